"""Quality of a transformer variant on the capture's inputs: measurements, never parity verdicts.

For each variant (and fp32, measured in the same run as the baseline of every ratio):

    per step     on every captured transformer call of every mode, run as generate() runs it
                 (cond and uncond rows at their own lengths, omnivoice_onnx.sessions.run_split):
                 argmax agreement and relative logit error ||got - ref|| / ||ref|| (L2 over the
                 rows generate() reads) against the PyTorch logits of the capture, plus max |d|
                 and the wall time of the calls
    end to end   upstream generate() with the variant's transformer inside (the export's fp32
                 codec graphs, or the variant's own: fp16), per mode: final-token agreement with
                 the PyTorch capture, the first step whose token state diverges, and the
                 log-spectral L1 of the WAV against the PyTorch output WAV; wall time of generate()
    greedy       the same requests with class and position temperatures 0 (GREEDY_CONFIG): final
                 tokens against PyTorch's greedy run (greedy_reference), the agreement ports report
    codecs       for a variant with its own codec graphs: encoder code match on the captured
                 reference, decoder log-spectral L1 on every captured decode

Why greedy too: under sampling (position temperature 5) one early drift sends the run down another
path, so sampled token agreement punishes small errors without bound (a C++ port: 100 % f32, 1.9 %
Q8_0 that still sounds right); greedy agreement is the figure other ports publish.

Why both: a per-step flip at a near-tie may never be unmasked (unmasking takes the most confident
positions), while one early flip changes every later step's input; only the 32-step token
agreement says whether the speech changes. On random weights the figures show a recipe's
arithmetic error, not the audible quality on the trained model.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from omnivoice_export.common import metrics
from omnivoice_export.common.measure import cpu_description
from omnivoice_export.step1_capture import capture
from omnivoice_export.step56_variants import quantize
from omnivoice_onnx.contract import variant_path
from omnivoice_onnx.sessions import TRANSFORMER_ARENA, make_session, run_split

if TYPE_CHECKING:  # imported where generate() runs, as the functions below do
    from omnivoice_export.step1_capture.generation import GenerationRequest


def relative_error(reference: np.ndarray, candidate: np.ndarray) -> float:
    """||candidate - reference||_2 / ||reference||_2 over all elements, in float64."""
    ref = reference.astype(np.float64)
    return float(np.linalg.norm(candidate.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def step_quality(session: Any, capture_dir: Path, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Per captured step of every mode: argmax agreement, relative error, max |d|, call seconds."""
    rows = []
    for mode in manifest["modes"]:
        for step in capture.mode_steps(manifest, mode):
            data = capture.load_step(capture_dir, mode, step)
            started = time.perf_counter()
            logits = run_split(session, data["input_ids"], data["audio_mask"], data["attention_mask"])
            seconds = time.perf_counter() - started
            vocab = logits.shape[-1]
            reference = np.concatenate(
                [data["logits_cond"].reshape(-1, vocab), data["logits_uncond"].reshape(-1, vocab)]
            )
            got = capture.read_rows(logits, data["attention_mask"])
            stats = metrics.logit_stats(reference, got)
            rows.append(
                {
                    "mode": mode,
                    "step": step,
                    "argmax_agreement": stats.argmax_agreement,
                    "relative_error": relative_error(reference, got),
                    "max_abs": stats.max_abs,
                    "flips": stats.flips,
                    "seconds": round(seconds, 4),
                }
            )
    return rows


def run_recorded(
    model: Any, request: GenerationRequest, config: dict[str, Any] | None = None
) -> tuple[list[np.ndarray], np.ndarray, float]:
    """generate() with a token recorder: (audio per item, token state after each step [N,B,8,T], seconds)."""
    from omnivoice_export.step1_capture.generation import generate_waveforms

    recorder = capture.Recorder(model, Path("."), steps=set())  # steps=set(): no step files, tokens only
    started = time.perf_counter()
    with recorder.active():
        audios = generate_waveforms(model, request, config)
    return audios, np.stack(recorder.token_states), time.perf_counter() - started


def mode_requests(capture_dir: Path, manifest: dict[str, Any]) -> Iterator[tuple[str, GenerationRequest]]:
    """(mode, its captured GenerationRequest with the reference path resolved) per captured mode."""
    from omnivoice_export.step1_capture.generation import GenerationRequest

    for mode, entry in manifest["modes"].items():
        request = GenerationRequest.from_dict(entry["request"])
        if request.ref_audio:
            request.ref_audio = str(Path(capture_dir) / request.ref_audio)
        yield mode, request


