"""omnivoice-onnx wyoming, as Home Assistant sees it: a real server process on a free loopback port,
driven by the `wyoming` package's own async client.

One server (module fixture) with a fixed --seed, --speed, --sentence-silence and --volume, and a
--ref-dir of two reference voices, so its audio is compared with the runtime's stream() bit for
bit (as 16-bit PCM). Every wait is bounded (READ_S per event).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
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
from omnivoice_onnx.serve import wyoming as wyoming_server  # noqa: E402
from omnivoice_onnx.serve.wyoming_voices import REF_AUDIO, REF_INSTRUCT, REF_TEXT  # noqa: E402
from omnivoice_onnx.voices import PRESETS  # noqa: E402

pytestmark = pytest.mark.slow  # the session pipeline's tiny export

SEED = 4242
SPEED = 1.25  # --speed: every request's rate (the protocol carries none)
# --sentence-silence and --volume: every request's pauses and loudness (the protocol carries neither)
SHAPING = {"sentence_silence": 0.05, "volume": 0.8}
CLOSE_S = 2.0  # a refused request's connection ends within this (a proxy waits for the end)
DESIGN = "male, low pitch"  # the reference folder's designed voice
START_S = 60
READ_S = 120
TEXT = "The first sentence is here. A second one follows it, somewhat longer than the first."
ENDS = ("audio-stop", "error", "info", "synthesize-stopped")  # events after which a client stops reading


@pytest.fixture(scope="module")
def tts(pipeline) -> OmniVoiceOnnx:
    return OmniVoiceOnnx.from_dir(pipeline.onnx, threads=1)


@pytest.fixture(scope="module")
def ref_dir(pipeline, tmp_path_factory) -> Path:
    """wyoming-piper's --omnivoice-ref-dir layout: a clone (en_US/Alice) and a design (de/narrator),
    and a folder that is no voice (passed over)."""
    folder = tmp_path_factory.mktemp("refs")
    (folder / "en_US" / "Alice").mkdir(parents=True)
    shutil.copy(pipeline.capture / "ref_voice.wav", folder / "en_US" / "Alice" / REF_AUDIO)
    shutil.copy(pipeline.capture / "ref_voice.txt", folder / "en_US" / "Alice" / REF_TEXT)
    (folder / "de" / "narrator").mkdir(parents=True)
    (folder / "de" / "narrator" / REF_INSTRUCT).write_text(DESIGN + "\n")
    (folder / "de" / "notes").mkdir()
    return folder


@pytest.fixture(scope="module")
def port(pipeline, ref_dir, tmp_path_factory):
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
        "--speed",
        str(SPEED),
        "--sentence-silence",
        str(SHAPING["sentence_silence"]),
        "--volume",
        str(SHAPING["volume"]),
        "--ref-dir",
        str(ref_dir),
        env={**os.environ, "OMNIVOICE_ORT_THREADS": "1"},
        start_timeout=START_S,
        command="wyoming",
    )
    yield launched.port
    assert launched.stop(START_S) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text and f"seed {SEED}; speed {SPEED:g}" in text, text[-3000:]
    # the start line says both language counts: what Info advertises, and what a request may name
    assert "language codes advertised to Home Assistant, a request may name any of the model's 646" in text


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


def pcm_of(tts: OmniVoiceOnnx, text: str, voice: str | None = None, **kwargs) -> bytes:
    """stream()'s audio at the server's seed and speed, as 16-bit PCM (a preset's voice, or `kwargs`)."""
    voice_kwargs = PRESETS[voice].generate_kwargs() if voice else {}
    chunks = tts.stream(text, seed=SEED, speed=SPEED, **SHAPING, **voice_kwargs, **kwargs)
    return b"".join(to_pcm16(chunk.samples).astype("<i2").tobytes() for chunk in chunks)


def refused(port: int, *events) -> tuple[Error, float]:
    """Send `events`, read up to the Error that refuses them -> (it, seconds from it to the end of
    the connection, which the client sees as read_event() -> None)."""

    async def talk() -> tuple[Error, float]:
        async with AsyncTcpClient("127.0.0.1", port, connect_timeout=READ_S, read_timeout=READ_S) as client:
            for event in events:
                await client.write_event(event.event())
            while not Error.is_type((event := await client.read_event()).type):
                assert not AudioStop.is_type(event.type), "spoken, not refused"
            start = time.monotonic()
            after = await asyncio.wait_for(client.read_event(), 10 * CLOSE_S)
            assert after is None, f"{after.type} after the Error"
            return Error.from_event(event), time.monotonic() - start

    return asyncio.run(talk())


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
    assert names[:2] == ["narrator", "Alice"]  # the reference voices first, by language folder (de, en_US)
    narrator, alice = program.voices[:2]
    assert narrator.languages == ["de"] and alice.languages == ["en-US"]
    assert narrator.description == f"narrator: {DESIGN}" and alice.description == "Alice: cloned voice"
    assert program.supports_synthesize_streaming
    languages = advertised_languages(tts.runtime_config["languages"])
    assert all(voice.languages == languages for voice in program.voices[2:])
    alloy = program.voices[names.index("alloy")]
    assert PRESETS["alloy"].instruct in alloy.description


def test_synthesize_streams_the_runtimes_audio(port, tts) -> None:
    """Synthesize -> AudioStart, AudioChunks of at most AUDIO_CHUNK_BYTES (each decoded chunk in
    pieces), AudioStop: stream()'s samples at the server's --speed."""
    events = exchange(port, Synthesize(TEXT, voice=SynthesizeVoice(name="alloy")))
    decoded = [
        to_pcm16(chunk.samples).astype("<i2").tobytes()
        for chunk in tts.stream(TEXT, seed=SEED, speed=SPEED, **SHAPING, **PRESETS["alloy"].generate_kwargs())
    ]
    pieces = [-(-len(pcm) // wyoming_server.AUDIO_CHUNK_BYTES) for pcm in decoded]
    assert len(decoded) > 1 and max(pieces) > 1  # decoded as it goes, and a decoded chunk split
    assert len(events) == sum(pieces) + 2  # chunks are sent as they are decoded
    sizes = [len(AudioChunk.from_event(event).audio) for event in events[1:-1]]
    assert max(sizes) <= wyoming_server.AUDIO_CHUNK_BYTES <= 64 * 1024 and all(size % 2 == 0 for size in sizes)
    assert audio_of(events, tts.sample_rate) == b"".join(decoded) == pcm_of(tts, TEXT, "alloy")
    normal = tts.generate(TEXT, seed=SEED, **PRESETS["alloy"].generate_kwargs())[0]
    assert len(b"".join(decoded)) < 2 * len(normal)  # --speed 1.25 speaks faster than 1.0
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


def test_refusals_are_error_events_that_end_the_connection(port) -> None:
    """A refused request gets one Error, then the connection ends (as wyoming-piper's), within
    CLOSE_S: a proxy waiting for AudioStop or the end learns at once, not at the idle timeout."""
    unknown, seconds = refused(port, Synthesize("Hello.", voice=SynthesizeVoice(name="nobody")))
    assert unknown.code == "invalid_voice" and "unknown voice 'nobody'" in unknown.text, unknown
    assert "alloy" in unknown.text and "Alice" in unknown.text and seconds < CLOSE_S
    design, seconds = refused(port, Synthesize("Hello.", voice=SynthesizeVoice(name="design")))
    assert design.code == "invalid_voice" and seconds < CLOSE_S  # it needs a description Wyoming cannot send
    long, seconds = refused(port, Synthesize("x" * (door.MAX_INPUT_CHARS + 1)))
    assert long.code == "string_above_max_length" and seconds < CLOSE_S
    empty, seconds = refused(port, Synthesize("   "))
    assert "empty" in empty.text and seconds < CLOSE_S
    streamed, seconds = refused(
        port, SynthesizeStart(), SynthesizeChunk("x" * (door.MAX_INPUT_CHARS + 1)), SynthesizeStop()
    )
    assert streamed.code == "string_above_max_length" and seconds < CLOSE_S
    # the server goes on: the next connection is served
    (info,) = exchange(port, Describe())
    assert Info.is_type(info.type)


SSML = (
    '<?xml version="1.0"?><speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis" xml:lang="en-US">'
    '<p><s>The first <emphasis>sentence</emphasis> is here.</s><break time="300ms"/>'
    '<s>A <sub alias="second">2nd</sub> one &amp; <![CDATA[the rest]]>.</s></p><!-- not read --></speak>'
)
SSML_TEXT = "The first sentence is here. A second one & the rest."


def test_ssml_is_spoken_as_its_text(port, tts) -> None:
    """text_format ssml: the markup is dropped, its text spoken (a Synthesize and a stream alike);
    a DTD (entity expansion, external entities) or what is not XML is refused with one line."""
    events = exchange(port, Synthesize(SSML, voice=SynthesizeVoice(name="alloy"), text_format="ssml"))
    assert audio_of(events, tts.sample_rate) == pcm_of(tts, SSML_TEXT, "alloy")
    cut = SSML.index("<break")
    streamed = exchange(
        port,
        SynthesizeStart(voice=SynthesizeVoice(name="alloy"), text_format="ssml"),
        SynthesizeChunk(SSML[:cut]),
        SynthesizeChunk(SSML[cut:]),
        SynthesizeStop(),
        until=("synthesize-stopped", "error"),
    )
    expected = pcm_of(tts, "The first sentence is here.", "alloy") + pcm_of(tts, "A second one & the rest.", "alloy")
    assert audio_of(streamed[:-1], tts.sample_rate) == expected
    bomb = '<!DOCTYPE speak [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]><speak>&b;</speak>'
    for document in (bomb, '<!DOCTYPE speak SYSTEM "file:///etc/passwd"><speak/>', "<speak>open", "&nbsp;"):
        error, seconds = refused(port, Synthesize(document, text_format="ssml"))
        assert error.code == "invalid_value" and error.text.count("\n") == 0 and "ssml" in error.text, error
        assert seconds < CLOSE_S
    unknown, _ = refused(port, Synthesize("Hello.", text_format="markdown"))
    assert "text_format 'markdown'" in unknown.text


def test_reference_voices_speak_as_their_folder_says(port, tts, pipeline) -> None:
    """--ref-dir: the clone speaks its recording's voice in its folder's language, the design its
    instruct.txt (any case of the name), each as stream() does with the same keywords."""
    prompt = tts.create_voice_clone_prompt(
        str(pipeline.capture / "ref_voice.wav"), (pipeline.capture / "ref_voice.txt").read_text().strip()
    )
    alice = exchange(port, Synthesize(TEXT, voice=SynthesizeVoice(name="alice", language="fr")))
    assert audio_of(alice, tts.sample_rate) == pcm_of(tts, TEXT, voice_clone_prompt=prompt, language="en")
    narrator = exchange(port, Synthesize(TEXT, voice=SynthesizeVoice(name="narrator")))
    assert audio_of(narrator, tts.sample_rate) == pcm_of(tts, TEXT, instruct=DESIGN, language="de")


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


def test_reference_folder_refusals_are_one_line(tts, pipeline, tmp_path: Path) -> None:
    """A voice that cannot be used stops the start with one line naming its folder; a folder that
    is no voice is passed over; a design's seed is its description's (the same on every start)."""
    from omnivoice_onnx.errors import UserError
    from omnivoice_onnx.serve.wyoming_voices import ref_seed, scan_ref_dir

    def voice(language: str, name: str, instruct: str = DESIGN) -> None:
        (tmp_path / language / name).mkdir(parents=True)
        (tmp_path / language / name / REF_INSTRUCT).write_text(instruct)

    voice("en", "Bob")
    (tmp_path / "en" / "empty").mkdir()
    refs = scan_ref_dir(tmp_path, tts)
    assert list(refs) == ["bob"] and refs["bob"].seed == ref_seed(DESIGN) == ref_seed(DESIGN + "")
    for language, name, fragment in (
        ("de", "bob", "(?i)two voices named 'bob'"),
        ("klingon", "kor", "unknown language 'klingon'"),
        ("fr", "auto", "reserved"),
    ):
        voice(language, name)
        with pytest.raises(UserError, match=fragment) as refused_start:
            scan_ref_dir(tmp_path, tts)
        assert "\n" not in str(refused_start.value)
        shutil.rmtree(tmp_path / language)
    voice("fr", "blank", instruct="  \n")
    with pytest.raises(UserError, match="instruct.txt is empty"):
        scan_ref_dir(tmp_path, tts)
    shutil.rmtree(tmp_path / "fr")
    done = subprocess.run(
        [sys.executable, "-m", "omnivoice_onnx", "wyoming", "--model-dir", str(pipeline.onnx), "--uri",
         "tcp://127.0.0.1:0", "--ref-dir", str(tmp_path / "missing")],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is not a folder" in done.stderr, done.stderr
