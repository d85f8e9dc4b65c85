"""omnivoice-onnx serve, as its clients see it: a real server process on a free loopback port,
driven by the official `openai` client and by raw HTTP (http.client, sockets).

One server (module fixture) serves most tests: 1 worker, 1 thread, a queue of 2, an API key, a
voices folder with one design voice. The SIGTERM test starts its own. Every wait is bounded:
the server must be up within SERVER_START_S, a request answers within REQUEST_S.
"""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from serving import Launched, launch  # noqa: E402

from omnivoice_onnx import OmniVoiceOnnx, audio_formats  # noqa: E402
from omnivoice_onnx.serve import door  # noqa: E402
from omnivoice_onnx.serve import service as server_service  # noqa: E402
from omnivoice_onnx.voices import PRESETS, Voice, load_voice, save_voice  # noqa: E402

pytestmark = pytest.mark.slow  # the session pipeline's tiny export

KEY = "test-key"
SERVER_START_S = 60
REQUEST_S = 120
TEXT = "Hello there."
LONG_TEXT = (
    "The first sentence is here. A second one follows it, somewhat longer than the first. "
    "Then a third, so that a stream has several chunks to send. And a fourth to end it."
)
STREAM_TEXT = "The first sentence is here. A second one follows it, somewhat longer than the first."
STREAM_STEPS = 8  # streams are checked for bytes, not quality: few steps keep the five streams cheap


class Server:
    """A running `omnivoice-onnx serve` (tests/serving.py.launch) and how to reach it."""

    def __init__(self, launched: Launched) -> None:
        self.launched, self.proc, self.port, self.log = launched, launched.process, launched.port, launched.log

    def client(self, key: str = KEY, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.launched.base_url, api_key=key, max_retries=0, timeout=REQUEST_S, **kwargs)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict | None = None,
        key: str | None = KEY,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_S)
        sent = {"Authorization": f"Bearer {key}"} if key else {}
        if isinstance(body, dict):
            body, sent["Content-Type"] = json.dumps(body).encode(), "application/json"
        sent.update(headers or {})
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    def health(self) -> dict:
        return json.loads(self.request("GET", "/health", key=None)[2])


def start_server(onnx: Path, voices: Path, log: Path, *flags: str) -> Server:
    env = {**os.environ, "OMNIVOICE_ORT_THREADS": "1"}
    env.pop(server_service.API_KEY_ENV, None)
    return Server(
        launch(onnx, log, "--voices", str(voices), "--threads", "1", *flags, env=env, start_timeout=SERVER_START_S)
    )


@pytest.fixture(scope="module")
def tts(pipeline) -> OmniVoiceOnnx:
    """The runtime in-process, one thread like the server's worker: its audio is the reference."""
    return OmniVoiceOnnx.from_dir(pipeline.onnx, threads=1)


