"""What every HTTP route passes through that is not the route itself (omnivoice_onnx.serve.app
puts it together): every error a client sees turned into the front door's JSON (door.ERRORS in
OpenAI's shape; a bug's traceback goes to the log only), the API key (RequireKey) and the count of
every request for /metrics (Measured).

Plain ASGI rather than @app.middleware: starlette's BaseHTTPMiddleware breaks a streamed response
whose client leaves ("No response returned"). A module of its own because none of it knows what a
request asks for: it stands on the front door's table alone, below the service and the routes.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from omnivoice_onnx.serve.door import LOG, ApiError, refuse

if TYPE_CHECKING:  # the serve extra's packages, imported where the app is built
    from fastapi import FastAPI
    from starlette.types import ASGIApp, Receive, Scope, Send

    from omnivoice_onnx.serve.metrics import Metrics

# Routes that answer without the API key: load balancers' probe, the page (it holds no data; its
# own requests send the key typed into it) and the icon a browser asks for by itself.
OPEN_PATHS = ("/health", "/", "/favicon.ico")


def error_response(error: ApiError) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def add_error_handlers(app: FastAPI) -> None:
    """Every error a client sees is the front door's JSON; a bug's traceback goes to the log only."""
    from fastapi import Request
    from starlette.exceptions import HTTPException

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Any:
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Any:
        if exc.status_code == 404:
            return error_response(refuse("not_found", detail=f"{request.method} {request.url.path}"))
        if exc.status_code == 405:
            return error_response(refuse("method_not_allowed", detail=str(exc.detail)))
        return error_response(ApiError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> Any:
        LOG.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(refuse("internal_error"))


def bearer_token(header: bytes) -> bytes:
    """The credentials of an `Authorization: Bearer <token>` header, b"" for any other scheme or
    none. The scheme name is case-insensitive (RFC 7235 2.1): `bearer KEY` and `BEARER KEY` count."""
    scheme, _, token = header.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


class RequireKey:
    """`Authorization: Bearer <key>` on every route but OPEN_PATHS."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            token = bearer_token(dict(scope["headers"]).get(b"authorization", b""))
            if not hmac.compare_digest(token, self.key.encode()):
                await error_response(refuse("invalid_api_key"))(scope, receive, send)
                return
        await self.app(scope, receive, send)


def route_templates(app: FastAPI) -> Callable[[Scope], str | None]:
    """route_of(scope): the template of the route that answered (its endpoint, set by routing),
    None if none did; the table is read from app.routes at the first request, when all are in."""
    from starlette.routing import Route  # FastAPI's routes (APIRoute) and the page's alike

    templates: dict[Any, str] = {}

    def route_of(scope: Scope) -> str | None:
        if not templates:
            templates.update({route.endpoint: route.path for route in app.routes if isinstance(route, Route)})
        return templates.get(scope.get("endpoint"))

    return route_of


class Measured:
    """Outermost: every request counted in /metrics, 401s and 404s included."""

    def __init__(self, app: ASGIApp, metrics: Metrics, route_of: Callable[[Scope], str | None]) -> None:
        self.app = metrics.middleware(app, route_of)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)
