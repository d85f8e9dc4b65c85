"""What a request is to the speech server (omnivoice_onnx.serve.app): OpenAI's request body (its
pydantic model, its 400s), the server's configuration and loaded state (Service: the pool, the
voices, uploaded references, the formats), and the Job a synthesis becomes (plan_job: every check,
the runtime's one validation included, before the request takes a place in the queue).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import ipaddress
import logging
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

from omnivoice_onnx import limits
from omnivoice_onnx import voices as voice_store
from omnivoice_onnx.audio_formats import AudioFormat
from omnivoice_onnx.bundle import Folder
from omnivoice_onnx.core.prompt import language_names
from omnivoice_onnx.core.request import keywords
from omnivoice_onnx.core.shapes import Model, Request, RequestKeywords, Tokenizer, VoiceClonePrompt
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.hashing import CHUNK_BYTES
from omnivoice_onnx.limits import MAX_SPEED, MIN_SPEED, SEED_MAX, SEED_MIN
from omnivoice_onnx.serve.door import (
    MAX_BODY_BYTES,
    MAX_INPUT_CHARS,
    MAX_INSTRUCTIONS_CHARS,
    ApiError,
    refuse,
    too_long,
)
from omnivoice_onnx.serve.pool import Job, Speaker, WorkerPool, scrub_paths

if TYPE_CHECKING:  # pydantic is the serve extra's, imported where the model is built
    from pydantic import BaseModel
    from typing_extensions import Unpack  # typing's own from Python 3.11


class ServedModel(Speaker, Protocol):
    """A loaded model as the server's front ends use it (OmniVoiceOnnx is one): besides the
    worker's two calls, a request's one validation before it queues, a reference's encoding, and
    what the answers describe (languages, instruct items, variants, token counts)."""

    @property
    def runtime_config(self) -> dict[str, Any]: ...  # the export's runtime-config.json

    @property
    def bundle(self) -> Folder: ...  # the export folder it was loaded from

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def model(self) -> Model: ...

    def validate(
        self, text: str | list[str], *, stream: bool = False, **keywords: Unpack[RequestKeywords]
    ) -> Request: ...

    def create_voice_clone_prompt(
        self, ref_audio: Any, ref_text: str, preprocess_prompt: bool = True
    ) -> VoiceClonePrompt: ...


LOG = logging.getLogger("omnivoice_onnx.server")

MODEL_ID = "omnivoice"  # the `model` a request names; a variant is also reachable as "omnivoice-<variant>"
# The model ids OpenAI clients send (speech models); each names the served variant, as OpenAI's
# voice names name the presets (voices.PRESETS): Open WebUI and the SDK examples work unchanged.
OPENAI_MODEL_IDS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
API_KEY_ENV = "OMNIVOICE_API_KEY"  # --api-key's environment spelling (keeps the key out of `ps`)
DEFAULT_QUEUE = 16  # waiting requests beyond the ones running; more get 429
DEFAULT_TIMEOUT_S = 300.0  # per request, queue wait included
DEFAULT_DRAIN_S = 60.0  # SIGTERM: how long requests in flight may take to finish
# The voice names that mean a mode, and the prefix of an uploaded reference's id: the voice store's
# (voices.MODES), where the same names are refused to every writer of a saved voice.
BUILTIN_VOICES = voice_store.MODES
REFERENCE_PREFIX = voice_store.REFERENCE_PREFIX
REFERENCES_KEPT = 32  # uploaded references held in memory (the least recently used goes first)


@dataclass(frozen=True)
class VoiceEntry:
    """One voice of Service.voice_catalogue(), as the voice lists (GET /v1/audio/voices, Wyoming's
    Info) show it."""

    name: str
    kind: Literal["builtin", "clone", "design", "preset"]  # clone/design: a saved voice
    text: str | None  # builtin: what the mode does; a saved voice's or preset's instruct (None: none)
    seed: int | None = None  # the seed it speaks with when a request gives none (a preset's, a saved voice's)

    @staticmethod
    def saved(voice: voice_store.Voice) -> VoiceEntry:
        """A saved voice's (or a preset's) entry: a clone when it holds a reference, else a design."""
        kind: Literal["clone", "design", "preset"] = (
            "preset" if voice.is_preset else "clone" if voice.prompt is not None else "design"
        )
        return VoiceEntry(voice.name, kind, voice.instruct, voice.seed)


# --- requests ------------------------------------------------------------------------------------


def speech_request_model() -> type[BaseModel]:
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
        speed: float | None = Field(None, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False, strict=True)  # limits
        stream_format: Literal["audio", "sse"] | None = None
        # Extension (Kokoro-FastAPI's field): false asks for the whole clip in one body with its
        # Content-Length; true or absent streams, as OpenAI does (absent: the server's --no-stream decides).
        stream: bool | None = Field(None, strict=True)
        # Extensions (not OpenAI's): the runtime's generate() arguments. Types and signs here; their
        # upper limits are the runtime's (omnivoice_onnx.core.request, raisable by environment), checked by
        # OmniVoiceOnnx.validate().
        language: str | None = None
        seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX, strict=True)
        num_step: int | None = Field(None, ge=1, strict=True)
        guidance_scale: float | None = Field(None, allow_inf_nan=False, strict=True)
        duration: float | None = Field(None, gt=0.0, allow_inf_nan=False, strict=True)
        strict_instructions: bool | None = Field(None, strict=True)  # refuse prose instructions (else applied/ignored)
        # piper's --sentence-silence (seconds between chunks) and --volume (linear gain)
        sentence_silence: float | None = Field(
            None, ge=limits.MIN_PAUSE_S, le=limits.MAX_PAUSE_S, allow_inf_nan=False, strict=True
        )
        volume: float | None = Field(None, ge=limits.MIN_VOLUME, le=limits.MAX_VOLUME, allow_inf_nan=False, strict=True)

    return SpeechRequest


# pydantic's type errors, as the front door's `invalid_type` (the words Wyoming's checks use too)
PYDANTIC_TYPES = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "model_type": "an object",
    "dict_type": "an object",
}
UNION_TAGS = {"str", "VoiceId"}  # pydantic's loc names the member of `str | VoiceId` that failed


def validation_error(exc: Any) -> ApiError:
    """pydantic's first complaint as the front door's refusal naming the field."""
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    param = ".".join(part for part in loc if part not in UNION_TAGS) or None
    if first["type"] == "extra_forbidden":
        return refuse("unknown_parameter", param, field=param)
    if first["type"] == "missing":
        return refuse("missing_required_parameter", param, detail=f"missing required field {param!r}")
    if first["type"] == "string_too_long" and param == "input":
        return too_long("input")
    if first["type"] in PYDANTIC_TYPES:
        if param is None:
            return refuse("invalid_type", field="the request body", expected="a JSON object")
        expected = 'a string or an object {"id": ...}' if param == "voice" else PYDANTIC_TYPES[first["type"]]
        return refuse("invalid_type", param, field=param, expected=expected)
    return refuse("invalid_value", param, detail=f"{param}: {first['msg']}")


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
    # A request that sets neither stream_format nor stream is streamed (OpenAI's default), unless
    # --no-stream: then it gets the whole clip, as before streaming was the default.
    stream: bool = True
    allow_voice_save: bool = False  # POST /v1/audio/references may save a named voice (--allow-voice-save)
    allowed_hosts: tuple[str, ...] = ()  # Host names answered besides loopback ones (--allowed-host; browser.py)
    cors_origins: tuple[str, ...] = ()  # page origins besides the server's own (--cors-origin; browser.py)
    # What a request that leaves these fields out gets (--num-step, --guidance-scale, --language):
    # a field the request sets wins. Checked once at load by the runtime's request check.
    request_defaults: dict[str, Any] = field(default_factory=dict)


@dataclass
class Service:
    """The loaded state the routes use."""

    config: ServerConfig
    pool: WorkerPool[ServedModel]
    voices: Path
    shelf: voice_store.VoiceShelf  # the saved voices in `voices`, each file parsed once per version
    formats: dict[str, AudioFormat]
    default_format: str
    fingerprint: str
    variant: str
    sample_rate: int
    # What the bundle's export report says of its weights (provenance.random_weights: a test
    # checkpoint that speaks noise); None when it says nothing (no report read).
    random_weights: bool | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    # Uploaded references (POST /v1/audio/references), by voice id; in memory, least recent first.
    references: collections.OrderedDict[str, VoiceClonePrompt] = field(default_factory=collections.OrderedDict)

    @property
    def tts(self) -> ServedModel:
        """The first worker's model: every worker loaded the same bundle and variant, so requests
        are checked and the answers described (languages, variants, token counts) with this one;
        the syntheses run on each worker's own."""
        return self.pool.models[0]

    def scrub(self, message: str) -> str:
        return scrub_paths(message, self.pool.folders)

    def model_ids(self) -> list[str]:
        """Every `model` a request may name: ours, OpenAI's speech models and --model-alias ids all
        name the served variant (an OpenAI client's "tts-1" works unchanged)."""
        return list(
            dict.fromkeys([MODEL_ID, f"{MODEL_ID}-{self.variant}", *OPENAI_MODEL_IDS, *self.config.model_aliases])
        )

    def model_entries(self) -> list[dict[str, Any]]:
        """Every model id, OpenAI's fields and ours: the variant it names, whether it is served, and
        (when the bundle's report says) random_weights, which the page reads to say it speaks noise."""
        present = self.tts.bundle.variants
        data = [
            {
                "id": MODEL_ID,
                "object": "model",
                "created": self.created,
                "owned_by": "omnivoice-onnx",
                "variant": self.variant,
                "served": True,
            }
        ]
        data += [
            {
                "id": f"{MODEL_ID}-{name}",
                "object": "model",
                "created": self.created,
                "owned_by": "omnivoice-onnx",
                "variant": name,
                "served": name == self.variant,
            }
            for name in present
        ]
        data += [
            {
                "id": alias,
                "object": "model",
                "created": self.created,
                "owned_by": "omnivoice-onnx",
                "variant": self.variant,
                "served": True,
            }
            for alias in self.model_ids()[2:]
        ]
        if self.random_weights is not None:
            data = [{**item, "random_weights": self.random_weights} for item in data]
        return data

    def saved_voices(self, listing: voice_store.SavedVoices | None = None) -> list[Any]:
        """The saved voices of `listing` (None: the folder as it is now); 500 when one is damaged."""
        with _voices_read():
            return (listing or self.shelf.listing()).voices()

    def saved_voice(self, name: str) -> voice_store.Voice | None:
        """The saved voice `name` (any case) as the folder is now; None when there is none (or no
        request could name one so: voices.is_askable), 500 when its file is damaged."""
        if not voice_store.is_askable(name):
            return None
        with _voices_read():
            return self.shelf.listing().find(name)

    def voice_kwargs(self, voice: Any, instructions: str | None) -> tuple[dict[str, Any], int | None]:
        """generate() keywords for the request's voice (a name, never a path; plan_job lays the
        request's instructions over them; `instructions` here only decides the design mode), and
        the seed the voice brings (a saved voice's or a preset's; None: the request's or a fresh
        one). A name resolves to a built-in mode, an uploaded reference (ref-...), a saved voice,
        else an OpenAI preset;
        modes, saved voices and presets whatever the name's case ("Alloy" is alloy). The voices
        folder is listed once, and only the voice named is parsed (unless parsed before, unchanged)."""
        name = voice if isinstance(voice, str) else voice.id
        if name.casefold() in BUILTIN_VOICES:
            name = name.casefold()
            if name == "design" and not instructions:
                raise refuse(
                    "missing_required_parameter", "instructions", detail=voice_store.design_needs("`instructions`")
                )
            return {}, None  # a mode designs from the request's instructions alone
        listing = self.shelf.listing()  # this request's one read of the voices folder
        try:
            voice_store.check_name(name)
        except UserError:
            raise refuse(
                "invalid_voice",
                "voice",
                detail=f"voice {name!r} is not a voice name (names are names, not "
                f"paths); voices: {', '.join(self.voice_names(listing))}",
            ) from None
        seed = None
        try:
            saved = None if name in self.references else listing.find(name)
            if saved is not None:
                saved = voice_store.for_model(saved, self.fingerprint)
        except UserError as exc:
            raise refuse("invalid_voice", "voice", detail=self.scrub(str(exc))) from exc
        if name in self.references:
            self.references.move_to_end(name)
            kwargs: dict[str, Any] = {"voice_clone_prompt": self.references[name]}
        elif (found := saved or voice_store.find_preset(name)) is not None:
            kwargs, seed = found.generate_kwargs(), found.seed
        else:
            hint = (
                " (uploaded references are kept in memory only: upload it again)"
                if name.startswith(REFERENCE_PREFIX)
                else ""
            )
            raise refuse(
                "invalid_voice",
                "voice",
                detail=f"unknown voice {name!r}{hint}; voices: {', '.join(self.voice_names(listing))}",
            )
        return kwargs, seed

    def voice_catalogue(self, listing: voice_store.SavedVoices | None = None) -> list[VoiceEntry]:
        """What `voice` may name (uploaded references aside), in the order every list shows it: the
        built-in modes a list offers (voices.LISTED_MODES: not "design", which speaks only with
        instructions), the saved voices, then the presets no saved voice of the same name hides
        (the one place that rule is written; voice_kwargs resolves a name in the same order; no
        saved voice takes a mode's name: voices.check_new_name). The voices folder is read once (or
        `listing` is this request's read of it)."""
        saved = self.saved_voices() if listing is None else self.saved_voices(listing)
        entries = [VoiceEntry(name, "builtin", BUILTIN_VOICES[name]) for name in voice_store.LISTED_MODES]
        entries += [VoiceEntry.saved(voice) for voice in saved]
        hidden = {voice.name.casefold() for voice in saved}
        return entries + [
            VoiceEntry.saved(preset) for name, preset in voice_store.PRESETS.items() if name not in hidden
        ]

    def voice_names(self, listing: voice_store.SavedVoices | None = None) -> list[str]:
        """The names of voice_catalogue(), in its order."""
        return [entry.name for entry in self.voice_catalogue(listing)]

    def languages(self) -> list[dict[str, Any]]:
        """The model's languages: [{"id", "names"}] in runtime-config.json's order."""
        table = language_names(self.tts.runtime_config["languages"])
        return [{"id": lang_id, "names": names} for lang_id, names in table.items()]

    def encode_reference(
        self, tts: ServedModel, source: bytes | IO[bytes], ref_text: str
    ) -> tuple[VoiceClonePrompt, str]:
        """An uploaded recording (a body's bytes, or an open file the form parser spooled) encoded
        as a cloning prompt by the runtime's own reader (length checked from the header, then read,
        resampled, trimmed: request.py's limits) with the model `tts`, and the upload's digest
        (sha256 of its bytes, NUL, ref_text: add_reference's id); ApiError 400 naming the problem.
        A worker's Task (pool.Task): decoding a long recording takes hundreds of MB, so it runs
        where a synthesis would; the bytes are copied to the reader's file in chunks."""
        digest = hashlib.sha256()
        with tempfile.TemporaryDirectory(prefix="omnivoice-ref-") as folder:
            path = Path(folder) / "reference"
            with open(path, "wb") as out:
                if isinstance(source, bytes):
                    digest.update(source)
                    out.write(source)
                else:
                    while block := source.read(CHUNK_BYTES):
                        digest.update(block)
                        out.write(block)
            digest.update(b"\0" + ref_text.encode())
            try:
                return tts.create_voice_clone_prompt(str(path), ref_text), digest.hexdigest()
            except UserError as exc:
                message = scrub_paths(str(exc), {"the uploaded reference": path, **self.pool.folders})
                raise refuse("invalid_reference", detail=message) from exc

    def add_reference(self, prompt: VoiceClonePrompt, digest: str) -> str:
        """Keep an uploaded reference for later requests (REFERENCES_KEPT at most) -> its voice id."""
        name = REFERENCE_PREFIX + digest[:16]
        self.references[name] = prompt
        self.references.move_to_end(name)
        while len(self.references) > REFERENCES_KEPT:
            self.references.popitem(last=False)
        return name


