#!/usr/bin/env python3
"""Step 6: the quality table of the transformer variants, on the capture's inputs.

For fp32 (the baseline, measured in the same run) and each variant made by quantize_omnivoice.py:

    per step     every captured transformer call of every mode, run as generate() runs it (cond
                 and uncond rows at their own lengths): argmax agreement and relative logit error
                 ||got - ref|| / ||ref|| against the PyTorch logits, on the rows generate() reads
    end to end   upstream generate() with the variant's transformer inside (codec graphs fp32),
                 in every captured mode: final-token agreement with PyTorch, the first divergent
                 step, the log-spectral L1 of the WAV against PyTorch's (WAVs in
                 --wav-dir/<variant>/<mode>.wav)

These are measurements, not parity verdicts: the fp32 verdicts are parity_check.py's and
infer_onnx.py's. Speed ratios and sizes are against fp32 in this same run, on the CPU and load
recorded with them. On random weights (tiny, full-random) the table shows a recipe's arithmetic
error, not the audible quality of the trained model; run it on the real checkpoint for that
(make quality MODEL=PATH). Results replace the `quality` section of onnx/export-report.json.

    python quality_omnivoice.py
    python quality_omnivoice.py --variants int8 --no-end-to-end
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from omnivoice_export.common.edge import add_capture_dir, add_onnx_dir, parse_subset
from omnivoice_export.common.measure import cpu_line
from omnivoice_export.step0_checkpoints.checkpoints import resolve_model, validate_checkpoint_dir
from omnivoice_export.step2_export import report
from omnivoice_export.step56_variants import quality
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import check_output
from omnivoice_onnx.program import THREADS, parse, run_main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_capture_dir(parser, "step 1's capture, the one the export was made from (default: capture/)")
    add_onnx_dir(parser, "step 2's export with step 5's variants in it (default: onnx/)")
    parser.add_argument(
        "--variants",
        default=None,
        help="comma-separated variants to measure besides fp32 (default: every variant in the report)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="checkpoint for generate()'s config and text tokenizer (tiny | full-random | PATH); "
        "default: the one named in the export report",
    )
    parser.add_argument(
        "--threads", type=THREADS, default=None, help="onnxruntime intra-op threads (default: all cores)"
    )
    parser.add_argument(
        "--wav-dir",
        type=Path,
        default=None,
        help="where the end-to-end WAVs go, one folder per variant (default: <capture-dir>/variants)",
    )
    parser.add_argument(
        "--no-end-to-end",
        action="store_true",
        help="per-step figures only (skips the generate() runs, the slow part at the real dims)",
    )
    return parse(parser, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    wav_dir = args.wav_dir or args.capture_dir / "variants"
    if not args.no_end_to_end:  # before minutes of measuring, not when the first WAV is written
        check_output(wav_dir, "--wav-dir", "dir")
    manifest, export = report.verify_against_capture(args.capture_dir, args.onnx_dir, ["transformer"])
    made = tuple(export.get("variants", {}))
    if not made:
        raise UserError(f"the export in {args.onnx_dir} has no variants", "run quantize_omnivoice.py (step 5) first")
    names = list(made) if args.variants is None else parse_subset(args.variants, "--variants", made)
    model_path = (
        resolve_model(args.model)
        if args.model
        else validate_checkpoint_dir(report.recorded_path(export["model"]["path"]))
    )
    machine = quality.machine()
    print(
        f"[step 6] fp32 and {', '.join(names)} on {cpu_line(machine['cpu'])}, load {machine['load_1min_at_start']}",
        flush=True,
    )
    results = {}
    started = time.perf_counter()
    greedy = None if args.no_end_to_end else quality.greedy_reference(model_path, args.capture_dir, manifest)
    for name in ["fp32", *names]:
        result = quality.measure_variant(
            name,
            model_path,
            args.onnx_dir,
            args.capture_dir,
            manifest,
            export,
            args.threads,
            not args.no_end_to_end,
            wav_dir,
            greedy,
        )
        results[name] = result
        e2e = "".join(
            f" {mode} tokens={r['token_match']:.4f} greedy={r['greedy_token_match']:.4f}"
            for mode, r in result.get("end_to_end", {}).items()
        )
        codecs = result.get("codecs", {})
        if codecs:
            e2e += (f" encoder code_match={codecs['encoder']['code_match']:.4f}" if "encoder" in codecs else "") + (
                f" decoder LSD={codecs['decoder']['log_spectral_l1_max']:.1e}" if "decoder" in codecs else ""
            )
        print(
            f"[quality] {name:<15} argmax min {result['argmax_agreement_min']:.4f} mean "
            f"{result['argmax_agreement_mean']:.4f}, rel err max {result['relative_error_max']:.1e}{e2e}",
            flush=True,
        )
    report.merge_section(
        args.onnx_dir,
        ("quality",),
        {
            "machine": machine,
            "seconds": round(time.perf_counter() - started, 1),
            "note": "measurements, not parity verdicts; ratios against fp32 in this run; random weights show "
            "a recipe's arithmetic error, not the trained model's audible quality",
            "variants": results,
        },
    )
    print()
    print(quality.table(results))
    print(
        f"\n[step 6] measured on {cpu_line(machine['cpu'])}, load {machine['load_1min_at_start']} at start; "
        f"in {report.report_path(args.onnx_dir)} under quality"
    )


if __name__ == "__main__":
    run_main(main)
