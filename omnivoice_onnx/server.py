"""An OpenAI-compatible speech server over the torch-free runtime (`omnivoice-onnx serve`).

    pip install 'omnivoice-onnx[serve]'
    omnivoice-onnx serve --model-dir onnx --port 8000          # 127.0.0.1 unless --host says otherwise

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.audio.speech.create(model="omnivoice", voice="auto", input="Hello.").write_to_file("hello.wav")

Routes (OpenAI's shapes, so the official client and the tools built on it work unchanged):
    POST /v1/audio/speech   model, input, voice, instructions, response_format, speed, stream_format,
                            and the extensions language, seed, num_step, guidance_scale, duration
    GET  /v1/audio/voices   the built-in modes, the saved voices (omnivoice_onnx.voices) and the
                            OpenAI-named presets no saved voice replaces (omnivoice_onnx.presets)
    GET  /v1/models         the bundle's model id, the transformer variants in the folder, and the
                            ids that name the served variant (tts-1, tts-1-hd, gpt-4o-mini-tts, --model-alias)
    GET  /v1/audio/languages  the model's language ids and names (extension)
    POST /v1/audio/references  a reference recording as the body, ?ref_text=its words -> a voice id
                            for later requests ("ref-...", in memory); &save_as=NAME saves it as a
                            voice, only with --allow-voice-save (else 403)
    GET  /                  a page to try voices (omnivoice_onnx/web/index.html; no key needed)
    GET  /health            liveness and queue depth (no key needed: for load balancers)

OpenAI clients work with OpenAI's defaults: `model="tts-1"` and `voice="alloy"` (a preset: a
voice-design instruct and a fixed seed, so the same request gives the same bytes); see
docs/drop-in.md.

What a request gets:
- Without stream_format: the whole clip from OmniVoiceOnnx.generate(), with upstream's global
  post-processing, in one response. A `seed` gives generate()'s audio with that seed, to the
  format's precision (16-bit PCM for wav/pcm/flac). The seed used is returned in `X-Seed`, so a
  request without one can be repeated. OpenAI streams every response; this server streams only
  when asked, because a text-chunk stream cannot equal the post-processed clip (see
  OmniVoiceOnnx.stream) and a caller that sends a seed expects generate()'s audio.
- stream_format "audio": chunked transfer of audio bytes as OmniVoiceOnnx.stream() decodes each
  text chunk (pcm, wav with an open-ended header as OpenAI sends it, or Ogg Opus). "sse": OpenAI's
  `speech.audio.delta` events (base64 of the same bytes) then one `speech.audio.done`. FLAC and
  MP3 are offered whole only: libsndfile rewrites their headers when it closes the file (FLAC's
  sample count, LAME's Info frame), and the bytes streamed before that are not a stream that
  decoders read back (measured: log Run 26E).
- Errors in OpenAI's shape {"error": {"message", "type", "param", "code"}}: 400 bad field, 401
  wrong key, 404 unknown route, 413 body too large, 429 queue full and 503 shutting down (both
  with Retry-After), 504 past the request timeout. No traceback or server path reaches a client:
  it goes to the server's log.

Concurrency: a bounded queue in front of N worker threads, each with its own OmniVoiceOnnx (own
sessions, threads = cores // N, so N x threads = cores). A client that disconnects has its queued
work dropped and its running work cancelled between unmasking steps (the `cancel` Event of
generate()/stream()); a request past --timeout is cancelled the same way. Requests are never
batched together (measured: log Run 26E); memory is each worker's model plus one request each.

SIGTERM (or Ctrl-C) stops accepting connections, lets the requests in flight finish (up to
--drain-timeout), and exits 0: for a server, a drained stop is the successful end of its work.
Only when the drain timeout cut requests off does it exit 143 (130 for Ctrl-C), the CLI's code for
"terminated with work undone".
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import hashlib
import hmac
import io
import ipaddress
import json
import logging
import math
import os
import queue
import signal
import socket
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any, Literal

import numpy as np

from omnivoice_onnx import audio_out
from omnivoice_onnx import voices as voice_store
from omnivoice_onnx.api import OmniVoiceOnnx
from omnivoice_onnx.audio_out import to_pcm16
from omnivoice_onnx.contract import variants_present
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.generate import Cancelled, VoiceClonePrompt
from omnivoice_onnx.presets import OPENAI_MODEL_IDS, PRESETS
from omnivoice_onnx.prompt import language_names
from omnivoice_onnx.rng import SEED_MAX, SEED_MIN, fresh_seed

LOG = logging.getLogger("omnivoice_onnx.server")

MODEL_ID = "omnivoice"  # the `model` a request names; a variant is also reachable as "omnivoice-<variant>"
API_KEY_ENV = "OMNIVOICE_API_KEY"  # --api-key's environment spelling (keeps the key out of `ps`)
MAX_INPUT_CHARS = 4096  # OpenAI's documented limit for `input`
MAX_INSTRUCTIONS_CHARS = 4096
SPEED_MIN, SPEED_MAX = 0.25, 4.0  # OpenAI's documented range for `speed`
MAX_BODY_BYTES = 64 * 1024  # 4096 chars of input are < 16 KiB even as \u escapes; leaves room
DEFAULT_QUEUE = 16  # waiting requests beyond the ones running; more get 429
DEFAULT_TIMEOUT_S = 300.0  # per request, queue wait included
LISTENING = "omnivoice-onnx serve: listening on "  # the start line's prefix, read by launch()
DEFAULT_DRAIN_S = 60.0  # SIGTERM: how long requests in flight may take to finish
# Connections (http_protocol): a client holding the server's resources without finishing a request
# (slowloris: one header byte every 2 s; 300 idle sockets) is cut off, with a JSON error where a
# reply is still possible. A real client sends its headers at once and its <= 64 KiB body in well
# under a second.
HEADER_TIMEOUT_S = 10.0  # from the connection (or the previous response) to a request's complete headers
BODY_TIMEOUT_S = 30.0  # from the headers to the complete body, plus its limit at MIN_BODY_RATE
MIN_BODY_RATE = 64 * 1024  # bytes/s a client must at least send: 16 MiB of reference audio get 256 s more
KEEP_ALIVE_S = 5.0  # an idle keep-alive connection is closed after this (uvicorn's default, stated)
MAX_CONNECTIONS = 512  # open connections at once; one more is answered 503 and closed
MAX_HEADER_BYTES = 16 * 1024  # request line + headers (h11's incomplete-event limit); more: 400
BUILTIN_VOICES = {
    "auto": "upstream's auto mode: a voice the model picks; with `instructions`, voice design",
    "design": "voice design from `instructions` (required), e.g. \"female, low pitch, british accent\"",
}
# POST /v1/audio/references: a reference recording as the request body (any format libsndfile
# reads). A 60 s reference (request.MAX_REF_SECONDS) at 48 kHz stereo 16-bit is 11.5 MB.
MAX_REFERENCE_BYTES = 16 << 20
REFERENCE_PREFIX = "ref-"  # the voice id of an uploaded reference: "ref-" + the first hex of its sha256
REFERENCES_KEPT = 32  # uploaded references held in memory (the least recently used goes first)


@dataclass(frozen=True)
class AudioFormat:
    """One response_format: how it is written and whether it can be sent as a stream."""

    media_type: str
    sf_format: str | None  # libsndfile container (None: raw s16le)
    sf_subtype: str | None
    streams: bool  # chunks concatenate to a stream decoders read (see the module docstring)


FORMATS = {
    "wav": AudioFormat("audio/wav", "WAV", "PCM_16", True),
    "pcm": AudioFormat("audio/pcm", None, None, True),  # s16le, mono, at the model's rate (24 kHz)
    "flac": AudioFormat("audio/flac", "FLAC", "PCM_16", False),
    "mp3": AudioFormat("audio/mpeg", "MP3", "MPEG_LAYER_III", False),
    "opus": AudioFormat("audio/ogg", "OGG", "OPUS", True),  # Ogg Opus, as OpenAI's opus
}
# OpenAI also offers aac; libsndfile has no AAC encoder, so it is refused like a format this
# machine's libsndfile lacks.


def available_formats() -> dict[str, AudioFormat]:
    """The FORMATS the installed libsndfile writes (MP3 needs libsndfile >= 1.1 built with LAME,
    Opus one built with libopus); the others are refused with a 400 that lists these."""
    import soundfile

    return {name: fmt for name, fmt in FORMATS.items()
            if fmt.sf_format is None or fmt.sf_subtype in soundfile.available_subtypes(fmt.sf_format)}


def encode_clip(samples: np.ndarray, fmt: str, sample_rate: int) -> bytes:
    """A whole clip as the bytes of a `fmt` file: wav/flac/pcm by the runtime's one writer
    (audio_out), mp3/opus from the same 16-bit samples by libsndfile."""
    if fmt in audio_out.FORMATS:
        return audio_out.encode_audio(samples, sample_rate, fmt)
    import soundfile

    spec = FORMATS[fmt]
    buffer = io.BytesIO()  # int16 in: libsndfile's own float conversion scales by 32768, audio_out's by 32767
    soundfile.write(buffer, to_pcm16(samples), sample_rate, format=spec.sf_format, subtype=spec.sf_subtype)
    return buffer.getvalue()


class _AppendOnly(io.RawIOBase):
    """A write target for libsndfile that keeps only what was not yet taken: a container written
    front to back (Ogg) streams through it; one that seeks back to rewrite a header fails loudly
    instead of sending bytes that disagree with those already sent."""

    def __init__(self) -> None:
        super().__init__()
        self.pending = bytearray()
        self.position = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.pending += bytes(data)
        self.position += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        target = {0: offset, 1: self.position + offset, 2: self.position + offset}[whence]
        if target != self.position:
            raise OSError(f"the encoder seeks back to byte {target} of a stream at {self.position}")
        return self.position

    def tell(self) -> int:
        return self.position

    def read(self, size: int = -1) -> bytes:
        return b""

    def take(self) -> bytes:
        data, self.pending = bytes(self.pending), bytearray()
        return data


class StreamEncoder:
    """Audio chunks -> the bytes of one continuous `fmt` stream, as they become available."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        self.spec, self.sample_rate = FORMATS[fmt], sample_rate
        if not self.spec.streams:
            raise ValueError(f"{fmt} does not stream")
        self._sink: _AppendOnly | None = None
        self._file = None
        if self.spec.sf_format not in (None, "WAV"):
            import soundfile

            self._sink = _AppendOnly()
            self._file = soundfile.SoundFile(self._sink, "w", samplerate=sample_rate, channels=1,
                                             format=self.spec.sf_format, subtype=self.spec.sf_subtype)

    def start(self) -> bytes:
        """What goes out before the first chunk."""
        return audio_out.wav_header(self.sample_rate, None) if self.spec.sf_format == "WAV" else b""

    def write(self, samples: np.ndarray) -> bytes:
        if self._file is None:
            return to_pcm16(samples).tobytes()
        self._file.write(to_pcm16(samples))
        return self._sink.take()

    def finish(self) -> bytes:
        if self._file is None:
            return b""
        self._file.close()
        return self._sink.take()


