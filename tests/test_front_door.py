"""The front door (omnivoice_onnx.serve.door): what a hostile or confused peer meets on the network.

Real server processes on free loopback ports (`omnivoice-onnx serve` and `omnivoice-onnx wyoming`,
module fixtures sharing one voices folder), driven by raw sockets where the peer does not speak
the protocol, by the `wyoming` package's own client and by HTTP where it does, and by headless
Chromium for what a web page can do. Every refusal is checked by its code and message from the
one error table, both servers keep serving, and their logs hold no traceback. Memory is bounded
by the servers' own refusals (sizes declared before they are read), not by timing.
"""

from __future__ import annotations

import asyncio
import http.client
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("wyoming")

from conftest import headless_chromium, single_stderr_line  # noqa: E402
from serving import Launched, launch  # noqa: E402
from test_server import tts  # noqa: E402,F401  (the runtime in-process: the voices' fingerprint)
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.error import Error  # noqa: E402
from wyoming.event import Event  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeVoice  # noqa: E402

from omnivoice_onnx.serve import door  # noqa: E402
from omnivoice_onnx.serve.service import API_KEY_ENV  # noqa: E402
from omnivoice_onnx.voices import Voice, save_voice  # noqa: E402

pytestmark = pytest.mark.slow  # the session pipeline's tiny export

START_S = 60
READ_S = 60
ALLOWED_ORIGIN = "http://127.0.0.1:1"  # a --cors-origin no page here is served from


# The Wyoming server's door timeouts, set through the environment as an operator sets them: short,
# so that the slow-peer test waits seconds for the cut-offs, not the defaults' 10 and 30.
WY_TIMEOUTS = {"HEADER_TIMEOUT_S": 2.0, "BODY_TIMEOUT_S": 3.0}


def start(onnx: Path, voices: Path, log: Path, command: str, *flags: str, **env_more: str) -> Launched:
    env = {**os.environ, "OMNIVOICE_ORT_THREADS": "1", **env_more}
    env.pop(API_KEY_ENV, None)
    return launch(
        onnx, log, "--voices", str(voices), "--threads", "1", *flags, env=env, start_timeout=START_S, command=command
    )


def stopped_cleanly(server: Launched) -> str:
    """Stop `server` (SIGTERM, bounded); its log, asserted free of tracebacks."""
    code = server.stop(START_S)
    text = server.log.read_text()
    assert code == 0 and "Traceback" not in text and "CancelledError" not in text, text[-3000:]
    return text


@pytest.fixture(scope="module")
def voices(tts, tmp_path_factory) -> Path:  # noqa: F811
    folder = tmp_path_factory.mktemp("door-voices")
    save_voice(
        folder, "narrator", Voice("narrator", None, "female, low pitch", tts.metadata["model_fingerprint"], Path())
    )
    return folder


@pytest.fixture(scope="module")
def wy(pipeline, voices, tmp_path_factory) -> Launched:
    timeouts = {f"OMNIVOICE_{name}": str(value) for name, value in WY_TIMEOUTS.items()}
    server = start(
        pipeline.onnx, voices, tmp_path_factory.mktemp("door-wy") / "wyoming.log", "wyoming", "--seed", "7", **timeouts
    )
    yield server
    stopped_cleanly(server)


@pytest.fixture(scope="module")
def web(pipeline, voices, tmp_path_factory) -> Launched:
    server = start(
        pipeline.onnx,
        voices,
        tmp_path_factory.mktemp("door-web") / "server.log",
        "serve",
        "--allow-voice-save",
        "--default-format",
        "wav",
        "--cors-origin",
        ALLOWED_ORIGIN,
    )
    yield server
    stopped_cleanly(server)


# --- clients -------------------------------------------------------------------------------------


