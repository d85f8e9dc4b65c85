"""Quantized variants of the fp32 transformer graph: the node choice, the graph edits, one-sidecar
saves, the checks a variant passes before anything reads it.

A variant is `onnx/<name>/omnivoice_transformer.onnx` + its one `.onnx.data` sidecar, made from
the fp32 export's transformer by one recipe (recipes.RECIPES, which says why each is what it is).
Codec graphs stay fp32 and loaders take them from onnx/, except where a recipe converts them too
(`codecs`: fp16 does): then the variant directory holds its own higgs_encoder/higgs_decoder graphs
and loaders take those (omnivoice_onnx.contract.variant_path).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import onnx
from onnx import helper, numpy_helper

from omnivoice_export.common.files import first_mismatch
from omnivoice_export.common.measure import PeakRss
from omnivoice_export.step2_export import report
from omnivoice_export.step2_export.report import read_graph_metadata, save_with_sidecar
from omnivoice_export.step56_variants import fp16, fusion, rotation, rowwise, sensitivity, smoothing
from omnivoice_export.step56_variants.recipes import RECIPES, Recipe
from omnivoice_onnx.contract import GRAPH_FILES, variant_dir, variant_path
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import check_output, temporary_dir, umask_mode
from omnivoice_onnx.hashing import file_entry, sha256_file

TRANSFORMER_FILE = GRAPH_FILES["transformer"]
# What replaces one embedding Gather: (its new initializers, its nodes), and the function that makes them
# from (the Gather's name, its fp32 table, its ids input, its output).
GatherReplacement: TypeAlias = tuple[list[onnx.TensorProto], list[onnx.NodeProto]]
GatherRewrite: TypeAlias = Callable[[str, np.ndarray, str, str], GatherReplacement]


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
    log: Callable[[str], object] = lambda _line: None,
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Quantize an fp32 graph already prepared for `recipe` (a "dynamic" or "rowwise" one), keeping
    `exclude` fp32; `calls` (feeds of the graph) calibrate the recipes that measure. Returns the
    quantized model and what it measured (the report entry's `calibration`). Any graph of the same
    building blocks works (tests and bench/bench_int8_judge.py run it on a trained LLaMA-family
    model); `workdir` holds the probe graphs (a graph over 2 GB has to be a file). `log` gets a line
    per calibration stage (minutes at the real dims)."""
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
        log(f"[quantize] {recipe.name}: measuring every quantized MatMul input on {len(calls)} captured calls")
        details["inputs"] = smoothing.smooth(model, exclude, calls, workdir)
        folded = sum(row["alpha"] is not None for row in details["inputs"])  # an alpha: a site, a fold
        log(f"[quantize] {recipe.name}: {len(details['inputs'])} inputs measured, {folded} scales folded")
        details["calls"] = len(calls)
    if recipe.rotate:
        details["rotated"], rotations = rotation.rotate_inputs(model, exclude)
        exclude = exclude + rotations
        log(f"[quantize] {recipe.name}: {len(details['rotated'])} inputs rotated")
    if recipe.select_fp32:
        selection = sensitivity.select_fp32(model, exclude, calls, workdir, log=log)
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
    quantized: onnx.ModelProto = quantizer.model.model  # onnxruntime ships no types
    return quantized


def quantize_embeddings_rowwise(model: onnx.ModelProto, gathers: list[str]) -> None:
    """Store each embedding table int8 with one fp32 scale per row, in place.

    Gather(table, ids) becomes Gather(q, ids) -> Cast(float) -> Mul(Gather(scale, ids)): standard
    ops, so any ONNX runtime (and a hand-written one) reads it. Symmetric per row:
    scale = max|row| / 127 (1 for an all-zero row), q = round-half-even(row / scale) in [-127, 127];
    the looked-up row is q * scale in float32.
    """

    def rowwise(prefix: str, table: np.ndarray, ids: str, output: str) -> GatherReplacement:
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

    def half(prefix: str, table: np.ndarray, ids: str, output: str) -> GatherReplacement:
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


def replace_embedding_gathers(model: onnx.ModelProto, gathers: list[str], rewrite: GatherRewrite) -> None:
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
    index = fusion.GraphIndex(graph)
    producers, consumers = index.producer, index.consumers
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
    onnx_dir: Path,
    recipe: Recipe,
    fp32_metadata: dict[str, str],
    capture_dir: Path | None = None,
    log: Callable[[str], object] = print,
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
                model, calibration = quantize_prepared(
                    prepared_graph(source, recipe), recipe, exclude, calls, staging, log
                )
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
    from omnivoice_export.step1_capture import capture
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
    onnx_dir: Path, names: list[str], log: Callable[[str], object] = print, capture_dir: Path | None = None
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
        entry = build_variant(onnx_dir, recipe, metadata, capture_dir or Path(export["capture"]["dir"]), log)
        entries[name] = entry
        log(
            f"[quantize] {name}: {entry['bytes'] / 2**20:.1f} MB ({entry['size_ratio']:.1%} of fp32) in "
            f"{entry['seconds']:.1f} s, peak RSS {entry['peak_rss_mb']:.0f} MB; nodes {entry['node_counts']}"
        )
    return entries
