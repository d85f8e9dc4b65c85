"""Graph rewrites of the unmasked transformer (FUSIONS), for the fp32-fused and int8 recipes.

- attention (fp32-fused, int8): each layer's attention core -> one com.microsoft MultiHeadAttention
  (below);
- projections (int8 only): the MatMuls that read one activation -> one MatMul + Split, the same
  int8 bits (fuse_projections);
- rms_norm (int8 only): each RMSNorm -> onnxruntime's SimplifiedLayerNormalization, its own float
  order (fuse_rms_norm).

Applied after quantize.drop_mask_work: the graph they rewrite is already
unmasked, i.e. valid only for calls whose attention mask is all True, which is every call
omnivoice_onnx.sessions.run_split makes (cond and uncond rows at their own lengths). A padded call
still gets NaN logits from drop_mask_work's output guard, so it is loud, never silently wrong.

What the dynamo exporter wrote per layer (torch SDPA with GQA lowered to plain ops), and what
replaces it:

    q   [B, H, S, D]   q_proj -> q_norm -> RoPE
    k   [B, H, S, D]   k_proj -> k_norm -> RoPE -> repeat_kv (Unsqueeze, Expand, Reshape: 8 -> 16 heads)
    v   [B, H, S, D]   v_proj -> repeat_kv
    kT = Reshape(Transpose(Reshape(k, [-1, S, D]), [0, 2, 1]), [B, H, D, S])
    p  = Softmax(MatMul(Mul(q, s), Mul(kT, s)))          s = D ** -0.25, applied to both sides
    out = Reshape(Transpose(MatMul(p, v), [0, 2, 1, 3]), [B, S, H * D])
  ->
    out = com.microsoft.MultiHeadAttention(Reshape(Transpose(q, [0, 2, 1, 3]), [0, 0, -1]), k, v,
                                           num_heads=H, scale=s * s)

MultiHeadAttention takes key and value in BNSH layout ([B, H, S, D], the form it documents for a
past key/value), so repeat_kv's output feeds it as is; H and D are read from repeat_kv's target
shape, s from the two scale Muls (the graph's own float32 constants; s * s is computed in float32).

Float order: the faithful graph scales q and kT by s each and multiplies; the fused kernel gets
s * s as its scale. Measured, the logits are the same bits as the unmasked graph's on every tiny
captured call (head_dim 16: s = 0.5) and on the three benchmark calls at the real dims (head_dim
128), so the fp32 verdicts hold exactly as for fp32-unmasked (tests/test_fusion.py, the bench).

Not fused in fp32, measured (investigation log): RMSNorm -> ORT's
SimplifiedLayerNormalization. Its kernel does not follow upstream's pow / mean / rsqrt / multiply
order: logits moved by up to 1.2e-5 against the faithful graph at the real dims, a 1-ULP near-tie
flipped its argmax on tiny (auto step 17: argmax 0.999399, so not the fp32 verdict), and no speed
gain showed in fp32. In int8, where that difference is far below the recipe's own
error, it gains 1.02-1.03x per call, so the int8 recipe uses it.
ORT 1.32's GroupQueryAttention (causal=0, 8 kv heads without the repeat) timed the same as
MultiHeadAttention on one attention call at the real dims, within the noise. Not built, measured
(investigation log): GroupQueryAttention with its own rotary (the RoPE chain and the K/V repeat gone; its Q/K
norm prologue is refused on CPU) or RoPE as RotaryEmbedding save ~1 ms per layer pair, ~2 % of an
int8 step.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from omnivoice_onnx.errors import UserError

MS_DOMAIN = "com.microsoft"
FUSIONS = ("attention", "projections", "rms_norm")
_FIX = "build the variant from the fp32 export made by export_omnivoice.py (step 2) with quantize_omnivoice.py"


class _Graph:
    """Producer/consumer/initializer lookups over a graph that is being rewritten."""

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


def attribute(node: onnx.NodeProto, name: str, default=None):
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _repeat_kv_heads(g: _Graph, name: str) -> tuple[int, int] | None:
    """(heads, head_dim) if `name` is repeat_kv's output: Reshape to Concat(B, [H], S, [D])."""
    reshape = g.op(name, "Reshape")
    shape = g.op(reshape.input[1], "Concat") if reshape is not None else None
    if shape is None or len(shape.input) != 4:
        return None
    heads, dim = g.constant(shape.input[1]), g.constant(shape.input[3])
    if heads is None or dim is None or heads.size != 1 or dim.size != 1:
        return None
    return int(heads.reshape(-1)[0]), int(dim.reshape(-1)[0])


