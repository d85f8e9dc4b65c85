"""`omnivoice-onnx speak` and the command's frame (omnivoice_onnx.__main__): input, output, flags, exit codes.

Fast tests check what happens before a model is loaded (they pass a model folder that does not
exist: a refusal about the output or the text proves it came first); slow ones speak with the tiny
export, as a user runs the command (a subprocess, stdin and stdout pipes)."""

from __future__ import annotations

import io
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
from conftest import REPO, Pipeline

from omnivoice_onnx import OmniVoiceOnnx, Progress, __version__
from omnivoice_onnx import __main__ as program
from omnivoice_onnx.audio_formats import to_pcm16
from omnivoice_onnx.cli import speak
from omnivoice_onnx.core.prompt import resolve_language
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.program import run_main

LONG = (
    "The first sentence sets the scene. A second one follows it closely, with a few more words. "
    "And a third one ends the paragraph here."
)


def command(*args: str, stdin: bytes | None = b"", cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omnivoice_onnx", *map(str, args)],
        input=stdin,
        cwd=cwd,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def one_error_line(done: subprocess.CompletedProcess, fragment: str) -> None:
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr.decode()
    assert lines[0].startswith("omnivoice-onnx: error: ") and fragment in lines[0], lines[0]


def test_version_and_help() -> None:
    assert command("--version").stdout.decode().strip() == f"omnivoice-onnx {__version__}"
    top = command("--help").stdout.decode()  # for users: the commands and examples, not how modules register
    assert "wyoming" in top and "serve" in top and "seed" in top
    assert not [word for word in ("SUBCOMMANDS", "add_parser", "import their heavy") if word in top], top
    text = command("speak", "--help").stdout.decode()
    for flag in (
        "--text-file",
        "--out",
        "--raw",
        "--stream",
        "--language",
        "--instruct",
        "--ref-audio",
        "--ref_audio",
        "--ref-text",
        "--ref_text",
        "--voice",
        "--voices",
        "--speed",
        "--duration",
        "--num-step",
        "--guidance-scale",
        "--seed",
        "--variant",
        "--threads",
        "--provider",
        "--model-dir",
        "--quiet",
        "--strict-instructions",
        ".mp3",
        "exit codes",
    ):
        assert flag in text, flag
    # What each serves, in its own words (no docs/ file, which a wheel does not install).
    assert "POST /v1/audio/speech" in command("serve", "--help").stdout.decode()
    assert "Home Assistant" in command("wyoming", "--help").stdout.decode()


@pytest.mark.parametrize(
    "args,stdin,fragment",
    [
        (["Hi.", "--out", "x.aac"], b"", "extension '.aac'"),
        (["Hi.", "--speed", "5", "--out", "x.wav"], b"", "--speed: 5 is out of range: a finite number in [0.25, 4.0]"),
        (["Hi.", "--raw", "--out", "x.wav"], b"", "--raw writes to stdout"),
        (["--out", "x.wav"], b"  \n", "the text to speak is empty"),
        (["Hi.", "--text-file", "t.txt", "--out", "x.wav"], b"", "both TEXT and --text-file"),
        (["Hi.", "--ref-audio", "r.wav", "--out", "x.wav"], b"", "needs both --ref-audio and --ref-text"),
        (["Hi.", "--num-step", "0", "--out", "x.wav"], b"", "--num_step: 0 is out of range"),
        (["Hi.", "--out", "x.wav"], b"", "export folder not found: missing-model"),
        (
            ["Hi.", "--out", "no/such/x.wav"],
            b"",
            "the folder no/such does not exist; create it first (mkdir -p no/such)",
        ),
    ],
)
def test_refused_before_any_work(args: list[str], stdin: bytes, fragment: str, tmp_path: Path) -> None:
    done = command("speak", *args, "--model-dir", "missing-model", stdin=stdin, cwd=tmp_path)
    one_error_line(done, fragment)
    assert os.listdir(tmp_path) == []


def test_text_sources(tmp_path: Path) -> None:
    class Stdin(io.StringIO):
        def isatty(self) -> bool:
            return False

    def args(text=None, text_file=None):
        return type("Args", (), {"text": text, "text_file": text_file})

    (tmp_path / "t.txt").write_text("From a file.\n", encoding="utf-8")
    assert speak.read_text(args("Hello."), Stdin("")) == "Hello."
    assert speak.read_text(args("-"), Stdin("From stdin.\n")) == "From stdin."
    assert speak.read_text(args(), Stdin("Piped.\n")) == "Piped."
    assert speak.read_text(args(text_file=tmp_path / "t.txt"), Stdin("")) == "From a file."
    tty = Stdin("")
    tty.isatty = lambda: True
    with pytest.raises(UserError, match="no text to speak"):
        speak.read_text(args(), tty)


def test_language_tags() -> None:
    languages = {"ids": ["en", "pt", "zh", "he", "fil"], "name_to_id": {"english": "en"}}
    for tag, expected in [
        ("en-US", "en"),
        ("pt_BR", "pt"),
        ("zh-Hant-TW", "zh"),
        ("EN", "en"),
        ("iw", "he"),
        ("tl", "fil"),
        ("English", "en"),
        ("None", None),
        (None, None),
    ]:
        assert resolve_language(tag, languages) == expected, tag
    for bad in ("xx-US", "english-US", "e"):
        with pytest.raises(UserError, match="unknown language"):
            resolve_language(bad, languages)


def test_progress_line_and_summary() -> None:
    err = io.StringIO()
    reporter = speak.Reporter(True, True, err)
    reporter.progress(Progress(chunk=1, chunks=2, step=3, steps=4))
    reporter.summary(2.0, 42, "x.wav")
    text = err.getvalue()
    assert "chunk 1/2 step 3/4" in text and "ETA" in text
    assert text.rstrip().split("\x1b[K")[-1].startswith("omnivoice-onnx: 2.00 s of audio in ")
    assert "RTF" in text and "model loaded in" in text and "seed 42 -> x.wav" in text
    quiet = io.StringIO()
    speak.Reporter(False, False, quiet).progress(Progress(1, 1, 1, 1))
    assert quiet.getvalue() == ""
    logged = io.StringIO()  # stderr not a terminal: no progress line, the summary alone
    reporter = speak.Reporter(True, False, logged)
    reporter.progress(Progress(chunk=1, chunks=1, step=1, steps=4))
    reporter.summary(0.0, 7, "x.wav")
    assert logged.getvalue().startswith("omnivoice-onnx: 0.00 s of audio") and logged.getvalue().count("\n") == 1
    assert "\r" not in logged.getvalue() and "nan" not in logged.getvalue() and "inf" not in logged.getvalue()


@pytest.mark.parametrize(
    "raised,code,fragment",
    [
        (MemoryError(), 2, "out of memory"),
        (KeyboardInterrupt(), 130, "interrupted"),
        (UserError("bad", "fix"), 2, "bad; fix"),
        (BrokenPipeError(), 141, None),
    ],
)
def test_error_mapping(raised: BaseException, code: int, fragment: str | None, capsys) -> None:
    def main(argv) -> None:
        raise raised

    with pytest.raises(SystemExit) as exit_:
        run_main(main, [], prog="omnivoice-onnx")
    assert exit_.value.code == code
    err = capsys.readouterr().err.strip()
    if fragment is None:
        assert err == ""
    else:
        assert len(err.splitlines()) == 1 and err.startswith("omnivoice-onnx: ") and fragment in err


def test_missing_subcommand_modules_are_skipped(monkeypatch) -> None:
    monkeypatch.setattr(program, "SUBCOMMANDS", ("speak", "not-written-yet"))
    assert list(program.subcommand_modules()) == ["speak"]


# --- speaking with the tiny export ---------------------------------------------------------------


@pytest.mark.slow
def test_speak_stdin_to_wav_is_generate(pipeline: Pipeline, tmp_path: Path) -> None:
    done = command(
        "speak",
        "--out",
        "x.wav",
        "--model-dir",
        pipeline.onnx,
        "--num-step",
        "4",
        "--seed",
        "9",
        "--language",
        "en-US",
        stdin=b"Hello there.\n",
        cwd=tmp_path,
    )
    assert done.returncode == 0 and done.stdout == b"", done.stderr.decode()
    (line,) = done.stderr.decode().splitlines()  # stderr is a pipe: the summary, no progress line
    assert line.startswith("omnivoice-onnx: ") and line.endswith("seed 9 -> x.wav") and "\r" not in line, line
    info = soundfile.info(str(tmp_path / "x.wav"))
    assert (info.samplerate, info.channels, info.subtype) == (24000, 1, "PCM_16")
    (expected,) = OmniVoiceOnnx.from_dir(pipeline.onnx).generate(
        "Hello there.", language="en", seed=9, generation_config={"num_step": 4}
    )
    assert np.array_equal(soundfile.read(tmp_path / "x.wav", dtype="int16")[0], to_pcm16(expected))


@pytest.mark.slow
def test_a_logged_seed_repeats_the_run(pipeline: Pipeline, tmp_path: Path) -> None:
    """`speak "Hi." --out x.wav 2>log` leaves the drawn seed in the log; that seed gives the same file."""
    common = ["--model-dir", pipeline.onnx, "--num-step", "2"]
    with open(tmp_path / "log", "wb") as log:
        done = subprocess.run(
            [sys.executable, "-m", "omnivoice_onnx", "speak", "Hi.", "--out", "x.wav", *map(str, common)],
            stdin=subprocess.DEVNULL,
            stderr=log,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    assert done.returncode == 0
    seed = re.search(r"seed (\d+) -> x\.wav$", (tmp_path / "log").read_text().strip()).group(1)
    again = command("speak", "Hi.", "--out", "y.wav", "--seed", seed, "--quiet", *common, cwd=tmp_path)
    assert again.returncode == 0 and again.stderr == b"", again.stderr.decode()
    assert (tmp_path / "x.wav").read_bytes() == (tmp_path / "y.wav").read_bytes()


@pytest.mark.slow
def test_speak_raw_stream_is_the_stream(pipeline: Pipeline, tmp_path: Path) -> None:
    done = command(
        "speak", LONG, "--raw", "--stream", "--model-dir", pipeline.onnx, "--num-step", "4", "--seed", "3", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr.decode()
    chunks = list(OmniVoiceOnnx.from_dir(pipeline.onnx).stream(LONG, seed=3, generation_config={"num_step": 4}))
    assert len(chunks) > 1
    assert done.stdout == to_pcm16(np.concatenate([c.samples for c in chunks])).astype("<i2").tobytes()


@pytest.mark.slow
def test_speak_to_a_device_a_symlink_and_a_closed_pipe(pipeline: Pipeline, tmp_path: Path) -> None:
    common = ["--model-dir", pipeline.onnx, "--num-step", "2", "--seed", "1"]
    (tmp_path / "store").mkdir()
    (tmp_path / "link.wav").symlink_to(tmp_path / "store" / "real.wav")
    outputs = ["link.wav"]
    if os.geteuid() == 0:
        os.mknod(tmp_path / "devnull", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        outputs.append("./devnull")
    for out in outputs:
        done = command("speak", "Hi.", "--out", out, *common, cwd=tmp_path)
        assert done.returncode == 0, done.stderr.decode()
    assert (tmp_path / "link.wav").is_symlink() and soundfile.info(str(tmp_path / "store" / "real.wav")).frames > 0
    if os.geteuid() == 0:
        assert stat.S_ISCHR((tmp_path / "devnull").lstat().st_mode)
    # A reader that goes away after a few bytes: exit 141, nothing on stderr.
    proc = subprocess.Popen(
        [sys.executable, "-m", "omnivoice_onnx", "speak", LONG, "--raw", "--stream", *map(str, common)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    proc.stdout.read(100)
    proc.stdout.close()
    assert proc.wait(timeout=300) == 128 + signal.SIGPIPE
    assert proc.stderr.read() == b""
