"""HTTP connections at the front door: uvicorn's h11 protocol held to door's limits (header time,
connection count, malformed requests answered in JSON) and the body reader every route that takes
a body uses (size and time limits), and uvicorn's Server with the signal handling that lets SIGTERM
drain. The app (routes) stands on this; nothing here knows a route.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import tempfile
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from http import HTTPStatus
from typing import IO, Any

from omnivoice_onnx.serve import door
from omnivoice_onnx.serve.door import ApiError, refuse

SPOOL_BYTES = 1 << 20  # an upload's bytes kept in memory before its file goes to disk (starlette's too)


async def body_pieces(request: Any, limit: int, timeout_s: float | None = None) -> AsyncGenerator[bytes, None]:
    """The request body's pieces as they arrive, refused (413) as soon as it passes `limit` bytes
    (declared or sent), and (408) when it has not all come within `timeout_s` (default:
    door.body_timeout of `limit`; a client trickling it would hold a connection and a task for as
    long as it likes); a client gone before its body ended is the table's `cancelled` (its log line,
    never a traceback). The one reader of a body: read_body, spooled_body and the form parser."""
    from starlette.requests import ClientDisconnect  # the serve extra's, as the app that calls this

    timeout_s = door.body_timeout(limit) if timeout_s is None else timeout_s
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdecimal() and int(declared) > limit:
        raise refuse("body_too_large", limit=limit)
    received = 0
    pieces = request.stream().__aiter__()
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            piece = await asyncio.wait_for(pieces.__anext__(), max(0.0, deadline - asyncio.get_running_loop().time()))
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise refuse("body_timeout", seconds=timeout_s, headers={"Connection": "close"}) from None
        except ClientDisconnect:
            raise refuse("cancelled", headers={"Connection": "close"}) from None
        received += len(piece)
        if received > limit:
            raise refuse("body_too_large", limit=limit)
        yield piece


async def read_body(request: Any, limit: int, timeout_s: float | None = None) -> bytes:
    """The whole request body, within body_pieces' limits: for the small ones (JSON, 64 KiB)."""
    return b"".join([piece async for piece in body_pieces(request, limit, timeout_s)])


async def spooled_body(request: Any, limit: int) -> IO[bytes]:
    """The request body, within body_pieces' limits, in a file at its start (memory up to
    SPOOL_BYTES, then disk): an upload of 16 MiB waiting for a worker holds no copy in memory."""
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
    try:
        async for piece in body_pieces(request, limit):
            spool.write(piece)
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    file: IO[bytes] = spool
    return file


def raw_error(error: ApiError) -> bytes:
    """`error` as a complete HTTP/1.1 response that closes the connection, for the places where
    there is no request to answer through the app (malformed HTTP, headers too slow, too many
    connections): the same JSON body as every other error, never uvicorn's plain text."""
    body = json.dumps(error.body()).encode()
    head = [
        f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{name}: {value}" for name, value in error.headers.items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def http_protocol() -> type:
    """uvicorn's h11 protocol with the front door's connection limits (built on first use: uvicorn
    is the `serve` extra's). uvicorn bounds neither the time to send headers nor the number of idle
    connections, and answers malformed HTTP in plain text."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11(H11Protocol):
        # uvicorn's own signature takes asyncio.Transport where asyncio's BaseProtocol says BaseTransport
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.header_timer: asyncio.TimerHandle | None = None
            self.over_limit = len(self.connections) > door.MAX_CONNECTIONS  # answered when its request comes
            self.arm_header_timer()

        def data_received(self, data: bytes) -> None:
            if self.over_limit:  # refused after reading what was sent: closing first would reset the answer
                self.reject(refuse("too_many_connections", limit=door.MAX_CONNECTIONS, headers={"Retry-After": "1"}))
                return
            super().data_received(data)

        def arm_header_timer(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
            self.header_timer = self.loop.call_later(door.header_timeout(), self.headers_too_slow)

        def headers_too_slow(self) -> None:
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being answered (its body has a timeout of its own)
            if self.conn.their_state is h11.IDLE:
                self.reject(refuse("header_timeout", seconds=door.header_timeout()))

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self.arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            self.reject(refuse("invalid_http", detail=msg.rstrip(".")))

        def reject(self, error: ApiError) -> None:
            if not self.transport.is_closing():
                self.transport.write(raw_error(error))
                self.transport.close()

    return BoundedH11


async def wait_disconnect(request: Any) -> None:
    """Returns when the client goes away (after the body was read, receive() waits for that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def make_server(config: Any, on_stop: Callable[[], None], on_ready: Callable[[], None]) -> Any:
    """uvicorn's Server with the signal handling this server documents: uvicorn re-raises a caught
    SIGTERM after its shutdown, so the process would die by the signal even after a clean drain.
    Here the first SIGTERM/SIGINT calls `on_stop` (the server marks its pool draining: new requests
    get 503) and starts uvicorn's graceful shutdown; `stopped_by` records the signal. `on_ready`
    (the start line a launcher waits for) runs once these handlers are in place, so a SIGTERM sent
    as soon as the line appears drains like any other, never the default death."""
    import uvicorn

    class Server(uvicorn.Server):
        stopped_by: int | None = None

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                on_ready()
                yield
                return
            previous = {sig: signal.signal(sig, self.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                on_ready()
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        def stop(self, sig: int, frame: Any) -> None:
            self.stopped_by = sig
            on_stop()
            self.handle_exit(sig, frame)

    return Server(config)
