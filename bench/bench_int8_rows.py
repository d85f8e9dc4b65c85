#!/usr/bin/env python3
"""int8's per-row activation scales against int8-pertensor's per-tensor ones, on one Qwen3 layer's
seven projections at the real dims (random weights; no export needed).

The graph: x [S, 1024] -> q (2048), k, v (1024 each) -> o_proj (2048 -> 1024) -> + x -> gate, up
(3072) -> gate * up -> down_proj (3072 -> 1024), summed into one output. Three forms of it: fp32,
quantize_dynamic per channel (int8-pertensor's quantization: DynamicQuantizeLinear +
MatMulIntegerToFloat after onnxruntime's fusions) and omnivoice_export.step56_variants.rowwise.quantize_rowwise
(int8's: a scale per row, MatMulInteger, two scale multiplies). Each round runs every form once per
shape, in turn (interleaved, so load drifts hit all alike); the median over rounds is reported, with
the CPU and its load.

    python bench/bench_int8_rows.py                      # S = 310, 730; 5 rounds of 5 calls; 2 threads
    python bench/bench_int8_rows.py --shapes 435 --rounds 9
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omnivoice_export.common.measure import cpu_description  # noqa: E402
from omnivoice_export.step56_variants import rowwise  # noqa: E402
from omnivoice_onnx.program import parse, run_main  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
HIDDEN, QUERY, KV, MLP = 1024, 2048, 1024, 3072  # the real Qwen3 dims (16 x 128 query, 8 x 128 kv)
FORMS = ("fp32", "int8-pertensor", "int8")


def layer_model(seed: int = 0) -> onnx.ModelProto:
    """The seven projections of one layer as one fp32 graph (module docstring)."""
    rng = np.random.default_rng(seed)
    shapes = {
        "wq": (HIDDEN, QUERY),
        "wk": (HIDDEN, KV),
        "wv": (HIDDEN, KV),
        "wo": (QUERY, HIDDEN),
        "wg": (HIDDEN, MLP),
        "wu": (HIDDEN, MLP),
        "wd": (MLP, HIDDEN),
    }
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.02).astype(np.float32), n) for n, s in shapes.items()]
    nodes = [
        helper.make_node("MatMul", [src, w], [out], name=f"mm_{out}")
        for src, w, out in (("x", "wq", "q"), ("x", "wk", "k"), ("x", "wv", "v"), ("q", "wo", "o"))
    ]
    nodes += [
        helper.make_node("Add", ["o", "x"], ["h"]),
        helper.make_node("MatMul", ["h", "wg"], ["g"], name="mm_g"),
        helper.make_node("MatMul", ["h", "wu"], ["u"], name="mm_u"),
        helper.make_node("Mul", ["g", "u"], ["m"]),
        helper.make_node("MatMul", ["m", "wd"], ["d"], name="mm_d"),
        helper.make_node("Add", ["k", "v"], ["kv"]),
        helper.make_node("Add", ["d", "kv"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, HIDDEN])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def build_forms(workdir: Path) -> dict[str, Path]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    paths = {name: workdir / f"{name}.onnx" for name in FORMS}
    onnx.save(layer_model(), str(paths["fp32"]))
    quantize_dynamic(
        paths["fp32"],
        paths["int8-pertensor"],
        per_channel=True,
        reduce_range=False,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
    )
    rows = layer_model()
    rowwise.quantize_rowwise(rows, [])
    onnx.save(rows, str(paths["int8"]))
    return paths


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="310,730", help="comma-separated sequence lengths S")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    parser.add_argument("--calls", type=int, default=5, help="calls per form, shape and round (mean)")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: print only)")
    return parse(parser, argv)


def main(argv: list[str] | None = None) -> None:
    import onnxruntime as ort

    args = parse_args(argv)
    shapes = [int(s) for s in args.shapes.split(",")]
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {
            name: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            for name, path in build_forms(Path(tmp)).items()
        }
    feeds = {s: {"x": np.random.default_rng(s).standard_normal((1, s, HIDDEN)).astype(np.float32)} for s in shapes}
    for s in shapes:
        for session in sessions.values():
            session.run(None, feeds[s])  # warm-up
    times: dict[str, dict[int, list[float]]] = {name: {s: [] for s in shapes} for name in FORMS}
    load = os.getloadavg()[0]
    for _round in range(args.rounds):
        for s in shapes:
            for name, session in sessions.items():
                started = time.perf_counter()
                for _ in range(args.calls):
                    session.run(None, feeds[s])
                times[name][s].append((time.perf_counter() - started) / args.calls)
    median = {name: {s: float(np.median(v)) for s, v in per.items()} for name, per in times.items()}
    print(
        f"one layer's projections at the real dims, {args.threads} threads, {cpu_description()}, "
        f"load {load:.2f} at start, {os.getloadavg()[0]:.2f} at end"
    )
    print(f"{'S':>6}" + "".join(f"{name + ' ms':>20}" for name in FORMS) + f"{'fp32/int8':>12}{'pertensor/int8':>16}")
    for s in shapes:
        row = median
        print(
            f"{s:>6}"
            + "".join(f"{row[name][s] * 1e3:>20.2f}" for name in FORMS)
            + f"{row['fp32'][s] / row['int8'][s]:>12.2f}{row['int8-pertensor'][s] / row['int8'][s]:>16.2f}"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "cpu": cpu_description(),
                    "threads": args.threads,
                    "rounds": args.rounds,
                    "calls": args.calls,
                    "load_start": load,
                    "load_end": os.getloadavg()[0],
                    "median_seconds": {n: {str(s): v for s, v in p.items()} for n, p in median.items()},
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    run_main(main)
