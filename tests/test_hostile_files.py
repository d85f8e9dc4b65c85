"""Hostile files at the runtime's file and terminal surfaces: what is hashed is what runs, what is
printed is one safe line, every JSON read is checked against one schema, folders the runtime makes
for itself are never followed through a link, and a path with a NUL is one line.

The race tests are real races: a helper process watches a file of the export with inotify and
replaces it the moment the loading process closes it after reading it (the end of its hash);
a control run shows that the replacement, loaded, gives other audio.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, Pipeline

from omnivoice_onnx.batch.lines import read_test_list
from omnivoice_onnx.contract import GRAPH_FILES, REPORT_FILE
from omnivoice_onnx.errors import OneLineFormatter, UserError, check_path, printable
from omnivoice_onnx.files import make_folder
from omnivoice_onnx.runtime_config import load_runtime_config
from omnivoice_onnx.verified import CACHE_ENV, VERIFIED_FILE, VERIFY_ENV, VerifiedFiles
from omnivoice_onnx.voices import PRESETS, Voice, list_voices, save_voice

FINGERPRINT = "sha256:0123456789abcdef"
HOSTILE = "\x1b]0;owned\x07\x1b[2J\r\u202eevil\x00\x9b\ud800"  # retitle, clear, CR, bidi, NUL, C1 CSI, surrogate

# The helper process of the race tests: watch FILE (IN_ACCESS, IN_CLOSE_NOWRITE); at the first close
# after a read (the end of a hash), rename SOURCE over FILE, print "swapped" and exit.
WATCHER = r"""
import ctypes, os, struct, sys
target, source = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
IN_ACCESS, IN_CLOSE_NOWRITE = 0x1, 0x10
if fd < 0 or libc.inotify_add_watch(fd, target.encode(), IN_ACCESS | IN_CLOSE_NOWRITE) < 0:
    sys.exit("inotify unavailable")
print("ready", flush=True)
read = False
while True:
    buffer, offset = os.read(fd, 65536), 0
    while offset < len(buffer):
        _, mask, _, length = struct.unpack_from("iIII", buffer, offset)
        offset += 16 + length
        read = read or bool(mask & IN_ACCESS)
        if read and mask & IN_CLOSE_NOWRITE:
            os.replace(source, target)
            print("swapped", flush=True)
            sys.exit(0)
