#!/usr/bin/env python3
"""Where the ONNX transformer's time goes: onnxruntime's profiler, summed per op type.

Runs one forward (after a warm-up) at the S~435 clone layout, padded (upstream's layout) and
split (cond and uncond rows at their own length), with ORT profiling on, and prints the time per
op type and its share. Achieved GFLOP/s against the analytic FLOP count: fp32 MatMul (every GEMM
of the faithful graph), the int8 GEMM kernels against the projections' FLOPs, the fused graphs'
Attention against attention's. --variants adds transformer variants of step 5 (quantize_omnivoice.py),
profiled split only: the unmasked and fused graphs are valid only for all-True masks (run_split's
calls). For a variant with int8 GEMMs, the ceiling they are measured against is a one-node
DynamicQuantizeMatMul (what onnxruntime fuses int8's DynamicQuantizeLinear + MatMulInteger into)
at the call's longest row and hidden -> 2 x intermediate (gate and up together), timed in the
same process: the share of it the graph's int8 GEMMs reach is the
"share of the int8 GEMM rate".

    python bench/profile_transformer.py --model full-random --onnx-dir bench/out/full/onnx \\
        --capture-dir bench/out/full/capture --variants fp32,fp32-unmasked,fp32-fused
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import tempfile
from pathlib import Path

import numpy as np

# bench/ (this script's directory) is on sys.path; importing bench_omnivoice puts the repository there.
from bench_omnivoice import (
    RESULTS,
    SHAPE_TEXTS,
    clone_request,
    export_parser,
    first_forward_inputs,
    transformer_flop_parts,
    transformer_flops,
)

from omnivoice_export.common.measure import (
    cpu_description,
    cpu_line,
    hardware_lines,
    hardware_record,
    integer_gemm_session,
    rate,
    results_stem,
)
from omnivoice_onnx.files import atomic_path, write_json_atomic
from omnivoice_onnx.limits import default_threads
from omnivoice_onnx.program import parse, run_main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = export_parser(__doc__)
    parser.add_argument("--shape", default="S~435", choices=tuple(SHAPE_TEXTS), help="which benchmark layout")
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="where the .json and .md results go")
    parser.add_argument(
        "--variants",
        default="fp32",
        help="comma-separated graphs to profile: fp32 (the export's, padded and split) and variants",
    )
    return parse(parser, argv)


def profile(session_path: Path, feeds_list: list[dict[str, np.ndarray]]) -> tuple[dict[str, float], float]:
    """(microseconds per op type, total) of one profiled pass over feeds_list, after a warm-up."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    if default_threads():
        options.intra_op_num_threads = default_threads()
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


# Integer GEMM kernels onnxruntime runs for quantize_dynamic's graphs, and the activation
# quantization MatMulIntegerToFloat reads apart (DynamicQuantizeMatMul does it inside).
INT8_GEMMS = ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger", "DynamicQuantizeLinear")


