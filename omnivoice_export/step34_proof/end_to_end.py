"""Compare mode of infer_onnx.py (step 4): the ONNX graphs against the PyTorch capture, end to end.

Two runs per capture mode, each replaying the capture's request (texts, seed, generation config):
    upstream     OmniVoice.generate() (omnivoice) with the transformer forward and the audio
                 tokenizer served by onnxruntime: final tokens, first divergent step, WAV and
                 spectrogram against the capture (see infer_onnx.py's docstring)
    runtime      omnivoice_onnx.OmniVoiceOnnx.generate(): no upstream code at all, the host side
                 reproduced in numpy; its final tokens against the capture's (exact-match rate,
                 the first item/frame/codebook that differs)

Results go under end_to_end.<provider> of the report (the runtime's under .runtime), or under
variants.<name>.end_to_end.<provider> for a transformer variant. This module needs torch and
omnivoice; synthesis (infer_onnx.py --text) never imports it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from omnivoice_export.common import metrics
from omnivoice_export.step0_checkpoints.checkpoints import load_omnivoice, resolve_model, validate_checkpoint_dir
from omnivoice_export.step1_capture import capture
from omnivoice_export.step1_capture.generation import GenerationRequest, generate_waveforms, read_wav, write_wav
from omnivoice_export.step2_export import report
from omnivoice_export.step2_export.ort_runtime import OrtGraphs, load_onnx_omnivoice
from omnivoice_export.step56_variants import quality, quantize
from omnivoice_onnx import OmniVoiceOnnx, Trace
from omnivoice_onnx.contract import FP32_VARIANT, GRAPH_NAMES, THRESHOLDS
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import atomic_path, check_input_dir, check_output
from omnivoice_onnx.program import CheckFailed

# The end-to-end entries of the threshold table, recorded with the results.
END_TO_END_THRESHOLDS = {k: v for k, v in THRESHOLDS.items() if k.startswith("end_to_end")}


def spectrogram_png(path: Path, reference: np.ndarray, candidate: np.ndarray, title: str) -> None:
    """PyTorch | ONNX | difference log spectrograms, side by side.

    A bare Figure rendered by the Agg canvas (no pyplot state to close) with fixed margins:
    matplotlib's constrained layout costs a large share of each figure's time, in a step that
    draws one per item and mode."""
    from matplotlib.figure import Figure

    length = min(reference.size, candidate.size)
    ref, got = metrics.log_spectrum(reference[:length]).T, metrics.log_spectrum(candidate[:length]).T
    fig = Figure(figsize=(15, 4))
    axes = fig.subplots(1, 3)
    fig.subplots_adjust(left=0.05, right=0.97, bottom=0.14, top=0.85, wspace=0.3)
    span = max(float(np.abs(got - ref).max()), 1e-9)  # symmetric, so white means "no difference"
    for ax, data, name, cmap, limits in (
        (axes[0], ref, "PyTorch", "magma", (None, None)),
        (axes[1], got, "ONNX", "magma", (None, None)),
        (axes[2], got - ref, "ONNX - PyTorch", "coolwarm", (-span, span)),
    ):
        image = ax.imshow(data, origin="lower", aspect="auto", cmap=cmap, vmin=limits[0], vmax=limits[1])
        ax.set_title(name)
        ax.set_xlabel(f"frame (hop {metrics.STFT_HOP})")
        fig.colorbar(image, ax=ax, label="log10 |X|")
    axes[0].set_ylabel("frequency bin")
    fig.suptitle(title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=80)


def compare_item(
    capture_dir: Path,
    mode: str,
    index: int,
    items: int,
    reference_name: str,
    audio: np.ndarray,
    rate: float,
    sample_rate: int,
    label: str,
) -> dict[str, Any]:
    """One item's waveform against the capture's: log-spectral L1, durations; its WAV and spectrogram."""
    reference_audio, _ = read_wav(capture_dir / mode / reference_name)
    lsd = metrics.log_spectral_l1(reference_audio, audio)
    wav = capture.item_file(f"{label}_{mode}.wav", index, items)
    spectrogram = capture.item_file(f"{label}_{mode}_spectrogram.png", index, items)
    write_wav(capture_dir / wav, audio, sample_rate)
    spectrogram_png(
        capture_dir / spectrogram,
        reference_audio,
        audio,
        f"{label} {mode}{f' item {index}' if items > 1 else ''}: token match {rate:.4f}, log-spectral L1 {lsd:.1e}",
    )
    return {
        "log_spectral_l1": lsd,
        "duration_s": audio.size / sample_rate,
        "reference_duration_s": reference_audio.size / sample_rate,
        "same_duration": audio.size == reference_audio.size,
        "wav": wav,
        "spectrogram": spectrogram,
    }


def compare_mode(
    model: Any, torch_model: Any, mode: str, manifest: dict[str, Any], capture_dir: Path, label: str = "onnx"
) -> dict[str, Any]:
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
    rate, per_codebook = metrics.code_match(
        capture.real_tokens(reference_tokens["final"], target_lens), capture.real_tokens(states[-1], target_lens)
    )
    diverged = quality.first_divergence(reference_tokens["after_step"], states)
    names = capture.item_files(manifest, mode, capture.OUTPUT_WAV)
    items = [
        compare_item(capture_dir, mode, index, len(names), name, audio, rate, model.sampling_rate, label)
        for index, (name, audio) in enumerate(zip(names, audios))
    ]
    lsd = max(item["log_spectral_l1"] for item in items)
    same_duration = len(audios) == len(names) and all(item["same_duration"] for item in items)
    passed = (
        rate >= END_TO_END_THRESHOLDS["end_to_end_token_match_min"]
        and same_duration
        and lsd <= END_TO_END_THRESHOLDS["end_to_end_log_spectral_l1_max"]
    )
    return {
        "token_match": rate,
        "token_match_per_codebook": per_codebook,
        "first_divergent_step": diverged,
        "log_spectral_l1": lsd,
        "same_duration": same_duration,
        "duration_s": sum(item["duration_s"] for item in items),
        "reference_duration_s": sum(item["reference_duration_s"] for item in items),
        "onnx_seconds": round(onnx_seconds, 3),
        "torch_seconds": None if torch_seconds is None else round(torch_seconds, 3),
        "items": items,
        "passed": passed,
    }


def verdict_word(passed: bool | None) -> str:
    return "measured" if passed is None else "OK" if passed else "FAIL"


def print_compare_table(results: dict[str, dict[str, Any]], runtime: dict[str, dict[str, Any]]) -> None:
    """One row per mode: upstream-with-ONNX (tokens, divergence, LSD, times) and the runtime's tokens."""
    print()
    print(
        f"{'mode':<8}{'tokens':>10}{'diverged':>10}{'LSD':>10}{'dur s':>8}{'torch s':>9}{'onnx s':>8}{'ratio':>7}"
        f"{'runtime':>10}{'rt s':>8}  verdict"
    )
    for mode, r in results.items():
        ratio = f"{r['torch_seconds'] / r['onnx_seconds']:.2f}" if r["torch_seconds"] else "-"
        torch_s = f"{r['torch_seconds']:.2f}" if r["torch_seconds"] else "-"
        diverged = "-" if r["first_divergent_step"] is None else str(r["first_divergent_step"])
        rt = runtime[mode]
        passed = None if r["passed"] is None else r["passed"] and rt["passed"]
        print(
            f"{mode:<8}{r['token_match']:>10.6f}{diverged:>10}{r['log_spectral_l1']:>10.1e}{r['duration_s']:>8.2f}"
            f"{torch_s:>9}{r['onnx_seconds']:>8.2f}{ratio:>7}{rt['token_match']:>10.6f}{rt['seconds']:>8.2f}  "
            f"{verdict_word(passed).upper()}"
        )


