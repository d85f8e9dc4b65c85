"""What real clients send to `omnivoice-onnx serve`: the `openai` SDK with its newest voices, any
case and prose instructions; OpenAI's default streamed mp3; Open WebUI's reading of the voice and
model lists; a one-call multipart clone from `requests` and `curl -F`; saved voices created,
renamed and deleted over HTTP; /metrics read by prometheus-client's parser; and the CLI's mp3
equal to the server's.

One server process (module fixture: an API key, --allow-voice-save, OpenAI's default format mp3,
a voices folder with one saved voice). Every wait is bounded.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
requests = pytest.importorskip("requests")
prometheus_parser = pytest.importorskip("prometheus_client.parser")

# tts: the runtime in-process, one thread like the server's worker (its audio is the reference)
from conftest import headless_chromium  # noqa: E402
from test_dropin import reference_wav  # noqa: E402
from test_server import LONG_TEXT, REQUEST_S, SERVER_START_S, Server, start_server, tts  # noqa: E402,F401

from omnivoice_onnx import OmniVoiceOnnx, audio_formats  # noqa: E402
from omnivoice_onnx.voices import PRESETS, Voice, save_voice  # noqa: E402

pytestmark = pytest.mark.slow  # the session pipeline's tiny export

KEY = "client-key"
STEPS = 4  # the checks compare bytes, not quality: few steps keep the model runs cheap
SAVED = "Narrator"  # a saved voice, spelt with a capital to be found in any case
PROSE = "Speak in a cheerful and positive tone."  # OpenAI's own example of instructions


@pytest.fixture(scope="module")
def voices(tts, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("voices")
    save_voice(folder, SAVED, Voice(SAVED, None, "male, low pitch", tts.metadata["model_fingerprint"], Path()))
    return folder


@pytest.fixture(scope="module")
def srv(pipeline, voices, tmp_path_factory):
    running = start_server(
        pipeline.onnx, voices, tmp_path_factory.mktemp("clients") / "server.log", "--api-key", KEY, "--allow-voice-save"
    )
    yield running
    assert running.launched.stop(SERVER_START_S) == 0, running.log.read_text()[-3000:]
    assert "Traceback" not in running.log.read_text()


def client(srv: Server) -> openai.OpenAI:
    return srv.client(key=KEY)


def wav_pcm(data: bytes) -> np.ndarray:
    return sf.read(io.BytesIO(data), dtype="int16")[0]


def few_steps(**extra) -> dict:
    return {"num_step": STEPS, **extra}


def test_sdk_voices_any_case_and_prose_instructions(srv: Server, tts: OmniVoiceOnnx) -> None:
    """marin and cedar speak their presets; "Alloy" is alloy; prose instructions are applied where
    OmniVoice reads them, the rest reported in headers, a voice's own design kept when nothing applies;
    strict_instructions refuses with the input named once."""
    sdk = client(srv)
    for name in ("marin", "cedar"):
        reply = sdk.audio.speech.create(
            model="tts-1", voice=name, input="Hi.", response_format="wav", extra_body=few_steps()
        )
        preset = PRESETS[name]
        (want,) = tts.generate("Hi.", instruct=preset.instruct, seed=preset.seed, generation_config=few_steps())
        assert reply.response.headers["x-seed"] == str(preset.seed)
        assert np.array_equal(wav_pcm(reply.content), audio_formats.to_pcm16(want)), name
    lower = sdk.audio.speech.create(
        model="tts-1", voice="alloy", input="Hi.", response_format="wav", extra_body=few_steps()
    )
    upper = sdk.audio.speech.create(
        model="tts-1", voice="Alloy", input="Hi.", response_format="wav", extra_body=few_steps()
    )
    assert upper.content == lower.content and upper.response.headers["x-seed"] == str(PRESETS["alloy"].seed)
    saved = sdk.audio.speech.create(
        model="tts-1", voice=SAVED.lower(), input="Hi.", response_format="wav", extra_body=few_steps(seed=3)
    )
    (want,) = tts.generate("Hi.", instruct="male, low pitch", seed=3, generation_config=few_steps())
    assert np.array_equal(wav_pcm(saved.content), audio_formats.to_pcm16(want))

    kept = sdk.audio.speech.create(
        model="tts-1", voice="alloy", input="Hi.", response_format="wav", instructions=PROSE, extra_body=few_steps()
    )
    assert kept.content == lower.content  # nothing OmniVoice reads: alloy stays alloy
    assert kept.response.headers["x-instructions-applied"] == ""
    assert "cheerful" in urllib.parse.unquote(kept.response.headers["x-instructions-ignored"])
    prose = "A deep, old man's voice, whispering with a cheerful smile"
    applied = sdk.audio.speech.create(
        model="tts-1", voice="alloy", input="Hi.", response_format="wav", instructions=prose, extra_body=few_steps()
    )
    headers = applied.response.headers
    assert urllib.parse.unquote(headers["x-instructions-applied"]) == "low pitch, elderly, male, whisper"
    assert "cheerful smile" in urllib.parse.unquote(headers["x-instructions-ignored"])
    (want,) = tts.generate(
        "Hi.", instruct="low pitch, elderly, male, whisper", seed=PRESETS["alloy"].seed, generation_config=few_steps()
    )
    assert np.array_equal(wav_pcm(applied.content), audio_formats.to_pcm16(want))
    assert "instructions: applied low pitch, elderly, male, whisper; ignored" in srv.log.read_text()
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.audio.speech.create(
            model="tts-1", voice="alloy", input="Hi.", instructions=PROSE, extra_body={"strict_instructions": True}
        )
    message = refused.value.body["message"]
    assert message.count(PROSE.strip()) == 1 and "american accent" in message and "河南话" not in message


def mpeg_frames(data: bytes) -> int:
    """MPEG-2 layer III frame headers (sync 0xFFF, 24 kHz) walked from the start: the frames a
    decoder finds, each header where the previous frame's length says."""
    at, frames = 0, 0
    while at + 4 <= len(data) and data[at] == 0xFF and data[at + 1] & 0xE0 == 0xE0:
        bitrate = (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)[data[at + 2] >> 4] * 1000
        padding = (data[at + 2] >> 1) & 1
        at += 72 * bitrate // 24000 + padding
        frames += 1
    assert at == len(data), f"no frame header at byte {at} of {len(data)}"
    return frames


