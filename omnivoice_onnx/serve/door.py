"""The front door of every network surface (`serve`'s HTTP, `wyoming`, and any later one): what a
peer on the network may send, how long it may take, how many may be connected, and what it is told
when refused. The protocol adapters (app: HTTP; wyoming: Wyoming events) read their bytes, limits
and refusals from here and nowhere else, so the same bad request gets the same answer on every
surface: one error table (code -> HTTP status, OpenAI's error type, the message), whose code is
also the Wyoming Error event's code.

What a request may be is checked twice on the way in, in this order: its shape here (sizes and the
JSON types of its fields, before anything is parsed further) and its meaning by the runtime's one
check (omnivoice_onnx.core.request, through service.plan_job) before it takes a place in the queue.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard, TypeVar, overload

from omnivoice_onnx.limits import LIMIT_ENV_PREFIX, env_number

LOG = logging.getLogger("omnivoice_onnx.server")

# --- limits: one set for every surface -----------------------------------------------------------
MAX_INPUT_CHARS = 4096  # OpenAI's documented limit for `input`; Wyoming's `text` (whole or streamed) too
MAX_INSTRUCTIONS_CHARS = 4096  # a request's `instructions` (OpenAI's limit for them)
MAX_BODY_BYTES = 64 * 1024  # a request's body (HTTP) or event data + payload (Wyoming): 4096 chars fit as \u escapes
MAX_HEADER_BYTES = 16 * 1024  # HTTP request line + headers (h11's incomplete-event limit); a Wyoming header line
# POST /v1/audio/references: a reference recording as the request body (any format libsndfile
# reads). A 60 s reference (limits.MAX_REF_SECONDS) at 48 kHz stereo 16-bit is 11.5 MB.
MAX_REFERENCE_BYTES = 16 << 20
MAX_CONNECTIONS = 512  # open connections at once per server; one more is refused (HTTP 503, Wyoming Error) and closed
# Time: a client holding the server's resources without finishing a request (slowloris: one header
# byte every 2 s; 600 idle sockets; a Wyoming data_length larger than what follows) is cut off, with
# an error where a reply is still possible. A real client sends its headers at once and its
# <= 64 KiB body in well under a second.
HEADER_TIMEOUT_S = 10.0  # from a request's first byte (HTTP: from the connection) to its complete headers
BODY_TIMEOUT_S = 30.0  # from the headers to the complete body, plus its length at MIN_BODY_RATE
# Each set per server process by OMNIVOICE_<name> (docs/serving.md), as the request limits are:
# longer for clients on a slow link, shorter for a server that must shed idle peers sooner.
TIMEOUTS = ("HEADER_TIMEOUT_S", "BODY_TIMEOUT_S")
MIN_BODY_RATE = 64 * 1024  # bytes/s a client must at least send: 16 MiB of reference audio get 256 s more
KEEP_ALIVE_S = 5.0  # HTTP: an idle keep-alive connection is closed after this (uvicorn's default, stated)
# Wyoming: a connection with no event in flight is closed after this. Longer than HTTP's keep-alive:
# a streamed synthesis (SynthesizeStart, then SynthesizeChunks as a language model writes them) is
# idle between its chunks.
IDLE_TIMEOUT_S = 60.0


def timeout(name: str) -> float:
    """Timeout `name` (one of TIMEOUTS): $OMNIVOICE_<name> when set, else the constant. A server
    reads each at start (cli.server_flags.server_config), so a bad value stops it before it listens."""
    if name not in TIMEOUTS:
        raise KeyError(f"{name} is not one of door.TIMEOUTS")
    return env_number(LIMIT_ENV_PREFIX + name, globals()[name])


def header_timeout() -> float:
    """Seconds from a request's first byte (HTTP: from the connection) to its complete headers."""
    return timeout("HEADER_TIMEOUT_S")


def body_timeout(length: int) -> float:
    """Seconds a body of `length` bytes may take to arrive (any surface)."""
    return timeout("BODY_TIMEOUT_S") + length / MIN_BODY_RATE


# --- the error table -----------------------------------------------------------------------------


class ApiError(Exception):
    """A refusal a client sees: HTTP answers it in OpenAI's shape, Wyoming as an Error event with
    `code`. Made by refuse() from the table; `headers` are HTTP's (Retry-After, Connection)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Refusal:
    """One row of ERRORS: the HTTP status, OpenAI's error type, and the message (a format string
    over refuse()'s keywords)."""

    status: int
    kind: str
    message: str


