"""omnivoice-onnx wyoming, as Home Assistant sees it: a real server process on a free loopback port,
driven by the `wyoming` package's own async client.

One server (module fixture) with a fixed --seed, so its audio is compared with the runtime's
stream() bit for bit (as 16-bit PCM). Every wait is bounded (READ_S per event).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

wyoming = pytest.importorskip("wyoming")

from conftest import REPO  # noqa: E402
from serving import launch  # noqa: E402
from wyoming.audio import AudioChunk, AudioStart, AudioStop  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.error import Error  # noqa: E402
from wyoming.event import Event  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped, SynthesizeVoice  # noqa: E402

from omnivoice_onnx import OmniVoiceOnnx  # noqa: E402
from omnivoice_onnx.audio_formats import to_pcm16  # noqa: E402
from omnivoice_onnx.core.prompt import advertised_languages  # noqa: E402
from omnivoice_onnx.serve import door  # noqa: E402
from omnivoice_onnx.voices import PRESETS  # noqa: E402

pytestmark = pytest.mark.slow  # the session pipeline's tiny export

SEED = 4242
START_S = 60
READ_S = 120
TEXT = "The first sentence is here. A second one follows it, somewhat longer than the first."
ENDS = ("audio-stop", "error", "info", "synthesize-stopped")  # events after which a client stops reading


@pytest.fixture(scope="module")
def tts(pipeline) -> OmniVoiceOnnx:
    return OmniVoiceOnnx.from_dir(pipeline.onnx, threads=1)


@pytest.fixture(scope="module")
def port(pipeline, tmp_path_factory):
    folder = tmp_path_factory.mktemp("wyoming")
    log = folder / "wyoming.log"
    launched = launch(
        pipeline.onnx,
        log,
        "--voices",
        str(folder / "voices"),
        "--threads",
        "1",
        "--seed",
        str(SEED),
        env={**os.environ, "OMNIVOICE_ORT_THREADS": "1"},
        start_timeout=START_S,
        command="wyoming",
    )
    yield launched.port
    assert launched.stop(START_S) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text and f"seed {SEED}" in text, text[-3000:]


def exchange(port: int, *events, until: tuple[str, ...] = ENDS) -> list[Event]:
    """Send `events` on one connection, then read events until one of type `until` (bounded)."""

    async def talk() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", port, connect_timeout=READ_S, read_timeout=READ_S) as client:
            for event in events:
                await client.write_event(event.event())
            received = []
            while not received or received[-1].type not in until:
                event = await client.read_event()
                assert event is not None, f"connection closed after {[e.type for e in received]}"
                received.append(event)
            return received

    return asyncio.run(talk())


def pcm_of(tts: OmniVoiceOnnx, text: str, voice: str) -> bytes:
    chunks = tts.stream(text, seed=SEED, **PRESETS[voice].generate_kwargs())
    return b"".join(to_pcm16(chunk.samples).astype("<i2").tobytes() for chunk in chunks)


def audio_of(events: list[Event], rate: int) -> bytes:
    """The audio bytes of AudioStart, AudioChunk..., AudioStop (asserted to be that shape)."""
    assert AudioStart.is_type(events[0].type) and AudioStop.is_type(events[-1].type), [e.type for e in events]
    start = AudioStart.from_event(events[0])
    assert (start.rate, start.width, start.channels) == (rate, 2, 1)
    chunks = [AudioChunk.from_event(event) for event in events[1:-1]]
    assert chunks and all((c.rate, c.width, c.channels) == (rate, 2, 1) for c in chunks)
    return b"".join(chunk.audio for chunk in chunks)


def test_describe_lists_voices_and_languages(port, tts) -> None:
    (event,) = exchange(port, Describe())
    (program,) = Info.from_event(event).tts
    names = [voice.name for voice in program.voices]
    assert set(PRESETS) <= set(names) and "auto" in names and "design" not in names
    assert program.supports_synthesize_streaming
    languages = advertised_languages(tts.runtime_config["languages"])
    assert all(voice.languages == languages for voice in program.voices)
    alloy = program.voices[names.index("alloy")]
    assert PRESETS["alloy"].instruct in alloy.description


def test_synthesize_streams_the_runtimes_audio(port, tts) -> None:
    """Synthesize -> AudioStart, one AudioChunk per decoded chunk, AudioStop: stream()'s samples."""
    events = exchange(port, Synthesize(TEXT, voice=SynthesizeVoice(name="alloy")))
    expected = list(tts.stream(TEXT, seed=SEED, **PRESETS["alloy"].generate_kwargs()))
    assert len(events) == len(expected) + 2 and len(expected) > 1  # chunks are sent as they are decoded
    assert audio_of(events, tts.sample_rate) == pcm_of(tts, TEXT, "alloy")
    capitalised = exchange(port, Synthesize(TEXT, voice=SynthesizeVoice(name="Alloy")))  # a name in any case
    assert audio_of(capitalised, tts.sample_rate) == audio_of(events, tts.sample_rate)


def test_streaming_synthesis_speaks_each_sentence(port, tts) -> None:
    """SynthesizeStart/Chunk/Stop: a sentence is spoken once complete, the rest at the stop; a
    Synthesize sent alongside (for old servers) is ignored."""
    voice = SynthesizeVoice(name="onyx")
    events = exchange(
        port,
        SynthesizeStart(voice=voice),
        SynthesizeChunk("The first sentence "),
        SynthesizeChunk("is here. A second one"),
        SynthesizeChunk(" ends it"),
        Synthesize("The first sentence is here. A second one ends it", voice=voice),
        SynthesizeStop(),
        until=("synthesize-stopped", "error"),
    )
    assert SynthesizeStopped.is_type(events[-1].type)
    expected = pcm_of(tts, "The first sentence is here.", "onyx") + pcm_of(tts, "A second one ends it", "onyx")
    assert audio_of(events[:-1], tts.sample_rate) == expected


def test_refusals_are_error_events(port) -> None:
    (unknown,) = exchange(port, Synthesize("Hello.", voice=SynthesizeVoice(name="nobody")))
    error = Error.from_event(unknown)
    assert error.code == "invalid_voice" and "unknown voice 'nobody'" in error.text and "alloy" in error.text
    (long,) = exchange(port, Synthesize("x" * (door.MAX_INPUT_CHARS + 1)))
    assert Error.from_event(long).code == "string_above_max_length"
    (empty,) = exchange(port, Synthesize("   "))
    assert Error.is_type(empty.type) and "empty" in Error.from_event(empty).text
    # the connection and the server survive a refusal: the next request is served
    (info,) = exchange(port, Describe())
    assert Info.is_type(info.type)


def test_bad_uri_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "omnivoice_onnx",
            "wyoming",
            "--model-dir",
            str(tmp_path),
            "--uri",
            "http://127.0.0.1:10200",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is not tcp://HOST:PORT" in done.stderr