def test_default_format_streams_mp3_as_it_is_made(srv: Server, tts: OmniVoiceOnnx) -> None:
    """stream_format audio without response_format: mp3 (OpenAI's default) arrives while the request
    is still running, and the bytes are whole MPEG frames a decoder reads; sse carries the same
    bytes as StreamEncoder makes of OmniVoiceOnnx.stream()."""
    sdk = client(srv)
    pieces, running_at_first = [], None
    # Eight sentence chunks of 64 steps: after the first chunk's bytes, seven more are still to be
    # made (~5 s on 2 busy cores: the investigation log), against a health request of milliseconds.
    with sdk.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=LONG_TEXT * 2, stream_format="audio", extra_body={"num_step": 64}
    ) as response:
        assert response.headers["content-type"] == "audio/mpeg"
        for piece in response.iter_bytes():
            if piece and running_at_first is None:
                running_at_first = srv.health()["running"]
            pieces.append(piece)
    data = b"".join(pieces)
    assert running_at_first == 1  # the first mp3 bytes came while the request was still being made
    assert mpeg_frames(data) > 10
    samples, rate = sf.read(io.BytesIO(data), dtype="int16")
    assert rate == tts.sample_rate and samples.size > 5 * rate

    status, headers, body = srv.request(
        "POST",
        "/v1/audio/speech",
        {
            "model": "tts-1",
            "voice": "alloy",
            "input": "One sentence. And another one.",
            "stream_format": "sse",
            "num_step": STEPS,
        },
        key=KEY,
    )
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: ") :]) for line in body.decode().splitlines() if line.startswith("data: ")]
    streamed = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    encoder = audio_formats.StreamEncoder("mp3", tts.sample_rate)
    want = encoder.start()
    for chunk in tts.stream(
        "One sentence. And another one.",
        instruct=PRESETS["alloy"].instruct,
        seed=PRESETS["alloy"].seed,
        generation_config=few_steps(),
    ):
        want += encoder.write(chunk.samples)
    assert streamed == want + encoder.finish()