_BAD = "invalid_request_error"
_SERVER = "server_error"
ERRORS: dict[str, Refusal] = {
    # the request's shape (checked here, before anything else reads it)
    "invalid_json": Refusal(400, _BAD, "the request is not valid JSON"),
    "invalid_event": Refusal(400, _BAD, "not a Wyoming event: {detail}"),
    "invalid_type": Refusal(400, _BAD, "{field} must be {expected}"),
    "invalid_http": Refusal(400, _BAD, "malformed HTTP request ({detail})"),
    "unknown_parameter": Refusal(400, _BAD, "unknown field {field!r}"),
    "missing_required_parameter": Refusal(400, _BAD, "{detail}"),
    "string_above_max_length": Refusal(400, _BAD, "{field} is longer than {limit} characters; {fix}"),
    "body_too_large": Refusal(413, _BAD, "the request is over the limit of {limit} bytes"),
    "empty_body": Refusal(400, _BAD, "the request body is empty; send the reference recording as the body"),
    "invalid_content_type": Refusal(
        400, _BAD, "send the fields as multipart/form-data (curl -F 'input=...' -F 'ref_audio=@ref.wav')"
    ),
    "invalid_multipart": Refusal(400, _BAD, "the multipart body cannot be read ({detail})"),
    # what it asks for (service, and the runtime's one check)
    "invalid_value": Refusal(400, _BAD, "{detail}"),
    "invalid_voice": Refusal(400, _BAD, "{detail}"),
    "invalid_reference": Refusal(400, _BAD, "{detail}"),
    "model_not_found": Refusal(404, _BAD, "{detail}"),
    "voice_not_found": Refusal(404, _BAD, "{detail}"),
    "voice_exists": Refusal(409, _BAD, "{detail}"),
    "invalid_instruct": Refusal(400, _BAD, "{detail}"),
    "unsupported_format": Refusal(400, _BAD, "{detail}"),
    "not_found": Refusal(404, _BAD, "no route {detail}"),
    "method_not_allowed": Refusal(405, _BAD, "{detail}"),
    # who may ask
    "invalid_api_key": Refusal(401, _BAD, "incorrect API key (send Authorization: Bearer <key>)"),
    "host_not_allowed": Refusal(
        403,
        "permission_error",
        "Host {host!r} is not a name this server answers to (a page reaching it through "
        "another name is refused); use http://127.0.0.1:PORT, or start the server with "
        "--allowed-host NAME",
    ),
    "cross_origin": Refusal(
        403,
        "permission_error",
        "a request from another page ({origin}) is refused: only this server's own page may send "
        "requests from a browser; start the server with --cors-origin ORIGIN to allow a page",
    ),
    "voice_save_disabled": Refusal(
        403,
        "permission_error",
        "saving voices over HTTP is off on this server; start it with --allow-voice-save, "
        "or leave out save_as to use the reference for requests without saving it",
    ),
    "voices_read_only": Refusal(
        403,
        "permission_error",
        "changing saved voices over HTTP is off on this server; start it with --allow-voice-save",
    ),
    # the connection's time and count
    "header_timeout": Refusal(408, _BAD, "the request headers did not arrive within {seconds:g} s"),
    "body_timeout": Refusal(408, _BAD, "the request body did not arrive within {seconds:.0f} s"),
    "idle_timeout": Refusal(408, _BAD, "no event arrived within {seconds:g} s; the connection is closed"),
    "too_many_connections": Refusal(503, _SERVER, "the server holds {limit} connections; retry shortly"),
    # the server's state
    "queue_full": Refusal(
        429, "rate_limit_error", "the server is busy ({running} running, {queued} queued); retry after {retry} s"
    ),
    "shutting_down": Refusal(503, _SERVER, "the server is shutting down"),
    "timeout": Refusal(504, _SERVER, "the request took longer than the server's timeout"),
    "cancelled": Refusal(499, _BAD, "request cancelled"),  # nginx's "client closed request": only logs see it
    "voices_unreadable": Refusal(
        500, _SERVER, "the voices folder holds a damaged voice file (the server log names it)"
    ),
    "internal_error": Refusal(500, _SERVER, "the server failed (its log has the details)"),
}


def refuse(code: str, param: str | None = None, headers: dict[str, str] | None = None, **values: Any) -> ApiError:
    """The ApiError of ERRORS[code], its message filled from `values`."""
    row = ERRORS[code]
    return ApiError(row.status, row.message.format(**values), param, code, row.kind, headers)


# --- the request's shape -------------------------------------------------------------------------

TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    dict: "an object",
    list: "a list",
    bool: "true or false",
}


JsonT = TypeVar("JsonT")


def is_kind(value: Any, kind: type[JsonT]) -> TypeGuard[JsonT]:
    """Whether a parsed JSON value is of `kind` (an integer is a number; true is never one)."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


@overload
def typed(data: Mapping[str, Any], name: str, kind: type[JsonT], required: Literal[True]) -> JsonT: ...
@overload
def typed(data: Mapping[str, Any], name: str, kind: type[JsonT], required: bool = False) -> JsonT | None: ...
def typed(data: Mapping[str, Any], name: str, kind: type[JsonT], required: bool = False) -> JsonT | None:
    """data[name] if it is JSON's `kind` (an integer counts as a number; true never does), None
    when absent (or null) and not `required`; else the table's `invalid_type` (or
    `missing_required_parameter`) naming the field."""
    value = data.get(name)
    if value is None:
        if required:
            raise refuse("missing_required_parameter", name, detail=f"missing required field {name!r}")
        return None
    if not is_kind(value, kind):
        raise refuse("invalid_type", name, field=name, expected=TYPE_NAMES[kind])
    return value


@overload
def text_field(data: Mapping[str, Any], name: str, required: Literal[True] = True) -> str: ...
@overload
def text_field(data: Mapping[str, Any], name: str, required: bool) -> str | None: ...
def text_field(data: Mapping[str, Any], name: str, required: bool = True) -> str | None:
    """A text field: a string of at most MAX_INPUT_CHARS (the runtime then checks what it says)."""
    value = typed(data, name, str, required)
    if value is not None and len(value) > MAX_INPUT_CHARS:
        raise too_long(name)
    return value


def too_long(field: str, fix: str = "split the text into several requests") -> ApiError:
    return refuse("string_above_max_length", field, field=field, limit=MAX_INPUT_CHARS, fix=fix)


def json_object(data: bytes, what: str) -> dict[str, Any]:
    """`data` parsed as one JSON object; the table's `invalid_json` / `invalid_type` otherwise
    (deep nesting and huge integers included: they are refusals, not tracebacks)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        raise refuse("invalid_json") from None
    if not isinstance(value, dict):
        raise refuse("invalid_type", field=f"the {what}", expected="a JSON object")
    return value
