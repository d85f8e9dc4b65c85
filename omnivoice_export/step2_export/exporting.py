"""PyTorch -> ONNX for the three graphs: exporters, one sidecar, metadata, self-checks.

Names, dtypes and axes of every input and output come from the contract table
(omnivoice_onnx.contract), the self-checks' tolerances from its threshold table.

Traps this module exists to avoid (see lab/investigation.md):
- attention stays `sdpa` with the bool [2B,1,S,S] mask; a graph that drops or replaces the mask
  is a defect: a causal kernel (GroupQueryAttention) is caught by the bidirectionality probe, a
  graph that ignores the mask (`eager` attention) by the mask probe.
- example inputs have batch >= 2: a batch-1 example lets the exporter fix the batch to 1.
- the encoder's length axis is 960*frames: encode() pads only when T is not a hop multiple, and
  the exported graph holds only the no-pad branch.
- torchaudio's resample computes its length with a float division that dynamo cannot trace on
  a symbolic length; wrappers.exportable_resample swaps in the integer form (bit-identical).
- exporters write weights where they like (dynamo: one `.data`; legacy: ~200 loose files); every
  graph is re-saved with all weights in one `<graph>.onnx.data` sidecar.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from omnivoice_export.common.measure import PeakRss
from omnivoice_export.step1_capture.capture import read_rows
from omnivoice_export.step2_export import wrappers
from omnivoice_export.step2_export.report import ExportResult, save_with_sidecar
from omnivoice_onnx.contract import (
    CONTRACTS,
    FRAME_RATE,
    GRAPH_FILES,
    HOP_LENGTH,
    LEGACY_AXIS_NAMES,
    SAMPLE_RATE,
    SAMPLES_AXIS,
    THRESHOLDS,
)
from omnivoice_onnx.errors import UserError, environment_error
from omnivoice_onnx.files import umask_mode

DEFAULT_OPSET = 18
# The opsets each exporter writes all three graphs at, runnable by onnxruntime (torch 2.13, ORT
# 1.32; investigation log). dynamo builds at its torchlib opset 18 and converts upward;
# converting the transformer downward fails, and torch then logs it and keeps 18, so a requested
# 17 would be recorded over an opset-18 graph. At 23 it emits RotaryEmbedding nodes that ORT
# refuses to run at any shape but the export's. legacy (TorchScript) needs 14 for
# scaled_dot_product_attention and stops at 20. The written opset is checked after every export
# all the same (written_opset).
EXPORTER_OPSETS = {"dynamo": range(18, 23), "legacy": range(14, 21)}
OPSET_MIN = min(r.start for r in EXPORTER_OPSETS.values())
OPSET_MAX = max(r.stop - 1 for r in EXPORTER_OPSETS.values())


def _opsets_text(exporter: str) -> str:
    return f"{EXPORTER_OPSETS[exporter].start}..{EXPORTER_OPSETS[exporter].stop - 1}"


OPSET_FIX = (
    f"use an opset in {_opsets_text('dynamo')} (18, 20 and 22 verified end to end), or --no-dynamo with "
    f"one in {_opsets_text('legacy')}"
)


def check_opset(opset: int, dynamo: bool) -> None:
    """UserError, before any model is loaded, for an opset the chosen exporter cannot write."""
    exporter = "dynamo" if dynamo else "legacy"
    if opset not in EXPORTER_OPSETS[exporter]:
        raise UserError(
            f"--opset {opset}: torch's {exporter} exporter writes these graphs at opsets {_opsets_text(exporter)} only",
            OPSET_FIX,
        )


def written_opset(path: Path) -> int:
    """The default-domain opset a saved graph imports: what onnxruntime runs it at."""
    model = onnx.load(str(path), load_external_data=False)
    version: int = next(entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx"))
    return version


def dynamic_shapes(graph: str) -> dict[str, dict[int, Any]]:
    """torch.export dynamic shapes per graph input (dynamo exporter), from the contract's axes."""
    from torch.export import Dim

    frames = Dim("frames", min=2, max=100_000)
    dims = {
        "batch": Dim("batch", min=1, max=1024),
        "seq": Dim("seq", min=2, max=40960),
        "frames": frames,
        # HOP_LENGTH * frames: the graph is valid only for hop-multiple lengths (see module docstring).
        SAMPLES_AXIS: HOP_LENGTH * frames,
    }
    return {
        t.name: {i: dims[axis] for i, axis in enumerate(t.axes) if isinstance(axis, str)}
        for t in CONTRACTS[graph].inputs
    }