def int8_gemm_ceiling(
    rows: int, hidden: int, width: int, op: str = "DynamicQuantizeMatMul", seconds: float = 3.0
) -> float:
    """GOP/s of one integer GEMM node [rows, hidden] x int8 [hidden, width] (measure.integer_gemm_session:
    DynamicQuantizeMatMul as quantize_dynamic writes it, or the bare MatMulInteger), on the threads
    the profiled sessions use ($OMNIVOICE_ORT_THREADS, else onnxruntime's default)."""
    session, feeds = integer_gemm_session(rows, hidden, width, op, threads=default_threads())
    return rate(lambda: session.run(None, feeds), 2 * rows * hidden * width, seconds)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from omnivoice_export.step0_checkpoints.checkpoints import resolve_model
    from omnivoice_export.step1_capture.generation import GenerationRequest
    from omnivoice_export.step2_export.ort_runtime import OrtGraphs, load_onnx_omnivoice
    from omnivoice_onnx.contract import variant_path
    from omnivoice_onnx.sessions import prefix_lengths, split_feeds

    hardware = hardware_record()
    model_path = resolve_model(args.model)
    config = json.loads((model_path / "config.json").read_text())
    model = load_onnx_omnivoice(model_path, OrtGraphs.load(args.onnx_dir, "cpu"))
    feeds = first_forward_inputs(
        model, clone_request(args.capture_dir, SHAPE_TEXTS[args.shape], GenerationRequest.num_step)
    )
    del model  # its transformer session: profile() opens its own, with profiling on
    lengths, groups = prefix_lengths(feeds["attention_mask"]), split_feeds(**feeds)
    assert lengths is not None and groups is not None, "generate() builds block-form masks"
    split = [group for _, group in groups]
    seq = feeds["input_ids"].shape[-1]
    runs = []
    for variant in args.variants.split(","):
        if variant == "fp32":
            runs.append((variant, "padded", [feeds, feeds], transformer_flops(config, [seq] * len(lengths))))
        runs.append((variant, "split", split + split, transformer_flops(config, lengths)))
    llm = config["llm_config"]
    ceilings: dict[str, float] = {}
    fp32_split = None
    lines: list[str] = [
        f"# Transformer profile: {args.model}, {args.shape} (S={seq}, rows {lengths})",
        "",
        f"CPU: {cpu_line(cpu_description())}",
        "",
        *hardware_lines({"cpu": cpu_description(), "hardware": hardware}),
        "",
    ]
    results = []
    for variant, label, passes, flops in runs:
        per_op, total = profile(variant_path(args.onnx_dir, variant), passes)
        if (variant, label) == ("fp32", "split"):
            fp32_split = total
        record = {
            "variant": variant,
            "layout": label,
            "kernel_seconds": total / 1e6,
            "gflop": flops / 1e9,
            "per_op_seconds": {op: micros / 1e6 for op, micros in per_op.items()},
        }
        lines += [
            "",
            f"{variant} {label}: S={seq} rows={lengths}  kernel time {total / 1e6:.3f} s, "
            f"{flops / 1e9:.0f} GFLOP -> {flops / total / 1e3:.0f} GFLOP/s overall",
        ]
        for op, micros in sorted(per_op.items(), key=lambda kv: -kv[1])[:12]:
            lines.append(f"  {op:<28}{micros / 1e6:>8.3f} s {100 * micros / total:>6.1f}%")
        # The passes hold every split group twice (the warm-up, then the profiled pass).
        row_lengths = [
            group["input_ids"].shape[-1]
            for group in passes[: len(passes) // 2]
            for _ in range(group["input_ids"].shape[0])
        ]
        parts = transformer_flop_parts(config, row_lengths)
        int8_micros = sum(per_op.get(op, 0.0) for op in INT8_GEMMS)
        if per_op.get("MatMul", 0.0) and not int8_micros:
            # the faithful graph's MatMuls are every GEMM; fused graphs' are the projections and heads
            gemm_flops = flops - (parts["attention"] if "Attention" in per_op else 0.0)
            record["matmul_gflops"] = gemm_flops / per_op["MatMul"] / 1e3
            lines.append(f"  MatMul: {record['matmul_gflops']:.0f} GFLOP/s")
        if per_op.get("Attention"):
            record["attention_gflops"] = parts["attention"] / per_op["Attention"] / 1e3
            lines.append(f"  Attention: {record['attention_gflops']:.0f} GFLOP/s")
        if int8_micros:
            dims = (max(row_lengths), llm["hidden_size"], 2 * llm["intermediate_size"])
            if not ceilings:  # both one-node rates, measured once, in this process, beside the profiles
                ceilings = {op: int8_gemm_ceiling(*dims, op) for op in ("DynamicQuantizeMatMul", "MatMulInteger")}
            ceiling = ceilings["DynamicQuantizeMatMul"]
            achieved = parts["projections"] / int8_micros / 1e3
            record.update(int8_gemm_gops=achieved, one_node_gops=ceilings, one_node_dims=list(dims))
            lines.append(
                f"  int8 GEMMs ({', '.join(op for op in INT8_GEMMS if op in per_op)}): {achieved:.0f} GOP/s = "
                f"{100 * achieved / ceiling:.0f} % of one DynamicQuantizeMatMul node's {ceiling:.0f} GOP/s, "
                f"{100 * achieved / ceilings['MatMulInteger']:.0f} % of one bare MatMulInteger's "
                f"{ceilings['MatMulInteger']:.0f} ([{dims[0]}, {dims[1]}] x [{dims[1]}, {dims[2]}], the "
                f"same threads, this process); the whole graph: {100 * flops / total / 1e3 / ceiling:.0f} %"
            )
            # The floor: integer GEMMs at the ceiling, the fp32 Attention and MatMuls (heads;
            # attention too in an unfused graph) as profiled, every other op free. fp32's split time
            # over it bounds what this graph's speed-up can reach on this CPU with these kernels.
            fp32_kernels = per_op.get("Attention", 0.0) + per_op.get("MatMul", 0.0)
            floor = parts["projections"] / ceiling / 1e3 + fp32_kernels
            record["floor_seconds"] = floor / 1e6
            lines.append(
                f"  floor {floor / 1e6:.3f} s: int8 GEMMs at the ceiling, Attention and MatMul as "
                f"profiled, the other ops' {(total - int8_micros - fp32_kernels) / 1e6:.3f} s free"
                + (
                    f"; at most {fp32_split / floor:.2f}x fp32 split's {fp32_split / 1e6:.3f} s (now "
                    f"{fp32_split / total:.2f}x)"
                    if fp32_split
                    else ""
                )
            )
        results.append(record)
    text = "\n".join(lines) + "\n"
    print(text)
    stem = args.results_dir / results_stem(f"{Path(args.model).name}-profile-{args.shape.replace('~', '')}")
    meta = {
        "model": args.model,
        "shape": args.shape,
        "S": int(seq),
        "rows": [int(n) for n in lengths],
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_description(),
        "ort_threads": default_threads(),
        "hardware": hardware,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
    }
    write_json_atomic(stem.with_suffix(".json"), {"meta": meta, "profiles": results})
    with atomic_path(stem.with_suffix(".md")) as tmp:
        tmp.write_text(text)
    print(f"results: {stem.with_suffix('.json')}")


if __name__ == "__main__":
    run_main(main)
