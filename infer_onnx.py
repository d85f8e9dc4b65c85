#!/usr/bin/env python3
"""Step 4: the ONNX graphs as drop-in replacements inside the real generate(), token-exact.

Compare mode (default): for each mode of the capture (same texts, seeds and generation config),
upstream's OmniVoice.generate() runs with the transformer forward, audio_tokenizer.encode and
audio_tokenizer.decode served by onnxruntime, and is compared with the PyTorch reference:

    final tokens     exact-match rate overall and per codebook; the first step at which the
                     token state diverges, if it does
    output WAV       log-spectral L1 against the reference WAV, and duration equality

It writes capture/onnx_<mode>.wav and capture/onnx_<mode>_spectrogram.png (PyTorch | ONNX |
difference; per item i of the batch mode: onnx_batch_<i>.wav, onnx_batch_spectrogram_<i>.png), prints a summary table with the wall time of PyTorch and ONNX generate() measured
in the same run (informational), and merges the results into onnx/export-report.json under
end_to_end.<provider>. Exit code 1 when tokens differ. It replays the capture's requests, so it
refuses a --seed or --num-step other than the capture's, a capture re-made after the export, and a
ref_voice.wav re-made after the capture (exit 2), rather than compare different runs.

--variant NAME runs a transformer variant of step 5 (quantize_omnivoice.py) with the export's fp32
codec graphs (files capture/onnx_<variant>_<mode>.*, results under variants.<name>.end_to_end in
the report). A quantized variant is measured, never judged (exit 0 whatever its tokens); an fp32
variant (fp32-unmasked) gets the fp32 verdict.

Synthesis mode (--text): speak any text with the ONNX graphs alone. The PyTorch weights are
never loaded: the host needs only the config, the text tokenizer and the duration estimator.
The graphs are checked against the export report first (sha256, metadata). Long text is split
into chunks by upstream, as in PyTorch. A reference WAV at another rate or with several channels
is resampled/averaged (a note says so); an unknown --language is an error ('None' selects
upstream's language-agnostic mode).

    python infer_onnx.py
    python infer_onnx.py --text "Hello there." --out hello.wav
    python infer_onnx.py --text "Hello." --ref-audio capture/ref_voice.wav --ref-text "..." --out clone.wav
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from omnivoice_export import capture, metrics, quality, quantize, report
from omnivoice_export.checkpoints import load_omnivoice, resolve_model, validate_checkpoint_dir
from omnivoice_export.cli import (NUM_STEP, SEED, THREADS, CheckFailed, check_input_dir, check_output, parse,
                                  run_main)
from omnivoice_export.files import atomic_path
from omnivoice_export.generation import (DEFAULT_SEED, LANGUAGE, GenerationRequest, check_language,
                                         check_reference_audio, generate_waveforms, read_wav, run_generate,
                                         write_wav)
from omnivoice_export.measure import PeakRss
from omnivoice_export.ort_runtime import OrtGraphs, load_onnx_omnivoice
from omnivoice_onnx.contract import GRAPH_NAMES, THRESHOLDS
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.sessions import PROVIDERS, check_provider

# The end-to-end entries of the threshold table, recorded with the results.
END_TO_END_THRESHOLDS = {k: v for k, v in THRESHOLDS.items() if k.startswith("end_to_end")}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--provider", default="cpu", help=f"one of {', '.join(PROVIDERS)}")
    parser.add_argument("--capture-dir", type=Path, default=capture.DEFAULT_DIR, help="step 1's capture")
    parser.add_argument("--onnx-dir", type=Path, default=report.DEFAULT_ONNX_DIR, help="step 2's export")
    parser.add_argument("--model", default=None,
                        help="checkpoint for the config and text tokenizer (tiny | full-random | PATH | Hugging Face repo id); "
                             "default: the one named in the export report")
    parser.add_argument("--threads", type=THREADS, default=None,
                        help="onnxruntime intra-op threads (default: all cores)")
    parser.add_argument("--no-split", action="store_true",
                        help="run cond and uncond rows as one padded transformer call (upstream's layout) instead "
                             "of each at its own length")
    parser.add_argument("--variant", default=None,
                        help="run a transformer variant made by quantize_omnivoice.py (int8, int4-b32, fp32-unmasked, ...) "
                             "with the export's fp32 codec graphs; compare mode then reports a quantized variant as "
                             "measurements under variants.<name> in the report, not as a verdict")
    parser.add_argument("--no-torch-timing", action="store_true",
                        help="compare mode: skip the PyTorch generate() timing run")
    synth = parser.add_argument_group("synthesis mode (needs no capture)")
    synth.add_argument("--text", default=None, help="text to speak; selects synthesis mode")
    synth.add_argument("--out", type=Path, default=Path("out.wav"), help="output WAV (24 kHz)")
    synth.add_argument("--ref-audio", type=Path, default=None, help="voice clone: reference WAV")
    synth.add_argument("--ref-text", default=None, help="voice clone: transcript of --ref-audio")
    synth.add_argument("--instruct", default=None, help="voice design: e.g. 'female, low pitch, british accent'")
    synth.add_argument("--language", default=None, help=f"language name or id, or 'None' (default: {LANGUAGE})")
    # None = not given: compare mode then takes the capture's, and refuses a different value.
    synth.add_argument("--seed", type=SEED, default=None,
                       help=f"torch seed before generate() (default: {DEFAULT_SEED}; compare mode: the capture's)")
    synth.add_argument("--num-step", type=NUM_STEP, default=None,
                       help="unmasking steps (default: 32; compare mode: the capture's)")
    return parse(parser, argv)


def spectrogram_png(path: Path, reference: np.ndarray, candidate: np.ndarray, title: str) -> None:
    """PyTorch | ONNX | difference log spectrograms, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    length = min(reference.size, candidate.size)
    ref, got = metrics.log_spectrum(reference[:length]).T, metrics.log_spectrum(candidate[:length]).T
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), constrained_layout=True)
    span = max(float(np.abs(got - ref).max()), 1e-9)  # symmetric, so white means "no difference"
    for ax, data, name, cmap, limits in ((axes[0], ref, "PyTorch", "magma", (None, None)),
                                         (axes[1], got, "ONNX", "magma", (None, None)),
                                         (axes[2], got - ref, "ONNX - PyTorch", "coolwarm", (-span, span))):
        image = ax.imshow(data, origin="lower", aspect="auto", cmap=cmap, vmin=limits[0], vmax=limits[1])
        ax.set_title(name)
        ax.set_xlabel(f"frame (hop {metrics.STFT_HOP})")
        fig.colorbar(image, ax=ax, label="log10 |X|")
    axes[0].set_ylabel("frequency bin")
    fig.suptitle(title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=80)
    plt.close(fig)


