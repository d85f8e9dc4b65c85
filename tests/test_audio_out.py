"""The one audio writer (omnivoice_onnx.audio_out) and its formats (omnivoice_onnx.audio_formats):
formats, the sample conversion, and where bytes go.

A hostile sweep found `--out ./devnull` (a `mknod c 1 3` character device) replaced by a regular
file and a symlinked output losing its link; both are pinned here, with pipes, stdout and the
atomic rules for regular files."""

from __future__ import annotations

import io
import os
import stat
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile
from conftest import REPO

from omnivoice_onnx import audio_out
from omnivoice_onnx.audio_formats import StreamEncoder, encode_audio, to_pcm16
from omnivoice_onnx.audio_out import open_output
from omnivoice_onnx.errors import UserError

RATE = 24000
SIGNAL = (0.6 * np.sin(np.arange(RATE, dtype=np.float32) / 7)).astype(np.float32)


def write_two_chunks(dest, fmt=None, stream=True) -> None:
    with open_output(dest, fmt, RATE, stream=stream) as sink:
        sink.write(SIGNAL[:10000])
        sink.write(SIGNAL[10000:])


def test_to_pcm16_formula() -> None:
    x = np.array([0.0, 1.0, -1.0, 1.5, -7.0, 0.5, -0.5, 1 / 32767 / 2, np.nan, 3e-5], dtype=np.float32)
    assert to_pcm16(x).tolist() == [0, 32767, -32767, 32767, -32767, 16384, -16384, 0, 0, 1]
    assert to_pcm16(x).dtype == np.int16


@pytest.mark.parametrize("name,subtype,fmt", [("a.wav", "PCM_16", "WAV"), ("a.flac", "PCM_16", "FLAC")])
def test_file_formats_from_the_extension(name: str, subtype: str, fmt: str, tmp_path: Path) -> None:
    write_two_chunks(tmp_path / name)
    info = soundfile.info(str(tmp_path / name))
    assert (info.samplerate, info.channels, info.subtype, info.format) == (RATE, 1, subtype, fmt)
    assert np.array_equal(soundfile.read(tmp_path / name, dtype="int16")[0], to_pcm16(SIGNAL))
    assert sorted(os.listdir(tmp_path)) == [name]  # no temporary left


def test_wav_bytes_are_encode_audio_and_raw_is_headerless(tmp_path: Path) -> None:
    write_two_chunks(tmp_path / "a.wav")
    write_two_chunks(tmp_path / "a.raw")
    assert (tmp_path / "a.wav").read_bytes() == encode_audio(SIGNAL, RATE, "wav")
    assert (
        (tmp_path / "a.raw").read_bytes()
        == to_pcm16(SIGNAL).astype("<i2").tobytes()
        == encode_audio(SIGNAL, RATE, "pcm")
    )
    header = (tmp_path / "a.wav").read_bytes()[:44]
    assert header[:4] == b"RIFF" and struct.unpack("<I", header[40:44])[0] == SIGNAL.size * 2


@pytest.mark.parametrize(
    "dest,fmt,message",
    [
        ("x.aac", None, "extension '.aac'"),
        ("noext", None, "no extension"),
        ("x.wav", "flac", "extension of wav"),
        ("x.wav", "ogg", "unknown audio format 'ogg'"),
        ("x.mp3", "opus", "extension of mp3"),
    ],
)
def test_unknown_or_contradicted_format_refused(dest: str, fmt, message: str, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=message):
        audio_out.check_destination(tmp_path / dest, fmt)
    assert os.listdir(tmp_path) == []


def test_directory_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is a directory"):
        open_output(tmp_path, "wav", RATE)


