#!/usr/bin/env python3
"""Step 3: per-graph parity of the ONNX graphs against the PyTorch capture, on captured real inputs.

    transformer  every captured step of every mode: argmax agreement and logit max-abs over the
                 rows generate() reads (plus mean-abs, and the reference's top-1/top-2 margin
                 where argmax disagrees, so a near-tie flip is told from a real error)
    encoder      exact code-match rate per codebook on the captured reference audio, plus a
                 length sweep: the reference cut to ~30 hop-multiple lengths, ONNX vs PyTorch
    decoder      log-spectral L1 per item (n_fft 1024, hop 256, log10, floor 1e-5), max-abs for
                 information

Each graph's declared inputs and outputs (names, dtypes, rank, axis names) and the shapes of every
call (one size per axis name, 960*frames samples per `frames` codes) are checked against the
contract table (omnivoice_onnx.contract). Before comparing anything, the capture manifest and the
export report must name the same model fingerprint, the capture must be the one the export was made
from (its manifest sha256, recorded in the report), each graph's metadata must name the report's
exporter and opset, and every capture and ONNX file must match its recorded sha256; otherwise it
stops with one line (exit 2).

Providers: cpu (default), cuda-fp32 (CUDA EP, TF32 off, read back from the session) and cuda-tf32
(CUDA EP defaults). cpu and cuda-fp32 are parity verdicts on the export; cuda-tf32 is reported as a
speed/precision trade-off. Under CUDA, a profiled first run of each graph reports how many nodes
onnxruntime ran on the GPU and which on the CPU (recorded as `placement`). Results are merged
into onnx/export-report.json under parity.<provider>; the exit code is 1 when any graph fails.
A graph with nothing to compare on (the encoder of a capture without clone mode) is refused
(exit 2), never reported as a PASS.

--variant NAME checks a transformer variant of step 5 (quantize_omnivoice.py) on the same captured
calls instead, run as generate() runs them (cond and uncond rows at their own lengths): a
quantized variant gets measurements (argmax agreement, relative logit error; exit 0), an fp32
variant (fp32-unmasked) the transformer's verdict; results under variants.<name>.parity.<provider>.

    python parity_check.py
    python parity_check.py --provider cuda-fp32 --graphs transformer
    python parity_check.py --variant int8
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from omnivoice_export import capture, metrics, quality, quantize, report
from omnivoice_export.checkpoints import validate_checkpoint_dir
from omnivoice_export.cli import (
    THREADS,
    CheckFailed,
    check_input_dir,
    check_output,
    float_range,
    parse,
    parse_subset,
    run_main,
)
from omnivoice_export.report import read_graph_metadata
from omnivoice_onnx.contract import (
    CONTRACTS,
    GRAPH_FILES,
    GRAPH_NAMES,
    THRESHOLDS,
    ort_signature,
    shape_problems,
    signature_problems,
)
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.sessions import PROVIDERS, check_provider, make_session, node_placement, run

SWEEP_LENGTHS = 30
# The flag overriding each graph's parity tolerance (contract.tolerances) for one run, and its help.
THRESHOLD_FLAGS = {  # key: (flag, help, its range: a rate in [0, 1] or a non-negative bound)
    "transformer_argmax_min": ("--argmax-min", "transformer: minimum argmax agreement on the rows generate() reads",
                               float_range(0, 1)),
    "transformer_max_abs": ("--max-abs", "transformer: maximum |logit difference| on those rows", float_range(0)),
    "encoder_code_match_min": ("--code-match-min", "encoder: minimum exact code-match rate", float_range(0, 1)),
    "decoder_log_spectral_l1_max": ("--lsd-max", "decoder: maximum log-spectral L1", float_range(0)),
}
TOLERANCES = tuple(key for contract in CONTRACTS.values() for key in contract.tolerances)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--provider", default="cpu", help=f"one of {', '.join(PROVIDERS)}")
    parser.add_argument("--graphs", default=",".join(GRAPH_NAMES), help="comma-separated subset to check")
    parser.add_argument("--capture-dir", type=Path, default=capture.DEFAULT_DIR, help="step 1's capture")
    parser.add_argument("--onnx-dir", type=Path, default=report.DEFAULT_ONNX_DIR, help="step 2's export")
    parser.add_argument("--threads", type=THREADS, default=None,
                        help="onnxruntime intra-op threads (default: all cores)")
    for key in TOLERANCES:
        flag, text, kind = THRESHOLD_FLAGS[key]
        parser.add_argument(flag, type=kind, default=THRESHOLDS[key], dest=key,
                            metavar=flag[2:].upper().replace("-", "_"), help=text)
    parser.add_argument("--no-sweep", action="store_true", help="skip the encoder length sweep (needs PyTorch weights)")
    parser.add_argument(
        "--variant",
        default=None,
        help="check a transformer variant made by quantize_omnivoice.py instead of the export's graphs: "
        "every captured call run as generate() runs it (cond and uncond rows at their own "
        "lengths); a quantized variant is measured (argmax agreement, relative logit error), "
        "an fp32 one (fp32-unmasked) judged by the transformer thresholds",
    )
    return parse(parser, argv)


def call_shape_problems(graph: str, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> list[str]:
    """One call's arrays against the contract's axes (see contract.shape_problems)."""
    return shape_problems(graph, {name: array.shape for name, array in {**feeds, **outputs}.items()})


def line(graph: str, label: str, values: str, ok: bool | None) -> None:
    verdict = "OK" if ok else ("FAIL" if ok is not None else "info")
    print(f"[{graph}] {label:<22} {values} {verdict}", flush=True)


def first_feeds(graph: str, capture_dir: Path, manifest: dict) -> dict[str, np.ndarray]:
    """The first captured input of `graph` (one run of it shows where onnxruntime put each node)."""
    mode = next(iter(manifest["modes"]))
    if graph == "transformer":
        data = capture.load_step(capture_dir, mode, capture.mode_steps(manifest, mode)[0])
    elif graph == "encoder":
        data = capture.load_mode_file(capture_dir, "clone", capture.ENCODER_FILE)
    else:
        data = capture.load_mode_file(capture_dir, mode, capture.item_files(manifest, mode, capture.DECODER_FILE)[0])
    return {name: data[name] for name in CONTRACTS[graph].input_names}


def check_placement(graph: str, session, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    """Under a CUDA provider: how many nodes onnxruntime ran on the GPU and which on the CPU
    (information: it keeps shape arithmetic on the CPU by design)."""
    run(session, feeds)
    placement = node_placement(session)
    cpu_ops = ", ".join(f"{op} x{count}" for op, count in sorted(placement["cpu_ops"].items(), key=lambda i: -i[1]))
    nodes = ", ".join(f"{count} on {provider}" for provider, count in placement["nodes"].items())
    line(graph, "node placement", nodes + (f" (CPU: {cpu_ops})" if cpu_ops else ""), None)
    return placement


def check_transformer(session, capture_dir: Path, manifest: dict, thresholds: dict[str, float]) -> dict[str, Any]:
    rows, failures = [], []
    argmax_min, max_abs = thresholds["transformer_argmax_min"], thresholds["transformer_max_abs"]
    for mode in manifest["modes"]:
        for step in capture.mode_steps(manifest, mode):
            data = capture.load_step(capture_dir, mode, step)  # one step at a time: bounded memory
            feeds = {k: data[k] for k in CONTRACTS["transformer"].input_names}
            outputs = run(session, feeds)
            logits = outputs["logits"]
            problems = call_shape_problems("transformer", feeds, outputs)
            if problems:  # rows cannot be matched with the capture's: nothing to compute metrics on
                failures += [f"{mode} step {step}: {p}" for p in problems]
                line("transformer", f"{mode} step {step:>2}", f"logits {list(logits.shape)}", False)
                rows.append({"mode": mode, "step": step, "S": int(feeds["input_ids"].shape[-1]), "passed": False})
                continue
            captured = np.concatenate([data["logits_cond"].reshape(-1, logits.shape[-1]),
                                       data["logits_uncond"].reshape(-1, logits.shape[-1])])
            stats = metrics.logit_stats(captured, capture.read_rows(logits, data["attention_mask"]))
            mask = data["attention_mask"][:, 0]
            no_key = int((~mask.any(-1)).sum()) * logits.shape[1]
            ok = stats.passed(argmax_min, max_abs)
            flip = (
                ""
                if not stats.flips
                else f" flips={stats.flips} margin={stats.flip_margin_min:.2e}..{stats.flip_margin_max:.2e}"
            )
            line(
                "transformer",
                f"{mode} step {step:>2}",
                f"argmax={stats.argmax_agreement:.6f} max_abs={stats.max_abs:.1e} mean_abs={stats.mean_abs:.1e}{flip}",
                ok,
            )
            rows.append({"mode": mode, "step": step, "S": int(logits.shape[-2]), **vars(stats),
                         "rows_excluded_no_key": no_key, "passed": ok})
            if not ok:
                failures.append(f"{mode} step {step}: argmax {stats.argmax_agreement:.6f} (min {argmax_min}), "
                                f"max_abs {stats.max_abs:.2e} (max {max_abs:.0e})")
    compared = [r for r in rows if "argmax_agreement" in r]
    worst = {"argmax_agreement_min": min((r["argmax_agreement"] for r in compared), default=0.0),
             "max_abs_max": max((r["max_abs"] for r in compared), default=float("inf"))}
    return {"rows": rows, **worst, "failures": failures}


def encoder_sweep(session, model_path: Path, audio: np.ndarray, hop: int,
                  thresholds: dict[str, float]) -> tuple[list[dict], list[str]]:
    """The captured reference cut to ~30 hop-multiple lengths: ONNX codes vs PyTorch codes."""
    import torch
    from transformers import HiggsAudioV2TokenizerModel
    from transformers.utils import logging as hf_logging

    from omnivoice_export.wrappers import EncoderWrapper

    hf_logging.disable_progress_bar()  # a per-tensor "Loading weights" bar says nothing about parity
    tokenizer = HiggsAudioV2TokenizerModel.from_pretrained(str(model_path / "audio_tokenizer")).eval()
    module = EncoderWrapper(tokenizer)
    frames = audio.shape[-1] // hop
    lengths = sorted({int(f) for f in np.linspace(2, frames, SWEEP_LENGTHS)})
    rows, failures = [], []
    for frame_count in lengths:
        feeds = {"input_values": audio[..., : frame_count * hop]}
        with torch.no_grad():
            expected = module(torch.from_numpy(feeds["input_values"])).numpy()
        outputs = run(session, feeds)
        failures += [f"sweep {frame_count} frames: {p}" for p in call_shape_problems("encoder", feeds, outputs)]
        rate, _ = metrics.code_match(expected, outputs["audio_codes"])
        ok = rate >= thresholds["encoder_code_match_min"]
        line("encoder", f"sweep {frame_count:>4} frames", f"code_match={rate:.6f}", ok)
        rows.append({"frames": frame_count, "samples": int(feeds["input_values"].shape[-1]), "code_match": rate,
                     "passed": ok})
        if not ok:
            failures.append(f"sweep {frame_count} frames: code match {rate:.6f}")
    return rows, failures


def check_encoder(session, capture_dir: Path, manifest: dict, model_path: Path | None, hop: int,
                  thresholds: dict[str, float]) -> dict[str, Any]:
    data = capture.load_mode_file(capture_dir, "clone", capture.ENCODER_FILE)
    feeds = {"input_values": data["input_values"]}
    outputs = run(session, feeds)
    rate, per_codebook = metrics.code_match(data["audio_codes"], outputs["audio_codes"])
    ok = rate >= thresholds["encoder_code_match_min"]
    line("encoder", "clone reference", f"code_match={rate:.6f} per_codebook={[round(r, 4) for r in per_codebook]}", ok)
    result: dict[str, Any] = {"captured": {"code_match": rate, "per_codebook": per_codebook, "passed": ok},
                              "failures": [] if ok else [f"captured reference: code match {rate:.6f}"]}
    result["failures"] += [f"captured reference: {p}" for p in call_shape_problems("encoder", feeds, outputs)]
    if model_path is None:
        result["sweep"] = "skipped (--no-sweep or no PyTorch weights)"
    else:
        result["sweep"], sweep_failures = encoder_sweep(session, model_path, data["input_values"], hop, thresholds)
        result["failures"] += sweep_failures
    return result


def check_decoder(session, capture_dir: Path, manifest: dict, thresholds: dict[str, float]) -> dict[str, Any]:
    rows, failures = [], []
    lsd_max = thresholds["decoder_log_spectral_l1_max"]
    for mode in manifest["modes"]:
        # One decode() per item of the request, as upstream calls it (batch 1 each).
        for item, name in enumerate(capture.item_files(manifest, mode, capture.DECODER_FILE)):
            data = capture.load_mode_file(capture_dir, mode, name)
            feeds = {"audio_codes": data["audio_codes"]}
            outputs = run(session, feeds)
            problems = call_shape_problems("decoder", feeds, outputs)
            failures += [f"{mode} item {item}: {p}" for p in problems]
            got, expected = outputs["audio_values"], data["audio_values"]
            same = got.shape == expected.shape
            lsd = metrics.log_spectral_l1(expected, got) if same else float("inf")
            max_abs = float(np.abs(expected - got).max()) if same else float("inf")
            ok = lsd <= lsd_max and not problems
            line("decoder", f"{mode} item {item}", f"log_spectral_l1={lsd:.2e} max_abs={max_abs:.1e}", ok)
            rows.append({"mode": mode, "item": item, "samples": int(expected.shape[-1]), "log_spectral_l1": lsd,
                         "max_abs": max_abs, "passed": ok})
            if lsd > lsd_max:
                failures.append(f"{mode} item {item}: log-spectral L1 {lsd:.2e} (max {lsd_max:.0e})")
    return {"rows": rows, "spectral": metrics.spectral_params(), "failures": failures}


def check_variant(args, thresholds: dict[str, float]) -> None:
    """--variant: its transformer on every captured call through run_split, as generate() runs it
    (the unmasked fp32 graph is only valid there). Results go under variants.<name>.parity.<provider>."""
    manifest, export = report.verify_against_capture(args.capture_dir, args.onnx_dir, ["transformer"])
    path = quantize.verify_variant(args.onnx_dir, export, args.variant)
    judged = export["variants"][args.variant]["recipe"]["bits"] == 32
    argmax_min, max_abs = thresholds["transformer_argmax_min"], thresholds["transformer_max_abs"]
    print(
        f"[step 3] variant {args.variant} "
        f"({'fp32: judged by the transformer thresholds' if judged else 'quantized: measured, not judged'}); "
        f"provider {args.provider}; model {export['model']['fingerprint']}",
        flush=True,
    )
    started = time.perf_counter()
    session = make_session(path, args.provider, args.threads)
    failures = [f"contract: {p}" for p in signature_problems("transformer", *ort_signature(session))]
    rows = quality.step_quality(session, args.capture_dir, manifest)
    for row in rows:
        row["passed"] = (row["argmax_agreement"] >= argmax_min and row["max_abs"] <= max_abs) if judged else None
        line("transformer", f"{row['mode']} step {row['step']:>2}", f"argmax={row['argmax_agreement']:.6f} "
             f"rel_err={row['relative_error']:.1e} max_abs={row['max_abs']:.1e} flips={row['flips']}", row["passed"])
        if row["passed"] is False:
            failures.append(
                f"{row['mode']} step {row['step']}: argmax {row['argmax_agreement']:.6f} (min {argmax_min}), "
                f"max_abs {row['max_abs']:.2e} (max {max_abs:.0e})"
            )
    worst = {
        "argmax_agreement_min": min(r["argmax_agreement"] for r in rows),
        "relative_error_max": max(r["relative_error"] for r in rows),
        "max_abs_max": max(r["max_abs"] for r in rows),
    }
    verdict = ("PASS" if not failures else "FAIL") if judged else "measurement (quantized variant)"
    report.merge_section(args.onnx_dir, ("variants", args.variant, "parity", args.provider), {
        "provider": args.provider, "verdict": verdict, "execution": "run_split (rows at their own lengths)",
        "thresholds": thresholds if judged else None, "seconds": round(time.perf_counter() - started, 2),
        "rows": rows, **worst, "failures": failures})
    print()
    print(f"variant {args.variant}: argmax agreement min {worst['argmax_agreement_min']:.6f}, relative error max "
          f"{worst['relative_error_max']:.1e}, max_abs {worst['max_abs_max']:.1e}: {verdict}")
    for failure in failures:
        print(f"  transformer failed: {failure}")
    if failures:
        raise CheckFailed(
            f"variant {args.variant}: {failures[0]}" + (f" (+{len(failures) - 1} more)" if len(failures) > 1 else "")
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_provider(args.provider)
    graphs = parse_subset(args.graphs, "--graphs", GRAPH_NAMES)
    thresholds = {key: getattr(args, key) for key in TOLERANCES}
    check_input_dir(args.capture_dir, "--capture-dir")
    check_output(args.onnx_dir, "--onnx-dir", "dir")  # the results are merged into its report
    if args.variant is not None:
        check_variant(args, thresholds)
        return
    manifest, export = report.verify_against_capture(args.capture_dir, args.onnx_dir, graphs)
    if "encoder" in graphs and "clone" not in manifest["modes"]:  # a verdict on nothing would read as a PASS
        raise UserError(f"the capture in {args.capture_dir} has no clone mode, the only one that calls encode(): "
                        "there is nothing to check the encoder on",
                        "re-run capture_reference.py with clone among --modes, or pass --graphs transformer,decoder")
    model_path = None
    if "encoder" in graphs and not args.no_sweep:
        model_path = validate_checkpoint_dir(report.recorded_path(export["model"]["path"]))
    informational = args.provider == "cuda-tf32"
    print(f"[step 3] provider {args.provider}; model {export['model']['fingerprint']}; "
          f"capture device {manifest['device']}" + ("; TF32: a speed/precision trade-off, not a parity verdict"
                                                    if informational else ""), flush=True)
    results: dict[str, Any] = {}
    started = time.perf_counter()
    for graph in graphs:
        path = args.onnx_dir / GRAPH_FILES[graph]
        cuda = args.provider.startswith("cuda")
        session = make_session(path, args.provider, args.threads, profile=cuda)
        placement = check_placement(graph, session, first_feeds(graph, args.capture_dir, manifest)) if cuda else None
        problems = signature_problems(graph, *ort_signature(session))
        if graph == "transformer":
            result = check_transformer(session, args.capture_dir, manifest, thresholds)
        elif graph == "encoder":
            hop = int(read_graph_metadata(path)["hop_length"])
            result = check_encoder(session, args.capture_dir, manifest, model_path, hop, thresholds)
        else:
            result = check_decoder(session, args.capture_dir, manifest, thresholds)
        result["failures"] = [f"contract: {p}" for p in problems] + result["failures"]
        result["passed"] = not result["failures"]
        if placement is not None:
            result["placement"] = placement
        results[graph] = result
        del session
    overall = all(r["passed"] for r in results.values())
    report.write_parity(args.onnx_dir, args.provider, "informational (TF32)" if informational else
                        ("PASS" if overall else "FAIL"), thresholds, manifest["device"],
                        time.perf_counter() - started, results)

    print()
    print(f"{'graph':<12}{'verdict':<8} worst")
    for graph, result in results.items():
        if graph == "transformer":
            worst = f"argmax {result['argmax_agreement_min']:.6f}, max_abs {result['max_abs_max']:.1e}"
        elif graph == "encoder":
            rates = [result["captured"]["code_match"]]
            rates += [r["code_match"] for r in result["sweep"] if isinstance(r, dict)]
            worst = f"code match {min(rates):.6f} over {len(rates)} inputs"
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