"""


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omnivoice_onnx", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def _one_line(done: subprocess.CompletedProcess, fragment: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and fragment in lines[0], lines[0]
    return lines[0]


# --- everything printed is one safe line ---------------------------------------------------------------


def test_printable_escapes_every_control_and_keeps_text() -> None:
    line = printable("Zoë " + HOSTILE)
    assert line.startswith("Zoë ") and line.isprintable()
    assert r"\x1b]0;owned\x07\x1b[2J\x0d\u202eevil\x00\x9b\ud800" in line
    assert printable(line) == line  # escaping twice changes nothing: no surface double-escapes
    error = UserError(f"voice {HOSTILE!s}", "fix\nit")
    assert str(error).isprintable() and error.problem.isprintable() and error.fix == r"fix\x0ait"


def test_log_lines_are_escaped() -> None:
    import logging

    record = logging.LogRecord("x", logging.INFO, __file__, 1, "voice %s", (HOSTILE,), None)
    assert OneLineFormatter("%(levelname)s: %(message)s").format(record).isprintable()


def test_voice_list_prints_a_hostile_file_name_escaped(tmp_path: Path) -> None:
    """A voice file named with escape sequences retitled and cleared the terminal through `voice list`.
    No request can name it, so it is not listed: the note that says so shows its name escaped."""
    voices = tmp_path / "voices"
    save_voice(voices, "alice", Voice("alice", None, "female, low pitch", FINGERPRINT, Path()))
    name = "\x1b]0;owned\x07\x1b[2J\u202eevil"
    shutil.copy(voices / "alice.json", voices / f"{name}.json")
    done = _cli("voice", "list", "--voices", voices, "--model-dir", tmp_path / "no-model")
    assert done.returncode == 0, done.stderr
    shown = done.stdout + done.stderr
    assert "\x1b" not in shown and "\u202e" not in shown and "\x07" not in shown
    assert r"\x1b]0;owned\x07\x1b[2J\u202eevil" in done.stderr and "not listed" in done.stderr
    listed = done.stdout.splitlines()  # the saved voice, then the presets
    assert [line.split()[0] for line in listed] == ["alice", *PRESETS]
    assert listed[0].endswith(f"  design 'female, low pitch'  model {FINGERPRINT}")


def test_an_error_naming_a_hostile_path_is_one_escaped_line(tmp_path: Path) -> None:
    folder = tmp_path / "m\x1b]0;owned\x07\x1b[2J\r\u202eevil\x9b"  # argv holds no NUL
    done = _cli("info", folder)
    line = _one_line(done, "export folder not found")
    assert line.isprintable() and r"\x1b]0;owned" in line


# --- every JSON read goes through one schema check -----------------------------------------------------


def test_runtime_config_sections_of_another_type_are_one_line(tmp_path: Path, assets: Path) -> None:
    good = json.loads((assets / "runtime-config.json").read_text(encoding="utf-8"))
    for section, value in [("version", "3"), ("languages", []), ("model", None), ("audio", 1.5)]:
        (tmp_path / "runtime-config.json").write_text(json.dumps({**good, section: value}))
        with pytest.raises(UserError, match=rf"is malformed: {section} is .*, expected"):
            load_runtime_config(tmp_path / "runtime-config.json")


@pytest.mark.parametrize(
    "field, value",
    [
        ("format_version", "1"),
        ("model_fingerprint", 7),
        ("instruct", ["x"]),
        ("ref_rms", "0.1"),
        ("ref_text", {"a": 1}),
        ("ref_audio_tokens", "x"),
        ("ref_audio_tokens", [[1, True]]),
    ],
)
def test_voice_file_fields_of_another_type_are_one_line(field: str, value, tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    path = save_voice(voices, "bob", Voice("bob", None, "female", FINGERPRINT, Path()))
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, field: value}))
    with pytest.raises(UserError, match=rf"voice file .* is malformed: {field}"):
        list_voices(voices)


def test_batch_line_fields_of_another_type_are_bad_lines(tmp_path: Path) -> None:
    lines = [
        {"id": "a", "text": 5},
        {"id": "b", "text": "x", "ref_audio": ["r.wav"], "ref_text": "t"},
        {"id": "c", "text": "x", "speed": "fast"},
        {"id": "d", "text": "x", "voice": {}},
        {"id": "e", "text": "x", "duration": True},
    ]
    (tmp_path / "list.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    parsed = read_test_list(tmp_path / "list.jsonl")
    assert parsed.lines == []
    assert [bad.problem for bad in parsed.bad] == [
        "text is an integer, expected a string",
        "ref_audio is a list, expected a string",
        "speed is a string, expected a number",
        "voice is an object, expected a string",
        "duration is a boolean, expected a number",
    ]


def test_a_verification_record_of_another_shape_is_not_used(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    record = folder / VERIFIED_FILE
    for files in [[], {"x": []}, {"x": {"stat": "1", "sha256": "0"}}, {"x": {"stat": [1], "sha256": 0}}]:
        record.write_text(json.dumps({"format": "omnivoice-onnx verified files", "version": 1, "files": files}))
        record.chmod(0o600)
        assert VerifiedFiles(record).entries == {}


# --- folders the runtime makes for itself ----------------------------------------------------------------


def test_a_link_planted_as_the_cache_folder_is_neither_trusted_nor_written_through(tmp_path: Path) -> None:
    """The cache folder was checked with stat(), through a planted link: a link to a private folder
    of the user's own (~/.ssh, say) received the record and its lock."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (tmp_path / "cache").symlink_to(private)
    verified = VerifiedFiles(tmp_path / "cache" / VERIFIED_FILE)
    verified.updates = {"/x": {"stat": [1, 2, 3, 4, 5], "sha256": "0" * 64}}
    verified.save()
    assert list(private.iterdir()) == []
    shutil.copy(__file__, private / VERIFIED_FILE)  # a record there is not read through the link either
    assert VerifiedFiles(tmp_path / "cache" / VERIFIED_FILE).entries == {}


