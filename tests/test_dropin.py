"""Drop-in use of `omnivoice-onnx serve`: OpenAI's own defaults (model "tts-1", voice "alloy"), the
presets, uploaded references, and the page at / driven in a real headless Chromium.

One server process (module fixture: --model-alias, --allow-voice-save, a voices folder with a
saved voice named like a preset). The browser test uses Debian's chromium (/usr/bin/chromium,
.ci/run installs it) through Playwright; it is skipped, saying why, where either is missing.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

# tts: the runtime in-process, one thread like the server's worker (its audio is the reference)
from conftest import headless_chromium  # noqa: E402
from test_server import REQUEST_S, SERVER_START_S, Server, start_server, tts  # noqa: E402,F401

from omnivoice_onnx import OmniVoiceOnnx, audio_formats  # noqa: E402
from omnivoice_onnx.serve.service import OPENAI_MODEL_IDS  # noqa: E402
from omnivoice_onnx.voices import PRESETS, Voice, save_voice  # noqa: E402

pytestmark = pytest.mark.slow  # the session pipeline's tiny export

ALIAS = "my-tts"
STEPS = 4  # the checks compare bytes, not quality: few steps keep the model runs cheap
SAVED_PRESET_NAME = "nova"  # a saved voice of a preset's name replaces the preset


@pytest.fixture(scope="module")
def voices(tts, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("voices")
    save_voice(
        folder,
        SAVED_PRESET_NAME,
        Voice(SAVED_PRESET_NAME, None, "male, low pitch", tts.metadata["model_fingerprint"], Path()),
    )
    return folder


@pytest.fixture(scope="module")
def srv(pipeline, voices, tmp_path_factory):
    running = start_server(
        pipeline.onnx,
        voices,
        tmp_path_factory.mktemp("dropin") / "server.log",
        "--model-alias",
        ALIAS,
        "--allow-voice-save",
        "--default-format",
        "wav",
    )
    yield running
    assert running.launched.stop(SERVER_START_S) == 0, running.log.read_text()[-3000:]
    assert "Traceback" not in running.log.read_text()


def pcm16(wav: bytes) -> np.ndarray:
    return sf.read(io.BytesIO(wav), dtype="int16")[0]


def test_openai_defaults_give_the_presets_audio(srv: Server, tts: OmniVoiceOnnx) -> None:
    """An OpenAI client with OpenAI's defaults only (model tts-1, voice alloy) gets audio, the
    same bytes twice: the preset's fixed seed, and generate()'s audio for it."""
    client = openai.OpenAI(base_url=srv.launched.base_url, api_key="unused", max_retries=0, timeout=REQUEST_S)
    first = client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there.")
    second = client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there.")
    assert first.content == second.content and first.response.headers["x-seed"] == str(PRESETS["alloy"].seed)
    (expected,) = tts.generate("Hello there.", instruct=PRESETS["alloy"].instruct, seed=PRESETS["alloy"].seed)
    assert np.array_equal(pcm16(first.content), audio_formats.to_pcm16(expected))
    models = {model.id for model in client.models.list().data}
    assert set(OPENAI_MODEL_IDS) | {ALIAS, "omnivoice"} <= models
    for model in (*OPENAI_MODEL_IDS[1:], ALIAS):
        reply = client.audio.speech.create(model=model, voice="echo", input="Hi.", extra_body={"num_step": STEPS})
        assert reply.response.headers["x-seed"] == str(PRESETS["echo"].seed)


def test_voices_list_saved_voices_before_presets(srv: Server, tts: OmniVoiceOnnx) -> None:
    status, _, body = srv.request("GET", "/v1/audio/voices", key=None)
    listed = json.loads(body)
    ids = [voice["id"] for voice in listed["voices"]]
    assert status == 200 and set(PRESETS) | {"auto"} <= set(ids) and "design" not in ids  # it needs instructions
    kinds = {item["id"]: item["kind"] for item in listed["data"]}
    assert kinds[SAVED_PRESET_NAME] == "design" and kinds["alloy"] == "preset"
    assert ids.count(SAVED_PRESET_NAME) == 1
    # the saved "nova" speaks (its instruct, the request's seed), and instructions still design a voice
    for voice, instructions, instruct, seed in (
        (SAVED_PRESET_NAME, None, "male, low pitch", 5),
        ("alloy", "male, elderly", "male, elderly", PRESETS["alloy"].seed),
    ):
        body = {"model": "tts-1", "voice": voice, "input": "Hi.", "num_step": STEPS, "response_format": "wav"}
        body.update({"instructions": instructions} if instructions else {"seed": seed})
        status, headers, audio = srv.request("POST", "/v1/audio/speech", body, key=None)
        assert status == 200 and headers["x-seed"] == str(seed), audio[:300]
        (expected,) = tts.generate("Hi.", instruct=instruct, seed=seed, generation_config={"num_step": STEPS})
        assert np.array_equal(pcm16(audio), audio_formats.to_pcm16(expected)), voice


def reference_wav(tts: OmniVoiceOnnx) -> bytes:
    rng = np.random.default_rng(0)
    samples = 2 * tts.sample_rate
    wave = 0.3 * np.sin(np.arange(samples) * 0.05) + 0.05 * rng.standard_normal(samples)
    buffer = io.BytesIO()
    sf.write(buffer, wave.astype(np.float32), tts.sample_rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def test_uploaded_reference_clones_and_saves(srv: Server, tts: OmniVoiceOnnx, voices: Path, tmp_path: Path) -> None:
    wav = reference_wav(tts)
    status, _, body = srv.request("POST", "/v1/audio/references?ref_text=A+short+reference.", wav, key=None)
    assert status == 200, body
    voice_id = json.loads(body)["id"]
    assert voice_id.startswith("ref-")
    request = {
        "model": "tts-1",
        "voice": voice_id,
        "input": "Hi.",
        "num_step": STEPS,
        "seed": 3,
        "response_format": "wav",
    }
    status, _, audio = srv.request("POST", "/v1/audio/speech", request, key=None)
    assert status == 200, audio[:300]
    (tmp_path / "ref.wav").write_bytes(wav)
    (expected,) = tts.generate(
        "Hi.",
        ref_audio=str(tmp_path / "ref.wav"),
        ref_text="A short reference.",
        seed=3,
        generation_config={"num_step": STEPS},
    )
    assert np.array_equal(pcm16(audio), audio_formats.to_pcm16(expected))
    status, _, body = srv.request("POST", "/v1/audio/references?ref_text=Words.&save_as=kept", wav, key=None)
    assert status == 200 and json.loads(body) == {"id": "kept", "saved": True}, body
    assert (voices / "kept.json").is_file()
    for query, code in (("ref_text=", "missing_required_parameter"), ("ref_text=x&save_as=../up", "invalid_voice")):
        status, _, body = srv.request("POST", f"/v1/audio/references?{query}", wav, key=None)
        assert status == 400 and json.loads(body)["error"]["code"] == code, body
    status, _, body = srv.request("POST", "/v1/audio/references?ref_text=x", b"not audio at all", key=None)
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "invalid_reference" and "/tmp" not in error["message"], body


def wait_until(page, expression: str, timeout_s: float) -> None:
    """Poll `expression` in the page until it is truthy (bounded). page.evaluate, not
    wait_for_function: the latter compiles its predicate with eval, which the page's
    Content-Security-Policy rightly forbids."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"{expression} still false after {timeout_s:g} s"
        time.sleep(0.1)