@pytest.fixture(scope="module")
def voices(tts, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("voices")
    fingerprint = tts.metadata["model_fingerprint"]
    save_voice(folder, "narrator", Voice("narrator", None, "female, low pitch", fingerprint, Path()))
    rng = np.random.default_rng(0)
    reference = 0.3 * np.sin(np.arange(2 * tts.sample_rate) * 0.05) + 0.05 * rng.standard_normal(2 * tts.sample_rate)
    prompt = tts.create_voice_clone_prompt((reference.astype(np.float32), tts.sample_rate), "A short reference.")
    save_voice(folder, "clone", Voice("clone", prompt, None, fingerprint, Path()))
    return folder


@pytest.fixture(scope="module")
def srv(pipeline, voices, tmp_path_factory):
    running = start_server(
        pipeline.onnx,
        voices,
        tmp_path_factory.mktemp("server") / "server.log",
        "--api-key",
        KEY,
        "--queue",
        "2",
        "--default-format",
        "wav",
    )
    yield running
    assert running.launched.stop(SERVER_START_S) == 0, running.log.read_text()[-3000:]
    assert "Traceback" not in running.log.read_text()


def pcm16(samples: np.ndarray) -> np.ndarray:
    return audio_formats.to_pcm16(samples)


def error_of(body: bytes) -> dict:
    """The OpenAI-shaped error object of a response body (asserted to be one)."""
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_routes(srv):
    client = srv.client()
    models = client.models.list()
    assert [m.id for m in models.data][0] == "omnivoice"
    status, _, body = srv.request("GET", "/v1/audio/voices")
    listed = json.loads(body)
    assert status == 200 and [item["id"] for item in listed["data"]] == [
        "auto",
        "clone",
        "narrator",
        *PRESETS,
    ]
    assert listed["voices"] == [{"id": item["id"], "name": item["name"]} for item in listed["data"]]
    health = srv.health()
    assert health["status"] == "ok" and health["workers"] == 1 and health["queue_size"] == 2
    status, _, body = srv.request("GET", "/v1/nothing")
    assert status == 404 and error_of(body)["code"] == "not_found"


def test_every_format_decodes_and_seed_equals_generate(srv, tts):
    """Whole clips: each format decodes; a seed gives generate()'s audio (16-bit formats exactly)."""
    client = srv.client()
    want = pcm16(tts.generate(TEXT, seed=7)[0])
    for fmt in audio_formats.available_response_formats():
        response = client.audio.speech.create(
            model="omnivoice", voice="auto", input=TEXT, response_format=fmt, extra_body={"seed": 7}
        )
        data = response.read()
        assert response.response.headers["x-seed"] == "7"
        if fmt == "pcm":
            got = np.frombuffer(data, "<i2")
        else:
            got, rate = sf.read(io.BytesIO(data), dtype="int16")
            assert rate == tts.sample_rate
        if fmt in ("pcm", "wav", "flac"):
            np.testing.assert_array_equal(got, want, err_msg=fmt)
        else:  # lossy: the same length, within the codec's delay
            assert abs(len(got) - len(want)) <= tts.sample_rate // 10, fmt


def test_extensions_and_voices(srv, tts, voices):
    """language, num_step, guidance_scale, duration, speed and saved voices (design, clone) reach generate()."""
    client = srv.client()
    response = client.audio.speech.create(
        model="omnivoice",
        voice="narrator",
        input=TEXT,
        response_format="pcm",
        speed=1.5,
        extra_body={"seed": 3, "language": "English", "num_step": 8, "guidance_scale": 1.0},
    )
    want = tts.generate(
        TEXT,
        seed=3,
        language="English",
        instruct="female, low pitch",
        speed=1.5,
        generation_config={"num_step": 8, "guidance_scale": 1.0},
    )[0]
    np.testing.assert_array_equal(np.frombuffer(response.read(), "<i2"), pcm16(want))
    clone = load_voice("clone", voices, tts.metadata["model_fingerprint"])
    response = client.audio.speech.create(
        model="omnivoice", voice="clone", input=TEXT, response_format="pcm", extra_body={"seed": 3, "num_step": 4}
    )
    want = tts.generate(TEXT, seed=3, voice_clone_prompt=clone.prompt, generation_config={"num_step": 4})[0]
    np.testing.assert_array_equal(np.frombuffer(response.read(), "<i2"), pcm16(want))
    response = client.audio.speech.create(
        model="omnivoice",
        voice="auto",
        input=TEXT,
        response_format="pcm",
        extra_body={"seed": 3, "duration": 2.0, "num_step": 4},
    )
    assert (
        len(response.read()) // 2
        == pcm16(tts.generate(TEXT, seed=3, duration=2.0, generation_config={"num_step": 4})[0]).size
    )


def test_streams_concatenate(srv, tts):
    """stream_format audio (wav, pcm, opus) and sse: the chunks form one valid stream, equal to
    OmniVoiceOnnx.stream() with the same seed."""
    client = srv.client()
    chunks = list(tts.stream(STREAM_TEXT, seed=5, generation_config={"num_step": STREAM_STEPS}))
    assert len(chunks) > 1  # a stream of several chunks, or this test would prove little
    want = pcm16(np.concatenate([c.samples for c in chunks]))
    for fmt in ("pcm", "wav", "opus"):
        with client.audio.speech.with_streaming_response.create(
            model="omnivoice",
            voice="auto",
            input=STREAM_TEXT,
            response_format=fmt,
            stream_format="audio",
            extra_body={"seed": 5, "num_step": STREAM_STEPS},
        ) as response:
            pieces = list(response.iter_bytes())
        data = b"".join(pieces)
        if fmt == "opus":
            got, _ = sf.read(io.BytesIO(data), dtype="int16")
            assert abs(len(got) - len(want)) <= tts.sample_rate // 10
            continue
        got = np.frombuffer(data, "<i2") if fmt == "pcm" else sf.read(io.BytesIO(data), dtype="int16")[0]
        np.testing.assert_array_equal(got, want, err_msg=fmt)
    status, headers, body = srv.request(
        "POST",
        "/v1/audio/speech",
        {
            "model": "omnivoice",
            "voice": "auto",
            "input": STREAM_TEXT,
            "response_format": "pcm",
            "stream_format": "sse",
            "seed": 5,
            "num_step": STREAM_STEPS,
        },
    )
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: ") :]) for line in body.decode().splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] > 0
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    np.testing.assert_array_equal(np.frombuffer(audio, "<i2"), want)


def test_pauses_and_volume_streamed_or_whole(srv, tts, voices):
    """sentence_silence and volume (piper's options) reach the runtime: with a saved clone voice the
    streamed answer (the openai SDK) and the whole one ("stream": false) are the same bytes, stream()'s."""
    prompt = load_voice("clone", voices, tts.metadata["model_fingerprint"]).prompt
    fields = {"seed": 5, "num_step": STREAM_STEPS, "sentence_silence": 0.25, "volume": 0.5}
    config = {"generation_config": {"num_step": STREAM_STEPS}, "seed": 5, "voice_clone_prompt": prompt}
    chunks = list(tts.stream(STREAM_TEXT, **config, sentence_silence=0.25, volume=0.5))
    want = pcm16(np.concatenate([c.samples for c in chunks]))
    plain = sum(c.samples.size for c in tts.stream(STREAM_TEXT, **config))
    assert len(chunks) > 1 and want.size == plain + (len(chunks) - 1) * round(0.25 * tts.sample_rate)
    with srv.client().audio.speech.with_streaming_response.create(
        model="omnivoice", voice="clone", input=STREAM_TEXT, response_format="pcm", extra_body=fields
    ) as response:
        np.testing.assert_array_equal(np.frombuffer(b"".join(response.iter_bytes()), "<i2"), want)
    body = {"model": "omnivoice", "voice": "clone", "input": STREAM_TEXT, "response_format": "pcm", "stream": False}
    status, headers, data = srv.request("POST", "/v1/audio/speech", {**body, **fields})
    assert status == 200 and int(headers["content-length"]) == 2 * want.size
    np.testing.assert_array_equal(np.frombuffer(data, "<i2"), want)


def test_bad_requests(srv, voices, tmp_path):
    """400s name the field; none carries a server path."""
    base = {"model": "omnivoice", "voice": "auto", "input": TEXT}
    cases = [
        ({"voice": "nobody"}, "voice", "auto, clone, narrator"),
        ({"voice": "../etc/passwd"}, "voice", "not a voice name"),
        ({"voice": {"id": "nobody"}}, "voice", "unknown voice"),
        ({"voice": "design"}, "instructions", "needs `instructions`"),
        ({"input": "x" * (door.MAX_INPUT_CHARS + 1)}, "input", "longer than"),
        ({"input": ""}, "input", "at least 1"),
        ({"speed": 4.5}, "speed", "less than or equal to 4"),
        ({"sentence_silence": 5.5}, "sentence_silence", "less than or equal to 5"),
        ({"volume": -0.5}, "volume", "greater than or equal to 0"),
        ({"volume": "loud"}, "volume", "must be a number"),
        ({"response_format": "aac"}, "response_format", "not available"),
        ({"response_format": "flac", "stream_format": "audio"}, "response_format", "cannot be streamed"),
        ({"sped": 2}, "sped", "unknown field"),
        ({"num_step": 0}, "num_step", "greater than or equal to 1"),
        ({"language": "Klingonish"}, None, "unknown language"),
        ({"num_step": 100_000}, None, "MAX_NUM_STEP"),  # the runtime's limits (omnivoice_onnx.limits)
        ({"duration": 10_000}, None, "MAX_DURATION_S"),
    ]
    for change, param, words in cases:
        status, _, body = srv.request("POST", "/v1/audio/speech", {**base, **change})
        error = error_of(body)
        assert status == 400 and error["param"] == param and words in error["message"], (change, error)
        assert str(tmp_path.parent.parent) not in error["message"] and "Traceback" not in error["message"]
    status, _, body = srv.request(
        "POST", "/v1/audio/speech", b"{not json", headers={"Content-Type": "application/json"}
    )
    assert status == 400 and error_of(body)["code"] == "invalid_json"
    status, _, body = srv.request("POST", "/v1/audio/speech", {**base, "model": "whisper-1"})
    assert status == 404 and error_of(body)["code"] == "model_not_found"
    # A voice of another model: refused by the runtime, whose message names the file; the client's doesn't.
    foreign = save_voice(voices, "foreign", Voice("foreign", None, "male", "0" * 64, Path()))
    try:
        status, _, body = srv.request("POST", "/v1/audio/speech", {**base, "voice": "foreign"})
    finally:
        foreign.unlink()
    error = error_of(body)
    assert status == 400 and "made for model" in error["message"], error
    assert str(voices) not in error["message"] and "<voices>" in error["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        srv.client().audio.speech.create(model="omnivoice", voice="nobody", input=TEXT)
    assert caught.value.status_code == 400 and "narrator" in caught.value.message


def test_auth_and_body_limit(srv):
    status, _, body = srv.request("GET", "/v1/models", key=None)
    assert status == 401 and error_of(body)["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        srv.client(key="wrong").models.list()
    assert srv.request("GET", "/health", key=None)[0] == 200  # load balancers probe without the key
    status, _, body = srv.request("GET", "/openapi.json")  # was a 500: no schema is served, a JSON 404 says so
    assert status == 404 and error_of(body)["code"] == "not_found"
    for scheme in ("bearer", "BEARER"):  # RFC 7235: the scheme name is case-insensitive
        assert srv.request("GET", "/v1/models", key=None, headers={"Authorization": f"{scheme} {KEY}"})[0] == 200
    big = json.dumps({"model": "omnivoice", "voice": "auto", "input": "x" * (door.MAX_BODY_BYTES + 1)}).encode()
    status, _, body = srv.request("POST", "/v1/audio/speech", big, headers={"Content-Type": "application/json"})
    assert status == 413 and error_of(body)["code"] == "body_too_large"
    # The same without Content-Length (chunked upload): refused while it is read, not after.
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=REQUEST_S)
    conn.request(
        "POST",
        "/v1/audio/speech",
        body=iter([big[i : i + 8192] for i in range(0, len(big), 8192)]),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        encode_chunked=True,
    )
    response = conn.getresponse()
    assert response.status == 413 and error_of(response.read())["code"] == "body_too_large"
    conn.close()


def test_page_is_open_and_voice_saving_is_off(srv):
    """The page at / needs no key (its own requests send it); saving a voice over HTTP needs the key
    AND --allow-voice-save, which this server lacks: 403, before the upload is read."""
    status, headers, body = srv.request("GET", "/", key=None)
    assert status == 200 and headers["content-type"].startswith("text/html") and b"/v1/audio/speech" in body
    path = "/v1/audio/references?ref_text=Words.&save_as=kept"
    assert srv.request("POST", path, b"RIFF", key=None)[0] == 401
    status, _, body = srv.request("POST", path, b"RIFF")
    error = error_of(body)
    assert status == 403 and error["code"] == "voice_save_disabled" and "--allow-voice-save" in error["message"]


def test_queue_full_is_429(srv):
    """1 worker + 2 queued: of 8 simultaneous requests some get 429 with Retry-After, none fails
    otherwise, and every accepted one returns audio."""
    body = {"model": "omnivoice", "voice": "auto", "input": LONG_TEXT, "response_format": "pcm", "num_step": 8}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: srv.request("POST", "/v1/audio/speech", body), range(8)))
    statuses = sorted(status for status, _, _ in results)
    assert set(statuses) == {200, 429} and statuses.count(200) >= 3, statuses
    for status, headers, data in results:
        if status == 429:
            assert int(headers["retry-after"]) >= 1 and error_of(data)["type"] == "rate_limit_error"
        else:
            assert len(data) > 0
    assert srv.health()["running"] == 0


