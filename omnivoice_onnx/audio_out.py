"""The one audio writer: 16-bit PCM WAV (default), FLAC, raw s16le, MP3 or Ogg Opus, to a file, a device,
a pipe or stdout.

    sink = open_output("hello.wav", None, 24000)      # format from the extension; checked now
    with sink:                                         # an exception inside: nothing is left behind
        for chunk in tts.stream(text):
            sink.write(chunk.samples)                  # float32 [n] in [-1, 1]

Every front end that writes a file or a stream (omnivoice-onnx speak, infer_onnx.py --text)
writes through this module, so a destination rule is decided once.

Formats (omnivoice_onnx.audio_formats: the bytes of each) come from `fmt` or else the extension
(.wav, .flac, .pcm/.raw, .mp3, .opus/.ogg); any other extension is a UserError when the output
is opened, before any model work. stdout, and a device or pipe without an extension, default to
WAV.

Destinations (open_output):
- "-" (or None): stdout. Refused when stdout is a terminal (audio bytes would garble it).
- a path in a folder that does not exist: refused, naming the folder (as cp, sox and a shell
  redirection do; a mistyped path must not create folders).
- a regular file, or a path that does not exist yet: written under a hidden temporary name beside
  it and renamed onto it when complete (files.create_temporary: a random name, created
  exclusively), so a Ctrl-C, a full disk or an error leaves the previous file (or none), never
  half a file. A replaced file keeps its mode.
- a symlink: followed deliberately. The link's final target is written atomically as above and
  the link itself stays a link (replacing the link by a regular file would silently detach
  whatever else reads through it; a dangling link gets its target created). This is what
  `cp`, `sox` and shell redirection do: they write through the link.
- a character device (`/dev/null`, a sound device, a `mknod c 1 3` copy of it), a FIFO or a socket:
  opened and written in place, never replaced by a rename (a rename would put a regular file where
  the device was). Such an output cannot be un-written: an interrupted run leaves what it wrote.
Streamed outputs (stdout, devices, pipes) get each write() at once when `stream` is True; WAV then
carries the size 0xFFFFFFFF in its RIFF and data headers ("until the end of the stream", as sox
and ffmpeg write to a pipe), unless the output is seekable (stdout redirected to a file), where
the header is patched at close. With `stream` False, a streamed output is written at close, in
one piece, with exact sizes. FLAC to a non-seekable output is always written at close (its
encoder seeks back to finish its header); stream WAV, raw PCM, MP3 or Opus instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import numpy as np

from omnivoice_onnx.audio_formats import ENCODED, StreamEncoder, check_format, encode_pcm16, to_pcm16, wav_header
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import (
    _errors_name,
    check_output,
    create_temporary,
    remove_stale_temporaries,
    replace_into,
)

EXTENSIONS = {
    ".wav": "wav",
    ".flac": "flac",
    ".pcm": "pcm",
    ".raw": "pcm",
    ".mp3": "mp3",
    ".opus": "opus",
    ".ogg": "opus",
}
STDOUT = "-"


def output_format(dest: str | os.PathLike[str] | None, fmt: str | None, streamed_path: bool = False) -> str:
    """The format for `dest`: `fmt` when given (and not contradicted by the extension), else the
    extension's; stdout, and a device or pipe without extension, default to wav."""
    if fmt is not None:
        check_format(fmt)
    if dest is None or str(dest) == STDOUT:
        return fmt or "wav"
    suffix = Path(dest).suffix.lower()
    named = EXTENSIONS.get(suffix)
    if fmt is not None and named is not None and named != fmt:
        raise UserError(
            f"{dest} has the extension of {named} but {fmt} was asked for",
            f"name the file *.{fmt if fmt != 'pcm' else 'pcm'} or drop the format option",
        )
    if fmt is not None:
        return fmt
    if named is not None:
        return named
    if not suffix and streamed_path:
        return "wav"
    choices = ", ".join(EXTENSIONS)
    what = f"the extension {suffix!r}" if suffix else "no extension"
    raise UserError(f"cannot tell the audio format of {dest}: it has {what}", f"name the file with one of {choices}")