def test_page_speaks_in_chromium(srv: Server, tmp_path: Path) -> None:
    """The page at /, in a real headless Chromium, under its own Content-Security-Policy: type
    text, press Speak; the audio streams in, plays (Web Audio buffers end), and the seed and RTF
    are shown."""
    with headless_chromium() as browser:
        page = browser.new_page(viewport={"width": 900, "height": 860})
        responses: list[tuple[str, int]] = []
        page.on("response", lambda response: responses.append((response.url, response.status)))
        page.goto(f"http://127.0.0.1:{srv.port}/", timeout=REQUEST_S * 1000)
        wait_until(page, "document.querySelectorAll('#voice option').length > 12", REQUEST_S)
        page.fill("#text", "Hello from the page.")
        page.fill("#steps", str(STEPS))
        page.click("#speak")
        wait_until(page, "window.omnivoice.done || window.omnivoice.error", REQUEST_S)
        state = page.evaluate("window.omnivoice")
        assert state["error"] is None and state["bytes"] > 0 and state["seed"] == str(PRESETS["alloy"].seed)
        wait_until(page, "window.omnivoice.played > 0", REQUEST_S)
        status = page.inner_text("#status")
        assert f"seed {PRESETS['alloy'].seed}" in status and "RTF" in status, status
        assert page.input_value("#seed") == str(PRESETS["alloy"].seed)  # the seed, where it is reused
        assert page.is_visible("#player")
        assert not [url for url, code in responses if code >= 400], responses  # the favicon included
        page.screenshot(path=str(tmp_path / "page.png"))
        page.fill("#steps", "0")  # refused: the clip of the request before must not stay on show
        page.click("#speak")
        wait_until(page, "window.omnivoice.error", REQUEST_S)
        assert not page.is_visible("#player") and "num_step" in page.inner_text("#status")
    assert (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shot = os.environ.get("OMNIVOICE_PAGE_SCREENSHOT")  # docs/images/web-page.png is made this way
    if shot:
        shutil.copyfile(tmp_path / "page.png", shot)
