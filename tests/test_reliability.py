"""Issue 8: wrong paths, stale captures, damaged artefacts, bad inputs and faults end in one line.

Each case checks the exit code (2 bad input, 1 failed check, 130 Ctrl-C), that stderr holds
exactly one error line naming the problem and the fix, that no traceback is printed, and, for
faults, that the previous complete artefacts are intact and no temporary file is left behind.

Most runs are in-process (`run_main(script.main, argv)`: no re-import of torch) on copies of the
session pipeline; a few run as subprocesses, as users run them. Damaged copies of the 700 MB
capture are symlink trees: a damaged file is unlinked and rewritten, never written through.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import soundfile

import capture_reference
import export_omnivoice
import infer_onnx
import make_reference
import parity_check
from conftest import Pipeline, run_script
from omnivoice_export import capture, exporting
from omnivoice_export.checkpoints import REQUIRED_FILES
from omnivoice_export.files import sha256_file
from omnivoice_export.cli import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_INTERRUPTED, run_main
from omnivoice_export.generation import REFERENCE_TEXT, check_reference_audio

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
    prefix = "FAILED: " if code == EXIT_CHECK_FAILED else "interrupted: " if code == EXIT_INTERRUPTED else "error: "
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
    """Every file under `directory` (hidden ones included) -> sha256."""
    return {str(p.relative_to(directory)): sha256_file(p) for p in sorted(directory.rglob("*")) if p.is_file()}


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
    "truncated-weights": (lambda m, tiny: replace_file(m / "model.safetensors",
                                                       (tiny / "model.safetensors").read_bytes()[:100_000]),
                          "model.safetensors is truncated or corrupt"),
    "garbage-weights": (lambda m, _: replace_file(m / "audio_tokenizer/model.safetensors", b"not a tensor file" * 99),
                        "is not a valid safetensors file"),
    "not-omnivoice-config": (lambda m, _: replace_file(m / "config.json", b'{"model_type": "qwen3"}'),
                             "is not an OmniVoice config"),
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


REFERENCE_ERRORS = {"missing": "audio file not found", "empty": "is an empty file", "no-samples": "has no samples",
                    "silent": "is silent", "not-audio": "is not a readable audio file"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", REFERENCE_ERRORS)
def test_reference_audio_refused_synthesis(kind: str, pipeline: Pipeline, tmp_path: Path, capsys) -> None:
    ref = _write_reference(tmp_path / "ref.wav", kind)
    result = run_inprocess(infer_onnx, synth_args(pipeline, tmp_path, "--text", "Hello there.", "--ref-audio", ref,
                                                  "--ref-text", REFERENCE_TEXT), capsys)
    assert_one_line(result, EXIT_BAD_INPUT, REFERENCE_ERRORS[kind], "3-10 s of clear speech")
    assert not (tmp_path / "out.wav").exists()


@pytest.mark.parametrize("case,message", [
    ("wav-missing", "clone mode needs"), ("txt-missing", "clone mode needs"), ("txt-empty", "ref_voice.txt is empty"),
    ("wav-silent", "is silent"), ("wav-not-audio", "is not a readable audio file")])
def test_reference_refused_capture(case: str, message: str, tiny_model: Path, tmp_path: Path, capsys) -> None:
    """capture_reference.py checks capture/ref_voice.{wav,txt} before loading the model."""
    ref_dir = tmp_path / "capture"
    ref_dir.mkdir()
    _write_reference(ref_dir / "ref_voice.wav", {"wav-silent": "silent", "wav-not-audio": "not-audio"}.get(case, "good"))
    (ref_dir / "ref_voice.txt").write_text("" if case == "txt-empty" else REFERENCE_TEXT)
    if case == "wav-missing":
        (ref_dir / "ref_voice.wav").unlink()
    if case == "txt-missing":
        (ref_dir / "ref_voice.txt").unlink()
    result = run_inprocess(capture_reference, ["--model", tiny_model, "--capture-dir", ref_dir, "--modes", "clone",
                                               "--num-step", "2"], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capture"]  # no temporary capture left behind


@pytest.mark.parametrize("kind,level,fragment", [
    ("stereo", "note", "has 2 channels; they are averaged to mono"),
    ("16khz", "note", "is 16000 Hz; it is resampled to 24000 Hz"),
    ("long", "warning", "is 24.0 s long (> 20 s)")])
def test_reference_accepted_with_one_line(kind: str, level: str, fragment: str, tmp_path: Path, capsys) -> None:
    check_reference_audio(_write_reference(tmp_path / "ref.wav", kind))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{level}: ") and fragment in lines[0], lines


@pytest.mark.slow
def test_reference_stereo_8khz_synthesizes(pipeline: Pipeline, tmp_path: Path, capsys) -> None:
    ref = tmp_path / "ref.wav"
    audio, _ = soundfile.read(pipeline.capture / "ref_voice.wav", dtype="float32")
    soundfile.write(ref, np.stack([audio, audio], axis=1)[::3][: 16000 * 4], 8000)  # 8 kHz stereo
    result = run_inprocess(infer_onnx, synth_args(pipeline, tmp_path, "--text", "Hello there.", "--ref-audio", ref,
                                                  "--ref-text", REFERENCE_TEXT), capsys)
    assert result.code == 0, result.err
    assert "note: reference audio" in result.err and "2 channels" in result.err and "8000 Hz" in result.err
    assert soundfile.info(tmp_path / "out.wav").frames > 0


# --- capture -----------------------------------------------------------------------------------

def _first_step(p: Pipeline) -> Path:
    return p.capture / "clone" / capture.STEP_FILE.format(0)


def _flip_middle_byte(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]


CAPTURE_CASES = {
    "missing": (lambda p: shutil.rmtree(p.capture), "capture manifest not found"),
    "manifest-not-json": (lambda p: replace_file(p.capture / "manifest.json", b'{"format": 1, "mod'),
                          "capture manifest is not valid JSON"),
    "manifest-malformed": (lambda p: edit_json(p.capture / "manifest.json", lambda m: m.pop("model")),
                           "is malformed or from another version"),
    "partial": (lambda p: _first_step(p).unlink(), "capture is incomplete"),
    "hash-mismatch": (lambda p: replace_file(_first_step(p), _flip_middle_byte(_first_step(p).read_bytes())),
                      "does not match its recorded sha256"),
    "other-model": (lambda p: edit_json(p.capture / "manifest.json",
                                        lambda m: m["model"].update(fingerprint="sha256:0123456789abcdef")),
                    "the capture is of model sha256:0123456789abcdef but the export of"),
    "other-generation-config": (lambda p: edit_json(p.capture / "manifest.json", lambda m: m.update(seed=7)),
                                "is not the one the export was made from"),
}


@pytest.mark.slow
def test_capture_of_other_model_refused_by_export(work: Pipeline, capsys) -> None:
    CAPTURE_CASES["other-model"][0](work)
    before = snapshot(work.onnx)
    result = run_inprocess(export_omnivoice, ["--model", work.model, "--capture-dir", work.capture,
                                              "--onnx-dir", work.onnx], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, "the capture was made with model sha256:0123456789abcdef")
    assert snapshot(work.onnx) == before


@pytest.mark.slow
@pytest.mark.parametrize("flags,message", [
    (["--num-step", "8"], "--num-step 8 differs from the capture's 32"),
    (["--seed", "7"], "--seed 7 differs from the capture's"),
    (["--instruct", "male"], "--instruct only apply to synthesis mode")])
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
    "data-truncated": (lambda p: replace_file(p.onnx / f"{DECODER}.data",
                                              (p.onnx / f"{DECODER}.data").read_bytes()[:1000]),
                       "does not match the export report's sha256"),
    "data-from-another-export": (lambda p: replace_file(p.onnx / f"{DECODER}.data",
                                                        bytes(reversed((p.onnx / f"{DECODER}.data").read_bytes()))),
                                 "does not match the export report's sha256"),
    "graph-not-onnx": (lambda p: replace_file(p.onnx / DECODER, b"\xff" * 64), "is not a readable ONNX graph"),
    "other-opset": (lambda p: _set_graph_entry(p, opset=20), "at opset 18 of model"),
    "other-exporter": (lambda p: _set_graph_entry(p, exporter="legacy"), "by the dynamo exporter"),
    "report-missing": (lambda p: _report(p).unlink(), "export report not found"),
    "report-not-json": (lambda p: replace_file(_report(p), _report(p).read_bytes()[:200]),
                        "export report is not valid JSON"),
    "report-malformed": (lambda p: edit_json(_report(p), lambda r: r["graphs"]["decoder"].pop("files")),
                         "is malformed or from another version"),
}


DAMAGE_CASES = {**{f"capture-{k}": v for k, v in CAPTURE_CASES.items()}, **{f"onnx-{k}": v for k, v in ONNX_CASES.items()}}


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
    result = run_inprocess(export_omnivoice, ["--model", work.model, "--capture-dir", work.capture,
                                              "--onnx-dir", work.onnx, "--graphs", "decoder"], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, "cannot add decoder to the existing export", "omit --graphs")
    assert snapshot(work.onnx) == before


# --- providers ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("script", [parity_check, infer_onnx], ids=["parity", "infer"])
@pytest.mark.parametrize("provider,message", [
    ("cuda-fp32", "needs onnxruntime's CUDAExecutionProvider"), ("tpu", "unknown provider 'tpu'")])
def test_provider_refused(script, provider: str, message: str, pipeline: Pipeline, capsys) -> None:
    import onnxruntime

    if provider.startswith("cuda") and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA EP")
    result = run_inprocess(script, ["--provider", provider, "--capture-dir", pipeline.capture,
                                    "--onnx-dir", pipeline.onnx], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, message, "requirements-gpu.txt" if "cuda" in provider else "cpu")


# --- synthesis inputs --------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("flags,message,fix", [
    (["--text", ""], "--text is empty", "pass the text"),
    (["--text", "   "], "--text is empty", "pass the text"),
    (["--text", "Hello.", "--language", "Klingon"], "unknown language 'Klingon'", "None for language-agnostic"),
    (["--text", "Hello.", "--instruct", "mal, low pitch"], "did you mean 'male'?", "Valid English items: ")])
def test_synthesis_input_refused(flags: list, message: str, fix: str, pipeline: Pipeline, tmp_path: Path,
                                 capsys) -> None:
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
        assert_one_line(run_inprocess(export_omnivoice, _export_argv(work), capsys), EXIT_INTERRUPTED,
                        "earlier artefacts are intact")
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

@pytest.mark.parametrize("script,args,message", [
    ("make_reference.py", ["--model", "/nonexistent/omnivoice"], "model path /nonexistent/omnivoice does not exist"),
    ("infer_onnx.py", ["--capture-dir", "/nonexistent/capture"], "capture manifest not found"),
])
def test_subprocess_one_line_no_traceback(script: str, args: list, message: str) -> None:
    done = run_script(script, *args, timeout=120)
    assert_one_line(Result(done.returncode, done.stdout, done.stderr), EXIT_BAD_INPUT, message)


def test_debug_shows_traceback() -> None:
    done = run_script("parity_check.py", "--provider", "tpu", "--debug", timeout=120)
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "UserError: unknown provider 'tpu'" in done.stderr


@pytest.mark.parametrize("script", [make_reference, capture_reference, export_omnivoice, parity_check, infer_onnx],
                         ids=lambda script: script.__name__)
def test_help_documents_exit_codes(script, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        script.parse_args(["--help"])
    assert exited.value.code == 0
    assert "exit codes: 0 success, 1 a check ran and failed, 2 bad or missing input" in " ".join(capsys.readouterr().out.split())
