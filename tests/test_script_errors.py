"""The pipeline scripts: wrong paths, stale captures, damaged artefacts, bad inputs and faults end in one line.

Each case checks the exit code (2 bad input, 1 failed check, 130 Ctrl-C), that stderr holds
exactly one error line naming the problem and the fix, that no traceback is printed, and, for
faults, that the previous complete artefacts are intact and no temporary file is left behind.

Most runs are in-process (`run_main(script.main, argv)`: no re-import of torch) on copies of the
session pipeline; a few run as subprocesses, as users run them. Damaged copies of the 700 MB
capture are symlink trees: a damaged file is unlinked and rewritten, never written through.
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import soundfile
from conftest import REPO, Pipeline, run_script

import capture_reference
import export_omnivoice
import infer_onnx
import make_reference
import parity_check
from omnivoice_export.step0_checkpoints.checkpoints import REQUIRED_FILES
from omnivoice_export.step1_capture import capture, generation
from omnivoice_export.step1_capture.generation import (
    REFERENCE_TEXT,
    GenerationRequest,
    check_reference_audio,
    write_wav,
)
from omnivoice_export.step2_export import exporting, report
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import atomic_path, temporary_dir
from omnivoice_onnx.hashing import sha256_file
from omnivoice_onnx.program import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_CHECK_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    run_main,
)
from omnivoice_onnx.verified import stat_identity

DECODER = "higgs_decoder.onnx"


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_inprocess(script, argv: list[str], capsys) -> Result:
    """A script's main() under run_main, as `python script.py argv` would run it."""
    capsys.readouterr()
    try:
        run_main(script.main, [str(a) for a in argv])
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


def assert_one_line(result: Result, code: int, *fragments: str) -> str:
    """Exit `code`, one error line on stderr (notes aside) containing every fragment, no traceback."""
    assert result.code == code, (result.code, result.err[-2000:])
    assert "Traceback" not in result.err
    shown = [line.split("\r")[-1] for line in result.err.split("\n")]  # what a terminal shows: bars overwritten
    lines = [line for line in shown if line.strip() and not line.startswith(("note:", "warning:"))]
    assert len(lines) == 1, lines
    prefix = {
        EXIT_CHECK_FAILED: "FAILED: ",
        EXIT_INTERRUPTED: "interrupted: ",
        EXIT_TERMINATED: "terminated (SIGTERM): ",
    }.get(code, "error: ")
    assert lines[0].startswith(prefix), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def linked_copy(src: Path, dst: Path) -> Path:
    """A tree of symlinks to src's files: cheap to make; damage it with `replace_file` only."""
    shutil.copytree(src, dst, copy_function=os.symlink)
    return dst