def compare_item(capture_dir: Path, mode: str, index: int, items: int, reference_name: str, audio: np.ndarray,
                 rate: float, sample_rate: int, label: str) -> dict[str, Any]:
    """One item's waveform against the capture's: log-spectral L1, durations; its WAV and spectrogram."""
    reference_audio, _ = read_wav(capture_dir / mode / reference_name)
    lsd = metrics.log_spectral_l1(reference_audio, audio)
    wav = capture.item_file(f"{label}_{mode}.wav", index, items)
    spectrogram = capture.item_file(f"{label}_{mode}_spectrogram.png", index, items)
    write_wav(capture_dir / wav, audio, sample_rate)
    spectrogram_png(capture_dir / spectrogram, reference_audio, audio,
                    f"{label} {mode}{f' item {index}' if items > 1 else ''}: token match {rate:.4f}, "
                    f"log-spectral L1 {lsd:.1e}")
    return {"log_spectral_l1": lsd, "duration_s": audio.size / sample_rate,
            "reference_duration_s": reference_audio.size / sample_rate,
            "same_duration": audio.size == reference_audio.size, "wav": wav, "spectrogram": spectrogram}


def compare_mode(model, torch_model, mode: str, manifest: dict, capture_dir: Path, label: str = "onnx") -> dict[str, Any]:
    entry = manifest["modes"][mode]
    request = GenerationRequest.from_dict(entry["request"])
    if request.ref_audio:
        request.ref_audio = str(capture_dir / request.ref_audio)
    reference_tokens = capture.load_mode_file(capture_dir, mode, capture.TOKENS_FILE)
    audios, states, onnx_seconds = quality.run_recorded(model, request)
    torch_seconds = None
    if torch_model is not None:
        started = time.perf_counter()
        generate_waveforms(torch_model, request)
        torch_seconds = time.perf_counter() - started
    target_lens = [row["t_len"] for row in entry["rows"]]
    rate, per_codebook = metrics.code_match(capture.real_tokens(reference_tokens["final"], target_lens),
                                            capture.real_tokens(states[-1], target_lens))
    diverged = quality.first_divergence(reference_tokens["after_step"], states)
    names = capture.item_files(manifest, mode, capture.OUTPUT_WAV)
    items = [compare_item(capture_dir, mode, index, len(names), name, audio, rate, model.sampling_rate, label)
             for index, (name, audio) in enumerate(zip(names, audios))]
    lsd = max(item["log_spectral_l1"] for item in items)
    same_duration = len(audios) == len(names) and all(item["same_duration"] for item in items)
    passed = (rate >= END_TO_END_THRESHOLDS["end_to_end_token_match_min"] and same_duration
              and lsd <= END_TO_END_THRESHOLDS["end_to_end_log_spectral_l1_max"])
    return {"token_match": rate, "token_match_per_codebook": per_codebook, "first_divergent_step": diverged,
            "log_spectral_l1": lsd, "same_duration": same_duration,
            "duration_s": sum(item["duration_s"] for item in items),
            "reference_duration_s": sum(item["reference_duration_s"] for item in items),
            "onnx_seconds": round(onnx_seconds, 3), "torch_seconds": None if torch_seconds is None else round(torch_seconds, 3),
            "items": items, "passed": passed}