def dynamic_axes(graph: str) -> dict[str, dict[int, str]]:
    """The legacy exporter's dynamic axes (it cannot state the 960*frames relation: a free name)."""
    contract = CONTRACTS[graph]
    return {
        t.name: {i: LEGACY_AXIS_NAMES.get(axis, axis) for i, axis in enumerate(t.axes) if isinstance(axis, str)}
        for t in contract.inputs + contract.outputs
    }


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence, for one export, the exporters' messages that say nothing about this export; each
    was traced to its source and is harmless here. Every other warning still shows.

    - torch's registry logs "torchvision is not installed. Skipping torchvision::nms" (and three
      more ops) per dynamo export: torchvision's detection ops, which no OmniVoice graph uses.
    - FutureWarning "`isinstance(treespec, LeafSpec)` is deprecated": torch's own pytree code
      calling its deprecated API while dynamo flattens the inputs; nothing this code can change.
    - UserWarning "The axis name: batch will not be used, since it shares the same shape
      constraints with another axis": every input shares one Dim per contract axis, as intended;
      set_metadata names the output axes from the contract afterwards.
    - RuntimeWarning "invalid value encountered in divide" from onnx's reference Div while the
      optimizer folds constants: torchaudio's sinc resampling kernel computes sin(t)/t, 0/0 at
      t = 0, and replaces that entry with 1 by a Where (PyTorch computes the same NaN silently);
      no NaN reaches a graph (checked on all three).
    - legacy exporter: TracerWarnings that the trace records Python control flow once (the
      encoder's pad-or-not branch, `if padding > 0`, the 8-codebook loop, sdpa's `q_length == 1`):
      which branch a graph holds is what the self-checks at shapes the export never saw and parity
      check, and the encoder's is stated in the contract (960*frames); and "Constant folding - Only
      steps=1 can be constant folded": a Slice left unfolded, computed at run time instead.
    """
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
            warnings.filterwarnings(
                "ignore",
                r"# The axis name: .* will not be used, since it shares the same shape "
                r"constraints with another axis",
                UserWarning,
            )
            warnings.filterwarnings(
                "ignore", "invalid value encountered in divide", RuntimeWarning, r"onnx\.reference\.ops\.op_div"
            )
            # torch.jit imports TracerWarning from torch.jit._trace without listing it in __all__
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)  # type: ignore[attr-defined]
            warnings.filterwarnings("ignore", "Constant folding - Only steps=1 can be constant folded", UserWarning)
            yield
    finally:
        registry.setLevel(level)


def run_exporter(
    module: torch.nn.Module, graph: str, inputs: tuple[torch.Tensor, ...], out_path: Path, dynamo: bool, opset: int
) -> None:
    """One torch.onnx.export call writing `out_path` (and whatever external data it chooses)."""
    input_names, output_names = list(CONTRACTS[graph].input_names), list(CONTRACTS[graph].output_names)
    with torch.no_grad(), wrappers.exportable_resample(), quiet_exporter():
        if dynamo:
            torch.onnx.export(
                module,
                inputs,
                str(out_path),
                dynamo=True,
                opset_version=opset,
                input_names=input_names,
                output_names=output_names,
                dynamic_shapes=dynamic_shapes(graph),
                external_data=True,
                optimize=True,
            )
        else:
            torch.onnx.export(
                module,
                inputs,
                str(out_path),
                dynamo=False,
                opset_version=opset,
                input_names=input_names,
                output_names=output_names,
                dynamic_axes=dynamic_axes(graph),
                do_constant_folding=True,
            )


def consolidate_external_data(src: Path, dst: Path) -> list[str]:
    """Re-save graph `src` as `dst` + one `dst.name + '.data'` sidecar; return the original
    external-data locations (what the exporter had scattered), for the report."""
    model = onnx.load(str(src), load_external_data=False)
    original = sorted(
        {
            entry.value
            for init in model.graph.initializer
            if init.data_location == onnx.TensorProto.EXTERNAL
            for entry in init.external_data
            if entry.key == "location"
        }
    )
    onnx.load_external_data_for_model(model, str(src.parent))
    save_with_sidecar(model, dst)
    return original


def set_metadata(path: Path, graph: str, metadata: dict[str, str]) -> None:
    """Write `metadata_props` and the contract's output axis names into the graph (weights untouched).

    dynamo names derived output dims like "s76"; the contract's names make them readable.
    """
    model = onnx.load(str(path), load_external_data=False)
    for dim, name in zip(model.graph.output[0].type.tensor_type.shape.dim, CONTRACTS[graph].outputs[0].axes):
        if isinstance(name, str) and dim.HasField("dim_param"):
            dim.dim_param = name
    del model.metadata_props[:]
    for key, value in metadata.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save_model(model, str(path))


def graph_metadata(
    graph: str,
    config: dict[str, Any],
    fingerprint: str,
    exporter: str,
    opset: int,
    versions: dict[str, str],
    provenance: dict[str, Any],
) -> dict[str, str]:
    """Constants a runtime needs, carried inside each graph (sherpa-onnx add_meta_data style), and
    the licence and source of the weights (omnivoice_export.step2_export.model_card.provenance): a graph copied
    out of its bundle still says what terms it carries."""
    import dataclasses

    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    return {
        "graph": graph,
        "io_contract": CONTRACTS[graph].summary,
        "model_fingerprint": fingerprint,
        "sample_rate": str(SAMPLE_RATE),
        "hop_length": str(HOP_LENGTH),
        "frame_rate": str(FRAME_RATE),
        "num_codebooks": str(config["num_audio_codebook"]),
        "audio_vocab_size": str(config["audio_vocab_size"]),
        "audio_mask_id": str(config["audio_mask_id"]),
        "codebook_weights": json.dumps(config["audio_codebook_weights"]),
        "attention": "bidirectional; bool mask [2B,1,S,S], True = may attend",
        "generation_defaults": json.dumps(dataclasses.asdict(OmniVoiceGenerationConfig())),
        "exporter": exporter,
        "opset": str(opset),
        "versions": json.dumps(versions),
        "license": provenance["license"],
        "source": provenance["source"],
    }


def signature(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Input/output names, dtypes and shapes (symbolic dims by name) of a saved graph."""
    model = onnx.load(str(path), load_external_data=False)

    def describe(values: Iterable[onnx.ValueInfoProto]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for value in values:
            tensor = value.type.tensor_type
            dims = [d.dim_param if d.dim_param else d.dim_value for d in tensor.shape.dim]
            out.append(
                {
                    "name": value.name,
                    "dtype": onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name,
                    "shape": dims,
                }
            )
        return out

    return {"inputs": describe(model.graph.input), "outputs": describe(model.graph.output)}


def check_graph(path: Path) -> str:
    """onnx.checker on the saved path (path-based: the transformer exceeds protobuf's 2 GB)."""
    try:
        onnx.checker.check_model(str(path), full_check=False)
    except onnx.checker.ValidationError as exc:
        return f"failed: {str(exc).splitlines()[0]}"
    return "ok"


def export_graph(
    module: torch.nn.Module,
    graph: str,
    inputs: tuple[torch.Tensor, ...],
    staging: Path,
    dynamo: bool,
    opset: int,
    log: Callable[[str], object] = print,
) -> ExportResult:
    """Export one graph into `staging/<graph file>` + its single sidecar, dynamo first.

    A dynamo failure falls back to the legacy exporter for this graph, with the reason logged
    and recorded; --no-dynamo goes straight to legacy.
    """
    result = ExportResult(graph=graph, opset=opset)
    raw_dir = staging / f"raw-{graph}"
    final = staging / GRAPH_FILES[graph]
    with PeakRss() as peak:
        attempts = ["dynamo", "legacy"] if dynamo else ["legacy"]
        for exporter in attempts:
            shutil.rmtree(raw_dir, ignore_errors=True)
            raw_dir.mkdir(parents=True)
            try:
                run_exporter(module, graph, inputs, raw_dir / "model.onnx", exporter == "dynamo", opset)
            except Exception as exc:  # the exporters raise many types; the reason goes in the report
                if exporter == "legacy" or environment_error(exc) is not None:  # legacy would fail alike
                    raise
                result.fallback_reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:500]}"
                log(f"  [{graph}] dynamo export failed ({result.fallback_reason}); falling back to legacy")
                log("".join(traceback.format_exception_only(type(exc), exc)).strip()[:2000])
                continue
            result.exporter = exporter
            break
        written = written_opset(raw_dir / "model.onnx")
        if written != opset:  # the report and metadata must never name an opset the graph is not at
            raise UserError(
                f"--opset {opset}: torch's {result.exporter} exporter could not convert the {graph} graph "
                f"to opset {opset} (it wrote opset {written})",
                OPSET_FIX,
            )
        result.original_external_files = consolidate_external_data(raw_dir / "model.onnx", final)
        shutil.rmtree(raw_dir)
    result.seconds, result.peak_rss_mb = round(peak.seconds, 2), round(peak.peak_mb, 1)
    return result


