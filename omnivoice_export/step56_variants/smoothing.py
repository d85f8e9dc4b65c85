"""The `int8` recipe's scales, calibrated from what the activations do (SmoothQuant, measured).

Why (docs/variants.md, the outlier proxies): a trained backbone's MatMul inputs carry outlier
channels, and where they are is a property of the model, not of one layer type: in the residual
stream read through flat norms, in GLU units that fire at every position (the down_proj input), in
value channels (the o_proj input). A per-row activation scale is set by the row's largest value, so
a persistent outlier channel leaves every other channel of every row a few of the 255 levels.
SmoothQuant (Xiao et al. 2023) divides channel j of the input by s_j and multiplies row j of the
weight by it (the product is unchanged), choosing s_j = act_j^alpha / w_j^(1 - alpha) from the
channel's measured range act_j and the weight row's range w_j. Here act_j is measured on the
capture's calls (the fp32 graph runs them, every quantized MatMul's input an extra output), alpha is
chosen per input by the smallest simulated int8 error of the MatMuls that read it (ALPHAS; "none"
is a candidate), and s_j is rounded to a power of two so that the fold is exact in fp32.

Where 1/s_j is folded (the site), exactly, bit for bit: scaling by a power of two commutes with
rounding, so each folded tensor is the old one times 1/s_j and each product x_j W_jn is unchanged:
- "norm": the input is an RMSNorm's output (SimplifiedLayerNormalization) that only quantized
  MatMuls read (q/k/v, gate/up): its weight g_j /= s_j.
- "up_proj": the input is Mul(silu(gate), up) (down_proj's): silu(g) * u scales with u, so up_proj's
  output column j is divided by s_j (its weight column; its int8 form is unchanged but for the
  column scale).
- "v_proj": the input is an ONNX Attention's output (o_proj's): attention is linear in v, so
  v_proj's output column j is divided by s_j; every query head that shares a kv head reads the same
  v channel, so the scale is tied across those heads (the o_proj rows of channel (h, d) take the
  scale of v channel (h // group, d)).
An input with no such site keeps s = 1 (the report says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from omnivoice_export.step56_variants.fusion import GraphIndex
from omnivoice_export.step56_variants.rowwise import matmuls_by_input

# The migration strengths tried per input (None: no migration); SmoothQuant's paper uses 0.5 for most
# models and up to 0.75-0.85 where activation outliers are strongest, so the grid spans both.
ALPHAS: tuple[float | None, ...] = (None, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# Rows of each input kept for the alpha search, spread evenly over the calibration calls.
SAMPLE_ROWS = 1024
INT8_LEVELS = 127  # symmetric int8: activations and weights both use [-127, 127] around zero
# Phase 5's spike rule (`int8-normfold`): an input whose largest row peak is this many times its
# median row peak spikes, and its MatMuls stay fp32 (the `int8` recipe measures instead: sensitivity).
SPIKE_RATIO = 20.0


@dataclass
class Site:
    """One quantized MatMul input: the MatMuls that read it and where its scale can be folded."""

    input: str
    readers: list[onnx.NodeProto]
    kind: str | None = None  # "norm" | "up_proj" | "v_proj" | None (no exact fold here)
    fold_node: onnx.NodeProto | None = None  # the norm, or the up_proj / v_proj MatMul
    # v_proj: for each input channel, the v channel it reads (channels sharing a kv head tie)
    channel_map: np.ndarray | None = None
    head_dim: int | None = None  # v_proj: channels per head (rotation's per-head block)


@dataclass
class InputStats:
    """What the fp32 graph's calls showed of one MatMul input."""

    channel_max: np.ndarray  # [K] max |x| per channel over every row of every call
    row_peaks: list[np.ndarray] = field(default_factory=list)  # per call: max |x| per row
    sample: list[np.ndarray] = field(default_factory=list)  # per call: rows kept for the alpha search

    def spike_ratio(self) -> float:
        """Largest row peak / median row peak (a massive row: the phase-5 spike rule's figure)."""
        peaks = np.concatenate(self.row_peaks)
        return float(peaks.max() / max(float(np.median(peaks)), 1e-30))

    def channel_ratio(self) -> float:
        """Largest channel range / median channel range: how far the outlier channels stand out."""
        return float(self.channel_max.max() / max(float(np.median(self.channel_max)), 1e-30))


def _attribute(node: onnx.NodeProto, name: str) -> int | None:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


