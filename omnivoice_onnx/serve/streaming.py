"""A streamed speech response: the job's first event (or the client gone), the encoded audio bytes
as chunks are decoded, and OpenAI's SSE events around them; and a worker's task awaited the same
way (task_result). A failure after the headers went out
cannot become a status code: it closes the response early (audio) or ends in an `error` event (SSE)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from omnivoice_onnx.audio_formats import StreamEncoder
from omnivoice_onnx.serve.connection import wait_disconnect
from omnivoice_onnx.serve.pool import Job, Task, Work, WorkerPool, job_failure, time_out

ResultT = TypeVar("ResultT")


async def first_event(job: Work, request: Any) -> tuple[str, Any]:
    """The job's (or task's) first event; if the client goes away first, the job is cancelled (dropped from the
    queue, or stopped between steps) and this returns ("gone", None)."""
    getter = asyncio.ensure_future(job.events.get())
    watcher = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not getter.done():
        getter.cancel()
        job.cancel.set()
        return "gone", None
    return getter.result()


async def task_result(pool: WorkerPool[Any], run: Callable[[Any], ResultT], request: Any, timeout_s: float) -> ResultT:
    """`run(model)` on a worker as a pool.Task, in turn with the syntheses, within `timeout_s`
    (queue wait included); its client gone, it is dropped from the queue. Its value, or the
    refusal it ended with (its own ApiError, the timeout, the queue's)."""
    loop = asyncio.get_running_loop()
    task = Task(run=run, loop=loop)
    pool.submit(task)  # queue_full / shutting_down: the table's, with Retry-After
    timer = loop.call_at(loop.time() + timeout_s, time_out, task)
    try:
        kind, payload = await first_event(task, request)
    finally:
        timer.cancel()
    if kind != "result":
        raise job_failure(task, kind, payload, pool.draining)
    result: ResultT = payload
    return result


class StreamFailed(Exception):
    """A streamed response's generation failed after its headers went out: the connection is
    closed without the final chunk, so the client sees an incomplete response, not a short clip."""


async def stream_bytes(
    job: Job, first: tuple[str, Any], encoder: StreamEncoder, timer: asyncio.TimerHandle
) -> AsyncIterator[bytes]:
    """The encoded bytes of a streamed job; on disconnect (the response task is cancelled) or any
    exit before the end, the job is cancelled in `finally`."""
    try:
        yield encoder.start()
        event = first
        while True:
            kind, payload = event
            if kind == "chunk":
                job.samples_out += payload.size
                data = encoder.write(payload)
                if data:
                    yield data
            elif kind == "done":
                data = encoder.finish()
                if data:
                    yield data
                job.finished = True
                return
            else:
                raise StreamFailed(job_failure(job, kind, payload).message)
            event = await job.events.get()
    finally:
        timer.cancel()
        if not job.finished:
            job.cancel.set()


async def sse_events(
    chunks: AsyncIterator[bytes], job: Job, input_tokens: int, hop_length: int
) -> AsyncIterator[bytes]:
    """OpenAI's speech SSE events around the audio bytes; a failure after the start is an `error`
    event. The done event's usage counts the input's text tokens and the audio frames made (the
    model's output tokens: one per codebook column, 25 per second)."""
    try:
        async for data in chunks:
            if data:
                event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")}
                yield f"data: {json.dumps(event)}\n\n".encode()
    except StreamFailed as exc:
        error = {"type": "error", "error": {"message": str(exc), "type": "server_error", "param": None, "code": None}}
        yield f"data: {json.dumps(error)}\n\n".encode()
        return
    frames = job.samples_out // hop_length
    done = {
        "type": "speech.audio.done",
        "usage": {"input_tokens": input_tokens, "output_tokens": frames, "total_tokens": input_tokens + frames},
    }
    yield f"data: {json.dumps(done)}\n\n".encode()
