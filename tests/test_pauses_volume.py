"""A request's sentence_silence and volume (piper's --sentence-silence and --volume): left out they
change nothing, bit for bit; a pause adds exactly round(seconds * rate) zeros at every chunk
boundary and none to a text of one chunk; the stream and the whole clip agree; a volume scales
every sample (clipped only in 16-bit output); out-of-range values are one line (API, CLI, batch).
The server's side (fields, 400s, streamed equal to whole) is in test_server.py."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
from conftest import REPO, Pipeline
from test_stream import clone, tts  # noqa: F401  (tts: test_stream's module fixture, the same runtime)

from omnivoice_export.step2_export.runtime_assets import host_sections
from omnivoice_onnx import OmniVoiceOnnx, Trace
from omnivoice_onnx.audio_formats import to_pcm16
from omnivoice_onnx.batch.lines import FileDigests, parse_line, request_hash
from omnivoice_onnx.core import audio
from omnivoice_onnx.core.request import keywords
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.limits import MAX_PAUSE_S, MAX_VOLUME

RATE = 24000
RULES = host_sections()["audio"]  # runtime-config.json's audio section, as the export writes it
FADE_N = int(RULES["cross_fade_silence_s"] * RATE) // 3  # the cross-fade's own silence at a boundary
TEXT = (
    "The first sentence sets the scene. A second one follows it closely, with a few more words. "
    "And a third one ends the paragraph here."
)
FEW_STEPS = {"num_step": 4}


def synthetic_chunks(seed: int) -> list[np.ndarray]:
    """Decoder-like chunks [1, T]: noise with a 700 ms pause inside (silence removal has work)."""
    rng = np.random.default_rng(seed)
    chunks = []
    for seconds in (1.3, 0.9, 1.7):
        x = (0.3 * rng.standard_normal(int(seconds * RATE))).astype(np.float32)
        x[RATE // 4 : RATE // 4 + int(0.7 * RATE)] = 0
        chunks.append(x[np.newaxis])
    return chunks


def assemble(chunks: list[np.ndarray], ref_rms: float | None, postprocess: bool, **extra: float) -> np.ndarray:
    assembler = audio.StreamAssembler(RATE, RULES, ref_rms, postprocess, 0.1, 0.1, **extra)
    return np.concatenate([assembler.add(c, i, len(chunks)) for i, c in enumerate(chunks)])


def joined(chunks: list[np.ndarray], ref_rms: float | None, postprocess: bool, pause: float, volume: float):
    return audio.join_chunks(chunks, ref_rms, RATE, RULES, postprocess, 0.1, 0.1, pause, volume)


@pytest.mark.parametrize("ref_rms", [None, 0.05])
@pytest.mark.parametrize("postprocess", [True, False])
def test_defaults_are_upstreams_output(ref_rms: float | None, postprocess: bool) -> None:
    """No pause, volume 1: upstream's post_process(cross_fade_chunks(...)), and the stream as before."""
    chunks = synthetic_chunks(0)
    upstream = audio.post_process(
        audio.cross_fade_chunks(chunks, RATE, RULES), ref_rms, RATE, RULES, postprocess, 0.1, 0.1
    )
    assert np.array_equal(joined(chunks, ref_rms, postprocess, 0.0, 1.0), upstream[0])
    assert np.array_equal(
        assemble(chunks, ref_rms, postprocess, pause_s=0.0, volume=1.0), assemble(chunks, ref_rms, postprocess)
    )