class AudioSink:
    """An open audio output. write() float32 chunks, then close(); abort() (or leaving a `with`
    block by an exception) removes what a regular-file output had written. Build it with open_output."""

    def __init__(
        self,
        handle: BinaryIO,
        fmt: str,
        sample_rate: int,
        stream: bool,
        name: str,
        replacing: tuple[Path, Path] | None = None,
        owned: bool = True,
    ) -> None:
        """replacing: (temporary, target) of a regular file: written to the temporary, renamed onto
        the target by close()."""
        self.fmt, self.sample_rate, self.name = fmt, sample_rate, name
        self.frames = 0  # samples written so far
        self._handle, self._replacing, self._owned = handle, replacing, owned
        self._seekable = _seekable(handle)
        # Buffer until close: a non-streamed pipe (exact WAV sizes), or FLAC where seeking is impossible.
        self._buffer: list[np.ndarray] | None = [] if (not self._seekable and (not stream or fmt == "flac")) else None
        self._flac: Any = None  # a soundfile.SoundFile once FLAC is written (soundfile has no stubs)
        self._encoder: StreamEncoder | None = None  # mp3, opus: appended frames, written as they come
        self._header_at: int | None = None
        self._closed = False

    def write(self, samples: np.ndarray) -> None:
        """Append float32 samples (any shape, flattened); converted by to_pcm16."""
        pcm = to_pcm16(samples)
        self.frames += pcm.size
        if self._buffer is not None:
            self._buffer.append(pcm)
            return
        with _errors_name(Path(self.name)):
            if self.fmt == "flac":
                if self._flac is None:
                    import soundfile

                    self._flac = soundfile.SoundFile(
                        self._handle, "w", self.sample_rate, 1, format="FLAC", subtype="PCM_16"
                    )
                self._flac.write(pcm)
                return
            if self.fmt in ENCODED:
                self._put(self._stream_encoder().write_pcm16(pcm))
                self._handle.flush()
                return
            if self.fmt == "wav" and self._header_at is None:
                self._header_at = self._handle.tell() if self._seekable else 0
                self._put(wav_header(self.sample_rate, None))
            self._put(pcm.astype("<i2").tobytes())
            self._handle.flush()  # a listener on a pipe hears each chunk as it is written

    def _stream_encoder(self) -> StreamEncoder:
        if self._encoder is None:
            self._encoder = StreamEncoder(self.fmt, self.sample_rate)
        return self._encoder

    def _put(self, data: bytes) -> None:
        """Write all of `data`. A buffered write larger than the pipe returns the short count the
        pipe took when its reader has gone (65,536 of 969,644 bytes, no error: `speak | head -c 1000`
        exited 0); the next write raises the BrokenPipeError that makes the command exit 141."""
        view = memoryview(data)
        while view:
            written = self._handle.write(view)
            if not written:
                raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))
            view = view[written:]

    def close(self) -> None:
        """Finish the output: sizes patched, buffered audio written, a temporary renamed into place."""
        if self._closed:
            return
        try:
            self._finish()
        except BaseException:
            self._discard()  # a full disk or a refused rename leaves no temporary behind
            raise

    def _finish(self) -> None:
        with _errors_name(Path(self.name)):
            if self._buffer is not None:
                data = np.concatenate(self._buffer) if self._buffer else np.zeros(0, np.int16)
                self._put(encode_pcm16(data, self.sample_rate, self.fmt))
            elif self.fmt in ENCODED:
                if self._encoder is None:  # nothing written: the encoder's empty stream
                    self.write(np.zeros(0, np.float32))
                self._put(self._stream_encoder().finish())
            elif self.fmt == "flac":
                if self._flac is None:  # nothing written: an empty but valid FLAC file
                    self.write(np.zeros(0, np.float32))
                self._flac.close()
            elif self.fmt == "wav":
                if self._header_at is None:  # nothing written: a valid empty WAV
                    self._put(wav_header(self.sample_rate, 0))
                elif self._seekable:
                    end = self._handle.tell()
                    self._handle.seek(self._header_at)
                    self._put(wav_header(self.sample_rate, self.frames))
                    self._handle.seek(end)
            self._handle.flush()
            self._closed = True
            if self._owned:
                self._handle.close()
            if self._replacing is not None:
                temp, target = self._replacing
                if target.exists():  # a replaced file keeps its permissions
                    os.chmod(temp, stat.S_IMODE(target.stat().st_mode))
                replace_into(temp, target)

    def abort(self) -> None:
        """Give up: a regular-file output's temporary is removed (the previous file stays); a
        streamed output keeps what it had received."""
        if not self._closed:
            self._discard()

    def _discard(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError, ValueError):
            if self._flac is not None:
                self._flac.close()
            if self._encoder is not None:
                self._encoder.close()
            if self._owned:
                self._handle.close()
        if self._replacing is not None:
            self._replacing[0].unlink(missing_ok=True)

    def __enter__(self) -> AudioSink:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


