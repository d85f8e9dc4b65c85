"""Quantized variants of the fp32 transformer graph: recipes, the node choice, one-sidecar saves.

A variant is `onnx/<name>/omnivoice_transformer.onnx` + its one `.onnx.data` sidecar, made from
the fp32 export's transformer by one recipe of onnxruntime.quantization (or omnivoice_export.fp16).
Codec graphs stay fp32 and loaders take them from onnx/, except where a recipe converts them too
(`codecs`: fp16 does): then the variant directory holds its own higgs_encoder/higgs_decoder graphs
and loaders take those (omnivoice_onnx.contract.variant_path).

Why the recipes are what they are (the quality table measures each):
- the audio heads (the last MatMul, hidden -> 8 x 1025) produce the logits that unmasking ranks
  by confidence and takes the argmax of: their quantization error lands on every logit directly,
  with no later layer to dilute it. Every recipe but `int8-plain` keeps them fp32; `int8-plain`
  exists to show why (on tiny: 2.4x int8-unfused's relative logit error, fewer tokens kept in
  every mode).
- the embeddings (text 151676 x H and audio 8200 x H) are Gathers: storing them in fewer bits
  saves disk, not time (a Gather reads a few rows), but the text table is most of an int8 file
  (621 MB of ~1.1 GB at the real dims, 46 % of fp32's size with it, against the issue's 40 %).
  `int8` and `int8-unfused` store them fp16 (Gather, Cast: rounding error 2^-11 relative per
  element, ~50x below int8 per row's), which brings the file to about a third of fp32's;
  `int8-emb32` is int8-unfused's recipe with fp32 tables, kept to measure what fp16 tables cost
  (the quality table). `int8-emb8` stores them int8 per row (in standard ops any runtime has);
  `int8-plain` quantizes every op `quantize_dynamic` supports (its Gathers then read uint8
  tables). The MatMulNBits recipes keep fp32 tables.
- `quantize_dynamic` quantizes each MatMul's activations per tensor at run time (uint8, scale
  from that call's min/max): the rows of one call share a scale, so the result of a row depends
  on the other rows in the call (cond and uncond rows of one length group, padding included).
  Weights are int8 per output channel (`per_channel`), symmetric; `reduce_range` is off, which is
  right on VNNI CPUs (AVX512-VNNI / AVX-VNNI) and can saturate u8 x s8 products on older AVX2 ones.
- `fp32-unmasked` is not quantized: the faithful fp32 graph without each layer's mask work, valid
  (and bit-identical) for the calls run_split makes, whose masks are all True (drop_mask_work).
- `fp32-fused` is fp32-unmasked with each layer's attention core fused into one ONNX Attention
  (opset 23; omnivoice_export.fusion): same calls, same output guard; its logits were the same
  bits as fp32-unmasked's on every call measured (tiny: all captured; real dims: the bench's
  shapes), not a guarantee: the fused kernel owns its float order.
- `fp16` (omnivoice_export.fp16): float16 weights and compute, float32 inputs and outputs, and
  float32 islands where float16 overflows or loses the decision (`keep_fp32`: RMSNorm's square,
  mean and rsqrt; RoPE's angles; softmax; the audio heads to the logits), computed in float32
  from the island's first input to its last output. Its codec graphs are float16 too, with the
  ops CODEC_KEEP_OPS names float32. The GPU / mobile format: an x86 CPU without native float16
  arithmetic runs it no faster than fp32 (0.97x at the real dims; slower on tiny).
- `int8-pertensor` (the `int8` until the outlier proxy showed it breaking) is quantize_dynamic on
  fp32-fused's graph (same calls, same output guard as fp32-unmasked), with two more rewrites
  before quantizing (omnivoice_export.fusion;
  investigation log): each RoPE as com.microsoft.RotaryEmbedding, so that Attention reads q, k
  and v without a layout change, and each RMSNorm as onnxruntime's SimplifiedLayerNormalization
  (each its own float order: not for the fp32 recipes). onnxruntime quantizes the activation that
  q/k/v (gate/up) share once and runs one MatMulIntegerToFloat per projection. The attention cores
  stay Attention in fp32: at the real dims they are 38 % of int8's kernel time on two threads, the
  bound on what int8 projections can gain. `int8-unfused` is the same quantization of the
  faithful graph (valid for any mask), kept to measure what the rewrites gain.
- `int8` is int8-pertensor's graph quantized by omnivoice_export.rowwise instead, calibrated on
  the capture's calls: every MatMul input's channel ranges measured and its outlier channels
  folded into the weights that read it (omnivoice_export.smoothing: SmoothQuant with alpha chosen
  per input, powers of two, the fp32 graph's bits unchanged; into the norms, up_proj's and
  v_proj's output columns), one scale per row of every activation (a massive row no longer sets
  the scale of the others), and fp32 for the fewest MatMuls whose measured share of the logit
  error reaches the target (omnivoice_export.sensitivity). Per-tensor scales are what a trained
  model's outliers break (docs/variants.md: the outlier proxies); `int8-normfold` is phase 5's
  rule (scales read from the norm weights, spiking rows fp32), `int8-rows` the per-row scales
  alone, kept to measure what each part adds.
- `MatMulNBits` keeps weights block-wise (block along K, one scale and zero point per block);
  `accuracy_level` 0 dequantizes to fp32 and runs an fp32 GEMM, 4 quantizes activations to int8
  per block and runs an int8 GEMM (faster; the kind of error that flipped argmaxes on Qwen3-0.6B,
  onnxruntime#29849).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from omnivoice_export import fp16, fusion, report, rowwise, sensitivity, smoothing
from omnivoice_export.cli import check_output
from omnivoice_export.files import file_entry, first_mismatch, sha256_file, temporary_dir, umask_mode
from omnivoice_export.measure import PeakRss
from omnivoice_export.report import read_graph_metadata, save_with_sidecar
from omnivoice_onnx.contract import GRAPH_FILES, variant_dir, variant_path
from omnivoice_onnx.errors import UserError

TRANSFORMER_FILE = GRAPH_FILES["transformer"]


@dataclass(frozen=True)
class Recipe:
    """How one variant is made from the fp32 transformer."""

    name: str
    # "dynamic" (quantize_dynamic, MatMulInteger) | "rowwise" (omnivoice_export.rowwise: per-row activation scales)
    # | "nbits" (MatMulNBits) | "unmasked" (fp32) | "fp16"
    method: str
    bits: int
    keep_heads_fp32: bool
    # "fp32" | "fp16" (store_embeddings_fp16; the fp16 method's own Gathers) | "int8-row"
    # (quantize_embeddings_rowwise) | "dynamic" (quantize_dynamic's)
    embeddings: str
    block_size: int | None = None  # nbits: weights per (scale, zero point) block along K
    accuracy_level: int | None = None  # nbits: 0 fp32 compute, 4 int8 activations
    fusions: tuple[str, ...] = ()  # unmasked, dynamic: omnivoice_export.fusion passes applied after drop_mask_work
    keep_fp32: tuple[str, ...] = ()  # fp16: the float32 islands of the transformer (fp16.TRANSFORMER_KEEP groups)
    codecs: tuple[str, ...] = ()  # codec graphs the variant converts and carries itself (else the export's fp32 ones)
    fold_norms: bool = False  # rowwise: smoothing.fold_norm_scales before quantizing (phase 5: scales from the norms)
    spikes_fp32: bool = False  # rowwise: the MatMuls whose input spikes on the capture's calls stay fp32 (phase 5)
    # rowwise: scales of every MatMul input measured on the capture's calls and folded (smoothing.smooth),
    # then the fewest MatMuls kept fp32 that reach sensitivity's target (sensitivity.select_fp32)
    calibrate: bool = False
    summary: str = ""

    def as_dict(self) -> dict[str, Any]:
        """As JSON reads it back (the report entry and the graph's `recipe` metadata)."""
        return {
            **asdict(self),
            "fusions": list(self.fusions),
            "keep_fp32": list(self.keep_fp32),
            "codecs": list(self.codecs),
        }


RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe(
            "fp32-unmasked",
            "unmasked",
            32,
            True,
            "fp32",
            summary="fp32, without the per-layer mask work (mask Add, NaN guard): for calls whose mask is all "
            "True, as run_split makes every call; NaN logits for any row whose mask is not",
        ),
        Recipe(
            "fp32-fused",
            "unmasked",
            32,
            True,
            "fp32",
            fusions=("attention",),
            summary="fp32-unmasked with each layer's attention core one ONNX Attention (opset 23, grouped-query): "
            "same calls, same guard; the same logits as fp32-unmasked where measured",
        ),
        Recipe(
            "fp16",
            "fp16",
            16,
            True,
            "fp16",
            keep_fp32=fp16.TRANSFORMER_KEEP,
            codecs=("encoder", "decoder"),
            summary="float16 weights and compute, float32 I/O; float32 islands for RMSNorm (square, mean, rsqrt), "
            "RoPE angles, softmax and the audio heads; its own float16 codec graphs (GPU / mobile format: "
            "no faster than fp32 on x86 CPUs without native float16)",
        ),
        Recipe(
            "int8",
            "rowwise",
            8,
            True,
            "fp16",
            fusions=("attention", "rotary", "rms_norm"),
            calibrate=True,
            summary="int8-pertensor's graph with every MatMul input's outlier channels measured on the capture's "
            "calls and folded into the weights (SmoothQuant, alpha measured per input, exact in fp32: into the "
            "norms, up_proj, v_proj), a scale per row of each activation (MatMulIntegerToFloat), and fp32 for "
            "the fewest MatMuls whose measured share of the logit error reaches the target",
        ),
        Recipe(
            "int8-normfold",
            "rowwise",
            8,
            True,
            "fp16",
            fusions=("attention", "rotary", "rms_norm"),
            fold_norms=True,
            spikes_fp32=True,
            summary="phase 5's int8, kept to compare: scales read from the norms' weights (not measured), a scale "
            "per row, fp32 for the MatMuls whose input rows spike; breaks where outlier channels are not "
            "in the norm weights (down_proj and o_proj inputs, residual channels)",
        ),
        Recipe(
            "int8-rows",
            "rowwise",
            8,
            True,
            "fp16",
            fusions=("attention", "rotary", "rms_norm"),
            summary="per-row activation scales alone, nothing folded, nothing kept fp32 (what the others add)",
        ),
        Recipe(
            "int8-pertensor",
            "dynamic",
            8,
            True,
            "fp16",
            fusions=("attention", "rotary", "rms_norm"),
            summary="quantize_dynamic on fp32-fused's graph: int8 per-channel weights, uint8 per-tensor activations; "
            "attention one ONNX Attention (fp32) on RotaryEmbedding's q and k, RMSNorm onnxruntime's kernel; "
            "audio heads fp32, embedding tables fp16; for run_split's calls (NaN logits for a row whose "
            "mask is not all True)",
        ),
        Recipe(
            "int8-unfused",
            "dynamic",
            8,
            True,
            "fp16",
            summary="int8 on the faithful graph (any mask), nothing fused: what the fusions of int8 gain",
        ),
        Recipe(
            "int8-emb32",
            "dynamic",
            8,
            True,
            "fp32",
            summary="int8-unfused with the embedding tables fp32: what storing them fp16 costs "
            "(46 % of fp32's size, not ~33 %)",
        ),
        Recipe(
            "int8-emb8",
            "dynamic",
            8,
            True,
            "int8-row",
            summary="int8-unfused, and the embedding tables int8 with one fp32 scale per row (Gather, Cast, Mul): "
            "the text table is most of the file",
        ),
        Recipe(
            "int8-plain",
            "dynamic",
            8,
            False,
            "dynamic",
            summary="int8-unfused over every op quantize_dynamic supports (audio heads and embeddings too): "
            "the recipe NOT to use, kept to show why the heads stay fp32",
        ),
        Recipe(
            "int8-nbits-a0",
            "nbits",
            8,
            True,
            "fp32",
            block_size=32,
            accuracy_level=0,
            summary="MatMulNBits 8-bit, block 32, accuracy_level 0 (fp32 compute); audio heads and embeddings fp32",
        ),
        Recipe(
            "int8-nbits-a4",
            "nbits",
            8,
            True,
            "fp32",
            block_size=32,
            accuracy_level=4,
            summary="MatMulNBits 8-bit, block 32, accuracy_level 4 (int8 activations); audio heads and embeddings fp32",
        ),
        Recipe(
            "int4-b32",
            "nbits",
            4,
            True,
            "fp32",
            block_size=32,
            accuracy_level=4,
            summary="MatMulNBits 4-bit, block 32, accuracy_level 4; audio heads and embeddings fp32",
        ),
        Recipe(
            "int4-b128",
            "nbits",
            4,
            True,
            "fp32",
            block_size=128,
            accuracy_level=4,
            summary="MatMulNBits 4-bit, block 128, accuracy_level 4; audio heads and embeddings fp32",
        ),
    )
}
DEFAULT_VARIANTS = tuple(RECIPES)


