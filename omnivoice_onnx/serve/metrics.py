"""The speech server's Prometheus metrics (GET /metrics, text exposition format), with the
`serve` extra's prometheus-client.

    omnivoice_http_requests_total{route,method,status}        requests answered
    omnivoice_http_request_duration_seconds{route}            request to last byte (histogram)
    omnivoice_http_time_to_first_byte_seconds{route}          request to first body byte (histogram)
    omnivoice_queue_depth                                     requests waiting for a worker
    omnivoice_requests_running                                requests a worker is on
    omnivoice_audio_seconds_total                             seconds of audio synthesised
    omnivoice_synthesis_rtf                                   worker seconds / audio seconds per request

Routes are labelled by their template (/v1/audio/voices/{name}), unknown paths as "other", and
methods by name when HTTP defines them (METHODS), any other as "other", so a scanner's requests
cannot grow the label set: at most routes x (METHODS + 1) x the statuses the server answers. Each
app has its own registry (no process-wide state: tests run several servers in one process).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Seconds: a short clip on a GPU takes tens of ms; a long one on a small CPU minutes (the timeout's 300 s).
LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Real-time factor: below 1 keeps up with playback, the line an operator watches.
RTF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0, 8.0, 16.0)
OTHER_ROUTE = "other"
# The methods of RFC 9110 and PATCH (RFC 5789), labelled as sent; a made-up one (HTTP allows any
# token) is OTHER_METHOD, or each would add a label set for as long as the server runs.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"})
OTHER_METHOD = "other"
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """The server's metrics and the ASGI middleware that counts its requests."""

    def __init__(self, queue_depth: Callable[[], float], running: Callable[[], float], sample_rate: int) -> None:
        self.registry = CollectorRegistry()
        self.sample_rate = sample_rate
        self.requests = Counter(
            "omnivoice_http_requests",
            "HTTP requests answered, by route and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "omnivoice_http_request_duration_seconds",
            "time from request to its last byte",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.first_byte = Histogram(
            "omnivoice_http_time_to_first_byte_seconds",
            "time from request to the first byte of its body",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        Gauge("omnivoice_queue_depth", "requests waiting for a worker", registry=self.registry).set_function(
            queue_depth
        )
        Gauge("omnivoice_requests_running", "requests a worker is synthesising", registry=self.registry).set_function(
            running
        )
        self.audio = Counter("omnivoice_audio_seconds", "seconds of audio synthesised", registry=self.registry)
        self.rtf = Histogram(
            "omnivoice_synthesis_rtf",
            "worker seconds / audio seconds of each completed request",
            buckets=RTF_BUCKETS,
            registry=self.registry,
        )

    def synthesis(self, seconds: float, samples: int) -> None:
        """One completed synthesis (called from a worker thread: prometheus-client is thread-safe)."""
        audio = samples / self.sample_rate
        self.audio.inc(audio)
        if audio > 0:
            self.rtf.observe(seconds / audio)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def middleware(self, app: ASGIApp, route_of: Callable[[Scope], str | None]) -> ASGIApp:
        """ASGI middleware: every HTTP request counted by route (route_of(scope) after routing,
        else OTHER_ROUTE), method and status, with its latency and time to first body byte."""

        async def measured(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            started = time.monotonic()
            status, first = 500, None

            async def tracked(message: Message) -> None:
                nonlocal status, first
                if message["type"] == "http.response.start":
                    status = message["status"]
                elif message["type"] == "http.response.body" and first is None and message.get("body"):
                    first = time.monotonic()
                await send(message)

            try:
                await app(scope, receive, tracked)
            finally:
                route = route_of(scope) or OTHER_ROUTE
                now = time.monotonic()
                method = scope["method"] if scope["method"] in METHODS else OTHER_METHOD
                self.requests.labels(route, method, str(status)).inc()
                self.latency.labels(route).observe(now - started)
                self.first_byte.labels(route).observe((first or now) - started)

        return measured
