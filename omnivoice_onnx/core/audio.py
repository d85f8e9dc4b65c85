"""The runtime's audio pre- and post-processing, equal to upstream OmniVoice's (omnivoice 0.2.1).

Reproduces, in numpy:
- `omnivoice/utils/audio.py`: `load_waveform` + `load_audio` (load_reference, file branch),
  `remove_silence` (-> _silence.py), `fade_and_pad_audio`, `cross_fade_chunks`;
  `torchaudio.functional.resample` (-> _resample.py).
- `omnivoice/models/omnivoice.py`: `OmniVoice.create_voice_clone_prompt` (the `(waveform, sr)`
  branch in load_reference; RMS boost, silence removal and hop clip in prepare_reference; with
  ref_text given, so upstream's `trim_long_audio` never runs and is not ported) and
  `OmniVoice._post_process_audio` (post_process).

Dtypes and float order, as upstream:
- Files are read with soundfile as float32 (libsndfile scales int PCM by 1/32768), channels mixed
  by `np.mean(axis=0)`. A float64 array passed in stays float64 through the channel mean, the
  resampling (kernel computed in float64 too) and the RMS boost, exactly as upstream keeps it;
  silence removal then returns float32 on the int16 grid.
- RMS is `sqrt(mean(x**2))` with numpy's pairwise float32 summation (float64 for float64 input),
  measured BEFORE the boost; the boost is `(x * 0.1) / rms` in the array's dtype. Post-processing
  scales by `(x * ref_rms) / 0.1` in float32 (NumPy 2 rounds python floats to float32 first).
- Bit-exact with upstream: everything except resampling. Resampling differs from torch by float32
  rounding (max |diff| 3.6e-7 measured, see _resample.py), and silence removal's int16 quantisation can
  turn such a difference into one int16 step (3.1e-5) on a sample sitting at a quantisation edge.

Two additions of this runtime, both off by default (the output is then upstream's, bit for bit):
a request's sentence_silence, round(seconds * rate) zeros added to the cross-fade's silence at
every boundary between a text's chunks (join_chunks; with it each chunk's silence is removed on
its own, as a stream removes it, so no later step shortens the pause), and its volume, every
output sample times float32(volume) as the last step (apply_volume; clipped to [-1, 1] only where
the samples become 16-bit PCM, audio_formats.to_pcm16, as piper clips before its int16).

Deliberate differences, all where upstream crashes or misbehaves: integer or float16 samples,
NaN/inf, empty or wrongly shaped arrays and a reference too short for one codec frame raise a
UserError; a float64 reference with preprocess=False is cast to float32 (upstream feeds float64 to
its float32 codec and fails); all-silent generated audio without a reference is returned empty
(upstream's peak normalisation fails on the empty array). Upstream's librosa fallback for files
soundfile cannot read (m4a...) is not ported: such a file is a UserError.
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import soundfile as sf

from omnivoice_onnx.core import _resample, _silence
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.limits import DEFAULT_SENTENCE_SILENCE_S, DEFAULT_VOLUME, too_large
from omnivoice_onnx.reading import existing_file

# The settings (`rules`: runtime-config.json's audio section, written by
# omnivoice_export/step2_export/runtime_assets.py from upstream; docs/runtime.md states each):
#   target_rms 0.1            references quieter than this are boosted to it; outputs scaled back down
#   peak_level 0.5, min_peak 1e-6   without a reference the output peak is set to peak_level,
#                             unless it is <= min_peak (near silent)
#   reference_silence_ms [200, 100, 200]   create_voice_clone_prompt's remove_silence(mid, lead, trail)
#   output_silence_ms [500, 100, 100]      _post_process_audio's remove_silence(mid, lead, trail)
#   silence_thresh_dbfs -50, seek_step_ms 10, leading_chunk_ms 10   pydub's silence parameters
#   cross_fade_silence_s 0.3  cross_fade_chunks' gap: fade-out, silence, fade-in thirds (the request's
#                             sentence_silence adds to the silence: pause_samples)
#   resample {lowpass_filter_width 6, rolloff 0.99}   torchaudio.functional.resample's defaults


def load_reference(
    ref_audio: str | os.PathLike[str] | tuple[np.ndarray, int],
    sample_rate: int,
    rules: dict[str, Any],
    max_seconds: float | None = None,
) -> np.ndarray:
    """float32 [1, T] mono at sample_rate (upstream load_audio / the tuple branch).

    A file is read with soundfile; a tuple is `(waveform [T] or [C, T], rate)`. Channels are
    averaged, then the audio is resampled to sample_rate as torchaudio does. A float64 waveform
    stays float64 (upstream computes the RMS boost in float64); prepare_reference returns float32.
    A reference longer than `max_seconds` is refused from its header or shape, before it is read
    or resampled (a 5-minute reference, or 3 s of samples labelled 1 Hz, would take GBs).
    """
    if isinstance(ref_audio, tuple):
        if len(ref_audio) != 2:
            raise UserError(f"reference audio tuple has {len(ref_audio)} items", "pass (waveform, sample_rate)")
        rate = _checked_rate(ref_audio[1])
        if max_seconds is not None:
            _check_length(np.shape(ref_audio[0])[-1] if np.ndim(ref_audio[0]) else 0, rate, max_seconds)
        waveform = _checked_array(ref_audio[0])
        if waveform.ndim == 1:
            waveform = waveform[np.newaxis, :]
    else:
        # A FIFO, /dev/zero, a directory or a symlink loop is named as what it is (README), before
        # anything opens it: libsndfile would block on a FIFO or read a device without end.
        existing_file(Path(ref_audio), "reference audio file", "pass the path of a WAV or FLAC file")
        if max_seconds is not None:
            try:
                info = sf.info(ref_audio)
            except sf.LibsndfileError:
                info = None  # _read_file names the problem
            if info is not None:
                _check_length(info.frames, info.samplerate, max_seconds)
        waveform, rate = _read_file(ref_audio)
    if waveform.shape[0] > 1:
        waveform = np.mean(waveform, axis=0, keepdims=True)
    return resample(waveform, rate, sample_rate, rules)


def _check_length(samples: int, rate: int, max_seconds: float) -> None:
    if samples / rate > max_seconds:
        raise too_large(
            f"the reference audio is {samples / rate:.1f} s long ({samples} samples at {rate} Hz)",
            "MAX_REF_SECONDS",
            "cut it to 3-10 s of clear speech",
        )


def resample(waveform: np.ndarray, orig_freq: int, new_freq: int, rules: dict[str, Any]) -> np.ndarray:
    """torchaudio.functional.resample with the parameters of rules["resample"] (_resample.py)."""
    return _resample.resample(waveform, orig_freq, new_freq, **rules["resample"])


def reference_rms(wav: np.ndarray) -> float:
    """upstream's `float(np.sqrt(np.mean(wav**2)))`, in the array's dtype: the squares rounded to
    float32 (for float32 input), summed by numpy's pairwise summation (docs/runtime.md states it:
    8 accumulators over blocks of at most 128, halves split at a multiple of 8), divided by the
    count in that dtype, then the square root and the conversion to a Python float. A sequential
    sum gives another float32 (tests/test_runtime_formulas.py), hence another boost and level."""
    return float(np.sqrt(np.mean(wav**2)))


def prepare_reference(
    wav: np.ndarray,
    sample_rate: int,
    hop_length: int,
    rules: dict[str, Any],
    preprocess: bool = True,
    min_seconds: float = 0.0,
) -> tuple[np.ndarray, float]:
    """(wav [1, T'] ready for the encoder: RMS-boosted, silence-removed if preprocess, clipped to a
    multiple of hop_length; ref_rms measured BEFORE the boost) = create_voice_clone_prompt's steps
    between loading and encode (with ref_text given).

    The returned wav is float32 and T' is a positive multiple of hop_length, of at least
    `min_seconds`. A silent reference (all zeros: anything else is boosted to target_rms) is
    refused whatever its length: upstream encodes a short one and clones silence.
    """
    wav = _checked_array(wav)
    if wav.ndim != 2 or wav.shape[0] != 1:
        raise ValueError(f"prepare_reference takes mono audio [1, T], got shape {wav.shape}")
    ref_rms = reference_rms(wav)
    target_rms = rules["target_rms"]
    if 0 < ref_rms < target_rms:
        wav = wav * target_rms / ref_rms
    if not np.abs(wav).max() >= 10 ** (rules["silence_thresh_dbfs"] / 20):  # boosted: only all-zero audio is
        raise UserError(
            "the reference audio is silent (all samples are zero)", "pass a reference with clearly audible speech"
        )
    if preprocess:
        mid, lead, trail = rules["reference_silence_ms"]
        wav = remove_silence(wav, sample_rate, mid, lead, trail, rules)
        if wav.shape[-1] == 0:
            raise UserError(
                "the reference audio is silent or too quiet: nothing is left after silence removal (-50 dBFS)",
                "pass a reference with clearly audible speech",
            )
    clip_size = wav.shape[-1] % hop_length
    if clip_size:
        wav = wav[:, :-clip_size]
    if wav.shape[-1] == 0 or wav.shape[-1] < min_seconds * sample_rate:
        raise UserError(
            f"the reference audio is {wav.shape[-1] / sample_rate:.2f} s long after preparation, under "
            f"{max(min_seconds, hop_length / sample_rate):g} s",
            "pass a reference of 3-10 s of speech",
        )
    return wav.astype(np.float32), ref_rms  # a copy: never a view of the caller's array


def post_process(
    audio: np.ndarray,
    ref_rms: float | None,
    sample_rate: int,
    rules: dict[str, Any],
    postprocess_output: bool,
    pad_duration: float,
    fade_duration: float,
) -> np.ndarray:
    """[1, T] -> [1, T'] as upstream _post_process_audio.

    Long pauses shrink (if postprocess_output: rules["output_silence_ms"]), the level follows the
    reference (a reference quieter than target_rms was boosted, so the output is scaled back:
    `(x * ref_rms) / target_rms`; without one `(x / peak) * peak_level` when peak > min_peak, in
    that order), then fades and silent padding avoid clicks.
    """
    if postprocess_output:
        mid, lead, trail = rules["output_silence_ms"]
        audio = remove_silence(audio, sample_rate, mid, lead, trail, rules)
    audio = level(audio, ref_rms, peak_of(audio), rules)
    return _fade_and_pad(audio, pad_duration, fade_duration, sample_rate)


def peak_of(audio: np.ndarray) -> np.float32 | None:
    """The peak that level() normalises by (None for empty audio)."""
    if not audio.size:
        return None
    peak: np.float32 = np.abs(audio).max()
    return peak


def level(audio: np.ndarray, ref_rms: float | None, peak: np.floating | None, rules: dict[str, Any]) -> np.ndarray:
    """_post_process_audio's gain: with a reference quieter than target_rms, `(x * ref_rms) /
    target_rms`; without a reference, `(x / peak) * peak_level` when `peak` (the whole output's)
    is > min_peak. Elementwise with fixed factors, in upstream's operation order, so a stream that
    applies it piece by piece with the same factors gets the same bits."""
    target_rms: float = rules["target_rms"]  # runtime-config.json's audio section
    min_peak: float = rules["min_peak"]
    peak_level: float = rules["peak_level"]
    gained: np.ndarray = audio
    if ref_rms is not None and ref_rms < target_rms:
        gained = audio * ref_rms / target_rms
    elif ref_rms is None and peak is not None and peak > min_peak:
        gained = audio / peak * peak_level
    return gained


def pause_samples(pause_s: float, sample_rate: int) -> int:
    """The zeros a request's sentence_silence of `pause_s` seconds adds at each chunk boundary:
    round(pause_s * rate), Python's round (half to even; 0.25 s is 6000 at 24 kHz)."""
    return round(pause_s * sample_rate)


def cross_fade_chunks(
    chunks: list[np.ndarray], sample_rate: int, rules: dict[str, Any], pause_s: float = 0.0
) -> np.ndarray:
    """as upstream utils/audio.cross_fade_chunks (same shapes in/out), with `pause_s` seconds of
    silence added at each boundary (a request's sentence_silence; 0 is upstream's join).

    Chunks [C, T_i] are joined as: chunk, linear fade-out over its last n samples, n + p zeros,
    next chunk with a linear fade-in over its first n samples, n = int(cross_fade_silence_s *
    rate) // 3 (2400 at 24 kHz), p = pause_samples(pause_s); a chunk shorter than n fades in over
    its whole length. The fade-out covers the last min(n, len(merged)) samples of everything
    joined so far, so after a chunk of L < n samples it also covers n - L of the zeros before it
    (the chunk gets the ramp's last L gains; vectors.rules' cross_fade cases). A single chunk is
    returned as is.
    """
    if not chunks:
        raise ValueError("cross_fade_chunks needs at least one chunk")
    if len(chunks) == 1:
        return chunks[0]
    fade_n = int(rules["cross_fade_silence_s"] * sample_rate) // 3
    silence_n = fade_n + pause_samples(pause_s, sample_rate)
    merged: np.ndarray = chunks[0].copy()
    for chunk in chunks[1:]:
        fout_n = min(fade_n, merged.shape[-1])
        if fout_n > 0:
            merged[..., -fout_n:] *= np.linspace(1, 0, fout_n, dtype=np.float32)[np.newaxis, :]
        silence = np.zeros((chunks[0].shape[0], silence_n), dtype=np.float32)
        fade_in = chunk.copy()
        fin_n = min(fade_n, fade_in.shape[-1])
        if fin_n > 0:
            fade_in[..., :fin_n] *= np.linspace(0, 1, fin_n, dtype=np.float32)[np.newaxis, :]
        merged = np.concatenate([merged, silence, fade_in], axis=-1)
    return merged


def join_chunks(
    chunks: list[np.ndarray],
    ref_rms: float | None,
    sample_rate: int,
    rules: dict[str, Any],
    postprocess_output: bool,
    pad_duration: float,
    fade_duration: float,
    pause_s: float,
    volume: float,
) -> np.ndarray:
    """A text's decoded chunks [1, T_i] -> its whole output, float32 [T]: what generate() returns.

    Without a pause, upstream's post_process(cross_fade_chunks(chunks)) (silence removed over the
    joined output). With one (pause_s > 0, more than one chunk), the pause must survive silence
    removal, which would shorten a long gap: each chunk's silence is removed on its own (as
    StreamAssembler removes it), the chunks are joined with the pause, then leveled, faded and
    padded. The volume is the last step (apply_volume).
    """
    if pause_s > 0 and len(chunks) > 1:
        if postprocess_output:
            mid, lead, trail = rules["output_silence_ms"]
            chunks = [remove_silence(chunk, sample_rate, mid, lead, trail, rules) for chunk in chunks]
        joined = cross_fade_chunks(chunks, sample_rate, rules, pause_s)
        output = post_process(joined, ref_rms, sample_rate, rules, False, pad_duration, fade_duration)
    else:
        joined = cross_fade_chunks(chunks, sample_rate, rules)
        output = post_process(joined, ref_rms, sample_rate, rules, postprocess_output, pad_duration, fade_duration)
    return apply_volume(output[0], volume)


def apply_volume(samples: np.ndarray, volume: float) -> np.ndarray:
    """A request's volume: each sample times float32(volume), in float32 (piper's --volume, a linear
    gain); 1.0 leaves the samples as they are. Not clipped here (a caller of the float API gets the
    gain as asked): every 16-bit output, files, streams and HTTP answers, clips to [-1, 1] in
    audio_formats.to_pcm16, as piper clips before its int16."""
    if volume == 1.0:
        return samples
    gained: np.ndarray = samples * np.float32(volume)
    return gained


def remove_silence(
    audio: np.ndarray, sample_rate: int, mid_sil: int, lead_sil: int, trail_sil: int, rules: dict[str, Any]
) -> np.ndarray:
    """Upstream utils/audio.remove_silence on mono [1, T] audio -> float32 [1, T'] (see _silence.py):
    silences over mid_sil ms (rules' -50 dBFS) keep mid_sil ms on each side; edges keep
    lead_sil/trail_sil ms."""
    return _silence.remove_silence(
        audio,
        sample_rate,
        mid_sil,
        lead_sil,
        trail_sil,
        silence_thresh=rules["silence_thresh_dbfs"],
        seek_step=rules["seek_step_ms"],
        leading_chunk=rules["leading_chunk_ms"],
    )


def _fade_and_pad(audio: np.ndarray, pad_duration: float, fade_duration: float, sample_rate: int) -> np.ndarray:
    """upstream utils/audio.fade_and_pad_audio: linear fades of k = min(int(fade_duration * rate),
    T // 2) samples at both ends, then int(pad_duration * rate) zeros on each side; empty audio
    unchanged. Gains (np.linspace, float64 then rounded once): fade-in g[i] = f32(i / (k - 1)),
    fade-out the exact mirror g[k - 1 - i] (not 1 - g[i]); k = 1 gives [0] in and [1] out.
    Each sample is multiplied by its gain in float32 (docs/runtime.md, tests/test_runtime_formulas.py)."""
    if audio.shape[-1] == 0:
        return audio
    fade_samples = int(fade_duration * sample_rate)
    pad_samples = int(pad_duration * sample_rate)
    processed: np.ndarray = audio.copy()
    if fade_samples > 0:
        k = min(fade_samples, processed.shape[-1] // 2)
        if k > 0:
            # np.linspace computes i * (stop - start) / (k - 1) + start in float64, then rounds
            processed[..., :k] *= np.linspace(0, 1, k, dtype=np.float32)[np.newaxis, :]
            processed[..., -k:] *= np.linspace(1, 0, k, dtype=np.float32)[np.newaxis, :]
    if pad_samples > 0:
        silence = np.zeros((processed.shape[0], pad_samples), dtype=processed.dtype)
        processed = np.concatenate([silence, processed, silence], axis=-1)
    return processed


def _read_file(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """upstream load_waveform's soundfile branch: float32 [C, T] and the file's rate."""
    try:
        data, rate = sf.read(path, dtype="float32", always_2d=True)
    except sf.LibsndfileError as exc:
        raise UserError(
            f"cannot read {os.fspath(path)} as audio ({exc})",
            "convert it to WAV or FLAC (soundfile/libsndfile reads those)",
        ) from exc
    return _checked_array(data.T), rate  # (T, C) -> (C, T), a transposed view as upstream's


def _checked_array(waveform: object) -> np.ndarray:
    """The waveform as a float32/float64 array of 1 or 2 dims, non-empty and finite; UserError otherwise."""
    array = np.asarray(waveform)
    fix = "pass float32 or float64 samples in [-1, 1], shaped [T] or [channels, T]"
    if array.dtype not in (np.float32, np.float64):
        raise UserError(f"reference audio samples are {array.dtype}", fix)
    if array.ndim not in (1, 2):
        raise UserError(f"reference audio has {array.ndim} dimensions {array.shape}", fix)
    if array.size == 0:
        raise UserError("reference audio holds no samples", fix)
    if array.ndim == 2 and array.shape[0] > array.shape[1]:
        raise UserError(f"reference audio shaped {array.shape} has more channels than samples", fix)
    if not np.isfinite(array).all():
        raise UserError("reference audio holds NaN or infinite samples", fix)
    return array


def _checked_rate(rate: object) -> int:
    """A positive whole sample rate as int (upstream accepts 16000.0 too); UserError otherwise."""
    if (
        isinstance(rate, bool)
        or not isinstance(rate, numbers.Real)
        or not math.isfinite(rate)
        or rate <= 0
        or not float(rate).is_integer()
    ):
        raise UserError(
            f"reference sample rate {rate!r} is not a positive whole number of Hz",
            "pass the rate as an int, e.g. 16000",
        )
    # int() of a Real that is not Integral needs its __int__, which numbers.Real does not promise
    return int(rate) if isinstance(rate, numbers.Integral) else int(float(rate))


class StreamAssembler:
    """cross_fade_chunks + post_process applied to chunks as they come (OmniVoiceOnnx.stream).

    add(chunk [1, T], index, count) returns the samples that can be played now. The result,
    concatenated, is what post_process(cross_fade_chunks(chunks)) gives, with two exceptions that
    a stream cannot avoid, both of a function of the whole output (the facts: upstream's
    post-processing is global):
    - without a reference, upstream sets the whole output's peak to peak_level; a stream cannot
      wait for the last chunk, so the gain is fixed from chunk 0's peak and kept for every chunk
      (no loudness jump between chunks). The stream is then generate()'s audio times
      peak(all) / peak(chunk 0) >= 1: louder by that one factor, clipped only where a later chunk's
      peak exceeds 1 / gain (twice chunk 0's peak, since peak_level is 0.5). With a reference the
      gain is fixed (ref_rms / target_rms) and this difference does not exist.
    - with postprocess_output, long pauses are shortened per chunk (each chunk's edges keep
      lead/trail 100 ms), not over the joined output: a pause that spans a chunk boundary is
      100 ms + 100 ms of cross-fade silence + 100 ms instead of whatever the whole-output rule
      leaves (at most 500 ms kept as is, longer ones cut to 200 ms). Inside chunks it is the same.
    With postprocess_output=False and a reference, the stream equals generate() sample for sample;
    with a pause (pause_s > 0: join_chunks removes silence per chunk too), also with postprocess_output.
    The pause (pause_samples zeros) and the volume (apply_volume) are join_chunks'.
    The samples a later step may still change are held back: the cross-fade's fade-out
    (rules["cross_fade_silence_s"] / 3) and the final fade-out (fade_duration) at the end of what has come
    so far, and everything until the output is long enough (2 x fade_duration) for the opening
    fade to have its full length.
    """

    def __init__(
        self,
        sample_rate: int,
        rules: dict[str, Any],
        ref_rms: float | None,
        postprocess_output: bool,
        pad_duration: float,
        fade_duration: float,
        *,
        pause_s: float = DEFAULT_SENTENCE_SILENCE_S,
        volume: float = DEFAULT_VOLUME,
    ) -> None:
        self.sample_rate, self.rules, self.ref_rms = sample_rate, rules, ref_rms
        self.postprocess_output = postprocess_output
        self.fade_n = int(rules["cross_fade_silence_s"] * sample_rate) // 3  # cross_fade_chunks' fade and silence
        self.silence_n = self.fade_n + pause_samples(pause_s, sample_rate)  # the zeros at each boundary
        self.volume = volume
        self.edge_n = int(fade_duration * sample_rate)  # _fade_and_pad's fades
        self.pad_n = int(pad_duration * sample_rate)
        self.pending = np.zeros((1, 0), dtype=np.float32)  # joined, not yet played (before level and fades)
        self.played = 0  # samples of the joined output already returned
        self.peak: np.floating | None = None  # the level's peak, fixed from chunk 0 (no reference)

    def add(self, chunk: np.ndarray, index: int, count: int) -> np.ndarray:
        """One decoded chunk [1, T] (chunk `index` of `count`) -> float32 [n] samples to play now."""
        if self.postprocess_output:
            mid, lead, trail = self.rules["output_silence_ms"]
            chunk = remove_silence(chunk, self.sample_rate, mid, lead, trail, self.rules)
        if index == 0:
            self.peak = peak_of(chunk)
            joined = chunk.copy()
        else:  # cross_fade_chunks: fade out what came before, silence, fade the chunk in
            joined = self.pending.copy()
            fout_n = min(self.fade_n, self.played + joined.shape[-1])
            joined[..., -fout_n:] *= np.linspace(1, 0, fout_n, dtype=np.float32)[np.newaxis, :]
            fade_in = chunk.copy()
            fin_n = min(self.fade_n, fade_in.shape[-1])
            if fin_n > 0:
                fade_in[..., :fin_n] *= np.linspace(0, 1, fin_n, dtype=np.float32)[np.newaxis, :]
            joined = np.concatenate([joined, np.zeros((1, self.silence_n), np.float32), fade_in], axis=-1)
        total = self.played + joined.shape[-1]
        last = index == count - 1
        if last:
            ready = joined.shape[-1]
        elif total < 2 * self.edge_n:
            ready = 0
        else:
            ready = max(0, joined.shape[-1] - max(self.fade_n, self.edge_n))
        out = level(joined[:, :ready], self.ref_rms, self.peak, self.rules)
        out = self._edge_fades(out, total if last else None)
        self.pending = joined[:, ready:]
        start = self.played == 0
        self.played += ready
        if self.pad_n > 0 and (start or last) and total > 0:
            pad = np.zeros((1, self.pad_n), dtype=np.float32)
            out = np.concatenate(([pad] if start and ready else []) + [out] + ([pad] if last else []), axis=-1)
        samples: npt.NDArray[np.float32] = apply_volume(out[0].astype(np.float32, copy=False), self.volume)
        return samples

    def _edge_fades(self, out: np.ndarray, total: int | None) -> np.ndarray:
        """_fade_and_pad's fades on the piece [played, played + n) of the joined output; `total`
        (known at the last chunk) places the closing fade."""
        if self.edge_n <= 0 or out.shape[-1] == 0:
            return out
        out = out.copy()
        begin, end = self.played, self.played + out.shape[-1]
        # k as _fade_and_pad takes it: min(fade, T // 2); before the end, T >= 2 * fade is ensured (add)
        k = min(self.edge_n, total // 2) if total is not None else self.edge_n
        if k > 0 and begin < k:
            out[..., : k - begin] *= np.linspace(0, 1, k, dtype=np.float32)[np.newaxis, begin : min(k, end)]
        if total is not None and k > 0:
            first = max(begin, total - k)
            out[..., first - begin :] *= np.linspace(1, 0, k, dtype=np.float32)[np.newaxis, first - (total - k) :]
        return out
