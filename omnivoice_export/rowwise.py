"""The `int8` recipe's two rewrites: outlier channels folded out of the norms, per-row activation scales.

Why (docs/variants.md, the outlier proxy): a trained Qwen-family backbone's linear layers read
inputs with a few outlier channels ~100x the rest (LLM.int8(), SmoothQuant) and, at the first
position and the delimiter tokens, massive values that an early layer's down_proj writes into the
residual (Sun et al. 2024: its input spikes there too). quantize_dynamic's per-tensor activation
scale is set by the largest value of the whole call, so one outlier channel or one massive row
leaves the other values a few of the 255 levels.

- fold_norm_scales (SmoothQuant, Xiao et al. 2023, with its scales read from the weights): for each
  RMSNorm whose output only quantized MatMuls read, channel j's activation scale is proportional
  to the norm's weight g_j (the normalised residual has no preferred channel), so
  s_j = |g_j|^ALPHA / max_n |W_jn|^(1 - ALPHA), rounded to a power of two; g_j /= s_j and
  W_j. *= s_j. Exact in fp32, bit for bit: scaling by a power of two commutes with rounding, so the
  norm's output is the old one times 1/s_j exactly and each product x_j W_jn is unchanged (no
  overflow or subnormal at these magnitudes); the test compares the logits' bits.
- quantize_rowwise: every other MatMul with a constant weight (the audio heads excluded) becomes
  int8 per output column (symmetric, max|W| / 127) x uint8 per row of its input (symmetric around
  the zero point 128, scale max|row| / 127, computed per call): onnxruntime's MatMulIntegerToFloat
  accumulates in int32 and applies the column scales (its scale of A takes one value, so the row
  scales are one Mul after it): a massive row costs only its own resolution. The input's quantization is
  computed once and shared by the MatMuls that read it (q/k/v, gate/up), as onnxruntime's
  DynamicQuantizeLinear is. Its uint8 x int8 GEMM is the kernel MLAS runs with VNNI / AMX.
- spike_ratios (mixed precision): a per-row scale saves the other rows from a massive row, not the
  massive row itself, whose other values fall to a level or two; where that row's output matters
  (the down_proj that writes the massive values: its input spikes ~1000x at those rows) the
  MatMul stays fp32. Which ones is measured, not guessed: the prepared fp32 graph runs a few of the
  capture's calls and a MatMul stays fp32 when its input's largest row peak is over SPIKE_RATIO
  times the median row peak (on the proxy: the one down_proj; on random weights: none).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

ALPHA = 0.5  # SmoothQuant's migration strength: the activation's and the weight's ranges meet halfway
ZERO_POINT = 128  # the uint8 activations' zero point: symmetric int8 values shifted into uint8
EPSILON = 1e-12  # the smallest row scale (an all-zero row quantizes to the zero point)
# An input whose largest row peak is this many times its median row peak spikes: its MatMul stays
# fp32. On random weights a row's peak varies little between rows; the down_proj that writes massive
# activations peaks far above its other rows (docs/variants.md has the proxy's figures).
SPIKE_RATIO = 20.0


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _weight_matmuls(graph: onnx.GraphProto, exclude: set[str]) -> list[onnx.NodeProto]:
    initializers = {init.name for init in graph.initializer}
    return [
        node
        for node in graph.node
        if node.op_type == "MatMul" and node.input[1] in initializers and node.name not in exclude
    ]


def fold_norm_scales(model: onnx.ModelProto, exclude: list[str]) -> int:
    """Migrate each norm's channel scales into the MatMuls that read it (module docstring); in
    place. A norm counts when its weight is a constant and every reader of its output is a MatMul
    with a constant weight of its own not in `exclude`; a norm weight the exporter shares between
    norms (equal values) is copied first. Returns the number of norms folded."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    readers = _consumers(graph)
    quantized = {node.name for node in _weight_matmuls(graph, set(exclude))}
    folded = 0
    for node in graph.node:
        if node.op_type != "SimplifiedLayerNormalization" or node.input[1] not in inits:
            continue
        users = readers.get(node.output[0], [])
        if (
            not users
            or any(user.name not in quantized for user in users)
            or any(len(readers[user.input[1]]) != 1 for user in users)
        ):
            continue
        if len(readers[node.input[1]]) != 1:  # the exporter shares equal constants (equal norm weights)
            private = numpy_helper.from_array(numpy_helper.to_array(inits[node.input[1]]), f"{node.name}_weight")
            graph.initializer.append(private)
            inits[private.name] = graph.initializer[-1]
            node.input[1] = private.name
        gain = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        weights = [numpy_helper.to_array(inits[user.input[1]]) for user in users]
        weight_range = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
        with np.errstate(divide="ignore"):
            ideal = np.abs(gain) ** ALPHA / np.maximum(weight_range, 1e-30) ** (1 - ALPHA)
        scale = np.where(ideal > 0, np.exp2(np.round(np.log2(np.where(ideal > 0, ideal, 1.0)))), 1.0).astype(np.float32)
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(gain / scale, node.input[1]))
        for user, weight in zip(users, weights, strict=True):
            inits[user.input[1]].CopyFrom(
                numpy_helper.from_array((weight * scale[:, None]).astype(np.float32), user.input[1])
            )
        folded += 1
    read = {name for node in graph.node for name in node.input}
    kept = [init for init in graph.initializer if init.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return folded


def quantize_weight(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 [K, N], float32 scale [N]): symmetric per output column, round half to even."""
    peak = np.abs(weight).max(axis=0)
    scale = np.where(peak > 0, peak / np.float32(127), np.float32(1)).astype(np.float32)
    return np.clip(np.rint(weight / scale), -127, 127).astype(np.int8), scale


def quantize_rowwise(model: onnx.ModelProto, exclude: list[str]) -> int:
    """Replace each MatMul with a constant weight (not in `exclude`) by the per-row int8 form of
    the module docstring; in place. Returns the number of MatMuls quantized."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    matmuls = _weight_matmuls(graph, set(exclude))
    if not matmuls:
        return 0
    if not any(opset.domain == "com.microsoft" for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([-1], dtype=np.int64), "rowq_axes"),
            numpy_helper.from_array(np.array(1 / 127, dtype=np.float32), "rowq_inv_127"),
            numpy_helper.from_array(np.array(EPSILON, dtype=np.float32), "rowq_epsilon"),
            numpy_helper.from_array(np.array(1.0, dtype=np.float32), "rowq_one"),
            numpy_helper.from_array(np.array(ZERO_POINT, dtype=np.uint8), "rowq_zero_point"),
        ]
    )
    quantized_inputs: dict[str, tuple[str, str]] = {}
    replacements: dict[int, list[onnx.NodeProto]] = {}
    for index, node in enumerate(matmuls):
        source = node.input[0]
        prefix = f"rowq_{index}"
        new_nodes = []
        if source not in quantized_inputs:
            a = f"rowq_in{len(quantized_inputs)}"
            new_nodes += [
                helper.make_node("Abs", [source], [f"{a}_abs"], name=f"{a}_abs"),
                helper.make_node("ReduceMax", [f"{a}_abs", "rowq_axes"], [f"{a}_peak"], keepdims=1, name=f"{a}_peak"),
                helper.make_node("Mul", [f"{a}_peak", "rowq_inv_127"], [f"{a}_raw_scale"], name=f"{a}_raw_scale"),
                helper.make_node("Max", [f"{a}_raw_scale", "rowq_epsilon"], [f"{a}_scale"], name=f"{a}_scale"),
                helper.make_node("Div", [source, f"{a}_scale"], [f"{a}_scaled"], name=f"{a}_scaled"),
                helper.make_node(
                    "QuantizeLinear", [f"{a}_scaled", "rowq_one", "rowq_zero_point"], [f"{a}_q"], name=f"{a}_q"
                ),
            ]
            quantized_inputs[source] = (f"{a}_q", f"{a}_scale")
        q, row_scale = quantized_inputs[source]
        weight, column_scale = quantize_weight(numpy_helper.to_array(inits[node.input[1]]).astype(np.float32))
        graph.initializer.extend(
            [numpy_helper.from_array(weight, f"{prefix}_w"), numpy_helper.from_array(column_scale, f"{prefix}_w_scale")]
        )
        new_nodes += [
            helper.make_node(
                "MatMulIntegerToFloat",
                [q, f"{prefix}_w", "rowq_one", f"{prefix}_w_scale", "rowq_zero_point"],
                [f"{prefix}_columns"],
                name=f"{prefix}_matmul",
                domain="com.microsoft",
            ),
            helper.make_node("Mul", [f"{prefix}_columns", row_scale], [node.output[0]], name=f"{prefix}_row_scale"),
        ]
        replacements[id(node)] = new_nodes
    used_weights = {node.input[1] for node in matmuls}
    nodes = [new for node in graph.node for new in replacements.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    still_read = {name for node in graph.node for name in node.input}
    kept = [init for init in graph.initializer if init.name not in used_weights or init.name in still_read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return len(matmuls)


def spike_ratios(
    model: onnx.ModelProto, exclude: list[str], calls: list[dict[str, np.ndarray]], workdir
) -> dict[str, float]:
    """{MatMul name: largest row peak / median row peak of its input over `calls`} for each MatMul
    quantize_rowwise would quantize, measured by running `model` (fp32, prepared) with those inputs
    as extra outputs; the copy is saved under `workdir` (a graph over 2 GB has to be a file)."""
    from omnivoice_export.report import save_with_sidecar
    from omnivoice_onnx.sessions import make_session

    matmuls = _weight_matmuls(model.graph, set(exclude))
    sources = sorted({node.input[0] for node in matmuls})
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend([helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in sources])
    path = workdir / "spike-probe.onnx"
    save_with_sidecar(probe, path)
    del probe
    session = make_session(path, fix="re-run quantize_omnivoice.py")
    peaks: dict[str, list[np.ndarray]] = {name: [] for name in sources}
    for feeds in calls:
        outputs = session.run(sources, feeds)
        for name, value in zip(sources, outputs, strict=True):
            peaks[name].append(np.abs(value).reshape(-1, value.shape[-1]).max(axis=1))
    del session
    ratio = {
        name: float(np.max(np.concatenate(rows)) / max(float(np.median(np.concatenate(rows))), 1e-30))
        for name, rows in peaks.items()
    }
    return {node.name: ratio[node.input[0]] for node in matmuls}
