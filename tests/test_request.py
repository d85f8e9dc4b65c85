"""One request, one validation: every path (speak, the API's generate and stream, the server, batch)
checks a request exactly once (core.request.validate, counted), hands the validated Request on,
and runs it as it is; the seed is drawn or checked there, once. One set of limits: the flags take
what the API takes, and every front end picks its threads by one rule.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from omnivoice_onnx import OmniVoiceOnnx, UserError, limits, sessions
from omnivoice_onnx import __main__ as program
from omnivoice_onnx import program as edge
from omnivoice_onnx.batch.run import Options, run_batch
from omnivoice_onnx.core import request, shapes
from omnivoice_onnx.serve.app import load_service
from omnivoice_onnx.serve.service import ServerConfig, build_job, speech_request_model

FEW_STEPS = {"num_step": 2}  # the count, not the speech, is under test


@pytest.fixture(scope="module")
def tts(pipeline) -> OmniVoiceOnnx:
    return OmniVoiceOnnx.from_dir(pipeline.onnx)


@pytest.fixture
def validations(monkeypatch) -> Iterator[list[int]]:
    """The number of core.request.validate calls so far, in a one-item list (read calls[0])."""
    calls = [0]
    real = request.validate

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(request, "validate", counted)
    yield calls


@pytest.mark.slow
def test_generate_and_stream_validate_once(tts, validations) -> None:
    audio = tts.generate("Hello there.", generation_config=FEW_STEPS, seed=3)[0]
    assert validations[0] == 1
    chunks = list(tts.stream("Hello there. A second sentence follows.", generation_config=FEW_STEPS, seed=3))
    assert validations[0] == 2 and chunks
    req = tts.validate("Hello there.", generation_config=FEW_STEPS, seed=3)
    assert validations[0] == 3
    assert np.array_equal(tts.generate(req)[0], audio)  # the Request runs as validated: not checked again
    assert validations[0] == 3
    streamed = tts.validate("Hello there. A second sentence follows.", generation_config=FEW_STEPS, seed=3, stream=True)
    assert [c.samples.size for c in tts.stream(streamed)] == [c.samples.size for c in chunks]
    assert validations[0] == 4


@pytest.mark.slow
def test_seed_drawn_once_and_recorded(tts, validations) -> None:
    req = tts.validate("Hello.", generation_config=FEW_STEPS)
    assert isinstance(req.seed, int)  # drawn by validate, the one place
    assert np.array_equal(tts.generate(req)[0], tts.generate("Hello.", generation_config=FEW_STEPS, seed=req.seed)[0])


@pytest.mark.slow
def test_keywords_with_a_request_refused(tts) -> None:
    req = tts.validate("Hello.", generation_config=FEW_STEPS, seed=1)
    with pytest.raises(UserError, match="seed given with a validated Request"):
        tts.generate(req, seed=2)


def test_the_request_keywords_are_written_once() -> None:
    """validate(), generate() and stream() take shapes.RequestKeywords as **keywords (one
    definition, in upstream generate()'s order); keywords() builds exactly those names."""
    import inspect

    assert shapes.REQUEST_KEYWORDS == (
        "language",
        "ref_text",
        "ref_audio",
        "voice_clone_prompt",
        "instruct",
        "duration",
        "speed",
        "generation_config",
        "seed",
        "strict_instructions",
        "sentence_silence",
        "volume",
    )
    for method in (OmniVoiceOnnx.validate, OmniVoiceOnnx.generate, OmniVoiceOnnx.stream):
        variadic = [p for p in inspect.signature(method).parameters.values() if p.kind is p.VAR_KEYWORD]
        assert len(variadic) == 1 and "RequestKeywords" in str(variadic[0].annotation), method.__name__
        assert not set(inspect.signature(method).parameters) & set(shapes.REQUEST_KEYWORDS), method.__name__
    assert tuple(request.keywords({})) == (*shapes.REQUEST_FIELDS, "generation_config")
    assert set(request.keywords({})) == set(shapes.REQUEST_KEYWORDS)


@pytest.mark.slow
def test_a_keyword_that_is_not_a_requests_is_a_type_error(tts) -> None:
    """As a signature that wrote the keywords out: a misspelt one is Python's TypeError, never ignored."""
    for call in (
        lambda: tts.validate("Hello.", langauge="English"),
        lambda: tts.generate("Hello.", sed=1),
        lambda: next(tts.stream("Hello.", instructs="female")),
    ):
        with pytest.raises(TypeError, match="got an unexpected keyword argument"):
            call()


@pytest.mark.slow
def test_speak_validates_once(pipeline, validations, tmp_path: Path) -> None:
    for extra in ([], ["--stream"]):
        before = validations[0]
        code = program.main(
            [
                "speak",
                "Hello there.",
                "--model-dir",
                str(pipeline.onnx),
                "--num-step",
                "2",
                "--seed",
                "5",
                "--out",
                str(tmp_path / "hello.wav"),
                "--quiet",
                *extra,
            ]
        )
        assert code == 0 and validations[0] == before + 1, (extra, validations[0] - before)


@pytest.mark.slow
def test_server_validates_once(pipeline, validations) -> None:
    """The handler's validation (build_job: a 400 before the queue) is the only one: the worker
    thread runs the Request it was handed."""
    service = load_service(ServerConfig(model_dir=pipeline.onnx, workers=1, threads=1))
    loop = asyncio.new_event_loop()
    try:
        for stream_format in (None, "audio"):
            before = validations[0]
            body = speech_request_model()(
                model="omnivoice",
                input="Hello there.",
                voice="auto",
                num_step=2,
                seed=7,
                response_format="pcm",
                stream_format=stream_format,
            )
            job, _ = build_job(service, body, loop)
            assert validations[0] == before + 1 and job.request.seed == 7
            service.pool.submit(job)

            async def finished() -> list[str]:
                kinds = []
                while not kinds or kinds[-1] not in ("done", "error", "cancelled", "timeout"):
                    kinds.append((await job.events.get())[0])
                return kinds

            kinds = loop.run_until_complete(asyncio.wait_for(finished(), 300))
            assert kinds[-1] == "done", kinds
            assert validations[0] == before + 1, stream_format
    finally:
        service.pool.close()
        loop.close()


@pytest.mark.slow
def test_batch_validates_each_line_once(pipeline, validations, tmp_path: Path) -> None:
    """Each line is validated up front by the driver; the worker runs that Request (pickled, as a
    process pool or Ray would carry it) without a second check."""
    lines = tmp_path / "lines.jsonl"
    lines.write_text(
        "".join(json.dumps({"id": f"l{i}", "text": f"Line number {i}.", "seed": i}) + "\n" for i in range(3))
    )
    summary = run_batch(
        Options(
            test_list=lines,
            res_dir=tmp_path / "out",
            model_dir=pipeline.onnx,
            generation_config=FEW_STEPS,
            threads=1,
            progress=False,
        ),
        log=lambda _: None,
    )
    assert summary.made == 3 and validations[0] == 3


def test_worker_threads_one_rule(monkeypatch) -> None:
    """serve and batch: --threads, else $OMNIVOICE_ORT_THREADS (serve used to ignore it), else the
    cores split over the workers; over MAX_THREADS refused (serve used to take up to 1024)."""
    monkeypatch.delenv(limits.THREADS_ENV, raising=False)
    assert sessions.worker_threads(2, 3) == 3
    assert sessions.worker_threads(2, None) == max(1, sessions.cores() // 2)
    monkeypatch.setenv(limits.THREADS_ENV, "5")
    assert sessions.worker_threads(2, None) == 5
    with pytest.raises(UserError, match="MAX_THREADS"):
        sessions.worker_threads(1, limits.MAX_THREADS + 1)


@pytest.mark.parametrize(
    ("flag", "text", "ok"),
    [
        (edge.T_SHIFT, "0", False),  # batch took 0, which validate refuses
        (edge.T_SHIFT, "0.1", True),
        (edge.SCORE_FACTOR, str(limits.MAX_SCORE_FACTOR), True),  # speak stopped at 100
        (edge.SCORE_FACTOR, str(-limits.MAX_SCORE_FACTOR), True),
        (edge.SCORE_FACTOR, str(limits.MAX_SCORE_FACTOR * 1.01), False),
        (edge.SPEED, str(limits.MIN_SPEED), True),
        (edge.SPEED, str(limits.MAX_SPEED * 1.01), False),
        (edge.DURATION, "0", False),
        (edge.CHUNK_SECONDS, "0", False),
    ],
)
def test_flag_ranges_are_the_apis(flag, text: str, ok: bool) -> None:
    if ok:
        assert flag(text) == float(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="out of range"):
            flag(text)