def test_failure_keeps_the_previous_file(tmp_path: Path) -> None:
    out = tmp_path / "a.wav"
    out.write_bytes(b"previous")
    out.chmod(0o640)
    with pytest.raises(KeyboardInterrupt):
        with open_output(out, None, RATE) as sink:
            sink.write(SIGNAL)
            raise KeyboardInterrupt
    assert out.read_bytes() == b"previous" and os.listdir(tmp_path) == ["a.wav"]
    write_two_chunks(out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640  # a replaced file keeps its mode


def test_symlink_target_written_and_link_kept(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    target = tmp_path / "store" / "real.wav"
    target.write_bytes(b"old")
    link = tmp_path / "link.wav"
    link.symlink_to(target)
    dangling = tmp_path / "dangling.wav"
    dangling.symlink_to(tmp_path / "store" / "new.wav")
    write_two_chunks(link)
    write_two_chunks(dangling)
    assert link.is_symlink() and dangling.is_symlink()
    assert target.read_bytes() == encode_audio(SIGNAL, RATE, "wav")
    assert (tmp_path / "store" / "new.wav").read_bytes() == encode_audio(SIGNAL, RATE, "wav")


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_character_device_is_written_in_place(tmp_path: Path) -> None:
    devnull = tmp_path / "devnull"
    os.mknod(devnull, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    for stream in (True, False):
        write_two_chunks(devnull, stream=stream)  # no extension: a device defaults to wav
        assert stat.S_ISCHR(devnull.lstat().st_mode)
    assert os.listdir(tmp_path) == ["devnull"]


def test_fifo_is_streamed(tmp_path: Path) -> None:
    fifo = tmp_path / "audio.pcm"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    write_two_chunks(fifo)
    reader.join(timeout=30)
    assert received == [encode_audio(SIGNAL, RATE, "pcm")]
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


# stdout in a child: streamed WAV on a pipe carries the "unknown length" sizes; not streamed, exact ones.
STDOUT_WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from omnivoice_onnx.audio_out import open_output
    x = (0.6 * np.sin(np.arange(24000, dtype=np.float32) / 7)).astype(np.float32)
    with open_output("-", sys.argv[1] or None, 24000, stream=sys.argv[2] == "stream") as sink:
        sink.write(x[:10000]); sink.write(x[10000:])
""")


@pytest.mark.parametrize(
    "fmt,mode",
    [
        ("", "stream"),
        ("", "whole"),
        ("pcm", "stream"),
        ("flac", "stream"),
        ("mp3", "stream"),
        ("mp3", "whole"),
        ("opus", "stream"),
    ],
)
def test_stdout_pipe(fmt: str, mode: str) -> None:
    done = subprocess.run([sys.executable, "-c", STDOUT_WRITER, fmt, mode], cwd=REPO, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    data = done.stdout
    expected = encode_audio(SIGNAL, RATE, fmt or "wav")
    if fmt == "" and mode == "stream":
        assert data[4:8] == data[40:44] == b"\xff\xff\xff\xff" and data[44:] == expected[44:]
        samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")  # readers take it as "until the end"
        assert rate == RATE and np.array_equal(samples, to_pcm16(SIGNAL))
    elif fmt == "opus":  # each Ogg stream has a random serial number: the same audio, not the same bytes
        assert np.array_equal(
            soundfile.read(io.BytesIO(data), dtype="int16")[0], soundfile.read(io.BytesIO(expected), dtype="int16")[0]
        )
    else:
        assert data == expected


def test_terminal_stdout_refused(monkeypatch) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    with pytest.raises(UserError, match="refusing to write audio to a terminal"):
        audio_out.check_destination("-", None)


@pytest.mark.parametrize("fmt", ["mp3", "opus"])
def test_encoded_formats_stream_and_equal_the_whole_clip(fmt: str, tmp_path: Path) -> None:
    """MP3 and Opus come out chunk by chunk (bytes after the first chunk), the chunks concatenate
    to the whole clip's bytes whatever the split, a file written through open_output holds the
    same bytes, and a decoder reads the whole length back."""
    signal = np.tile(SIGNAL, 3)
    encoder = StreamEncoder(fmt, RATE)
    first = encoder.start() + encoder.write(signal[:RATE])
    rest = encoder.write(signal[RATE : RATE + 777]) + encoder.write(signal[RATE + 777 :]) + encoder.finish()
    whole = encode_audio(signal, RATE, fmt)
    with open_output(tmp_path / f"a.{fmt}", None, RATE) as sink:
        sink.write(signal[:5000])
        sink.write(signal[5000:])
    written = (tmp_path / f"a.{fmt}").read_bytes()
    assert len(first) > 0
    if fmt == "mp3":  # bare MPEG-2 layer III frames (sync 0xFFF, 24 kHz): no Info frame to rewrite
        assert first + rest == whole == encode_audio(signal, RATE, fmt) == written
        assert whole[:2] == b"\xff\xf3" and b"Info" not in whole[:1000] and b"Xing" not in whole[:1000]
    decoded = [soundfile.read(io.BytesIO(data), dtype="int16") for data in (first + rest, whole, written)]
    assert all(rate == RATE and np.array_equal(samples, decoded[0][0]) for samples, rate in decoded)
    assert signal.size <= decoded[0][0].size <= signal.size + 2 * 1152  # plus the codec's delay