def test_voice_folder_and_made_folders_refuse_a_planted_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "voices").symlink_to(elsewhere)
    with pytest.raises(UserError, match="is a symbolic link, not a folder"):
        save_voice(tmp_path / "voices", "eve", Voice("eve", None, "female", FINGERPRINT, Path()))
    assert list(elsewhere.iterdir()) == []
    made = make_folder(tmp_path / "new" / "res", "--res-dir", "fix")
    assert (tmp_path / "new" / "res").is_dir() and made.st_ino == (tmp_path / "new" / "res").stat().st_ino
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="is not a folder"):
        make_folder(tmp_path / "file", "--res-dir", "fix")


# --- paths with a NUL ------------------------------------------------------------------------------------


def test_a_nul_in_any_path_field_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="ref_audio .* holds a NUL character at position 3"):
        check_path("ref\x00.wav", "ref_audio")
    with pytest.raises(UserError, match="must be a file path"):
        check_path(5, "ref_audio")
    lines = [
        {"id": "a", "text": "x", "ref_audio": "r\u0000.wav", "ref_text": "t"},
        {"id": "b", "text": "x", "voice": "v\u0000.json"},
    ]
    (tmp_path / "list.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    parsed = read_test_list(tmp_path / "list.jsonl")
    assert parsed.lines == [] and [bad.id for bad in parsed.bad] == ["a", "b"]
    assert all("holds a NUL character at position 1: not a path" in bad.problem for bad in parsed.bad)


# --- what is hashed is what runs: real races -------------------------------------------------------------


def _speak(onnx: Path, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return _cli(
        "speak",
        "Hello there, this is a test.",
        "--model-dir",
        onnx,
        "--seed",
        "7",
        "--num-step",
        "4",
        "--out",
        out,
        env=env,
    )


def _samples(path: Path) -> np.ndarray:
    import soundfile

    return soundfile.read(str(path), dtype="int16")[0]


def _lowercasing(tokenizer: Path, out: Path) -> None:
    """tokenizer.json with a lowercasing normaliser put first: other ids for 'Hello'."""
    data = json.loads(tokenizer.read_text(encoding="utf-8"))
    data["normalizer"] = {
        "type": "Sequence",
        "normalizers": [{"type": "Lowercase"}] + ([data["normalizer"]] if data.get("normalizer") else []),
    }
    out.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("swapped", ["sidecar", "tokenizer"])
def test_a_file_swapped_the_moment_its_hash_ends_is_never_what_runs(
    swapped: str, pipeline: Pipeline, perturbed_transformer: Path, tmp_path: Path
) -> None:
    """A sidecar or tokenizer.json renamed over the verified one right after its hash was loaded
    (exit 0, other audio). Now a swapped graph file is refused in one line, and a swapped
    tokenizer.json has no effect: it is parsed from the bytes that were hashed."""
    onnx = Path(shutil.copytree(pipeline.onnx, tmp_path / "onnx"))
    env = {CACHE_ENV: str(tmp_path / "cache"), "OMNIVOICE_ORT_THREADS": "1"}
    baseline = _speak(onnx, tmp_path / "baseline.wav", env)
    assert baseline.returncode == 0, baseline.stderr
    if swapped == "sidecar":
        name = GRAPH_FILES["transformer"]
        assert (perturbed_transformer / name).read_bytes() == (onnx / name).read_bytes()  # only the weights differ
        target, replacement = onnx / f"{name}.data", tmp_path / "replacement"
        shutil.copy(perturbed_transformer / f"{name}.data", replacement)
    else:
        target, replacement = onnx / "tokenizer.json", tmp_path / "replacement"
        _lowercasing(target, replacement)
    # Control: the replacement, loaded unchecked, changes the audio.
    control = Path(shutil.copytree(onnx, tmp_path / "control"))
    shutil.copy(replacement, control / target.name)
    done = _speak(control, tmp_path / "control.wav", {**env, VERIFY_ENV: "0"})
    assert done.returncode == 0, done.stderr
    assert not np.array_equal(_samples(tmp_path / "control.wav"), _samples(tmp_path / "baseline.wav"))
    # The race: the watcher renames the replacement in as the loader closes the file it hashed.
    watcher = subprocess.Popen(
        [sys.executable, "-c", WATCHER, str(target), str(replacement)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert watcher.stdout.readline().strip() == "ready"
        raced = _speak(onnx, tmp_path / "raced.wav", {**env, CACHE_ENV: str(tmp_path / "fresh-cache")})
        assert watcher.wait(timeout=60) == 0 and watcher.stdout.read().strip() == "swapped"
    finally:
        watcher.kill()
    assert target.read_bytes() == (control / target.name).read_bytes()  # the swap happened
    if swapped == "sidecar":
        _one_line(raced, f"{target} changed after it was verified")
        assert not (tmp_path / "raced.wav").exists()
    else:
        assert raced.returncode == 0, raced.stderr
        assert np.array_equal(_samples(tmp_path / "raced.wav"), _samples(tmp_path / "baseline.wav"))


@pytest.mark.slow
def test_a_sidecar_written_in_place_while_its_session_runs_is_refused(
    pipeline: Pipeline, tmp_path: Path, monkeypatch
) -> None:
    """onnxruntime maps a graph's external data file: a write into it after the session was made
    reaches the weights. The call that follows is refused, never returned."""
    from omnivoice_onnx import OmniVoiceOnnx

    onnx = Path(shutil.copytree(pipeline.onnx, tmp_path / "onnx"))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    tts = OmniVoiceOnnx.from_dir(onnx, threads=1)
    tts.generate("Hello.", seed=1, generation_config={"num_step": 2})
    sidecar = onnx / f"{GRAPH_FILES['transformer']}.data"
    with open(sidecar, "r+b") as handle:
        handle.seek(sidecar.stat().st_size // 2)
        handle.write(b"\0\0\0\0")
    with pytest.raises(UserError, match=f"{sidecar.name} changed after it was verified"):
        tts.generate("Hello.", seed=1, generation_config={"num_step": 2})


@pytest.mark.slow
def test_a_report_section_of_another_shape_ends_info_in_one_line(pipeline: Pipeline, tmp_path: Path) -> None:
    """An export report whose `parity` is a list ended `info` in an AttributeError."""
    onnx = Path(shutil.copytree(pipeline.onnx, tmp_path / "onnx"))
    report = json.loads((onnx / REPORT_FILE).read_text())
    for section, value in [("parity", ["cpu"]), ("end_to_end", {"cpu": "PASS"}), ("variants", [])]:
        (onnx / REPORT_FILE).write_text(json.dumps({**report, section: value}))
        done = _cli("info", onnx)
        _one_line(done, f"is malformed: {section}")
    (onnx / REPORT_FILE).write_text(json.dumps({**report, "parity": ["cpu"]}))
    _one_line(_cli("speak", "Hi.", "--model-dir", onnx, "--out", tmp_path / "x.wav"), "parity is a list")


@pytest.mark.slow
def test_a_nul_in_a_batch_ref_audio_is_a_bad_line_not_a_traceback(pipeline: Pipeline, tmp_path: Path) -> None:
    """It ended in a traceback (ValueError: embedded null byte, from soundfile)."""
    line = {"id": "a", "text": "Hello.", "ref_audio": "ref\u0000.wav", "ref_text": "Hi."}
    (tmp_path / "list.jsonl").write_text(json.dumps(line) + "\n")
    done = _cli(
        "batch",
        "--model-dir",
        pipeline.onnx,
        "--test_list",
        tmp_path / "list.jsonl",
        "--res_dir",
        tmp_path / "out",
        "--num_step",
        "2",
        env={CACHE_ENV: str(tmp_path / "cache")},
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    bad, summary = done.stderr.strip().splitlines()  # the bad line, then the one error line
    assert "line 1 (a): ref_audio 'ref\\x00.wav' holds a NUL character at position 3" in bad
    assert summary.startswith("omnivoice-onnx: error: 1 bad line(s)") and not (tmp_path / "out").exists()


def test_watcher_helper_swaps_after_a_read_not_after_a_bare_open(tmp_path: Path) -> None:
    """The race tests' helper acts on the first close that follows a read: a stat-only open and
    close (as the old loader's identity check did) does not trigger it."""
    target, source = tmp_path / "t", tmp_path / "s"
    target.write_bytes(b"old")
    source.write_bytes(b"new")
    watcher = subprocess.Popen(
        [sys.executable, "-c", WATCHER, str(target), str(source)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert watcher.stdout.readline().strip() == "ready"
        open(target, "rb").close()
        time.sleep(0.3)
        assert target.read_bytes() == b"old"  # this read, then its close, trigger the swap
        assert watcher.wait(timeout=10) == 0
    finally:
        watcher.kill()
    assert target.read_bytes() == b"new"
