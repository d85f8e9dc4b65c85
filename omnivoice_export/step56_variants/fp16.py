"""float16 graphs with float32 islands: the `fp16` variant's conversion and its graph checks.

Why not onnxruntime's converter alone. `onnxruntime.transformers.float16.convert_float_to_float16`
with nothing kept ("naive") squares the residual stream in float16: a trained Qwen residual carries
a few channels in the hundreds to thousands at every position, |x| > 256 squares past float16's
65504, the RMSNorm mean is inf, rsqrt 0, and the layer's output 0 (all-zero logits on CUDA, as
public fp16 OmniVoice exports show). onnxruntime's CPU provider hides it: it has no float16 Pow or
ReduceMean kernel, runs them in float32 through casts it inserts, and removes the cast pairs
between them, so a CPU run of the naive graph looks right. Its `node_block_list` keeps each listed
node float32 but casts every output back to float16 before the next node reads it, so a blocked
RMSNorm chain still stores x^2 (and the mean) in float16 between its nodes: the same overflow
(facts sheet, "A blocked op list is not an fp32 island"). `join_fp32_islands` removes exactly those
round trips (Cast to float16 followed by Cast back to float32), so a chain of kept nodes computes
in float32 from its first input to its last output, with casts only at its edges.

What stays float32 (KEEP, per graph; the recipe's `keep_fp32` names the transformer's groups):
    rmsnorm   every Pow(x, 2) -> ReduceMean -> Add(eps) -> Sqrt -> Reciprocal -> Mul(x, .) -> Mul(weight, .)
              chain: the square and mean of the residual (and of q/k in q_norm/k_norm) in float32,
              the normalised result cast to float16 at the island's edge (it is bounded by the weight)
    rope      every node whose output reaches Cos/Sin: positions are integers, and float16 holds
              integers exactly only up to 2048 (angle = position x inv_freq)
    softmax   the mask Add, Softmax and its NaN guard: a float16 Softmax sums exp() in float16
    heads     the audio-heads MatMul and everything from it to `logits`: the logits unmasking ranks
              and takes the argmax of; fed by the final norm's float32 output directly
Everything else (the projections and MLP, attention's two MatMuls, RoPE's rotation, the residual
Adds, the embedding Gathers) is float16. Inputs and outputs keep their float32 / int64 / bool
types (keep_io_types), so the contract table holds unchanged.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import onnx
from onnx import TensorProto, helper

from omnivoice_export.step56_variants.fusion import GraphIndex, prune_dead_nodes
from omnivoice_onnx.errors import UserError

FIX = "build fp16 from the fp32 export made by export_omnivoice.py (step 2): quantize_omnivoice.py --variants fp16"

TRANSFORMER_KEEP = ("rmsnorm", "rope", "softmax", "heads")
# Codec graphs: op types kept float32 (chosen by what each computes, then measured as a whole, see
# the investigation log: encoder code match 0.9966, decoder LSD 1.6e-3 on tiny): the normalisations and
# reductions, Snake's sin (x + sin(a x)^2 / a), the quantizer's distances and ArgMax, the
# resampler's sinc arithmetic. Keeping every MatMul too did not remove the encoder's code flips.
CODEC_KEEP_OPS = (
    "Pow",
    "ReduceMean",
    "ReduceSum",
    "Sqrt",
    "Div",
    "Reciprocal",
    "Sin",
    "Erf",
    "Softmax",
    "LayerNormalization",
    "InstanceNormalization",
    "ArgMax",
    "Sub",
    "Range",
)
# The reductions of a residual stream: what must never read or write float16 on the way.
SQUARE_AND_REDUCE = ("Pow", "ReduceMean", "Sqrt", "Reciprocal")


def rmsnorm_chains(g: GraphIndex) -> list[list[onnx.NodeProto]]:
    """Each RMSNorm as exported: [Pow(x, 2), ReduceMean, Add(eps), Sqrt, Reciprocal, Mul(x, rsqrt), Mul(w, .)]."""
    chains = []
    for pow_node in (n for n in g.graph.node if n.op_type == "Pow"):
        exponent = g.constant(pow_node.input[1])
        if exponent is None or exponent.size != 1 or float(exponent.reshape(-1)[0]) != 2.0:
            continue
        chain, current = [pow_node], pow_node
        for op in ("ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul"):
            current = g.only_consumer(current.output[0], op)
            if current is None:
                break
            chain.append(current)
        if len(chain) == 7 and pow_node.input[0] in chain[5].input:
            chains.append(chain)
    return chains


def backward_cone(g: GraphIndex, outputs: list[str]) -> set[str]:
    """Names of the nodes whose outputs reach any of `outputs` (those producing them included)."""
    seen: set[str] = set()
    queue = deque(outputs)
    while queue:
        node = g.producer.get(queue.popleft())
        if node is not None and node.name not in seen:
            seen.add(node.name)
            queue.extend(name for name in node.input if name)
    return seen


def forward_cone(g: GraphIndex, start: onnx.NodeProto) -> set[str]:
    """Names of `start` and every node reading, directly or not, one of its outputs."""
    seen = {start.name}
    queue = deque(start.output)
    while queue:
        for node in g.consumers.get(queue.popleft(), []):
            if node.name not in seen:
                seen.add(node.name)
                queue.extend(node.output)
    return seen


def transformer_keep(model: onnx.ModelProto, heads: str, groups: tuple[str, ...]) -> dict[str, list[str]]:
    """Node names kept float32 per group of TRANSFORMER_KEEP (`heads`: the audio-heads MatMul's name)."""
    name_nodes(model)
    g = GraphIndex(model.graph)
    keep: dict[str, set[str]] = {group: set() for group in groups}
    if "rmsnorm" in keep:
        chains = rmsnorm_chains(g)
        squares = [n for n in model.graph.node if n.op_type == "Pow"]
        if not chains or len(chains) != len(squares):
            # A norm left unmatched would square its input in float16: refuse rather than write it.
            raise UserError(
                f"found the exported RMSNorm chain (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul) at "
                f"{len(chains)} of the graph's {len(squares)} Pow nodes",
                FIX,
            )
        keep["rmsnorm"] = {node.name for chain in chains for node in chain}
    if "rope" in keep:
        trig = [out for node in model.graph.node if node.op_type in ("Cos", "Sin") for out in node.output]
        keep["rope"] = backward_cone(g, trig)
    if "softmax" in keep:
        for softmax in (n for n in model.graph.node if n.op_type == "Softmax"):
            keep["softmax"].add(softmax.name)
            add = g.op(softmax.input[0], "Add")
            if add is not None:
                keep["softmax"].add(add.name)
            for isnan in (n for n in g.consumers.get(softmax.output[0], []) if n.op_type == "IsNaN"):
                keep["softmax"].add(isnan.name)
                keep["softmax"].update(n.name for n in g.consumers.get(isnan.output[0], []) if n.op_type == "Where")
    if "heads" in keep:
        keep["heads"] = forward_cone(g, next(n for n in model.graph.node if n.name == heads))
    return {group: sorted(names) for group, names in keep.items()}


def convert_transformer(
    model: onnx.ModelProto, heads: str, groups: tuple[str, ...]
) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """The fp16 transformer (convert) with `groups` kept float32 (transformer_keep); returns it
    and the kept node names per group (the report records them)."""
    kept = transformer_keep(model, heads, groups)
    return convert(model, {name for names in kept.values() for name in names}), kept


def name_nodes(model: onnx.ModelProto) -> None:
    """Give every unnamed node a unique name (the converter's block list is by name)."""
    used = {node.name for node in model.graph.node if node.name}
    for index, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_fp16pass_{index}"
            while name in used:
                name += "_"
            node.name = name
            used.add(name)


def convert(model: onnx.ModelProto, keep: set[str]) -> onnx.ModelProto:
    """float16 everywhere but the nodes named in `keep`, whose chains become float32 islands;
    float32 inputs and outputs. Returns the converted model (the input is consumed)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    name_nodes(model)
    del model.graph.value_info[:]
    model.graph.value_info.extend(infer_types(model).graph.value_info)
    converted: onnx.ModelProto = convert_float_to_float16(  # onnxruntime ships no types
        model, keep_io_types=True, op_block_list=[], node_block_list=sorted(keep), disable_shape_infer=True
    )
    make_islands(converted)
    # The converter's value_info describes tensors this pass renamed or removed: re-inferred by ORT.
    del converted.graph.value_info[:]
    return converted


def make_islands(model: onnx.ModelProto) -> int:
    """Turn a converted graph's chains of float32 nodes into islands, in place: sort it (the
    converter appends its casts at the end; pruning walks the nodes in order), join the round
    trips, drop the casts no node reads any more. Returns the number of round trips joined."""
    topological_sort(model)
    joined = join_fp32_islands(model)
    prune_dead_nodes(model)
    return joined


def convert_by_op(model: onnx.ModelProto, ops: tuple[str, ...]) -> onnx.ModelProto:
    """`convert` keeping every node of the listed op types (the codec graphs' recipe)."""
    name_nodes(model)
    return convert(model, {node.name for node in model.graph.node if node.op_type in ops})


def join_fp32_islands(model: onnx.ModelProto) -> int:
    """Remove every float32 -> float16 -> float32 round trip, in place; returns how many.

    The converter puts a Cast(to float16) after each kept node and a Cast(to float32) before
    each kept node's float16 input, so two kept nodes in a row exchange their tensor through
    float16. A reader of Cast32(Cast16(x)) with x float32 reads x itself instead; the Cast16 stays
    while a float16 node still reads it (prune_dead_nodes removes it otherwise).
    """
    g = GraphIndex(model.graph)
    types = value_types(model)
    outputs = {output.name for output in model.graph.output}
    joined = 0
    for node in model.graph.node:
        if node.op_type != "Cast" or cast_to(node) != TensorProto.FLOAT:
            continue
        down = g.op(node.input[0], "Cast")
        if down is None or cast_to(down) != TensorProto.FLOAT16 or types.get(down.input[0]) != TensorProto.FLOAT:
            continue
        if node.output[0] in outputs:  # a graph output keeps its name: the Cast becomes a copy of x
            node.op_type, node.input[0] = "Identity", down.input[0]
            del node.attribute[:]
        for reader in g.consumers.get(node.output[0], []):
            reader.input[:] = [down.input[0] if name == node.output[0] else name for name in reader.input]
        joined += 1
    return joined


def cast_to(node: onnx.NodeProto) -> int:
    to: int = next(attr.i for attr in node.attribute if attr.name == "to")
    return to


def value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor of the graph (inputs, initializers, node outputs), by ONNX type inference."""
    inferred = infer_types(model)
    types = {
        info.name: info.type.tensor_type.elem_type
        for info in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)
    }
    types.update({init.name: init.data_type for init in model.graph.initializer})
    return types


def infer_types(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape and type inference on a weightless copy of `model`: the weights are not needed,
    and a model over 2 GB (full-random's transformer) cannot be serialised for inference whole."""
    shell = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import)
    shell.graph.node.extend(model.graph.node)
    shell.graph.input.extend(model.graph.input)
    shell.graph.output.extend(model.graph.output)
    # Small initializers keep their values (shapes and axes read by Reshape, Slice, Concat); the
    # weights become typed graph inputs of their shape.
    small = [init for init in model.graph.initializer if int(np.prod(init.dims)) <= 64]
    shell.graph.initializer.extend(small)
    kept = {init.name for init in small}
    shell.graph.input.extend(
        helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
        for init in model.graph.initializer
        if init.name not in kept
    )
    topological_sort(shell)  # inference types a node only after its inputs: the converter appends its casts
    return onnx.shape_inference.infer_shapes(shell)