def _match_attention(g: _Graph, softmax: onnx.NodeProto) -> dict | None:
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
    inner = g.op(transpose.input[0], "Reshape") if transpose is not None else None
    if inner is None or list(attribute(transpose, "perm", [])) != [0, 2, 1]:
        return None
    key, value = inner.input[0], pv.input[1]
    heads = _repeat_kv_heads(g, key)
    if heads is None or heads != _repeat_kv_heads(g, value):
        return None
    back = g.only_consumer(pv.output[0], "Transpose")
    merge = g.only_consumer(back.output[0], "Reshape") if back is not None else None
    if merge is None or list(attribute(back, "perm", [])) != [0, 2, 1, 3]:
        return None
    scale = np.float32(q_side[1].reshape(-1)[0]) * np.float32(k_side[1].reshape(-1)[0])
    if abs(float(scale) - heads[1] ** -0.5) > 1e-6 * heads[1] ** -0.5:  # SDPA's default scale, or not attention's
        return None
    return {"query": q_side[0], "key": key, "value": value, "output": merge.output[0], "heads": heads[0],
            "scale": float(scale)}


def take_over(model: onnx.ModelProto, g: _Graph, output: str, new: list[onnx.NodeProto]) -> None:
    """Insert `new` right after the node producing `output`, the last of them taking the name over:
    the old producer writes `<output>_unfused`, which nothing reads, so prune_dead_nodes drops the
    chain it ended. Consumers keep reading `output`, and node order stays topological."""
    old = g.producer[output]
    old.output[0] = f"{output}_unfused"
    position = list(model.graph.node).index(old)
    for offset, node in enumerate(new):
        model.graph.node.insert(position + 1 + offset, node)


def fuse_attention(model: onnx.ModelProto) -> int:
    """Replace each layer's unmasked attention core by one com.microsoft MultiHeadAttention; in place.

    Each decoder layer has one Softmax, so every Softmax must match: refuses (UserError) if one
    does not or there is none, rather than write a graph half fused. Returns the number fused (the
    layer count). The replaced nodes are removed by prune_dead_nodes.
    """
    g = _Graph(model.graph)
    softmaxes = [node for node in model.graph.node if node.op_type == "Softmax"]
    matches = [match for match in (_match_attention(g, node) for node in softmaxes) if match is not None]
    if not softmaxes or len(matches) != len(softmaxes):
        raise UserError(f"found the unmasked attention pattern (MatMul(Mul(q, s), Mul(kT, s)) -> Softmax -> MatMul -> "
                        f"Transpose -> Reshape) at {len(matches)} of the graph's {len(softmaxes)} Softmax nodes "
                        "(one per layer)", _FIX)
    shared = numpy_helper.from_array(np.array([0, 0, -1], dtype=np.int64), "fused_attention_bsd_shape")
    model.graph.initializer.append(shared)
    for index, match in enumerate(matches):
        prefix = f"fused_attention_{index}"
        new = [
            helper.make_node("Transpose", [match["query"]], [f"{prefix}_q_bsnh"], perm=[0, 2, 1, 3],
                             name=f"{prefix}_q_transpose"),
            helper.make_node("Reshape", [f"{prefix}_q_bsnh", shared.name], [f"{prefix}_q"], name=f"{prefix}_q_reshape"),
            helper.make_node("MultiHeadAttention", [f"{prefix}_q", match["key"], match["value"]], [match["output"]],
                             name=prefix, domain=MS_DOMAIN, num_heads=match["heads"], scale=match["scale"]),
        ]
        # The old merge Reshape gives its output name to MultiHeadAttention and becomes dead.
        take_over(model, g, match["output"], new)
    add_opset(model, MS_DOMAIN, 1)
    return len(matches)