def find_sites(model: onnx.ModelProto, exclude: list[str]) -> list[Site]:
    """Every input of a MatMul that will be quantized (a constant weight, not `exclude`), with its
    fold site where the graph has one of the three the module docstring names."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    readers = GraphIndex(graph).consumers
    sites = [Site(source, nodes) for source, nodes in matmuls_by_input(graph, set(exclude)).items()]
    names = {node.name for site in sites for node in site.readers}
    for site in sites:
        users = readers[site.input]
        own_weights = all(len(readers[user.input[1]]) == 1 for user in site.readers)
        if len(users) != len(site.readers) or not own_weights:
            continue  # something else reads the input (or a weight is shared): no exact fold
        source = producer.get(site.input)
        if source is None:
            continue
        if source.op_type == "SimplifiedLayerNormalization" and source.input[1] in inits:
            site.kind, site.fold_node = "norm", source
        elif source.op_type == "Mul":
            up = [producer.get(name) for name in source.input]
            silu = [p for p in up if p is not None and p.op_type == "Mul" and _is_silu(p, producer)]
            linear = [p for p in up if p is not None and p.op_type == "MatMul" and p.name in names]
            if len(silu) == 1 and len(linear) == 1 and _private(linear[0], readers):
                site.kind, site.fold_node = "up_proj", linear[0]
        elif source.op_type == "Attention" and source.domain in ("", "ai.onnx"):
            value = producer.get(source.input[2])
            q_heads, kv_heads = _attribute(source, "q_num_heads"), _attribute(source, "kv_num_heads")
            if (
                value is not None
                and value.name in names
                and _private(value, readers)
                and q_heads
                and kv_heads
                and len(source.output) == 1
            ):
                width = int(inits[value.input[1]].dims[1])
                head_dim = width // int(kv_heads)
                channels = np.arange(int(q_heads) * head_dim)
                group = int(q_heads) // int(kv_heads)
                site.kind, site.fold_node, site.head_dim = "v_proj", value, head_dim
                site.channel_map = (channels // head_dim // group) * head_dim + channels % head_dim
    return sites


def _private(linear: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]]) -> bool:
    """A MatMul whose output and weight nothing else reads: its output columns can be rescaled."""
    return len(readers[linear.output[0]]) == 1 and len(readers[linear.input[1]]) == 1


def _is_silu(node: onnx.NodeProto, producer: dict[str, onnx.NodeProto]) -> bool:
    """Mul(x, Sigmoid(x)): the exporter's silu."""
    sources = [producer.get(name) for name in node.input]
    sigmoid = [p for p in sources if p is not None and p.op_type == "Sigmoid"]
    return len(sigmoid) == 1 and sigmoid[0].input[0] in node.input