@pytest.mark.parametrize("pause", [0.25, 0.3, 1.0, MAX_PAUSE_S])
def test_a_pause_adds_exactly_its_samples_at_each_boundary(pause: float) -> None:
    """round(pause * rate) zeros at the start of each boundary's silence, nothing else changed."""
    chunks = synthetic_chunks(1)
    extra = audio.pause_samples(pause, RATE)
    assert extra == round(pause * RATE) and audio.pause_samples(0.25, RATE) == 6000
    plain = audio.cross_fade_chunks(chunks, RATE, RULES)[0]
    paused = audio.cross_fade_chunks(chunks, RATE, RULES, pause)[0]
    assert paused.size == plain.size + extra * (len(chunks) - 1)
    boundaries = [sum(c.shape[-1] for c in chunks[:k]) + (k - 1) * FADE_N for k in range(1, len(chunks))]
    expected = np.insert(plain, np.repeat(boundaries, extra), 0.0)
    assert np.array_equal(paused, expected)
    # the stream with postprocess_output off: the same join, extra zeros and all
    streamed, before = assemble(chunks, 0.05, False, pause_s=pause), assemble(chunks, 0.05, False)
    assert streamed.size == before.size + extra * (len(chunks) - 1)


@pytest.mark.parametrize("postprocess", [True, False])
def test_streamed_equals_whole_with_a_pause(postprocess: bool) -> None:
    """With a reference and a pause, the stream is the whole clip sample for sample, silence
    removal included (both remove it chunk by chunk), volume included."""
    chunks = synthetic_chunks(2)
    whole = joined(chunks, 0.05, postprocess, 0.4, 0.7)
    assert np.array_equal(assemble(chunks, 0.05, postprocess, pause_s=0.4, volume=0.7), whole)
    # the pause survives silence removal: exactly its samples longer than without it, chunk by chunk
    without = joined(chunks, 0.05, postprocess, 1e-9, 0.7)  # > 0: the same per-chunk path, 0 samples added
    assert whole.size - without.size == 2 * audio.pause_samples(0.4, RATE)


def test_volume_is_a_linear_gain_clipped_in_16_bit_output() -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, 4800).astype(np.float32)
    assert audio.apply_volume(x, 1.0) is x
    assert np.array_equal(audio.apply_volume(x, 0.5), x * np.float32(0.5))  # halved, exactly
    loud = audio.apply_volume(x, 3.0)
    assert loud.dtype == np.float32 and np.abs(loud).max() > 1  # the float API is not clipped
    pcm = to_pcm16(loud)
    assert np.array_equal(pcm[np.abs(loud) >= 1], np.sign(loud[np.abs(loud) >= 1]).astype(np.int16) * 32767)
    chunks = synthetic_chunks(4)
    assert np.array_equal(joined(chunks, 0.05, True, 0.0, 0.5), joined(chunks, 0.05, True, 0.0, 1.0) * np.float32(0.5))


@pytest.mark.slow
@pytest.mark.parametrize(
    "keyword,value,fragment",
    [
        ("sentence_silence", MAX_PAUSE_S + 0.5, "sentence_silence 5.5 is out of range [0, 5]"),
        ("sentence_silence", -0.1, "sentence_silence -0.1 is out of range [0, 5]"),
        ("sentence_silence", "1", "sentence_silence must be a number, got str"),
        ("volume", MAX_VOLUME * 2, "volume 20.0 is out of range [0, 10]"),
        ("volume", float("nan"), "volume must be finite"),
        ("volume", True, "volume must be a number, got bool"),
    ],
)
def test_out_of_range_is_one_user_error(keyword: str, value: object, fragment: str, tts: OmniVoiceOnnx) -> None:
    with pytest.raises(UserError) as raised:
        tts.validate("Hello.", **{keyword: value})
    assert fragment in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.slow
