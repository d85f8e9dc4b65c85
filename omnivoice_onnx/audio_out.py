"""The one audio writer: 16-bit PCM WAV (default), FLAC, raw s16le, MP3 or Ogg Opus, to a file, a device,
a pipe or stdout.

    sink = open_output("hello.wav", None, 24000)      # format from the extension; checked now
    with sink:                                         # an exception inside: nothing is left behind
        for chunk in tts.stream(text):
            sink.write(chunk.samples)                  # float32 [n] in [-1, 1]
    data = encode_audio(samples, 24000, "flac")        # a whole clip as bytes (server, batch)

Every front end (omnivoice-onnx speak, infer_onnx.py --text, the server, batch) writes through
this module, so a format, a sample conversion or a destination rule is decided once.

Formats: "wav" (RIFF, PCM 16-bit mono, 44-byte header: what sox, aplay, browsers and every
audio library read; float32 WAV made sox complain and doubled the size), "flac" (16-bit, lossless,
smaller), "pcm" (raw signed 16-bit little-endian mono, no header: `aplay -r 24000 -f S16_LE`,
OpenAI's `response_format=pcm`), "mp3" (64 kbit/s constant bit rate MPEG frames, OpenAI's default
format) and "opus" (Ogg Opus); the last two are libsndfile's encoders, through StreamEncoder, so
the CLI, the server and a stream write the same bytes for the same samples. The format comes from
`fmt` or else the extension (.wav, .flac, .pcm/.raw, .mp3, .opus/.ogg); any other extension is a
UserError when the output is opened, before any model work.
stdout, and a device or pipe without an extension, default to WAV.

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
import io
import os
import stat
import struct
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import (
    _errors_name,
    check_output,
    create_temporary,
    remove_stale_temporaries,
    replace_into,
)

FORMATS = ("wav", "flac", "pcm", "mp3", "opus")  # every format the CLI writes and the server answers
EXTENSIONS = {".wav": "wav", ".flac": "flac", ".pcm": "pcm", ".raw": "pcm", ".mp3": "mp3", ".opus": "opus",
              ".ogg": "opus"}
STDOUT = "-"
PCM16_SCALE = 32767  # full scale of a 16-bit sample; -1.0 -> -32767, so the scale is symmetric
WAV_HEADER_BYTES = 44
WAV_UNKNOWN_SIZE = 0xFFFFFFFF  # RIFF/data size of a stream whose length is unknown when the header is written


def to_pcm16(samples: np.ndarray) -> np.ndarray:
    """float samples -> int16: `rint(clip(x, -1, 1) * 32767)` (round half to even), NaN -> 0.

    Clipping first makes an over-full sample saturate instead of wrapping around (a loud click);
    32767 rather than 32768 keeps +1.0 representable and the scale symmetric, as libsndfile
    does when it writes floats to PCM_16. A port reproduces it bit for bit with that formula.
    """
    x = np.nan_to_num(np.asarray(samples, dtype=np.float32).reshape(-1), nan=0.0)
    return np.rint(np.clip(x, -1.0, 1.0) * np.float32(PCM16_SCALE)).astype(np.int16)


def wav_header(sample_rate: int, frames: int | None) -> bytes:
    """A 44-byte RIFF/WAVE header for 16-bit PCM mono; frames None: the unknown-length stream form."""
    data = WAV_UNKNOWN_SIZE if frames is None else frames * 2
    riff = WAV_UNKNOWN_SIZE if frames is None else data + WAV_HEADER_BYTES - 8
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data))


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """A whole clip (float32 [n]) as the bytes of a `fmt` file (FORMATS): the same bytes from the
    CLI, the server and batch for the same samples."""
    return _encode_pcm16(to_pcm16(samples), sample_rate, check_format(fmt))


def _encode_pcm16(pcm: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    data = pcm.astype("<i2").tobytes()
    if fmt == "pcm":
        return data
    if fmt == "wav":
        return wav_header(sample_rate, pcm.size) + data
    if fmt in ENCODED:  # one encoder for whole clips and streams: a clip is a stream of one chunk
        encoder = StreamEncoder(fmt, sample_rate)
        return encoder.start() + encoder.write_pcm16(pcm) + encoder.finish()
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, pcm, sample_rate, format="FLAC", subtype="PCM_16")
    return buffer.getvalue()


def check_format(fmt: str) -> str:
    """`fmt` if this machine writes it; UserError otherwise (mp3 and opus need a libsndfile built
    with LAME and libopus, as the soundfile wheels' is)."""
    if fmt not in FORMATS:
        raise UserError(f"unknown audio format {fmt!r}", f"choose one of {', '.join(FORMATS)}")
    if fmt in ENCODED and fmt not in available_response_formats():
        raise UserError(f"this machine's libsndfile cannot write {fmt}",
                        "install soundfile's wheel (its libsndfile has MP3 and Opus), or write wav or flac")
    return fmt


def output_format(dest: str | os.PathLike | None, fmt: str | None, streamed_path: bool = False) -> str:
    """The format for `dest`: `fmt` when given (and not contradicted by the extension), else the
    extension's; stdout, and a device or pipe without extension, default to wav."""
    if fmt is not None:
        check_format(fmt)
    if dest is None or str(dest) == STDOUT:
        return fmt or "wav"
    suffix = Path(dest).suffix.lower()
    named = EXTENSIONS.get(suffix)
    if fmt is not None and named is not None and named != fmt:
        raise UserError(f"{dest} has the extension of {named} but {fmt} was asked for",
                        f"name the file *.{fmt if fmt != 'pcm' else 'pcm'} or drop the format option")
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

    def __init__(self, handle: BinaryIO, fmt: str, sample_rate: int, stream: bool, name: str,
                 temp: Path | None = None, target: Path | None = None, owned: bool = True) -> None:
        self.fmt, self.sample_rate, self.name = fmt, sample_rate, name
        self.frames = 0  # samples written so far
        self._handle, self._temp, self._target, self._owned = handle, temp, target, owned
        self._seekable = _seekable(handle)
        # Buffer until close: a non-streamed pipe (exact WAV sizes), or FLAC where seeking is impossible.
        self._buffer: list[np.ndarray] | None = [] if (not self._seekable and (not stream or fmt == "flac")) else None
        self._flac = None
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

                    self._flac = soundfile.SoundFile(self._handle, "w", self.sample_rate, 1, format="FLAC",
                                                     subtype="PCM_16")
                self._flac.write(pcm)
                return
            if self.fmt in ENCODED:
                if self._encoder is None:
                    self._encoder = StreamEncoder(self.fmt, self.sample_rate)
                self._put(self._encoder.write_pcm16(pcm))
                self._handle.flush()
                return
            if self.fmt == "wav" and self._header_at is None:
                self._header_at = self._handle.tell() if self._seekable else 0
                self._put(wav_header(self.sample_rate, None))
            self._put(pcm.astype("<i2").tobytes())
            self._handle.flush()  # a listener on a pipe hears each chunk as it is written

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
                self._put(_encode_pcm16(data, self.sample_rate, self.fmt))
            elif self.fmt in ENCODED:
                if self._encoder is None:  # nothing written: the encoder's empty stream
                    self.write(np.zeros(0, np.float32))
                self._put(self._encoder.finish())
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
            if self._temp is not None:
                if self._target.exists():  # a replaced file keeps its permissions
                    os.chmod(self._temp, stat.S_IMODE(self._target.stat().st_mode))
                replace_into(self._temp, self._target)

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
        if self._temp is not None:
            self._temp.unlink(missing_ok=True)

    def __enter__(self) -> AudioSink:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


def _seekable(handle: BinaryIO) -> bool:
    try:
        return handle.seekable()
    except (OSError, ValueError):
        return False


def _destination(dest: str | os.PathLike | None, fmt: str | None, what: str) -> tuple[str, Path | None, str]:
    """(kind, path to write, format) for `dest`: kind "stdout", "stream" (a device, FIFO or socket,
    written in place) or "file" (written atomically); every check open_output makes, nothing created."""
    if dest is None or str(dest) == STDOUT:
        if sys.stdout.isatty():
            raise UserError("refusing to write audio to a terminal", "redirect stdout to a file or a player "
                            "(`| aplay`, `> out.wav`), or pass --out FILE")
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
        raise UserError(f"{what} {given}: the folder {folder} does not exist",
                        f"create it first (mkdir -p {folder}), or write into an existing folder")
    return "file", target, fmt


def check_destination(dest: str | os.PathLike | None, fmt: str | None, what: str = "output") -> str:
    """The format `dest` will be written in, after every check open_output makes (unknown
    extension, a directory, a folder it may not write, a terminal as stdout), creating nothing:
    for a front end to call before loading a model. `what` names the destination in messages."""
    return _destination(dest, fmt, what)[2]


def open_output(dest: str | os.PathLike | None, fmt: str | None, sample_rate: int, stream: bool = False,
                what: str = "output") -> AudioSink:
    """Open `dest` for audio (see the module docstring for formats and destinations); every problem
    the user can fix is a UserError now, before any samples (check_destination). stream: write
    streamed outputs as each write() comes (else at close, with exact sizes)."""
    kind, target, fmt = _destination(dest, fmt, what)
    if kind == "stdout":
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
    return AudioSink(handle, fmt, sample_rate, stream, str(dest), temp=temp, target=target)


# --- the server's response formats (OpenAI's response_format) ------------------------------------
# wav, pcm and flac are this module's writers; mp3 and opus are libsndfile's (LAME, libopus), where
# it has them. Every one but FLAC streams (stream_format "audio"/"sse", and speak --stream):
# StreamEncoder's chunks concatenate to one file decoders read. FLAC does not: libsndfile seeks
# back to write its sample count when it closes the file.

@dataclass(frozen=True)
class AudioFormat:
    """One response_format: how it is written and whether it can be sent as a stream."""

    media_type: str
    sf_format: str | None  # libsndfile container (None: raw s16le)
    sf_subtype: str | None
    streams: bool  # chunks concatenate to a stream decoders read (see RESPONSE_FORMATS)


RESPONSE_FORMATS = {
    "wav": AudioFormat("audio/wav", "WAV", "PCM_16", True),
    "pcm": AudioFormat("audio/pcm", None, None, True),  # s16le, mono, at the model's rate (24 kHz)
    "flac": AudioFormat("audio/flac", "FLAC", "PCM_16", False),
    "mp3": AudioFormat("audio/mpeg", "MP3", "MPEG_LAYER_III", True),  # bare MPEG frames, no Info frame
    "opus": AudioFormat("audio/ogg", "OGG", "OPUS", True),  # Ogg Opus, as OpenAI's opus
}
ENCODED = ("mp3", "opus")  # written by libsndfile's encoders, through StreamEncoder
# OpenAI also offers aac; libsndfile has no AAC encoder, so it is refused like a format this
# machine's libsndfile lacks.
# MP3: constant bit rate, so a decoder that sizes a stream from its bytes (libsndfile's reader,
# a browser's seek bar) gets its length right without the Info frame a stream cannot carry;
# libsndfile's compression level 0.6 is LAME's 64 kbit/s at 24 kHz mono (libsndfile's default is
# a variable ~16 kbit/s).
MP3_BITRATE_MODE = "CONSTANT"
MP3_COMPRESSION_LEVEL = 0.6
MP3_PIECE = 4800  # samples per encoder call: the frames of one (<= 4 KB) always fit the pipe


def available_response_formats() -> dict[str, AudioFormat]:
    """The RESPONSE_FORMATS the installed libsndfile writes (MP3 needs libsndfile >= 1.1 built with LAME,
    Opus one built with libopus); the others are refused with a 400 that lists these."""
    import soundfile

    return {name: fmt for name, fmt in RESPONSE_FORMATS.items()
            if fmt.sf_format is None or fmt.sf_subtype in soundfile.available_subtypes(fmt.sf_format)}


def encode_clip(samples: np.ndarray, fmt: str, sample_rate: int) -> bytes:
    """A whole clip as the bytes of a `fmt` file (a RESPONSE_FORMATS name): encode_audio's bytes."""
    return encode_audio(samples, sample_rate, fmt)


class _AppendOnly(io.RawIOBase):
    """A write target for libsndfile that keeps only what was not yet taken: a container written
    front to back (Ogg) streams through it; one that seeks back to rewrite a header fails loudly
    instead of sending bytes that disagree with those already sent."""

    def __init__(self) -> None:
        super().__init__()
        self.pending = bytearray()
        self.position = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.pending += bytes(data)
        self.position += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        target = {0: offset, 1: self.position + offset, 2: self.position + offset}[whence]
        if target != self.position:
            raise OSError(f"the encoder seeks back to byte {target} of a stream at {self.position}")
        return self.position

    def tell(self) -> int:
        return self.position

    def read(self, size: int = -1) -> bytes:
        return b""

    def take(self) -> bytes:
        data, self.pending = bytes(self.pending), bytearray()
        return data


class _PipeSink:
    """libsndfile's MP3 encoder writing into an OS pipe whose other end we read. libsndfile treats
    any file object it can seek (a virtual one included) as a file: LAME then starts with an empty
    Info frame and rewrites it at close, which a stream already sent cannot take. Into a pipe it
    writes plain MPEG frames front to back, a stream by construction."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)

    def take(self) -> bytes:
        parts = []
        while True:
            try:
                part = os.read(self.read_fd, 1 << 16)
            except BlockingIOError:
                break
            if not part:
                break
            parts.append(part)
        return b"".join(parts)


def _close_encoder(file: Any, pipe: _PipeSink | None) -> None:
    """Close the libsndfile encoder, then its pipe (in that order: a pipe descriptor closed first
    could be reused by another file before the encoder's last write)."""
    with contextlib.suppress(Exception):
        if file is not None and not file.closed:
            file.close()
    if pipe is not None:
        for fd in (pipe.write_fd, pipe.read_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class StreamEncoder:
    """Audio chunks -> the bytes of one continuous `fmt` stream, as they become available: the
    first MP3 frames come out with the first chunk. A whole clip is one write (encode_audio)."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        self.spec, self.sample_rate = RESPONSE_FORMATS[fmt], sample_rate
        if not self.spec.streams:
            raise ValueError(f"{fmt} does not stream")
        self._sink: _AppendOnly | _PipeSink | None = None
        self._file = None
        self._piece: int | None = None
        if self.spec.sf_format not in (None, "WAV"):
            import soundfile

            if fmt == "mp3":
                self._sink, self._piece = _PipeSink(), MP3_PIECE
                self._file = soundfile.SoundFile(self._sink.write_fd, "w", samplerate=sample_rate, channels=1,
                                                 format=self.spec.sf_format, subtype=self.spec.sf_subtype,
                                                 closefd=False, bitrate_mode=MP3_BITRATE_MODE,
                                                 compression_level=MP3_COMPRESSION_LEVEL)
            else:
                self._sink = _AppendOnly()
                self._file = soundfile.SoundFile(self._sink, "w", samplerate=sample_rate, channels=1,
                                                 format=self.spec.sf_format, subtype=self.spec.sf_subtype)
        # An encoder dropped unfinished (a client gone) still releases libsndfile and the pipe.
        self._finalizer = weakref.finalize(self, _close_encoder, self._file,
                                           self._sink if isinstance(self._sink, _PipeSink) else None)

    def start(self) -> bytes:
        """What goes out before the first chunk."""
        return wav_header(self.sample_rate, None) if self.spec.sf_format == "WAV" else b""

    def write(self, samples: np.ndarray) -> bytes:
        """The bytes that float32 `samples` add to the stream (to_pcm16 first)."""
        return self.write_pcm16(to_pcm16(samples))

    def write_pcm16(self, pcm: np.ndarray) -> bytes:
        if self._file is None:
            return pcm.astype("<i2").tobytes()
        step = self._piece or max(pcm.size, 1)
        out = []
        for start in range(0, pcm.size, step):
            self._file.write(pcm[start:start + step])
            out.append(self._sink.take())
        return b"".join(out)

    def finish(self) -> bytes:
        """The stream's last bytes (the encoder's buffered frames); the encoder is closed."""
        if self._file is None:
            return b""
        self._file.close()
        data = self._sink.take()
        self.close()
        return data

    def close(self) -> None:
        """Release the encoder without finishing the stream (idempotent)."""
        self._finalizer()
