"""PyTorch -> ONNX for the three graphs: exporters, one sidecar, metadata, self-checks.

Names, dtypes and axes of every input and output come from the contract table
(omnivoice_onnx.contract), the self-checks' tolerances from its threshold table.

Traps this module exists to avoid (see docs/omnivoice_onnx_investigation.md):
- attention stays `sdpa` with the bool [2B,1,S,S] mask; a graph that drops or replaces the mask
  (a causal GroupQueryAttention kernel, `eager` attention) is a defect, caught by the
  bidirectionality probe.
- example inputs have batch >= 2: a batch-1 example lets the exporter fix the batch to 1.
- the encoder's length axis is 960*frames: encode() pads only when T is not a hop multiple, and
  the exported graph holds only the no-pad branch.
- torchaudio's resample computes its length with a float division that dynamo cannot trace on
  a symbolic length; wrappers.exportable_resample swaps in the integer form (bit-identical).
- exporters write weights where they like (dynamo: one `.data`; legacy: ~200 loose files); every
  graph is re-saved with all weights in one `<graph>.onnx.data` sidecar.
"""

from __future__ import annotations

import json
import os
import shutil
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from omnivoice_export import wrappers
from omnivoice_export.capture import read_rows
from omnivoice_export.cli import disk_full_error
from omnivoice_export.files import umask_mode
from omnivoice_export.measure import PeakRss
from omnivoice_export.report import ExportResult
from omnivoice_onnx.contract import (CONTRACTS, FRAME_RATE, GRAPH_FILES, HOP_LENGTH, LEGACY_AXIS_NAMES, SAMPLE_RATE,
                                     SAMPLES_AXIS, THRESHOLDS)

DEFAULT_OPSET = 18


def dynamic_shapes(graph: str) -> dict[str, dict[int, Any]]:
    """torch.export dynamic shapes per graph input (dynamo exporter), from the contract's axes."""
    from torch.export import Dim

    frames = Dim("frames", min=2, max=100_000)
    dims = {"batch": Dim("batch", min=1, max=1024), "seq": Dim("seq", min=2, max=40960), "frames": frames,
            # HOP_LENGTH * frames: the graph is valid only for hop-multiple lengths (see module docstring).
            SAMPLES_AXIS: HOP_LENGTH * frames}
    return {t.name: {i: dims[axis] for i, axis in enumerate(t.axes) if isinstance(axis, str)}
            for t in CONTRACTS[graph].inputs}


def dynamic_axes(graph: str) -> dict[str, dict[int, str]]:
    """The legacy exporter's dynamic axes (it cannot state the 960*frames relation: a free name)."""
    contract = CONTRACTS[graph]
    return {t.name: {i: LEGACY_AXIS_NAMES.get(axis, axis) for i, axis in enumerate(t.axes) if isinstance(axis, str)}
            for t in contract.inputs + contract.outputs}


def run_exporter(module: torch.nn.Module, graph: str, inputs: tuple[torch.Tensor, ...], out_path: Path,
                 dynamo: bool, opset: int) -> None:
    """One torch.onnx.export call writing `out_path` (and whatever external data it chooses)."""
    names = {"input_names": list(CONTRACTS[graph].input_names), "output_names": list(CONTRACTS[graph].output_names)}
    with torch.no_grad(), wrappers.exportable_resample():
        if dynamo:
            torch.onnx.export(module, inputs, str(out_path), dynamo=True, opset_version=opset, **names,
                              dynamic_shapes=dynamic_shapes(graph), external_data=True, optimize=True)
        else:
            torch.onnx.export(module, inputs, str(out_path), dynamo=False, opset_version=opset, **names,
                              dynamic_axes=dynamic_axes(graph), do_constant_folding=True)


def consolidate_external_data(src: Path, dst: Path) -> list[str]:
    """Re-save graph `src` as `dst` + one `dst.name + '.data'` sidecar; return the original
    external-data locations (what the exporter had scattered), for the report."""
    model = onnx.load(str(src), load_external_data=False)
    original = sorted({entry.value for init in model.graph.initializer
                       if init.data_location == onnx.TensorProto.EXTERNAL
                       for entry in init.external_data if entry.key == "location"})
    onnx.load_external_data_for_model(model, str(src.parent))
    save_with_sidecar(model, dst)
    return original


