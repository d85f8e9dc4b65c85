"""Step 3's logic: per-graph parity of the ONNX graphs against the PyTorch capture, on captured
real inputs (parity_check.py is its command line; the tests call it through there).

One line per call and graph (`[transformer] clone step 17 argmax=1.000000 max_abs=3.1e-06 ... OK`),
every failure collected before the verdict, so one run shows all problems. The thresholds are the
contract's (omnivoice_onnx.contract.THRESHOLDS), overridable per run by the script's flags.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from omnivoice_export.common import metrics
from omnivoice_export.step0_checkpoints.checkpoints import validate_checkpoint_dir
from omnivoice_export.step1_capture import capture
from omnivoice_export.step2_export import report
from omnivoice_export.step2_export.report import read_graph_metadata
from omnivoice_export.step56_variants import quality, quantize
from omnivoice_onnx.contract import CONTRACTS, GRAPH_FILES, ort_signature, shape_problems, signature_problems
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.program import CheckFailed
from omnivoice_onnx.sessions import make_session, node_placement, run

SWEEP_LENGTHS = 30  # encoder length sweep: the captured reference cut to about this many hop-multiple lengths


def call_shape_problems(graph: str, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> list[str]:
    """One call's arrays against the contract's axes (see contract.shape_problems)."""
    return shape_problems(graph, {name: array.shape for name, array in {**feeds, **outputs}.items()})


def line(graph: str, label: str, values: str, ok: bool | None) -> None:
    verdict = "OK" if ok else ("FAIL" if ok is not None else "info")
    print(f"[{graph}] {label:<22} {values} {verdict}", flush=True)


def first_feeds(graph: str, capture_dir: Path, manifest: dict[str, Any]) -> dict[str, np.ndarray]:
    """The first captured input of `graph` (one run of it shows where onnxruntime put each node)."""
    mode = next(iter(manifest["modes"]))
    if graph == "transformer":
        data = capture.load_step(capture_dir, mode, capture.mode_steps(manifest, mode)[0])
    elif graph == "encoder":
        data = capture.load_mode_file(capture_dir, "clone", capture.ENCODER_FILE)
    else:
        data = capture.load_mode_file(capture_dir, mode, capture.item_files(manifest, mode, capture.DECODER_FILE)[0])
    return {name: data[name] for name in CONTRACTS[graph].input_names}


def check_placement(graph: str, session: Any, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    """Under a CUDA provider: how many nodes onnxruntime ran on the GPU and which on the CPU
    (information: it keeps shape arithmetic on the CPU by design)."""
    run(session, feeds)
    placement = node_placement(session)
    cpu_ops = ", ".join(f"{op} x{count}" for op, count in sorted(placement["cpu_ops"].items(), key=lambda i: -i[1]))
    nodes = ", ".join(f"{count} on {provider}" for provider, count in placement["nodes"].items())
    line(graph, "node placement", nodes + (f" (CPU: {cpu_ops})" if cpu_ops else ""), None)
    return placement


def check_transformer(
    session: Any, capture_dir: Path, manifest: dict[str, Any], thresholds: dict[str, float]
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
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
            captured = np.concatenate(
                [data["logits_cond"].reshape(-1, logits.shape[-1]), data["logits_uncond"].reshape(-1, logits.shape[-1])]
            )
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
            rows.append(
                {
                    "mode": mode,
                    "step": step,
                    "S": int(logits.shape[-2]),
                    **vars(stats),
                    "rows_excluded_no_key": no_key,
                    "passed": ok,
                }
            )
            if not ok:
                failures.append(
                    f"{mode} step {step}: argmax {stats.argmax_agreement:.6f} (min {argmax_min}), "
                    f"max_abs {stats.max_abs:.2e} (max {max_abs:.0e})"
                )
    compared = [r for r in rows if "argmax_agreement" in r]
    worst = {
        "argmax_agreement_min": min((r["argmax_agreement"] for r in compared), default=0.0),
        "max_abs_max": max((r["max_abs"] for r in compared), default=float("inf")),
    }
    return {"rows": rows, **worst, "failures": failures}


def encoder_sweep(
    session: Any, model_path: Path, audio: np.ndarray, hop: int, thresholds: dict[str, float]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The captured reference cut to ~30 hop-multiple lengths: ONNX codes vs PyTorch codes."""
    import torch
    from transformers import HiggsAudioV2TokenizerModel
    from transformers.utils import logging as hf_logging

    from omnivoice_export.step2_export.wrappers import EncoderWrapper

    # a per-tensor "Loading weights" bar says nothing about parity (transformers leaves it unannotated)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tokenizer = HiggsAudioV2TokenizerModel.from_pretrained(str(model_path / "audio_tokenizer"))
    tokenizer.eval()  # type: ignore[no-untyped-call]  # PreTrainedModel.eval() is unannotated
    module = EncoderWrapper(tokenizer)
    frames = audio.shape[-1] // hop
    lengths = sorted({int(f) for f in np.linspace(2, frames, SWEEP_LENGTHS)})
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for frame_count in lengths:
        feeds = {"input_values": audio[..., : frame_count * hop]}
        with torch.no_grad():
            expected = module(torch.from_numpy(feeds["input_values"])).numpy()
        outputs = run(session, feeds)
        failures += [f"sweep {frame_count} frames: {p}" for p in call_shape_problems("encoder", feeds, outputs)]
        rate, _ = metrics.code_match(expected, outputs["audio_codes"])
        ok = rate >= thresholds["encoder_code_match_min"]
        line("encoder", f"sweep {frame_count:>4} frames", f"code_match={rate:.6f}", ok)
        rows.append(
            {"frames": frame_count, "samples": int(feeds["input_values"].shape[-1]), "code_match": rate, "passed": ok}
        )
        if not ok:
            failures.append(f"sweep {frame_count} frames: code match {rate:.6f}")
    return rows, failures


