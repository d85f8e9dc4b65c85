"""A streamed speech response: the job's first event (or the client gone), the encoded audio bytes
as chunks are decoded, and OpenAI's SSE events around them; and a worker's task awaited the same
way (task_result). A failure after the headers went out
cannot become a status code: it closes the response early (audio) or ends in an `error` event (SSE)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from omnivoice_onnx.audio_formats import StreamEncoder
from omnivoice_onnx.serve.connection import wait_disconnect
from omnivoice_onnx.serve.door import refuse
from omnivoice_onnx.serve.middleware import error_response
from omnivoice_onnx.serve.pool import Job, Task, Work, WorkerPool, job_failure, time_out

if TYPE_CHECKING:  # the serve extra's package, imported where the app is built
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOG = logging.getLogger("omnivoice_onnx.server")

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


async def first_or_failure(job: Job, request: Any, timer: asyncio.TimerHandle, draining: bool) -> tuple[str, Any]:
    """A synthesis' first event (a chunk, or its whole audio); its failure (error, timeout, client
    gone) as the refusal it answers (`draining`: the pool's, at the time), the job cancelled and
    `timer` stopped."""
    try:
        first = await first_event(job, request)
    except BaseException:
        timer.cancel()
        job.cancel.set()
        raise
    kind, payload = first
    if kind in ("error", "timeout", "cancelled", "gone"):
        timer.cancel()
        raise job_failure(job, kind, payload, draining)
    return first


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


class LastWord:
    """A request that SIGTERM's --drain-timeout cancels before its response started gets a JSON 503
    (uvicorn would send a plain-text 500); one that had started is cut short. A stream whose
    generation failed after its headers went out (its timeout, a worker's error) ends without its
    last chunk and one log line, not uvicorn's traceback. Here, not in serve.middleware with the
    others: it knows how the app's streams fail (StreamFailed)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except StreamFailed as exc:
            LOG.warning("%s %s: stream cut short: %s", scope["method"], scope["path"], exc)
        except asyncio.CancelledError:
            if scope["type"] != "http" or started:
                raise
            LOG.warning("drain timeout: %s %s cut off before its response", scope["method"], scope["path"])
            await error_response(refuse("shutting_down", headers={"Connection": "close"}))(scope, receive, send)