def verdict_word(passed: bool | None) -> str:
    return "measured" if passed is None else "OK" if passed else "FAIL"


def print_compare_table(results: dict[str, dict[str, Any]]) -> None:
    print()
    print(f"{'mode':<8}{'tokens':>10}{'diverged':>10}{'LSD':>10}{'dur s':>8}{'torch s':>9}{'onnx s':>8}{'ratio':>7}  verdict")
    for mode, r in results.items():
        ratio = f"{r['torch_seconds'] / r['onnx_seconds']:.2f}" if r["torch_seconds"] else "-"
        torch_s = f"{r['torch_seconds']:.2f}" if r["torch_seconds"] else "-"
        diverged = "-" if r["first_divergent_step"] is None else str(r["first_divergent_step"])
        print(f"{mode:<8}{r['token_match']:>10.6f}{diverged:>10}{r['log_spectral_l1']:>10.1e}{r['duration_s']:>8.2f}"
              f"{torch_s:>9}{r['onnx_seconds']:>8.2f}{ratio:>7}  {verdict_word(r['passed']).upper()}")


def variant_transformer(args, export: dict) -> tuple[Path | None, bool]:
    """(--variant's transformer graph or None for the export's, whether the fp32 verdicts apply).

    An fp32 variant (fp32-unmasked) must pass the fp32 verdicts; a quantized one is measured.
    The unmasked graph is valid only for calls whose mask is all True, i.e. through run_split.
    """
    if args.variant is None:
        return None, True
    path = quantize.verify_variant(args.onnx_dir, export, args.variant)
    recipe = export["variants"][args.variant]["recipe"]
    if args.no_split and recipe["method"] == "unmasked":
        raise UserError(f"--no-split with variant {args.variant}: the unmasked graph gives NaN logits for padded "
                        "rows", "drop --no-split (cond and uncond rows then run at their own lengths)")
    return path, recipe["bits"] == 32


def check_compare_flags(args, manifest: dict) -> None:
    """Compare mode replays the capture's requests: a flag that would change them is refused, not ignored."""
    for flag, value, key in (("--seed", args.seed, "seed"), ("--num-step", args.num_step, "num_step")):
        captured = manifest.get(key)
        if value is not None and value != captured:
            raise UserError(f"{flag} {value} differs from the capture's {captured}: compare mode replays the "
                            "capture's requests", f"drop {flag}, or re-run steps 1-2 with {flag} {value}")
    given = [flag for flag, value in (("--ref-audio", args.ref_audio), ("--ref-text", args.ref_text),
                                      ("--instruct", args.instruct), ("--language", args.language)) if value]
    if given:
        raise UserError(f"{', '.join(given)} only apply to synthesis mode", "add --text, or drop them")


