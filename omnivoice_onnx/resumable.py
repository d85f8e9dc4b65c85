"""An HTTP(S) GET into a `.part` file that survives interruption and lies: what `download` fetches
a release archive with (omnivoice_onnx.fetch).

    with open(open_regular(part, os.O_RDWR | os.O_CREAT, "the partial download"), "r+b") as handle:
        fetch_resumable(url, handle, part)

What the file holds is continued with a Range request (a server that answers the whole file, or
cannot serve the range, restarts it). At most max_download_bytes() are written whatever the server
announces (a Content-Length of a terabyte is refused before a byte is written) or sends (a body
without end is cut there). Redirects are followed to http(s) only. The `.part` is kept only when
the fetch itself was interrupted (a dropped connection, Ctrl-C, SIGTERM) after bytes arrived, and
the message says so and why; any other end removes it. A `.part` already whole (a run interrupted
while it was checked) is found so by the server's 416 naming that size, and fetched no further.

On a terminal a progress line on stderr is redrawn as the bytes arrive (as pip and huggingface_hub
do); when stderr is a pipe or a file it stays quiet.
"""

from __future__ import annotations

import http.client
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, BinaryIO, NoReturn, TextIO

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
PROGRESS_EVERY_S = 0.1  # the progress line is redrawn at most this often
RESUME_FIX = "run the same command again: it resumes"


def kept_line(part: Path, size: int) -> str:
    """What an interrupted run says of the `.part` it kept (Ctrl-C, SIGTERM: the run's last line)."""
    return f"the partial download {part} ({size:,} bytes) was kept: the same command resumes it"


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
    serve the range (416) too, unless its 416 names the size the `.part` has (whole already). At
    most max_download_bytes(): a larger announced size is refused before a byte is written, a body
    that runs past it is cut there. An interrupted fetch (the connection, Ctrl-C, SIGTERM) keeps
    the `.part` for the next run and says so, or removes it and says nothing was kept when it holds
    nothing; any other refusal (a bound, a full disk, a range that does not continue it) removes it.
    A progress line on a terminal's stderr (Progress)."""
    limit = max_download_bytes()
    progress = Progress(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1] or url)
    try:
        _fetch_into(url, handle, part, limit, progress)
    except _Kept:
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (program's Terminated): the run's last line says what stays
        size = handle.tell()
        if not size:
            part.unlink(missing_ok=True)
            raise
        raise type(exc)(kept_line(part, size)) from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    finally:
        progress.close()


class Progress:
    """One line on stderr, redrawn in place as bytes arrive (`omnivoice.tar: 12.0 of 96.0 MiB (12%),
    30.1 MiB/s`), only when stderr is a terminal: a pipe or a log file gets none of it (the
    command's summary line is the record). Ended by close(), so the next line starts clean."""

    def __init__(self, name: str, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.name, self.on, self.drawn = name, _is_terminal(self.stream), False
        self.started = self.last = time.monotonic()
        self.first = 0  # the size when this response's bytes began (a resumed .part's): the rate is of the rest

    def begin(self, done: int) -> None:
        self.first, self.started = done, time.monotonic()

    def update(self, done: int, total: int | None, force: bool = False) -> None:
        if not self.on:
            return
        now = time.monotonic()
        if not force and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        rate = (done - self.first) / max(now - self.started, 1e-3) / 2**20
        size = (
            f"{done / 2**20:,.1f} of {total / 2**20:,.1f} MiB ({100 * done // max(total, 1)}%)"
            if total
            else f"{done / 2**20:,.1f} MiB"
        )
        self.stream.write(f"\r{self.name}: {size}, {rate:,.1f} MiB/s\x1b[K")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


class _Kept(UserError):
    """The fetch was interrupted and its `.part` kept on purpose (the message says so): resumable."""


def _fetch_into(url: str, handle: BinaryIO, part: Path, limit: int, progress: Progress) -> None:
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
            if _whole_size(exc.headers.get("Content-Range")) == have:  # whole already (its check was interrupted)
                return None
            handle.truncate(0)
            return _fetch_into(url, handle, part, limit, progress)
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
        progress.begin(start)
        _copy_body(url, response, handle, part, limit, lambda: progress.update(handle.tell(), expected))
        progress.update(handle.tell(), expected, force=True)
        if expected is not None and handle.tell() < expected:
            raise _Kept(
                f"the download of {url} was interrupted after {handle.tell()} of {expected} bytes; "
                f"{part} was kept for the next run",
                RESUME_FIX,
            )


def _copy_body(url: str, response: Any, handle: BinaryIO, part: Path, limit: int, arrived: Callable[[], None]) -> None:
    """The response's body appended to `handle`, at most `limit` bytes in all: reads and writes
    apart, so a dropped connection (kept, resumable) is never mistaken for a full disk (removed).
    `arrived()` after each block (the progress line)."""
    while True:
        try:
            block = response.read1(min(CHUNK, limit + 1 - handle.tell()))  # what has arrived: kept if cut
        except (http.client.IncompleteRead, OSError) as exc:
            raise _Kept(
                f"the download of {url} was interrupted after {handle.tell()} bytes ({exc}); {part} was kept "
                "for the next run",
                RESUME_FIX,
            ) from None
        if not block:
            return
        if handle.tell() + len(block) > limit:
            _too_large(url, handle.tell() + len(block), "sent more than")
        try:
            handle.write(block)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(part)) from None
        arrived()


def _range_start(content_range: str | None) -> int | None:
    match = re.fullmatch(r"bytes (\d+)-\d+/(\d+|\*)", (content_range or "").strip())
    return int(match.group(1)) if match else None


def _whole_size(content_range: str | None) -> int | None:
    """The full size a 416's `Content-Range: bytes */SIZE` names (RFC 9110 14.4), else None."""
    match = re.fullmatch(r"bytes \*/(\d+)", (content_range or "").strip())
    return int(match.group(1)) if match else None