def install_graphs(staging: Path, onnx_dir: Path, graphs: list[str]) -> None:
    """Move finished graphs from staging into onnx_dir.

    Per graph the old `.onnx` is removed first, then the new sidecar and the new `.onnx` are
    renamed in: an interruption leaves a graph either complete (old or new) or absent, never a
    new graph over an old sidecar that the export report's sha256 would not match.
    """
    onnx_dir.mkdir(parents=True, exist_ok=True)
    for graph in graphs:
        name = GRAPH_FILES[graph]
        umask_mode(staging / name, staging / (name + ".data"))
        (onnx_dir / name).unlink(missing_ok=True)
        os.replace(staging / (name + ".data"), onnx_dir / (name + ".data"))
        os.replace(staging / name, onnx_dir / name)


# --- self-checks right after export (ORT, cpu) --------------------------------------------------


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def bidirectionality_probe(session: Any, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """Change only the last allowed position of cond item 0 and check earlier positions' logits move.

    A causal graph (or one that ignores the mask in the causal direction) leaves every earlier
    position unchanged; a bidirectional one cannot.
    """
    from omnivoice_onnx.sessions import run

    c_len = int(inputs["attention_mask"][0, 0, 0].sum())
    changed = {k: v.copy() for k, v in inputs.items()}
    last = c_len - 1
    changed["input_ids"][0, :, last] = (changed["input_ids"][0, :, last] + 1) % 1024
    base = run(session, inputs)["logits"][0, :, :last]
    probe = run(session, changed)["logits"][0, :, :last]
    delta = _max_abs(base, probe)
    minimum = THRESHOLDS["self_check_probe_min_change"]
    passed = bool(delta > minimum)
    return {
        "passed": passed,
        "max_abs_change_before_last": delta,
        "position": last,
        "failure": None
        if passed
        else f"bidirectionality probe: changing position {last} moved the earlier "
        f"logits by {delta:.1e} (a causal graph; at least {minimum:.0e} expected)",
    }


def mask_probe(session: Any, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """Change only the keys a row's queries may not attend to and check their logits stay put.

    The row is the first whose query 0 is denied some key (an uncond row: its padding beyond the
    target frames). Queries allowed exactly what query 0 is allowed never see the changed keys,
    so a graph that honours the mask gives them weight 0 and their logits do not move at all. A
    graph that ignores the mask (`eager` attention adds the bool mask to the scores as 0/1) lets
    them through. The bidirectionality probe cannot see this: it changes an allowed key.
    """
    from omnivoice_onnx.sessions import run

    mask = inputs["attention_mask"][:, 0]
    denied_rows = [r for r in range(mask.shape[0]) if not mask[r, 0].all()]
    if not denied_rows:
        return {"passed": False, "failure": "mask probe: no row of the inputs has a masked key to change"}
    row = denied_rows[0]
    allowed = mask[row, 0]
    queries = np.flatnonzero((mask[row] == allowed).all(-1))  # queries allowed exactly what query 0 is
    changed = {k: v.copy() for k, v in inputs.items()}
    changed["input_ids"][row][:, ~allowed] = (changed["input_ids"][row][:, ~allowed] + 1) % 1024
    base = run(session, inputs)["logits"][row][:, queries]
    probe = run(session, changed)["logits"][row][:, queries]
    delta = _max_abs(base, probe)
    maximum = THRESHOLDS["self_check_mask_probe_max_change"]
    passed = bool(delta <= maximum)
    return {
        "passed": passed,
        "max_abs_change": delta,
        "row": row,
        "queries": int(queries.size),
        "masked_keys": int((~allowed).sum()),
        "failure": None
        if passed
        else f"mask probe: changing {int((~allowed).sum())} masked keys of row {row} "
        f"moved the logits of queries that may not see them by {delta:.1e} "
        f"(the graph ignores the attention mask; at most {maximum:.0e} allowed)",
    }


def self_check_transformer(
    session: Any, module: torch.nn.Module, examples: list[dict[str, np.ndarray]]
) -> dict[str, Any]:
    """ORT vs torch on the read rows at shapes other than the export's, plus both probes."""
    from omnivoice_onnx.sessions import run

    shapes, failures = [], []
    limit = THRESHOLDS["transformer_max_abs"]
    for feeds in examples:
        with torch.no_grad():
            expected = module(*(torch.from_numpy(feeds[k]) for k in CONTRACTS["transformer"].input_names)).numpy()
        got = run(session, feeds)["logits"]
        delta = _max_abs(read_rows(got, feeds["attention_mask"]), read_rows(expected, feeds["attention_mask"]))
        shape = list(feeds["input_ids"].shape)
        shapes.append({"shape": shape, "max_abs": delta, "passed": delta <= limit})
        if delta > limit:
            failures.append(f"at input_ids {shape}: max |logit - torch| {delta:.1e} (at most {limit:.0e})")
    probes = {
        "bidirectional_probe": bidirectionality_probe(session, examples[0]),
        "mask_probe": mask_probe(session, examples[0]),
    }
    failures += [probe["failure"] for probe in probes.values() if probe["failure"]]
    return {
        "dynamic_shapes": shapes,
        "dynamic_passed": all(s["passed"] for s in shapes),
        **probes,
        "failures": failures,
        "passed": not failures,
    }


def self_check_codec(session: Any, module: torch.nn.Module, graph: str, examples: list[np.ndarray]) -> dict[str, Any]:
    """Encoder: exact codes; decoder: max |d| within tolerance; at shapes other than the export's."""
    from omnivoice_onnx.sessions import run

    (input_name,), (output_name,) = CONTRACTS[graph].input_names, CONTRACTS[graph].output_names
    shapes, failures = [], []
    for array in examples:
        with torch.no_grad(), wrappers.exportable_resample():
            expected = module(torch.from_numpy(array)).numpy()
        got = run(session, {input_name: array})[output_name]
        same_shape = got.shape == expected.shape
        if graph == "encoder":
            metric = {"code_match": float(np.mean(got == expected)) if same_shape else 0.0}
            ok = same_shape and metric["code_match"] >= THRESHOLDS["encoder_code_match_min"]
            detail = f"code match {metric['code_match']:.6f}"
        else:
            metric = {"max_abs": _max_abs(got, expected) if same_shape else float("inf")}
            ok = metric["max_abs"] <= THRESHOLDS["self_check_decoder_max_abs"]
            detail = f"max |audio - torch| {metric['max_abs']:.1e}"
        shapes.append({"shape": list(array.shape), **metric, "passed": ok})
        if not ok:
            failures.append(
                f"at {input_name} {list(array.shape)}: "
                + (detail if same_shape else f"output {list(got.shape)}, torch {list(expected.shape)}")
            )
    return {"dynamic_shapes": shapes, "failures": failures, "passed": not failures}