def replace_file(path: Path, data: bytes) -> None:
    """Give `path` new content without writing through a symlink into the shared pipeline."""
    path.unlink(missing_ok=True)
    path.write_bytes(data)


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    replace_file(path, json.dumps(data).encode())


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` (hidden ones included) -> its sha256; a symlink (linked_copy)
    -> its target and the target's stat identity, not a hash of the shared file: a write through
    the link changes the target's mtime and ctime (what the runtime's verified record trusts), and
    a file put in the link's place changes the entry."""
    return {
        str(p.relative_to(directory)): (
            f"-> {os.readlink(p)} {stat_identity(p.stat())}" if p.is_symlink() else sha256_file(p)
        )
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def work(pipeline: Pipeline, tmp_path: Path) -> Pipeline:
    """capture/ as a symlink tree, onnx/ as a real copy (44 MB): safe to damage as above."""
    onnx_dir = tmp_path / "onnx"
    shutil.copytree(pipeline.onnx, onnx_dir)
    return Pipeline(pipeline.model, linked_copy(pipeline.capture, tmp_path / "capture"), onnx_dir)


def parity_args(p: Pipeline, *extra) -> list:
    return ["--capture-dir", p.capture, "--onnx-dir", p.onnx, "--graphs", "decoder", *extra]


def synth_args(p: Pipeline, tmp_path: Path, *extra) -> list:
    return ["--onnx-dir", p.onnx, "--out", tmp_path / "out.wav", "--num-step", "2", *extra]


# --- model -------------------------------------------------------------------------------------


def _model_copy(tiny: Path, dst: Path) -> Path:
    for name in REQUIRED_FILES:
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        (dst / name).symlink_to(tiny / name)
    return dst


MODEL_CASES = {  # case -> (damage(model copy, original), message)
    "missing": (lambda m, _: shutil.rmtree(m), "does not exist"),
    "no-audio-tokenizer": (lambda m, _: shutil.rmtree(m / "audio_tokenizer"), "has no audio_tokenizer/"),
    "truncated-weights": (
        lambda m, tiny: replace_file(m / "model.safetensors", (tiny / "model.safetensors").read_bytes()[:100_000]),
        "model.safetensors is truncated or corrupt",
    ),
    "garbage-weights": (
        lambda m, _: replace_file(m / "audio_tokenizer/model.safetensors", b"not a tensor file" * 99),
        "is not a valid safetensors file",
    ),
    "not-omnivoice-config": (
        lambda m, _: replace_file(m / "config.json", b'{"model_type": "qwen3"}'),
        "is not an OmniVoice config",
    ),
    "config-not-json": (lambda m, _: replace_file(m / "config.json", b"{oops"), "config.json is not valid JSON"),
}


@pytest.mark.parametrize("case", MODEL_CASES)
def test_model_refused(case: str, tiny_model: Path, tmp_path: Path, capsys) -> None:
    model = _model_copy(tiny_model, tmp_path / "model")
    damage, message = MODEL_CASES[case]
    damage(model, tiny_model)
    result = run_inprocess(make_reference, ["--model", model, "--out-dir", tmp_path / "ref"], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, message, "; ")
    assert not (tmp_path / "ref").exists()


# --- reference audio and transcript -------------------------------------------------------------


def _write_reference(path: Path, kind: str) -> Path:
    rate = 24000
    speech = (0.3 * np.sin(np.linspace(0, 2000, rate * 3))).astype(np.float32)
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "no-samples":
        soundfile.write(path, np.zeros(0, np.float32), rate)
    elif kind == "silent":
        soundfile.write(path, np.zeros(rate * 3, np.float32), rate)
    elif kind == "not-audio":
        path.write_text("this is a transcript, not audio\n" * 50)
    elif kind == "stereo":
        soundfile.write(path, np.stack([speech, speech * 0.5], axis=1), rate)
    elif kind == "16khz":
        soundfile.write(path, speech[: 16000 * 3], 16000)
    elif kind == "long":
        soundfile.write(path, np.tile(speech, 8), rate)  # 24 s
    elif kind == "good":
        soundfile.write(path, speech, rate, subtype="FLOAT")
    return path


REFERENCE_ERRORS = {
    "missing": "audio file not found",
    "empty": "is an empty file",
    "no-samples": "has no samples",
    "silent": "is silent",
    "not-audio": "is not a readable audio file",
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", REFERENCE_ERRORS)
def test_reference_audio_refused_synthesis(kind: str, pipeline: Pipeline, tmp_path: Path, capsys) -> None:
    ref = _write_reference(tmp_path / "ref.wav", kind)
    result = run_inprocess(
        infer_onnx,
        synth_args(pipeline, tmp_path, "--text", "Hello there.", "--ref-audio", ref, "--ref-text", REFERENCE_TEXT),
        capsys,
    )
    assert_one_line(result, EXIT_BAD_INPUT, REFERENCE_ERRORS[kind], "3-10 s of clear speech")
    assert not (tmp_path / "out.wav").exists()


@pytest.mark.parametrize(
    "case,message",
    [
        ("wav-missing", "clone mode needs"),
        ("txt-missing", "clone mode needs"),
        ("txt-empty", "ref_voice.txt is empty"),
        ("wav-silent", "is silent"),
        ("wav-not-audio", "is not a readable audio file"),
    ],
)
def test_reference_refused_capture(case: str, message: str, tiny_model: Path, tmp_path: Path, capsys) -> None:
    """capture_reference.py checks capture/ref_voice.{wav,txt} before loading the model."""
    ref_dir = tmp_path / "capture"
    ref_dir.mkdir()
    _write_reference(
        ref_dir / "ref_voice.wav", {"wav-silent": "silent", "wav-not-audio": "not-audio"}.get(case, "good")
    )
    (ref_dir / "ref_voice.txt").write_text("" if case == "txt-empty" else REFERENCE_TEXT)
    if case == "wav-missing":
        (ref_dir / "ref_voice.wav").unlink()
    if case == "txt-missing":
        (ref_dir / "ref_voice.txt").unlink()
    result = run_inprocess(
        capture_reference,
        ["--model", tiny_model, "--capture-dir", ref_dir, "--modes", "clone", "--num-step", "2"],
        capsys,
    )
    assert_one_line(result, EXIT_BAD_INPUT, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capture"]  # no temporary capture left behind


@pytest.mark.parametrize(
    "kind,level,fragment",
    [
        ("stereo", "note", "has 2 channels; they are averaged to mono"),
        ("16khz", "note", "is 16000 Hz; it is resampled to 24000 Hz"),
        ("long", "warning", "is 24.0 s long (> 20 s)"),
    ],
)
def test_reference_accepted_with_one_line(kind: str, level: str, fragment: str, tmp_path: Path, capsys) -> None:
    check_reference_audio(_write_reference(tmp_path / "ref.wav", kind))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{level}: ") and fragment in lines[0], lines


@pytest.mark.slow
def test_reference_stereo_8khz_synthesizes(pipeline: Pipeline, tmp_path: Path, capsys) -> None:
    ref = tmp_path / "ref.wav"
    audio, _ = soundfile.read(pipeline.capture / "ref_voice.wav", dtype="float32")
    soundfile.write(ref, np.stack([audio, audio], axis=1)[::3][: 16000 * 4], 8000)  # 8 kHz stereo
    result = run_inprocess(
        infer_onnx,
        synth_args(pipeline, tmp_path, "--text", "Hello there.", "--ref-audio", ref, "--ref-text", REFERENCE_TEXT),
        capsys,
    )
    assert result.code == 0, result.err
    assert "note: reference audio" in result.err and "2 channels" in result.err and "8000 Hz" in result.err
    assert soundfile.info(tmp_path / "out.wav").frames > 0


# --- capture -----------------------------------------------------------------------------------


def _first_step(p: Pipeline) -> Path:
    return p.capture / "clone" / capture.STEP_FILE.format(0)


def _flip_middle_byte(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


CAPTURE_CASES = {
    "missing": (lambda p: shutil.rmtree(p.capture), "capture manifest not found"),
    "manifest-not-json": (
        lambda p: replace_file(p.capture / "manifest.json", b'{"format": 1, "mod'),
        "manifest.json is not valid JSON",
    ),
    "manifest-malformed": (
        lambda p: edit_json(p.capture / "manifest.json", lambda m: m.pop("model")),
        "is malformed: model is missing",
    ),
    "partial": (lambda p: _first_step(p).unlink(), "capture is incomplete"),
    "hash-mismatch": (
        lambda p: replace_file(_first_step(p), _flip_middle_byte(_first_step(p).read_bytes())),
        "does not match its recorded sha256",
    ),
    "other-model": (
        lambda p: edit_json(
            p.capture / "manifest.json", lambda m: m["model"].update(fingerprint="sha256:0123456789abcdef")
        ),
        "the capture is of model sha256:0123456789abcdef but the export of",
    ),
    "other-generation-config": (
        lambda p: edit_json(p.capture / "manifest.json", lambda m: m.update(seed=7)),
        "is not the one the export was made from",
    ),
}


@pytest.mark.slow
def test_capture_of_other_model_refused_by_export(work: Pipeline, capsys) -> None:
    CAPTURE_CASES["other-model"][0](work)
    before = snapshot(work.onnx)
    result = run_inprocess(
        export_omnivoice, ["--model", work.model, "--capture-dir", work.capture, "--onnx-dir", work.onnx], capsys
    )
    assert_one_line(result, EXIT_BAD_INPUT, "the capture was made with model sha256:0123456789abcdef")
    assert snapshot(work.onnx) == before


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags,message",
    [
        (["--num-step", "8"], "--num-step 8 differs from the capture's 32"),
        (["--seed", "7"], "--seed 7 differs from the capture's"),
        (["--instruct", "male"], "--instruct only apply to synthesis mode"),
    ],
)
def test_compare_refuses_other_generation_config(flags: list, message: str, work: Pipeline, capsys) -> None:
    result = run_inprocess(infer_onnx, ["--capture-dir", work.capture, "--onnx-dir", work.onnx, *flags], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, message, "re-run steps 1-2" if "differs" in message else "add --text")


@pytest.mark.slow
def test_compare_refuses_reference_remade_after_capture(work: Pipeline, tmp_path: Path, capsys) -> None:
    _write_reference(tmp_path / "new.wav", "good")
    replace_file(work.capture / "ref_voice.wav", (tmp_path / "new.wav").read_bytes())
    result = run_inprocess(infer_onnx, ["--capture-dir", work.capture, "--onnx-dir", work.onnx], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, "is not the reference the capture was made from", "capture_reference.py")


# --- onnx --------------------------------------------------------------------------------------


def _report(p: Pipeline) -> Path:
    return p.onnx / "export-report.json"


def _set_graph_entry(p: Pipeline, **changes) -> None:
    edit_json(_report(p), lambda r: r["graphs"]["decoder"].update(changes))


ONNX_CASES = {
    "graph-missing": (lambda p: (p.onnx / DECODER).unlink(), "higgs_decoder.onnx is missing"),
    "data-missing": (lambda p: (p.onnx / f"{DECODER}.data").unlink(), "higgs_decoder.onnx.data is missing"),
    "data-truncated": (
        lambda p: replace_file(p.onnx / f"{DECODER}.data", (p.onnx / f"{DECODER}.data").read_bytes()[:1000]),
        "does not match the export report's sha256",
    ),
    "data-from-another-export": (
        lambda p: replace_file(p.onnx / f"{DECODER}.data", bytes(reversed((p.onnx / f"{DECODER}.data").read_bytes()))),
        "does not match the export report's sha256",
    ),
    "graph-not-onnx": (lambda p: replace_file(p.onnx / DECODER, b"\xff" * 64), "is not a readable ONNX graph"),
    "other-opset": (lambda p: _set_graph_entry(p, opset=20), "at opset 18 of model"),
    "other-exporter": (lambda p: _set_graph_entry(p, exporter="legacy"), "by the dynamo exporter"),
    "report-missing": (lambda p: _report(p).unlink(), "export report not found"),
    "report-not-json": (
        lambda p: replace_file(_report(p), _report(p).read_bytes()[:200]),
        "export-report.json is not valid JSON",
    ),
    "report-malformed": (
        lambda p: edit_json(_report(p), lambda r: r["graphs"]["decoder"].pop("files")),
        "is malformed: graphs.decoder.files is missing",
    ),
}


DAMAGE_CASES = {
    **{f"capture-{k}": v for k, v in CAPTURE_CASES.items()},
    **{f"onnx-{k}": v for k, v in ONNX_CASES.items()},
}


@pytest.mark.slow
@pytest.mark.parametrize("case", DAMAGE_CASES)
def test_damage_refused_by_parity(case: str, work: Pipeline, capsys) -> None:
    damage, message = DAMAGE_CASES[case]
    damage(work)
    before = snapshot(work.onnx)
    result = run_inprocess(parity_check, parity_args(work), capsys)
    line = assert_one_line(result, EXIT_BAD_INPUT, message)
    assert re.search(r"; (re-)?run (capture_reference|export_omnivoice)\.py|; re-run steps 1-2", line)  # the fix
    if case.startswith("onnx-other-"):
        assert "but the export report says" in line
    assert snapshot(work.onnx) == before  # refused: nothing merged into the report, never half-overwritten


@pytest.mark.slow
@pytest.mark.parametrize("case", ["data-truncated", "other-opset"])
def test_onnx_refused_by_synthesis(case: str, work: Pipeline, tmp_path: Path, capsys) -> None:
    ONNX_CASES[case][0](work)
    result = run_inprocess(infer_onnx, synth_args(work, tmp_path, "--text", "Hello there."), capsys)
    assert_one_line(result, EXIT_BAD_INPUT, ONNX_CASES[case][1])


@pytest.mark.slow
def test_malformed_report_refused_by_partial_export(work: Pipeline, capsys) -> None:
    ONNX_CASES["report-not-json"][0](work)
    before = snapshot(work.onnx)
    result = run_inprocess(
        export_omnivoice,
        ["--model", work.model, "--capture-dir", work.capture, "--onnx-dir", work.onnx, "--graphs", "decoder"],
        capsys,
    )
    assert_one_line(result, EXIT_BAD_INPUT, "cannot add decoder to the existing export", "omit --graphs")
    assert snapshot(work.onnx) == before


# --- providers ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("script", [parity_check, infer_onnx], ids=["parity", "infer"])
@pytest.mark.parametrize(
    "provider,message", [("cuda-fp32", "needs onnxruntime's CUDAExecutionProvider"), ("tpu", "unknown provider 'tpu'")]
)
def test_provider_refused(script, provider: str, message: str, pipeline: Pipeline, capsys) -> None:
    import onnxruntime

    if provider.startswith("cuda") and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA EP")
    result = run_inprocess(
        script, ["--provider", provider, "--capture-dir", pipeline.capture, "--onnx-dir", pipeline.onnx], capsys
    )
    assert_one_line(result, EXIT_BAD_INPUT, message, "requirements-gpu.txt" if "cuda" in provider else "cpu")


# --- synthesis inputs --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags,message,fix",
    [
        (["--text", ""], "--text is empty", "pass the text"),
        (["--text", "   "], "--text is empty", "pass the text"),
        (["--text", "Hello.", "--language", "Klingon"], "unknown language 'Klingon'", "leave the language out"),
        (["--text", "Hello.", "--instruct", "male, female"], "Conflicting instruct items", ""),
    ],
)
def test_synthesis_input_refused(
    flags: list, message: str, fix: str, pipeline: Pipeline, tmp_path: Path, capsys
) -> None:
    result = run_inprocess(infer_onnx, synth_args(pipeline, tmp_path, *flags), capsys)
    assert_one_line(result, EXIT_BAD_INPUT, message, fix)
    assert not (tmp_path / "out.wav").exists()


@pytest.mark.slow
def test_synthesis_long_text_is_chunked(pipeline: Pipeline, tmp_path: Path, capsys) -> None:
    """Upstream splits text estimated over 30 s into chunks; the ONNX graphs must serve that too."""
    text = " ".join(["The rainbow is a division of white light into many beautiful colors."] * 12)
    result = run_inprocess(infer_onnx, synth_args(pipeline, tmp_path, "--text", text), capsys)
    assert result.code == 0, result.err
    info = soundfile.info(tmp_path / "out.wav")
    assert info.frames / info.samplerate > 30.0


# --- faults ------------------------------------------------------------------------------------


def _export_argv(p: Pipeline, *extra) -> list:
    return ["--model", p.model, "--capture-dir", p.capture, "--onnx-dir", p.onnx, *extra]


@pytest.mark.slow
@pytest.mark.parametrize("fault", [KeyboardInterrupt, RuntimeError], ids=["ctrl-c", "exception"])
def test_fault_mid_export_keeps_previous_export(fault, work: Pipeline, monkeypatch, capsys) -> None:
    def exporter_dies(module, graph, inputs, out_path, dynamo, opset):
        Path(out_path).write_bytes(b"half a graph")
        raise fault("simulated")

    monkeypatch.setattr(exporting, "run_exporter", exporter_dies)
    before = snapshot(work.onnx)
    if fault is KeyboardInterrupt:
        assert_one_line(
            run_inprocess(export_omnivoice, _export_argv(work), capsys),
            EXIT_INTERRUPTED,
            "earlier artefacts are intact",
        )
    else:
        with pytest.raises(RuntimeError, match="simulated"):  # a bug keeps its traceback
            run_main(export_omnivoice.main, [str(a) for a in _export_argv(work)])
    assert snapshot(work.onnx) == before  # staging removed, graphs and report untouched


@pytest.mark.slow
@pytest.mark.parametrize("where", ["sidecar", "exporter"])
def test_disk_full_during_export(where: str, work: Pipeline, pipeline: Pipeline, monkeypatch, capsys) -> None:
    """ENOSPC while consolidating the sidecar, or inside the exporter (no fallback to legacy)."""

    def exporter_copies(module, graph, inputs, out_path, dynamo, opset):  # a real graph, without exporting
        if where == "exporter":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(out_path).parent / f"{DECODER}.data"))
        shutil.copy(pipeline.onnx / DECODER, out_path)
        shutil.copy(pipeline.onnx / f"{DECODER}.data", Path(out_path).parent / f"{DECODER}.data")

    real_save = onnx.external_data_helper.save_external_data

    def save_until_full(tensor, base_path):
        real_save(tensor, base_path)  # some bytes reach the sidecar, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(base_path) / f"{DECODER}.data"))

    monkeypatch.setattr(exporting, "run_exporter", exporter_copies)
    monkeypatch.setattr(onnx.external_data_helper, "save_external_data", save_until_full)
    before = snapshot(work.onnx)
    result = run_inprocess(export_omnivoice, _export_argv(work, "--graphs", "decoder"), capsys)
    assert_one_line(result, EXIT_BAD_INPUT, "disk full while writing", f"{DECODER}.data", "free space and re-run")
    assert "falling back to legacy" not in result.out + result.err  # a full disk is not an exporter failure
    assert snapshot(work.onnx) == before


@pytest.mark.slow
@pytest.mark.parametrize("fault", [KeyboardInterrupt, RuntimeError], ids=["ctrl-c", "exception"])
def test_fault_mid_capture_keeps_previous_capture(fault, work: Pipeline, monkeypatch, capsys) -> None:
    real_save, calls = capture.save_npz, []

    def save_then_die(path, arrays):
        calls.append(path)
        entry = real_save(path, arrays)
        if len(calls) == 2:  # a step file is on disk in the temporary capture
            raise fault("simulated")
        return entry

    monkeypatch.setattr(capture, "save_npz", save_then_die)
    before = snapshot(work.capture)
    argv = ["--model", work.model, "--capture-dir", work.capture, "--modes", "auto", "--num-step", "2"]
    if fault is KeyboardInterrupt:
        assert_one_line(run_inprocess(capture_reference, argv, capsys), EXIT_INTERRUPTED)
    else:
        with pytest.raises(RuntimeError, match="simulated"):
            run_main(capture_reference.main, [str(a) for a in argv])
    assert len(calls) == 2
    assert snapshot(work.capture) == before
    assert sorted(p.name for p in work.capture.parent.iterdir()) == ["capture", "onnx"]  # no temporary capture


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["ctrl-c", "disk-full"])
def test_fault_mid_report_update_keeps_report(fault: str, work: Pipeline, monkeypatch, capsys) -> None:
    real_write = pathlib.Path.write_text

    def write_half_then_die(self, data, *args, **kwargs):
        if not self.name.startswith(".export-report.json.tmp"):
            return real_write(self, data, *args, **kwargs)
        real_write(self, data[: len(data) // 2], *args, **kwargs)
        if fault == "ctrl-c":
            raise KeyboardInterrupt
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    monkeypatch.setattr(pathlib.Path, "write_text", write_half_then_die)
    before = snapshot(work.onnx)
    result = run_inprocess(parity_check, parity_args(work), capsys)
    if fault == "ctrl-c":
        assert_one_line(result, EXIT_INTERRUPTED, "earlier artefacts are intact")
    else:
        assert_one_line(result, EXIT_BAD_INPUT, "disk full while writing", ".export-report.json.tmp")
    assert snapshot(work.onnx) == before  # the half-written temporary file is gone, the report untouched


@pytest.mark.slow
def test_failed_check_exits_1(work: Pipeline, capsys) -> None:
    result = run_inprocess(parity_check, parity_args(work, "--lsd-max", "0"), capsys)
    assert_one_line(result, EXIT_CHECK_FAILED, "parity failed for decoder on cpu")
    assert json.loads(_report(work).read_text())["parity"]["cpu"]["verdict"] == "FAIL"


# --- as users run them: subprocesses -----------------------------------------------------------


@pytest.mark.parametrize(
    "script,args,message",
    [
        (
            "make_reference.py",
            ["--model", "/nonexistent/omnivoice"],
            "model path /nonexistent/omnivoice does not exist",
        ),
        ("infer_onnx.py", ["--capture-dir", "/nonexistent/capture"], "capture manifest not found"),
    ],
)
def test_subprocess_one_line_no_traceback(script: str, args: list, message: str) -> None:
    done = run_script(script, *args, timeout=120)
    assert_one_line(Result(done.returncode, done.stdout, done.stderr), EXIT_BAD_INPUT, message)


def test_debug_shows_traceback() -> None:
    done = run_script("parity_check.py", "--provider", "tpu", "--debug", timeout=120)
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "UserError: unknown provider 'tpu'" in done.stderr


# Scripts whose work needs no torch until it has checked its input: their --help and every refusal
# skip torch's ~2 s import (the export and capture steps load the model, so they import it).
TORCH_FREE_SCRIPTS = (
    "parity_check.py",
    "infer_onnx.py",
    "quantize_omnivoice.py",
    "quality_omnivoice.py",
    "make_reference.py",
    "capture_reference.py",
    "bench/bench_omnivoice.py",
    "bench/bench_runtime.py",
)


def test_checking_scripts_import_no_torch_before_their_work() -> None:
    code = (
        "import runpy, sys\n"
        f"for script in {TORCH_FREE_SCRIPTS!r}:\n"
        "    runpy.run_path(script, run_name='imported')\n"
        "print(sorted(m for m in ('torch', 'transformers', 'omnivoice') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "script",
    [make_reference, capture_reference, export_omnivoice, parity_check, infer_onnx],
    ids=lambda script: script.__name__,
)
def test_help_documents_exit_codes(script, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        script.parse_args(["--help"])
    assert exited.value.code == 0
    assert "exit codes: 0 success, 1 a check ran and failed, 2 bad or missing input" in " ".join(
        capsys.readouterr().out.split()
    )


# --- the hostile sweep, one test per class -------------------------------------------


def _dead_pid() -> int:
    """The id of a process that has exited (and been reaped): what a SIGKILLed run leaves."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(
    "script,argv,message",
    [
        (make_reference, ["--num-step", "0"], "argument --num-step: 0 is out of range: an integer >= 1"),
        (capture_reference, ["--num-step", "-1"], "argument --num-step: -1 is out of range"),
        (capture_reference, ["--seed", str(2**64)], f"argument --seed: {2**64} is out of range"),
        (infer_onnx, ["--text", "Hi.", "--num-step", "0"], "argument --num-step: 0 is out of range"),
        (infer_onnx, ["--seed", str(-(2**63) - 1)], "argument --seed"),
        (infer_onnx, ["--threads", "0"], "argument --threads: 0 is out of range: an integer >= 1"),
        (parity_check, ["--threads", "-1"], "argument --threads: -1 is out of range"),
        (parity_check, ["--argmax-min", "2"], "argument --argmax-min: 2 is out of range: a finite number in [0, 1]"),
        (parity_check, ["--max-abs", "nan"], "argument --max-abs: nan is out of range"),
        (parity_check, ["--lsd-max", "-1"], "argument --lsd-max: -1 is out of range"),
        (parity_check, ["--code-match-min", "x"], "argument --code-match-min: 'x' is not a number"),
        (export_omnivoice, ["--opset", "99"], "argument --opset: 99 is out of range: an integer in [14, 22]"),
        (export_omnivoice, ["--opset", "7"], "argument --opset: 7 is out of range"),
        (
            export_omnivoice,
            ["--opset", "17"],
            "--opset 17: torch's dynamo exporter writes these graphs at opsets 18..22",
        ),
        (export_omnivoice, ["--opset", "23"], "argument --opset: 23 is out of range"),
        (export_omnivoice, ["--opset", "21", "--no-dynamo"], "legacy exporter writes these graphs at opsets 14..20"),
        (export_omnivoice, ["--bogus"], "unrecognized arguments: --bogus"),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
def test_flag_out_of_range_refused_at_once(script, argv: list, message: str, tmp_path: Path, capsys) -> None:
    """Every numeric flag is range-checked when parsed (argparse errors are one line too), before
    any model loads: `--num-step 0` used to reach onnxruntime as a Gather index error."""
    result = run_inprocess(script, [*argv, "--capture-dir", tmp_path / "capture"], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, message)
    assert "usage:" not in result.err
    assert sorted(tmp_path.iterdir()) == []


def test_seed_range_is_torchs() -> None:
    """The seed flags accept exactly what torch.manual_seed accepts."""
    import torch

    from omnivoice_onnx.limits import SEED_MAX, SEED_MIN
    from omnivoice_onnx.program import SEED

    for seed in (SEED_MIN, SEED_MAX):
        torch.manual_seed(SEED(str(seed)))
    for seed in (SEED_MIN - 1, SEED_MAX + 1):
        with pytest.raises((RuntimeError, ValueError)):  # torch raises either, by the side
            torch.manual_seed(seed)
    torch.manual_seed(0)


@pytest.mark.parametrize(
    "script,argv",
    [
        (export_omnivoice, ["--graphs", "decoder,decoder"]),
        (parity_check, ["--graphs", "encoder,decoder,encoder"]),
        (capture_reference, ["--modes", "auto, auto"]),
    ],
    ids=["export", "parity", "capture"],
)
def test_repeated_subset_entries_refused(script, argv: list, tmp_path: Path, capsys) -> None:
    """`--graphs decoder,decoder` exported the decoder twice into one staging file, installed it
    once, then failed on the second install after the report's sidecar had been replaced."""
    result = run_inprocess(script, [*argv, "--capture-dir", tmp_path / "capture"], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, "given more than once", "at most once")


def _unwritable_dir(path: Path, monkeypatch) -> Path:
    """A folder this process may not create files in: mode 0555, and for root (whom the mode does
    not stop) creating a file there raises EACCES, as the kernel answers any other user."""
    path.mkdir(mode=0o555)
    if os.geteuid() == 0:
        real_mkstemp = tempfile.mkstemp

        def mkstemp(*args, dir=None, **kwargs):
            if dir is not None and Path(dir) == path:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(Path(dir) / ".write-test"))
            return real_mkstemp(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    return path


@pytest.mark.parametrize(
    "case",
    [
        "out-is-dir",
        "out-in-file",
        "out-unwritable",
        "out-dir-is-file",
        "capture-dir-is-file",
        "onnx-dir-is-file",
        "onnx-dir-unwritable",
    ],
)
def test_output_checked_before_any_work(case: str, tmp_path: Path, monkeypatch, capsys) -> None:
    """`--out`, `--out-dir`, `--capture-dir` (written) and `--onnx-dir` are checked when the run
    starts: synthesis used to fail only after generating, with a traceback; a file given as
    --capture-dir was silently replaced by the capture."""
    a_file = tmp_path / "a-file"
    a_file.write_text("keep me\n")
    script, argv, message = {
        "out-is-dir": (infer_onnx, ["--text", "Hi.", "--out", tmp_path], "is a directory"),
        "out-in-file": (infer_onnx, ["--text", "Hi.", "--out", a_file / "out.wav"], "is not a directory"),
        "out-unwritable": (
            infer_onnx,
            ["--text", "Hi.", "--out", _unwritable_dir(tmp_path / "ro", monkeypatch) / "out.wav"]
            if case == "out-unwritable"
            else [],
            "cannot create files in",
        ),
        "out-dir-is-file": (make_reference, ["--out-dir", a_file], "--out-dir"),
        "capture-dir-is-file": (capture_reference, ["--modes", "auto", "--capture-dir", a_file], "--capture-dir"),
        "onnx-dir-is-file": (export_omnivoice, ["--onnx-dir", a_file], "--model-dir"),
        "onnx-dir-unwritable": (
            parity_check,
            ["--onnx-dir", _unwritable_dir(tmp_path / "ro", monkeypatch)] if case == "onnx-dir-unwritable" else [],
            "cannot create files in",
        ),
    }[case]
    model = [] if script is parity_check else ["--model", "/nonexistent/model"]  # parity reads the report's
    result = run_inprocess(script, [*argv, *model], capsys)
    line = assert_one_line(result, EXIT_BAD_INPUT, message)
    assert "model path /nonexistent/model" not in line  # refused before the model was even resolved
    assert a_file.read_text() == "keep me\n"


def test_sigterm_unwinds_like_ctrl_c(tmp_path: Path, capsys) -> None:
    """SIGTERM raises in the main thread, so every `finally` runs: no temporary file is left."""
    target = tmp_path / "artefact.json"

    def killed_while_writing(argv) -> None:
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal arrives first

    result = run_inprocess(SimpleNamespace(main=killed_while_writing), [], capsys)
    assert_one_line(result, EXIT_TERMINATED, "nothing half-written was kept")
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is scoped to the run


def test_stale_temporaries_of_dead_runs_removed(tmp_path: Path) -> None:
    """What a killed run left (staging directory, temporary report) goes with the next write;
    a live run's staging stays; a directory renamed aside an instant before the kill comes back."""
    dead, live = _dead_pid(), os.getppid()
    onnx_dir = tmp_path / "onnx"
    onnx_dir.mkdir()
    (onnx_dir / f".staging.tmp-{dead}").mkdir()
    (onnx_dir / f".staging.tmp-{dead}" / "omnivoice_transformer.onnx.data").write_bytes(b"\0" * 1000)
    (onnx_dir / f".staging.tmp-{live}").mkdir()
    (onnx_dir / f".export-report.json.tmp-{dead}").write_text("{")
    (tmp_path / f".capture.old-{dead}").mkdir()
    (tmp_path / f".capture.old-{dead}" / "manifest.json").write_text("{}")
    with temporary_dir(onnx_dir / "staging") as staging:
        assert staging.name.startswith(f".staging.tmp-{os.getpid()}-")
        assert sorted(p.name for p in onnx_dir.iterdir()) == sorted(
            [f".staging.tmp-{live}", staging.name, f".export-report.json.tmp-{dead}"]
        )
    with atomic_path(onnx_dir / "export-report.json") as tmp:
        tmp.write_text("{}")
    assert sorted(p.name for p in onnx_dir.iterdir()) == sorted([f".staging.tmp-{live}", "export-report.json"])
    with temporary_dir(tmp_path / "capture"):
        pass
    assert (tmp_path / "capture" / "manifest.json").read_text() == "{}"  # restored, not deleted


def test_broken_pipe_exits_quietly(capsys) -> None:
    def reader_gone(argv) -> None:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    result = run_inprocess(SimpleNamespace(main=reader_gone), [], capsys)
    assert (result.code, result.err) == (EXIT_BROKEN_PIPE, "")


def test_disk_full_names_the_file(tmp_path: Path, monkeypatch, capsys) -> None:
    """A write through a file object raises ENOSPC without a file name; the line must name it."""
    real_write_bytes = pathlib.Path.write_bytes

    def write_until_full(self, data):
        if ".out.wav.tmp-" not in self.name:
            return real_write_bytes(self, data)
        real_write_bytes(self, data[:100])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as file.write raises it: no name

    monkeypatch.setattr(pathlib.Path, "write_bytes", write_until_full)
    out = tmp_path / "out.wav"
    result = run_inprocess(SimpleNamespace(main=lambda argv: write_wav(out, np.zeros(2400, np.float32))), [], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, f"disk full while writing {out}", "free space and re-run")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kind,message",
    [
        ("directory", "is a directory, not a file"),
        ("symlink-loop", "Too many levels of symbolic links"),
        ("dangling-symlink", "is a symlink to a missing file"),
        ("all-nan", "has 72000 NaN or infinite samples"),
        ("some-nan", "has 100 NaN or infinite samples (first at 0.042 s)"),
        ("inf", "has 2 NaN or infinite samples"),
    ],
)
def test_reference_audio_paths_and_samples(kind: str, message: str, tmp_path: Path) -> None:
    """A directory or a symlink loop used to be "not found"; NaN and inf samples used to be
    accepted (or, all NaN, end in upstream's advice to set preprocess_prompt=False)."""
    ref = tmp_path / "ref.wav"
    speech = (0.3 * np.sin(np.linspace(0, 2000, 24000 * 3))).astype(np.float32)
    if kind == "directory":
        ref.mkdir()
    elif kind == "symlink-loop":
        ref.symlink_to(ref)
    elif kind == "dangling-symlink":
        ref.symlink_to(tmp_path / "gone.wav")
    else:
        if kind == "all-nan":
            speech[:] = np.nan
        elif kind == "some-nan":
            speech[1000:1100] = np.nan
        else:
            speech[[5000, 6000]] = [np.inf, -np.inf]
        soundfile.write(ref, speech, 24000, subtype="FLOAT")
    with pytest.raises(UserError, match=re.escape(message)) as raised:
        check_reference_audio(ref)
    assert raised.value.fix


def test_upstream_silence_message_translated(torch_model) -> None:
    """Upstream's real message for a reference left empty by its silence removal advises a
    generate() argument the scripts do not have; it is said in the CLI's terms."""
    with pytest.raises(ValueError) as raised:
        torch_model.create_voice_clone_prompt(
            ref_audio=(np.full((1, 24000), np.nan, np.float32), 24000), ref_text="hello"
        )
    error = generation._upstream_error(str(raised.value), GenerationRequest(mode="clone", text="x", ref_audio="r.wav"))
    assert error is not None and "preprocess_prompt" not in str(error)
    assert "reference audio r.wav has no sound left after upstream's silence removal" in error.problem
    assert error.fix == generation.REFERENCE_FIX
    assert (
        generation._upstream_error(
            "zero-size array to reduction operation maximum", GenerationRequest(mode="auto", text="x")
        )
        is None
    )  # any other ValueError is a bug: not turned into advice


# Hand-edited artefacts whose sha256 was re-recorded: every integrity check passes, the readers'
# schemas must refuse them.


def _rehash_capture_file(p: Pipeline, mode: str, name: str) -> None:
    path = p.capture / mode / name
    edit_json(
        p.capture / "manifest.json",
        lambda m: m["modes"][mode]["files"][name].update(sha256=sha256_file(path), bytes=path.stat().st_size),
    )
    _rehash_manifest(p)


def _rehash_manifest(p: Pipeline) -> None:
    edit_json(_report(p), lambda r: r["capture"].update(manifest_sha256=sha256_file(p.capture / "manifest.json")))


def _truncate_npz(p: Pipeline) -> None:
    path = p.capture / "auto" / capture.DECODER_FILE
    replace_file(path, path.read_bytes()[:3000])
    _rehash_capture_file(p, "auto", capture.DECODER_FILE)


def _drop_npz_array(p: Pipeline) -> None:
    path = p.capture / "auto" / capture.DECODER_FILE
    arrays = dict(np.load(path))
    del arrays["audio_values"]
    path.unlink()
    np.savez(path, **arrays)
    _rehash_capture_file(p, "auto", capture.DECODER_FILE)


def _edit_manifest(change):
    def damage(p: Pipeline) -> None:
        edit_json(p.capture / "manifest.json", change)
        _rehash_manifest(p)

    return damage


HAND_EDITED = {  # case -> (damage, message)
    "report-no-model-path": (
        lambda p: edit_json(_report(p), lambda r: r["model"].pop("path")),
        "export report",
        "is malformed: model.path is missing",
    ),
    "report-model-null": (
        lambda p: edit_json(_report(p), lambda r: r.update(model=None)),
        "export report",
        "is malformed: model is null, expected an object",
    ),
    "report-entry-no-bytes": (
        lambda p: edit_json(_report(p), lambda r: r["graphs"]["decoder"]["files"][DECODER].pop("bytes")),
        "export report",
        'graphs.decoder.files["higgs_decoder.onnx"].bytes is missing',
    ),
    "report-opset-string": (
        lambda p: _set_graph_entry(p, opset="18"),
        "export report",
        "graphs.decoder.opset is a string, expected an integer",
    ),
    "report-graph-files-swapped": (
        lambda p: edit_json(_report(p), lambda r: r["graphs"].update(decoder=r["graphs"]["encoder"])),
        "export report",
        "graphs.decoder lists",
    ),
    "report-format-2": (
        lambda p: edit_json(_report(p), lambda r: r.update(format=2)),
        "export report",
        "is of format 2, not 1: it is from another version",
    ),
    "manifest-reference-null": (
        _edit_manifest(lambda m: m.update(reference=None)),
        "capture manifest",
        "reference is null, expected an object",
    ),
    "manifest-clone-without-reference-hash": (
        _edit_manifest(lambda m: m["reference"].update(wav_sha256=None)),
        "capture manifest",
        "reference.wav_sha256 is null, but the clone",
    ),
    "manifest-request-num-step-0": (
        _edit_manifest(lambda m: m["modes"]["auto"]["request"].update(num_step=0)),
        "capture manifest",
        "modes.auto.request.num_step is 0",
    ),
    "manifest-a-list": (_edit_manifest(lambda m: m.clear()), "capture manifest", "is of format None"),
    "npz-truncated": (_truncate_npz, "capture file", "decoder.npz is damaged (BadZipFile"),
    "npz-array-missing": (_drop_npz_array, "capture file", "has no array 'audio_values' (it has audio_codes)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", HAND_EDITED)
def test_hand_edited_artefact_refused(case: str, work: Pipeline, capsys) -> None:
    damage, what, message = HAND_EDITED[case]
    damage(work)
    before = snapshot(work.onnx)
    result = run_inprocess(parity_check, parity_args(work), capsys)
    line = assert_one_line(result, EXIT_BAD_INPUT, what, message)
    assert re.search(r"; (re-)?run (capture_reference|export_omnivoice)\.py", line)
    assert snapshot(work.onnx) == before


@pytest.mark.slow
def test_compare_refuses_manifest_without_reference(work: Pipeline, capsys) -> None:
    HAND_EDITED["manifest-reference-null"][0](work)
    result = run_inprocess(infer_onnx, ["--capture-dir", work.capture, "--onnx-dir", work.onnx], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, "reference is null", "capture_reference.py")


def _deny_reading(path: Path, monkeypatch) -> None:
    """Make `path` unreadable: mode 0, and for root (whom the mode does not stop) opening it
    raises EACCES, as the kernel answers any other user."""
    path.chmod(0)
    if os.geteuid() != 0:
        return
    target = os.path.realpath(path)
    real_open = io.open

    def guarded_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == target:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(io, "open", guarded_open)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["manifest.json", "export-report.json", DECODER, f"{DECODER}.data"])
def test_unreadable_artefact_says_permissions(name: str, work: Pipeline, monkeypatch, capsys) -> None:
    """Permission denied used to be a traceback (manifest, report, sidecar) or "re-run export"
    (the graph); the fix is the file's permissions."""
    path = work.capture / name if name == "manifest.json" else work.onnx / name
    replace_file(path, path.read_bytes())  # a real file in the symlinked capture
    _deny_reading(path, monkeypatch)
    result = run_inprocess(parity_check, parity_args(work), capsys)
    assert_one_line(
        result,
        EXIT_BAD_INPUT,
        str(path),
        "Permission denied" if name != f"{DECODER}.data" else "permission denied",
        "chmod/chown",
    )


@pytest.mark.slow
def test_graph_returning_nan_named(work: Pipeline, tmp_path: Path, capsys) -> None:
    """A sidecar overwritten with random bytes (its sha256 re-recorded) loads and returns NaN; it
    used to end in numpy's "zero-size array to reduction operation" relayed as advice."""
    sidecar = work.onnx / f"{DECODER}.data"
    replace_file(sidecar, np.random.default_rng(0).bytes(sidecar.stat().st_size))
    edit_json(
        _report(work), lambda r: r["graphs"]["decoder"]["files"][f"{DECODER}.data"].update(sha256=sha256_file(sidecar))
    )
    result = run_inprocess(infer_onnx, synth_args(work, tmp_path, "--text", "Hello there."), capsys)
    assert_one_line(
        result, EXIT_BAD_INPUT, "the decoder graph", "returned NaN or infinite values", "export_omnivoice.py"
    )
    assert not (tmp_path / "out.wav").exists()


@pytest.mark.slow
def test_opset_the_converter_missed_refused(work: Pipeline, monkeypatch, capsys) -> None:
    """dynamo cannot convert the transformer below opset 18 and keeps 18 with a logged error;
    the report and metadata then said 17. Allowed through the up-front range, the written opset
    is still checked: one line, nothing installed."""
    monkeypatch.setitem(exporting.EXPORTER_OPSETS, "dynamo", range(17, 23))
    before = snapshot(work.onnx)
    result = run_inprocess(export_omnivoice, _export_argv(work, "--graphs", "transformer", "--opset", "17"), capsys)
    assert_one_line(
        result,
        EXIT_BAD_INPUT,
        "--opset 17: torch's dynamo exporter could not convert the transformer graph to opset 17 (it wrote opset 18)",
        "use an opset in 18..22",
    )
    assert snapshot(work.onnx) == before


@pytest.mark.slow
def test_sigterm_mid_export_keeps_export_and_leaves_nothing(work: Pipeline, tmp_path: Path) -> None:
    """`kill` of an export used to leave its staging directory (GBs at full size) behind."""
    before = snapshot(work.onnx)
    with open(tmp_path / "stderr.txt", "w+") as stderr:  # a file: torch's warnings would fill a pipe
        proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "export_omnivoice.py"),
                *map(str, _export_argv(work, "--graphs", "transformer")),
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        deadline = time.monotonic() + 300
        while not list(work.onnx.glob(".staging.tmp-*")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(0.5)  # inside the exporter (the transformer's export takes ~6 s on tiny)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
        stderr.seek(0)
        err = stderr.read()
    assert proc.returncode == EXIT_TERMINATED, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and last.startswith("terminated (SIGTERM)"), last
    if "too late to stop the run" in last:  # a library's bare `except:` swallowed it: the export completed
        assert not list(work.onnx.glob(".*"))
        report.verify_graphs(work.onnx, report.load_report(work.onnx), ["transformer"])
    else:
        assert snapshot(work.onnx) == before  # no staging directory, graphs and report untouched


def test_swallowed_sigterm_reported_when_the_run_ends(capsys) -> None:
    """A SIGTERM that lands in a library's bare `except:` does not stop the run; run_main still
    ends it with 143 and says the run completed."""

    def swallowing_library(argv) -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal arrives first
        except BaseException:  # noqa: BLE001 - the library's bare `except:`
            pass

    result = run_inprocess(SimpleNamespace(main=swallowing_library), [], capsys)
    assert_one_line(result, EXIT_TERMINATED, "too late to stop the run, which completed")


@pytest.mark.slow
def test_closed_stdout_exits_quietly(work: Pipeline) -> None:
    """`parity_check.py | head -1`: no BrokenPipeError traceback, the code of a SIGPIPE'd tool."""
    before = snapshot(work.onnx)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "parity_check.py"), *map(str, parity_args(work))],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read()
    proc.wait(timeout=300)
    assert proc.returncode == EXIT_BROKEN_PIPE, err[-2000:]
    assert err.strip() == ""
    assert snapshot(work.onnx) == before