def save_with_sidecar(model: onnx.ModelProto, dst: Path) -> None:
    """Save `model` as `dst` with every tensor over 1 KB in the one sidecar `dst.name + '.data'`."""
    onnx.save_model(model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=dst.name + ".data", size_threshold=1024)


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


def graph_metadata(graph: str, config: dict[str, Any], fingerprint: str, exporter: str, opset: int,
                   versions: dict[str, str]) -> dict[str, str]:
    """Constants a runtime needs, carried inside each graph (sherpa-onnx add_meta_data style)."""
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig
    import dataclasses

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
    }


def signature(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Input/output names, dtypes and shapes (symbolic dims by name) of a saved graph."""
    model = onnx.load(str(path), load_external_data=False)

    def describe(values) -> list[dict[str, Any]]:
        out = []
        for value in values:
            tensor = value.type.tensor_type
            dims = [d.dim_param if d.dim_param else d.dim_value for d in tensor.shape.dim]
            out.append({"name": value.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name,
                        "shape": dims})
        return out
    return {"inputs": describe(model.graph.input), "outputs": describe(model.graph.output)}


def check_graph(path: Path) -> str:
    """onnx.checker on the saved path (path-based: the transformer exceeds protobuf's 2 GB)."""
    try:
        onnx.checker.check_model(str(path), full_check=False)
    except onnx.checker.ValidationError as exc:
        return f"failed: {str(exc).splitlines()[0]}"
    return "ok"


def export_graph(module: torch.nn.Module, graph: str, inputs: tuple[torch.Tensor, ...], staging: Path,
                 dynamo: bool, opset: int, log=print) -> ExportResult:
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
                if exporter == "legacy" or disk_full_error(exc) is not None:  # legacy would fill the disk too
                    raise
                result.fallback_reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:500]}"
                log(f"  [{graph}] dynamo export failed ({result.fallback_reason}); falling back to legacy")
                log("".join(traceback.format_exception_only(type(exc), exc)).strip()[:2000])
                continue
            result.exporter = exporter
            break
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


def bidirectionality_probe(session, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
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
    return {"passed": bool(delta > THRESHOLDS["self_check_probe_min_change"]), "max_abs_change_before_last": delta,
            "position": last}


def self_check_transformer(session, module, examples: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """ORT vs torch on the read rows at shapes other than the export's, plus the probe."""
    from omnivoice_onnx.sessions import run

    shapes = []
    worst = 0.0
    for feeds in examples:
        with torch.no_grad():
            expected = module(*(torch.from_numpy(feeds[k]) for k in CONTRACTS["transformer"].input_names)).numpy()
        got = run(session, feeds)["logits"]
        delta = _max_abs(read_rows(got, feeds["attention_mask"]), read_rows(expected, feeds["attention_mask"]))
        worst = max(worst, delta)
        shapes.append({"shape": list(feeds["input_ids"].shape), "max_abs": delta})
    probe = bidirectionality_probe(session, examples[0])
    within = worst <= THRESHOLDS["transformer_max_abs"]
    return {"dynamic_shapes": shapes, "dynamic_passed": within, "bidirectional_probe": probe,
            "passed": within and probe["passed"]}


def self_check_codec(session, module, graph: str, examples: list[np.ndarray]) -> dict[str, Any]:
    """Encoder: exact codes; decoder: max |d| within tolerance; at shapes other than the export's."""
    from omnivoice_onnx.sessions import run

    (input_name,), (output_name,) = CONTRACTS[graph].input_names, CONTRACTS[graph].output_names
    shapes, passed = [], True
    for array in examples:
        with torch.no_grad(), wrappers.exportable_resample():
            expected = module(torch.from_numpy(array)).numpy()
        got = run(session, {input_name: array})[output_name]
        if graph == "encoder":
            metric = {"code_match": float(np.mean(got == expected)) if got.shape == expected.shape else 0.0}
            ok = got.shape == expected.shape and metric["code_match"] >= THRESHOLDS["encoder_code_match_min"]
        else:
            metric = {"max_abs": _max_abs(got, expected) if got.shape == expected.shape else float("inf")}
            ok = metric["max_abs"] <= THRESHOLDS["self_check_decoder_max_abs"]
        passed &= ok
        shapes.append({"shape": list(array.shape), **metric, "passed": ok})
    return {"dynamic_shapes": shapes, "passed": passed}
