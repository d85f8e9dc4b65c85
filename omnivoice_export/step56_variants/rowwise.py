"""Per-row int8 MatMuls: the quantization of every `int8*` recipe that is not onnxruntime's own.

Why (docs/variants.md, the outlier proxies): a trained backbone's MatMul inputs carry massive rows
(the first position and the delimiter tokens, Sun et al. 2024) beside outlier channels.
quantize_dynamic's per-tensor activation scale is set by the largest value of the whole call, so
one massive row leaves every other row a few of the 255 levels. Here every MatMul with a constant
weight (the audio heads excluded) becomes int8 per output column (symmetric, max|W| / 127) x uint8
per row of its input (symmetric around the zero point 128, scale max|row| / 127, computed per call):
onnxruntime's MatMulIntegerToFloat accumulates in int32 and applies the column scales (its scale of
A takes one value, so the row scales are one Mul after it): a massive row costs only its own
resolution. The input's quantization is computed once and shared by the MatMuls that read it
(q/k/v, gate/up), as onnxruntime's DynamicQuantizeLinear is. Its uint8 x int8 GEMM is the kernel
MLAS runs with VNNI / AMX. Outlier channels are omnivoice_export.step56_variants.smoothing's part (scales folded
into the weights before this runs); which MatMuls stay fp32 is omnivoice_export.step56_variants.sensitivity's.

`switch` keeps each MatMul's fp32 form beside its int8 one, chosen per call by a bool input: the
graph sensitivity measures mixes of kept-fp32 sets with, one session for all of them.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

ZERO_POINT = 128  # the uint8 activations' zero point: symmetric int8 values shifted into uint8
EPSILON = 1e-12  # the smallest row scale (an all-zero row quantizes to the zero point)
# The switch graph's input: one bool per quantized MatMul (in weight_matmuls order), True = run it fp32.
SWITCH_INPUT = "fp32_select"


def weight_matmuls(graph: onnx.GraphProto, exclude: set[str]) -> list[onnx.NodeProto]:
    """The MatMuls a recipe quantizes: a constant weight (initializer), not named in `exclude`."""
    initializers = {init.name for init in graph.initializer}
    return [
        node
        for node in graph.node
        if node.op_type == "MatMul" and node.input[1] in initializers and node.name not in exclude
    ]


def matmuls_by_input(graph: onnx.GraphProto, exclude: set[str]) -> dict[str, list[onnx.NodeProto]]:
    """weight_matmuls grouped by the input they read (q/k/v share one, gate/up another), in graph
    order: the unit smoothing folds a scale into and rotation rotates."""
    inputs: dict[str, list[onnx.NodeProto]] = {}
    for node in weight_matmuls(graph, exclude):
        inputs.setdefault(node.input[0], []).append(node)
    return inputs


def quantize_weight(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 [K, N], float32 scale [N]): symmetric per output column, round half to even."""
    peak = np.abs(weight).max(axis=0)
    scale = np.where(peak > 0, peak / np.float32(127), np.float32(1)).astype(np.float32)
    return np.clip(np.rint(weight / scale), -127, 127).astype(np.int8), scale


def quantize_rowwise(model: onnx.ModelProto, exclude: list[str], switch: bool = False) -> int:
    """Replace each MatMul with a constant weight (not in `exclude`) by the per-row int8 form of
    the module docstring; in place. With `switch`, each also keeps its fp32 MatMul, and the graph
    input SWITCH_INPUT (bool [N]) picks, per MatMul, the fp32 result (True) or the int8 one.
    Returns the number of MatMuls quantized."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    matmuls = weight_matmuls(graph, set(exclude))
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
        output = f"{prefix}_int8" if switch else node.output[0]
        new_nodes += [
            helper.make_node(
                "MatMulIntegerToFloat",
                [q, f"{prefix}_w", "rowq_one", f"{prefix}_w_scale", "rowq_zero_point"],
                [f"{prefix}_columns"],
                name=f"{prefix}_matmul",
                domain="com.microsoft",
            ),
            helper.make_node("Mul", [f"{prefix}_columns", row_scale], [output], name=f"{prefix}_row_scale"),
        ]
        if switch:
            graph.initializer.append(numpy_helper.from_array(np.array(index, dtype=np.int64), f"{prefix}_index"))
            new_nodes += [
                helper.make_node("MatMul", list(node.input), [f"{prefix}_fp32"], name=f"{prefix}_fp32"),
                helper.make_node(
                    "Gather", [SWITCH_INPUT, f"{prefix}_index"], [f"{prefix}_pick"], name=f"{prefix}_pick"
                ),
                helper.make_node(
                    "Where", [f"{prefix}_pick", f"{prefix}_fp32", output], [node.output[0]], name=f"{prefix}_where"
                ),
            ]
        replacements[id(node)] = new_nodes
    if switch:
        graph.input.append(helper.make_tensor_value_info(SWITCH_INPUT, onnx.TensorProto.BOOL, [len(matmuls)]))
    used_weights = {node.input[1] for node in matmuls}
    nodes = [new for node in graph.node for new in replacements.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    still_read = {name for node in graph.node for name in node.input}
    kept = [init for init in graph.initializer if init.name not in used_weights or init.name in still_read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return len(matmuls)