# --- requests ------------------------------------------------------------------------------------

class ApiError(Exception):
    """An error a client sees, in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def speech_request_model():
    """The pydantic model of a POST /v1/audio/speech body (built on first use: pydantic is the
    `serve` extra's, not the runtime core's). Unknown fields are refused, as OpenAI refuses them:
    a misspelt `sped` must not silently run at speed 1. Numbers are strict: `"speed": true` or
    `"seed": "7"` is a 400, never read as 1 or 7 (a JSON integer is still a number)."""
    from pydantic import BaseModel, ConfigDict, Field

    class VoiceId(BaseModel):
        model_config = ConfigDict(extra="forbid")
        id: str

    class SpeechRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        model: str
        input: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)
        voice: str | VoiceId
        instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
        response_format: str | None = None
        speed: float | None = Field(None, ge=SPEED_MIN, le=SPEED_MAX, allow_inf_nan=False, strict=True)
        stream_format: Literal["audio", "sse"] | None = None
        # Extensions (not OpenAI's): the runtime's generate() arguments. Types and signs here; their
        # upper limits are the runtime's (omnivoice_onnx.request, raisable by environment), checked by
        # OmniVoiceOnnx.validate().
        language: str | None = None
        seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX, strict=True)
        num_step: int | None = Field(None, ge=1, strict=True)
        guidance_scale: float | None = Field(None, allow_inf_nan=False, strict=True)
        duration: float | None = Field(None, gt=0.0, allow_inf_nan=False, strict=True)

    return SpeechRequest


def validation_error(exc: Any) -> ApiError:
    """pydantic's first complaint as one 400 naming the field."""
    first = exc.errors()[0]
    param = ".".join(str(part) for part in first["loc"]) or None
    if first["type"] == "extra_forbidden":
        return ApiError(400, f"unknown field {param!r}", param, "unknown_parameter")
    if first["type"] == "missing":
        return ApiError(400, f"missing required field {param!r}", param, "missing_required_parameter")
    if first["type"] == "string_too_long" and param == "input":
        return ApiError(400, f"input is longer than {MAX_INPUT_CHARS} characters; split the text into several "
                        "requests", param, "string_above_max_length")
    return ApiError(400, f"{param}: {first['msg']}", param, "invalid_value")