def test_the_runtime_pauses_and_scales(tts: OmniVoiceOnnx, pipeline: Pipeline) -> None:
    """On the tiny export: the keywords left out or at their defaults give the same samples; a
    pause gives the stream's chunking to generate() (the same tokens), exactly (count - 1) pauses
    more than the pause-free stream, and, with a reference, the stream's samples; a text of one
    chunk gets none; volume 0.5 halves generate()'s samples."""
    kwargs = {"seed": 11, "generation_config": FEW_STEPS, **clone(pipeline)}
    (plain,) = tts.generate(TEXT, **kwargs)
    assert np.array_equal(tts.generate(TEXT, **kwargs, sentence_silence=0.0, volume=1.0)[0], plain)
    assert np.array_equal(tts.generate(TEXT, **kwargs, volume=0.5)[0], plain * np.float32(0.5))

    whole_trace, streamed_trace = Trace(), Trace()
    (whole,) = tts.generate(TEXT, **kwargs, sentence_silence=0.25, trace=whole_trace)
    chunks = list(tts.stream(TEXT, **kwargs, sentence_silence=0.25, trace=streamed_trace))
    assert len(chunks) >= 3
    assert all(np.array_equal(a, b) for a, b in zip(whole_trace.results[0], streamed_trace.results[0]))
    assert np.array_equal(np.concatenate([c.samples for c in chunks]), whole)
    before = sum(c.samples.size for c in tts.stream(TEXT, **kwargs))
    assert whole.size - before == (len(chunks) - 1) * audio.pause_samples(0.25, tts.sample_rate)

    short = {"seed": 5, "generation_config": FEW_STEPS}  # one chunk under either chunking
    assert np.array_equal(
        tts.generate("Hello there.", **short, sentence_silence=2.0)[0], tts.generate("Hello there.", **short)[0]
    )


def command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omnivoice_onnx", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize(
    "flag,value,fragment",
    [
        ("--sentence-silence", "6", "--sentence_silence: 6 is out of range: a finite number in [0.0, 5.0]"),
        ("--volume", "-1", "--volume: -1 is out of range: a finite number in [0.0, 10.0]"),
        ("--volume", "loud", "--volume: 'loud' is not a number"),
    ],
)
def test_cli_refuses_out_of_range(flag: str, value: str, fragment: str, tmp_path: Path) -> None:
    done = command("speak", "Hi.", flag, value, "--out", "x.wav", "--model-dir", "missing-model", cwd=tmp_path)
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr.decode()
    assert lines[0].startswith("omnivoice-onnx: error: ") and fragment in lines[0], lines[0]
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_cli_flags_reach_the_runtime(tts: OmniVoiceOnnx, pipeline: Pipeline, tmp_path: Path) -> None:
    out = tmp_path / "paused.wav"
    done = command(
        "speak", TEXT, "--sentence-silence", "0.25", "--volume", "0.5", "--seed", "3", "--num-step", "4",
        "--model-dir", pipeline.onnx, "--out", out, "--quiet", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    got, rate = soundfile.read(out, dtype="int16")
    want = tts.generate(TEXT, seed=3, sentence_silence=0.25, volume=0.5, generation_config=FEW_STEPS)[0]
    assert rate == tts.sample_rate and np.array_equal(got, to_pcm16(want))


def test_batch_lines_take_them(tmp_path: Path) -> None:
    """A line's sentence_silence and volume reach validate()'s keywords and its request hash; a line
    without them keeps the hash it had before they existed; an out-of-range one is a bad line."""
    line = parse_line({"id": "a", "text": "Hi.", "sentence_silence": 0.5, "volume": 2}, 1, tmp_path, None)
    assert (line.sentence_silence, line.volume) == (0.5, 2.0)
    built = keywords(dataclasses.asdict(line))
    assert (built["sentence_silence"], built["volume"]) == (0.5, 2.0)
    bare = parse_line({"id": "a", "text": "Hi."}, 1, tmp_path, None)
    digests = FileDigests()
    assert request_hash(bare, {}, digests, None) != request_hash(line, {}, digests, None)
    assert request_hash(bare, {}, digests, None) == request_hash(
        dataclasses.replace(line, sentence_silence=None, volume=None), {}, digests, None
    )
    with pytest.raises(ValueError, match=r"volume 11 is out of range \[0, 10\]"):
        parse_line({"id": "a", "text": "Hi.", "volume": 11}, 1, tmp_path, None)
    with pytest.raises(ValueError, match="sentence_silence is a string, expected a number"):
        parse_line({"id": "a", "text": "Hi.", "sentence_silence": "long"}, 1, tmp_path, None)
