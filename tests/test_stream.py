"""OmniVoiceOnnx.stream(): the tokens generate() makes, audio chunk by chunk; progress and cancellation.

The assembly (audio.StreamAssembler) is checked on synthetic chunks against upstream's whole-output
post-processing (cross_fade_chunks + post_process), the API on the tiny export."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import Pipeline

from omnivoice_export.step2_export.runtime_assets import host_sections
from omnivoice_onnx import Cancelled, OmniVoiceOnnx, Trace
from omnivoice_onnx.core import audio

RATE = 24000
RULES = host_sections()["audio"]  # runtime-config.json's audio section, as the export writes it
# Three sentences: several chunks under STREAM_CHUNK_DEFAULTS, one under upstream's 30 s threshold.
TEXT = (
    "The first sentence sets the scene. A second one follows it closely, with a few more words. "
    "And a third one ends the paragraph here."
)


def synthetic_chunks(seed: int, loud_last: float = 1.0) -> list[np.ndarray]:
    """Decoder-like chunks [1, T]: noise with a pause inside (so silence removal has work)."""
    rng = np.random.default_rng(seed)
    chunks = []
    for i, seconds in enumerate((1.3, 0.9, 1.7)):
        x = (0.3 * rng.standard_normal(int(seconds * RATE))).astype(np.float32)
        x[RATE // 4 : RATE // 4 + int(0.7 * RATE)] = 0  # a 700 ms pause
        chunks.append(x[np.newaxis] * (loud_last if i == 2 else 1.0))
    return chunks


def assemble(chunks, ref_rms, postprocess, pad=0.1, fade=0.1) -> np.ndarray:
    assembler = audio.StreamAssembler(RATE, RULES, ref_rms, postprocess, pad, fade)
    return np.concatenate([assembler.add(c, i, len(chunks)) for i, c in enumerate(chunks)])


def whole(chunks, ref_rms, postprocess, pad=0.1, fade=0.1) -> np.ndarray:
    return audio.post_process(
        audio.cross_fade_chunks(chunks, RATE, RULES), ref_rms, RATE, RULES, postprocess, pad, fade
    )[0]


@pytest.mark.parametrize("pad,fade", [(0.1, 0.1), (0.0, 0.0), (0.3, 2.5)])
def test_assembly_equals_the_whole_output_with_a_reference(pad: float, fade: float) -> None:
    """postprocess_output off, a reference (fixed gain): the same bits, whatever the fade lengths
    (a 2.5 s fade spans chunks: the stream holds samples back until it knows them)."""
    chunks = synthetic_chunks(0)
    assert np.array_equal(assemble(chunks, 0.05, False, pad, fade), whole(chunks, 0.05, False, pad, fade))
    single = chunks[:1]
    assert np.array_equal(assemble(single, None, True), whole(single, None, True))  # one chunk: exactly generate()'s


def test_assembly_without_reference_is_one_fixed_gain() -> None:
    """No reference: the level is fixed from chunk 0's peak, so a louder later chunk makes the whole
    stream louder by one factor (peak(all) / peak(chunk 0)); no jump between chunks."""
    chunks = synthetic_chunks(1, loud_last=1.5)
    streamed, full = assemble(chunks, None, False), whole(chunks, None, False)
    factor = np.abs(np.concatenate(chunks, axis=-1)).max() / np.abs(chunks[0]).max()
    assert factor > 1.2
    np.testing.assert_allclose(streamed, full * factor, rtol=1e-5, atol=1e-6)


def test_assembly_with_postprocessing_differs_only_at_boundaries() -> None:
    """Silence removal per chunk: each chunk's own pause is cut as upstream cuts it; the pauses at
    the two boundaries come out at most 0.3 s longer or shorter each."""
    chunks = synthetic_chunks(2)
    streamed, full = assemble(chunks, 0.05, True), whole(chunks, 0.05, True)
    assert abs(streamed.size - full.size) <= 2 * 0.3 * RATE
    assert streamed.size < whole(chunks, 0.05, False).size  # the 700 ms pauses were cut


@pytest.fixture(scope="module")
def tts(pipeline: Pipeline) -> OmniVoiceOnnx:
    return OmniVoiceOnnx.from_dir(pipeline.onnx)


def clone(pipeline: Pipeline) -> dict:
    return {
        "ref_audio": str(pipeline.capture / "ref_voice.wav"),
        "ref_text": (pipeline.capture / "ref_voice.txt").read_text().strip(),
    }


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["clone", "auto"])
def test_stream_tokens_and_samples_equal_generate(mode: str, tts: OmniVoiceOnnx, pipeline: Pipeline) -> None:
    """Same seed and config: generate()'s tokens chunk for chunk; with postprocess_output=False the
    concatenated audio is generate()'s, bit for bit with a reference, one gain factor without."""
    kwargs = clone(pipeline) if mode == "clone" else {}
    config = {"num_step": 4, "postprocess_output": False}
    streamed_trace, whole_trace = Trace(), Trace()
    chunks = list(tts.stream(TEXT, seed=11, generation_config=config, trace=streamed_trace, **kwargs))
    (full,) = tts.generate(
        TEXT, seed=11, generation_config={**tts.STREAM_CHUNK_DEFAULTS, **config}, trace=whole_trace, **kwargs
    )
    assert len(chunks) >= 3 and [c.index for c in chunks] == list(range(len(chunks)))
    assert all(c.count == len(chunks) and c.sample_rate == tts.sample_rate for c in chunks)
    assert len(streamed_trace.results[0]) == len(whole_trace.results[0]) == len(chunks)
    for ours, theirs in zip(streamed_trace.results[0], whole_trace.results[0]):
        assert np.array_equal(ours, theirs)
    streamed = np.concatenate([c.samples for c in chunks])
    if mode == "clone":
        assert np.array_equal(streamed, full)
    else:
        gain = float(streamed @ full) / float(full @ full)
        assert gain >= 1 - 1e-6
        np.testing.assert_allclose(streamed, full * gain, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_stream_with_postprocessing_keeps_tokens(tts: OmniVoiceOnnx) -> None:
    config = {"num_step": 4}
    streamed_trace, whole_trace = Trace(), Trace()
    chunks = list(tts.stream(TEXT, seed=2, generation_config=config, trace=streamed_trace))
    (full,) = tts.generate(TEXT, seed=2, generation_config={**tts.STREAM_CHUNK_DEFAULTS, **config}, trace=whole_trace)
    assert all(np.array_equal(a, b) for a, b in zip(streamed_trace.results[0], whole_trace.results[0]))
    streamed = np.concatenate([c.samples for c in chunks])
    assert abs(streamed.size - full.size) <= 0.3 * tts.sample_rate * (len(chunks) - 1)


@pytest.mark.slow
def test_progress_and_cancel(tts: OmniVoiceOnnx) -> None:
    seen = []
    chunks = list(tts.stream(TEXT, seed=1, generation_config={"num_step": 3}, progress=seen.append))
    n = len(chunks)
    assert [(p.chunk, p.chunks, p.step, p.steps) for p in seen] == [
        (c, n, s, 3) for c in range(1, n + 1) for s in (1, 2, 3)
    ]
    seen.clear()
    tts.generate("Hello there.", seed=1, generation_config={"num_step": 2}, progress=seen.append)
    assert [(p.chunk, p.chunks, p.step, p.steps) for p in seen] == [(1, 1, 1, 2), (1, 1, 2, 2)]

    cancel = threading.Event()
    calls = []

    def stop_after_two(p) -> None:
        calls.append(p)
        if len(calls) == 2:
            cancel.set()

    for run in (
        lambda: list(
            tts.stream(TEXT, seed=1, generation_config={"num_step": 3}, progress=stop_after_two, cancel=cancel)
        ),
        lambda: tts.generate(TEXT, seed=1, generation_config={"num_step": 3}, progress=stop_after_two, cancel=cancel),
    ):
        calls.clear()
        cancel.clear()
        with pytest.raises(Cancelled):
            run()
        assert len(calls) == 2  # stopped before the third step