def first_token_difference(reference: list[np.ndarray], candidate: list[np.ndarray]) -> dict[str, int] | None:
    """The first cell where per-item token arrays [C, T] differ, frame-major within an item:
    {item, frame, codebook} (frame = the shorter length when the lengths differ); None if equal."""
    for item, (ref, got) in enumerate(zip(reference, candidate)):
        frames = min(ref.shape[-1], got.shape[-1])
        unequal = np.argwhere((ref[:, :frames] != got[:, :frames]).T)  # [frame, codebook] pairs, frame-major
        if unequal.size:
            return {"item": item, "frame": int(unequal[0][0]), "codebook": int(unequal[0][1])}
        if ref.shape != got.shape:
            return {"item": item, "frame": frames, "codebook": 0}
    return None


def runtime_mode(tts: OmniVoiceOnnx, mode: str, manifest: dict[str, Any], capture_dir: Path) -> dict[str, Any]:
    """The torch-free runtime on one capture request: its final tokens against PyTorch's.

    The request is the capture's (texts, seed, language, instruct, reference, num_step); every
    other generation field is upstream's default, as in the capture (the runtime reads the
    export's runtime-config.json). A capture is never chunked, so each item's result is [8, T].
    """
    entry = manifest["modes"][mode]
    request = GenerationRequest.from_dict(entry["request"])
    trace = Trace()
    started = time.perf_counter()
    tts.generate(
        request.text,
        language=request.language,
        instruct=request.instruct,
        ref_text=request.ref_text,
        ref_audio=str(capture_dir / request.ref_audio) if request.ref_audio else None,
        generation_config={"num_step": request.num_step},
        seed=request.seed,
        trace=trace,
    )
    seconds = time.perf_counter() - started
    final = capture.load_mode_file(capture_dir, mode, capture.TOKENS_FILE)["final"]
    reference = [final[i, :, : row["t_len"]] for i, row in enumerate(entry["rows"])]
    candidate = [np.asarray(tokens) for tokens in trace.results]
    per_item = [float(np.mean(ref == got)) if ref.shape == got.shape else 0.0 for ref, got in zip(reference, candidate)]
    cells = [ref.size for ref in reference]
    rate = float(np.dot(per_item, cells) / sum(cells)) if len(candidate) == len(reference) else 0.0
    return {
        "token_match": rate,
        "token_match_per_item": per_item,
        "first_difference": first_token_difference(reference, candidate),
        "target_frames": [int(got.shape[-1]) for got in candidate],
        "seconds": round(seconds, 3),
        "passed": rate >= END_TO_END_THRESHOLDS["end_to_end_token_match_min"],
    }


