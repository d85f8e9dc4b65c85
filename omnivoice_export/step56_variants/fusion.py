"""Graph rewrites of the unmasked transformer (FUSIONS), for the fp32-fused and int8 recipes.

- attention (fp32-fused, int8): each layer's attention core -> one ONNX Attention (opset 23),
  grouped-query, without repeating the kv heads (fuse_attention);
- rotary (int8 only): each RoPE of q and k -> one com.microsoft.RotaryEmbedding, its own float
  order (fuse_rotary);
- rms_norm (int8 only): each RMSNorm -> onnxruntime's SimplifiedLayerNormalization, its own float
  order (fuse_rms_norm).

Applied after quantize.drop_mask_work: the graph they rewrite is already
unmasked, i.e. valid only for calls whose attention mask is all True, which is every call
omnivoice_onnx.sessions.run_split makes (cond and uncond rows at their own lengths). A padded call
still gets NaN logits from drop_mask_work's output guard, so it is loud, never silently wrong.

What the dynamo exporter wrote per layer (torch SDPA with GQA lowered to plain ops), and what
replaces it:

    q   [B, H, S, D]   q_proj -> Reshape -> q_norm -> Transpose -> RoPE
    k   [B, KV, S, D]  k_proj -> Reshape -> k_norm -> Transpose -> RoPE
                       -> repeat_kv (Unsqueeze, Expand, Reshape: KV = 8 -> H = 16 heads)
    v   [B, KV, S, D]  v_proj -> Reshape -> Transpose -> repeat_kv
    kT = Reshape(Transpose(Reshape(k, [-1, S, D]), [0, 2, 1]), [B, H, D, S])
    p  = Softmax(MatMul(Mul(q, s), Mul(kT, s)))          s = D ** -0.25, applied to both sides
    out = Reshape(Transpose(MatMul(p, v), [0, 2, 1, 3]), [B, S, H * D])
  ->  (fp32-fused: q, k, v as the layer has them, [B, N, S, D])
    out = Reshape(Transpose(Attention(q, k_before_repeat, v_before_repeat, scale=s * s), [0, 2, 1, 3]),
                  [0, 0, -1])
  ->  (int8, after rotary: q and k are RotaryEmbedding's [B, S, N * D] outputs, v is v_proj's)
    out = Attention(q, k, v, q_num_heads=H, kv_num_heads=KV, scale=s * s)

H, KV and D are read from repeat_kv's shapes, s from the two scale Muls (the graph's own float32
constants; s * s is computed in float32). Attention takes the KV heads as they are (grouped-query
attention), so repeat_kv's copies go. It needs opset 23 (onnxruntime >= 1.23 on CPU); the rest of
the exported graph means the same at opset 23 (the versions between only add types).

Float order: the faithful graph scales q and kT by s each and multiplies; the fused kernel gets
s * s as its scale. Measured, the logits are the same bits as the unmasked graph's on every tiny
captured call (head_dim 16: s = 0.5; tests/test_fusion.py) and on calls at the real dims (head_dim
128, S = 227, 278, 452 and 920, two threads; the bench checks its three shapes each run), so the fp32
verdicts hold exactly as for fp32-unmasked. Before Attention, com.microsoft.MultiHeadAttention
held the same bits; Attention runs both the int8 and the fp32-fused graph faster (docs/variants.md,
"int8: fused for speed").

Not fused in fp32, measured (investigation log): RMSNorm -> ORT's
SimplifiedLayerNormalization. Its kernel does not follow upstream's pow / mean / rsqrt / multiply
order: logits moved by up to 1.2e-5 against the faithful graph at the real dims, a 1-ULP near-tie
flipped its argmax on tiny (auto step 17: argmax 0.999399, so not the fp32 verdict), and no speed
gain showed in fp32. In int8, where that difference is far below the recipe's own
error, it gains a few per cent per call, so the int8 recipe uses it. RoPE as RotaryEmbedding
likewise (it rounds differently from the exported nodes' rotation). com.microsoft.GroupQueryAttention is causal on CPU:
not this model's attention. Removed, measured (docs/variants.md): merging q/k/v and gate/up into
one int8 GEMM + Split gained a little on Zen 4 but cost per call on the Intel Xeon with AMX,
where the GEMM is fast and the Split's copy is not; onnxruntime shares one activation
quantization between the separate projections anyway (DynamicQuantizeLinear + MatMulIntegerToFloat).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from omnivoice_onnx.errors import UserError

MS_DOMAIN = "com.microsoft"
# The ONNX Attention operator (GQA without repeating the kv heads) first appears in opset 23.
ATTENTION_OPSET = 23
FUSIONS = ("attention", "rotary", "rms_norm")
_FIX = "build the variant from the fp32 export made by export_omnivoice.py (step 2) with quantize_omnivoice.py"


class GraphIndex:
    """Producer/consumer/initializer lookups over a graph that is being rewritten (every graph
    edit of steps 5-6 reads its graph through one of these)."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.producer = {out: node for node in graph.node for out in node.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.initializers = {init.name: init for init in graph.initializer}

    def op(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The node of type op_type producing `name`, or None."""
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def only_consumer(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The one node reading `name`, if there is exactly one and it is of op_type."""
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 and users[0].op_type == op_type else None

    def constant(self, name: str) -> np.ndarray | None:
        """A small initializer's value (shapes, scalars); None for anything else (weights stay unread)."""
        init = self.initializers.get(name)
        return None if init is None or int(np.prod(init.dims)) > 8 else numpy_helper.to_array(init)

    def split_constant(self, node: onnx.NodeProto) -> tuple[str, np.ndarray] | None:
        """(the other input, the scalar) of a binary node whose one input is a scalar initializer."""
        for index in (0, 1):
            value, other = self.constant(node.input[index]), node.input[1 - index]
            if value is not None and value.size == 1 and other not in self.initializers:
                return other, value
        return None


def attribute(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """Attribute `name` of `node` as onnx.helper decodes it (an int, float, list ...), or `default`."""
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _repeat_kv(g: GraphIndex, name: str) -> tuple[str, int, int, int] | None:
    """(the kv heads' tensor, heads, kv heads, head_dim) if `name` is repeat_kv's output:
    Reshape(Expand(Unsqueeze(x, 2), Concat(B, [KV], [H / KV], S, [D])), Concat(B, [H], S, [D])),
    which repeats each kv head in place (query head h reads kv head h // (H / KV), as Attention's
    grouped-query form does)."""
    reshape = g.op(name, "Reshape")
    shape = g.op(reshape.input[1], "Concat") if reshape is not None else None
    expand = g.op(reshape.input[0], "Expand") if reshape is not None else None
    repeated = g.op(expand.input[1], "Concat") if expand is not None else None
    unsqueeze = g.op(expand.input[0], "Unsqueeze") if expand is not None else None
    if shape is None or len(shape.input) != 4 or repeated is None or len(repeated.input) != 5 or unsqueeze is None:
        return None
    axes = g.constant(unsqueeze.input[1]) if len(unsqueeze.input) > 1 else None
    found = [
        value
        for value in (
            g.constant(item)
            for item in (shape.input[1], repeated.input[1], repeated.input[2], shape.input[3], repeated.input[4])
        )
        if value is not None and value.size == 1
    ]
    if axes is None or list(axes.reshape(-1)) != [2] or len(found) != 5:  # every one a scalar
        return None
    heads, kv_heads, repeats, dim, kv_dim = (int(value.reshape(-1)[0]) for value in found)
    if heads != kv_heads * repeats or dim != kv_dim:  # each kv head repeated in place, as repeat_kv does
        return None
    return unsqueeze.input[0], heads, kv_heads, dim


def _bsd_source(g: GraphIndex, name: str, head_dim: int) -> str | None:
    """The [B, S, N * D] tensor that `name` = Transpose(Reshape(x, [B, S, N, D]), [0, 2, 1, 3]) was
    made from, when x is a projection's output or a RotaryEmbedding's (3-D by construction); else None."""
    transpose = g.op(name, "Transpose")
    if transpose is None:
        return None
    reshape = g.op(transpose.input[0], "Reshape")
    if reshape is None or list(attribute(transpose, "perm", [])) != [0, 2, 1, 3]:
        return None
    shape = g.constant(reshape.input[1])
    if shape is None:
        concat = g.op(reshape.input[1], "Concat")
        last = g.constant(concat.input[-1]) if concat is not None and len(concat.input) == 4 else None
        shape = None if last is None else np.array([0, 0, -1, *last.reshape(-1)])
    source = g.producer.get(reshape.input[0])
    if shape is None or len(shape) != 4 or int(shape[-1]) != head_dim or source is None:
        return None
    projection = source.op_type == "MatMul" and source.input[1] in g.initializers  # hidden [B, S, H] @ W
    return reshape.input[0] if projection or source.op_type == "RotaryEmbedding" else None


def _match_attention(g: GraphIndex, softmax: onnx.NodeProto) -> dict[str, Any] | None:
    """The unmasked attention core around `softmax`, or None if it is not the exported pattern."""
    if attribute(softmax, "axis", -1) not in (-1, 3):
        return None
    qk = g.op(softmax.input[0], "MatMul")
    pv = g.only_consumer(softmax.output[0], "MatMul")
    if qk is None or pv is None or pv.input[0] != softmax.output[0]:
        return None
    q_mul, k_mul = g.op(qk.input[0], "Mul"), g.op(qk.input[1], "Mul")
    q_side = g.split_constant(q_mul) if q_mul is not None else None
    k_side = g.split_constant(k_mul) if k_mul is not None else None
    if q_side is None or k_side is None:
        return None
    # kT = Reshape(Transpose(Reshape(k), [0, 2, 1])): k.transpose(-2, -1) as dynamo lowers it.
    outer = g.op(k_side[0], "Reshape")
    transpose = g.op(outer.input[0], "Transpose") if outer is not None else None
    if transpose is None:
        return None
    inner = g.op(transpose.input[0], "Reshape")
    if inner is None or list(attribute(transpose, "perm", [])) != [0, 2, 1]:
        return None
    key, value = _repeat_kv(g, inner.input[0]), _repeat_kv(g, pv.input[1])
    if key is None or value is None or key[1:] != value[1:]:
        return None
    heads, kv_heads, head_dim = key[1:]
    back = g.only_consumer(pv.output[0], "Transpose")
    if back is None:
        return None
    merge = g.only_consumer(back.output[0], "Reshape")
    if merge is None or list(attribute(back, "perm", [])) != [0, 2, 1, 3]:
        return None
    scale = np.float32(q_side[1].reshape(-1)[0]) * np.float32(k_side[1].reshape(-1)[0])
    if abs(float(scale) - head_dim**-0.5) > 1e-6 * head_dim**-0.5:  # SDPA's default scale, or not attention's
        return None
    flat = [_bsd_source(g, name, head_dim) for name in (q_side[0], key[0], value[0])]
    return {
        "query": q_side[0],
        "key": key[0],
        "value": value[0],
        "output": merge.output[0],
        "heads": heads,
        "kv_heads": kv_heads,
        "scale": float(scale),
        "flat": None if None in flat else flat,
    }


def take_over(model: onnx.ModelProto, g: GraphIndex, output: str, new: list[onnx.NodeProto]) -> None:
    """Insert `new` right after the node producing `output`, the last of them taking the name over:
    the old producer writes `<output>_unfused`, which nothing reads, so prune_dead_nodes drops the
    chain it ended. Consumers keep reading `output`, and node order stays topological."""
    old = g.producer[output]
    old.output[0] = f"{output}_unfused"
    position = list(model.graph.node).index(old)
    for offset, node in enumerate(new):
        model.graph.node.insert(position + 1 + offset, node)


def fuse_attention(model: onnx.ModelProto) -> int:
    """Replace each layer's unmasked attention core by one ONNX Attention (opset 23); in place.

    Each decoder layer has one Softmax, so every Softmax must match: refuses (UserError) if one
    does not or there is none, rather than write a graph half fused. Where q, k and v are each a
    [B, S, N * D] tensor seen through a Reshape and Transpose (after fuse_rotary), Attention reads
    them as they are; otherwise it reads the [B, N, S, D] tensors and its output is laid back to
    [B, S, H * D]. Raises the graph's opset to 23. Returns the number fused (the layer count). The
    replaced nodes are removed by prune_dead_nodes.
    """
    g = GraphIndex(model.graph)
    softmaxes = [node for node in model.graph.node if node.op_type == "Softmax"]
    matches = [match for match in (_match_attention(g, node) for node in softmaxes) if match is not None]
    if not softmaxes or len(matches) != len(softmaxes):
        raise UserError(
            f"found the unmasked attention pattern (MatMul(Mul(q, s), Mul(kT, s)) -> Softmax -> MatMul -> "
            f"Transpose -> Reshape) at {len(matches)} of the graph's {len(softmaxes)} Softmax nodes "
            "(one per layer)",
            _FIX,
        )
    require_opset(model, ATTENTION_OPSET)  # refuses an old graph before anything is rewritten
    shared = numpy_helper.from_array(np.array([0, 0, -1], dtype=np.int64), "fused_attention_bsd_shape")
    if any(match["flat"] is None for match in matches):
        model.graph.initializer.append(shared)
    for index, match in enumerate(matches):
        prefix = f"fused_attention_{index}"
        if match["flat"] is not None:  # q, k, v each a [B, S, N * D] tensor: no layout change around it
            new = [
                helper.make_node(
                    "Attention",
                    match["flat"],
                    [match["output"]],
                    name=prefix,
                    scale=match["scale"],
                    q_num_heads=match["heads"],
                    kv_num_heads=match["kv_heads"],
                )
            ]
        else:
            new = [
                helper.make_node(
                    "Attention",
                    [match["query"], match["key"], match["value"]],
                    [f"{prefix}_bnsh"],
                    name=prefix,
                    scale=match["scale"],
                ),
                helper.make_node(
                    "Transpose", [f"{prefix}_bnsh"], [f"{prefix}_bsnh"], perm=[0, 2, 1, 3], name=f"{prefix}_transpose"
                ),
                helper.make_node("Reshape", [f"{prefix}_bsnh", shared.name], [match["output"]], name=f"{prefix}_merge"),
            ]
        # The old merge Reshape gives its output name to the new one and becomes dead.
        take_over(model, g, match["output"], new)
    return len(matches)


def _match_rms_norm(g: GraphIndex, pow_node: onnx.NodeProto) -> dict[str, Any] | None:
    """Qwen3RMSNorm as the dynamo exporter writes it, from its Pow: weight * (x * 1/sqrt(mean(x^2) + eps))."""
    exponent = g.constant(pow_node.input[1])
    if exponent is None or exponent.size != 1 or float(exponent.reshape(-1)[0]) != 2.0:
        return None
    x = pow_node.input[0]
    mean = g.only_consumer(pow_node.output[0], "ReduceMean")
    if mean is None or attribute(mean, "keepdims", 1) != 1:
        return None
    axes = g.constant(mean.input[1]) if len(mean.input) > 1 else np.array(attribute(mean, "axes", []))
    if axes is None or list(axes.reshape(-1)) != [-1]:
        return None
    add = g.only_consumer(mean.output[0], "Add")
    eps = g.split_constant(add) if add is not None else None
    if add is None or eps is None:
        return None
    sqrt = g.only_consumer(add.output[0], "Sqrt")
    inverse = g.only_consumer(sqrt.output[0], "Reciprocal") if sqrt is not None else None
    if inverse is None:
        return None
    scaled = g.only_consumer(inverse.output[0], "Mul")
    if scaled is None or set(scaled.input) != {x, inverse.output[0]}:
        return None
    weighted = g.only_consumer(scaled.output[0], "Mul")
    if weighted is None:
        return None
    weight = next((name for name in weighted.input if name != scaled.output[0]), None)
    init = g.initializers.get(weight) if weight is not None else None
    if init is None or len(init.dims) != 1:
        return None
    return {"input": x, "weight": weight, "epsilon": float(eps[1].reshape(-1)[0]), "output": weighted.output[0]}


def fuse_rms_norm(model: onnx.ModelProto) -> int:
    """Replace each RMSNorm's seven nodes by onnxruntime's SimplifiedLayerNormalization; in place.

    For the int8 recipe only: the kernel computes mean(x^2) and the scaling in its own order, so
    its float bits are not upstream's (fp32 logits moved by up to 1.2e-5 at the real dims,
    investigation log: the reason the fp32 recipes keep the exported nodes), a difference far below int8's
    own error (per-call max |d| ~0.4). Every RMSNorm must match (one ReduceMean each): refuses
    (UserError) otherwise, never half fused. Returns the number fused.
    """
    g = GraphIndex(model.graph)
    matches = [
        match
        for match in (_match_rms_norm(g, node) for node in model.graph.node if node.op_type == "Pow")
        if match is not None
    ]
    means = sum(node.op_type == "ReduceMean" for node in model.graph.node)
    if not matches or len(matches) != means:
        raise UserError(
            f"found the RMSNorm pattern (Pow(x, 2) -> ReduceMean -> Add(eps) -> Sqrt -> Reciprocal -> "
            f"Mul(x) -> Mul(weight)) at {len(matches)} of the graph's {means} ReduceMean nodes",
            _FIX,
        )
    for index, match in enumerate(matches):
        take_over(
            model,
            g,
            match["output"],
            [
                helper.make_node(
                    "SimplifiedLayerNormalization",
                    [match["input"], match["weight"]],
                    [match["output"]],
                    name=f"fused_rms_norm_{index}",
                    axis=-1,
                    epsilon=match["epsilon"],
                )
            ],
        )
    return len(matches)


def _slice_bounds(g: GraphIndex, node: onnx.NodeProto | None) -> tuple[str, int, int] | None:
    """(data, start, end) of a Slice along the last axis with step 1, or None."""
    if node is None or node.op_type != "Slice" or len(node.input) < 4:
        return None
    steps = g.constant(node.input[4]) if len(node.input) > 4 else np.array([1])
    found = [
        value
        for value in (*(g.constant(name) for name in node.input[1:4]), steps)
        if value is not None and value.size == 1
    ]
    if len(found) != 4:  # starts, ends, axes and steps, every one a scalar
        return None
    start, end, axis, step = (int(value.reshape(-1)[0]) for value in found)
    if axis not in (-1, 3) or step != 1:
        return None
    return node.input[0], start, end


def _rotary_table(g: GraphIndex, name: str, op_type: str) -> str | None:
    """The angles [1, S, D/2] behind Unsqueeze(op_type(Concat(f, f)), 1), RoPE's cos or sin as
    Qwen3's rotary embedding writes them (torch.cat((freqs, freqs), -1)), or None. Batch 1: the
    positions are arange(S) for every row (transformers' cache_position.unsqueeze(0)); fuse_rotary
    squeezes that axis."""
    unsqueeze = g.op(name, "Unsqueeze")
    if unsqueeze is None or len(unsqueeze.input) < 2:
        return None
    axes = g.constant(unsqueeze.input[1])
    function = g.op(unsqueeze.input[0], op_type) if axes is not None and list(axes.reshape(-1)) == [1] else None
    doubled = g.op(function.input[0], "Concat") if function is not None else None
    if doubled is None or len(doubled.input) != 2 or doubled.input[0] != doubled.input[1]:
        return None
    return doubled.input[0] if attribute(doubled, "axis") == -1 else None


def _match_rotary(g: GraphIndex, add: onnx.NodeProto) -> dict[str, Any] | None:
    """RoPE as the dynamo exporter writes apply_rotary_pos_emb, from its final Add:
    x * cos + Concat(-x[..., D/2:], x[..., :D/2]) * sin with x = Transpose(y, [0, 2, 1, 3])."""
    for plain_name, rotated_name in (add.input, reversed(add.input)):
        plain, rotated = g.op(plain_name, "Mul"), g.op(rotated_name, "Mul")
        if plain is None or rotated is None:
            continue
        concat = next((g.op(name, "Concat") for name in rotated.input if g.op(name, "Concat")), None)
        if concat is None or len(concat.input) != 2 or attribute(concat, "axis") not in (-1, 3):
            continue
        negated = g.op(concat.input[0], "Neg")
        second = _slice_bounds(g, g.producer.get(negated.input[0])) if negated is not None else None
        first = _slice_bounds(g, g.producer.get(concat.input[1]))
        if second is None or first is None or first[0] != second[0]:
            continue
        x, (_, start, half), (_, middle, _) = first[0], first, second
        if start != 0 or middle != half or x not in plain.input:
            continue
        transpose = g.op(x, "Transpose")
        cos = _rotary_table(g, next(name for name in plain.input if name != x), "Cos")
        sin = _rotary_table(g, next(name for name in rotated.input if name != concat.output[0]), "Sin")
        if transpose is None or list(attribute(transpose, "perm", [])) != [0, 2, 1, 3] or cos is None or cos != sin:
            continue
        return {"input": transpose.input[0], "angles": cos, "head_dim": 2 * half, "output": add.output[0]}
    return None


def fuse_rotary(model: onnx.ModelProto) -> int:
    """Replace each RoPE (q and k of every layer) by one com.microsoft.RotaryEmbedding; in place.

    For the int8 recipe only. The exported rotation is seven nodes over the [B, H, S, D] tensor
    (two Slices, Neg, Concat, two Muls, Add), each a pass over memory: at the real dims 1.4 ms per
    q at S = 452 on two threads against 0.24 ms for RotaryEmbedding (investigation log). The
    kernel reads the same angles, cos(f) and sin(f) of the graph's own f = position * inv_freq
    (computed once from f [1, S, D/2], so its table always covers the call's S), with position
    offset 0, on the norm's [B, S, H * D] output; the head size comes from the table's width
    (2 x D/2). It rotates in its own float order (max |d| 4.8e-7 against the exported nodes on
    unit-normal inputs): not for the fp32 recipes, far below int8's own error. The result goes
    back to [B, H, S, D] by Reshape and Transpose, which fuse_attention, run next, looks through:
    Attention then reads RotaryEmbedding's [B, S, N * D] output itself. Refuses (UserError) a graph where not every
    Concat(-x2, x1) rotation matches, never half fused; returns the number fused (2 per layer).
    """
    g = GraphIndex(model.graph)
    rotations = [node for node in model.graph.node if node.op_type == "Neg"]
    matches = [
        match
        for match in (_match_rotary(g, node) for node in model.graph.node if node.op_type == "Add")
        if match is not None
    ]
    angles = {match["angles"] for match in matches}
    if not matches or len(matches) != len(rotations) or len(angles) != 1:
        raise UserError(
            f"found the RoPE pattern (Transpose -> x * cos + Concat(-x2, x1) * sin) at {len(matches)} of "
            f"the graph's {len(rotations)} rotations (Neg nodes), over {len(angles)} angle tables "
            "(expected one)",
            _FIX,
        )
    (angle,) = angles
    tables = [
        numpy_helper.from_array(np.array([0], dtype=np.int64), "fused_rotary_axis0"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "fused_rotary_position_offset"),
        numpy_helper.from_array(np.array([0, 0, -1], dtype=np.int64), "fused_rotary_bsd_shape"),
        numpy_helper.from_array(
            np.array([0, 0, -1, matches[0]["head_dim"]], dtype=np.int64), "fused_rotary_bsnh_shape"
        ),
    ]
    model.graph.initializer.extend(tables)
    shared = [
        helper.make_node("Cos", [angle], ["fused_rotary_cos3"], name="fused_rotary_cos"),
        helper.make_node(
            "Squeeze",
            ["fused_rotary_cos3", "fused_rotary_axis0"],
            ["fused_rotary_cos_cache"],
            name="fused_rotary_cos_cache",
        ),
        helper.make_node("Sin", [angle], ["fused_rotary_sin3"], name="fused_rotary_sin"),
        helper.make_node(
            "Squeeze",
            ["fused_rotary_sin3", "fused_rotary_axis0"],
            ["fused_rotary_sin_cache"],
            name="fused_rotary_sin_cache",
        ),
    ]
    position = list(model.graph.node).index(g.producer[angle]) + 1
    for offset, node in enumerate(shared):
        model.graph.node.insert(position + offset, node)
    for index, match in enumerate(matches):
        prefix = f"fused_rotary_{index}"
        take_over(
            model,
            g,
            match["output"],
            [
                helper.make_node(
                    "Reshape", [match["input"], "fused_rotary_bsd_shape"], [f"{prefix}_in"], name=f"{prefix}_flatten"
                ),
                helper.make_node(
                    "RotaryEmbedding",
                    [
                        f"{prefix}_in",
                        "fused_rotary_position_offset",
                        "fused_rotary_cos_cache",
                        "fused_rotary_sin_cache",
                    ],
                    [f"{prefix}_out"],
                    name=prefix,
                    domain=MS_DOMAIN,
                    interleaved=0,
                ),
                helper.make_node(
                    "Reshape", [f"{prefix}_out", "fused_rotary_bsnh_shape"], [f"{prefix}_bsnh"], name=f"{prefix}_heads"
                ),
                helper.make_node(
                    "Transpose", [f"{prefix}_bsnh"], [match["output"]], perm=[0, 2, 1, 3], name=f"{prefix}_bnsh"
                ),
            ],
        )
    add_opset(model, MS_DOMAIN, 1)
    return len(matches)


def prune_dead_nodes(model: onnx.ModelProto) -> int:
    """Drop nodes whose outputs reach no graph output, then initializers no node reads; returns
    the number of nodes dropped. Node order (topological) is kept."""
    graph = model.graph
    needed = {output.name for output in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    dropped = len(graph.node) - len(kept)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    unused = [init for init in graph.initializer if init.name not in needed]
    for init in unused:
        graph.initializer.remove(init)
    return dropped


def require_opset(model: onnx.ModelProto, version: int) -> None:
    """Raise the default domain's opset to `version` (and the IR version to the one onnx pairs
    with it), without converting any op. Sound for the graphs this project exports at opset 18 or
    later: the ops they use (no DFT, GridSample or GroupNormalization) keep their meaning up to 23,
    the versions between only adding types (Cast's saturate attribute concerns float8). An older
    graph (the legacy exporter's opsets 14-17, ReduceMean's axes an attribute) is refused."""
    entry = next(entry for entry in model.opset_import if entry.domain in ("", "ai.onnx"))
    if entry.version < 18:
        raise UserError(
            f"the transformer graph is at opset {entry.version}; the fused variants need an export at "
            "opset 18 or later",
            "re-export with export_omnivoice.py's default (dynamo, opset 18)",
        )
    entry.version = max(entry.version, version)
    ir = next(row[1] for row in helper.VERSION_TABLE if row[2] >= version)
    model.ir_version = max(model.ir_version, ir)


def add_opset(model: onnx.ModelProto, domain: str, version: int) -> None:
    if not any(entry.domain == domain for entry in model.opset_import):
        model.opset_import.append(helper.make_opsetid(domain, version))


def apply_fusions(model: onnx.ModelProto, fusions: tuple[str, ...]) -> dict[str, int]:
    """Run the named fusions (of FUSIONS) on an unmasked graph, then prune; counts per fusion."""
    unknown = [name for name in fusions if name not in FUSIONS]
    if unknown:
        raise ValueError(f"unknown fusion(s) {unknown}; known: {FUSIONS}")
    counts = {}
    # RoPE first: attention then finds q and k as RotaryEmbedding's [B, S, N * D] outputs.
    if "rotary" in fusions:
        counts["rotary"] = fuse_rotary(model)
    if "attention" in fusions:
        counts["attention"] = fuse_attention(model)
    if "rms_norm" in fusions:
        counts["rms_norm"] = fuse_rms_norm(model)
    counts["pruned_nodes"] = prune_dead_nodes(model)
    return counts