def raw_wyoming(port: int, data: bytes, wait_s: float = READ_S, until: int | None = None) -> tuple[list[dict], bool]:
    """Send `data` on a new connection; (the events read back, whether the server closed it)
    within `wait_s`. With `until`, reading stops once that many whole events have come, and
    `closed` says whether the server closed the connection before they all came; without it,
    reading goes on for a second after an error event to see whether the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(data)
        received, closed = b"", False
        deadline = time.monotonic() + wait_s
        try:
            while time.monotonic() < deadline:
                chunk = sock.recv(65536)
                if not chunk:
                    closed = True
                    break
                received += chunk
                if until is not None:
                    if len(split_events(received)[0]) >= until:
                        break
                elif b'"error"' in received and received.count(b"\n") >= 1 and received.endswith(b"}"):
                    sock.settimeout(1.0)  # an error event came: is the connection closed after it?
        except TimeoutError:
            pass
        except ConnectionResetError:
            closed = True
    return parse_events(received), closed


def split_events(data: bytes) -> tuple[list[dict], bytes]:
    """The whole Wyoming events at the start of `data` (header line, then data and payload bytes),
    as {"type", "data"}, and the bytes of an event not yet whole."""
    events = []
    while b"\n" in data:
        line, _, after = data.partition(b"\n")
        header = json.loads(line)
        length, payload = header.get("data_length") or 0, header.get("payload_length") or 0
        if len(after) < length + payload:
            break
        body, data = after[:length], after[length + payload :]
        events.append(
            {"type": header["type"], "data": {**header.get("data", {}), **(json.loads(body) if body else {})}}
        )
    return events, data


def parse_events(data: bytes) -> list[dict]:
    """Wyoming events in `data`, every one of them whole."""
    events, rest = split_events(data)
    assert rest == b"", f"an event cut short: {rest[:200]!r}"
    return events


def exchange(port: int, *events) -> list[Event]:
    """Send `events` on one connection with the wyoming client; read until an end event."""

    async def talk() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", port, connect_timeout=READ_S, read_timeout=READ_S) as client:
            for event in events:
                await client.write_event(event if isinstance(event, Event) else event.event())
            received = []
            while not received or received[-1].type not in ("audio-stop", "error", "info", "synthesize-stopped"):
                event = await client.read_event()
                assert event is not None, f"connection closed after {[e.type for e in received]}"
                received.append(event)
            return received

    return asyncio.run(talk())


def header_event(kind: str, data: dict | None = None, **header) -> bytes:
    body = json.dumps(data).encode() if data is not None else b""
    head = {"type": kind, **({"data_length": len(body)} if body else {}), **header}
    return json.dumps(head).encode() + b"\n" + body


def http_request(
    port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=READ_S)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def http_error(port: int, method: str, path: str, body: bytes | None = None, **headers: str) -> tuple[int, dict]:
    status, _, data = http_request(
        port, method, path, body, {key.replace("_", "-"): value for key, value in headers.items()}
    )
    return status, json.loads(data)["error"]


def speech(**fields) -> bytes:
    return json.dumps({"model": "omnivoice", "voice": "alloy", "input": "Hello.", **fields}).encode()


def health(port: int) -> dict:
    return json.loads(http_request(port, "GET", "/health")[2])


# --- Wyoming: a peer that does not speak the protocol ---------------------------------------------


@pytest.mark.parametrize(
    "data,code",
    [
        (b"[]\n", "invalid_type"),
        (b'"describe"\n', "invalid_type"),
        (b'{"data": {}}\n', "invalid_event"),  # no type
        (b'{"type": "describe", "data_length": "abc"}\n', "invalid_event"),
        (b'{"type": "describe", "data_length": -1}\n', "invalid_event"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "invalid_json"),
        (b'{"type": "describe", "payload_length": 268435456}\n', "body_too_large"),  # refused before it is read
        (b"{" * 100_000 + b"\n", "invalid_event"),  # a header line over the limit
    ],
)
def test_wyoming_unframed_peer_gets_one_error_and_is_closed(wy: Launched, data: bytes, code: str) -> None:
    events, closed = raw_wyoming(wy.port, data, wait_s=10)
    assert [event["type"] for event in events] == ["error"] and closed, events
    assert events[0]["data"]["code"] == code and from_the_table(code, events[0]["data"]["text"]), events


def from_the_table(code: str, text: str) -> bool:
    """Whether `text` is the message door.ERRORS gives `code` (its {fields} filled with anything)."""
    pattern = re.sub(r"\\\{[^}]*\\\}", ".+", re.escape(door.ERRORS[code].message))
    return re.fullmatch(pattern, text) is not None


@pytest.mark.parametrize(
    "event,code",
    [
        (header_event("synthesize", {"text": 5}), "invalid_type"),
        (header_event("synthesize", {"text": "Hello.", "voice": "alloy"}), "invalid_type"),  # a bare string
        (header_event("synthesize", {"voice": {"name": "alloy"}}), "missing_required_parameter"),
        (header_event("synthesize", {"text": "Hello.", "voice": {"name": 3}}), "invalid_type"),
        (header_event("synthesize-start", {"voice": ["alloy"]}), "invalid_type"),
    ],
)
def test_wyoming_bad_field_gets_an_error_and_the_connection_ends(wy: Launched, event: bytes, code: str) -> None:
    """One error naming the field, then the server closes the connection, as wyoming-piper does:
    a client that waits for AudioStop or EOF (a proxy) learns at once that the request ended."""
    started = time.monotonic()
    events, closed = raw_wyoming(wy.port, event)
    assert [e["type"] for e in events] == ["error"] and events[0]["data"]["code"] == code, events
    assert closed and time.monotonic() - started < 5, "the connection stayed open after the error"


def test_wyoming_slow_and_lying_peers_are_cut_off_while_others_are_served(wy: Launched) -> None:
    """A half-sent header ends in header_timeout, a data_length larger than what follows in
    body_timeout, each after the time the server's environment set (WY_TIMEOUTS); meanwhile
    another client's describe is answered at once."""
    results: dict[str, tuple[list[dict], bool, float]] = {}
    body_limit = WY_TIMEOUTS["BODY_TIMEOUT_S"] + 100 / door.MIN_BODY_RATE

    def hold(name: str, data: bytes) -> None:
        started = time.monotonic()
        events, closed = raw_wyoming(wy.port, data, wait_s=body_limit + 15)
        results[name] = (events, closed, time.monotonic() - started)

    threads = [
        threading.Thread(target=hold, args=("half", b'{"type": "descr')),
        threading.Thread(target=hold, args=("lie", b'{"type": "describe", "data_length": 100}\n{"a": 1}')),
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    started = time.monotonic()
    (info,) = exchange(wy.port, Describe())
    assert Info.is_type(info.type) and time.monotonic() - started < 10
    for thread in threads:
        thread.join()
    for name, code, limit in (
        ("half", "header_timeout", WY_TIMEOUTS["HEADER_TIMEOUT_S"]),
        ("lie", "body_timeout", body_limit),
    ):
        events, closed, seconds = results[name]
        assert [e["data"].get("code") for e in events] == [code] and closed, (name, events)
        assert events[0]["data"]["text"] == door.refuse(code, seconds=limit).message  # the time set
        assert limit - 0.5 < seconds < limit + 10, (name, seconds)


def first_answer_comes_as(port: int, kind: str) -> None:
    """Ask describe on new connections until the first event back is a `kind` (at most READ_S):
    the server takes and drops connections on its own time."""
    deadline, events = time.monotonic() + READ_S, []
    while time.monotonic() < deadline:
        events, _ = raw_wyoming(port, header_event("describe"), until=1)
        if events and events[0]["type"] == kind:
            return
        time.sleep(0.05)
    raise AssertionError(f"no describe was answered with {kind} in {READ_S} s (last: {events})")


def test_wyoming_connections_are_capped(wy: Launched) -> None:
    """MAX_CONNECTIONS idle connections: one more gets too_many_connections and is closed; once
    they close, the server serves again."""
    held = [socket.create_connection(("127.0.0.1", wy.port), timeout=READ_S) for _ in range(door.MAX_CONNECTIONS)]
    try:
        first_answer_comes_as(wy.port, "error")  # the server has taken every held connection
        events, closed = raw_wyoming(wy.port, header_event("describe"), wait_s=READ_S)
        assert [e["data"].get("code") for e in events] == ["too_many_connections"] and closed, events
    finally:
        for sock in held:
            sock.close()
    first_answer_comes_as(wy.port, "info")  # the server has seen them close
    (info,) = exchange(wy.port, Describe())
    assert Info.is_type(info.type)


def test_wyoming_streamed_text_without_a_sentence_end_is_bounded(wy: Launched) -> None:
    """Chunks that never end a sentence are held up to MAX_INPUT_CHARS, then refused."""
    chunk = "x" * 1000
    events = exchange(
        wy.port,
        SynthesizeStart(voice=SynthesizeVoice(name="alloy")),
        *[SynthesizeChunk(chunk) for _ in range(door.MAX_INPUT_CHARS // len(chunk) + 2)],
    )
    error = Error.from_event(events[-1])
    assert error.code == "string_above_max_length" and str(door.MAX_INPUT_CHARS) in error.text, error


# --- one table: the same bad request, the same answer on both surfaces ----------------------------


def wyoming_error(port: int, data: bytes) -> dict:
    events, _ = raw_wyoming(port, data, wait_s=READ_S, until=1)
    assert events and events[0]["type"] == "error", events
    return events[0]["data"]


@pytest.mark.parametrize(
    "name,http_body,wyoming_data,field",
    [
        ("wrong type", speech(input=5), header_event("synthesize", {"text": 5}), True),
        (
            "too long",
            speech(input="x" * (door.MAX_INPUT_CHARS + 1)),
            header_event("synthesize", {"text": "x" * (door.MAX_INPUT_CHARS + 1)}),
            True,
        ),
        ("nothing to say", speech(input="   "), header_event("synthesize", {"text": "   "}), False),
        (
            "unknown voice",
            speech(voice="nobody"),
            header_event("synthesize", {"text": "Hi.", "voice": {"name": "nobody"}}),
            False,
        ),
        ("not JSON", b"{oops", b"{oops\n", False),
        ("not an object", b"[]", b"[]\n", False),
        (
            "too large",
            speech(input="x" * door.MAX_BODY_BYTES),
            header_event("synthesize", {"text": "x" * door.MAX_BODY_BYTES}),
            False,
        ),
    ],
)
def test_http_and_wyoming_answer_a_bad_request_alike(
    web: Launched, wy: Launched, name: str, http_body: bytes, wyoming_data: bytes, field: bool
) -> None:
    """Same code, same message (a field named as its protocol names it: HTTP's `input` is
    Wyoming's `text`), both from door.ERRORS."""
    status, error = http_error(web.port, "POST", "/v1/audio/speech", http_body, content_type="application/json")
    got = wyoming_error(wy.port, wyoming_data)
    assert got["code"] == error["code"] and status == door.ERRORS[error["code"]].status, (name, error, got)
    message = error["message"].replace("input", "text") if field else error["message"]
    if name == "not an object":
        message = message.replace("request body", "event header")
    assert got["text"] == message, (name, error, got)


def test_a_damaged_voice_file_is_voices_unreadable_on_both(web: Launched, wy: Launched, voices: Path) -> None:
    damaged = voices / "damaged.json"
    damaged.write_text("{ not json")
    try:
        status, error = http_error(web.port, "GET", "/v1/audio/voices")
        got = wyoming_error(wy.port, header_event("describe"))
        assert (status, error["code"]) == (500, "voices_unreadable") and got["code"] == "voices_unreadable"
        assert got["text"] == error["message"] == door.ERRORS["voices_unreadable"].message
    finally:
        damaged.unlink()
    (info,) = exchange(wy.port, Describe())
    assert Info.is_type(info.type)


# --- Wyoming: stopping, and where it listens -------------------------------------------------------


def test_sigterm_mid_stream_ends_each_client_with_a_final_event(pipeline, voices, tmp_path: Path) -> None:
    """SIGTERM while one client streams text (no sentence end yet) and another's synthesis runs:
    each gets an Error (shutting_down) or its AudioStop, the log no traceback, the exit is clean."""
    server = start(pipeline.onnx, voices, tmp_path / "wyoming.log", "wyoming", "--drain-timeout", "0")
    results: dict[str, list[Event]] = {}

    async def streaming() -> None:
        async with AsyncTcpClient("127.0.0.1", server.port, connect_timeout=READ_S, read_timeout=READ_S) as client:
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="alloy")).event())
            await client.write_event(SynthesizeChunk("A sentence that has not ended").event())
            results["streaming"] = [await client.read_event()]

    async def speaking() -> None:
        async with AsyncTcpClient("127.0.0.1", server.port, connect_timeout=READ_S, read_timeout=READ_S) as client:
            await client.write_event(
                Synthesize(
                    " ".join(["A long sentence to keep the worker busy."] * 20), voice=SynthesizeVoice(name="alloy")
                ).event()
            )
            received = []
            while (event := await client.read_event()) is not None:
                received.append(event)
                if event.type in ("audio-stop", "error"):
                    break
            results["speaking"] = received

    async def both() -> None:
        tasks = [asyncio.ensure_future(streaming()), asyncio.ensure_future(speaking())]
        await asyncio.sleep(3.0)
        server.process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(asyncio.gather(*tasks), READ_S)

    asyncio.run(both())
    assert server.process.wait(START_S) in (0, 128 + signal.SIGTERM)
    (stream_end,) = results["streaming"]
    assert Error.is_type(stream_end.type) and Error.from_event(stream_end).code == "shutting_down"
    last = results["speaking"][-1]
    assert last.type == "audio-stop" or Error.from_event(last).code == "shutting_down", last
    text = server.log.read_text()
    assert "Traceback" not in text and "CancelledError" not in text, text[-3000:]


