"""The server's worker pool: a bounded queue in front of N worker threads, each with its own
loaded model (an OmniVoiceOnnx, own sessions), and the work a request hands it: a Job (a
synthesis) or a Task (any other model work: an uploaded reference's decoding and encoding, which
takes hundreds of MB for a long recording, so it queues like a synthesis rather than running
beside the workers). Uploads hold a place too from before their body is read (upload_slot). The pool knows a
model only as a Speaker, the two calls a worker makes; the app that loads the models knows more.
The app (omnivoice_onnx.serve.app) loads the models and submits jobs; a worker runs generate()
or stream() with the job's `cancel` Event, so a client that leaves or a request past its timeout
is cancelled between unmasking steps. Errors reach the client as the front door's refusals
(door.refuse); a bug's traceback goes to the log only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from omnivoice_onnx.core.shapes import AudioChunk, Request
from omnivoice_onnx.errors import Cancelled, UserError
from omnivoice_onnx.serve.door import ApiError, refuse

LOG = logging.getLogger("omnivoice_onnx.server")


class Speaker(Protocol):
    """What a worker asks of its model (OmniVoiceOnnx is one): a validated request's audio, whole
    or chunk by chunk, stopped between unmasking steps once `cancel` is set."""

    def generate(self, text: Request, *, cancel: threading.Event | None = None) -> list[np.ndarray]: ...

    def stream(self, text: Request, *, cancel: threading.Event | None = None) -> Iterator[AudioChunk]: ...


SpeakerT = TypeVar("SpeakerT", bound=Speaker)


@dataclass(kw_only=True)
class Work:
    """What a request hands the pool, shared by its handler (event loop) and a worker thread."""

    loop: asyncio.AbstractEventLoop
    # Job: ("chunk"|"audio", samples) ... ("done", None); Task: ("result", value), ("done", None);
    # either: ("error", ApiError) | ("timeout", None) | ("cancelled", None)
    events: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    timed_out: bool = False

    def emit(self, kind: str, payload: Any = None) -> None:
        """From the worker thread: hand an event to the handler's loop (dropped if the loop is gone)."""
        with contextlib.suppress(RuntimeError):  # the loop closed: the server is gone, nobody is listening
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))


@dataclass(kw_only=True)
class Job(Work):
    """One synthesis."""

    request: Request  # validated by the handler (OmniVoiceOnnx.validate), run as it is: never re-checked
    stream: bool  # stream() (the request was validated with stream=True), else generate()
    finished: bool = False
    samples_out: int = 0  # audio samples streamed so far (the SSE usage's output tokens)


@dataclass(kw_only=True)
class Task(Work):
    """Other model work, run by a worker with its own model: `run(model)`'s value is the result
    (an ApiError it raises is the client's answer)."""

    run: Callable[[Any], Any]


def scrub_paths(message: str, folders: dict[str, Path]) -> str:
    """`message` with this machine's folders replaced by their labels (a runtime error may name a file)."""
    for label, folder in folders.items():
        for spelling in sorted({str(folder), str(Path(folder).resolve())}, key=len, reverse=True):
            message = message.replace(spelling, label)
    return message


