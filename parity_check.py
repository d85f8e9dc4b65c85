#!/usr/bin/env python3
"""Step 3: per-graph parity of the ONNX graphs against the PyTorch capture, on captured real inputs.

    transformer  every captured step of every mode: argmax agreement and logit max-abs over the
                 rows generate() reads (plus mean-abs, and the reference's top-1/top-2 margin
                 where argmax disagrees, so a near-tie flip is told from a real error)
    encoder      exact code-match rate per codebook on the captured reference audio, plus a
                 length sweep: the reference cut to ~30 hop-multiple lengths, ONNX vs PyTorch
    decoder      log-spectral L1 per item (n_fft 1024, hop 256, log10, floor 1e-5), max-abs for
                 information

Before comparing anything, the capture manifest and the export report must name the same model
fingerprint, the capture must be the one the export was made from (its manifest sha256, recorded
in the report), each graph's metadata must name the report's exporter and opset, and every
capture and ONNX file must match its recorded sha256; otherwise it stops with one line (exit 2).

Providers: cpu (default), cuda-fp32 (CUDA EP, TF32 off) and cuda-tf32 (CUDA EP defaults). cpu and
cuda-fp32 are parity verdicts on the export; cuda-tf32 is reported as a speed/precision
trade-off. Results are merged into onnx/export-report.json under parity.<provider>; the exit code
is 1 when any graph fails.

    python parity_check.py
    python parity_check.py --provider cuda-fp32 --graphs transformer
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from omnivoice_export import capture, metrics, report, wrappers
from omnivoice_export.checkpoints import validate_checkpoint_dir
from omnivoice_export.exporting import transformer_read_rows
from omnivoice_export.cli import REPO_ROOT, CheckFailed, add_debug_flag, parse_subset, run_main
from omnivoice_onnx.sessions import PROVIDERS, check_provider, make_session, run

HOP = 960
SWEEP_LENGTHS = 30
CONTRACT = {  # graph -> ({input: dtype}, {output: dtype}, output rank)
    "transformer": ({"input_ids": "int64", "audio_mask": "bool", "attention_mask": "bool"}, {"logits": "float32"}),
    "encoder": ({"input_values": "float32"}, {"audio_codes": "int64"}),
    "decoder": ({"audio_codes": "int64"}, {"audio_values": "float32"}),
}
ORT_TYPES = {"tensor(int64)": "int64", "tensor(bool)": "bool", "tensor(float)": "float32"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--provider", default="cpu", help=f"one of {', '.join(PROVIDERS)}")
    parser.add_argument("--graphs", default=",".join(wrappers.GRAPH_NAMES), help="comma-separated subset to check")
    parser.add_argument("--capture-dir", type=Path, default=REPO_ROOT / "capture", help="step 1's capture")
    parser.add_argument("--onnx-dir", type=Path, default=REPO_ROOT / "onnx", help="step 2's export")
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads (default: all cores)")
    parser.add_argument("--argmax-min", type=float, default=metrics.THRESHOLDS["transformer_argmax_min"],
                        help="transformer: minimum argmax agreement on the rows generate() reads")
    parser.add_argument("--max-abs", type=float, default=metrics.THRESHOLDS["transformer_max_abs"],
                        help="transformer: maximum |logit difference| on those rows")
    parser.add_argument("--code-match-min", type=float, default=metrics.THRESHOLDS["encoder_code_match_min"],
                        help="encoder: minimum exact code-match rate")
    parser.add_argument("--lsd-max", type=float, default=metrics.THRESHOLDS["decoder_log_spectral_l1_max"],
                        help="decoder: maximum log-spectral L1")
    parser.add_argument("--no-sweep", action="store_true", help="skip the encoder length sweep (needs PyTorch weights)")
    add_debug_flag(parser)
    return parser.parse_args(argv)


def check_contract(session, graph: str) -> list[str]:
    """Optimum-style: input/output names and dtypes as the design table says."""
    problems = []
    inputs, outputs = CONTRACT[graph]
    for kind, expected, actual in (("input", inputs, session.get_inputs()), ("output", outputs, session.get_outputs())):
        got = {a.name: ORT_TYPES.get(a.type, a.type) for a in actual}
        if got != expected:
            problems.append(f"{kind}s are {got}, expected {expected}")
    return problems


def line(graph: str, label: str, values: str, ok: bool | None) -> None:
    verdict = "OK" if ok else ("FAIL" if ok is not None else "info")
    print(f"[{graph}] {label:<22} {values} {verdict}", flush=True)


def check_transformer(session, capture_dir: Path, manifest: dict, args) -> dict[str, Any]:
    rows, failures = [], []
    for mode in manifest["modes"]:
        for step in capture.mode_steps(manifest, mode):
            data = capture.load_step(capture_dir, mode, step)  # one step at a time: bounded memory
            logits = run(session, {k: data[k] for k in wrappers.TRANSFORMER_INPUTS})["logits"]
            captured = np.concatenate([data["logits_cond"].reshape(-1, logits.shape[-1]),
                                       data["logits_uncond"].reshape(-1, logits.shape[-1])])
            stats = metrics.logit_stats(captured, transformer_read_rows(logits, data["attention_mask"]))
            mask = data["attention_mask"][:, 0]
            no_key = int((~mask.any(-1)).sum()) * logits.shape[1]
            ok = stats.passed(args.argmax_min, args.max_abs)
            flip = "" if not stats.flips else f" flips={stats.flips} margin={stats.flip_margin_min:.2e}..{stats.flip_margin_max:.2e}"
            line("transformer", f"{mode} step {step:>2}", f"argmax={stats.argmax_agreement:.6f} max_abs={stats.max_abs:.1e} "
                 f"mean_abs={stats.mean_abs:.1e}{flip}", ok)
            rows.append({"mode": mode, "step": step, "S": int(logits.shape[-2]), **vars(stats),
                         "rows_excluded_no_key": no_key, "passed": ok})
            if not ok:
                failures.append(f"{mode} step {step}: argmax {stats.argmax_agreement:.6f} (min {args.argmax_min}), "
                                f"max_abs {stats.max_abs:.2e} (max {args.max_abs:.0e})")
    worst = {"argmax_agreement_min": min(r["argmax_agreement"] for r in rows),
             "max_abs_max": max(r["max_abs"] for r in rows)}
    return {"rows": rows, **worst, "failures": failures}


def encoder_sweep(session, model_path: Path, audio: np.ndarray, args) -> tuple[list[dict], list[str]]:
    """The captured reference cut to ~30 hop-multiple lengths: ONNX codes vs PyTorch codes."""
    import torch
    from transformers import HiggsAudioV2TokenizerModel

    from omnivoice_export.wrappers import EncoderWrapper

    tokenizer = HiggsAudioV2TokenizerModel.from_pretrained(str(model_path / "audio_tokenizer")).eval()
    module = EncoderWrapper(tokenizer)
    frames = audio.shape[-1] // HOP
    lengths = sorted({int(f) for f in np.linspace(2, frames, SWEEP_LENGTHS)})
    rows, failures = [], []
    for frame_count in lengths:
        cut = audio[..., : frame_count * HOP]
        with torch.no_grad():
            expected = module(torch.from_numpy(cut)).numpy()
        got = run(session, {"input_values": cut})["audio_codes"]
        rate, _ = metrics.code_match(expected, got)
        ok = rate >= args.code_match_min
        line("encoder", f"sweep {frame_count:>4} frames", f"code_match={rate:.6f}", ok)
        rows.append({"frames": frame_count, "samples": int(cut.shape[-1]), "code_match": rate, "passed": ok})
        if not ok:
            failures.append(f"sweep {frame_count} frames: code match {rate:.6f}")
    return rows, failures


def check_encoder(session, capture_dir: Path, manifest: dict, model_path: Path | None, args) -> dict[str, Any]:
    if "clone" not in manifest["modes"]:
        return {"skipped": "the capture has no clone mode (the only mode that calls encode)", "failures": []}
    data = capture.load_mode_file(capture_dir, "clone", "encoder.npz")
    got = run(session, {"input_values": data["input_values"]})["audio_codes"]
    rate, per_codebook = metrics.code_match(data["audio_codes"], got)
    ok = rate >= args.code_match_min
    line("encoder", "clone reference", f"code_match={rate:.6f} per_codebook={[round(r, 4) for r in per_codebook]}", ok)
    result: dict[str, Any] = {"captured": {"code_match": rate, "per_codebook": per_codebook, "passed": ok},
                              "failures": [] if ok else [f"captured reference: code match {rate:.6f}"]}
    if model_path is None:
        result["sweep"] = "skipped (--no-sweep or no PyTorch weights)"
    else:
        result["sweep"], sweep_failures = encoder_sweep(session, model_path, data["input_values"], args)
        result["failures"] += sweep_failures
    return result


def check_decoder(session, capture_dir: Path, manifest: dict, args) -> dict[str, Any]:
    rows, failures = [], []
    for mode in manifest["modes"]:
        data = capture.load_mode_file(capture_dir, mode, "decoder.npz")
        got = run(session, {"audio_codes": data["audio_codes"]})["audio_values"]
        expected = data["audio_values"]
        for item in range(expected.shape[0]):
            lsd = metrics.log_spectral_l1(expected[item], got[item]) if got.shape == expected.shape else float("inf")
            max_abs = float(np.abs(expected[item] - got[item]).max()) if got.shape == expected.shape else float("inf")
            ok = lsd <= args.lsd_max
            line("decoder", f"{mode} item {item}", f"log_spectral_l1={lsd:.2e} max_abs={max_abs:.1e}", ok)
            rows.append({"mode": mode, "item": item, "samples": int(expected.shape[-1]), "log_spectral_l1": lsd,
                         "max_abs": max_abs, "passed": ok})
            if not ok:
                failures.append(f"{mode} item {item}: log-spectral L1 {lsd:.2e} (max {args.lsd_max:.0e})")
    return {"rows": rows, "spectral": metrics.spectral_params(), "failures": failures}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_provider(args.provider)
    graphs = parse_subset(args.graphs, "--graphs", wrappers.GRAPH_NAMES)
    manifest, export = report.verify_against_capture(args.capture_dir, args.onnx_dir, graphs)
    model_path = None
    if "encoder" in graphs and not args.no_sweep:
        model_path = validate_checkpoint_dir(Path(export["model"]["path"]))
    informational = args.provider == "cuda-tf32"
    print(f"[step 3] provider {args.provider}; model {export['model']['fingerprint']}; "
          f"capture device {manifest['device']}" + ("; TF32: a speed/precision trade-off, not a parity verdict"
                                                    if informational else ""), flush=True)
    results: dict[str, Any] = {}
    started = time.perf_counter()
    for graph in graphs:
        session = make_session(args.onnx_dir / wrappers.GRAPH_FILES[graph], args.provider, args.threads)
        problems = check_contract(session, graph)
        if graph == "transformer":
            result = check_transformer(session, args.capture_dir, manifest, args)
        elif graph == "encoder":
            result = check_encoder(session, args.capture_dir, manifest, model_path, args)
        else:
            result = check_decoder(session, args.capture_dir, manifest, args)
        result["failures"] = [f"contract: {p}" for p in problems] + result["failures"]
        result["passed"] = not result["failures"]
        results[graph] = result
        del session
    thresholds = {"transformer_argmax_min": args.argmax_min, "transformer_max_abs": args.max_abs,
                  "encoder_code_match_min": args.code_match_min, "decoder_log_spectral_l1_max": args.lsd_max}
    overall = all(r["passed"] for r in results.values())
    section = {"provider": args.provider, "verdict": "informational (TF32)" if informational else
               ("PASS" if overall else "FAIL"), "thresholds": thresholds, "capture_device": manifest["device"],
               "seconds": round(time.perf_counter() - started, 2), "graphs": results}
    report.merge_section(args.onnx_dir, ("parity", args.provider), section)

    print()
    print(f"{'graph':<12}{'verdict':<8} worst")
    for graph, result in results.items():
        if graph == "transformer":
            worst = f"argmax {result['argmax_agreement_min']:.6f}, max_abs {result['max_abs_max']:.1e}"
        elif graph == "encoder":
            rates = [result["captured"]["code_match"]] if "captured" in result else []
            rates += [r["code_match"] for r in result.get("sweep", []) if isinstance(r, dict)]
            worst = f"code match {min(rates):.6f} over {len(rates)} inputs" if rates else result.get("skipped", "")
        else:
            worst = f"log-spectral L1 {max(r['log_spectral_l1'] for r in result['rows']):.2e}"
        print(f"{graph:<12}{'PASS' if result['passed'] else 'FAIL':<8} {worst}")
        for failure in result["failures"]:
            print(f"  {graph} failed: {failure}")
    if informational:
        print(f"OVERALL (TF32, informational): {'within' if overall else 'outside'} the fp32 thresholds")
        return
    print(f"OVERALL: {'PASS' if overall else 'FAIL'}")
    if not overall:
        raise CheckFailed(f"parity failed for {', '.join(g for g, r in results.items() if not r['passed'])} "
                          f"on {args.provider}")


if __name__ == "__main__":
    run_main(main)
