"""The capture is complete, self-validating, reproducible and faithful to what it observed.

Every parity number downstream is measured against these files, so they must hold exactly what an
uninstrumented generate() computes, at every step, and the same run twice must give the same bytes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import Pipeline, run_script, single_stderr_line

import capture_reference
from omnivoice_export.step0_checkpoints.checkpoints import model_fingerprint
from omnivoice_export.step1_capture import capture
from omnivoice_export.step1_capture.generation import GenerationRequest, generate_waveforms, read_wav
from omnivoice_export.step2_export import wrappers
from omnivoice_onnx.contract import CONTRACTS
from omnivoice_onnx.hashing import sha256_file

NUM_STEP = 32  # upstream's default, which the session capture runs at
# Fresh forwards are checked at the first step (all targets masked), the first with tokens filled
# in, the middle and the last (the most tokens filled): 12 forwards instead of 96 keeps the suite fast.
CHECKED_STEPS = (0, 1, NUM_STEP // 2, NUM_STEP - 1)


@pytest.mark.slow
def test_manifest_validates(pipeline: Pipeline) -> None:
    """load_manifest accepts the capture, and independently: every listed file exists with the
    recorded sha256, bytes and tensor shapes, no unlisted file sits in a mode directory, and the
    fingerprint is the model's."""
    manifest = capture.load_manifest(pipeline.capture)
    assert manifest["model"]["fingerprint"] == model_fingerprint(pipeline.model)
    for mode, entry in manifest["modes"].items():
        listed = set(entry["files"])
        assert {p.name for p in (pipeline.capture / mode).iterdir()} == listed, f"{mode}: unlisted or missing files"
        for name, info in entry["files"].items():
            path = pipeline.capture / mode / name
            assert sha256_file(path) == info["sha256"]
            assert path.stat().st_size == info["bytes"]
            if name.endswith(".npz"):
                arrays = capture.load_npz(path)
                assert {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in arrays.items()} == info[
                    "tensors"
                ], f"{mode}/{name}: tensors differ from the manifest"
    assert sha256_file(pipeline.capture / manifest["reference"]["wav"]) == manifest["reference"]["wav_sha256"]


@pytest.mark.slow
def test_all_modes_captured_at_every_step(pipeline: Pipeline) -> None:
    """Later steps, where the token state differs most, are validated too: all 32 transformer calls
    of all three modes are on disk, with the token state after each, and the codec calls."""
    manifest = capture.load_manifest(pipeline.capture, verify_hashes=False)
    assert list(manifest["modes"]) == list(capture.MODES)
    assert manifest["num_step"] == NUM_STEP and manifest["steps"] == "all"
    for mode, entry in manifest["modes"].items():
        assert entry["steps_called"] == NUM_STEP
        assert capture.mode_steps(manifest, mode) == list(range(NUM_STEP))
        tokens = capture.load_mode_file(pipeline.capture, mode, "tokens.npz")
        assert tokens["after_step"].shape[0] == NUM_STEP
        assert np.array_equal(tokens["after_step"][-1], tokens["final"])
        for item, (rows, name) in enumerate(zip(entry["rows"], capture.item_files(manifest, mode, "decoder.npz"))):
            final = tokens["final"][item]
            assert (final[:, : rows["t_len"]] != 1024).all(), f"{mode} item {item}: masked tokens after the last step"
            assert (final[:, rows["t_len"] :] == 1024).all(), f"{mode} item {item}: padding is not the mask id"
            # generate() decodes exactly the final tokens, one item at a time.
            decoded = capture.load_mode_file(pipeline.capture, mode, name)
            assert np.array_equal(decoded["audio_codes"], final[None, :, : rows["t_len"]])
        assert ("encoder.npz" in entry["files"]) == (mode == "clone"), "only clone mode encodes audio"


@pytest.mark.slow
def test_batch_mode_is_a_real_batch(pipeline: Pipeline) -> None:
    """The batch mode holds one generate() of two texts of different lengths, as upstream batches
    them: 2B = 4 transformer rows, both c_len and t_len differ between the items, the shorter
    cond row is padded with rows that may attend to nothing, the uncond rows with their diagonal,
    and each item has its own decoder call and WAV."""
    manifest = capture.load_manifest(pipeline.capture, verify_hashes=False)
    entry = manifest["modes"]["batch"]
    assert isinstance(entry["request"]["text"], list) and len(entry["request"]["text"]) == 2
    (c0, t0), (c1, t1) = ((r["c_len"], r["t_len"]) for r in entry["rows"])
    assert c0 != c1 and t0 != t1
    step = capture.load_step(pipeline.capture, "batch", 0)
    mask = step["attention_mask"][:, 0]
    assert mask.shape[0] == 4
    short = 0 if c0 < c1 else 1
    assert not mask[short, min(c0, c1) :].any(), "the shorter cond row's padding queries attend to something"
    assert step["logits_cond"].shape == (8 * (t0 + t1), 1025)
    assert step["logits_uncond"].shape == (8 * (t0 + t1), 1025)
    assert {"decoder_0.npz", "decoder_1.npz", "output_0.wav", "output_1.wav"} <= set(entry["files"])