@contextlib.contextmanager
def _voices_read() -> Iterator[None]:
    """A damaged voice file met while reading the folder: logged by name, the table's 500 to the client."""
    try:
        yield
    except UserError as exc:
        LOG.error("voices folder: %s", exc)
        raise refuse("voices_unreadable") from exc


REQUEST_DEFAULT_FIELDS = ("num_step", "guidance_scale", "language")  # ServerConfig.request_defaults' keys


@dataclass
class Speech:
    """What one synthesis asks for: the one shape plan_job() reads, built by the Wyoming server
    directly and from an HTTP body (SpeechRequest, whose fields these are) by Speech.of."""

    input: str
    voice: str
    instructions: str | None = None
    language: str | None = None
    speed: float | None = None
    duration: float | None = None
    num_step: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    strict_instructions: bool | None = None
    sentence_silence: float | None = None  # seconds between the text's chunks (None: none)
    volume: float | None = None  # the output's linear gain (None: unchanged)

    @classmethod
    def of(cls, body: Any) -> Speech:
        """The synthesis a SpeechRequest body asks for (its other fields are the HTTP answer's)."""
        return cls(**{item.name: getattr(body, item.name) for item in dataclasses.fields(cls)})


def plan_job(service: Service, request: Speech, loop: asyncio.AbstractEventLoop, stream: bool) -> Job:
    """The validated work of one synthesis: the voice resolved, the seed chosen (the request's,
    else its voice's: a saved voice's or a preset's, else drawn by validate), the request checked
    by the runtime without model work, once (the worker runs this Request); ApiError (400) for
    anything it would refuse."""
    voice_kwargs, voice_seed = service.voice_kwargs(request.voice, request.instructions)
    fields = dataclasses.asdict(request)
    fields |= {name: value for name, value in service.config.request_defaults.items() if fields.get(name) is None}
    kwargs = {**keywords(fields), **voice_kwargs}  # the one builder (core.request.keywords)
    own_design = voice_kwargs.get("instruct")
    if request.instructions:
        kwargs["instruct"] = request.instructions  # the request's description wins over a saved or preset design
    if kwargs["seed"] is None:
        kwargs["seed"] = voice_seed
    tts = service.tts
    try:  # no model work: a 400 before the queue
        req = tts.validate(request.input, **kwargs, stream=stream)
        if request.instructions and own_design and req.instruct_readings[0].instruct is None:
            # Prose with no word OmniVoice reads ("speak cheerfully") keeps the voice's own design
            # (alloy stays alloy); the reading still reports every word as ignored.
            kept = tts.validate(request.input, **{**kwargs, "instruct": own_design}, stream=stream)
            req = dataclasses.replace(kept, instruct_readings=req.instruct_readings)
    except UserError as exc:
        raise refuse("invalid_value", detail=service.scrub(str(exc))) from exc
    return Job(request=req, stream=stream, loop=loop)


