"""What Home Assistant needs of the servers: `wyoming` and `serve` with a variant, fewer steps and a
default language; Wyoming's Info as Home Assistant's pickers show it; mDNS discovery found by the
zeroconf library's own ServiceBrowser. Real server processes on free loopback ports, the `wyoming`
package's client, bounded waits."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("wyoming")
zeroconf = pytest.importorskip("zeroconf")

from conftest import REPO  # noqa: E402
from serving import launch  # noqa: E402
from wyoming.audio import AudioChunk  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402
from wyoming.tts import Synthesize, SynthesizeVoice  # noqa: E402

from omnivoice_onnx import OmniVoiceOnnx  # noqa: E402
from omnivoice_onnx.audio_formats import to_pcm16  # noqa: E402
from omnivoice_onnx.serve import wyoming as wyoming_server  # noqa: E402
from omnivoice_onnx.serve import wyoming_voices  # noqa: E402
from omnivoice_onnx.voices import PRESETS  # noqa: E402

pytestmark = pytest.mark.slow  # the session pipeline's tiny export

SEED = 77
STEPS = 8
START_S = 90
READ_S = 120
TEXT = "Turn on the kitchen lights."
NAME = f"omnivoice-test-{os.getpid()}"
ENV = {**os.environ, "OMNIVOICE_ORT_THREADS": "1"}


@pytest.fixture(scope="module")
def wyoming_port(variants_export, tmp_path_factory):
    """`omnivoice-onnx wyoming --num-step 8 --variant int8 --zeroconf NAME`, as the issue asks."""
    folder = tmp_path_factory.mktemp("wyoming-ha")
    log = folder / "wyoming.log"
    launched = launch(
        variants_export,
        log,
        "--voices",
        str(folder / "voices"),
        "--threads",
        "1",
        "--seed",
        str(SEED),
        "--num-step",
        str(STEPS),
        "--variant",
        "int8",
        "--zeroconf",
        NAME,
        env=ENV,
        start_timeout=START_S,
        command="wyoming",
    )
    yield launched.port
    assert launched.stop(START_S) == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()


def exchange(port: int, event) -> list:
    async def talk() -> list:
        async with AsyncTcpClient("127.0.0.1", port, connect_timeout=READ_S, read_timeout=READ_S) as client:
            await client.write_event(event.event())
            received = []
            while not received or received[-1].type not in ("audio-stop", "error", "info"):
                received.append(await client.read_event())
                assert received[-1] is not None
            return received

    return asyncio.run(talk())


def test_info_is_what_home_assistant_can_show(wyoming_port) -> None:
    """Each voice's description starts with its name and is short; the languages are BCP-47 codes
    Home Assistant names (at most ~150 of the model's 646), English among them."""
    (event,) = exchange(wyoming_port, Describe())
    (program,) = Info.from_event(event).tts
    for voice in program.voices:
        assert voice.description.startswith(voice.name + ":"), voice.description
        assert len(voice.description) <= wyoming_voices.MAX_DESCRIPTION_CHARS
    alloy = next(voice for voice in program.voices if voice.name == "alloy")
    assert alloy.description == f"alloy: {PRESETS['alloy'].instruct}"
    languages = program.voices[0].languages
    assert all(voice.languages == languages for voice in program.voices)
    assert "en" in languages and "ar" in languages and "yue" in languages and len(languages) <= 150
    assert all(len(code) == 2 for code in languages if code != "yue")


def test_any_id_or_tag_of_the_model_still_works(wyoming_port, variants_export) -> None:
    """A request naming eng or en-US speaks as language "en" does, with the server's variant and
    steps: the int8 runtime's stream() at 8 steps, bit for bit."""
    tts = OmniVoiceOnnx.from_dir(variants_export, variant="int8", threads=1)
    expected = b"".join(
        to_pcm16(chunk.samples).astype("<i2").tobytes()
        for chunk in tts.stream(
            TEXT, seed=SEED, language="en", generation_config={"num_step": STEPS}, **PRESETS["alloy"].generate_kwargs()
        )
    )
    for tag in ("eng", "en-US", "ar"):
        events = exchange(wyoming_port, Synthesize(TEXT, voice=SynthesizeVoice(language=tag)))
        assert events[-1].type == "audio-stop", events[-1]
        audio = b"".join(AudioChunk.from_event(e).audio for e in events if AudioChunk.is_type(e.type))
        assert (audio == expected) == (tag != "ar"), tag


def test_zeroconf_announces_wyoming(wyoming_port) -> None:
    """zeroconf's own ServiceBrowser finds the server's _wyoming._tcp service, at its port."""
    found = threading.Event()

    class Listener(zeroconf.ServiceListener):
        def add_service(self, zc, type_, name) -> None:
            if name == f"{NAME}.{wyoming_server.ZEROCONF_TYPE}":
                found.set()

        def update_service(self, zc, type_, name) -> None:
            pass

        def remove_service(self, zc, type_, name) -> None:
            pass

    zc = zeroconf.Zeroconf(ip_version=zeroconf.IPVersion.V4Only)
    try:
        browser = zeroconf.ServiceBrowser(zc, wyoming_server.ZEROCONF_TYPE, Listener())
        assert found.wait(30), "not announced"
        info = zc.get_service_info(wyoming_server.ZEROCONF_TYPE, f"{NAME}.{wyoming_server.ZEROCONF_TYPE}", 5000)
        assert info is not None and info.port == wyoming_port and "127.0.0.1" in info.parsed_addresses()
        browser.cancel()
    finally:
        zc.close()


def command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omnivoice_onnx", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**ENV, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--variant", "int8"], "no transformer variant 'int8'"),
        (["--language", "klingon"], "unknown language 'klingon'"),
    ],
)
def test_bad_server_defaults_are_one_line(pipeline, flags: list[str], fragment: str) -> None:
    done = command("wyoming", "--model-dir", str(pipeline.onnx), "--uri", "tcp://127.0.0.1:0", *flags)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and lines[-1].startswith("omnivoice-onnx: error: ") and fragment in lines[-1], (
        done.stderr
    )
    assert "Traceback" not in done.stderr


def test_http_defaults_yield_to_the_request(pipeline, tmp_path: Path) -> None:
    """`serve --num-step 4 --language en`: a request without num_step gets 4, one with num_step 2
    gets 2 (the request's field wins)."""
    import soundfile

    launched = launch(
        pipeline.onnx,
        tmp_path / "serve.log",
        "--threads",
        "1",
        "--num-step",
        "4",
        "--language",
        "en",
        env=ENV,
        start_timeout=START_S,
    )
    tts = OmniVoiceOnnx.from_dir(pipeline.onnx, threads=1)
    try:
        for extra, steps in (({}, 4), ({"num_step": 2}, 2)):
            body = {"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "wav", "seed": SEED, **extra}
            request = urllib.request.Request(
                f"http://127.0.0.1:{launched.port}/v1/audio/speech",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=READ_S) as response:
                got, _ = soundfile.read(io.BytesIO(response.read()), dtype="int16")
            (audio,) = tts.generate(
                TEXT,
                language="en",
                seed=SEED,
                generation_config={"num_step": steps},
                **PRESETS["alloy"].generate_kwargs(),
            )
            assert np.array_equal(got, to_pcm16(audio)), steps
    finally:
        assert launched.stop(START_S) == 0
