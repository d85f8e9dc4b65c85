"""The page at / (omnivoice_onnx/serve/web/index.html: plain HTML + JS, nothing fetched from
elsewhere; package data, in the wheel via pyproject), served with its Content-Security-Policy
(browser.page_csp), and the empty /favicon.ico a browser asks for by itself. Neither needs the API
key (middleware.OPEN_PATHS): the page holds no data, and its own requests send the key typed
into it.

A module of its own because the page is static: read once when the app is built, it knows
nothing of the service or of a request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omnivoice_onnx.serve.browser import page_csp

if TYPE_CHECKING:  # the serve extra's package, imported where the app is built
    from fastapi import FastAPI


def web_page() -> bytes:
    """The page at / (package data: omnivoice_onnx/serve/web/index.html, in the wheel via pyproject)."""
    from importlib.resources import files

    # one name a step: a Traversable's joinpath takes a single name before Python 3.11
    return (files("omnivoice_onnx") / "serve" / "web" / "index.html").read_bytes()


def add_page_routes(app: FastAPI) -> None:
    """GET / and GET /favicon.ico."""
    from fastapi.responses import Response

    html = web_page()
    csp = page_csp(html)

    @app.get("/")
    async def page() -> Response:
        """The page to try voices, with its Content-Security-Policy."""
        return Response(html, media_type="text/html; charset=utf-8", headers={"Content-Security-Policy": csp})

    @app.get("/favicon.ico")
    async def favicon() -> Response:
        """No icon: an empty answer, so a browser's automatic request is neither a 404 nor a 401."""
        return Response(status_code=204)


def random_weights(report: dict[str, Any] | None) -> bool | None:
    """The export report's provenance.random_weights (the model card's "Random weights"): True for
    a bundle built from a random-weight test checkpoint; None when the report does not say."""
    provenance = (report or {}).get("provenance")
    flag = provenance.get("random_weights") if isinstance(provenance, dict) else None
    return flag if isinstance(flag, bool) else None