def greedy_reference(model_path: Path, capture_dir: Path, manifest: dict[str, Any]) -> dict[str, np.ndarray]:
    """PyTorch's token states [N,B,8,T] per mode for the captured requests with GREEDY_CONFIG."""
    from omnivoice_export.step0_checkpoints.checkpoints import load_omnivoice
    from omnivoice_export.step1_capture.generation import GREEDY_CONFIG

    model = load_omnivoice(model_path)
    return {
        mode: run_recorded(model, request, GREEDY_CONFIG)[1] for mode, request in mode_requests(capture_dir, manifest)
    }


def first_divergence(reference: np.ndarray, candidate: np.ndarray) -> int | None:
    """First step whose token state differs (None: never)."""
    for step in range(min(len(reference), len(candidate))):
        if reference[step].shape != candidate[step].shape or not np.array_equal(reference[step], candidate[step]):
            return step
    return None if len(reference) == len(candidate) else min(len(reference), len(candidate))


def end_to_end(
    model_path: Path,
    onnx_dir: Path,
    variant: str,
    capture_dir: Path,
    manifest: dict[str, Any],
    threads: int | None,
    wav_dir: Path | None,
    greedy: dict[str, np.ndarray] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per mode: upstream generate() with `variant`'s graphs (contract.variant_path) against the
    capture, and with GREEDY_CONFIG against `greedy` (greedy_reference) when given."""
    from omnivoice_export.step1_capture.generation import GREEDY_CONFIG, read_wav, write_wav
    from omnivoice_export.step2_export.ort_runtime import OrtGraphs, load_onnx_omnivoice

    graphs = OrtGraphs.load(onnx_dir, "cpu", threads, transformer=variant_path(onnx_dir, variant), variant=variant)
    model = load_onnx_omnivoice(model_path, graphs)
    results = {}
    for mode, request in mode_requests(capture_dir, manifest):
        entry = manifest["modes"][mode]
        audios, states, seconds = run_recorded(model, request)
        reference = capture.load_mode_file(capture_dir, mode, capture.TOKENS_FILE)
        names = capture.item_files(manifest, mode, capture.OUTPUT_WAV)  # one per item of a batched request
        reference_audios = [read_wav(Path(capture_dir) / mode / name)[0] for name in names]
        target_lens = [row["t_len"] for row in entry["rows"]]
        rate, per_codebook = metrics.code_match(
            capture.real_tokens(reference["final"], target_lens), capture.real_tokens(states[-1], target_lens)
        )
        results[mode] = {
            "token_match": rate,
            "token_match_per_codebook": per_codebook,
            "first_divergent_step": first_divergence(reference["after_step"], states),
            "log_spectral_l1": max(metrics.log_spectral_l1(ref, audio) for ref, audio in zip(reference_audios, audios)),
            "same_duration": [a.size for a in audios] == [r.size for r in reference_audios],
            "seconds": round(seconds, 3),
        }
        if greedy is not None:
            _, greedy_states, _ = run_recorded(model, request, GREEDY_CONFIG)
            results[mode]["greedy_token_match"] = metrics.code_match(
                capture.real_tokens(greedy[mode][-1], target_lens), capture.real_tokens(greedy_states[-1], target_lens)
            )[0]
            results[mode]["greedy_first_divergent_step"] = first_divergence(greedy[mode], greedy_states)
        if wav_dir is not None:
            for index, audio in enumerate(audios):
                write_wav(
                    Path(wav_dir) / capture.item_file(f"{mode}.wav", index, len(audios)), audio, model.sampling_rate
                )
    return results


def machine() -> dict[str, Any]:
    """The CPU (measure.cpu_description) and load a figure was measured on (figures are only
    comparable within one run; int8 quality depends on the CPU's integer kernels)."""
    return {"cpu": cpu_description(), "machine": platform.machine(), "load_1min_at_start": round(os.getloadavg()[0], 2)}


def codec_quality(
    onnx_dir: Path, variant: str, capture_dir: Path, manifest: dict[str, Any], threads: int | None
) -> dict[str, Any]:
    """A variant's own codec graphs on the capture: encoder code match on the clone reference
    (against PyTorch's codes; RVQ flips near codebook boundaries cascade into later codebooks),
    decoder log-spectral L1 and max |d| on every captured decode (against PyTorch's audio)."""
    from omnivoice_onnx.sessions import CODEC_ARENA, run

    result: dict[str, Any] = {}
    encoder = variant_path(onnx_dir, variant, "encoder")
    if encoder.parent != Path(onnx_dir) and "clone" in manifest["modes"]:
        data = capture.load_mode_file(capture_dir, "clone", capture.ENCODER_FILE)
        codes = run(make_session(encoder, "cpu", threads, arena=CODEC_ARENA), {"input_values": data["input_values"]})
        rate, per_codebook = metrics.code_match(data["audio_codes"], codes["audio_codes"])
        result["encoder"] = {"code_match": rate, "per_codebook": per_codebook}
    decoder = variant_path(onnx_dir, variant, "decoder")
    if decoder.parent != Path(onnx_dir):
        session = make_session(decoder, "cpu", threads, arena=CODEC_ARENA)
        lsd, max_abs = [], []
        for mode in manifest["modes"]:
            for name in capture.item_files(manifest, mode, capture.DECODER_FILE):
                data = capture.load_mode_file(capture_dir, mode, name)
                audio = run(session, {"audio_codes": data["audio_codes"]})["audio_values"]
                lsd.append(metrics.log_spectral_l1(data["audio_values"], audio))
                max_abs.append(float(np.abs(audio - data["audio_values"]).max()))
        result["decoder"] = {"log_spectral_l1_max": max(lsd), "max_abs": max(max_abs)}
    return result


def measure_variant(
    name: str,
    model_path: Path,
    onnx_dir: Path,
    capture_dir: Path,
    manifest: dict[str, Any],
    export: dict[str, Any],
    threads: int | None,
    end_to_end_too: bool,
    wav_root: Path | None,
    greedy: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Every measurement of one variant ('fp32': the export's own graphs); `greedy`: PyTorch's
    greedy token states (greedy_reference), measured against when given."""
    path = quantize.verify_variant(onnx_dir, export, name)
    session = make_session(path, "cpu", threads, arena=TRANSFORMER_ARENA)
    steps = step_quality(session, capture_dir, manifest)
    del session
    size = sum((path.parent / f).stat().st_size for f in (path.name, path.name + ".data"))
    result: dict[str, Any] = {
        "bytes": size,
        "steps": steps,
        "argmax_agreement_min": min(r["argmax_agreement"] for r in steps),
        "argmax_agreement_mean": float(np.mean([r["argmax_agreement"] for r in steps])),
        "relative_error_max": max(r["relative_error"] for r in steps),
        "relative_error_mean": float(np.mean([r["relative_error"] for r in steps])),
        "step_seconds": round(sum(r["seconds"] for r in steps), 3),
    }
    codecs = codec_quality(onnx_dir, name, capture_dir, manifest, threads)
    if codecs:
        result["codecs"] = codecs
    if end_to_end_too:
        result["end_to_end"] = end_to_end(
            model_path,
            onnx_dir,
            name,
            capture_dir,
            manifest,
            threads,
            None if wav_root is None else Path(wav_root) / name,
            greedy,
        )
    return result


def table(results: dict[str, dict[str, Any]]) -> str:
    """The quality table: one row per variant, ratios against fp32 measured in the same run."""
    base = results["fp32"]
    modes = list(next(iter(results.values())).get("end_to_end", {}))
    greedy = bool(modes) and "greedy_token_match" in base["end_to_end"][modes[0]]
    header = (
        f"{'variant':<15}{'MB':>8}{'size':>7}{'step speed':>11}{'argmax min':>11}{'argmax mean':>12}"
        f"{'rel err max':>12}"
        + "".join(f"{m + ' tok':>11}{'div':>5}{'LSD':>9}" + (f"{'greedy':>8}" if greedy else "") for m in modes)
        + ("  e2e speed" if modes else "")
    )
    lines = [header]
    for name, r in results.items():
        row = (
            f"{name:<15}{r['bytes'] / 2**20:>8.1f}{r['bytes'] / base['bytes']:>7.1%}"
            f"{base['step_seconds'] / r['step_seconds']:>10.2f}x{r['argmax_agreement_min']:>11.4f}"
            f"{r['argmax_agreement_mean']:>12.4f}{r['relative_error_max']:>12.1e}"
        )
        for mode in modes:
            e = r["end_to_end"][mode]
            div = "-" if e["first_divergent_step"] is None else str(e["first_divergent_step"])
            row += f"{e['token_match']:>11.4f}{div:>5}{e['log_spectral_l1']:>9.1e}"
            if greedy:
                row += f"{e['greedy_token_match']:>8.4f}"
        if modes:
            total = sum(e["seconds"] for e in r["end_to_end"].values())
            row += f"{sum(e['seconds'] for e in base['end_to_end'].values()) / total:>10.2f}x"
        lines.append(row)
    return "\n".join(lines)