def wait_for(condition, what: str, timeout: float = REQUEST_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def open_request(srv: Server, body: dict) -> socket.socket:
    """A raw socket that has sent a speech request and not read the answer."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=REQUEST_S)
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def test_disconnect_cancels(srv):
    """A client that leaves: its running request stops between steps, its queued one is dropped,
    and the worker is free for the next request."""
    body = {"model": "omnivoice", "voice": "auto", "input": LONG_TEXT * 4, "response_format": "pcm", "num_step": 256}
    before = srv.health()
    running = open_request(srv, body)
    wait_for(lambda: srv.health()["running"] == 1, "the first request to run")
    queued = open_request(srv, body)
    wait_for(lambda: srv.health()["queued"] == 1, "the second request to queue")
    queued.close()
    running.close()
    wait_for(lambda: srv.health()["cancelled"] == before["cancelled"] + 2, "both to be cancelled")
    assert srv.health()["completed"] == before["completed"] and srv.health()["running"] == 0
    # Mid-stream: read the first bytes, then leave.
    sock = open_request(srv, {**body, "stream_format": "audio"})
    assert sock.recv(1024).startswith(b"HTTP/1.1 200")
    sock.close()
    wait_for(lambda: srv.health()["cancelled"] == before["cancelled"] + 3, "the stream to be cancelled")
    assert len(srv.client().audio.speech.create(model="omnivoice", voice="auto", input=TEXT).read()) > 44


def test_timeout_then_sigterm_drains_and_exits_0(pipeline, voices, tmp_path):
    """Its own server, --timeout 4: a second server on its port is refused in one line (exit 2); a
    request past the timeout gets 504 (stopped between steps). Then SIGTERM
    with a request in flight: the request completes, the process exits 0, the port closes."""
    srv = start_server(pipeline.onnx, voices, tmp_path / "server.log", "--timeout", "4")
    try:
        busy = subprocess.run(
            [
                sys.executable,
                "-m",
                "omnivoice_onnx",
                "serve",
                "--model-dir",
                str(pipeline.onnx),
                "--port",
                str(srv.port),
            ],
            capture_output=True,
            text=True,
            timeout=SERVER_START_S,
        )
        assert busy.returncode == 2 and busy.stderr.count("\n") == 1 and "Address already in use" in busy.stderr
        status, _, body = srv.request(
            "POST",
            "/v1/audio/speech",
            {
                "model": "omnivoice",
                "voice": "auto",
                "input": LONG_TEXT * 8,
                "response_format": "wav",
                "num_step": 256,
                "stream": False,  # the whole clip: the timeout comes before any byte, as a status
            },
            None,
        )
        assert status == 504 and error_of(body)["code"] == "timeout"
        wait_for(lambda: srv.health()["timed_out"] == 1 and srv.health()["running"] == 0, "the worker to stop")
        body = {
            "model": "omnivoice",
            "voice": "auto",
            "input": STREAM_TEXT,
            "response_format": "wav",
            "num_step": 4,
            "seed": 1,
        }
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(srv.request, "POST", "/v1/audio/speech", body, None)
            wait_for(lambda: srv.health()["running"] == 1, "the request to run")
            srv.proc.send_signal(signal.SIGTERM)
            status, _, data = pending.result(REQUEST_S)
        assert status == 200 and sf.read(io.BytesIO(data))[0].size > 0
        assert srv.proc.wait(SERVER_START_S) == 0
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", srv.port), timeout=5).close()
    finally:
        srv.launched.stop(SERVER_START_S)


def test_without_the_extra_one_line(monkeypatch, capsys, tmp_path):
    """`omnivoice-onnx serve` where fastapi is not installed: one line naming the extra, exit 2."""
    from omnivoice_onnx.__main__ import main

    monkeypatch.setitem(sys.modules, "fastapi", None)  # import fastapi -> ModuleNotFoundError
    with pytest.raises(SystemExit) as stopped:
        main(["serve", "--model-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(err) == 1 and "omnivoice-onnx[serve]" in err[0], err