def build_job(service: Service, request: Any, loop: asyncio.AbstractEventLoop) -> tuple[Job, str]:
    """The validated work of one request and its response_format; ApiError (400) for anything
    the runtime would refuse, found before the request takes a place in the queue."""
    check_model(service, request.model)
    fmt = response_format(service, request.response_format)
    stream = streams(service, fmt, request.stream_format, request.stream)
    return plan_job(service, Speech.of(request), loop, stream=stream), fmt


def check_model(service: Service, model: str) -> None:
    """The table's model_not_found (404) unless `model` names the served variant (Service.model_ids)."""
    if model not in service.model_ids():
        raise refuse(
            "model_not_found",
            "model",
            detail=f"model {model!r} does not exist; this server has {', '.join(service.model_ids())}",
        )


def response_format(service: Service, fmt: str | None) -> str:
    """A request's response_format (None: the server's default) if this machine writes it, else
    the table's 400 listing those it does."""
    fmt = fmt or service.default_format
    if fmt not in service.formats:
        raise refuse(
            "unsupported_format",
            "response_format",
            detail=f"response_format {fmt!r} is not available here; choose one of {', '.join(service.formats)}",
        )
    return fmt


def streams(service: Service, fmt: str, stream_format: str | None, stream: bool | None) -> bool:
    """Whether a request is answered as a stream: with a stream_format, or `stream` true; `stream`
    false gets the whole clip; neither set, the server's default (streamed unless --no-stream)
    where `fmt` streams (FLAC is then sent whole). A format that cannot stream asked to stream,
    and `stream` false beside a stream_format, are 400s."""
    if stream is False and stream_format is not None:
        raise refuse(
            "invalid_value",
            "stream",
            detail=f"stream false asks for the whole clip but stream_format is {stream_format!r}; drop one of them",
        )
    asked = stream_format is not None or stream is True
    if asked and not service.formats[fmt].streams:
        streamable = [name for name, spec in service.formats.items() if spec.streams]
        field = "stream_format" if stream_format is not None else "stream"
        raise refuse(
            "unsupported_format",
            "response_format",
            detail=f"response_format {fmt!r} cannot be streamed; "
            f"with {field} use one of {', '.join(streamable)}, or drop {field} to get the whole {fmt} file",
        )
    if stream is None and stream_format is None:
        return service.config.stream and service.formats[fmt].streams
    return asked


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or a UserError naming the address (uvicorn itself logs and exits 1)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(2048)  # uvicorn's backlog; a client that connects before the loop runs waits in it
    except OSError as exc:
        raise UserError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc})",
            "choose another --port (0: any free one) or --host, or stop what uses it",
        ) from None
    return listener


