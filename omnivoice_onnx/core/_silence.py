"""Silence removal equal to upstream's, which runs on pydub (0.25.1) AudioSegments.

Reproduces `omnivoice/utils/audio.py`: `remove_silence`, `remove_silence_edges`,
`numpy_to_audiosegment`, `audiosegment_to_numpy`, and the pydub code they run:
`pydub/silence.py` `split_on_silence`, `detect_nonsilent`, `detect_silence`,
`detect_leading_silence`, and `pydub/audio_segment.py` `AudioSegment.__getitem__`, `__len__`,
`rms`, `dBFS`, `reverse`, `__add__` (with CPython 3.11's `audioop.rms`).

The arithmetic a port must copy exactly (everything here is integer or float64 scalar math, so
the result is bit-identical to upstream's):
- float -> int16: `(x * 32768.0).clip(-32768, 32767).astype(int16)`, truncation toward zero
  (0.99999 -> 32767, -0.00002 -> 0); back: `int16 / 32768.0` in float32. The output of
  remove_silence therefore always lies on the int16 grid.
- pydub addresses audio in whole milliseconds. A segment's length is
  `round(1000 * (frames / rate))` ms (the division first, then Python's round: half to even);
  a position of `ms` is frame
  `int(ms * (rate / 1000.0))` (float64, truncated).
- Slicing `seg[a:b]` first clamps a and b to the length in ms. When the clamped end maps past the
  last real frame (the length was rounded up), pydub appends zero frames to make up the count,
  but only if the slice holds at least one real frame. So `seg[start:]` can be a few samples
  LONGER than the audio it came from, and the padded zeros count in an rms.
- rms (audioop.rms): `floor(sqrt(sum(s*s) / n))` with the sum in float64 (exact for int16 squares
  under 2**53) over all n samples, 0 for an empty slice: an integer.
- detect_silence: a window is silent when `rms <= 10 ** (-50 / 20) * 32768.0` (= 103.6, so
  rms <= 103). Windows of `min_silence_len` ms start every `seek_step` ms, plus one at the very
  end if the steps miss it; silent windows that overlap or touch merge into ranges.
- detect_leading_silence: 10-ms chunks, a chunk is silent when its dBFS
  `20 * log(rms / 32768, 10)` (-inf for rms 0) is < -50, i.e. also rms <= 103.
- split_on_silence keeps `keep_silence` ms around each non-silent range; where two kept ranges
  overlap, both end/start at the floor-midpoint `(end + start) // 2`.
- Joining the pieces (`AudioSegment.silent(duration=0) + piece + ...`) syncs them to
  max(11025, rate) Hz; below 11025 Hz pydub would resample with audioop.ratecv, which is not
  reproduced here (the runtime only runs at 24 kHz), so such rates are refused.
"""

from __future__ import annotations

import math

import numpy as np

# The threshold (-50 dBFS), seek step (10 ms) and leading-silence chunk (10 ms) are the export's
# runtime-config.json audio section, passed in by audio.remove_silence. What stays here is pydub's
# own arithmetic: the int16 scale and the rate pieces are joined at.
INT16_SCALE = 32768.0  # full scale of int16 audio; also pydub's max_possible_amplitude
PYDUB_JOIN_RATE = 11025  # AudioSegment.silent()'s frame rate, which `+` syncs every piece up to