def runtime_section(results: dict[str, dict[str, Any]], variant: str, judged: bool) -> dict[str, Any]:
    """The report's `runtime` entry: per mode and overall; a verdict only where judged (fp32)."""
    cells = {mode: sum(r["target_frames"]) for mode, r in results.items()}
    overall = sum(results[m]["token_match"] * cells[m] for m in results) / max(sum(cells.values()), 1)
    verdict = ("PASS" if all(r["passed"] for r in results.values()) else "FAIL") if judged else "measurement"
    return {
        "runtime": "omnivoice_onnx",
        "variant": variant,
        "verdict": verdict,
        "token_match": overall,
        "modes": results,
    }


def variant_transformer(args: argparse.Namespace, export: dict[str, Any]) -> tuple[Path | None, bool]:
    """(--variant's transformer graph or None for the export's, whether the fp32 verdicts apply).

    An fp32 variant (fp32-unmasked) must pass the fp32 verdicts; a quantized one is measured.
    The unmasked graph is valid only for calls whose mask is all True, i.e. through run_split:
    so is every recipe with fusions (fp32-fused, int8), which are applied to the unmasked graph.
    """
    if args.variant is None:
        return None, True
    path = quantize.verify_variant(args.onnx_dir, export, args.variant)
    recipe = export["variants"][args.variant]["recipe"]
    if args.no_split and (recipe["method"] == "unmasked" or recipe["fusions"]):
        raise UserError(
            f"--no-split with variant {args.variant}: the unmasked graph gives NaN logits for padded rows",
            "drop --no-split (cond and uncond rows then run at their own lengths)",
        )
    return path, recipe["bits"] == 32


def check_compare_flags(args: argparse.Namespace, manifest: dict[str, Any]) -> None:
    """Compare mode replays the capture's requests: a flag that would change them is refused, not ignored."""
    for flag, value, key in (("--seed", args.seed, "seed"), ("--num-step", args.num_step, "num_step")):
        captured = manifest.get(key)
        if value is not None and value != captured:
            raise UserError(
                f"{flag} {value} differs from the capture's {captured}: compare mode replays the capture's requests",
                f"drop {flag}, or re-run steps 1-2 with {flag} {value}",
            )
    given = [
        flag
        for flag, value in (
            ("--ref-audio", args.ref_audio),
            ("--ref-text", args.ref_text),
            ("--instruct", args.instruct),
            ("--language", args.language),
        )
        if value
    ]
    if given:
        raise UserError(f"{', '.join(given)} only apply to synthesis mode", "add --text, or drop them")