def measure_inputs(
    model: onnx.ModelProto, names: list[str], calls: list[dict[str, np.ndarray]], workdir: Path
) -> dict[str, InputStats]:
    """Run `model` (fp32) on `calls` with each of `names` as an extra output; per input, its channel
    ranges, row peaks and SAMPLE_ROWS rows spread over the calls. The probe copy is saved under
    `workdir` (a graph over 2 GB has to be a file)."""
    from omnivoice_export.step2_export.report import save_with_sidecar
    from omnivoice_onnx.sessions import make_session

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend([helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in names])
    path = Path(workdir) / "calibration-probe.onnx"
    save_with_sidecar(probe, path)
    del probe
    session = make_session(path, fix="re-run quantize_omnivoice.py")
    stats: dict[str, InputStats] = {}
    per_call = max(1, SAMPLE_ROWS // max(len(calls), 1))
    for feeds in calls:
        for name, value in zip(names, session.run(names, feeds), strict=True):
            rows = np.abs(value.reshape(-1, value.shape[-1]))
            entry = stats.setdefault(name, InputStats(np.zeros(rows.shape[1], dtype=np.float32)))
            np.maximum(entry.channel_max, rows.max(axis=0), out=entry.channel_max)
            entry.row_peaks.append(rows.max(axis=1))
            pick = np.linspace(0, rows.shape[0] - 1, min(per_call, rows.shape[0])).round().astype(int)
            entry.sample.append(value.reshape(-1, value.shape[-1])[pick].astype(np.float32))
    del session
    path.unlink()
    path.with_name(path.name + ".data").unlink(missing_ok=True)
    return stats


def power_of_two(values: np.ndarray) -> np.ndarray:
    """Each positive value rounded to the nearest power of two (in log2); others give 1."""
    positive = values > 0
    exponent = np.round(np.log2(np.where(positive, values, 1.0)))
    return np.where(positive, np.exp2(exponent), 1.0).astype(np.float32)


def quantize_rows(x: np.ndarray) -> np.ndarray:
    """x after int8 per-row quantization and back (symmetric, as rowwise.quantize_rowwise runs it)."""
    scale = np.maximum(np.abs(x).max(axis=1, keepdims=True) / INT8_LEVELS, 1e-12)
    rounded: np.ndarray = np.clip(np.rint(x / scale), -INT8_LEVELS, INT8_LEVELS) * scale
    return rounded


def quantize_columns(w: np.ndarray) -> np.ndarray:
    """w after int8 per-column quantization and back (rowwise.quantize_weight's rule)."""
    peak = np.abs(w).max(axis=0, keepdims=True)
    scale = np.where(peak > 0, peak / INT8_LEVELS, 1.0)
    return np.clip(np.rint(w / scale), -INT8_LEVELS, INT8_LEVELS) * scale


def simulated_error(x: np.ndarray, weights: list[np.ndarray], scale: np.ndarray, exact: list[np.ndarray]) -> float:
    """Relative squared error of the readers' outputs when input and weights are quantized after
    migrating `scale` (x / s, s * W), summed over the readers; each row's error is relative to its
    own output norm, so a massive row does not hide the error of the ordinary ones. `exact`: the
    readers' fp32 outputs x @ W (computed once by the caller: the same for every scale tried)."""
    xq = quantize_rows(x / scale)
    total = 0.0
    for w, reference in zip(weights, exact, strict=True):
        approx = xq @ quantize_columns(w * scale[:, None])
        norms = np.maximum((reference**2).sum(axis=1), 1e-30)
        total += float(np.mean(((approx - reference) ** 2).sum(axis=1) / norms))
    return total


@dataclass
class Choice:
    """The scale chosen for one site and what the search measured."""

    alpha: float | None
    scale: np.ndarray  # [K] powers of two (ones for no migration)
    errors: dict[str, float]  # simulated error per alpha tried ("none" for no migration)


def choose_scale(site: Site, stats: InputStats, weights: list[np.ndarray]) -> Choice:
    """The ALPHAS candidate with the smallest simulated error (module docstring); a site with no
    fold keeps ones. For v_proj the channels that read one v channel share its scale."""
    x = np.concatenate(stats.sample).astype(np.float32)
    ones = np.ones(x.shape[1], dtype=np.float32)
    exact = [x @ w for w in weights]
    if site.kind is None:
        return Choice(None, ones, {"none": simulated_error(x, weights, ones, exact)})
    act = stats.channel_max.astype(np.float64)
    weight_range = np.max([np.abs(w).max(axis=1) for w in weights], axis=0).astype(np.float64)
    if site.channel_map is not None:  # tie each v channel's readers: one range per v channel
        width = int(site.channel_map.max()) + 1
        act_v = np.zeros(width)
        weight_v = np.zeros(width)
        np.maximum.at(act_v, site.channel_map, act)
        np.maximum.at(weight_v, site.channel_map, weight_range)
        act, weight_range = act_v[site.channel_map], weight_v[site.channel_map]
    errors: dict[str, float] = {}
    best: tuple[float, float | None, np.ndarray] | None = None
    for alpha in ALPHAS:
        if alpha is None:
            scale = ones
        else:
            with np.errstate(divide="ignore"):
                scale = power_of_two(act**alpha / np.maximum(weight_range, 1e-30) ** (1 - alpha))
        error = simulated_error(x, weights, scale, exact)
        errors["none" if alpha is None else f"{alpha:g}"] = error
        if best is None or error < best[0]:
            best = (error, alpha, scale)
    assert best is not None
    return Choice(best[1], best[2], errors)


def fold(model: onnx.ModelProto, site: Site, scale: np.ndarray) -> None:
    """Divide the site's input by `scale` (powers of two) where the site folds it, and multiply its
    readers' weight rows by it; in place, exact in fp32 (module docstring)."""
    if site.kind is None or np.all(scale == 1):
        return
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    readers = GraphIndex(graph).consumers

    def update(name: str, value: np.ndarray) -> None:
        inits[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))

    assert site.fold_node is not None
    if site.kind == "norm":
        norm = site.fold_node
        if len(readers[norm.input[1]]) != 1:  # the exporter shares equal constants (equal norm weights)
            private = numpy_helper.from_array(numpy_helper.to_array(inits[norm.input[1]]), f"{norm.name}_weight")
            graph.initializer.append(private)
            inits[private.name] = graph.initializer[-1]
            norm.input[1] = private.name
        update(norm.input[1], numpy_helper.to_array(inits[norm.input[1]]) / scale)
    else:
        producer_weight = site.fold_node.input[1]
        column_scale = scale if site.channel_map is None else _v_scale(site.channel_map, scale)
        update(producer_weight, numpy_helper.to_array(inits[producer_weight]) / column_scale[None, :])
    for reader in site.readers:
        update(reader.input[1], numpy_helper.to_array(inits[reader.input[1]]) * scale[:, None])


