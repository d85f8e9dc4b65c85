"""The exported graphs have the contract, files, metadata and report the design states,
with both exporters; the bidirectionality probe can fail; an interrupted export keeps the old one.

The dynamo export is the session pipeline's; the legacy one is exported once here, into its own
directory. Everything is read back from the files themselves, not from what the exporter said.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import CausalTransformerWrapper, Pipeline, read_report

import export_omnivoice
from omnivoice_export.step0_checkpoints.checkpoints import model_fingerprint
from omnivoice_export.step1_capture import capture
from omnivoice_export.step2_export import exporting
from omnivoice_onnx.bundle import MODEL_CARD_FILE, RUNTIME_CONFIG_FILE, TOKENIZER_FILE, card_license
from omnivoice_onnx.contract import CONTRACTS, GRAPH_FILES, GRAPH_NAMES, THRESHOLDS, ort_signature, signature_problems
from omnivoice_onnx.core.prompt import TextTokenizer
from omnivoice_onnx.hashing import sha256_file
from omnivoice_onnx.runtime_config import load_runtime_config
from omnivoice_onnx.sessions import make_session

TRANSFORMER_INPUTS = CONTRACTS["transformer"].input_names

# The design table: (name, dtype, dims) per input and output; str dims are symbolic.
CONTRACT = {
    "transformer": (
        [
            ("input_ids", "int64", ["batch", 8, "seq"]),
            ("audio_mask", "bool", ["batch", "seq"]),
            ("attention_mask", "bool", ["batch", 1, "seq", "seq"]),
        ],
        [("logits", "float32", ["batch", 8, "seq", 1025])],
    ),
    "encoder": (
        [("input_values", "float32", ["batch", 1, "960*frames"])],
        [("audio_codes", "int64", ["batch", 8, "frames"])],
    ),
    "decoder": (
        [("audio_codes", "int64", ["batch", 8, "frames"])],
        [("audio_values", "float32", ["batch", 1, "960*frames"])],
    ),
}
# The legacy exporter cannot state the 960*frames relation; its encoder length is a free symbol.
LEGACY_ENCODER_LENGTH = "samples"
CONSTANTS = {
    "sample_rate": "24000",
    "hop_length": "960",
    "frame_rate": "25",
    "num_codebooks": "8",
    "audio_vocab_size": "1025",
    "audio_mask_id": "1024",
    "opset": str(exporting.DEFAULT_OPSET),
}
pytestmark = pytest.mark.slow  # every test here uses the session pipeline (steps 0-2, ~100 s)
REPORT_NAME = "export-report.json"


@pytest.fixture(params=["dynamo", "legacy"])
def export(request, pipeline: Pipeline) -> tuple[str, Path]:
    """(exporter, onnx dir) for each exporter; the legacy export is only built when asked for."""
    if request.param == "dynamo":
        return "dynamo", pipeline.onnx
    return "legacy", request.getfixturevalue("legacy_export").onnx


def _load(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path), load_external_data=False)


def _describe(values) -> list[tuple[str, str, list]]:
    return [
        (
            v.name,
            onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name,
            [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
        )
        for v in values
    ]


@pytest.mark.parametrize("graph", GRAPH_NAMES)
def test_signature(export: tuple[str, Path], graph: str) -> None:
    """Names, dtypes and symbolic dims as the design table says (ORT feeds by these names; a fixed
    dim would be an exporter specialising a dynamic one), and the report records the same."""
    exporter, onnx_dir = export
    inputs, outputs = CONTRACT[graph]
    if exporter == "legacy" and graph == "encoder":
        inputs = [("input_values", "float32", ["batch", 1, LEGACY_ENCODER_LENGTH])]
    model = _load(onnx_dir / GRAPH_FILES[graph])
    assert _describe(model.graph.input) == inputs
    assert _describe(model.graph.output) == outputs
    recorded = read_report(onnx_dir)["graphs"][graph]["signature"]
    assert [(v["name"], v["dtype"], v["shape"]) for v in recorded["inputs"]] == inputs
    assert [(v["name"], v["dtype"], v["shape"]) for v in recorded["outputs"]] == outputs


@pytest.mark.parametrize("graph", GRAPH_NAMES)
def test_session_meets_the_contract(export: tuple[str, Path], graph: str) -> None:
    """What parity_check.py checks first: the signature onnxruntime sees has no contract problem
    (the legacy exporter's free name for the encoder's length included)."""
    _, onnx_dir = export
    assert signature_problems(graph, *ort_signature(make_session(onnx_dir / GRAPH_FILES[graph]))) == []


def test_one_sidecar_per_graph_and_no_stray_files(export: tuple[str, Path]) -> None:
    """onnx/ holds exactly three graphs, their three sidecars, the report, the model card and the
    runtime's two files (the legacy exporter alone scatters ~200 weight files at real size; tiny
    ships no licence file to copy), and every external tensor of a graph lies inside its own sidecar."""
    _, onnx_dir = export
    expected = {REPORT_NAME, MODEL_CARD_FILE, TOKENIZER_FILE, RUNTIME_CONFIG_FILE} | {
        n for name in GRAPH_FILES.values() for n in (name, name + ".data")
    }
    assert {p.name for p in onnx_dir.iterdir()} == expected
    for name in GRAPH_FILES.values():
        sidecar_bytes = (onnx_dir / (name + ".data")).stat().st_size
        external = [
            {e.key: e.value for e in init.external_data}
            for init in _load(onnx_dir / name).graph.initializer
            if init.data_location == onnx.TensorProto.EXTERNAL
        ]
        assert external, f"{name} keeps no weights in its sidecar"
        assert {e["location"] for e in external} == {name + ".data"}
        assert max(int(e["offset"]) + int(e["length"]) for e in external) <= sidecar_bytes


def test_export_files_have_the_umask_mode(export: tuple[str, Path]) -> None:
    """Graphs and sidecars are readable as the user's umask allows (onnx writes sidecars 0600)."""
    _, onnx_dir = export
    mask = os.umask(0)
    os.umask(mask)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in onnx_dir.iterdir()}
    assert set(modes.values()) == {oct(0o666 & ~mask)}, modes


