"""parity_check.py passes a correct export, fails wrong graphs naming them, and refuses
inputs it cannot compare with one line and exit code 2.

A check that cannot fail proves nothing, so two wrong transformers are installed into copies with
their report entries re-hashed (what a faulty exporter would write): integrity checks pass and
only the metrics stand between them and a PASS.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import Pipeline, install_graph, read_report, rehash_graph, run_script, single_stderr_line

import parity_check
from omnivoice_export.step1_capture import capture
from omnivoice_export.step2_export import report
from omnivoice_onnx.contract import CONTRACTS, GRAPH_FILES, GRAPH_NAMES, THRESHOLDS
from omnivoice_onnx.program import CheckFailed

pytestmark = pytest.mark.slow  # every test here uses the session pipeline (steps 0-2, ~100 s)
NUM_STEP = 32
# A section another provider's run left in the report; the cpu run must keep it as it is.
OTHER_PROVIDER = "cuda-fp32"
OTHER_SECTION = {"provider": OTHER_PROVIDER, "verdict": "PASS", "graphs": {}, "note": "written by the test"}


def _parity(capture_dir: Path, onnx_dir: Path, *extra: str) -> None:
    parity_check.main(["--capture-dir", str(capture_dir), "--onnx-dir", str(onnx_dir), *extra])


@pytest.fixture(scope="module")
def passing_report(pipeline: Pipeline, tmp_path_factory) -> dict:
    """The report after the default parity run (cpu, all graphs, encoder sweep) on a copy of the
    session export that already holds another provider's section."""

    onnx_dir = tmp_path_factory.mktemp("parity") / "onnx"
    shutil.copytree(pipeline.onnx, onnx_dir)
    report.merge_section(onnx_dir, ("parity", OTHER_PROVIDER), OTHER_SECTION)
    _parity(pipeline.capture, onnx_dir)  # returns normally: exit code 0
    return read_report(onnx_dir)


def test_passes_on_the_correct_export(passing_report: dict, pipeline: Pipeline) -> None:
    """Every graph passes on every captured input, within the one threshold table."""
    section = passing_report["parity"]["cpu"]
    assert section["verdict"] == "PASS"
    assert section["thresholds"] == {k: THRESHOLDS[k] for contract in CONTRACTS.values() for k in contract.tolerances}
    graphs = section["graphs"]
    assert all(graphs[g]["passed"] and not graphs[g]["failures"] for g in GRAPH_NAMES)
    manifest = capture.load_manifest(pipeline.capture, verify_hashes=False)
    checked = {(row["mode"], row["step"]) for row in graphs["transformer"]["rows"]}
    assert checked == {(mode, step) for mode in manifest["modes"] for step in range(NUM_STEP)}
    assert graphs["transformer"]["argmax_agreement_min"] >= THRESHOLDS["transformer_argmax_min"]
    assert graphs["transformer"]["max_abs_max"] <= THRESHOLDS["transformer_max_abs"]
    assert graphs["encoder"]["captured"]["code_match"] == 1.0
    assert len(graphs["encoder"]["sweep"]) > 10 and all(r["code_match"] == 1.0 for r in graphs["encoder"]["sweep"])
    assert {row["mode"] for row in graphs["decoder"]["rows"]} == set(manifest["modes"])


def test_covers_the_batch(passing_report: dict, pipeline: Pipeline) -> None:
    """Every step of the batch mode (one generate() of two texts of different lengths: 2B = 4
    rows, the shorter item padded) is compared on the rows generate() reads of both items, and
    each item's decoder call."""
    graphs = passing_report["parity"]["cpu"]["graphs"]
    batch = [row for row in graphs["transformer"]["rows"] if row["mode"] == "batch"]
    assert len(batch) == NUM_STEP and all(row["passed"] and row["argmax_agreement"] == 1.0 for row in batch)
    items = capture.load_manifest(pipeline.capture, verify_hashes=False)["modes"]["batch"]["rows"]
    assert len(items) == 2
    assert all(row["rows"] == 2 * 8 * sum(item["t_len"] for item in items) for row in batch)  # cond + uncond
    assert [row["item"] for row in graphs["decoder"]["rows"] if row["mode"] == "batch"] == [0, 1]


def test_results_for_two_providers_coexist(passing_report: dict) -> None:
    """A cpu run merges its section beside another provider's, which it leaves untouched."""
    assert set(passing_report["parity"]) == {"cpu", OTHER_PROVIDER}
    assert passing_report["parity"][OTHER_PROVIDER] == OTHER_SECTION