def check_encoder(
    session: Any,
    capture_dir: Path,
    manifest: dict[str, Any],
    model_path: Path | None,
    hop: int,
    thresholds: dict[str, float],
) -> dict[str, Any]:
    data = capture.load_mode_file(capture_dir, "clone", capture.ENCODER_FILE)
    feeds = {"input_values": data["input_values"]}
    outputs = run(session, feeds)
    rate, per_codebook = metrics.code_match(data["audio_codes"], outputs["audio_codes"])
    ok = rate >= thresholds["encoder_code_match_min"]
    line("encoder", "clone reference", f"code_match={rate:.6f} per_codebook={[round(r, 4) for r in per_codebook]}", ok)
    result: dict[str, Any] = {
        "captured": {"code_match": rate, "per_codebook": per_codebook, "passed": ok},
        "failures": [] if ok else [f"captured reference: code match {rate:.6f}"],
    }
    result["failures"] += [f"captured reference: {p}" for p in call_shape_problems("encoder", feeds, outputs)]
    if model_path is None:
        result["sweep"] = "skipped (--no-sweep or no PyTorch weights)"
    else:
        result["sweep"], sweep_failures = encoder_sweep(session, model_path, data["input_values"], hop, thresholds)
        result["failures"] += sweep_failures
    return result