def test_wyoming_off_loopback_needs_allow_remote(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "omnivoice_onnx", "wyoming", "--model-dir", str(tmp_path), "--uri", "tcp://0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=START_S,
    )
    assert done.returncode == 2 and "--allow-remote" in single_stderr_line(done), done.stderr


@pytest.mark.parametrize("command", ["serve", "wyoming"])
def test_a_bad_door_timeout_stops_the_server_in_one_line(pipeline, command: str) -> None:
    """OMNIVOICE_BODY_TIMEOUT_S that is not a positive number: exit 2 and one line naming the
    variable, before any model loads or port opens, on both surfaces."""
    done = subprocess.run(
        [sys.executable, "-m", "omnivoice_onnx", command, "--model-dir", str(pipeline.onnx)],
        capture_output=True,
        text=True,
        timeout=START_S,
        env={**os.environ, "OMNIVOICE_BODY_TIMEOUT_S": "soon"},
    )
    line = single_stderr_line(done)
    assert done.returncode == 2 and "OMNIVOICE_BODY_TIMEOUT_S='soon' is not a positive number" in line, line
    assert "listening on" not in done.stdout + done.stderr


def test_wyoming_allow_remote_says_so_at_start(pipeline, voices, tmp_path: Path) -> None:
    log = tmp_path / "wyoming.log"
    env = {**os.environ, "OMNIVOICE_ORT_THREADS": "1"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "omnivoice_onnx",
            "wyoming",
            "--model-dir",
            str(pipeline.onnx),
            "--uri",
            "tcp://0.0.0.0:0",
            "--allow-remote",
            "--threads",
            "1",
            "--voices",
            str(voices),
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.monotonic() + START_S
        while "listening on" not in log.read_text() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(START_S) == 0
    text = log.read_text()
    assert "WITHOUT AUTHENTICATION" in text and "listening on tcp://0.0.0.0:" in text, text


# --- HTTP: what a web page can do ----------------------------------------------------------------


def test_foreign_host_refused_loopback_names_served(web: Launched) -> None:
    """DNS rebinding: a page under another name reaching 127.0.0.1 sends its own name as Host."""
    status, error = http_error(web.port, "GET", "/v1/audio/voices", host=f"rebind.example:{web.port}")
    assert (status, error["code"]) == (403, "host_not_allowed")
    status, _, _ = http_request(
        web.port,
        "POST",
        "/v1/audio/speech",
        speech(num_step=2),
        {"Host": "rebind.example", "Content-Type": "application/json"},
    )
    assert status == 403
    for host in (f"localhost:{web.port}", f"127.0.0.1:{web.port}", "app.localhost", f"[::1]:{web.port}"):
        assert http_request(web.port, "GET", "/v1/audio/voices", headers={"Host": host})[0] == 200, host


def test_cross_origin_posts_refused_before_any_work_or_write(web: Launched, voices: Path) -> None:
    before = health(web.port)
    status, error = http_error(
        web.port,
        "POST",
        "/v1/audio/speech",
        speech(num_step=2),
        content_type="text/plain",
        origin="http://evil.example",
    )
    assert (status, error["code"]) == (403, "cross_origin")
    status, error = http_error(
        web.port, "POST", "/v1/audio/speech", speech(num_step=2), content_type="text/plain", sec_fetch_site="cross-site"
    )  # a browser that sent no Origin
    assert (status, error["code"]) == (403, "cross_origin")
    saved = voices / "narrator.json"
    kept = saved.read_bytes()
    status, error = http_error(
        web.port,
        "POST",
        "/v1/audio/references?ref_text=hi&save_as=narrator",
        b"RIFF" * 100,
        origin=f"http://127.0.0.1:{web.port + 1}",
    )  # same site, another origin
    assert (status, error["code"]) == (403, "cross_origin")
    assert saved.read_bytes() == kept
    after = health(web.port)
    assert {k: after[k] for k in ("completed", "failed", "cancelled")} == {
        k: before[k] for k in ("completed", "failed", "cancelled")
    }


def test_cors_preflight_answers_only_allowed_origins(web: Launched) -> None:
    preflight = {
        "Origin": ALLOWED_ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization",
    }
    status, headers, _ = http_request(web.port, "OPTIONS", "/v1/audio/speech", headers=preflight)
    assert status == 204 and headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert (
        "POST" in headers["access-control-allow-methods"] and "authorization" in headers["access-control-allow-headers"]
    )
    status, headers, _ = http_request(
        web.port, "OPTIONS", "/v1/audio/speech", headers={**preflight, "Origin": "http://evil.example"}
    )
    assert status == 403 and "access-control-allow-origin" not in headers
    status, headers, _ = http_request(web.port, "GET", "/v1/audio/voices", headers={"Origin": ALLOWED_ORIGIN})
    assert status == 200 and headers["access-control-allow-origin"] == ALLOWED_ORIGIN


def test_page_sends_its_security_headers_and_keeps_no_key_in_local_storage(web: Launched) -> None:
    status, headers, body = http_request(web.port, "GET", "/")
    assert status == 200 and headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY" and headers["referrer-policy"] == "no-referrer"
    csp = headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp and "'unsafe-inline'" not in csp
    assert b"localStorage" not in body and b"sessionStorage" in body


class AttackerPage(http.server.BaseHTTPRequestHandler):
    """A page on another loopback port that tries the API: a text/plain fetch, a form POST that
    would overwrite a saved voice, and a read of the voice list."""

    api = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        api = f"http://127.0.0.1:{self.api}"
        page = f"""<!doctype html><html><body>
<form id="f" method="POST" enctype="text/plain" target="sink"
      action="{api}/v1/audio/references?ref_text=hi&save_as=narrator"><input name="x" value="y"></form>
<iframe name="sink"></iframe>
<script>
window.results = {{}};
fetch("{api}/v1/audio/speech", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}},
  body: JSON.stringify({{model: "omnivoice", voice: "alloy", input: "Hello.", num_step: 2}})}})
  .then(() => window.results.speech = "sent").catch((e) => window.results.speech = "failed");
fetch("{api}/v1/audio/voices").then((r) => r.text()).then((t) => window.results.voices = t)
  .catch((e) => window.results.voices = "blocked");
document.getElementById("f").submit();
window.results.form = "submitted";
</script></body></html>""".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args) -> None:
        pass