def compare(args) -> None:
    check_input_dir(args.capture_dir, "--capture-dir")
    check_output(args.onnx_dir, "--onnx-dir", "dir")  # the end-to-end results are merged into its report
    check_output(args.capture_dir, "--capture-dir", "dir")  # onnx_<mode>.wav and the spectrograms go there
    manifest, export = report.verify_against_capture(args.capture_dir, args.onnx_dir, list(GRAPH_NAMES))
    check_compare_flags(args, manifest)
    if "clone" in manifest["modes"]:
        capture.reference_wav(args.capture_dir, manifest)  # the very reference the clone tokens came from
    model_path = resolve_model(args.model) if args.model else validate_checkpoint_dir(Path(export["model"]["path"]))
    transformer, judged = variant_transformer(args, export)
    graphs = OrtGraphs.load(args.onnx_dir, args.provider, args.threads, transformer=transformer)
    model = load_onnx_omnivoice(model_path, graphs, split=not args.no_split)
    torch_model = None if args.no_torch_timing else load_omnivoice(model_path)
    label = "onnx" if args.variant is None else f"onnx_{args.variant}"
    print(f"[step 4] provider {args.provider}; generate() with ONNX modules"
          f"{'' if args.variant is None else ' (transformer: variant ' + args.variant + ')'} vs the capture "
          f"({manifest['model']['fingerprint']})", flush=True)
    results = {}
    for mode in manifest["modes"]:
        result = compare_mode(model, torch_model, mode, manifest, args.capture_dir, label)
        if not judged:
            result["passed"] = None
        results[mode] = result
        diverged = "never" if result["first_divergent_step"] is None else f"step {result['first_divergent_step']}"
        print(f"[end_to_end] {mode:<7} tokens={result['token_match']:.6f} diverged={diverged} "
              f"log_spectral_l1={result['log_spectral_l1']:.1e} duration {result['duration_s']:.2f}s"
              f"{'' if result['same_duration'] else ' (reference ' + format(result['reference_duration_s'], '.2f') + 's)'} "
              f"{verdict_word(result['passed'])}", flush=True)
    if not judged:
        report.merge_section(args.onnx_dir, ("variants", args.variant, "end_to_end", args.provider), {
            "provider": args.provider, "verdict": "measurement (quantized variant)", "modes": results,
            "spectral": metrics.spectral_params()})
        print_compare_table(results)
        print(f"measurements of quantized variant {args.variant}, not a parity verdict (wavs and spectrograms in "
              f"{args.capture_dir})")
        return
    overall = all(r["passed"] for r in results.values())
    if args.variant is None:
        report.write_end_to_end(args.onnx_dir, args.provider, "PASS" if overall else "FAIL", results,
                                END_TO_END_THRESHOLDS, metrics.spectral_params())
    else:
        report.merge_section(args.onnx_dir, ("variants", args.variant, "end_to_end", args.provider), {
            "provider": args.provider, "verdict": "PASS" if overall else "FAIL", "modes": results,
            "thresholds": END_TO_END_THRESHOLDS, "spectral": metrics.spectral_params()})
    print_compare_table(results)
    print(f"OVERALL: {'PASS' if overall else 'FAIL'}  (wavs and spectrograms in {args.capture_dir})")
    if not overall:
        failed = [m for m, r in results.items() if not r["passed"]]
        raise CheckFailed(f"ONNX generate() differs from PyTorch in {', '.join(failed)} "
                          f"(first divergent step: {', '.join(str(results[m]['first_divergent_step']) for m in failed)})")


def synthesize(args) -> None:
    if not args.text.strip():
        raise UserError("--text is empty", "pass the text to speak")
    if (args.ref_audio is None) != (args.ref_text is None):
        raise UserError("voice clone needs both --ref-audio and --ref-text")
    if args.ref_text is not None and not args.ref_text.strip():
        raise UserError("--ref-text is empty", "pass the transcript of --ref-audio")
    check_output(args.out, "--out", "file")
    check_input_dir(args.onnx_dir, "--onnx-dir")
    if args.ref_audio is not None:
        check_reference_audio(args.ref_audio)
    language = LANGUAGE if args.language is None else args.language
    check_language(language)
    export = report.load_report(args.onnx_dir)
    report.verify_graphs(args.onnx_dir, export, list(GRAPH_NAMES))
    model_path = resolve_model(args.model) if args.model else validate_checkpoint_dir(Path(export["model"]["path"]))
    mode = "clone" if args.ref_audio else "design" if args.instruct else "auto"
    request = GenerationRequest(mode=mode, text=args.text, seed=DEFAULT_SEED if args.seed is None else args.seed,
                                language=language, instruct=args.instruct,
                                ref_audio=str(args.ref_audio) if args.ref_audio else None, ref_text=args.ref_text,
                                num_step=GenerationRequest.num_step if args.num_step is None else args.num_step)
    transformer, _ = variant_transformer(args, export)
    with PeakRss() as peak:
        graphs = OrtGraphs.load(args.onnx_dir, args.provider, args.threads, transformer=transformer)
        model = load_onnx_omnivoice(model_path, graphs, split=not args.no_split)
        audio = run_generate(model, request)
    write_wav(args.out, audio, model.sampling_rate)
    print(f"[synthesis] {mode}: {audio.size / model.sampling_rate:.2f} s of audio -> {args.out} in {peak.seconds:.1f} s; "
          f"peak RSS {peak.peak_mb:.0f} MB (ONNX graphs only, no PyTorch weights)")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_provider(args.provider)
    if args.text is not None:
        synthesize(args)
    else:
        compare(args)


if __name__ == "__main__":
    run_main(main)