def check_decoder(
    session: Any, capture_dir: Path, manifest: dict[str, Any], thresholds: dict[str, float]
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
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
            rows.append(
                {
                    "mode": mode,
                    "item": item,
                    "samples": int(expected.shape[-1]),
                    "log_spectral_l1": lsd,
                    "max_abs": max_abs,
                    "passed": ok,
                }
            )
            if lsd > lsd_max:
                failures.append(f"{mode} item {item}: log-spectral L1 {lsd:.2e} (max {lsd_max:.0e})")
    return {"rows": rows, "spectral": metrics.spectral_params(), "failures": failures}


def check_variant(
    capture_dir: Path, onnx_dir: Path, variant: str, provider: str, threads: int | None, thresholds: dict[str, float]
) -> None:
    """A transformer variant on every captured call through run_split, as generate() runs it (the
    unmasked fp32 graph is only valid there): a quantized variant is measured, an fp32 one judged.
    Results go under variants.<name>.parity.<provider>; raises CheckFailed on a judged failure."""
    manifest, export = report.verify_against_capture(capture_dir, onnx_dir, ["transformer"])
    path = quantize.verify_variant(onnx_dir, export, variant)
    judged = export["variants"][variant]["recipe"]["bits"] == 32
    argmax_min, max_abs = thresholds["transformer_argmax_min"], thresholds["transformer_max_abs"]
    print(
        f"[step 3] variant {variant} "
        f"({'fp32: judged by the transformer thresholds' if judged else 'quantized: measured, not judged'}); "
        f"provider {provider}; model {export['model']['fingerprint']}",
        flush=True,
    )
    started = time.perf_counter()
    session = make_session(path, provider, threads)
    failures = [f"contract: {p}" for p in signature_problems("transformer", *ort_signature(session))]
    rows = quality.step_quality(session, capture_dir, manifest)
    for row in rows:
        row["passed"] = (row["argmax_agreement"] >= argmax_min and row["max_abs"] <= max_abs) if judged else None
        line(
            "transformer",
            f"{row['mode']} step {row['step']:>2}",
            f"argmax={row['argmax_agreement']:.6f} "
            f"rel_err={row['relative_error']:.1e} max_abs={row['max_abs']:.1e} flips={row['flips']}",
            row["passed"],
        )
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
    report.merge_section(
        onnx_dir,
        ("variants", variant, "parity", provider),
        {
            "provider": provider,
            "verdict": verdict,
            "execution": "run_split (rows at their own lengths)",
            "thresholds": thresholds if judged else None,
            "seconds": round(time.perf_counter() - started, 2),
            "rows": rows,
            **worst,
            "failures": failures,
        },
    )
    print()
    print(
        f"variant {variant}: argmax agreement min {worst['argmax_agreement_min']:.6f}, relative error max "
        f"{worst['relative_error_max']:.1e}, max_abs {worst['max_abs_max']:.1e}: {verdict}"
    )
    for failure in failures:
        print(f"  transformer failed: {failure}")
    if failures:
        raise CheckFailed(
            f"variant {variant}: {failures[0]}" + (f" (+{len(failures) - 1} more)" if len(failures) > 1 else "")
        )


def check_graphs(
    capture_dir: Path,
    onnx_dir: Path,
    graphs: list[str],
    provider: str,
    threads: int | None,
    thresholds: dict[str, float],
    sweep: bool = True,
) -> None:
    """Step 3 on the export's own graphs: each graph against the capture (its contract, then its
    metric), one line per call, the table of verdicts, OVERALL. Results are merged into the report
    under parity.<provider>; raises CheckFailed when a graph fails (never for cuda-tf32, which is
    information), UserError before any work when the inputs cannot be compared."""
    manifest, export = report.verify_against_capture(capture_dir, onnx_dir, graphs)
    if "encoder" in graphs and "clone" not in manifest["modes"]:  # a verdict on nothing would read as a PASS
        raise UserError(
            f"the capture in {capture_dir} has no clone mode, the only one that calls encode(): "
            "there is nothing to check the encoder on",
            "re-run capture_reference.py with clone among --modes, or pass --graphs transformer,decoder",
        )
    model_path = None
    if "encoder" in graphs and sweep:
        model_path = validate_checkpoint_dir(report.recorded_path(export["model"]["path"]))
    informational = provider == "cuda-tf32"
    print(
        f"[step 3] provider {provider}; model {export['model']['fingerprint']}; "
        f"capture device {manifest['device']}"
        + ("; TF32: a speed/precision trade-off, not a parity verdict" if informational else ""),
        flush=True,
    )
    results: dict[str, Any] = {}
    started = time.perf_counter()
    for graph in graphs:
        path = onnx_dir / GRAPH_FILES[graph]
        cuda = provider.startswith("cuda")
        session = make_session(path, provider, threads, profile=cuda)
        placement = check_placement(graph, session, first_feeds(graph, capture_dir, manifest)) if cuda else None
        problems = signature_problems(graph, *ort_signature(session))
        if graph == "transformer":
            result = check_transformer(session, capture_dir, manifest, thresholds)
        elif graph == "encoder":
            hop = int(read_graph_metadata(path)["hop_length"])
            result = check_encoder(session, capture_dir, manifest, model_path, hop, thresholds)
        else:
            result = check_decoder(session, capture_dir, manifest, thresholds)
        result["failures"] = [f"contract: {p}" for p in problems] + result["failures"]
        result["passed"] = not result["failures"]
        if placement is not None:
            result["placement"] = placement
        results[graph] = result
        del session
    overall = all(r["passed"] for r in results.values())
    report.write_parity(
        onnx_dir,
        provider,
        "informational (TF32)" if informational else ("PASS" if overall else "FAIL"),
        thresholds,
        manifest["device"],
        time.perf_counter() - started,
        results,
    )

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
        raise CheckFailed(
            f"parity failed for {', '.join(g for g, r in results.items() if not r['passed'])} on {provider}"
        )