def test_cross_origin_page_and_rebinding_refused_in_chromium(web: Launched, voices: Path) -> None:
    """Headless Chromium: a page from another loopback port cannot make the API speak, save a
    voice or read the voice list; the API reached under a foreign name (DNS rebinding, mapped by
    the browser's resolver) answers 403."""
    AttackerPage.api = web.port
    attacker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AttackerPage)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    saved = voices / "narrator.json"
    kept, before = saved.read_bytes(), health(web.port)
    try:
        with headless_chromium(("--no-sandbox", "--host-resolver-rules=MAP rebind.test 127.0.0.1")) as browser:
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{attacker.server_address[1]}/", timeout=READ_S * 1000)
            page.wait_for_function("window.results.speech && window.results.voices", timeout=READ_S * 1000)
            results = page.evaluate("window.results")
            assert results["voices"] == "blocked" and results["form"] == "submitted", results
            rebound = browser.new_page()
            response = rebound.goto(f"http://rebind.test:{web.port}/v1/audio/voices", timeout=READ_S * 1000)
            assert response.status == 403 and "host_not_allowed" in rebound.content()
    finally:
        attacker.shutdown()
    deadline = time.monotonic() + 10
    log = web.log.read_text()
    while log.count("(cross_origin)") < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        log = web.log.read_text()
    assert "POST /v1/audio/speech (cross_origin)" in log and "POST /v1/audio/references (cross_origin)" in log
    assert saved.read_bytes() == kept
    after = health(web.port)
    assert after["completed"] == before["completed"] and after["failed"] == before["failed"]