def weight_nodes(model: onnx.ModelProto, heads_width: int) -> tuple[list[str], list[str]]:
    """(audio-heads MatMul names, embedding Gather names) of the fp32 transformer.

    The dynamo exporter names weights val_N, so the heads are found by shape: the one MatMul whose
    weight initializer is [hidden, num_codebooks * audio_vocab_size]. Embeddings are the Gathers
    that read an initializer.
    """
    shapes = {init.name: list(init.dims) for init in model.graph.initializer}
    heads = [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and any(shapes.get(name, [])[-1:] == [heads_width] for name in node.input)
    ]
    embeddings = [node.name for node in model.graph.node if node.op_type == "Gather" and node.input[0] in shapes]
    if len(heads) != 1 or not embeddings:
        raise UserError(
            f"the transformer graph has {len(heads)} audio-heads MatMul(s) of width {heads_width} and "
            f"{len(embeddings)} embedding Gather(s); expected one and at least one",
            "quantize the fp32 export made by export_omnivoice.py (step 2)",
        )
    return heads, embeddings


def quantize_dynamic_variant(source: Path, staging: Path, recipe: Recipe, exclude: list[str]) -> onnx.ModelProto:
    """quantize_dynamic on `source`; returns the quantized model with its weights in memory.

    quantize_dynamic reads its input by path and writes a shape-inferred copy beside it. onnx
    refuses a sidecar reached through a symlink or a hard link, and a ModelProto input costs two
    more in-memory copies of the weights (~5 GB at the real dims), so the input is the fp32 graph
    proto alone, saved beside the fp32 sidecar it still points to, under the staging directory's
    name plus `-input.onnx`; it and the `-inferred` copy onnxruntime writes beside it are removed
    afterwards, and after a kill -9 by the next run's staging (files.remove_stale_temporaries).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph_only = source.with_name(f"{staging.name}-input.onnx")
    onnx.save_model(onnx.load(str(source), load_external_data=False), str(graph_only))
    out = staging / "dynamic" / TRANSFORMER_FILE
    out.parent.mkdir()
    try:
        quantize_dynamic(
            graph_only,
            out,
            per_channel=True,
            reduce_range=False,
            weight_type=QuantType.QInt8,
            use_external_data_format=True,
            op_types_to_quantize=None if recipe.embeddings == "dynamic" else ["MatMul"],
            nodes_to_exclude=exclude,
        )
        model = onnx.load(str(out))
    finally:
        graph_only.unlink(missing_ok=True)
        graph_only.with_name(graph_only.stem + "-inferred.onnx").unlink(missing_ok=True)
    shutil.rmtree(out.parent)
    return model


def prepared_graph(source: Path, recipe: Recipe) -> onnx.ModelProto:
    """The fp32 graph without the mask work, with `recipe.fusions` applied: what a fused recipe
    quantizes (the fused Attention nodes stay fp32, as in fp32-fused)."""
    model = onnx.load(str(source))
    drop_mask_work(model)
    fusion.apply_fusions(model, recipe.fusions)
    return model


def quantize_prepared(
    model: onnx.ModelProto,
    recipe: Recipe,
    exclude: list[str],
    calls: list[dict[str, np.ndarray]],
    workdir: Path,
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Quantize an fp32 graph already prepared for `recipe` (a "dynamic" or "rowwise" one), keeping
    `exclude` fp32; `calls` (feeds of the graph) calibrate the recipes that measure. Returns the
    quantized model and what it measured (the report entry's `calibration`). Any graph of the same
    building blocks works (tests and bench/bench_int8_judge.py run it on a trained LLaMA-family
    model); `workdir` holds the probe graphs (a graph over 2 GB has to be a file)."""
    workdir = Path(workdir)
    details: dict[str, Any] = {}
    if recipe.method == "dynamic":
        path = workdir / "unmasked" / TRANSFORMER_FILE
        path.parent.mkdir()
        save_with_sidecar(model, path)
        return quantize_dynamic_variant(path, workdir, recipe, exclude), details
    if recipe.method != "rowwise":
        raise ValueError(f"quantize_prepared takes dynamic and rowwise recipes, not {recipe.method}")
    fp32: list[str] = []
    if recipe.fold_norms:
        details["norms_folded"] = smoothing.fold_norm_scales(model, exclude)
    if recipe.spikes_fp32:
        ratios = smoothing.spike_ratios(model, exclude, calls, workdir)
        spikes = {name: round(ratio, 1) for name, ratio in ratios.items() if ratio > smoothing.SPIKE_RATIO}
        details["spikes"] = {
            "threshold": smoothing.SPIKE_RATIO,
            "largest_ratio": round(max(ratios.values()), 1),
            "fp32": spikes,
        }
        fp32 += list(spikes)
    if recipe.calibrate:
        details["inputs"] = smoothing.smooth(model, exclude, calls, workdir)
        selection = sensitivity.select_fp32(model, exclude, calls, workdir)
        details["fp32"] = {
            "target": {"mean": sensitivity.TARGET_MEAN, "min": sensitivity.TARGET_MIN},
            "max_share": sensitivity.MAX_FP32_SHARE,
            "reached": selection.reached,
            "kept": selection.kept,
            "share": round(selection.fp32_share, 4),
            "agreement_mean": round(float(np.mean(selection.agreement)), 6),
            "agreement_min": round(min(selection.agreement), 6),
            "all_int8_mean": round(float(np.mean(selection.all_int8)), 6),
            "all_int8_min": round(min(selection.all_int8), 6),
            "contribution": {name: float(f"{selection.contribution[name]:.4g}") for name in selection.order},
        }
        fp32 += selection.kept
        details["calls"] = len(calls)
    rowwise.quantize_rowwise(model, exclude + fp32)
    return model, details