class Int16Segment:
    """A mono pydub AudioSegment reduced to what upstream uses: int16 samples addressed in ms."""

    def __init__(self, samples: np.ndarray, rate: int) -> None:
        self.samples = samples
        self.rate = rate
        # prefix sums of squares: the sum over any slice is exact in int64
        self._sum_squares = np.concatenate([[0], np.cumsum(samples.astype(np.int64) ** 2)])

    def __len__(self) -> int:
        """Length in ms, pydub's `round(1000 * (frames / rate))` (round half to even)."""
        return round(1000 * (len(self.samples) / self.rate))

    def _frame(self, ms: int) -> int:
        """pydub's `_parse_position` for a non-negative ms: `int(ms * (rate / 1000.0))`."""
        return int(ms * (self.rate / 1000.0))

    def _span(self, start_ms: int, end_ms: int) -> tuple[int, int, int]:
        """(first real frame, end real frame, zero frames appended) of pydub's `seg[start_ms:end_ms]`."""
        length = len(self)
        start, end = self._frame(min(start_ms, length)), self._frame(min(end_ms, length))
        real_start, real_end = min(start, len(self.samples)), min(end, len(self.samples))
        real = max(real_end - real_start, 0)
        # pydub builds the padding from the slice's first frame: an empty slice gets none.
        padding = (end - start) - real if real > 0 else 0
        return real_start, real_start + real, max(padding, 0)

    def slice(self, start_ms: int, end_ms: int) -> Int16Segment:
        """pydub's `seg[start_ms:end_ms]` for non-negative ms, zero-padded as pydub pads."""
        first, last, padding = self._span(start_ms, end_ms)
        samples = self.samples[first:last]
        if padding:
            samples = np.concatenate([samples, np.zeros(padding, dtype=np.int16)])
        return Int16Segment(samples, self.rate)

    def rms(self, start_ms: int, end_ms: int) -> int:
        """audioop.rms of `seg[start_ms:end_ms]`: floor(sqrt(sum of squares / samples))."""
        first, last, padding = self._span(start_ms, end_ms)
        count = last - first + padding
        if count == 0:
            return 0
        return int(math.sqrt(int(self._sum_squares[last] - self._sum_squares[first]) / count))

    def reverse(self) -> Int16Segment:
        return Int16Segment(self.samples[::-1].copy(), self.rate)


def detect_silence(seg: Int16Segment, min_silence_len: int, silence_thresh: float, seek_step: int) -> list[list[int]]:
    """pydub.silence.detect_silence: silent [start_ms, end_ms] ranges."""
    seg_len = len(seg)
    if seg_len < min_silence_len:
        return []
    max_silent_rms = 10 ** (silence_thresh / 20) * INT16_SCALE
    last_slice_start = seg_len - min_silence_len
    slice_starts = list(range(0, last_slice_start + 1, seek_step))
    if last_slice_start % seek_step:
        slice_starts.append(last_slice_start)
    silence_starts = [i for i in slice_starts if seg.rms(i, i + min_silence_len) <= max_silent_rms]
    if not silence_starts:
        return []

    silent_ranges = []
    prev_i = current_range_start = silence_starts[0]
    for silence_start_i in silence_starts[1:]:
        continuous = silence_start_i == prev_i + seek_step
        # two overlapping silent windows merge even when a blip makes the one between them loud
        silence_has_gap = silence_start_i > prev_i + min_silence_len
        if not continuous and silence_has_gap:
            silent_ranges.append([current_range_start, prev_i + min_silence_len])
            current_range_start = silence_start_i
        prev_i = silence_start_i
    silent_ranges.append([current_range_start, prev_i + min_silence_len])
    return silent_ranges


def detect_nonsilent(seg: Int16Segment, min_silence_len: int, silence_thresh: float, seek_step: int) -> list[list[int]]:
    """pydub.silence.detect_nonsilent: the [start_ms, end_ms] ranges between the silent ones."""
    silent_ranges = detect_silence(seg, min_silence_len, silence_thresh, seek_step)
    seg_len = len(seg)
    if not silent_ranges:
        return [[0, seg_len]]
    if silent_ranges[0][0] == 0 and silent_ranges[0][1] == seg_len:
        return []
    nonsilent_ranges = []
    prev_end_i = 0
    for start_i, end_i in silent_ranges:
        nonsilent_ranges.append([prev_end_i, start_i])
        prev_end_i = end_i
    if silent_ranges[-1][1] != seg_len:
        nonsilent_ranges.append([prev_end_i, seg_len])
    if nonsilent_ranges[0] == [0, 0]:
        nonsilent_ranges.pop(0)
    return nonsilent_ranges