class WorkerPool(Generic[SpeakerT]):
    """N worker threads, each with its own model, fed from one bounded queue. Generic in the
    model's type: the pool calls only Speaker's methods; its owner reads `models` as what it loaded."""

    def __init__(self, models: list[SpeakerT], queue_size: int, folders: dict[str, Path]) -> None:
        self.models = models
        self.folders = folders  # label -> folder, kept out of what clients see (scrub_paths)
        self.queue: queue.Queue[Job | Task | None] = queue.Queue(maxsize=queue_size)
        self.queue_size = queue_size
        self.running = 0
        self.uploads = 0  # upload_slot()s held: bodies being read, waiting or encoded
        self.draining = False
        self.cut_off = 0  # requests cancelled while draining (exit 143 when > 0)
        # Outcomes since start, in /health: what an operator (and the tests) can see of cancellation.
        self.counts = {"completed": 0, "cancelled": 0, "timed_out": 0, "failed": 0}
        self.mean_seconds = 1.0  # running mean of a request's worker time, for Retry-After
        # Called from the worker with (seconds of work, samples made) of each completed request: /metrics.
        self.on_synthesis: Callable[[float, int], None] | None = None
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, args=(model,), name=f"omnivoice-worker-{i}", daemon=True)
            for i, model in enumerate(models)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def workers(self) -> int:
        return len(self.models)

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the queue ahead, at the mean request time, over the workers."""
        ahead = self.queue.qsize() + self.running
        return max(1, math.ceil(self.mean_seconds * ahead / self.workers))

    @property
    def max_uploads(self) -> int:
        """Uploads held at once (upload_slot): one per worker and queue place. With each body at
        most forms.MAX_FORM_BYTES, the bodies in memory are bounded by this many of them."""
        return self.workers + self.queue_size

    def submit(self, job: Job | Task) -> None:
        """Queue `job`; the table's `shutting_down` (503) once draining, `queue_full` (429) when
        there is no room, each with its Retry-After."""
        if self.draining:
            raise refuse("shutting_down", headers={"Retry-After": "5"})
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise self._full() from None

    def _full(self) -> ApiError:
        retry = self.retry_after()
        return refuse(
            "queue_full", running=self.workers, queued=self.queue_size, retry=retry, headers={"Retry-After": str(retry)}
        )

    @contextlib.contextmanager
    def upload_slot(self) -> Iterator[None]:
        """A place for one upload (a reference recording, up to 16 MiB), taken BEFORE its body is
        read and held until its encoding is done: past max_uploads the request is the table's
        queue_full (429), so uploads wait like work instead of piling up in memory. Event loop only."""
        if self.draining:
            raise refuse("shutting_down", headers={"Retry-After": "5"})
        if self.uploads >= self.max_uploads:
            raise self._full()
        self.uploads += 1
        try:
            yield
        finally:
            self.uploads -= 1

    def close(self) -> None:
        """Stop the workers after the jobs already queued (the drain has let them finish)."""
        self.draining = True
        for _ in self._threads:
            self.queue.put(None)
        for thread in self._threads:
            thread.join()

    def _work(self, tts: SpeakerT) -> None:
        while (job := self.queue.get()) is not None:
            if job.cancel.is_set():  # its client left (or it timed out, or the drain ran out) while it waited
                job.emit(*self._cancelled(job))
                continue
            with self._lock:
                self.running += 1
            started = time.monotonic()
            final: list[tuple[str, Any]] = []
            try:
                final = self._run(tts, job)
            finally:
                with self._lock:
                    self.running -= 1
                    self.mean_seconds = 0.8 * self.mean_seconds + 0.2 * (time.monotonic() - started)
                for event in final:  # after `running` drops: a client holding its answer sees the worker free
                    job.emit(*event)

    def _synthesized(self, seconds: float, samples: int) -> None:
        if self.on_synthesis is not None:
            self.on_synthesis(seconds, samples)

    def _count(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += 1

    def _cancelled(self, job: Work) -> tuple[str, Any]:
        if self.draining and not job.timed_out:
            with self._lock:
                self.cut_off += 1
        self._count("timed_out" if job.timed_out else "cancelled")
        return ("timeout" if job.timed_out else "cancelled"), None

    def _run(self, tts: SpeakerT, job: Job | Task) -> list[tuple[str, Any]]:
        """Run the job, emitting its chunks as they come -> its final events (the whole clip, or a
        task's result, and "done"; or its failure), which _work emits once the worker counts as free."""
        started, samples = time.monotonic(), 0
        try:
            final: list[tuple[str, Any]]
            if isinstance(job, Task):
                final = [("result", job.run(tts))]
            elif job.stream:
                for chunk in tts.stream(job.request, cancel=job.cancel):
                    samples += chunk.samples.size
                    job.emit("chunk", chunk.samples)
                self._synthesized(time.monotonic() - started, samples)
                final = []
            else:
                audio = tts.generate(job.request, cancel=job.cancel)[0]
                self._synthesized(time.monotonic() - started, audio.size)
                final = [("audio", audio)]
            self._count("completed")
            return [*final, ("done", None)]
        except Cancelled:
            return [self._cancelled(job)]
        except ApiError as exc:  # a task's own refusal (an uploaded reference that cannot be read)
            self._count("failed")
            return [("error", exc)]
        except UserError as exc:
            self._count("failed")
            return [("error", refuse("invalid_value", detail=scrub_paths(str(exc), self.folders)))]
        except Exception:  # a bug or the machine (memory): logged with its traceback; the client gets one line
            self._count("failed")
            LOG.exception("request failed")
            return [("error", refuse("internal_error"))]


def time_out(job: Work) -> None:
    """The request's time is up: its handler answers now (a queued job would otherwise wait for a
    worker to reach it), and the worker drops it or stops it before its next step."""
    job.timed_out = True
    job.cancel.set()
    job.events.put_nowait(("timeout", None))


def job_failure(job: Work, kind: str, payload: Any, draining: bool = False) -> ApiError:
    """The refusal a job that ended without its audio gets: its error, the timeout, or (cancelled)
    `shutting_down` when the drain cut it off, else `cancelled` (its client left: only logs see it)."""
    if kind == "error" and isinstance(payload, ApiError):
        return payload
    if kind == "timeout":
        return refuse("timeout")
    return refuse("shutting_down" if draining else "cancelled")