def _seekable(handle: BinaryIO) -> bool:
    try:
        return handle.seekable()
    except (OSError, ValueError):
        return False


def _destination(dest: str | os.PathLike[str] | None, fmt: str | None, what: str) -> tuple[str, Path | None, str]:
    """(kind, path to write, format) for `dest`: kind "stdout", "stream" (a device, FIFO or socket,
    written in place) or "file" (written atomically); every check open_output makes, nothing created."""
    if dest is None or str(dest) == STDOUT:
        if sys.stdout.isatty():
            raise UserError(
                "refusing to write audio to a terminal",
                "redirect stdout to a file or a player (`| aplay`, `> out.wav`), or pass --out FILE",
            )
        return "stdout", None, output_format(None, fmt)
    given = Path(dest)
    target = Path(os.path.realpath(given))  # symlinks followed: the link's target is what is written
    try:
        mode = target.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # a new file (check_output names a parent that is a file)
        mode = None
    except OSError as exc:
        raise UserError(f"{what} {given} cannot be reached ({exc.strerror})", "pass a path you may write") from exc
    if mode is not None and stat.S_ISDIR(mode):
        raise UserError(f"{what} {given} is a directory", f"pass the path of a file to write, e.g. {given / 'out.wav'}")
    if mode is not None and not stat.S_ISREG(mode):
        return "stream", target, output_format(given, fmt, streamed_path=True)
    fmt = output_format(given, fmt)
    check_output(target, what, "file")
    if not target.parent.is_dir():  # as cp, sox and a shell redirection: a typo must not make folders
        folder = given.parent if not given.parent.is_dir() else target.parent
        raise UserError(
            f"{what} {given}: the folder {folder} does not exist",
            f"create it first (mkdir -p {folder}), or write into an existing folder",
        )
    return "file", target, fmt


def check_destination(dest: str | os.PathLike[str] | None, fmt: str | None, what: str = "output") -> str:
    """The format `dest` will be written in, after every check open_output makes (unknown
    extension, a directory, a folder it may not write, a terminal as stdout), creating nothing:
    for a front end to call before loading a model. `what` names the destination in messages."""
    return _destination(dest, fmt, what)[2]


def open_output(
    dest: str | os.PathLike[str] | None, fmt: str | None, sample_rate: int, stream: bool = False, what: str = "output"
) -> AudioSink:
    """Open `dest` for audio (see the module docstring for formats and destinations); every problem
    the user can fix is a UserError now, before any samples (check_destination). stream: write
    streamed outputs as each write() comes (else at close, with exact sizes)."""
    kind, target, fmt = _destination(dest, fmt, what)
    if target is None:  # stdout
        return AudioSink(sys.stdout.buffer, fmt, sample_rate, stream, "<stdout>", owned=False)
    if kind == "stream":
        try:
            handle = open(target, "wb")  # noqa: SIM115 (closed by the sink)
        except OSError as exc:
            raise UserError(f"cannot open {what} {dest} ({exc.strerror})", "pass a path you may write") from exc
        return AudioSink(handle, fmt, sample_rate, stream, str(dest))
    remove_stale_temporaries(target)
    with _errors_name(target):
        temp = create_temporary(target)
        handle = open(temp, "wb")  # noqa: SIM115 (closed by the sink)
    return AudioSink(handle, fmt, sample_rate, stream, str(dest), replacing=(temp, target))