def compare(args: argparse.Namespace) -> None:
    check_input_dir(args.capture_dir, "--capture-dir")
    check_output(args.onnx_dir, "--model-dir", "dir")  # the end-to-end results are merged into its report
    check_output(args.capture_dir, "--capture-dir", "dir")  # onnx_<mode>.wav and the spectrograms go there
    manifest, export = report.verify_against_capture(args.capture_dir, args.onnx_dir, list(GRAPH_NAMES))
    check_compare_flags(args, manifest)
    if "clone" in manifest["modes"]:
        capture.reference_wav(args.capture_dir, manifest)  # the very reference the clone tokens came from
    model_path = (
        resolve_model(args.model)
        if args.model
        else validate_checkpoint_dir(report.recorded_path(export["model"]["path"]))
    )
    transformer, judged = variant_transformer(args, export)
    graphs = OrtGraphs.load(
        args.onnx_dir, args.provider, args.threads, transformer=transformer, variant=args.variant or FP32_VARIANT
    )  # fp16 carries its own codec graphs
    model = load_onnx_omnivoice(model_path, graphs, split=not args.no_split)
    torch_model = None if args.no_torch_timing else load_omnivoice(model_path)
    label = "onnx" if args.variant is None else f"onnx_{args.variant}"
    print(
        f"[step 4] provider {args.provider}; generate() with ONNX modules"
        f"{'' if args.variant is None else ' (transformer: variant ' + args.variant + ')'} vs the capture "
        f"({manifest['model']['fingerprint']})",
        flush=True,
    )
    results = {}
    for mode in manifest["modes"]:
        result = compare_mode(model, torch_model, mode, manifest, args.capture_dir, label)
        if not judged:
            result["passed"] = None
        results[mode] = result
        diverged = "never" if result["first_divergent_step"] is None else f"step {result['first_divergent_step']}"
        reference = "" if result["same_duration"] else f" (reference {result['reference_duration_s']:.2f}s)"
        print(
            f"[end_to_end] {mode:<7} tokens={result['token_match']:.6f} diverged={diverged} "
            f"log_spectral_l1={result['log_spectral_l1']:.1e} duration {result['duration_s']:.2f}s{reference} "
            f"{verdict_word(result['passed'])}",
            flush=True,
        )
    del model, graphs, torch_model  # the runtime loads its own sessions: never two transformers at once
    runtime = compare_runtime(args, manifest, judged)
    section = {"provider": args.provider, "modes": results, "runtime": runtime, "spectral": metrics.spectral_params()}
    if not judged:
        report.merge_section(
            args.onnx_dir,
            ("variants", args.variant, "end_to_end", args.provider),
            {**section, "verdict": "measurement (quantized variant)"},
        )
        print_compare_table(results, runtime["modes"])
        print(
            f"measurements of quantized variant {args.variant}, not a parity verdict (wavs and spectrograms in "
            f"{args.capture_dir})"
        )
        return
    overall = all(r["passed"] for r in results.values()) and runtime["verdict"] == "PASS"
    section.update(verdict="PASS" if overall else "FAIL", thresholds=END_TO_END_THRESHOLDS)
    path = (
        ("end_to_end", args.provider)
        if args.variant is None
        else ("variants", args.variant, "end_to_end", args.provider)
    )
    report.merge_section(args.onnx_dir, path, section)
    print_compare_table(results, runtime["modes"])
    print(f"OVERALL: {'PASS' if overall else 'FAIL'}  (wavs and spectrograms in {args.capture_dir})")
    if not overall:
        failed = [m for m, r in results.items() if not r["passed"]]
        problems = (
            [
                f"ONNX generate() differs from PyTorch in {', '.join(failed)} (first divergent step: "
                f"{', '.join(str(results[m]['first_divergent_step']) for m in failed)})"
            ]
            if failed
            else []
        )
        failed_rt = [m for m, r in runtime["modes"].items() if not r["passed"]]
        if failed_rt:
            problems.append(
                f"the runtime's tokens differ from PyTorch's in {', '.join(failed_rt)} (first difference: "
                f"{'; '.join(str(runtime['modes'][m]['first_difference']) for m in failed_rt)})"
            )
        raise CheckFailed("; ".join(problems))


def compare_runtime(args: argparse.Namespace, manifest: dict[str, Any], judged: bool) -> dict[str, Any]:
    """The torch-free runtime (the same variant, provider and threads) on every capture request."""
    # No --variant means the faithful graph here, as on the PyTorch side, not the runtime's default.
    tts = OmniVoiceOnnx.from_dir(
        args.onnx_dir,
        provider=args.provider,
        threads=args.threads,
        variant=FP32_VARIANT if args.variant is None else args.variant,
    )
    results = {}
    for mode in manifest["modes"]:
        result = runtime_mode(tts, mode, manifest, args.capture_dir)
        if not judged:
            result["passed"] = None
        results[mode] = result
        where = result["first_difference"]
        print(
            f"[runtime] {mode:<7} tokens={result['token_match']:.6f} first difference="
            f"{'never' if where is None else 'item {item} frame {frame} codebook {codebook}'.format(**where)} "
            f"in {result['seconds']:.2f}s {verdict_word(result['passed'])}",
            flush=True,
        )
    return runtime_section(results, tts.variant, judged)
