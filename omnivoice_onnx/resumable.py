"""An HTTP(S) GET into a `.part` file that survives interruption and lies: what `download` fetches
a release archive with (omnivoice_onnx.fetch).

    with open(open_regular(part, os.O_RDWR | os.O_CREAT, "the partial download"), "r+b") as handle:
        fetch_resumable(url, handle, part)

What the file holds is continued with a Range request (a server that answers the whole file, or
cannot serve the range, restarts it). At most max_download_bytes() are written whatever the server
announces (a Content-Length of a terabyte is refused before a byte is written) or sends (a body
without end is cut there). Redirects are followed to http(s) only. The `.part` is kept only when
the fetch itself was interrupted (a dropped connection, Ctrl-C, SIGTERM), and the message says so
and why; any other end removes it.
"""

from __future__ import annotations

import http.client
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any, BinaryIO, NoReturn

from omnivoice_onnx.errors import UserError
from omnivoice_onnx.limits import LIMIT_ENV_PREFIX, env_number

HTTP_TIMEOUT_S = 60.0  # per socket operation, not per download
CHUNK = 1 << 20
# The most an archive download writes, whatever the server announces or sends (an endless body, a
# Content-Length of a terabyte): over twice the largest archive (the real model's fp32 variants,
# ~3 GiB of files: docs/performance.md). OMNIVOICE_MAX_DOWNLOAD_BYTES sets it per process.
MAX_DOWNLOAD_BYTES = 8 << 30
DOWNLOAD_LIMIT_ENV = LIMIT_ENV_PREFIX + "MAX_DOWNLOAD_BYTES"
HTTP_SCHEMES = ("http", "https")  # what a download fetches, first URL and every redirect alike


def max_download_bytes() -> int:
    """The most one archive download writes: $OMNIVOICE_MAX_DOWNLOAD_BYTES, else MAX_DOWNLOAD_BYTES."""
    return int(env_number(DOWNLOAD_LIMIT_ENV, MAX_DOWNLOAD_BYTES))


class _HttpRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, refused when they lead anywhere but http(s) (urllib follows ftp:// and
    refuses file:// naming only the URL asked for), naming where the server sent it."""

    def http_error_302(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: Any
    ) -> IO[bytes] | None:
        location = headers.get("location") or headers.get("uri")
        target = urllib.parse.urljoin(req.full_url, location or "")
        if urllib.parse.urlsplit(target).scheme.lower() not in HTTP_SCHEMES:
            raise UserError(
                f"{req.full_url} redirects to {target!r:.200}, which is not an http(s) URL: refused",
                "ask the publisher for the archive's http(s) URL",
            )
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _too_large(url: str, size: int, how: str) -> NoReturn:
    raise UserError(
        f"{url} {how} {size:,} bytes, more than any release archive (the limit, {DOWNLOAD_LIMIT_ENV}, "
        f"is {max_download_bytes():,}): stopped, nothing was kept",
        f"check the URL; if the archive really is that large, raise {DOWNLOAD_LIMIT_ENV}",
    )


def fetch_resumable(url: str, handle: BinaryIO, part: Path) -> None:
    """Fetch `url` into `handle` (the open `.part` file at `part`), continuing what it holds with a
    Range request; a server that answers with the whole file (200) restarts it, one that cannot
    serve the range (416) too. At most max_download_bytes(): a larger announced size is refused
    before a byte is written, a body that runs past it is cut there. An interrupted fetch (the
    connection, Ctrl-C, SIGTERM) keeps the `.part` for the next run and says so; any other refusal
    (a bound, a full disk, a range that does not continue it) removes it."""
    limit = max_download_bytes()
    try:
        _fetch_into(url, handle, part, limit)
    except (_Kept, KeyboardInterrupt):
        raise
    except BaseException:
        part.unlink(missing_ok=True)
        raise


class _Kept(UserError):
    """The fetch was interrupted and its `.part` kept on purpose (the message says so): resumable."""


def _fetch_into(url: str, handle: BinaryIO, part: Path, limit: int) -> None:
    handle.seek(0, os.SEEK_END)
    have = handle.tell()
    if have > limit:
        handle.truncate(0)
        have = 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.build_opener(_HttpRedirects).open(request, timeout=HTTP_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:
            handle.truncate(0)
            return _fetch_into(url, handle, part, limit)
        raise UserError(f"{exc.url or url} answered HTTP {exc.code} {exc.reason}", "check the URL") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(f"cannot reach {url} ({reason})", "check the URL and the network, then run again") from None
    with response:
        resumed = response.status == 206 and _range_start(response.headers.get("Content-Range")) == have
        if response.status == 206 and not resumed:
            raise UserError(f"{url} answered a range that does not continue the partial download", "run again")
        if not resumed:
            handle.seek(0)
            handle.truncate(0)
        start = have if resumed else 0
        length = response.headers.get("Content-Length")
        expected = start + int(length) if length and length.isdigit() else None
        if expected is not None and expected > limit:
            _too_large(url, expected, "announces")
        _copy_body(url, response, handle, part, limit)
        if expected is not None and handle.tell() < expected:
            raise _Kept(
                f"the download of {url} was interrupted after {handle.tell()} of {expected} bytes; "
                f"{part} was kept for the next run",
                "run the same command again: it resumes",
            )


def _copy_body(url: str, response: Any, handle: BinaryIO, part: Path, limit: int) -> None:
    """The response's body appended to `handle`, at most `limit` bytes in all: reads and writes
    apart, so a dropped connection (kept, resumable) is never mistaken for a full disk (removed)."""
    while True:
        try:
            block = response.read1(min(CHUNK, limit + 1 - handle.tell()))  # what has arrived: kept if cut
        except (http.client.IncompleteRead, OSError) as exc:
            raise _Kept(
                f"the download of {url} was interrupted after {handle.tell()} bytes ({exc}); {part} was kept "
                "for the next run",
                "run the same command again: it resumes",
            ) from None
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (program's Terminated): the run's last line says why
            raise type(exc)(
                f"the partial download {part} ({handle.tell()} bytes) was kept: the same command resumes it"
            ) from None
        if not block:
            return
        if handle.tell() + len(block) > limit:
            _too_large(url, handle.tell() + len(block), "sent more than")
        try:
            handle.write(block)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(part)) from None


def _range_start(content_range: str | None) -> int | None:
    match = re.fullmatch(r"bytes (\d+)-\d+/(\d+|\*)", (content_range or "").strip())
    return int(match.group(1)) if match else None