@dataclass
class Job:
    """One request's work, shared by its handler (event loop) and a worker thread."""

    text: str
    kwargs: dict[str, Any]  # generate()/stream() keywords besides text and seed
    seed: int
    stream: bool
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # ("chunk"|"audio", samples) ... ("done"|"error", x)
    cancel: threading.Event = field(default_factory=threading.Event)
    timed_out: bool = False
    finished: bool = False
    samples_out: int = 0  # audio samples streamed so far (the SSE usage's output tokens)

    def emit(self, kind: str, payload: Any = None) -> None:
        """From the worker thread: hand an event to the handler's loop (dropped if the loop is gone)."""
        with contextlib.suppress(RuntimeError):  # the loop closed: the server is gone, nobody is listening
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))


def scrub_paths(message: str, folders: dict[str, Path]) -> str:
    """`message` with this machine's folders replaced by their labels (a runtime error may name a file)."""
    for label, folder in folders.items():
        for spelling in sorted({str(folder), str(Path(folder).resolve())}, key=len, reverse=True):
            message = message.replace(spelling, label)
    return message


class QueueFull(Exception):
    """No room in the queue (429)."""


class Draining(Exception):
    """The server is stopping (503)."""


class WorkerPool:
    """N worker threads, each with its own OmniVoiceOnnx, fed from one bounded queue."""

    def __init__(self, models: list[OmniVoiceOnnx], queue_size: int, folders: dict[str, Path]) -> None:
        self.models = models
        self.folders = folders  # label -> folder, kept out of what clients see (scrub_paths)
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self.queue_size = queue_size
        self.running = 0
        self.draining = False
        self.cut_off = 0  # requests cancelled while draining (exit 143 when > 0)
        # Outcomes since start, in /health: what an operator (and the tests) can see of cancellation.
        self.counts = {"completed": 0, "cancelled": 0, "timed_out": 0, "failed": 0}
        self.mean_seconds = 1.0  # running mean of a request's worker time, for Retry-After
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._work, args=(model,), name=f"omnivoice-worker-{i}", daemon=True)
                         for i, model in enumerate(models)]
        for thread in self._threads:
            thread.start()

    @property
    def workers(self) -> int:
        return len(self.models)

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the queue ahead, at the mean request time, over the workers."""
        ahead = self.queue.qsize() + self.running
        return max(1, math.ceil(self.mean_seconds * ahead / self.workers))

    def submit(self, job: Job) -> None:
        if self.draining:
            raise Draining()
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise QueueFull() from None

    def close(self) -> None:
        """Stop the workers after the jobs already queued (the drain has let them finish)."""
        self.draining = True
        for _ in self._threads:
            self.queue.put(None)
        for thread in self._threads:
            thread.join()

    def _work(self, tts: OmniVoiceOnnx) -> None:
        while (job := self.queue.get()) is not None:
            if job.cancel.is_set():  # its client left (or it timed out, or the drain ran out) while it waited
                self._cancelled(job)
                continue
            with self._lock:
                self.running += 1
            started = time.monotonic()
            try:
                self._run(tts, job)
            finally:
                with self._lock:
                    self.running -= 1
                    self.mean_seconds = 0.8 * self.mean_seconds + 0.2 * (time.monotonic() - started)

    def _count(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += 1

    def _cancelled(self, job: Job) -> None:
        if self.draining and not job.timed_out:
            with self._lock:
                self.cut_off += 1
        self._count("timed_out" if job.timed_out else "cancelled")
        job.emit("timeout" if job.timed_out else "cancelled")

    def _run(self, tts: OmniVoiceOnnx, job: Job) -> None:
        try:
            if job.stream:
                for chunk in tts.stream(job.text, **job.kwargs, seed=job.seed, cancel=job.cancel):
                    job.emit("chunk", chunk.samples)
            else:
                job.emit("audio", tts.generate(job.text, **job.kwargs, seed=job.seed, cancel=job.cancel)[0])
            self._count("completed")
            job.emit("done")
        except Cancelled:
            self._cancelled(job)
        except UserError as exc:
            self._count("failed")
            job.emit("error", ApiError(400, scrub_paths(str(exc), self.folders)))
        except Exception:  # a bug or the machine (memory): logged with its traceback; the client gets one line
            self._count("failed")
            LOG.exception("request failed")
            job.emit("error", ApiError(500, "the server failed to make this audio (its log has the details)",
                                       kind="server_error", code="internal_error"))


# --- the app -------------------------------------------------------------------------------------

@dataclass
class ServerConfig:
    """What `omnivoice-onnx serve` was asked for."""

    model_dir: Path
    voices_dir: Path | None = None  # None: omnivoice_onnx.voices.voices_dir's default
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # None: no key required (refused off loopback unless no_auth)
    no_auth: bool = False  # --no-auth: serve a non-loopback host without a key, knowingly
    workers: int = 1
    threads: int | None = None  # per worker; None: cores // workers
    queue_size: int = DEFAULT_QUEUE
    timeout_s: float = DEFAULT_TIMEOUT_S
    drain_s: float = DEFAULT_DRAIN_S
    variant: str | None = None
    default_format: str | None = None  # None: mp3 (OpenAI's default) where libsndfile writes it, else wav
    max_body_bytes: int = MAX_BODY_BYTES
    model_aliases: tuple[str, ...] = ()  # more model ids that name the served variant (--model-alias)
    allow_voice_save: bool = False  # POST /v1/audio/references may save a named voice (--allow-voice-save)


def cores() -> int:
    """CPUs this process may run on (the affinity mask, which containers and taskset narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class Service:
    """The loaded state the routes use."""

    config: ServerConfig
    pool: WorkerPool
    voices: Path
    formats: dict[str, AudioFormat]
    default_format: str
    fingerprint: str
    variant: str
    sample_rate: int
    created: int = field(default_factory=lambda: int(time.time()))
    # Uploaded references (POST /v1/audio/references), by voice id; in memory, least recent first.
    references: collections.OrderedDict[str, VoiceClonePrompt] = field(default_factory=collections.OrderedDict)

    def scrub(self, message: str) -> str:
        return scrub_paths(message, self.pool.folders)

    def model_ids(self) -> list[str]:
        """Every `model` a request may name: ours, OpenAI's speech models and --model-alias ids all
        name the served variant (an OpenAI client's "tts-1" works unchanged)."""
        return list(dict.fromkeys([MODEL_ID, f"{MODEL_ID}-{self.variant}", *OPENAI_MODEL_IDS,
                                   *self.config.model_aliases]))

    def saved_voices(self) -> list[Any]:
        try:
            return voice_store.list_voices(self.voices)
        except UserError as exc:
            LOG.error("voices folder: %s", exc)
            raise ApiError(500, "the voices folder holds a damaged voice file (the server log names it)",
                           kind="server_error", code="voices_unreadable") from exc

    def voice_kwargs(self, voice: Any, instructions: str | None) -> tuple[dict[str, Any], int | None]:
        """generate() keywords for the request's voice and instructions (a name, never a path), and
        the seed the voice brings (a preset's; None: the request's or a fresh one). A name resolves
        to a built-in mode, an uploaded reference (ref-...), a saved voice, else an OpenAI preset."""
        name = voice if isinstance(voice, str) else voice.id
        if name in BUILTIN_VOICES:
            if name == "design" and not instructions:
                raise ApiError(400, "voice 'design' needs `instructions` describing the voice, e.g. "
                               "\"female, low pitch\"", "instructions", "missing_required_parameter")
            return ({"instruct": instructions} if instructions else {}), None
        try:
            voice_store.check_name(name)
        except UserError:
            raise ApiError(400, f"voice {name!r} is not a voice name (names are names, not paths); voices: "
                           f"{', '.join(self.voice_names())}", "voice", "invalid_voice") from None
        seed = None
        if name in self.references:
            self.references.move_to_end(name)
            kwargs: dict[str, Any] = {"voice_clone_prompt": self.references[name]}
        elif name in self.saved_names():
            try:
                kwargs = voice_store.load_voice(name, self.voices, self.fingerprint).generate_kwargs()
            except UserError as exc:
                raise ApiError(400, self.scrub(str(exc)), "voice", "invalid_voice") from exc
        elif name in PRESETS:
            kwargs, seed = PRESETS[name].generate_kwargs(), PRESETS[name].seed
        else:
            hint = " (uploaded references are kept in memory only: upload it again)" \
                if name.startswith(REFERENCE_PREFIX) else ""
            raise ApiError(400, f"unknown voice {name!r}{hint}; voices: {', '.join(self.voice_names())}", "voice",
                           "invalid_voice")
        if instructions:
            kwargs["instruct"] = instructions  # the request's description wins over a saved or preset design
        return kwargs, seed

    def saved_names(self) -> list[str]:
        return [voice.name for voice in self.saved_voices()]

    def voice_names(self) -> list[str]:
        """What `voice` may name (uploaded references aside): the built-in modes, the saved voices, and
        the presets no saved voice of the same name replaces."""
        saved = self.saved_names()
        return list(BUILTIN_VOICES) + saved + [name for name in PRESETS if name not in saved]

    def languages(self) -> list[dict[str, Any]]:
        """The model's languages: [{"id", "names"}] in runtime-config.json's order."""
        table = language_names(self.pool.models[0].runtime_config["languages"])
        return [{"id": lang_id, "names": names} for lang_id, names in table.items()]

    def encode_reference(self, data: bytes, ref_text: str) -> VoiceClonePrompt:
        """An uploaded recording (a file's bytes) encoded as a cloning prompt by the runtime's own
        reader (length checked from the header, then read, resampled, trimmed: request.py's
        limits); ApiError 400 naming the problem. Runs on the caller's thread (not a worker's)."""
        with tempfile.TemporaryDirectory(prefix="omnivoice-ref-") as folder:
            path = Path(folder) / "reference"
            path.write_bytes(data)
            try:
                return self.pool.models[0].create_voice_clone_prompt(str(path), ref_text)
            except UserError as exc:
                message = scrub_paths(str(exc), {"the uploaded reference": path, **self.pool.folders})
                raise ApiError(400, message, None, "invalid_reference") from exc

    def add_reference(self, prompt: VoiceClonePrompt, digest: str) -> str:
        """Keep an uploaded reference for later requests (REFERENCES_KEPT at most) -> its voice id."""
        name = REFERENCE_PREFIX + digest[:16]
        self.references[name] = prompt
        self.references.move_to_end(name)
        while len(self.references) > REFERENCES_KEPT:
            self.references.popitem(last=False)
        return name


@dataclass
class Speech:
    """What one synthesis asks for, as a front end without pydantic (the Wyoming server) builds it;
    the fields SpeechRequest shares, so plan_job() reads either."""

    input: str
    voice: str
    instructions: str | None = None
    language: str | None = None
    speed: float | None = None
    duration: float | None = None
    num_step: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None


def plan_job(service: Service, request: Any, loop: asyncio.AbstractEventLoop, stream: bool) -> Job:
    """The validated work of one synthesis (a SpeechRequest or a Speech): the voice resolved, the
    seed chosen (the request's, else its preset's, else a fresh one), the request checked by the
    runtime without model work; ApiError (400) for anything it would refuse."""
    kwargs, voice_seed = service.voice_kwargs(request.voice, request.instructions)
    config = {key: value for key, value in (("num_step", request.num_step),
                                             ("guidance_scale", request.guidance_scale)) if value is not None}
    kwargs.update(language=request.language, speed=request.speed, duration=request.duration,
                  generation_config=config or None)
    seed = request.seed if request.seed is not None else voice_seed if voice_seed is not None else fresh_seed()
    try:
        service.pool.models[0].validate(request.input, **kwargs, seed=seed)  # no model work: a 400 before the queue
    except UserError as exc:
        raise ApiError(400, service.scrub(str(exc))) from exc
    return Job(text=request.input, kwargs=kwargs, seed=seed, stream=stream, loop=loop)


def build_job(service: Service, request: Any, loop: asyncio.AbstractEventLoop) -> tuple[Job, str]:
    """The validated work of one request and its response_format; ApiError (400) for anything
    the runtime would refuse, found before the request takes a place in the queue."""
    if request.model not in service.model_ids():
        raise ApiError(404, f"model {request.model!r} does not exist; this server has {', '.join(service.model_ids())}",
                       "model", "model_not_found")
    fmt = request.response_format or service.default_format
    if fmt not in service.formats:
        raise ApiError(400, f"response_format {fmt!r} is not available here; choose one of "
                       f"{', '.join(service.formats)}", "response_format", "unsupported_format")
    if request.stream_format and not service.formats[fmt].streams:
        streamable = [name for name, spec in service.formats.items() if spec.streams]
        raise ApiError(400, f"response_format {fmt!r} cannot be streamed; with stream_format use one of "
                       f"{', '.join(streamable)}, or drop stream_format to get the whole {fmt} file",
                       "response_format", "unsupported_format")
    return plan_job(service, request, loop, stream=request.stream_format is not None), fmt


async def read_body(request: Any, limit: int, timeout_s: float | None = None) -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` bytes (declared or sent),
    and with 408 when it has not all come within `timeout_s` (default BODY_TIMEOUT_S plus `limit`
    at MIN_BODY_RATE; a client trickling it would hold a connection and a task for as long as it
    likes)."""
    timeout_s = BODY_TIMEOUT_S + limit / MIN_BODY_RATE if timeout_s is None else timeout_s
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdecimal() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes is over the limit of {limit}", code="body_too_large")
    body = bytearray()
    pieces = request.stream().__aiter__()
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            piece = await asyncio.wait_for(pieces.__anext__(), max(0.0, deadline - asyncio.get_running_loop().time()))
        except StopAsyncIteration:
            return bytes(body)
        except asyncio.TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {timeout_s:.0f} s", code="body_timeout",
                           headers={"Connection": "close"}) from None
        body += piece
        if len(body) > limit:
            raise ApiError(413, f"request body is over the limit of {limit} bytes", code="body_too_large")


def raw_error(error: ApiError) -> bytes:
    """`error` as a complete HTTP/1.1 response that closes the connection, for the places where
    there is no request to answer through the app (malformed HTTP, headers too slow, too many
    connections): the same JSON body as every other error, never uvicorn's plain text."""
    body = json.dumps(error.body()).encode()
    head = [f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close",
            *(f"{name}: {value}" for name, value in error.headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def http_protocol() -> type:
    """uvicorn's h11 protocol with the connection limits above (built on first use: uvicorn is the
    `serve` extra's). uvicorn bounds neither the time to send headers nor the number of idle
    connections, and answers malformed HTTP in plain text."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11(H11Protocol):
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.header_timer: asyncio.TimerHandle | None = None
            self.over_limit = len(self.connections) > MAX_CONNECTIONS  # answered when its request comes
            self.arm_header_timer()

        def data_received(self, data: bytes) -> None:
            if self.over_limit:  # refused after reading what was sent: closing first would reset the answer
                self.reject(ApiError(503, f"the server holds {MAX_CONNECTIONS} connections; retry shortly",
                                     kind="server_error", code="too_many_connections", headers={"Retry-After": "1"}))
                return
            super().data_received(data)

        def arm_header_timer(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
            self.header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self.headers_too_slow)

        def headers_too_slow(self) -> None:
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being answered (its body has BODY_TIMEOUT_S of its own)
            if self.conn.their_state is h11.IDLE:
                self.reject(ApiError(408, f"the request headers did not arrive within {HEADER_TIMEOUT_S:g} s",
                                     code="header_timeout"))

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self.arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            self.reject(ApiError(400, f"malformed HTTP request ({msg.rstrip('.')})", code="invalid_http"))

        def reject(self, error: ApiError) -> None:
            if not self.transport.is_closing():
                self.transport.write(raw_error(error))
                self.transport.close()

    return BoundedH11


async def wait_disconnect(request: Any) -> None:
    """Returns when the client goes away (after the body was read, receive() waits for that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(service: Service) -> Any:
    """The FastAPI application over `service` (its WorkerPool is closed when the app shuts down)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from pydantic import ValidationError
    from starlette.exceptions import HTTPException

    SpeechRequest = speech_request_model()

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(service.pool.close)

    # No generated schema or docs pages (GET /openapi.json is a JSON 404 like any unknown route):
    # the routes are OpenAI's, documented in the README, and the speech route reads its body itself.
    app = FastAPI(title="omnivoice-onnx", description=__doc__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    def error_response(error: ApiError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return error_response(ApiError(404, f"no route {request.method} {request.url.path}", code="not_found"))
        return error_response(ApiError(exc.status_code, str(exc.detail), code=None))

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        LOG.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(ApiError(500, "internal server error (the server log has the details)",
                                       kind="server_error", code="internal_error"))

    key = service.config.api_key

    class RequireKey:
        """`Authorization: Bearer <key>` on every route but /health (load balancers probe without
        it) and the page at / (it holds no data; its own requests send the key typed into it).
        Plain ASGI rather than @app.middleware: starlette's BaseHTTPMiddleware breaks a
        streamed response whose client leaves ("No response returned")."""

        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
            if scope["type"] == "http" and scope["path"] not in ("/health", "/"):
                token = bearer_token(dict(scope["headers"]).get(b"authorization", b""))
                if not hmac.compare_digest(token, key.encode()):
                    response = error_response(ApiError(401, "incorrect API key (send Authorization: Bearer <key>)",
                                                       code="invalid_api_key"))
                    await response(scope, receive, send)
                    return
            await self.app(scope, receive, send)

    if key:
        app.add_middleware(RequireKey)

    class DrainCutOff:
        """Outermost: a request that SIGTERM's --drain-timeout cancels before its response started
        gets a JSON 503 (uvicorn would send a plain-text 500); one that had started is cut short."""

        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
            started = False

            async def tracked(message: dict) -> None:
                nonlocal started
                started = started or message["type"] == "http.response.start"
                await send(message)

            try:
                await self.app(scope, receive, tracked)
            except asyncio.CancelledError:
                if scope["type"] != "http" or started:
                    raise
                LOG.warning("drain timeout: %s %s cut off before its response", scope["method"], scope["path"])
                await error_response(ApiError(503, "the server was stopped before this request finished (drain "
                                                   "timeout)", kind="server_error", code="shutting_down",
                                              headers={"Connection": "close"}))(scope, receive, send)

    app.add_middleware(DrainCutOff)

    @app.get("/health")
    async def health() -> JSONResponse:
        pool = service.pool
        body = {"status": "draining" if pool.draining else "ok", "workers": pool.workers, "running": pool.running,
                "queued": pool.queue.qsize(), "queue_size": pool.queue_size, **pool.counts}
        return JSONResponse(body, status_code=503 if pool.draining else 200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        present = variants_present(service.config.model_dir)
        data = [{"id": MODEL_ID, "object": "model", "created": service.created, "owned_by": "omnivoice-onnx",
                 "variant": service.variant, "served": True}]
        data += [{"id": f"{MODEL_ID}-{name}", "object": "model", "created": service.created,
                  "owned_by": "omnivoice-onnx", "variant": name, "served": name == service.variant}
                 for name in present]
        data += [{"id": alias, "object": "model", "created": service.created, "owned_by": "omnivoice-onnx",
                  "variant": service.variant, "served": True} for alias in service.model_ids()[2:]]
        return {"object": "list", "data": data}

    @app.get("/v1/audio/voices")
    async def list_voices() -> dict[str, Any]:
        data = [{"id": name, "name": name, "kind": "builtin", "description": text}
                for name, text in BUILTIN_VOICES.items()]
        saved = service.saved_voices()
        data += [{"id": voice.name, "name": voice.name, "kind": "clone" if voice.prompt is not None else "design",
                  "instruct": voice.instruct} for voice in saved]
        data += [{"id": name, "name": name, "kind": "preset", "instruct": preset.instruct, "seed": preset.seed}
                 for name, preset in PRESETS.items() if name not in {voice.name for voice in saved}]
        return {"object": "list", "voices": [item["id"] for item in data], "data": data}

    @app.get("/v1/audio/languages")
    async def list_languages() -> dict[str, Any]:
        """The `language` values the model knows (ids; names and tags like en-US resolve too)."""
        return {"object": "list", "data": service.languages()}

    async def add_reference(request: Request) -> JSONResponse:
        """Body: a reference recording (any format libsndfile reads); query: ref_text (its words),
        and save_as=NAME to keep it as a saved voice (only with --allow-voice-save). Answers the
        voice id to name in speech requests: NAME when saved, else an in-memory "ref-..." id."""
        ref_text, save_as = request.query_params.get("ref_text"), request.query_params.get("save_as")
        if not ref_text or not ref_text.strip():
            raise ApiError(400, "ref_text (the words spoken in the reference) is required", "ref_text",
                           "missing_required_parameter")
        if save_as is not None and not service.config.allow_voice_save:
            raise ApiError(403, "saving voices over HTTP is off on this server; start it with --allow-voice-save, "
                           "or leave out save_as to use the reference for requests without saving it",
                           "save_as", "voice_save_disabled", kind="permission_error")
        if save_as is not None:
            try:
                voice_store.check_name(save_as)
            except UserError as exc:
                raise ApiError(400, str(exc), "save_as", "invalid_voice") from None
        body = await read_body(request, MAX_REFERENCE_BYTES)
        if not body:
            raise ApiError(400, "the request body is empty; send the reference recording as the body",
                           code="empty_body")
        digest = hashlib.sha256(body + b"\0" + ref_text.encode()).hexdigest()
        prompt = await asyncio.to_thread(service.encode_reference, body, ref_text)
        if save_as is None:
            return JSONResponse({"id": service.add_reference(prompt, digest), "saved": False})
        voice = voice_store.Voice(save_as, prompt, None, service.fingerprint, Path())
        await asyncio.to_thread(voice_store.save_voice, service.voices, save_as, voice)
        LOG.info("saved voice %s (POST /v1/audio/references)", save_as)
        return JSONResponse({"id": save_as, "saved": True})

    app.router.add_route("/v1/audio/references", add_reference, methods=["POST"])  # reads its body itself

    @app.get("/")
    async def page() -> Response:
        """The page to try voices (omnivoice_onnx/web/index.html: plain HTML + JS, nothing fetched
        from elsewhere)."""
        return Response(web_page(), media_type="text/html; charset=utf-8")

    async def speech(request: Request) -> Any:
        body = await read_body(request, service.config.max_body_bytes)
        try:
            parsed = SpeechRequest.model_validate_json(body)
        except ValidationError as exc:
            if any(error["type"] == "json_invalid" for error in exc.errors()):
                raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
            raise validation_error(exc) from None
        loop = asyncio.get_running_loop()
        job, fmt = build_job(service, parsed, loop)
        try:
            service.pool.submit(job)
        except QueueFull:
            raise ApiError(429, f"the server is busy ({service.pool.workers} running, {service.pool.queue_size} "
                           "queued); retry after the Retry-After seconds", code="queue_full",
                           kind="rate_limit_error", headers={"Retry-After": str(service.pool.retry_after())}) from None
        except Draining:
            raise ApiError(503, "the server is shutting down", code="shutting_down", kind="server_error",
                           headers={"Retry-After": "5"}) from None
        timer = loop.call_at(loop.time() + service.config.timeout_s, time_out, job)
        headers = {"X-Seed": str(job.seed)}
        try:
            first = await _first_event(job, request)
        except BaseException:
            timer.cancel()
            job.cancel.set()
            raise
        kind, payload = first
        if kind in ("error", "timeout", "cancelled", "gone"):
            timer.cancel()
            raise job_failure(job, kind, payload)
        if not job.stream:
            timer.cancel()
            data = await asyncio.to_thread(encode_clip, payload, fmt, service.sample_rate)  # mp3 of minutes: not on the loop
            return Response(data, media_type=service.formats[fmt].media_type, headers=headers)
        chunks = _stream_bytes(job, first, StreamEncoder(fmt, service.sample_rate), timer)
        if parsed.stream_format == "sse":
            tts = service.pool.models[0]
            input_tokens = len(tts.tokenizer.encode(job.text, add_special_tokens=False))
            return StreamingResponse(_sse(chunks, job, input_tokens, tts.model.hop_length),
                                     media_type="text/event-stream", headers=headers)
        return StreamingResponse(chunks, media_type=service.formats[fmt].media_type, headers=headers)

    # A plain Starlette route: the handler reads and validates the body itself (size limit first,
    # then OpenAI-shaped 400s), so FastAPI's parameter injection has nothing to do here.
    app.router.add_route("/v1/audio/speech", speech, methods=["POST"])
    return app


def web_page() -> bytes:
    """The page at / (package data: omnivoice_onnx/web/index.html, in the wheel via pyproject)."""
    from importlib.resources import files

    return files("omnivoice_onnx").joinpath("web", "index.html").read_bytes()


def time_out(job: Job) -> None:
    """The request's time is up: its handler answers now (a queued job would otherwise wait for a
    worker to reach it), and the worker drops it or stops it before its next step."""
    job.timed_out = True
    job.cancel.set()
    job.events.put_nowait(("timeout", None))


def job_failure(job: Job, kind: str, payload: Any) -> ApiError:
    if kind == "error":
        return payload
    if kind == "timeout":
        return ApiError(504, "the request took longer than the server's timeout", code="timeout", kind="server_error")
    # 499 (nginx's "client closed request"): only the access log sees it, the client has gone.
    return ApiError(499, "request cancelled", code="cancelled")


async def _first_event(job: Job, request: Any) -> tuple[str, Any]:
    """The job's first event; if the client goes away first, the job is cancelled (dropped from the
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


class StreamFailed(Exception):
    """A streamed response's generation failed after its headers went out: the connection is
    closed without the final chunk, so the client sees an incomplete response, not a short clip."""


async def _stream_bytes(job: Job, first: tuple[str, Any], encoder: StreamEncoder,
                        timer: asyncio.TimerHandle) -> AsyncIterator[bytes]:
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


async def _sse(chunks: AsyncIterator[bytes], job: Job, input_tokens: int, hop_length: int) -> AsyncIterator[bytes]:
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
    done = {"type": "speech.audio.done",
            "usage": {"input_tokens": input_tokens, "output_tokens": frames, "total_tokens": input_tokens + frames}}
    yield f"data: {json.dumps(done)}\n\n".encode()


# --- running it ----------------------------------------------------------------------------------

def load_service(config: ServerConfig) -> Service:
    """Load one OmniVoiceOnnx per worker and check the voices folder, before the port opens."""
    threads = config.threads or max(1, cores() // config.workers)
    # The first load checks the bundle's files against its report (OmniVoiceOnnx's verify); the
    # other workers load the same files just checked, so they skip the re-hash (~3.7 GB at full size).
    models = [OmniVoiceOnnx.from_dir(config.model_dir, threads=threads, resident_codecs=True, variant=config.variant,
                                     verify=i == 0)
              for i in range(config.workers)]
    formats = available_formats()
    default = config.default_format or ("mp3" if "mp3" in formats else "wav")
    if default not in formats:
        raise UserError(f"--default-format {default} is not available here", f"choose one of {', '.join(formats)}")
    voices = voice_store.voices_dir(config.model_dir, config.voices_dir)
    voice_store.list_voices(voices)  # a damaged voice file is named now, not at the first request
    first = models[0]
    folders = {"<voices>": voices, "<model>": Path(config.model_dir)}
    return Service(config=config, pool=WorkerPool(models, config.queue_size, folders), voices=voices, formats=formats,
                   default_format=default, fingerprint=first.metadata["model_fingerprint"], variant=first.variant,
                   sample_rate=first.sample_rate)


def bearer_token(header: bytes) -> bytes:
    """The credentials of an `Authorization: Bearer <token>` header, b"" for any other scheme or
    none. The scheme name is case-insensitive (RFC 7235 2.1): `bearer KEY` and `BEARER KEY` count."""
    scheme, _, token = header.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


def api_key_from(flag: str | None, environ: dict[str, str]) -> str | None:
    """The key the server requires: --api-key if given, else $OMNIVOICE_API_KEY, else None. An empty
    one is an error, not "no key": `--api-key "$KEY"` with KEY unset would otherwise start the
    server with authentication off and no word."""
    source, key = ("--api-key", flag) if flag is not None else (f"${API_KEY_ENV}", environ.get(API_KEY_ENV))
    if key is not None and not key.strip():
        raise UserError(f"{source} is empty (an unset shell variable?)",
                        "pass the key the clients will send, or leave the option out for a loopback-only server")
    return key


def is_loopback(host: str) -> bool:
    """Whether every address `host` resolves to is this machine's loopback (127.0.0.0/8, ::1)."""
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False  # bind() names an unresolvable host in its own line
    return bool(found) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in found)


def check_auth(config: ServerConfig) -> None:
    """Refuse to serve a host other machines can reach without a key, unless --no-auth says so
    knowingly (then warn, loudly); a key and --no-auth together contradict each other."""
    if config.no_auth and config.api_key is not None:
        raise UserError("--no-auth and an API key contradict each other",
                        f"drop --no-auth, or drop --api-key / unset ${API_KEY_ENV}")
    if config.api_key is None and not is_loopback(config.host):
        if not config.no_auth:
            raise UserError(f"refusing to serve {config.host} without an API key: anyone who can reach it could use it",
                            f"pass --api-key KEY (or set ${API_KEY_ENV}), bind --host 127.0.0.1, or pass --no-auth "
                            "to serve it open on purpose")
        LOG.warning("--no-auth: serving %s WITHOUT AUTHENTICATION; anyone who can reach this address can use it",
                    config.host)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or a UserError naming the address (uvicorn itself logs and exits 1)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(2048)  # uvicorn's backlog; a client that connects before the loop runs waits in it
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror or exc})",
                        "choose another --port (0: any free one) or --host, or stop what uses it") from None
    return listener


def serve(config: ServerConfig) -> int:
    """Run the server until SIGTERM/SIGINT; the exit code (0 drained, 143/130 requests cut off)."""
    import uvicorn

    check_auth(config)
    listener = bind(config.host, config.port)  # a busy port is named before the models load
    service = load_service(config)
    server = make_server(uvicorn.Config(create_app(service), host=config.host, port=config.port, log_level="info",
                                        timeout_graceful_shutdown=math.ceil(config.drain_s), lifespan="on",
                                        http=http_protocol(), timeout_keep_alive=math.ceil(KEEP_ALIVE_S),
                                        h11_max_incomplete_event_size=MAX_HEADER_BYTES),
                         service.pool)
    host, port = listener.getsockname()[:2]
    LOG.info("omnivoice-onnx serve: %d worker(s) x %d thread(s), queue %d, default format %s, voices %s",
             service.pool.workers, config.threads or max(1, cores() // config.workers), config.queue_size,
             service.default_format, service.voices)
    # uvicorn prints no address for a socket it is given; this line has the real port (--port 0).
    LOG.info("%s%s", LISTENING, f"http://{f'[{host}]' if ':' in host else host}:{port}/v1")
    server.run(sockets=[listener])
    if server.stopped_by is not None and service.pool.cut_off:
        return 128 + server.stopped_by
    return 0


@dataclass
class Launched:
    """A server started by `launch`: its process, its port and its log file."""

    process: Any  # subprocess.Popen
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait (bounded) for the drain and exit; its exit code."""
        import subprocess

        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
                raise
        return self.process.returncode


def launch(model_dir: Path, log: Path, *flags: str, env: dict[str, str] | None = None,
           start_timeout: float = 60.0, command: str = "serve") -> Launched:
    """`omnivoice-onnx serve --model-dir M --port 0 FLAGS` as a child process, once it listens: the
    port is read from its start line, so there is no race for a free port (tests, benches).
    command="wyoming" starts `omnivoice-onnx wyoming --uri tcp://127.0.0.1:0` the same way."""
    import re
    import subprocess
    import sys

    with open(log, "w") as handle:
        where = ["--port", "0"] if command == "serve" else ["--uri", "tcp://127.0.0.1:0"]
        process = subprocess.Popen([sys.executable, "-m", "omnivoice_onnx", command, "--model-dir", str(model_dir),
                                    *where, *flags], env=env, stdout=handle, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + start_timeout
    while time.monotonic() < deadline:
        found = re.search(re.escape(f"omnivoice-onnx {command}: listening on ") + r"\S+:(\d+)", Path(log).read_text())
        if found:
            return Launched(process, int(found.group(1)), Path(log))
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    process.wait(10)
    raise RuntimeError(f"the server did not start within {start_timeout:g} s; its log: {log}")


def make_server(config: Any, pool: WorkerPool) -> Any:
    """uvicorn's Server with the signal handling this server documents: uvicorn re-raises a caught
    SIGTERM after its shutdown, so the process would die by the signal even after a clean drain.
    Here the first SIGTERM/SIGINT marks the pool draining (new requests: 503) and starts uvicorn's
    graceful shutdown; `stopped_by` records the signal."""
    import uvicorn

    class Server(uvicorn.Server):
        stopped_by: int | None = None

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        def stop(self, sig: int, frame: Any) -> None:
            self.stopped_by = sig
            pool.draining = True
            self.handle_exit(sig, frame)

    return Server(config)
