"""The audio formats: float samples to the bytes of a 16-bit PCM WAV (default), FLAC, raw s16le, MP3
or Ogg Opus file or stream, decided once for every front end (omnivoice_onnx.audio_out writes them
to a destination; the server answers OpenAI's response_format with them; batch writes WAVs).

    data = encode_audio(samples, 24000, "flac")        # a whole clip as bytes (server, batch)
    encoder = StreamEncoder("mp3", 24000)               # a stream: bytes as each chunk comes
    out = encoder.start() + encoder.write(chunk) + ... + encoder.finish()

Formats: "wav" (RIFF, PCM 16-bit mono, 44-byte header: what sox, aplay, browsers and every
audio library read; float32 WAV made sox complain and doubled the size), "flac" (16-bit, lossless,
smaller), "pcm" (raw signed 16-bit little-endian mono, no header: `aplay -r 24000 -f S16_LE`,
OpenAI's `response_format=pcm`), "mp3" (64 kbit/s constant bit rate MPEG frames, OpenAI's default
format) and "opus" (Ogg Opus); the last two are libsndfile's encoders, through StreamEncoder, so
the CLI, the server and a stream write the same bytes for the same samples. Every sample goes
through to_pcm16 first.

A module of its own because what bytes a clip becomes is one job and where they go (a file
replaced atomically, a device, a pipe, stdout: audio_out) is another; the server and batch need
only this one.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from omnivoice_onnx.errors import UserError

FORMATS = ("wav", "flac", "pcm", "mp3", "opus")  # every format the CLI writes and the server answers
PCM16_SCALE = 32767  # full scale of a 16-bit sample; -1.0 -> -32767, so the scale is symmetric
WAV_HEADER_BYTES = 44
WAV_UNKNOWN_SIZE = 0xFFFFFFFF  # RIFF/data size of a stream whose length is unknown when the header is written


def to_pcm16(samples: np.ndarray) -> npt.NDArray[np.int16]:
    """float samples -> int16: `rint(clip(x, -1, 1) * 32767)` (round half to even), NaN -> 0.

    Clipping first makes an over-full sample saturate instead of wrapping around (a loud click);
    32767 rather than 32768 keeps +1.0 representable and the scale symmetric, as libsndfile
    does when it writes floats to PCM_16. A port reproduces it bit for bit with that formula.
    """
    x = np.nan_to_num(np.asarray(samples, dtype=np.float32).reshape(-1), nan=0.0)
    pcm: npt.NDArray[np.int16] = np.rint(np.clip(x, -1.0, 1.0) * np.float32(PCM16_SCALE)).astype(np.int16)
    return pcm


def wav_header(sample_rate: int, frames: int | None) -> bytes:
    """A 44-byte RIFF/WAVE header for 16-bit PCM mono; frames None: the unknown-length stream form."""
    data = WAV_UNKNOWN_SIZE if frames is None else frames * 2
    riff = WAV_UNKNOWN_SIZE if frames is None else data + WAV_HEADER_BYTES - 8
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data)
    )


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """A whole clip (float32 [n]) as the bytes of a `fmt` file (FORMATS): the same bytes from the
    CLI, the server and batch for the same samples."""
    return encode_pcm16(to_pcm16(samples), sample_rate, check_format(fmt))


def encode_pcm16(pcm: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """A clip already in 16-bit samples (to_pcm16's) as the bytes of a `fmt` file."""
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
        raise UserError(
            f"this machine's libsndfile cannot write {fmt}",
            "install soundfile's wheel (its libsndfile has MP3 and Opus), or write wav or flac",
        )
    return fmt


# --- the server's response formats (OpenAI's response_format) ------------------------------------
# wav, pcm and flac are written here; mp3 and opus are libsndfile's (LAME, libopus), where
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

    return {
        name: fmt
        for name, fmt in RESPONSE_FORMATS.items()
        if fmt.sf_format is None or fmt.sf_subtype in soundfile.available_subtypes(fmt.sf_format)
    }


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
        self._file: Any = None  # a soundfile.SoundFile (soundfile has no stubs)
        self._piece: int | None = None
        if self.spec.sf_format not in (None, "WAV"):
            import soundfile

            if fmt == "mp3":
                self._sink, self._piece = _PipeSink(), MP3_PIECE
                self._file = soundfile.SoundFile(
                    self._sink.write_fd,
                    "w",
                    samplerate=sample_rate,
                    channels=1,
                    format=self.spec.sf_format,
                    subtype=self.spec.sf_subtype,
                    closefd=False,
                    bitrate_mode=MP3_BITRATE_MODE,
                    compression_level=MP3_COMPRESSION_LEVEL,
                )
            else:
                self._sink = _AppendOnly()
                self._file = soundfile.SoundFile(
                    self._sink,
                    "w",
                    samplerate=sample_rate,
                    channels=1,
                    format=self.spec.sf_format,
                    subtype=self.spec.sf_subtype,
                )
        # An encoder dropped unfinished (a client gone) still releases libsndfile and the pipe.
        self._finalizer = weakref.finalize(
            self, _close_encoder, self._file, self._sink if isinstance(self._sink, _PipeSink) else None
        )

    def start(self) -> bytes:
        """What goes out before the first chunk."""
        return wav_header(self.sample_rate, None) if self.spec.sf_format == "WAV" else b""

    def write(self, samples: np.ndarray) -> bytes:
        """The bytes that float32 `samples` add to the stream (to_pcm16 first)."""
        return self.write_pcm16(to_pcm16(samples))

    def write_pcm16(self, pcm: np.ndarray) -> bytes:
        if self._file is None or self._sink is None:  # WAV and PCM: the samples themselves
            return pcm.astype("<i2").tobytes()
        step = self._piece or max(pcm.size, 1)
        out = []
        for start in range(0, pcm.size, step):
            self._file.write(pcm[start : start + step])
            out.append(self._sink.take())
        return b"".join(out)

    def finish(self) -> bytes:
        """The stream's last bytes (the encoder's buffered frames); the encoder is closed."""
        if self._file is None or self._sink is None:
            return b""
        self._file.close()
        data = self._sink.take()
        self.close()
        return data

    def close(self) -> None:
        """Release the encoder without finishing the stream (idempotent)."""
        self._finalizer()
