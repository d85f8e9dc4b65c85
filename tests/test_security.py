"""Issue 38 (reliability and security, round 4): one test per class the hostile sweep found, each
at the class's root (the server's launch, the atomic writer, the bounded readers, ...), run the
way a user or an attacker meets it: real processes, real files, real links.

Fast by default: nothing here loads a model unless marked slow.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, single_stderr_line

from omnivoice_onnx import audio_out, files, limits, runtime_config, voices
from omnivoice_onnx.batch import lines as batch_lines
from omnivoice_onnx.batch import run as batch_run
from omnivoice_onnx.bundle import Bundle, Folder, read_report
from omnivoice_onnx.contract import FP32_VARIANT, FRAME_RATE, GRAPH_FILES, NUM_CODEBOOKS, REPORT_FILE
from omnivoice_onnx.core import audio, request
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.serve import connection, door, middleware
from omnivoice_onnx.serve import service as server_service

START_S = 60  # a refused start is one line within this, long before any model could load


def expected_files(folder: Path, variant: str) -> list:
    """The files a variant loads, from the report (Bundle.file_checks), without opening the graphs."""
    return Bundle(Path(folder), variant, read_report(folder)).file_checks()


def omnivoice(
    *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None, timeout: float = START_S
) -> subprocess.CompletedProcess:
    """`python -m omnivoice_onnx ARGS` as a user runs it (text stderr, bytes stdin)."""
    proc = subprocess.run(
        [sys.executable, "-m", "omnivoice_onnx", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        env=env,
        timeout=timeout,
    )
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"))


def clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != server_service.API_KEY_ENV}
    return {**env, **extra}


# --- 1. the server is never open by accident -------------------------------------------------------


@pytest.mark.parametrize(
    "flags,env,words",
    [
        (["--host", "0.0.0.0"], {}, "refusing to serve 0.0.0.0 without an API key"),
        (["--host", "::"], {}, "refusing to serve :: without an API key"),
        (["--api-key", ""], {}, "--api-key is empty"),
        (["--host", "0.0.0.0", "--api-key", " "], {}, "--api-key is empty"),
        (["--host", "0.0.0.0"], {server_service.API_KEY_ENV: ""}, f"${server_service.API_KEY_ENV} is empty"),
        (["--no-auth", "--api-key", "k"], {}, "contradict"),
    ],
)
def test_server_never_starts_open_by_accident(
    flags: list[str], env: dict[str, str], words: str, tmp_path: Path
) -> None:
    """An exposed host without a key, or an empty key (`--api-key "$KEY"` with KEY unset), used to
    start a server with authentication off and no word; now one line, exit 2, before any model load
    (the model folder here is empty: reaching the load would say so instead)."""
    proc = omnivoice("serve", "--model-dir", str(tmp_path), "--port", "0", *flags, env=clean_env(**env))
    assert proc.returncode == 2, proc.stderr
    assert words in single_stderr_line(proc)


def test_no_auth_passes_the_key_check_and_warns_only_once_serving(tmp_path: Path) -> None:
    """--no-auth passes the check; the empty model folder is then what stops it, in one line: the
    warning about serving without authentication is logged once the server listens (a warning
    then a refusal were two messages for one refusal; test_round6 holds the warning)."""
    proc = omnivoice(
        "serve", "--model-dir", str(tmp_path), "--port", "0", "--host", "0.0.0.0", "--no-auth", env=clean_env()
    )
    assert proc.returncode == 2
    assert "WITHOUT AUTHENTICATION" not in proc.stderr and "refusing" not in single_stderr_line(proc)


@pytest.mark.parametrize(
    "header,token",
    [
        (b"Bearer k", b"k"),
        (b"bearer k", b"k"),
        (b"BEARER  k ", b"k"),
        (b"Basic k", b""),
        (b"Bearerk", b""),
        (b"", b""),
    ],
)
def test_bearer_scheme_is_case_insensitive(header: bytes, token: bytes) -> None:
    """RFC 7235: `bearer KEY` and `BEARER KEY` used to get 401."""
    assert middleware.bearer_token(header) == token


def test_loopback_hosts() -> None:
    assert all(server_service.is_loopback(host) for host in ("127.0.0.1", "localhost", "::1"))
    assert not any(server_service.is_loopback(host) for host in ("0.0.0.0", "::"))


# --- 2. no write through a planted link, nothing left on failure, bundle paths confined ------------


def victim_and_links(folder: Path, name: str) -> Path:
    """A file another user wants overwritten, and symlinks to it under every temporary name an
    earlier writer used for `name` (`.<name>.tmp-<pid>`, pids around this process's)."""
    victim = folder.parent / f"victim-{name}"
    victim.write_bytes(b"precious")
    for pid in range(max(1, os.getpid() - 50), os.getpid() + 50):
        (folder / f".{name}.tmp-{pid}").symlink_to(victim)
    return victim


def write_report(target: Path) -> None:
    files.write_json_atomic(target, {"a": 1})


def write_speech(target: Path) -> None:
    with audio_out.open_output(target, None, 24000) as sink:
        sink.write(np.zeros(2400, np.float32))


def write_voice(target: Path) -> None:
    voices.save_voice(target.parent, target.stem, voices.Voice(target.stem, None, "low pitch", "fp", Path()))


def write_results(target: Path) -> None:
    log = batch_run.ResultsLog(target, {})
    log.rewrite([{"id": "a", "line": 1}])
    log.append({"id": "b", "line": 2})
    log.close()


WRITERS = {
    "report.json": write_report,
    "out.wav": write_speech,
    "alice.json": write_voice,
    batch_lines.RESULTS_FILE: write_results,
}


@pytest.mark.parametrize("name", WRITERS)
def test_planted_temporary_links_never_redirect_a_write(name: str, tmp_path: Path) -> None:
    """Temporaries were `.<name>.tmp-<pid>`, opened without O_EXCL/O_NOFOLLOW: links planted for
    upcoming pids in a shared folder made speak --out, voices, reports and results.jsonl write into
    the planter's file. Now each writer's temporary is random and created exclusively."""
    folder = tmp_path / "shared"
    folder.mkdir()
    victim = victim_and_links(folder, name)
    WRITERS[name](folder / name)
    assert victim.read_bytes() == b"precious"
    written = folder / name
    assert written.is_file() and not written.is_symlink() and written.stat().st_size > 0
    assert [p for p in folder.iterdir() if not p.is_symlink() and p != written] == []  # no temporary left


def test_results_append_refuses_a_link_planted_in_its_place(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    log = batch_run.ResultsLog(tmp_path / batch_lines.RESULTS_FILE, {})
    log.rewrite([])
    (tmp_path / batch_lines.RESULTS_FILE).unlink()
    (tmp_path / batch_lines.RESULTS_FILE).symlink_to(victim)
    with pytest.raises(UserError, match="is a symbolic link, not a file this program made"):
        log.append({"id": "a", "line": 1})
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("name", ["report.json", "out.wav"])
def test_a_refused_rename_names_the_target_and_leaves_nothing(name: str, tmp_path: Path) -> None:
    """The rename onto a directory (`voice add --force` onto one) named the hidden temporary, left
    it behind and was a traceback; now one line naming the target, nothing left."""
    target = tmp_path / name

    def write_then_block(path: Path) -> None:
        if name == "out.wav":
            sink = audio_out.open_output(path, None, 24000)
            target.mkdir()  # a directory appears where the file goes, after the checks
            with sink:
                sink.write(np.zeros(240, np.float32))
        else:
            target.mkdir()
            WRITERS[name](path)

    with pytest.raises(UserError) as caught:
        write_then_block(target)
    assert caught.value.problem == f"{target} is a directory" and ".tmp-" not in str(caught.value)
    assert [p.name for p in tmp_path.iterdir()] == [name]


@pytest.mark.parametrize("where", ["graph", "variant"])
def test_report_paths_outside_the_bundle_refused_before_opening(where: str, tmp_path: Path) -> None:
    """A report entry `files["../../x.data"]` was opened and hashed before the load was refused."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    entry = {"sha256": "0" * 64, "bytes": 1}
    escape = f"{GRAPH_FILES['encoder']}/../../../outside.data" if where == "graph" else "../../outside.data"
    (tmp_path / "outside.data").write_bytes(b"x")
    report = {
        "graphs": {name: {"files": {}} for name in GRAPH_FILES},
        "runtime_assets": {"tokenizer.json": entry, "runtime-config.json": entry},
        "variants": {"int8": {"dir": "int8", "files": {}}},
    }
    report["graphs"]["encoder" if where == "graph" else "decoder"]["files"][escape] = entry
    report["variants"]["int8"]["files"] = {escape: entry} if where == "variant" else {}
    files.write_json_atomic(bundle / REPORT_FILE, report)
    with pytest.raises(UserError, match="a path outside its folder"):
        expected_files(bundle, "int8" if where == "variant" else FP32_VARIANT)


def test_voices_folder_resolved_once_and_kept_inside_the_bundle(tmp_path: Path, monkeypatch) -> None:
    """A bundle's voices/ that is a symlink out of the bundle received `voice add`; `--voices`
    naming a file was a traceback."""
    monkeypatch.delenv(voices.VOICES_ENV, raising=False)
    bundle, elsewhere = tmp_path / "bundle", tmp_path / "elsewhere"
    bundle.mkdir()
    elsewhere.mkdir()
    Folder(bundle).voices_path.symlink_to(elsewhere)
    with pytest.raises(UserError, match="leads outside"):
        voices.voices_dir(Folder(bundle))
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="is not a folder"):
        voices.voices_dir(Folder(bundle), tmp_path / "file")
    link = tmp_path / "named"
    link.symlink_to(elsewhere)
    assert voices.voices_dir(Folder(bundle), link) == elsewhere.resolve()  # a folder the user names is theirs


# --- 3. every input bounded before it is read whole ------------------------------------------------


@pytest.mark.parametrize(
    "args,stdin",
    [
        (["--text-file", "/dev/zero"], None),
        ([], b"x" * 200_000),  # piped stdin over the bytes MAX_TEXT_CHARS can take
    ],
)
def test_text_inputs_are_read_up_to_their_limit(args: list[str], stdin: bytes | None, tmp_path: Path) -> None:
    """`/dev/zero` as --text-file was read to 2.6 GB before "out of memory"."""
    proc = omnivoice(
        "speak", *args, "--out", str(tmp_path / "x.wav"), "--model-dir", str(tmp_path / "none"), stdin=stdin
    )
    assert proc.returncode == 2 and "is larger than 80,000 bytes" in single_stderr_line(proc)
    assert list(tmp_path.iterdir()) == []


def test_test_list_is_read_up_to_its_limit(monkeypatch) -> None:
    monkeypatch.setattr(batch_lines, "MAX_LIST_BYTES", 1 << 20)
    with pytest.raises(UserError, match="test list /dev/zero is larger than 1,048,576 bytes"):
        batch_lines.read_test_list(Path("/dev/zero"))


DEEP = "[" * 200_000 + "]" * 200_000


def deep_json_readers(tmp_path: Path, assets: Path, text: str = DEEP) -> dict[str, Callable[[], object]]:
    """Every JSON reader of the runtime, each given a file holding `text` (200k-deep JSON)."""
    bundle = tmp_path / "bundle"
    shutil.copytree(assets, bundle)
    for name in ("runtime-config.json", REPORT_FILE, "alice.json"):
        (bundle / name).write_text(text)
    return {
        "voice file": lambda: voices.read_voice(str(bundle / "alice.json"), bundle),
        "runtime-config.json": lambda: runtime_config.load_runtime_config(bundle / "runtime-config.json"),
        "export-report.json": lambda: expected_files(bundle, FP32_VARIANT),
    }


@pytest.mark.parametrize("reader", ["voice file", "runtime-config.json", "export-report.json"])
def test_deep_json_is_one_line(reader: str, tmp_path: Path, assets: Path) -> None:
    """200k-deep JSON in a voice file, runtime-config.json or export-report.json raised
    RecursionError (serve never started)."""
    with pytest.raises(UserError, match="nests deeper than"):
        deep_json_readers(tmp_path, assets)[reader]()


@pytest.mark.skipif(
    not getattr(sys, "get_int_max_str_digits", lambda: 0)(),
    reason="this Python has no integer conversion limit (before 3.10.7, or PYTHONINTMAXSTRDIGITS=0)",
)
@pytest.mark.parametrize("reader", ["voice file", "runtime-config.json", "export-report.json"])
def test_an_integer_too_long_to_convert_is_one_line(reader: str, tmp_path: Path, assets: Path) -> None:
    """A 5,000-digit integer (past Python's int conversion limit) made json.loads raise ValueError,
    not JSONDecodeError: a traceback."""
    with pytest.raises(UserError, match="is not valid JSON"):
        deep_json_readers(tmp_path, assets, '{"n": ' + "9" * 5000 + "}")[reader]()


def test_deep_or_incomplete_jsonl_lines_are_bad_lines_not_tracebacks(tmp_path: Path) -> None:
    """In a test list a 200k-deep line is a bad line; in results.jsonl it, and a record without
    "line" (which the rewrite sorts by: a KeyError), are dropped as a torn line is."""
    listed = tmp_path / "list.jsonl"
    listed.write_text(json.dumps({"id": "a", "text": "Hi."}) + "\n" + DEEP + "\n")
    parsed = batch_lines.read_test_list(listed)
    assert [line.id for line in parsed.lines] == ["a"] and "not JSON" in parsed.bad[0].problem
    results = tmp_path / batch_lines.RESULTS_FILE
    results.write_text(DEEP + "\n" + json.dumps({"id": "a"}) + "\n" + json.dumps({"id": "b", "line": 2}) + "\n")
    assert list(batch_run.read_results(results)) == ["b"]


@pytest.mark.parametrize("pattern", [r"(x+x+)+y", r"(a|aa)*b", r"(\w)\1"])
def test_backtracking_regex_in_the_bundle_refused_at_load(pattern: str, tmp_path: Path, assets: Path) -> None:
    """A runtime-config.json carrying `(x+x+)+y` stalled speak on every request."""
    config = json.loads((assets / "runtime-config.json").read_text(encoding="utf-8"))
    config["prompt"]["nonverbal_pattern"] = pattern
    (tmp_path / "runtime-config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(UserError, match="without nested repeats"):
        runtime_config.load_runtime_config(tmp_path / "runtime-config.json")


# --- 4. text decoded strictly ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,stdin,words",
    [
        (["speak", b"caf\xe9 au lait"], None, "command-line argument 2 is not valid text"),
        (["voice", "add", "v", "--instruct", b"\xff"], None, "command-line argument 5 is not valid text"),
        (["speak"], b"caf\xe9", "stdin is not UTF-8 text (byte 0xe9 on line 1, offset 3)"),
        (["speak", "--text-file", "LATIN1"], None, "is not UTF-8 text (byte 0xe9 on line 2, offset 10)"),
    ],
)
def test_invalid_utf8_is_one_line_naming_where(args: list, stdin: bytes | None, words: str, tmp_path: Path) -> None:
    """Latin-1 bytes in argv or stdin reached the tokenizer (`TextInputSequence must be str`) or
    the voice writer (`surrogates not allowed`, leaving an empty voices/)."""
    (tmp_path / "latin1.txt").write_bytes(b"Hello.\ncaf\xe9")
    argv = [os.fsdecode(a) if isinstance(a, bytes) else a.replace("LATIN1", str(tmp_path / "latin1.txt")) for a in args]
    proc = omnivoice(
        *argv,
        "--model-dir",
        str(tmp_path / "none"),
        *(["--out", str(tmp_path / "x.wav")] if argv[0] == "speak" else []),
        stdin=stdin,
    )
    assert proc.returncode == 2 and words in single_stderr_line(proc), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latin1.txt"]


def test_lone_surrogate_escapes_refused_in_json_and_requests(tmp_path: Path) -> None:
    """`"\\udcff"` in a JSON voice file or a request's text is a str UTF-8 cannot carry."""
    path = tmp_path / "v.json"
    voice = voices.Voice("v", None, "low pitch", "fp", Path()).to_json()
    path.write_text(json.dumps({**voice, "instruct": "low \udcff"}))
    with pytest.raises(UserError, match="instruct is not valid text"):
        voices.read_voice(str(path), tmp_path)
    with pytest.raises(UserError, match="text is not valid text"):
        request._texts("caf\udce9")
    with pytest.raises(UserError, match="instruct is not valid text"):
        request._optional_str("x\ud800", "instruct")


# --- 7. voices validated on import as on use; booleans are not numbers -----------------------------


def test_voice_longer_than_the_reference_limit_refused_when_read(tmp_path: Path) -> None:
    """`voice import` of a 703-byte .pt wrote a 15 MB voice of 40,000 s of codes (refused only
    when spoken): every reader checks the length as generate() does."""
    frames = int(limits.limit("MAX_REF_SECONDS") * FRAME_RATE) + 1
    with pytest.raises(UserError, match="over MAX_REF_SECONDS"):
        voices.check_tokens(np.zeros((NUM_CODEBOOKS, frames), np.int64), "voice")
    assert voices.check_tokens(np.zeros((NUM_CODEBOOKS, frames - 1), np.int64), "voice").shape[1] == frames - 1


def test_true_is_not_a_version_or_a_number(tmp_path: Path) -> None:
    path = tmp_path / "v.json"
    voice = voices.Voice("v", None, "low pitch", "fp", Path()).to_json()
    path.write_text(json.dumps({**voice, "format_version": True}))
    with pytest.raises(UserError, match="format_version is a boolean, expected an integer"):
        voices.read_voice(str(path), tmp_path)
    pytest.importorskip("pydantic")
    model = server_service.speech_request_model()
    base = {"model": "omnivoice", "input": "Hi.", "voice": "auto"}
    for field in ("speed", "seed", "num_step", "guidance_scale", "duration"):
        with pytest.raises(ValueError, match=field):
            model.model_validate_json(json.dumps({**base, field: True}))
    assert model.model_validate_json(json.dumps({**base, "speed": 1, "seed": 7})).speed == 1.0


# --- 9 (issue). privacy: nothing under $HOME, no telemetry warning ---------------------------------


def identity_graph(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


@pytest.mark.parametrize("home", ["writable", "unwritable"])
def test_sessions_write_nothing_under_home_and_print_no_telemetry_line(home: str, tmp_path: Path) -> None:
    """onnxruntime wrote a device id under ~/.cache/Microsoft on every run, and printed a
    telemetry warning before our error when HOME could not be written."""
    graph = identity_graph(tmp_path / "g.onnx")
    home_dir = tmp_path / "home"
    home_dir.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME")}
    env["HOME"] = str(home_dir) if home == "writable" else "/dev/null"  # a HOME no folder can be made in
    code = (
        "import numpy as np; from omnivoice_onnx.sessions import make_session; "
        f"print(make_session({str(graph)!r}).run(None, {{'x': np.ones(1, np.float32)}})[0][0])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env, timeout=START_S
    )
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "1.0", "")
    assert list(home_dir.rglob("*")) == []


# --- 5. a closed pipe is exit 141, never 0 after a partial write -----------------------------------

WHOLE_CLIP = (
    "import numpy as np; from omnivoice_onnx import audio_out\n"
    "from omnivoice_onnx.program import run_main\n"
    "def main(argv):\n"
    "    with audio_out.open_output('-', 'wav', 24000) as sink:\n"
    "        sink.write(np.zeros(484_800, np.float32))  # 20.2 s: 969,644 bytes, written whole at close\n"
    "run_main(main)\n"
)


def test_stdout_closed_mid_write_exits_141() -> None:
    """`speak | head -c 1000` exited 0 after 65,536 of 969,644 bytes: a buffered write into a pipe
    whose reader left returns the short count instead of raising."""
    proc = subprocess.run(
        f"{sys.executable} -c {shlex.quote(WHOLE_CLIP)} | head -c 1000 >/dev/null; echo ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=START_S,
    )
    assert (proc.stdout.strip(), proc.stderr) == ("141", "")


# --- 6. concurrency: locked names and res-dirs, workers that die with their driver -----------------

SAVE_ONE = (
    "import sys; from pathlib import Path; from omnivoice_onnx.program import run_main\n"
    "from omnivoice_onnx.voices import Voice, save_voice\n"
    "def main(argv):\n"
    "    folder, tag = Path(argv[0]), argv[1]\n"
    "    save_voice(folder, 'same', Voice('same', None, tag, 'fp', Path()), replace=False)\n"
    "    print('saved', tag)\n"
    "run_main(main, sys.argv[1:])\n"
)


def test_simultaneous_adds_of_one_name_save_exactly_one(tmp_path: Path) -> None:
    """8 simultaneous `voice add same` without --force: five said "saved", one voice survived."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SAVE_ONE, str(tmp_path), f"voice {i}"],
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(8)
    ]
    results = [(proc.wait(START_S), *proc.communicate()) for proc in procs]
    saved = [out.split(" ", 1)[1].strip() for code, out, _ in results if code == 0]
    assert len(saved) == 1, results
    assert all(code == 2 and "already exists" in err for code, _, err in results if code != 0), results
    assert voices.read_voice("same", tmp_path).instruct == saved[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same.json"]  # no lock or temporary left


def test_a_second_batch_run_into_a_busy_res_dir_is_refused(tmp_path: Path) -> None:
    """Two batch runs with different lists into one --res-dir both exited 0 and results.jsonl lost
    the second run's records. The second is now refused before it reads anything (the first is
    this test, holding the res-dir's lock as a run does)."""
    listed = tmp_path / "list.jsonl"
    listed.write_text(json.dumps({"id": "a", "text": "Hi."}) + "\n")
    res_dir = tmp_path / "out"
    res_dir.mkdir()
    options = batch_run.Options(test_list=listed, res_dir=res_dir, model_dir=tmp_path / "no-model")
    with files.FolderLock(res_dir, batch_lines.RESULTS_FILE, "--res-dir"):
        with pytest.raises(UserError, match=f"--res-dir is in use by another process \\(pid {os.getpid()}"):
            batch_run.run_batch(options, log=lambda message: None)
    with pytest.raises(UserError, match="no-model"):  # free again: the run goes on to the model
        batch_run.run_batch(options, log=lambda message: None)


DRIVER = (
    "import concurrent.futures, multiprocessing, os, signal, time\n"
    "from omnivoice_onnx.batch import pool, run\n"
    "if __name__ == '__main__':\n"
    "    pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context('spawn'),\n"
    "        initializer=pool._pool_init, initargs=(run.Synthesizer.load, ('m', 'fp32', 1), os.getpid()))\n"
    "    for future in [pool.submit(time.sleep, 0.5) for _ in range(2)]:\n"
    "        future.result()  # both workers started and initialised\n"
    "    print(' '.join(map(str, pool._processes)), flush=True)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_end_when_their_driver_is_killed(tmp_path: Path) -> None:
    """Killing `batch --workers 2` with SIGKILL left both workers (and the resource tracker)
    running, ~260 MB each, 79 s later."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=START_S,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == -9, proc.stderr
    workers = [int(pid) for pid in proc.stdout.split()]
    assert len(workers) == 2
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in workers)


# --- 9 (brief). references named as what they are ---------------------------------------------------


@pytest.mark.parametrize(
    "kind,words",
    [
        ("fifo", "is not a regular file"),
        ("device", "is not a regular file"),
        ("directory", "is a directory, not a file"),
        ("loop", "cannot be reached (Too many levels of symbolic links)"),
        ("missing", "reference audio file not found"),
    ],
)
def test_reference_that_is_not_a_file_is_named_as_what_it_is(kind: str, words: str, tmp_path: Path) -> None:
    """A FIFO, /dev/zero, a directory or a symlink loop as reference audio was "does not exist"."""
    path = {"device": Path("/dev/zero")}.get(kind, tmp_path / "ref.wav")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "loop":
        path.symlink_to(path)
    with pytest.raises(UserError) as caught:
        audio.load_reference(os.fspath(path), 24000, {}, max_seconds=60.0)
    assert words in caught.value.problem


# --- 8. the server's connections bounded, every refusal in OpenAI's JSON shape ----------------------


async def echo_length(scope: dict, receive, send) -> None:
    """An app that reads the body as the speech route does (connection.read_body) and says its length."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    try:
        body = await connection.read_body(Request(scope, receive), 1024)
        response = JSONResponse({"bytes": len(body)})
    except door.ApiError as error:
        response = JSONResponse(error.body(), error.status, error.headers)
    await response(scope, receive, send)


@pytest.fixture
def bounded_server(monkeypatch):
    """uvicorn with connection.http_protocol() on a free loopback port, in a thread; short limits."""
    uvicorn = pytest.importorskip("uvicorn")
    for name in door.TIMEOUTS:  # the constants below, not a developer's own OMNIVOICE_<timeout>
        monkeypatch.delenv(f"OMNIVOICE_{name}", raising=False)
    monkeypatch.setattr(door, "HEADER_TIMEOUT_S", 1.0)
    monkeypatch.setattr(door, "BODY_TIMEOUT_S", 1.0)
    monkeypatch.setattr(door, "MAX_CONNECTIONS", 3)
    listener = server_service.bind("127.0.0.1", 0)
    running = uvicorn.Server(
        uvicorn.Config(
            echo_length,
            lifespan="off",
            http=connection.http_protocol(),
            log_level="critical",
            h11_max_incomplete_event_size=door.MAX_HEADER_BYTES,
        )
    )
    thread = threading.Thread(target=running.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_S
    while not running.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield listener.getsockname()[1]
    running.should_exit = True
    thread.join(START_S)


def reply(port: int, *pieces: bytes, wait_s: float = 5.0) -> tuple[int, dict, float]:
    """Send `pieces` (0.2 s apart) on a new connection; (status, JSON body, seconds until the
    server closed it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        start = time.monotonic()
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.2)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body), time.monotonic() - start


@pytest.mark.parametrize(
    "pieces,status,code",
    [
        ([b"GARBAGE\r\n\r\n"], 400, "invalid_http"),  # uvicorn's plain-text 400 before
        ([b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 17_000, b"\r\n\r\n"], 400, "invalid_http"),  # > 16 KiB
        ([b"POST / HTTP/1.1\r\nHost: x\r\n"], 408, "header_timeout"),  # headers never finished: held forever before
        ([b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n1"], 408, "body_timeout"),
        ([], 408, "header_timeout"),  # an idle connection
    ],
)
def test_slow_idle_and_malformed_connections_end_with_a_json_error(
    pieces: list[bytes], status: int, code: str, bounded_server: int
) -> None:
    got, body, seconds = reply(bounded_server, *pieces)
    assert (got, body["error"]["code"]) == (status, code) and set(body["error"]) == {"message", "type", "param", "code"}
    assert seconds < 4


def test_connections_over_the_limit_refused_with_a_json_503(bounded_server: int) -> None:
    held = [socket.create_connection(("127.0.0.1", bounded_server), timeout=5) for _ in range(door.MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)
        status, body, _ = reply(bounded_server, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (status, body["error"]["code"]) == (503, "too_many_connections")
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    request_bytes = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
    status, body, _ = reply(bounded_server, request_bytes)
    assert (status, body) == (200, {"bytes": 2})


# --- 10. Ray addresses checked, and bounded in time, before any output -------------------------------


@pytest.mark.parametrize(
    "address,env,words",
    [
        ("garbage", {}, "is not a Ray address"),
        ("10.0.0.1:99999", {}, "is not a Ray address"),
        ("127.0.0.1:1", {}, "nothing answers at 127.0.0.1:1 within"),  # hung before
        ("ray://127.0.0.1:10001", {}, "needs Ray Client"),
        ("auto", {"RAY_ADDRESS": "127.0.0.1:1"}, "--ray auto: nothing answers at"),
        ("auto", {}, "no running Ray cluster found"),
    ],
)
def test_bad_ray_addresses_refused(address: str, env: dict[str, str], words: str, tmp_path: Path, monkeypatch) -> None:
    """Every bad --ray address was a traceback (ray://... without ray[client], `auto` with no
    cluster, garbage) or a hang (127.0.0.1:1)."""
    pytest.importorskip("ray")
    from omnivoice_onnx.batch import ray_engine

    if address.startswith("ray://") and importlib.util.find_spec("grpc") is not None:
        pytest.skip("Ray Client is installed here")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # no cluster this machine runs is found
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if address == "auto" and not env:
        from ray._private import services

        if services.find_gcs_addresses():  # ray finds running clusters by their processes too
            pytest.skip("a Ray cluster runs on this machine (another job's): `auto` would find it")
    with pytest.raises(UserError, match=re.escape(words)):
        ray_engine.check_address(address)


def test_a_dead_ray_address_refused_before_any_output(tmp_path: Path) -> None:
    """The refusal comes before results.jsonl (or the res-dir) exists."""
    pytest.importorskip("ray")
    listed = tmp_path / "list.jsonl"
    listed.write_text(json.dumps({"id": "a", "text": "Hi."}) + "\n")
    proc = omnivoice(
        "batch",
        "--test-list",
        str(listed),
        "--res-dir",
        str(tmp_path / "out"),
        "--ray",
        "127.0.0.1:1",
        "--model-dir",
        str(tmp_path),
    )
    assert proc.returncode == 2 and "nothing answers at 127.0.0.1:1" in single_stderr_line(proc), proc.stderr
    assert not (tmp_path / "out").exists()