def quantize_nbits_variant(source: Path, recipe: Recipe, exclude: list[str]) -> onnx.ModelProto:
    """MatMulNBits weight-only quantization of every MatMul but `exclude` (Gathers untouched)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(source)),
        bits=recipe.bits,
        block_size=recipe.block_size,
        is_symmetric=False,
        accuracy_level=recipe.accuracy_level,
        nodes_to_exclude=exclude,
        op_types_to_quantize=("MatMul",),
    )
    quantizer.process()
    return quantizer.model.model


def quantize_embeddings_rowwise(model: onnx.ModelProto, gathers: list[str]) -> None:
    """Store each embedding table int8 with one fp32 scale per row, in place.

    Gather(table, ids) becomes Gather(q, ids) -> Cast(float) -> Mul(Gather(scale, ids)): standard
    ops, so any ONNX runtime (and a hand-written one) reads it. Symmetric per row:
    scale = max|row| / 127 (1 for an all-zero row), q = round-half-even(row / scale) in [-127, 127];
    the looked-up row is q * scale in float32.
    """

    def rowwise(prefix: str, table: np.ndarray, ids: str, output: str):
        peak = np.abs(table).max(axis=1, keepdims=True)
        scale = np.where(peak > 0, peak / np.float32(127), np.float32(1)).astype(np.float32)
        quantized = np.clip(np.rint(table / scale), -127, 127).astype(np.int8)
        prefix += "_int8row"
        return [numpy_helper.from_array(quantized, f"{prefix}_q"), numpy_helper.from_array(scale, f"{prefix}_scale")], [
            helper.make_node("Gather", [f"{prefix}_q", ids], [f"{prefix}_rows_q"], name=f"{prefix}_gather_q"),
            helper.make_node(
                "Gather", [f"{prefix}_scale", ids], [f"{prefix}_rows_scale"], name=f"{prefix}_gather_scale"
            ),
            helper.make_node(
                "Cast", [f"{prefix}_rows_q"], [f"{prefix}_rows_f"], to=onnx.TensorProto.FLOAT, name=f"{prefix}_cast"
            ),
            helper.make_node("Mul", [f"{prefix}_rows_f", f"{prefix}_rows_scale"], [output], name=f"{prefix}_mul"),
        ]

    replace_embedding_gathers(model, gathers, rowwise)


def store_embeddings_fp16(model: onnx.ModelProto, gathers: list[str]) -> None:
    """Store each embedding table fp16, in place: Gather(table, ids) becomes
    Gather(table_fp16, ids) -> Cast(float). The looked-up row is the fp32 row rounded to nearest
    fp16 (relative error <= 2^-11 for normal values; an |x| below fp16's 6.1e-5 normal range keeps
    an absolute error <= 3e-8); half the bytes of an fp32 table, no scale to store."""

    def half(prefix: str, table: np.ndarray, ids: str, output: str):
        peak = float(np.abs(table).max())
        if not peak <= np.finfo(np.float16).max:
            raise UserError(
                f"embedding {prefix} holds |x| = {peak:.3g}, beyond float16's range (65504)",
                "use a recipe that keeps the tables fp32 (int8-emb32) or int8 per row (int8-emb8)",
            )
        prefix += "_fp16"
        return [numpy_helper.from_array(table.astype(np.float16), f"{prefix}_table")], [
            helper.make_node("Gather", [f"{prefix}_table", ids], [f"{prefix}_rows"], name=f"{prefix}_gather"),
            helper.make_node("Cast", [f"{prefix}_rows"], [output], to=onnx.TensorProto.FLOAT, name=f"{prefix}_cast"),
        ]

    replace_embedding_gathers(model, gathers, half)


def replace_embedding_gathers(model: onnx.ModelProto, gathers: list[str], rewrite) -> None:
    """Replace each named Gather(table, ids) -> output, in place, by the nodes and initializers
    `rewrite(node name, fp32 table, ids, output)` returns; the fp32 table is removed."""
    initializers = {init.name: init for init in model.graph.initializer}
    nodes = {node.name: node for node in model.graph.node}
    for name in gathers:
        node = nodes[name]
        tables, replacement = rewrite(
            name, numpy_helper.to_array(initializers[node.input[0]]), node.input[1], node.output[0]
        )
        model.graph.initializer.remove(initializers[node.input[0]])
        model.graph.initializer.extend(tables)
        position = list(model.graph.node).index(node)
        model.graph.node.remove(node)
        for offset, new in enumerate(replacement):
            model.graph.node.insert(position + offset, new)


def drop_mask_work(model: onnx.ModelProto) -> int:
    """Remove each layer's mask work, valid for calls whose attention mask is all True; in place.

    The faithful graph (SDPA with a bool mask, as the dynamo exporter lowers it) does per layer:
    Where(mask, 0, -inf) -> Add to the scaled scores -> Softmax -> IsNaN/Where (rows with no
    allowed key give 0, not NaN). With every mask entry True the Add adds +0.0 (x + 0 == x for
    every finite x) and Softmax gives no NaN, so Softmax(scores) alone is bit-identical. run_split
    (omnivoice_onnx.sessions) runs cond and uncond rows at their own lengths, so every call it
    makes has an all-True mask. The input `attention_mask` stays (same contract), and one check
    per call replaces the per-layer work: a row whose mask holds any False gets NaN logits, so a
    padded call on this graph is loud, never silently wrong. Returns the number of layers changed.
    """
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    drop, changed = [], 0
    for softmax in [node for node in graph.node if node.op_type == "Softmax"]:
        add = producers.get(softmax.input[0])
        if add is None or add.op_type != "Add":
            continue
        masks = [
            name
            for name in add.input
            if name in producers and producers[name].op_type == "Where" and producers[name].input[0] == "attention_mask"
        ]
        guard_isnan = [n for n in consumers.get(softmax.output[0], []) if n.op_type == "IsNaN"]
        if len(masks) != 1 or len(guard_isnan) != 1:
            continue
        guard = [n for n in consumers.get(guard_isnan[0].output[0], []) if n.op_type == "Where"]
        if len(guard) != 1:
            continue
        scores = next(name for name in add.input if name != masks[0])
        softmax.input[0] = scores
        for node in consumers.get(guard[0].output[0], []):
            node.input[:] = [softmax.output[0] if name == guard[0].output[0] else name for name in node.input]
        drop += [add, guard_isnan[0], guard[0]]
        changed += 1
    if changed == 0:
        raise UserError(
            "found no masked attention (Where(attention_mask) -> Add -> Softmax -> IsNaN/Where) in the "
            "transformer graph",
            "quantize the fp32 export made by export_omnivoice.py (step 2)",
        )
    dropped = {id(node) for node in drop}
    kept = [node for node in graph.node if id(node) not in dropped]
    used = {name for node in kept for name in node.input}
    kept = [
        node
        for node in kept
        if not (node.op_type == "Where" and node.input[0] == "attention_mask" and node.output[0] not in used)
    ]
    del graph.node[:]
    graph.node.extend(kept)
    guard_output(model)
    return changed


def guard_output(model: onnx.ModelProto) -> None:
    """logits = Where(row's mask has a False, NaN, logits): the unmasked graph's one check per call."""
    graph = model.graph
    output = graph.output[0].name
    raw = f"{output}_unguarded"
    for node in graph.node:
        node.output[:] = [raw if name == output else name for name in node.output]
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([1, 2, 3], dtype=np.int64), "mask_guard_axes"),
            numpy_helper.from_array(np.array(np.nan, dtype=np.float32), "mask_guard_nan"),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Not", ["attention_mask"], ["mask_guard_not"], name="mask_guard_not"),
            helper.make_node(
                "Cast", ["mask_guard_not"], ["mask_guard_f"], to=onnx.TensorProto.FLOAT, name="mask_guard_cast"
            ),
            helper.make_node(
                "ReduceMax",
                ["mask_guard_f", "mask_guard_axes"],
                ["mask_guard_any_f"],
                keepdims=1,
                name="mask_guard_any",
            ),
            helper.make_node(
                "Cast", ["mask_guard_any_f"], ["mask_guard_bad"], to=onnx.TensorProto.BOOL, name="mask_guard_bool"
            ),
            helper.make_node("Where", ["mask_guard_bad", "mask_guard_nan", raw], [output], name="mask_guard_where"),
        ]
    )


def quantized_node_counts(model: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each quantized op type the variant holds (for the report)."""
    kinds = (
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeLinear",
        "MatMulNBits",
        "MatMul",
        "Gather",
        "Softmax",
        "IsNaN",
        "Cast",
        "Attention",
        "RotaryEmbedding",
    )
    counts = {kind: 0 for kind in kinds}
    for node in model.graph.node:
        if node.op_type in counts:
            counts[node.op_type] += 1
    return {kind: count for kind, count in counts.items() if count}


def build_variant(
    onnx_dir: Path, recipe: Recipe, fp32_metadata: dict[str, str], capture_dir: Path | None = None
) -> dict[str, Any]:
    """Write `onnx/<recipe.name>/` from the fp32 transformer (and codec graphs, for a recipe with
    `codecs`); return its report entry.

    Everything is written into a hidden staging directory first; the finished files are renamed
    into the variant directory (old .onnx removed first, then the new sidecars, then the new .onnx),
    so an interruption leaves a variant complete (old or new) or absent, never mixed. `seconds`
    is the whole build, install and hashing included: the time the user waits for the variant.

    `capture_dir` (a recipe that calibrates): the capture whose calls calibrate it, of the export's model.

    Runs building into one onnx/ at once build in their own staging directories; installing,
    hashing the installed files and merging the entry into the report happen under the report's
    lock (report.report_lock), so the entry always describes the files in place and no run's
    entry is lost.
    """
    started = time.perf_counter()
    onnx_dir = Path(onnx_dir)
    source = onnx_dir / TRANSFORMER_FILE
    heads_width = int(fp32_metadata["num_codebooks"]) * int(fp32_metadata["audio_vocab_size"])
    heads, embeddings = weight_nodes(onnx.load(str(source), load_external_data=False), heads_width)
    exclude = (heads if recipe.keep_heads_fp32 else []) + (embeddings if recipe.embeddings != "dynamic" else [])
    kept: dict[str, list[str]] = {}
    calibration: dict[str, Any] = {}
    with temporary_dir(variant_dir(onnx_dir, recipe.name)) as staging:
        with PeakRss() as peak:
            if recipe.method == "rowwise" or (recipe.method == "dynamic" and recipe.fusions):
                calls = calibration_calls(capture_dir, fp32_metadata) if recipe.spikes_fp32 or recipe.calibrate else []
                model, calibration = quantize_prepared(prepared_graph(source, recipe), recipe, exclude, calls, staging)
            elif recipe.method == "dynamic":
                model = quantize_dynamic_variant(source, staging, recipe, exclude)
            elif recipe.method == "unmasked":
                model = onnx.load(str(source))
                drop_mask_work(model)
                fusion.apply_fusions(model, recipe.fusions)
            elif recipe.method == "fp16":
                model = onnx.load(str(source))
                model, kept = fp16.convert_transformer(model, heads[0], recipe.keep_fp32)
            else:
                model = quantize_nbits_variant(source, recipe, exclude)
            if recipe.embeddings == "int8-row":
                quantize_embeddings_rowwise(model, embeddings)
            elif recipe.embeddings == "fp16" and recipe.method != "fp16":  # fp16's Gathers are float16 already
                store_embeddings_fp16(model, embeddings)
            set_variant_metadata(model, fp32_metadata, recipe, source)
            counts = quantized_node_counts(model)
            save_with_sidecar(model, staging / TRANSFORMER_FILE)
            del model
            for graph in recipe.codecs:
                convert_codec(onnx_dir, graph, recipe, staging)
        with report.report_lock(onnx_dir):
            install_variant(staging, variant_dir(onnx_dir, recipe.name), recipe_files(recipe))
            files = variant_files(onnx_dir, recipe)
            fp32_bytes = sum(
                (onnx_dir / name).stat().st_size for name in (TRANSFORMER_FILE, TRANSFORMER_FILE + ".data")
            )
            size = sum(files[name]["bytes"] for name in (TRANSFORMER_FILE, TRANSFORMER_FILE + ".data"))
            entry = {
                "recipe": recipe.as_dict(),
                "dir": recipe.name,
                "file": TRANSFORMER_FILE,
                "files": files,
                "bytes": size,
                "fp32_bytes": fp32_bytes,
                "size_ratio": round(size / fp32_bytes, 4),
                "excluded_nodes": exclude if recipe.method != "fp16" else [],
                "node_counts": counts,
                "seconds": round(time.perf_counter() - started, 2),
                "peak_rss_mb": round(peak.peak_mb, 1),
            }
            if recipe.method == "fp16":
                entry["fp32_nodes"] = kept
            if calibration:
                entry["calibration"] = calibration
            report.merge_section(onnx_dir, ("variants", recipe.name), entry)
    return entry


# Captured calls per mode that calibrate a recipe that measures (calibrate, spikes_fp32): evenly spaced over its steps.
CALIBRATION_STEPS = 4


def calibration_calls(capture_dir: Path | None, metadata: dict[str, str]) -> list[dict[str, np.ndarray]]:
    """Feeds of the transformer calls generate() makes (run_split's groups) at CALIBRATION_STEPS
    captured steps of each mode; the capture must be of the export's model."""
    from omnivoice_export import capture
    from omnivoice_onnx.sessions import split_feeds

    fix = "pass --capture-dir of the capture the export was made from (step 1)"
    if capture_dir is None:
        raise UserError("this recipe is calibrated on captured calls, and no capture was given", fix)
    manifest = capture.load_manifest(capture_dir, verify_hashes=False)
    if manifest["model"]["fingerprint"] != metadata["model_fingerprint"]:
        raise UserError(
            f"the capture {capture_dir} is of model {manifest['model']['fingerprint']}, the export of "
            f"{metadata['model_fingerprint']}",
            fix,
        )
    calls = []
    for mode in manifest["modes"]:
        steps = capture.mode_steps(manifest, mode)
        for step in steps[:: max(1, -(-len(steps) // CALIBRATION_STEPS))]:
            data = capture.load_step(capture_dir, mode, step)
            groups = split_feeds(data["input_ids"], data["audio_mask"], data["attention_mask"])
            calls += [feeds for _rows, feeds in groups or []]
    return calls


def set_variant_metadata(model: onnx.ModelProto, metadata: dict[str, str], recipe: Recipe, source: Path) -> None:
    """A variant graph's metadata: its fp32 source's, plus the variant, its recipe and the source's sha256."""
    del model.metadata_props[:]
    graph = metadata.get("graph", "transformer")
    for key, value in {
        **metadata,
        "variant": recipe.name,
        "recipe": json.dumps(recipe.as_dict()),
        f"fp32_{graph}_sha256": sha256_file(source),
    }.items():
        model.metadata_props.add(key=key, value=value)


def convert_codec(onnx_dir: Path, graph: str, recipe: Recipe, staging: Path) -> None:
    """The export's codec `graph` as float16 with fp16.CODEC_KEEP_OPS float32 (the fp16 recipe),
    saved into `staging` with its metadata plus the variant's."""
    source = Path(onnx_dir) / GRAPH_FILES[graph]
    model = onnx.load(str(source))
    metadata = {prop.key: prop.value for prop in model.metadata_props}
    model = fp16.convert_by_op(model, fp16.CODEC_KEEP_OPS)
    set_variant_metadata(model, metadata, recipe, source)
    save_with_sidecar(model, staging / GRAPH_FILES[graph])


def recipe_files(recipe: Recipe) -> list[str]:
    """The graph files a variant of `recipe` holds: its transformer, then its own codec graphs."""
    return [TRANSFORMER_FILE, *(GRAPH_FILES[graph] for graph in recipe.codecs)]


def install_variant(staging: Path, target: Path, graphs: list[str]) -> None:
    """Rename the finished graphs and sidecars from `staging` into `target`."""
    target.mkdir(parents=True, exist_ok=True)
    umask_mode(*(staging / name for graph in graphs for name in (graph, graph + ".data")))
    for graph in graphs:
        (target / graph).unlink(missing_ok=True)
    for graph in graphs:
        os.replace(staging / (graph + ".data"), target / (graph + ".data"))
    for graph in graphs:
        os.replace(staging / graph, target / graph)


def variant_files(onnx_dir: Path, recipe: Recipe) -> dict[str, dict[str, Any]]:
    folder = variant_dir(onnx_dir, recipe.name)
    return {file: file_entry(folder / file) for graph in recipe_files(recipe) for file in (graph, graph + ".data")}


def verify_variant(onnx_dir: Path, export: dict[str, Any], name: str) -> Path:
    """The variant's transformer path, once its files match the report's entry (sha256) and its
    metadata names the variant and the export's model; 'fp32' is the export's own graph."""
    if name == "fp32":
        report.verify_graphs(onnx_dir, export, ["transformer"])
        return variant_path(onnx_dir, name)
    entry = export.get("variants", {}).get(name)
    fix = f"run quantize_omnivoice.py --variants {name}"
    if entry is None:
        known = ", ".join(export.get("variants", {})) or "none"
        raise UserError(f"the export report has no variant {name!r} (made so far: {known})", fix)
    folder = variant_dir(onnx_dir, name)
    for file in entry["files"]:
        if not (folder / file).is_file():
            raise UserError(f"{folder / file} is missing", fix)
    changed = first_mismatch((folder / file, info) for file, info in entry["files"].items())
    if changed is not None:
        raise UserError(f"{changed} does not match the export report's sha256 (modified or from another export)", fix)
    meta = read_graph_metadata(folder / TRANSFORMER_FILE)
    if meta.get("variant") != name or meta.get("model_fingerprint") != export["model"]["fingerprint"]:
        raise UserError(
            f"{folder / TRANSFORMER_FILE} is variant {meta.get('variant')} of model "
            f"{meta.get('model_fingerprint')}, not {name} of {export['model']['fingerprint']}",
            fix,
        )
    return folder / TRANSFORMER_FILE


def check_variant_outputs(onnx_dir: Path, names: list[str]) -> None:
    """Before any build: every variant folder can be written (absent or a directory) and onnx/
    accepts new files; a run must not fail at install after minutes of quantizing."""
    for name in names:
        folder = variant_dir(onnx_dir, name)
        if os.path.lexists(folder) and not folder.is_dir():
            raise UserError(
                f"{folder} exists and is not a directory: variant {name} is written into that folder",
                "move or remove it, then re-run",
            )
    check_output(Path(onnx_dir), "--model-dir", "dir")


def quantize_variants(
    onnx_dir: Path, names: list[str], log=print, capture_dir: Path | None = None
) -> dict[str, dict[str, Any]]:
    """Build each named variant from the verified fp32 export; merge each entry into the report
    as soon as it is written (an interrupted run keeps the entries of the finished variants).
    `capture_dir` calibrates the recipes that measure (default: the capture the export was made from)."""
    export = report.load_report(onnx_dir)
    report.verify_graphs(onnx_dir, export, ["transformer"])
    check_variant_outputs(onnx_dir, names)
    metadata = read_graph_metadata(Path(onnx_dir) / TRANSFORMER_FILE)
    entries = {}
    for index, name in enumerate(names, 1):
        recipe = RECIPES[name]
        log(f"[quantize] {index}/{len(names)} {name}: {recipe.summary} ...")
        entry = build_variant(onnx_dir, recipe, metadata, capture_dir or Path(export["capture"]["dir"]))
        entries[name] = entry
        log(
            f"[quantize] {name}: {entry['bytes'] / 2**20:.1f} MB ({entry['size_ratio']:.1%} of fp32) in "
            f"{entry['seconds']:.1f} s, peak RSS {entry['peak_rss_mb']:.0f} MB; nodes {entry['node_counts']}"
        )
    return entries