def _v_scale(channel_map: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The per-v-channel scale behind a tied o_proj input scale (each v channel's readers agree)."""
    v_scale = np.ones(int(channel_map.max()) + 1, dtype=np.float32)
    v_scale[channel_map] = scale
    return v_scale


def prune_initializers(model: onnx.ModelProto) -> None:
    """Drop initializers no node reads (a norm weight a fold replaced by a private copy)."""
    read = {name for node in model.graph.node for name in node.input}
    kept = [init for init in model.graph.initializer if init.name in read]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)


def reader_weights(model: onnx.ModelProto, site: Site) -> list[np.ndarray]:
    inits = {init.name: init for init in model.graph.initializer}
    return [numpy_helper.to_array(inits[reader.input[1]]).astype(np.float32) for reader in site.readers]


def fold_norm_scales(model: onnx.ModelProto, exclude: list[str], alpha: float = 0.5) -> int:
    """Phase 5's rule (`int8-normfold`), kept to compare: only norm sites, and channel j's activation
    range assumed proportional to the norm weight |g_j| (the normalised residual assumed to have no
    preferred channel) instead of measured: s_j = |g_j|^alpha / w_j^(1 - alpha). Returns the number
    of norms folded."""
    inits = {init.name: init for init in model.graph.initializer}
    sites = [site for site in find_sites(model, exclude) if site.kind == "norm"]
    for site in sites:
        assert site.fold_node is not None
        gain = np.abs(numpy_helper.to_array(inits[site.fold_node.input[1]]).astype(np.float64))
        weight_range = np.max([np.abs(w).max(axis=1) for w in reader_weights(model, site)], axis=0)
        with np.errstate(divide="ignore"):
            fold(model, site, power_of_two(gain**alpha / np.maximum(weight_range, 1e-30) ** (1 - alpha)))
    prune_initializers(model)
    return len(sites)


def smooth(
    model: onnx.ModelProto, exclude: list[str], calls: list[dict[str, np.ndarray]], workdir: Path
) -> list[dict[str, object]]:
    """Measure every quantized MatMul input on `calls`, choose and fold its scale (module
    docstring); in place. Returns one report row per input: its readers, site, alpha, ranges."""
    sites = find_sites(model, exclude)
    stats = measure_inputs(model, [site.input for site in sites], calls, workdir)
    rows: list[dict[str, object]] = []
    for site in sites:
        choice = choose_scale(site, stats[site.input], reader_weights(model, site))
        fold(model, site, choice.scale)
        entry = stats[site.input]
        rows.append(
            {
                "input": site.input,
                "matmuls": [reader.name for reader in site.readers],
                "fold": site.kind or "none (no exact site)",
                "alpha": choice.alpha,
                "channel_ratio": round(entry.channel_ratio(), 1),
                "row_spike_ratio": round(entry.spike_ratio(), 1),
                "max_abs": float(f"{float(entry.channel_max.max()):.4g}"),
                "scale_range": [float(choice.scale.min()), float(choice.scale.max())],
                "error_by_alpha": {key: float(f"{value:.3g}") for key, value in choice.errors.items()},
            }
        )
    prune_initializers(model)
    return rows


def spike_ratios(
    model: onnx.ModelProto, exclude: list[str], calls: list[dict[str, np.ndarray]], workdir: Path
) -> dict[str, float]:
    """Phase 5's spike rule: {MatMul: its input's largest row peak / median row peak on `calls`}
    for every MatMul that would be quantized."""
    sites = find_sites(model, exclude)
    stats = measure_inputs(model, [site.input for site in sites], calls, workdir)
    return {reader.name: stats[site.input].spike_ratio() for site in sites for reader in site.readers}
