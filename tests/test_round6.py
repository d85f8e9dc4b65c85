"""Reliability and security, round 6: the server's, the voice store's and the small cases,
each at its root, met the way a user or an attacker meets them: a real server process on a free
loopback port, real concurrent clients, real voice files, real processes for the command line.
The download's cases (planted links, lying bodies, leftovers, hub ids) are in test_fetch.py.

Fast unless marked slow (the session pipeline's tiny export).
"""

from __future__ import annotations

import concurrent.futures
import http.client
import io
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import REPO, single_stderr_line
from test_fetch import command as omnivoice

from omnivoice_onnx import files, voices
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.limits import MAX_SPEED, MIN_SPEED, check_speed
from omnivoice_onnx.serve import metrics as server_metrics
from omnivoice_onnx.voices import Voice, VoiceShelf, save_voice

FINGERPRINT = "sha256:0123456789abcdef"
START_S = 60


def design(name: str) -> Voice:
    return Voice(name, None, "female, low pitch", FINGERPRINT, Path())


# --- names that mean modes ---------------------------------------------------------------------------

RESERVED = ["auto", "Design", "AUTO", "ref-0123456789abcdef", "Ref-mine"]


@pytest.mark.parametrize("name", RESERVED)
def test_reserved_names_are_refused_before_anything_is_written(name: str, tmp_path: Path) -> None:
    """A voice saved as `auto` or `design` (any case), or as an uploaded reference's `ref-...` id,
    could never be asked for (the mode or the reference resolves first): every writer refuses it
    (voices.check_new_name) before a file is written; a rename to it too."""
    with pytest.raises(UserError, match="is reserved"):
        save_voice(tmp_path, name, design(name))
    save_voice(tmp_path, "alice", design("alice"))
    with pytest.raises(UserError, match="is reserved"):
        voices.rename_voice(tmp_path, "alice", name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alice.json"]


def test_voice_add_and_import_refuse_a_reserved_name_in_one_line(tmp_path: Path) -> None:
    """The command line's writers: one line, exit 2, before the model or the file is read."""
    folder = tmp_path / "voices"
    for args in (("add", "design", "--instruct", "female"), ("import", tmp_path / "missing.pt", "auto")):
        done = omnivoice("voice", *args, "--model-dir", tmp_path / "no-model", "--voices", folder)
        assert done.returncode == 2 and "is reserved" in single_stderr_line(done), done.stderr
    assert not folder.exists()


def test_listings_leave_out_voice_files_no_request_can_name(tmp_path: Path) -> None:
    """A voice file copied in under a name no request can ask for (a space, a dot, a mode's name)
    is not listed, by the server's shelf or by `voice list`: one listing rule (voices.voice_files)."""
    path = save_voice(tmp_path, "alice", design("alice"))
    for name in ("my voice", "a.b", "auto", "Design", "ref-0123456789abcdef", "-x"):
        (tmp_path / f"{name}.json").write_bytes(path.read_bytes())
    assert list(voices.voice_files(tmp_path)) == ["alice"]
    assert [v.name for v in voices.list_voices(tmp_path)] == ["alice"]
    assert [v.name for v in VoiceShelf(tmp_path).listing().voices()] == ["alice"]


def test_listing_while_writers_remove_never_fails(tmp_path: Path) -> None:
    """Readers list and parse the folder while writers create, rename and delete in it: a file gone
    since the listing is no voice, never a damaged one (the 500 of a concurrent delete)."""
    shelf = VoiceShelf(tmp_path)
    stop = threading.Event()
    failures: list[BaseException] = []

    def write(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            a, b = f"v{rng.randrange(4)}", f"v{rng.randrange(4)}"
            try:
                action = rng.randrange(3)
                if action == 0:
                    save_voice(tmp_path, a, design(a))
                elif action == 1:
                    voices.rename_voice(tmp_path, a, b)
                else:
                    voices.remove_voice(tmp_path, a)
            except UserError:  # absent or taken: a writer's ordinary refusal
                pass

    def read() -> None:
        while not stop.is_set():
            try:
                listing = shelf.listing()
                listing.voices()
                listing.find("v1")
            except BaseException as exc:  # noqa: BLE001 (collected: the test's finding)
                failures.append(exc)
                return

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)] + [
        threading.Thread(target=read) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    time.sleep(3)
    stop.set()
    for thread in threads:
        thread.join(30)
    assert not failures, failures[0]


# --- folders replaced whole -------------------------------------------------------------------------


def test_a_folder_replaced_whole_is_set_aside_where_no_link_can_wait(tmp_path: Path) -> None:
    """files.atomic_dir sets the old folder aside onto a fresh folder of a random name: a link planted
    at the fixed `.<name>.old-<pid>` receives nothing (the rename onto it failed, a traceback). A
    link at the path itself is replaced by the new folder, its target untouched (it was renamed aside
    and left as `.<name>.old-<pid>`)."""
    target, victim = tmp_path / "m", tmp_path / "victim"
    target.mkdir()
    (target / "a").write_text("old")
    victim.mkdir()
    (victim / "keep").write_text("precious")
    planted = tmp_path / f".m.old-{os.getpid()}"
    planted.symlink_to(victim)
    with files.atomic_dir(target) as tmp:
        (tmp / "b").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["b"]
    link = tmp_path / "link"
    link.symlink_to(victim)
    with files.atomic_dir(link) as tmp:
        (tmp / "c").write_text("new")
    assert not link.is_symlink() and sorted(p.name for p in link.iterdir()) == ["c"]
    assert sorted(p.name for p in victim.iterdir()) == ["keep"] and (victim / "keep").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m", "link", "victim", planted.name])


# --- the speed range ------------------------------------------------------------------------------


def test_speed_is_one_closed_range() -> None:
    """OpenAI's documented 0.25-4.0, both ends in, for the API (limits.check_speed, which
    request.validate uses), the command line's flag and the server's request model alike."""
    from omnivoice_onnx.program import SPEED
    from omnivoice_onnx.serve.service import speech_request_model

    model = speech_request_model()
    for value in (MIN_SPEED, MAX_SPEED):
        assert check_speed(value) == SPEED(str(value)) == model(model="m", input="x", voice="v", speed=value).speed
    for value in (MIN_SPEED - 1e-9, MAX_SPEED + 1e-9):
        with pytest.raises(UserError, match=r"out of range \[0.25, 4\]"):
            check_speed(value)


# --- small cases ------------------------------------------------------------------------------------


def test_an_empty_zeroconf_name_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("wyoming")
    done = omnivoice("wyoming", "--model-dir", tmp_path, "--zeroconf", "")
    assert done.returncode == 2 and "--zeroconf '' is not a service name" in single_stderr_line(done), done.stderr


def test_a_zeroconf_that_fails_to_import_is_one_line(tmp_path: Path) -> None:
    """An installed zeroconf whose import fails (a wheel for another Python): one line naming it."""
    pytest.importorskip("wyoming")
    broken = tmp_path / "site" / "zeroconf"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('undefined symbol: _zeroconf_cache')\n")
    done = omnivoice(
        "wyoming", "--model-dir", tmp_path, "--zeroconf", env={"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{REPO}"}
    )
    line = single_stderr_line(done)
    assert done.returncode == 2 and "needs zeroconf, which is installed but fails to import" in line, done.stderr


def test_a_busy_port_under_no_auth_is_one_line_without_the_warning(tmp_path: Path) -> None:
    """The bind fails (0.0.0.0:P overlaps the 127.0.0.1:P this test listens on): the refusal alone,
    not the WITHOUT AUTHENTICATION warning before it."""
    env = {key: value for key, value in os.environ.items() if key != "OMNIVOICE_API_KEY"}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        done = subprocess.run(
            [sys.executable, "-m", "omnivoice_onnx", "serve", "--model-dir", str(tmp_path), "--host", "0.0.0.0"]
            + ["--port", str(busy.getsockname()[1]), "--no-auth"],
            cwd=REPO,
            capture_output=True,
            text=True,
            env=env,
            timeout=START_S,
        )
    assert done.returncode == 2 and "cannot listen on 0.0.0.0" in single_stderr_line(done), done.stderr


def test_made_up_methods_add_no_label_set() -> None:
    """/metrics counts requests by method: a made-up one (HTTP allows any token) is "other", so 300
    of them add one label set, not 300."""
    import asyncio

    from prometheus_client.parser import text_string_to_metric_families

    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 405, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    metrics = server_metrics.Metrics(lambda: 0, lambda: 0, 24000)
    measured = metrics.middleware(app, lambda scope: None)

    async def send(message) -> None:
        pass

    async def receive() -> dict:
        return {"type": "http.request"}

    for method in [f"M{i}" for i in range(300)] + ["GET", "PATCH"]:
        asyncio.run(measured({"type": "http", "method": method, "path": "/x"}, receive, send))
    samples = [
        sample
        for family in text_string_to_metric_families(metrics.render().decode())
        if family.name == "omnivoice_http_requests"
        for sample in family.samples
        if sample.name.endswith("_total")
    ]
    assert sorted(sample.labels["method"] for sample in samples) == ["GET", "PATCH", "other"]


# --- the server (slow: the tiny export) ---------------------------------------------------------------


def multipart(fields: dict[str, str], audio: bytes | None = None) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields.items()
    )
    if audio is not None:
        body += (
            f'--{boundary}\r\nContent-Disposition: form-data; name="ref_audio"; filename="r.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n"
        ).encode() + audio
        body += b"\r\n"
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def reference(seconds: float, rate: int = 48000, channels: int = 2) -> bytes:
    """A recording as a client uploads one: 52 s at 48 kHz stereo 16-bit is 10 MB (under 60 s)."""
    t = np.arange(int(rate * seconds)) / rate
    wave = 0.3 * np.sin(2 * np.pi * 220 * t)[:, None] * np.ones((1, channels))
    wave += 0.01 * np.random.default_rng(0).standard_normal(wave.shape)
    buffer = io.BytesIO()
    sf.write(buffer, wave.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


class Web:
    """A running `omnivoice-onnx serve --allow-voice-save` and plain HTTP to it."""

    def __init__(self, launched) -> None:
        self.launched, self.port = launched, launched.port

    def request(
        self, method: str, path: str, body: bytes | dict | None = None, kind: str | None = None
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        headers = {"Content-Type": kind} if kind else {}
        if isinstance(body, dict):
            body, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def form(self, path: str, fields: dict[str, str], audio: bytes | None = None) -> tuple[int, bytes]:
        body, kind = multipart(fields, audio)
        return self.request("POST", path, body, kind)

    def status(self, key: str) -> int:
        """The server process's /proc status field `key` (VmRSS, VmHWM) in MiB."""
        text = Path(f"/proc/{self.launched.process.pid}/status").read_text()
        return int(re.search(rf"{key}:\s+(\d+) kB", text).group(1)) // 1024


@pytest.fixture(scope="module")
def web(pipeline, tmp_path_factory):
    from serving import launch

    env = {key: value for key, value in os.environ.items() if key != "OMNIVOICE_API_KEY"}
    env["OMNIVOICE_ORT_THREADS"] = "1"
    folder = tmp_path_factory.mktemp("round6")
    launched = launch(
        pipeline.onnx,
        folder / "server.log",
        "--voices",
        str(folder / "voices"),
        "--threads",
        "1",
        "--allow-voice-save",
        "--default-format",
        "wav",
        env=env,
        start_timeout=START_S,
    )
    server = Web(launched)
    server.voices = folder / "voices"
    yield server
    assert launched.stop(START_S) == 0
    text = launched.log.read_text()
    assert "Traceback" not in text, text[-3000:]


@pytest.mark.slow
def test_reserved_names_over_http_are_400_and_write_nothing(web: Web) -> None:
    for name in ("auto", "Design", "ref-0123456789abcdef"):
        status, body = web.form("/v1/audio/voices", {"name": name, "instruct": "female, low pitch"})
        assert status == 400 and json.loads(body)["error"]["code"] == "invalid_voice", body
        status, body = web.request("POST", f"/v1/audio/references?ref_text=Hi.&save_as={name}", b"RIFF")
        assert status == 400 and b"is reserved" in body, body
    assert web.form("/v1/audio/voices", {"name": "keeper", "instruct": "male"})[0] == 201
    status, body = web.request("PATCH", "/v1/audio/voices/keeper", {"name": "AUTO"})
    assert status == 400 and b"is reserved" in body, body
    (web.voices / "my voice.json").write_bytes((web.voices / "keeper.json").read_bytes())
    (web.voices / "auto.json").write_bytes((web.voices / "keeper.json").read_bytes())
    listed = [item["id"] for item in json.loads(web.request("GET", "/v1/audio/voices")[1])["data"]]
    assert listed.count("auto") == 1 and "my voice" not in listed and "keeper" in listed
    assert sorted(p.name for p in web.voices.iterdir()) == ["auto.json", "keeper.json", "my voice.json"]
    for name in ("auto.json", "my voice.json", "keeper.json"):
        (web.voices / name).unlink()


@pytest.mark.slow
def test_concurrent_voice_writers_never_get_a_500(web: Web) -> None:
    """8 clients create, rename, delete and list voices of four names at once: each answer is a
    success or the refusal its race earns (404 gone, 409 taken), never a 5xx."""

    def client(seed: int) -> list[int]:
        rng, statuses = random.Random(seed), []
        for _ in range(25):
            a, b = f"w{rng.randrange(4)}", f"w{rng.randrange(4)}"
            action = rng.randrange(4)
            if action == 0:
                statuses.append(web.form("/v1/audio/voices", {"name": a, "instruct": "female"})[0])
            elif action == 1:
                statuses.append(web.request("PATCH", f"/v1/audio/voices/{a}", {"name": b})[0])
            elif action == 2:
                statuses.append(web.request("DELETE", f"/v1/audio/voices/{a}")[0])
            else:
                statuses.append(web.request("GET", "/v1/audio/voices")[0])
        return statuses

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = [status for result in pool.map(client, range(8)) for status in result]
    assert set(statuses) <= {200, 201, 404, 409}, sorted(set(statuses))
    for path in web.voices.glob("w*.json"):
        path.unlink()


@pytest.mark.slow
def test_speed_at_both_ends_over_http_clone_and_speak(web: Web, pipeline, tmp_path: Path) -> None:
    speech = {"model": "omnivoice", "voice": "alloy", "input": "Hi.", "num_step": 2}
    for speed, expected in ((MIN_SPEED, 200), (MAX_SPEED, 200), (0.24, 400), (4.01, 400)):
        status, body = web.request("POST", "/v1/audio/speech", {**speech, "speed": speed})
        assert status == expected, (speed, body[:300])
    fields = {"input": "Hi.", "ref_text": "A sine wave.", "num_step": "2", "speed": "0.25"}
    status, body = web.form("/v1/audio/speech/clone", fields, reference(2.0, 24000, 1))
    assert status == 200, body[:300]
    out = tmp_path / "slow.wav"
    done = omnivoice(
        "speak", "Hi.", "--model-dir", pipeline.onnx, "--speed", "0.25", "--num-step", "2", "--out", out, "--quiet"
    )
    assert done.returncode == 0 and out.exists(), done.stderr


@pytest.mark.slow
def test_uploads_queue_like_work_within_their_memory_bound(web: Web) -> None:
    """8 concurrent 10 MB clone uploads are encoded by the worker one at a time (pool.Task) and wait
    for it spooled to disk, so they cost the server no more than one upload after another: past the
    peak two sequential ones reach (one reference's decoding, the allocator settled), 8 at once add
    less than one body each (before: +1.5 GB, 8 decodings at once). An upload takes its place
    before its body is read: past workers + queue held at once, the next is 429 without reading."""
    audio = reference(52.0)
    assert 9.5e6 < len(audio) < 10.5e6
    fields = {"input": "Hi.", "ref_text": "A sine wave reference.", "num_step": "2"}
    for _ in range(2):
        assert web.form("/v1/audio/speech/clone", fields, audio)[0] == 200
    sequential = web.status("VmHWM")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: web.form("/v1/audio/speech/clone", fields, audio)[0], range(8)))
    concurrent_peak = web.status("VmHWM")
    assert statuses == [200] * 8 and concurrent_peak - sequential < 8 * 10, (sequential, concurrent_peak)
    slots = json.loads(web.request("GET", "/health")[1])
    held = []
    try:  # each holds an upload slot: its headers say 10 MB are coming, and none do
        for _ in range(slots["workers"] + slots["queue_size"]):
            sock = socket.create_connection(("127.0.0.1", web.port), timeout=30)
            sock.sendall(
                b"POST /v1/audio/references?ref_text=Hi. HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: audio/wav\r\nContent-Length: 10000000\r\n\r\nRIFF"
            )
            held.append(sock)
        time.sleep(1)
        status, body = web.request("POST", "/v1/audio/references?ref_text=Hi.", audio)
        assert status == 429 and json.loads(body)["error"]["code"] == "queue_full", body[:300]
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 30  # the held slots go back as their connections close
    while web.request("POST", "/v1/audio/references?ref_text=Hi.", reference(1.0, 24000, 1))[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)


@pytest.mark.slow
def test_no_auth_warns_once_listening(pipeline, tmp_path: Path) -> None:
    from serving import launch

    env = {key: value for key, value in os.environ.items() if key != "OMNIVOICE_API_KEY"}
    log = tmp_path / "server.log"
    launched = launch(
        pipeline.onnx, log, "--host", "0.0.0.0", "--no-auth", "--threads", "1", env=env, start_timeout=START_S
    )
    assert launched.stop(START_S) == 0
    text = log.read_text()
    assert text.index("listening on http://0.0.0.0:") < text.index("WITHOUT AUTHENTICATION"), text