# --- who may call: the key ---------------------------------------------------------------------


def api_key_from(flag: str | None, environ: Mapping[str, str]) -> str | None:
    """The key the server requires: --api-key if given, else $OMNIVOICE_API_KEY, else None. An empty
    one is an error, not "no key": `--api-key "$KEY"` with KEY unset would otherwise start the
    server with authentication off and no word."""
    source, key = ("--api-key", flag) if flag is not None else (f"${API_KEY_ENV}", environ.get(API_KEY_ENV))
    if key is not None and not key.strip():
        raise UserError(
            f"{source} is empty (an unset shell variable?)",
            "pass the key the clients will send, or leave the option out for a loopback-only server",
        )
    return key


def is_loopback(host: str) -> bool:
    """Whether every address `host` resolves to is this machine's loopback (127.0.0.0/8, ::1)."""
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False  # bind() names an unresolvable host in its own line
    return bool(found) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in found)


def check_auth(config: ServerConfig) -> str | None:
    """Refuse to serve a host other machines can reach without a key, unless --no-auth says so
    knowingly: then the loud warning to log beside the listening line, once every other check has
    passed (a refusal after it would be two messages for one refusal); a key and --no-auth
    together contradict each other."""
    if config.no_auth and config.api_key is not None:
        raise UserError(
            "--no-auth and an API key contradict each other",
            f"drop --no-auth, or drop --api-key / unset ${API_KEY_ENV}",
        )
    if config.api_key is None and not is_loopback(config.host):
        if not config.no_auth:
            raise UserError(
                f"refusing to serve {config.host} without an API key: anyone who can reach it could use it",
                f"pass --api-key KEY (or set ${API_KEY_ENV}), bind --host 127.0.0.1, or pass --no-auth "
                "to serve it open on purpose",
            )
        return f"--no-auth: serving {config.host} WITHOUT AUTHENTICATION; anyone who can reach this address can use it"
    return None