def fuse_projections(model: onnx.ModelProto, exclude: tuple[str, ...] = ()) -> int:
    """Merge the MatMuls that read one activation with constant weights into one MatMul + Split; in place.

    Each layer's q/k/v projections read the input norm's output, gate/up the post-attention
    norm's: X @ [Wq | Wk | Wv] then Split along the last axis gives the same columns as the three
    MatMuls. Meant before quantize_dynamic (the `int8` recipe): its weights are int8 per output
    column (axis -1) and its activation scale is per tensor, shared by q/k/v already, so the
    merged MatMulInteger computes every output column with the same integers and the same two
    scales as the separate ones: the same bits, in one larger GEMM with one activation pass and
    one kernel launch instead of three (the same bits: tests/test_fusion.py on tiny; 1.05x per
    call at the real dims, investigation log). Not used for the fp32 recipes: an fp32 GEMM of
    another width may block its sums differently, so fp32 bits would no longer be promised. MatMuls in
    `exclude` (the audio heads) stay as they are. Refuses (UserError) a graph with nothing to
    merge. Returns the number of merged groups.
    """
    g = _Graph(model.graph)
    weights = {name: init for name, init in g.initializers.items() if len(init.dims) == 2}
    groups: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.name not in exclude and node.input[1] in weights:
            groups.setdefault(node.input[0], []).append(node)
    merged = 0
    for activation, nodes in groups.items():
        rows = {weights[node.input[1]].dims[0] for node in nodes}
        if len(nodes) < 2 or len(rows) != 1:
            continue
        arrays = [numpy_helper.to_array(weights[node.input[1]]) for node in nodes]
        prefix = f"fused_projections_{merged}"
        joined = numpy_helper.from_array(np.concatenate(arrays, axis=1), f"{prefix}_weight")
        widths = numpy_helper.from_array(np.array([a.shape[1] for a in arrays], dtype=np.int64), f"{prefix}_widths")
        model.graph.initializer.extend([joined, widths])
        first = list(model.graph.node).index(nodes[0])
        model.graph.node.insert(first, helper.make_node("MatMul", [activation, joined.name], [f"{prefix}_out"],
                                                        name=prefix))
        model.graph.node.insert(first + 1, helper.make_node("Split", [f"{prefix}_out", widths.name],
                                                            [node.output[0] for node in nodes], axis=-1,
                                                            name=f"{prefix}_split"))
        for node in nodes:
            node.output[0] = f"{node.output[0]}_unmerged"
        merged += 1
    if merged == 0:
        raise UserError("found no MatMuls with constant weights sharing one input (q/k/v, gate/up) to merge", _FIX)
    return merged


def _match_rms_norm(g: _Graph, pow_node: onnx.NodeProto) -> dict | None:
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
    sqrt = g.only_consumer(add.output[0], "Sqrt") if eps is not None else None
    inverse = g.only_consumer(sqrt.output[0], "Reciprocal") if sqrt is not None else None
    scaled = g.only_consumer(inverse.output[0], "Mul") if inverse is not None else None
    if scaled is None or set(scaled.input) != {x, inverse.output[0]}:
        return None
    weighted = g.only_consumer(scaled.output[0], "Mul")
    weight = next((name for name in weighted.input if name != scaled.output[0]), None) if weighted is not None else None
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
    g = _Graph(model.graph)
    matches = [match for match in (_match_rms_norm(g, node) for node in model.graph.node if node.op_type == "Pow")
               if match is not None]
    means = sum(node.op_type == "ReduceMean" for node in model.graph.node)
    if not matches or len(matches) != means:
        raise UserError(f"found the RMSNorm pattern (Pow(x, 2) -> ReduceMean -> Add(eps) -> Sqrt -> Reciprocal -> "
                        f"Mul(x) -> Mul(weight)) at {len(matches)} of the graph's {means} ReduceMean nodes", _FIX)
    for index, match in enumerate(matches):
        take_over(model, g, match["output"], [helper.make_node(
            "SimplifiedLayerNormalization", [match["input"], match["weight"]], [match["output"]],
            name=f"fused_rms_norm_{index}", axis=-1, epsilon=match["epsilon"])])
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


def add_opset(model: onnx.ModelProto, domain: str, version: int) -> None:
    if not any(entry.domain == domain for entry in model.opset_import):
        model.opset_import.append(helper.make_opsetid(domain, version))


def apply_fusions(model: onnx.ModelProto, fusions: tuple[str, ...], exclude: tuple[str, ...] = ()) -> dict[str, int]:
    """Run the named fusions (of FUSIONS) on an unmasked graph, then prune; counts per fusion.
    `exclude`: MatMul names the projections fusion leaves alone."""
    unknown = [name for name in fusions if name not in FUSIONS]
    if unknown:
        raise ValueError(f"unknown fusion(s) {unknown}; known: {FUSIONS}")
    counts = {}
    if "attention" in fusions:
        counts["attention"] = fuse_attention(model)
    if "projections" in fusions:
        counts["projections"] = fuse_projections(model, exclude)
    if "rms_norm" in fusions:
        counts["rms_norm"] = fuse_rms_norm(model)
    counts["pruned_nodes"] = prune_dead_nodes(model)
    return counts