@pytest.mark.parametrize(
    "wrong_graph,graph",
    [
        ("perturbed_transformer", "transformer"),
        ("causal_transformer", "transformer"),
        ("mask_ignoring_transformer", "transformer"),
        ("perturbed_encoder", "encoder"),
        ("perturbed_decoder", "decoder"),
    ],
)
def test_fails_on_a_wrong_graph(request, wrong_graph: str, graph: str, pipeline: Pipeline, onnx_copy: Path) -> None:
    """Audio heads scaled by 1.5 (argmax unchanged, logits off), a causal-attention model, a model
    whose attention ignores the mask (eager), an encoder and a decoder with one conv scaled: each
    fails, naming its graph and only it; the other graphs still pass."""
    install_graph(request.getfixturevalue(wrong_graph), onnx_copy, graph)
    checked = GRAPH_NAMES if graph == "transformer" else ("encoder", "decoder")  # the transformer's steps take longest
    with pytest.raises(CheckFailed) as failure:
        _parity(pipeline.capture, onnx_copy, "--no-sweep", "--graphs", ",".join(checked))
    assert str(failure.value) == f"parity failed for {graph} on cpu"
    section = read_report(onnx_copy)["parity"]["cpu"]
    assert section["verdict"] == "FAIL"
    assert {g: r["passed"] for g, r in section["graphs"].items()} == {g: g != graph for g in checked}
    result = section["graphs"][graph]
    if graph == "transformer":
        assert result["max_abs_max"] > THRESHOLDS["transformer_max_abs"]
    elif graph == "encoder":
        assert result["captured"]["code_match"] < THRESHOLDS["encoder_code_match_min"]
    else:
        assert max(row["log_spectral_l1"] for row in result["rows"]) > THRESHOLDS["decoder_log_spectral_l1_max"]


def test_contract_violation_fails(pipeline: Pipeline, onnx_copy: Path) -> None:
    """A decoder whose output length axis lost its contract name (dynamo's raw "s76") is a
    different graph to a runtime that binds axes by name: parity fails it, naming the axis, though
    every value matches."""
    import onnx

    name = GRAPH_FILES["decoder"]
    model = onnx.load(str(onnx_copy / name), load_external_data=False)
    model.graph.output[0].type.tensor_type.shape.dim[2].dim_param = "s76"
    onnx.save_model(model, str(onnx_copy / name))
    rehash_graph(onnx_copy, "decoder")
    with pytest.raises(CheckFailed, match="parity failed for decoder"):
        _parity(pipeline.capture, onnx_copy, "--graphs", "decoder")
    result = read_report(onnx_copy)["parity"]["cpu"]["graphs"]["decoder"]
    assert result["failures"] == ["contract: output audio_values axis 2 is 's76', expected '960*frames'"]
    assert all(row["passed"] for row in result["rows"])


def test_fingerprint_mismatch_is_refused(pipeline: Pipeline, onnx_copy: Path) -> None:
    """A capture and an export of different models are never compared: exit 2, one line naming
    both fingerprints, and nothing merged into the report."""
    data = read_report(onnx_copy)
    data["model"]["fingerprint"] = "sha256:0123456789abcdef"
    report.report_path(onnx_copy).write_text(json.dumps(data))
    proc = run_script("parity_check.py", "--capture-dir", str(pipeline.capture), "--onnx-dir", str(onnx_copy))
    assert proc.returncode == 2
    line = single_stderr_line(proc)
    assert "sha256:0123456789abcdef" in line
    assert capture.load_manifest(pipeline.capture, verify_hashes=False)["model"]["fingerprint"] in line
    assert "parity" not in read_report(onnx_copy)


@pytest.mark.parametrize("damage", ["truncated", "corrupted"])
def test_damaged_sidecar_is_refused(pipeline: Pipeline, onnx_copy: Path, damage: str) -> None:
    """A truncated sidecar (interrupted copy) or one with flipped bytes (same size) is refused
    before any session loads it: exit 2, one line naming the file."""
    sidecar = onnx_copy / (GRAPH_FILES["transformer"] + ".data")
    content = bytearray(sidecar.read_bytes())
    if damage == "truncated":
        content = content[: len(content) // 2]
    else:
        content[len(content) // 2] ^= 0xFF
    sidecar.write_bytes(bytes(content))
    proc = run_script("parity_check.py", "--capture-dir", str(pipeline.capture), "--onnx-dir", str(onnx_copy))
    assert proc.returncode == 2
    assert sidecar.name in single_stderr_line(proc)


def test_cuda_provider_without_cuda_is_one_line_error(pipeline: Pipeline) -> None:
    """--provider cuda-fp32 where onnxruntime has no CUDA EP fails with one line, never a quiet
    fall back to CPU."""
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("checks the error on a machine without onnxruntime's CUDA provider")
    proc = run_script(
        "parity_check.py",
        "--provider",
        "cuda-fp32",
        "--capture-dir",
        str(pipeline.capture),
        "--onnx-dir",
        str(pipeline.onnx),
    )
    assert proc.returncode != 0
    assert "cuda" in single_stderr_line(proc).lower()
