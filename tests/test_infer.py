"""The ONNX graphs drop into the real generate() token-exact, a wrong graph is reported
as a divergence at a named step, and synthesis needs only the graphs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile
from conftest import Pipeline, copy_pipeline, install_graph, read_report, run_script, single_stderr_line

import infer_onnx
from omnivoice_export.step1_capture import capture
from omnivoice_onnx.contract import SAMPLE_RATE, THRESHOLDS
from omnivoice_onnx.program import CheckFailed

pytestmark = pytest.mark.slow  # every test here uses the session pipeline (steps 0-2, ~100 s)
NUM_STEP = 32


def _compare(pipeline: Pipeline) -> None:
    infer_onnx.main(["--capture-dir", str(pipeline.capture), "--onnx-dir", str(pipeline.onnx), "--no-torch-timing"])


@pytest.fixture(scope="module")
def end_to_end(pipeline: Pipeline, tmp_path_factory) -> tuple[Pipeline, dict]:
    """(copy, report section end_to_end.cpu) after compare mode on a copy of the session pipeline
    (it writes onnx_<mode>.wav beside the capture)."""
    copy = copy_pipeline(pipeline, tmp_path_factory.mktemp("infer"))
    _compare(copy)  # returns normally: exit code 0
    return copy, read_report(copy.onnx)["end_to_end"]["cpu"]


@pytest.mark.parametrize("mode", capture.MODES)
def test_onnx_generate_is_token_exact(end_to_end: tuple[Pipeline, dict], mode: str) -> None:
    """Same request, same seed, ONNX modules: every final token equal, never a divergent step,
    the same duration, and the audio within the end-to-end log-spectral threshold."""
    copy, section = end_to_end
    assert section["verdict"] == "PASS"
    result = section["modes"][mode]
    assert result["token_match"] == 1.0
    assert result["token_match_per_codebook"] == [1.0] * 8
    assert result["first_divergent_step"] is None
    assert result["same_duration"] and result["duration_s"] == result["reference_duration_s"]
    assert result["log_spectral_l1"] <= THRESHOLDS["end_to_end_log_spectral_l1_max"]
    assert result["passed"]
    assert len(result["items"]) == (2 if mode == "batch" else 1)  # the batch mode's two texts, each compared
    for item in result["items"]:
        assert item["same_duration"] and item["log_spectral_l1"] <= THRESHOLDS["end_to_end_log_spectral_l1_max"]
        info = soundfile.info(str(copy.capture / item["wav"]))
        assert info.samplerate == SAMPLE_RATE and info.duration == pytest.approx(item["duration_s"])
    # The torch-free runtime on the same request: PyTorch's final tokens, every one.
    runtime = section["runtime"]
    assert (runtime["runtime"], runtime["variant"], runtime["verdict"], runtime["token_match"]) == (
        "omnivoice_onnx",
        "fp32",
        "PASS",
        1.0,
    )
    assert runtime["modes"][mode]["token_match_per_item"] == [1.0] * len(result["items"])
    assert runtime["modes"][mode]["first_difference"] is None and runtime["modes"][mode]["passed"]


def test_wrong_transformer_diverges_at_a_named_step(pipeline_copy: Pipeline, perturbed_transformer: Path) -> None:
    """Audio heads scaled by 1.5 (argmax unchanged, confidences off) change which positions get
    unmasked: tokens fall below 100% and the report names the first divergent step (exit 1)."""
    install_graph(perturbed_transformer, pipeline_copy.onnx, "transformer")
    with pytest.raises(CheckFailed, match="first divergent step"):
        _compare(pipeline_copy)
    section = read_report(pipeline_copy.onnx)["end_to_end"]["cpu"]
    assert section["verdict"] == "FAIL"
    failed = {mode: r for mode, r in section["modes"].items() if not r["passed"]}
    assert failed, "no mode failed"
    for mode, result in failed.items():
        assert result["token_match"] < 1.0, f"{mode} failed with identical tokens"
        assert isinstance(result["first_divergent_step"], int) and 0 <= result["first_divergent_step"] < NUM_STEP
        # The runtime runs the same wrong graph: its tokens leave PyTorch's too, at a named cell.
        runtime = section["runtime"]["modes"][mode]
        assert runtime["token_match"] < 1.0 and not runtime["passed"]
        assert set(runtime["first_difference"]) == {"item", "frame", "codebook"}
    assert section["runtime"]["verdict"] == "FAIL"


def test_synthesis_writes_a_wav_without_a_capture(pipeline: Pipeline, tmp_path: Path) -> None:
    """--text speaks with the graphs alone: a capture directory that does not exist is never read."""
    out = tmp_path / "hello.wav"
    infer_onnx.main(
        [
            "--text",
            "Hello there, this is a test.",
            "--out",
            str(out),
            "--num-step",
            "4",
            "--onnx-dir",
            str(pipeline.onnx),
            "--capture-dir",
            str(tmp_path / "no-capture"),
        ]
    )
    info = soundfile.info(str(out))
    assert (info.samplerate, info.channels) == (SAMPLE_RATE, 1)
    assert info.duration > 0.5
    assert not (tmp_path / "no-capture").exists()


def test_missing_capture_is_one_line_error(pipeline: Pipeline, tmp_path: Path) -> None:
    """Compare mode without a capture: exit 2 and one line that says to run step 1."""
    proc = run_script(
        "infer_onnx.py",
        "--capture-dir",
        str(tmp_path / "missing"),
        "--onnx-dir",
        str(pipeline.onnx),
        "--no-torch-timing",
    )
    assert proc.returncode == 2
    line = single_stderr_line(proc)
    assert "capture_reference.py" in line and "step 1" in line
