"""Reading Wyoming events off the network for the Wyoming server (omnivoice_onnx.serve.wyoming):
the framing (a JSON header line, then data_length bytes of JSON data, then payload_length bytes
of payload) and every limit on it, so that nothing a peer sends ends in a traceback or holds the
server. The header line is at most door.MAX_HEADER_BYTES and must be a JSON object with a
"type"; data_length and payload_length are byte counts whose sum is at most door.MAX_BODY_BYTES
(declared, so a 256 MB payload is refused before it is read); an event must arrive whole within
door.header_timeout() (its header) and door.body_timeout (the rest) of its first byte; none
beginning within door.IDLE_TIMEOUT_S is Idle. What is not an event is Unframed: its peer gets one
Error event and the connection is closed.

The `wyoming` package's own reader is not used: it reads whatever length a header declares, with
no time limit, and ends a malformed event without a word. A module of its own because this is
the server's edge against a hostile peer, read and tested apart from what the events then ask
for (the handler, the server).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from omnivoice_onnx.serve import door
from omnivoice_onnx.serve.door import ApiError, refuse


@dataclass
class Incoming:
    """One event as read off the network: its type, its data (the header's merged with the data
    bytes', as the protocol says) and its payload."""

    type: str
    data: dict[str, Any]
    payload: bytes


class Unframed(Exception):
    """The peer is not speaking the protocol (or not in time): it gets `error`, then the
    connection is closed (what follows cannot be told apart from the rest of a bad event)."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


class Idle(Exception):
    """No event began within door.IDLE_TIMEOUT_S: the connection is closed, as HTTP closes an
    idle keep-alive connection."""


def byte_count(header: dict[str, Any], name: str) -> int:
    value = header.get(name)
    if value is None:
        return 0
    if not door.is_kind(value, int) or value < 0:
        raise Unframed(refuse("invalid_event", detail=f"its {name} {value!r} is not a byte count"))
    return value


async def read_event(reader: asyncio.StreamReader) -> Incoming | None:
    """The next event, None when the peer closed the connection (between events or inside one);
    Unframed for what is not an event, Idle when none begins in time. Sizes are checked on the
    header, before anything they announce is read."""
    try:
        first = await asyncio.wait_for(reader.read(1), door.IDLE_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise Idle() from None
    if not first:
        return None
    try:
        line = first + await asyncio.wait_for(reader.readline(), door.header_timeout())
    except asyncio.TimeoutError:
        raise Unframed(refuse("header_timeout", seconds=door.header_timeout())) from None
    except ValueError:  # the StreamReader's limit: no newline within MAX_HEADER_BYTES
        raise Unframed(
            refuse("invalid_event", detail=f"its header line is longer than {door.MAX_HEADER_BYTES} bytes")
        ) from None
    if not line.endswith(b"\n"):
        return None  # the peer closed inside a header
    try:
        header = door.json_object(line, "event header")
    except ApiError as exc:
        raise Unframed(exc) from None
    kind = header.get("type")
    if not isinstance(kind, str) or not kind:
        raise Unframed(refuse("invalid_event", detail='its header has no "type" string'))
    data_length, payload_length = byte_count(header, "data_length"), byte_count(header, "payload_length")
    if data_length + payload_length > door.MAX_BODY_BYTES:
        raise Unframed(refuse("body_too_large", limit=door.MAX_BODY_BYTES))
    data = header.get("data") or {}
    if not isinstance(data, dict):
        raise Unframed(refuse("invalid_type", field="the header's data", expected="an object"))
    seconds = door.body_timeout(data_length + payload_length)
    try:
        rest = await asyncio.wait_for(reader.readexactly(data_length + payload_length), seconds)
    except asyncio.TimeoutError:
        raise Unframed(refuse("body_timeout", seconds=seconds)) from None
    except asyncio.IncompleteReadError:
        return None  # the peer closed inside the event
    if data_length:
        try:
            data = {**data, **door.json_object(rest[:data_length], "event data")}
        except ApiError as exc:
            raise Unframed(exc) from None
    return Incoming(kind, data, rest[data_length:])