def test_open_webui_reads_voices_and_models(srv: Server, voices: Path) -> None:
    """Open WebUI's own expressions over GET {base}/audio/voices and /audio/models, with its Bearer
    key: every preset and saved voice, and the speech models; GET /v1/models/{id} as OpenAI's."""
    base, auth = srv.launched.base_url, {"Authorization": f"Bearer {KEY}"}
    data = requests.get(f"{base}/audio/voices", headers=auth, timeout=REQUEST_S).json()
    listed = {voice["id"]: voice["name"] for voice in data["voices"]}  # backend/open_webui/routers/audio.py
    assert set(PRESETS) | {SAVED} <= set(listed) and listed["marin"] == "marin"
    assert "design" not in listed  # Open WebUI sends no instructions, without which it cannot speak
    assert [item["id"] for item in data["data"]] == list(listed)  # the full entries, as before
    models = requests.get(f"{base}/audio/models", headers=auth, timeout=REQUEST_S).json().get("models", [])
    assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts", "omnivoice"} <= {model["id"] for model in models}
    sdk = client(srv)
    assert sdk.models.retrieve("tts-1").id == "tts-1"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("whisper-1")


def test_one_call_clone_with_requests_and_curl(srv: Server, tts: OmniVoiceOnnx, tmp_path: Path) -> None:
    """POST /v1/audio/speech/clone, multipart, from `requests` and from `curl -F`: generate()'s audio
    for that reference and seed, in the asked format; a missing ref_text is a 400 naming it."""
    reference = tmp_path / "ref.wav"
    reference.write_bytes(reference_wav(tts))
    fields = {
        "input": "Hi.",
        "ref_text": "A short reference.",
        "response_format": "wav",
        "seed": "3",
        "num_step": str(STEPS),
        "speed": "1.25",
    }
    url, auth = f"{srv.launched.base_url}/audio/speech/clone", {"Authorization": f"Bearer {KEY}"}
    with reference.open("rb") as handle:
        reply = requests.post(
            url, data=fields, files={"ref_audio": ("ref.wav", handle, "audio/wav")}, headers=auth, timeout=REQUEST_S
        )
    assert reply.status_code == 200, reply.text[:300]
    (want,) = tts.generate(
        "Hi.",
        ref_audio=str(reference),
        ref_text="A short reference.",
        seed=3,
        speed=1.25,
        generation_config=few_steps(),
    )
    assert np.array_equal(wav_pcm(reply.content), audio_formats.to_pcm16(want))
    out = tmp_path / "curl.wav"
    curl = [
        "curl",
        "-sS",
        "--max-time",
        str(REQUEST_S),
        "-o",
        str(out),
        "-w",
        "%{http_code}",
        "-H",
        f"Authorization: Bearer {KEY}",
        "-F",
        f"ref_audio=@{reference}",
    ]
    for name, value in fields.items():
        curl += ["-F", f"{name}={value}"]
    done = subprocess.run([*curl, url], capture_output=True, text=True, timeout=REQUEST_S + 10)
    assert done.stdout == "200", (done.stdout, done.stderr)
    assert out.read_bytes() == reply.content
    with reference.open("rb") as handle:
        missing = requests.post(
            url, data={"input": "Hi."}, files={"ref_audio": handle}, headers=auth, timeout=REQUEST_S
        )
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "ref_text"
    bad = requests.post(
        url,
        data={"input": "Hi.", "ref_text": "x", "speed": "fast"},
        files={"ref_audio": ("r.wav", b"RIFF")},
        headers=auth,
        timeout=REQUEST_S,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "speed"


def test_saved_voices_created_renamed_and_deleted_over_http(srv: Server, tts: OmniVoiceOnnx, voices: Path) -> None:
    """POST /v1/audio/voices (multipart) creates a clone or a designed voice; GET shows it; PATCH
    renames it (a taken name is 409); the new name speaks, in any case; DELETE removes it (404 after)."""
    base, auth = srv.launched.base_url, {"Authorization": f"Bearer {KEY}"}
    made = requests.post(
        f"{base}/audio/voices",
        data={"name": "teller", "ref_text": "A short reference."},
        files={"ref_audio": ("ref.wav", reference_wav(tts), "audio/wav")},
        headers=auth,
        timeout=REQUEST_S,
    )
    assert made.status_code == 201 and made.json()["kind"] == "clone", made.text
    designed = requests.post(
        f"{base}/audio/voices", data={"name": "soft", "instruct": "female, whisper"}, headers=auth, timeout=REQUEST_S
    )
    assert designed.status_code == 201 and designed.json()["instruct"] == "female, whisper", designed.text
    again = requests.post(
        f"{base}/audio/voices", data={"name": "SOFT", "instruct": "male"}, headers=auth, timeout=REQUEST_S
    )
    assert again.status_code == 409
    assert requests.get(f"{base}/audio/voices/Teller", headers=auth, timeout=REQUEST_S).json()["kind"] == "clone"
    taken = requests.patch(f"{base}/audio/voices/teller", json={"name": "soft"}, headers=auth, timeout=REQUEST_S)
    assert taken.status_code == 409
    renamed = requests.patch(
        f"{base}/audio/voices/teller", json={"name": "storyteller"}, headers=auth, timeout=REQUEST_S
    )
    assert renamed.status_code == 200 and renamed.json()["id"] == "storyteller", renamed.text
    assert sorted(path.name for path in voices.glob("*.json")) == [f"{SAVED}.json", "soft.json", "storyteller.json"]
    reply = client(srv).audio.speech.create(
        model="tts-1", voice="StoryTeller", input="Hi.", response_format="wav", extra_body=few_steps(seed=3)
    )
    assert wav_pcm(reply.content).size > 0
    for name in ("storyteller", "soft"):
        gone = requests.delete(f"{base}/audio/voices/{name}", headers=auth, timeout=REQUEST_S)
        assert gone.status_code == 200 and gone.json()["deleted"] is True
    assert requests.delete(f"{base}/audio/voices/soft", headers=auth, timeout=REQUEST_S).status_code == 404
    assert requests.get(f"{base}/audio/voices/storyteller", headers=auth, timeout=REQUEST_S).status_code == 404
    assert sorted(path.name for path in voices.glob("*.json")) == [f"{SAVED}.json"]


def test_a_saved_designed_voice_keeps_its_seed(srv: Server, voices: Path) -> None:
    """POST /v1/audio/voices with instruct and seed saves the seed; every request naming the voice
    without a seed speaks with it (the same bytes, x-seed the saved one), a request's own seed still
    wins; a designed voice saved without a seed gets one drawn at save time, kept the same way."""
    base, auth = srv.launched.base_url, {"Authorization": f"Bearer {KEY}"}
    kept = requests.post(
        f"{base}/audio/voices",
        data={"name": "keeper", "instruct": "male, low pitch", "seed": "7"},
        headers=auth,
        timeout=REQUEST_S,
    )
    assert kept.status_code == 201 and kept.json()["seed"] == 7, kept.text
    assert json.loads((voices / "keeper.json").read_text())["seed"] == 7
    drawn = requests.post(
        f"{base}/audio/voices", data={"name": "drawn", "instruct": "female"}, headers=auth, timeout=REQUEST_S
    )
    assert drawn.status_code == 201 and isinstance(drawn.json()["seed"], int), drawn.text
    bad = requests.post(
        f"{base}/audio/voices",
        data={"name": "x", "instruct": "male", "seed": str(2**64)},
        headers=auth,
        timeout=REQUEST_S,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "seed" and not (voices / "x.json").exists()
    listed = {
        item["id"]: item
        for item in requests.get(f"{base}/audio/voices", headers=auth, timeout=REQUEST_S).json()["data"]
    }
    assert listed["keeper"]["seed"] == 7 and listed["drawn"]["seed"] == drawn.json()["seed"]
    speech = client(srv).audio.speech.with_raw_response
    for name, seed in (("keeper", 7), ("Drawn", drawn.json()["seed"])):
        first, second = (
            speech.create(model="tts-1", voice=name, input="Hi there.", response_format="wav", extra_body=few_steps())
            for _ in range(2)
        )
        assert first.content == second.content, name
        assert first.headers["x-seed"] == second.headers["x-seed"] == str(seed)
    own = speech.create(model="tts-1", voice="keeper", input="Hi.", response_format="wav", extra_body=few_steps(seed=3))
    assert own.headers["x-seed"] == "3"
    for name in ("keeper", "drawn"):
        assert requests.delete(f"{base}/audio/voices/{name}", headers=auth, timeout=REQUEST_S).status_code == 200


def test_metrics_parse_with_prometheus_client(srv: Server) -> None:
    """GET /metrics (with the key) in Prometheus' text format: requests by route and status,
    latency and time-to-first-byte histograms, queue depth, audio seconds and RTF."""
    client(srv).audio.speech.create(
        model="tts-1", voice="alloy", input="Hi.", response_format="wav", extra_body=few_steps()
    )
    status, _, body = srv.request("GET", "/v1/nothing", key=KEY)
    assert status == 404
    status, headers, body = srv.request("GET", "/metrics", key=KEY)
    assert status == 200 and headers["content-type"].startswith("text/plain")
    families = {family.name: family for family in prometheus_parser.text_string_to_metric_families(body.decode())}
    requests_total = {
        (s.labels["route"], s.labels["status"]): s.value
        for s in families["omnivoice_http_requests"].samples
        if s.name.endswith("_total")
    }
    assert requests_total[("/v1/audio/speech", "200")] >= 1 and requests_total[("other", "404")] >= 1
    for name in ("omnivoice_http_request_duration_seconds", "omnivoice_http_time_to_first_byte_seconds"):
        assert families[name].type == "histogram"
        counts = [
            s for s in families[name].samples if s.name.endswith("_count") and s.labels["route"] == "/v1/audio/speech"
        ]
        assert counts and counts[0].value >= 1, name
    assert families["omnivoice_queue_depth"].samples[0].value == 0
    assert next(s.value for s in families["omnivoice_audio_seconds"].samples if s.name.endswith("_total")) > 0
    assert next(s.value for s in families["omnivoice_synthesis_rtf"].samples if s.name.endswith("_count")) >= 1
    assert srv.request("GET", "/metrics", key=None)[0] == 401


def test_speak_writes_the_servers_mp3(srv: Server, pipeline, tmp_path: Path) -> None:
    """`omnivoice-onnx speak --out x.mp3` and the server, same text, seed and steps: the same bytes."""
    out = tmp_path / "x.mp3"
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "omnivoice_onnx",
            "speak",
            "Hello there.",
            "--seed",
            "7",
            "--num-step",
            str(STEPS),
            "--threads",
            "1",
            "--model-dir",
            str(pipeline.onnx),
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=REQUEST_S,
    )
    assert done.returncode == 0 and time.monotonic() - started < REQUEST_S, done.stderr
    reply = client(srv).audio.speech.create(
        model="tts-1", voice="auto", input="Hello there.", extra_body=few_steps(seed=7)
    )
    assert reply.response.headers["content-type"] == "audio/mpeg"
    assert out.read_bytes() == reply.content and mpeg_frames(reply.content) > 0


def test_page_asks_for_the_key_before_calling_it_wrong(srv: Server) -> None:
    """The page on a server with a key, in headless Chromium: before any key is typed it asks for
    one (not "incorrect API key"); with the key typed, the voices load."""
    from test_dropin import wait_until

    with headless_chromium(("--no-sandbox",)) as browser:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{srv.port}/", timeout=REQUEST_S * 1000)
        wait_until(page, "document.querySelector('#status').textContent !== ''", REQUEST_S)
        status = page.inner_text("#status")
        assert "needs its API key" in status and "incorrect" not in status, status
        page.fill("#api-key", KEY)
        page.dispatch_event("#api-key", "change")
        wait_until(page, "document.querySelectorAll('#voice option').length > 12", REQUEST_S)