def _small_capture(pipeline: Pipeline, directory: Path) -> Path:
    """A 4-step clone capture into `directory` from the session's step-0 reference: clone is the
    only mode that writes every kind of capture file (its encoder call included)."""
    directory.mkdir()
    for name in ("ref_voice.wav", "ref_voice.txt"):
        shutil.copyfile(pipeline.capture / name, directory / name)
    capture_reference.main(
        ["--model", str(pipeline.model), "--num-step", "4", "--modes", "clone", "--capture-dir", str(directory)]
    )
    return directory


def _tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_recapture_is_bit_identical(pipeline: Pipeline, tmp_path: Path) -> None:
    """Two captures with the same request give the same bytes in every file, the manifest (hashes,
    versions, request) and the WAVs included: a parity failure can never be a capture artefact."""
    first = _tree(_small_capture(pipeline, tmp_path / "first"))
    second = _tree(_small_capture(pipeline, tmp_path / "second"))
    assert "manifest.json" in first and "clone/output.wav" in first
    assert sorted(first) == sorted(second)
    differing = [name for name in first if first[name] != second[name]]
    assert not differing, f"files differ between two identical captures: {differing}"


@pytest.mark.slow
def test_recorded_logits_equal_a_fresh_forward(pipeline: Pipeline, torch_model) -> None:
    """The stored logits rows are what the transformer computes on the stored inputs, in every mode
    (at CHECKED_STEPS): the recorder copied them and neither row selection nor storage moved a bit."""
    transformer = wrappers.make_wrappers(torch_model)["transformer"]
    manifest = capture.load_manifest(pipeline.capture, verify_hashes=False)
    for mode in manifest["modes"]:
        for step in CHECKED_STEPS:
            data = capture.load_step(pipeline.capture, mode, step)
            with torch.no_grad():
                logits = transformer(*(torch.from_numpy(data[k]) for k in CONTRACTS["transformer"].input_names)).numpy()
            cond, uncond = capture.logits_rows(logits, data["attention_mask"])
            assert np.array_equal(cond, data["logits_cond"]), f"{mode} step {step}: cond rows differ"
            assert np.array_equal(uncond, data["logits_uncond"]), f"{mode} step {step}: uncond rows differ"


@pytest.mark.slow
@pytest.mark.parametrize("mode", capture.MODES)
def test_capture_does_not_change_generate(pipeline: Pipeline, torch_model, mode: str) -> None:
    """An uninstrumented generate() with the recorded request gives exactly the captured waveform
    (decoded from the captured final tokens): the recorder observed without changing anything."""
    manifest = capture.load_manifest(pipeline.capture, verify_hashes=False)
    request = GenerationRequest.from_dict(manifest["modes"][mode]["request"])
    if request.ref_audio:
        request.ref_audio = str(pipeline.capture / request.ref_audio)
    assert "forward" not in vars(torch_model), "a recorder or ONNX forward is still installed on the model"
    audios = generate_waveforms(torch_model, request)
    names = capture.item_files(manifest, mode, "output.wav")
    assert len(audios) == len(names)
    for audio, name in zip(audios, names):
        captured, _ = read_wav(pipeline.capture / mode / name)
        assert audio.shape == captured.shape
        assert np.array_equal(audio, captured), f"{mode}: plain generate() differs from the captured run ({name})"


def test_patched_restores_instance_attributes() -> None:
    """capture.patched puts back what an instance had (or removes what it lacked), even when the
    block raises: a failed capture must not leave a recorder installed on the model."""

    class Model:
        def forward(self) -> str:
            return "class"

    model = Model()
    model.decode = lambda: "instance"
    with pytest.raises(RuntimeError):
        with capture.patched([(model, "forward", lambda: "patched"), (model, "decode", lambda: "patched")]):
            assert model.forward() == model.decode() == "patched"
            raise RuntimeError
    assert "forward" not in vars(model) and model.forward() == "class"
    assert model.decode() == "instance"


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_device_cuda_without_cuda_is_one_line_error(pipeline: Pipeline, tmp_path: Path) -> None:
    """--device cuda on a CPU-only machine fails before loading anything, with one line, and leaves
    no capture behind."""
    target = tmp_path / "capture"
    proc = run_script(
        "capture_reference.py", "--model", str(pipeline.model), "--device", "cuda", "--capture-dir", str(target)
    )
    assert proc.returncode == 2
    assert "cuda" in single_stderr_line(proc).lower()
    assert not target.exists()
