"""What a web browser may do with the HTTP server: the browser-facing half of the front door.

A server on this machine is reachable by every page the user opens, and a browser sends some
requests across origins without asking (a form POST, a `text/plain` fetch) and lets a page reach
127.0.0.1 under its own name (DNS rebinding). So, before any route runs:
- Host: a server without a key bound to loopback answers only requests whose Host is a loopback
  name (localhost, *.localhost, 127.x.x.x, [::1]) or one named with --allowed-host (which also
  turns the check on for any other server). A rebinding page's requests carry its own name: 403.
- Origin: a request a page sends from another origin (its Origin header, or Sec-Fetch-Site:
  cross-site without one) is refused, 403, before its body is read, unless that origin is named
  with --cors-origin; then a CORS preflight (OPTIONS) is answered and responses carry
  Access-Control-Allow-Origin. The server's own page is same-origin and needs nothing.
- Every response says nosniff, no referrer and no framing; the page also gets a Content-Security-
  Policy that allows its own inline script and style (by hash) and requests to its own origin only.
Clients that are not browsers (the openai package, curl, Home Assistant) send no Origin and are
not affected.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omnivoice_onnx.serve.door import LOG, ApiError, refuse

# Every response: no MIME sniffing, no Referer to elsewhere, never in a frame (old browsers' header;
# the page's CSP says frame-ancestors too).
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]
CORS_METHODS = b"GET, POST"
CORS_HEADERS = b"authorization, content-type"
CORS_MAX_AGE = b"600"
ORIGIN_FORM = re.compile(r"https?://[A-Za-z0-9.\-]+(:[0-9]{1,5})?|https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")
HOST_FORM = re.compile(r"[A-Za-z0-9.\-]+|\[?[0-9A-Fa-f:.]+\]?")


def host_name(header: str) -> str:
    """The name of a Host header, its port dropped, lower case ("[::1]:8000" -> "::1")."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def is_loopback_name(name: str) -> bool:
    """Whether a Host name can only mean this machine: localhost and *.localhost (RFC 6761:
    browsers resolve them to loopback themselves) or a loopback address literal."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_origin_flag(value: str) -> str:
    """A --cors-origin value: scheme://host[:port] exactly as a browser sends Origin; ValueError otherwise."""
    if not ORIGIN_FORM.fullmatch(value):
        raise ValueError(f"{value!r} is not an origin (scheme://host[:port], e.g. http://127.0.0.1:3000)")
    return value.lower()


def check_host_flag(value: str) -> str:
    """An --allowed-host value: a host name or address, no port; ValueError otherwise."""
    if not HOST_FORM.fullmatch(value) or not value.strip("[]"):
        raise ValueError(f"{value!r} is not a host name (e.g. tts.example.lan, no scheme or port)")
    return value.lower().strip("[]")


@dataclass(frozen=True)
class BrowserPolicy:
    """Which Host names and page origins the server answers."""

    check_host: bool  # answer only loopback names and allowed_hosts
    allowed_hosts: frozenset[str] = frozenset()
    cors_origins: frozenset[str] = frozenset()

    def host_allowed(self, header: str | None) -> bool:
        if not self.check_host or header is None:  # HTTP/1.0 sends none; a browser always does
            return True
        name = host_name(header)
        return is_loopback_name(name) or name in self.allowed_hosts

    def origin_refused(self, origin: str | None, host: str | None, fetch_site: str | None) -> str | None:
        """The foreign origin a request comes from, None when it may be answered: no Origin (not a
        browser, or a same-origin GET), its own origin, or an allowed one."""
        if origin is None:
            return "Sec-Fetch-Site: cross-site, no Origin" if fetch_site == "cross-site" else None
        origin = origin.lower()
        if host is not None and origin in (f"http://{host.lower()}", f"https://{host.lower()}"):
            return None
        return None if origin in self.cors_origins else origin


def page_csp(html: bytes) -> str:
    """The page's Content-Security-Policy: its inline <script> and <style> by hash, requests and
    media to its own origin (the played clip is a blob: URL), nothing framed, no form posts."""
    text = html.decode("utf-8")

    def hashes(tag: str) -> str:
        bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.S)
        return " ".join(
            f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()}'" for body in bodies
        )

    return (
        f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; connect-src 'self'; "
        "media-src 'self' blob:; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )


async def send_error(send: Callable, error: ApiError, extra: list[tuple[bytes, bytes]]) -> None:
    """`error` as a complete JSON response through ASGI `send` (no framework needed)."""
    import json

    body = json.dumps(error.body()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *extra,
        *((name.lower().encode(), value.encode()) for name, value in error.headers.items()),
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BrowserGuard:
    """ASGI middleware: the Host and Origin checks, the CORS preflight, the security headers
    (see the module's docstring). It stands outside the key check: a preflight carries no key."""

    def __init__(self, app: Any, policy: BrowserPolicy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        host, origin = headers.get("host"), headers.get("origin")
        refusal = None
        if not self.policy.host_allowed(host):
            refusal = refuse("host_not_allowed", host=host)
        elif (foreign := self.policy.origin_refused(origin, host, headers.get("sec-fetch-site"))) is not None:
            refusal = refuse("cross_origin", origin=foreign)
        if refusal is not None:  # before the body is read or any route runs
            LOG.info(
                "refused %s %s (%s): Host %r, Origin %r", scope["method"], scope["path"], refusal.code, host, origin
            )
            await send_error(send, refusal, SECURITY_HEADERS)
            return
        cors = (
            []
            if origin is None or origin.lower() not in self.policy.cors_origins
            else [
                (b"access-control-allow-origin", origin.encode("latin-1")),
                (b"vary", b"Origin"),
                (b"access-control-expose-headers", b"x-seed"),
            ]
        )
        if cors and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await send(
                {
                    "type": "http.response.start",
                    "status": 204,
                    "headers": [
                        *SECURITY_HEADERS,
                        *cors,
                        (b"access-control-allow-methods", CORS_METHODS),
                        (b"access-control-allow-headers", CORS_HEADERS),
                        (b"access-control-max-age", CORS_MAX_AGE),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return

        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS, *cors]}
            await send(message)

        await self.app(scope, receive, with_headers)