def split_on_silence(
    seg: Int16Segment, min_silence_len: int, silence_thresh: float, keep_silence: int, seek_step: int
) -> list[Int16Segment]:
    """pydub.silence.split_on_silence with an integer keep_silence (ms kept on each side)."""
    output_ranges = [
        [start - keep_silence, end + keep_silence]
        for start, end in detect_nonsilent(seg, min_silence_len, silence_thresh, seek_step)
    ]
    for range_i, range_ii in zip(output_ranges, output_ranges[1:]):
        if range_ii[0] < range_i[1]:
            range_i[1] = (range_i[1] + range_ii[0]) // 2
            range_ii[0] = range_i[1]
    return [seg.slice(max(start, 0), min(end, len(seg))) for start, end in output_ranges]


def detect_leading_silence(seg: Int16Segment, silence_threshold: float, chunk_ms: int) -> int:
    """pydub.silence.detect_leading_silence (chunk_ms-ms chunks): the ms where the leading silence ends."""
    trim_ms = 0
    while _dbfs(seg.rms(trim_ms, trim_ms + chunk_ms)) < silence_threshold and trim_ms < len(seg):
        trim_ms += chunk_ms
    return min(trim_ms, len(seg))


def _dbfs(rms: int) -> float:
    """pydub's AudioSegment.dBFS for an int16 rms: 20 * log10(rms / 32768), -inf for 0."""
    if not rms:
        return -math.inf
    return 20 * math.log(rms / INT16_SCALE, 10)


def remove_silence_edges(
    seg: Int16Segment, lead_sil: int, trail_sil: int, silence_threshold: float, chunk_ms: int
) -> Int16Segment:
    """upstream remove_silence_edges: keep at most lead_sil / trail_sil ms of edge silence.

    start = max(0, leading_silence_ms - lead_sil); seg = seg[start:] reversed; the same with
    trail_sil on the reversed segment; reversed back. (pydub's slicing rules: Int16Segment.slice.)
    """
    start_ms = max(0, detect_leading_silence(seg, silence_threshold, chunk_ms) - lead_sil)
    seg = seg.slice(start_ms, len(seg)).reverse()
    start_ms = max(0, detect_leading_silence(seg, silence_threshold, chunk_ms) - trail_sil)
    return seg.slice(start_ms, len(seg)).reverse()


def to_int16(audio: np.ndarray) -> np.ndarray:
    """upstream numpy_to_audiosegment's quantisation of one channel (truncation toward zero)."""
    return (audio * INT16_SCALE).clip(-32768, 32767).astype(np.int16)


def remove_silence(
    audio: np.ndarray,
    sample_rate: int,
    mid_sil: int,
    lead_sil: int,
    trail_sil: int,
    *,
    silence_thresh: float,
    seek_step: int,
    leading_chunk: int,
) -> np.ndarray:
    """upstream remove_silence on mono audio: float [1, T] -> float32 [1, T'] on the int16 grid.

    Silences longer than mid_sil ms (at silence_thresh dBFS, windows every seek_step ms) shrink to
    at most mid_sil ms on each side of the speech around them (0 skips this), then the edges keep
    lead_sil / trail_sil ms of silence (leading_chunk-ms chunks).
    """
    if audio.ndim != 2 or audio.shape[0] != 1:
        raise ValueError(f"remove_silence takes mono audio [1, T], got shape {audio.shape}")
    if mid_sil > 0 and sample_rate < PYDUB_JOIN_RATE:
        raise ValueError(
            f"remove_silence needs a sample rate >= {PYDUB_JOIN_RATE} Hz (pydub resamples below it), got {sample_rate}"
        )
    seg = Int16Segment(to_int16(audio[0]), sample_rate)
    if mid_sil > 0:
        pieces = split_on_silence(seg, mid_sil, silence_thresh, keep_silence=mid_sil, seek_step=seek_step)
        joined = [piece.samples for piece in pieces]
        seg = Int16Segment(np.concatenate(joined) if joined else np.zeros(0, np.int16), sample_rate)
    seg = remove_silence_edges(seg, lead_sil, trail_sil, silence_thresh, leading_chunk)
    return (seg.samples.astype(np.float32) / INT16_SCALE)[np.newaxis, :]
