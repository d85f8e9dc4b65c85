#!/usr/bin/env python3
"""Where the ONNX transformer's time goes: onnxruntime's profiler, summed per op type.

Runs one forward (after a warm-up) at the S~435 clone layout, padded (upstream's layout) and
split (cond and uncond rows at their own length), with ORT profiling on, and prints the time per
op type and its share. MatMul's achieved GFLOP/s is printed against the analytic FLOP count.
--variants adds transformer variants of step 5 (quantize_omnivoice.py), profiled split only: the
fp32-unmasked and fp32-fused graphs are valid only for all-True masks (run_split's calls).

    python bench/profile_transformer.py --model full-random --onnx-dir bench/out/full/onnx \\
        --capture-dir bench/out/full/capture --variants fp32,fp32-unmasked,fp32-fused
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

# bench/ (this script's directory) is on sys.path; importing bench_omnivoice puts the repository there.
from bench_omnivoice import SHAPE_TEXTS, clone_request, export_parser, first_forward_inputs, transformer_flops

from omnivoice_export.cli import parse, run_main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = export_parser(__doc__)
    parser.add_argument("--shape", default="S~435", choices=tuple(SHAPE_TEXTS), help="which benchmark layout")
    parser.add_argument("--variants", default="fp32",
                        help="comma-separated graphs to profile: fp32 (the export's, padded and split) and variants")
    return parse(parser, argv)


def profile(session_path: Path, feeds_list: list[dict]) -> tuple[dict[str, float], float]:
    """(microseconds per op type, total) of one profiled pass over feeds_list, after a warm-up."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    session = ort.InferenceSession(str(session_path), sess_options=options, providers=["CPUExecutionProvider"])
    for feeds in feeds_list:
        session.run(None, feeds)
    trace = json.loads(Path(session.end_profiling()).read_text())
    # Count only the last pass: events of the warm-up come first in the trace.
    runs = [e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    start = runs[-len(feeds_list) // 2]["ts"] if len(runs) >= 2 else 0
    per_op: dict[str, float] = collections.defaultdict(float)
    for event in trace:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= start:
            per_op[event["args"]["op_name"]] += event["dur"]
    return dict(per_op), sum(per_op.values())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from omnivoice_export.checkpoints import resolve_model
    from omnivoice_export.generation import GenerationRequest
    from omnivoice_export.ort_runtime import OrtGraphs, load_onnx_omnivoice
    from omnivoice_export.quantize import variant_path
    from omnivoice_onnx.sessions import prefix_lengths, split_feeds

    model_path = resolve_model(args.model)
    config = json.loads((model_path / "config.json").read_text())
    model = load_onnx_omnivoice(model_path, OrtGraphs.load(args.onnx_dir, "cpu"))
    feeds = first_forward_inputs(model, clone_request(args.capture_dir, SHAPE_TEXTS[args.shape],
                                                      GenerationRequest.num_step))
    del model  # its transformer session: profile() opens its own, with profiling on
    lengths = prefix_lengths(feeds["attention_mask"])
    split = [group for _, group in split_feeds(**feeds)]
    seq = feeds["input_ids"].shape[-1]
    runs = []
    for variant in args.variants.split(","):
        if variant == "fp32":
            runs.append((variant, "padded", [feeds, feeds], transformer_flops(config, [seq] * len(lengths))))
        runs.append((variant, "split", split + split, transformer_flops(config, lengths)))
    for variant, label, passes, flops in runs:
        per_op, total = profile(variant_path(args.onnx_dir, variant), passes)
        print(f"\n{variant} {label}: S={seq} rows={lengths}  kernel time {total / 1e6:.3f} s, "
              f"{flops / 1e9:.0f} GFLOP -> {flops / total / 1e3:.0f} GFLOP/s overall")
        for op, micros in sorted(per_op.items(), key=lambda kv: -kv[1])[:12]:
            print(f"  {op:<16}{micros / 1e6:>8.3f} s {100 * micros / total:>6.1f}%")
        matmul = per_op.get("MatMul", 0.0)
        if matmul:
            print(f"  MatMul alone: {flops / matmul / 1e3:.0f} GFLOP/s")


if __name__ == "__main__":
    run_main(main)