@pytest.mark.parametrize("graph", GRAPH_NAMES)
def test_metadata_props(export: tuple[str, Path], pipeline: Pipeline, graph: str) -> None:
    """The constants a runtime needs travel inside each graph and read back through onnxruntime."""
    exporter, onnx_dir = export
    meta = dict(make_session(onnx_dir / GRAPH_FILES[graph]).get_modelmeta().custom_metadata_map)
    assert meta["graph"] == graph
    assert meta["model_fingerprint"] == model_fingerprint(pipeline.model)
    assert {k: meta[k] for k in CONSTANTS} == CONSTANTS
    assert meta["exporter"] == exporter
    defaults = json.loads(meta["generation_defaults"])
    assert defaults["num_step"] == 32 and "guidance_scale" in defaults
    versions = json.loads(meta["versions"])
    assert {"torch", "onnx", "onnxruntime", "transformers", "omnivoice"} <= versions.keys()
    # The licence and source travel with a graph copied out of its bundle (tiny: random weights).
    assert (meta["license"], meta["source"]) == (
        "other",
        "random-weight tiny checkpoint (omnivoice_export.step0_checkpoints.builder, seed 0)",
    )


def test_report(export: tuple[str, Path], pipeline: Pipeline) -> None:
    """Every report field a user acts on is present and true of the files: sha256 and sizes
    recomputed, checker ok, every self-check (other shapes, bidirectionality probe) passed."""
    exporter, onnx_dir = export
    data = read_report(onnx_dir)
    assert data["model"]["fingerprint"] == model_fingerprint(pipeline.model)
    assert data["capture"]["manifest_sha256"] == sha256_file(pipeline.capture / capture.MANIFEST_NAME)
    assert set(data["graphs"]) == set(GRAPH_NAMES)
    for graph, entry in data["graphs"].items():
        name = GRAPH_FILES[graph]
        assert entry["file"] == name
        assert (entry["exporter"], entry["fallback_reason"], entry["opset"]) == (
            exporter,
            None,
            exporting.DEFAULT_OPSET,
        )
        assert set(entry["files"]) == {name, name + ".data"}
        for file, info in entry["files"].items():
            assert info["bytes"] == (onnx_dir / file).stat().st_size
            assert info["sha256"] == sha256_file(onnx_dir / file)
        assert entry["checker"] == "ok"
        assert entry["self_checks"]["passed"] is True
        assert entry["self_checks"]["dynamic_shapes"], "no self-check at other shapes"
        # Self-checks ran at shapes other than the export example's.
        shapes = {tuple(s["shape"]) for s in entry["self_checks"]["dynamic_shapes"]}
        assert len(shapes) >= 2
    assert data["graphs"]["transformer"]["self_checks"]["bidirectional_probe"]["passed"] is True
    assert data["graphs"]["transformer"]["self_checks"]["mask_probe"]["passed"] is True
    # The runtime's files: recorded with their sha256, and readable by the runtime from onnx/ alone.
    assert set(data["runtime_assets"]) == {TOKENIZER_FILE, RUNTIME_CONFIG_FILE}
    for file, info in data["runtime_assets"].items():
        assert (info["bytes"], info["sha256"]) == ((onnx_dir / file).stat().st_size, sha256_file(onnx_dir / file))
    assert load_runtime_config(onnx_dir / "runtime-config.json")["model"]["audio_mask_id"] == 1024
    assert TextTokenizer.from_file(onnx_dir / "tokenizer.json").encode("<|text_start|>hi<|text_end|>")[0] == 151674