def topological_sort(model: onnx.ModelProto) -> None:
    """Order the nodes so that each comes after the producers of its inputs (the converter
    appends its casts at the end of the list), in place; ties keep the original order."""
    graph = model.graph
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending = list(graph.node)
    ordered = []
    while pending:
        rest = []
        for node in pending:
            if all(name in available for name in node.input):
                ordered.append(node)
                available.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            raise ValueError(f"graph has a cycle or a dangling input at {rest[0].name}")
        pending = rest
    del graph.node[:]
    graph.node.extend(ordered)


def float16_squares(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes of SQUARE_AND_REDUCE that read or write float16: where an fp16 graph
    squares or reduces in float16 (the naive conversion's RMSNorms). Empty for the `fp16` variant."""
    types = value_types(model)
    return [
        node.name
        for node in model.graph.node
        if node.op_type in SQUARE_AND_REDUCE
        and any(types.get(name) == TensorProto.FLOAT16 for name in list(node.input) + list(node.output) if name)
    ]


def island_round_trips(model: onnx.ModelProto) -> list[str]:
    """Casts to float32 that read a Cast to float16 of a float32 tensor: round trips left inside
    an island (what the converter's block list alone leaves). Empty after join_fp32_islands."""
    g = GraphIndex(model.graph)
    types = value_types(model)
    return [
        node.name
        for node in model.graph.node
        if node.op_type == "Cast"
        and cast_to(node) == TensorProto.FLOAT
        and (down := g.op(node.input[0], "Cast")) is not None
        and cast_to(down) == TensorProto.FLOAT16
        and types.get(down.input[0]) == TensorProto.FLOAT
    ]