def test_model_alias_must_be_one_printable_word(tmp_path: Path) -> None:
    for alias in ("", "two\nlines", "with space"):
        done = subprocess.run(
            [sys.executable, "-m", "omnivoice_onnx", "serve", "--model-dir", str(tmp_path), "--model-alias", alias],
            capture_output=True,
            text=True,
            timeout=START_S,
        )
        assert done.returncode == 2 and "is not a model id" in single_stderr_line(done), (alias, done.stderr)


def test_stream_cut_by_the_timeout_leaves_no_traceback(pipeline, voices, tmp_path: Path) -> None:
    server = start(pipeline.onnx, voices, tmp_path / "server.log", "serve", "--timeout", "3")
    body = json.dumps(
        {
            "model": "omnivoice",
            "voice": "alloy",
            "input": " ".join(["A long sentence."] * 40),
            "response_format": "pcm",
            "stream_format": "audio",
        }
    ).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=READ_S)
    try:
        conn.request("POST", "/v1/audio/speech", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status == 200:
            with pytest.raises(http.client.IncompleteRead):
                response.read()  # cut short: no final chunk
        else:
            assert response.status == 504
    finally:
        conn.close()
    text = stopped_cleanly(server)
    assert "stream cut short" in text or "504" in text, text[-2000:]