def _strings(value, where: str = ""):
    """(field path, string) of every string in a JSON value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, f"{where}[{index}]")
    elif isinstance(value, str):
        yield where, value


def test_report_paths_and_model_card(pipeline: Pipeline) -> None:
    """The bundle describes itself: the report names the checkpoint relative to the
    project and marks the one path outside it (the test's capture, in a temporary directory)
    local-only, no other absolute path; the export wrote README.md, a model card with the hub's
    YAML header whose licence is what the checkpoint declares (tiny: random weights, "other"), the
    files, the licences a bundle inherits and the misuse notice, and no path of this machine."""
    data = read_report(pipeline.onnx)
    assert data["model"]["path"] == "checkpoints/tiny"
    assert data["local_only"] == ["capture.dir"]
    absolute = {where for where, text in _strings(data) if text.startswith("/")}
    assert absolute == {"capture.dir"}, absolute
    assert data["provenance"]["license"] == "other" and data["provenance"]["random_weights"] is True
    card = (pipeline.onnx / MODEL_CARD_FILE).read_text()
    assert card.startswith(
        "---\nlicense: other\nbase_model: k2-fsa/OmniVoice\npipeline_tag: text-to-speech\nlibrary_name: onnx\n"
    )
    assert card_license(pipeline.onnx) == "other"
    for expected in (
        "Random weights",
        "speaks noise",
        "omnivoice_transformer.onnx",
        "runtime-config.json",
        "| fp32 (the export) |",
        "not run",
        "pip install",
        "omnivoice-onnx speak",
        "Apache-2.0",
        "CC-BY-NC-4.0",
        "Higgs audio tokenizer",
        "voice cloning",
    ):
        assert expected in card, expected
    assert str(pipeline.capture) not in card and str(Path.cwd()) not in card


def _probe_inputs(pipeline: Pipeline) -> dict[str, np.ndarray]:
    """Real transformer inputs of a mid-generation step (clone mode)."""
    data = capture.load_step(pipeline.capture, "clone", 16)
    return {k: data[k] for k in TRANSFORMER_INPUTS}


def test_probe_passes_on_the_export(pipeline: Pipeline) -> None:
    """The real (bidirectional) export: changing the last position moves the earlier logits."""
    session = make_session(pipeline.onnx / GRAPH_FILES["transformer"])
    probe = exporting.bidirectionality_probe(session, _probe_inputs(pipeline))
    assert probe["passed"] is True
    assert probe["max_abs_change_before_last"] > 1e-3


def test_probe_fails_on_a_causal_graph(pipeline: Pipeline, causal_transformer: Path, torch_model) -> None:
    """A faithful export of a causal model (the defect of public OmniVoice ONNX exports) fails the
    probe: the probe is not vacuous. The graph matches its torch module, so the failure comes from
    the causality alone, not from a broken export."""
    inputs = _probe_inputs(pipeline)
    session = make_session(causal_transformer / GRAPH_FILES["transformer"])
    probe = exporting.bidirectionality_probe(session, inputs)
    assert probe["passed"] is False
    assert probe["max_abs_change_before_last"] <= THRESHOLDS["self_check_probe_min_change"]
    with torch.no_grad():
        expected = CausalTransformerWrapper(torch_model)(
            *(torch.from_numpy(inputs[k]) for k in TRANSFORMER_INPUTS)
        ).numpy()
    got = session.run(["logits"], inputs)[0]
    rows = capture.read_rows
    assert (
        np.abs(rows(got, inputs["attention_mask"]) - rows(expected, inputs["attention_mask"])).max()
        <= THRESHOLDS["transformer_max_abs"]
    )


@pytest.mark.parametrize("mode", ["clone", "batch"])
def test_mask_probe_passes_on_the_export(pipeline: Pipeline, mode: str) -> None:
    """The real export honours the mask: changing keys a row's queries may not attend to (an uncond
    row's padding; in the batch mode the shorter cond row's) leaves their logits exactly as they were."""
    session = make_session(pipeline.onnx / GRAPH_FILES["transformer"])
    data = capture.load_step(pipeline.capture, mode, 16)
    probe = exporting.mask_probe(session, {k: data[k] for k in TRANSFORMER_INPUTS})
    assert probe["passed"] is True and probe["failure"] is None
    assert probe["max_abs_change"] == 0.0
    assert probe["masked_keys"] > 0 and probe["queries"] > 0


def test_mask_probe_fails_on_a_mask_ignoring_graph(pipeline: Pipeline, mask_ignoring_transformer: Path) -> None:
    """A faithful export of the model with `eager` attention (which adds the bool mask to the
    scores, so masked keys still weigh) fails the mask probe, while it passes the bidirectionality
    probe: that probe alone let such a graph through."""
    inputs = _probe_inputs(pipeline)
    session = make_session(mask_ignoring_transformer / GRAPH_FILES["transformer"])
    probe = exporting.mask_probe(session, inputs)
    assert probe["passed"] is False
    assert probe["max_abs_change"] > 1e-2
    assert probe["failure"].startswith("mask probe: ")
    assert exporting.bidirectionality_probe(session, inputs)["passed"] is True


def _snapshot(directory: Path) -> dict[str, str]:
    """sha256 of every file under `directory`, hidden and nested ones included."""
    return {str(p.relative_to(directory)): sha256_file(p) for p in sorted(directory.rglob("*")) if p.is_file()}


def test_interrupted_export_keeps_the_previous_export(pipeline_copy: Pipeline, monkeypatch) -> None:
    """A crash while the second graph's sidecar is being written leaves onnx/ exactly as it was:
    no partial file, no staging directory, every previous file byte-identical. (The legacy
    exporter, several times faster here: staging and installation do not depend on the exporter.)"""
    before = _snapshot(pipeline_copy.onnx)
    calls = []
    original = exporting.consolidate_external_data

    def crash_on_second_graph(src: Path, dst: Path) -> list[str]:
        calls.append(dst.name)
        result = original(src, dst)
        if len(calls) == 2:
            sidecar = dst.with_name(dst.name + ".data")
            sidecar.write_bytes(sidecar.read_bytes()[: sidecar.stat().st_size // 2])  # half-written
            raise OSError(f"simulated crash while writing {sidecar.name}")
        return result

    monkeypatch.setattr(exporting, "consolidate_external_data", crash_on_second_graph)
    with pytest.raises(OSError, match="simulated crash"):
        export_omnivoice.main(
            [
                "--model",
                str(pipeline_copy.model),
                "--capture-dir",
                str(pipeline_copy.capture),
                "--onnx-dir",
                str(pipeline_copy.onnx),
                "--graphs",
                "decoder,transformer",
                "--no-dynamo",
            ]
        )
    assert calls == [GRAPH_FILES["decoder"], GRAPH_FILES["transformer"]]
    assert _snapshot(pipeline_copy.onnx) == before
    assert sorted(p.name for p in pipeline_copy.onnx.parent.iterdir()) == ["capture", "onnx"]
