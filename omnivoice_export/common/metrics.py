"""Parity metrics, one per component with its reason (thresholds: omnivoice_onnx.contract.THRESHOLDS).

- transformer: argmax agreement and logit max-abs over the rows generate() reads, on captured
  real inputs. Argmax is what unmasking consumes; max-abs bounds how far log-softmax, CFG and
  the confidence ranking can move. Where argmax disagrees, the reference's own top-1/top-2
  margin tells a near-tie flip from a real error.
- encoder: exact integer code-match rate; codes are discrete, so "close" means nothing.
- decoder: log-spectral L1. The codec is GAN-trained and phase is not unique, so waveform SNR
  punishes harmless phase differences; the log-magnitude spectrum is what a listener hears.

Random ids/codes are never used: they are out of distribution and hide real failures.

Each metric refuses (ValueError) arrays of different shapes, which numpy would broadcast into a
meaningless figure, and empty arrays, on which agreement would be a vacuous 1.0: a comparison of
nothing must never read as a PASS.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Log-spectral L1 parameters (stated in every report that uses it).
STFT_N_FFT = 1024
STFT_HOP = 256
SPECTRAL_FLOOR = 1e-5  # magnitudes below this are clamped before log10 (silence is not compared at -inf)


@dataclass
class LogitStats:
    """Transformer parity over a set of rows [N, V]."""

    rows: int
    argmax_agreement: float
    max_abs: float
    mean_abs: float
    flips: int
    flip_margin_min: float | None  # reference top1 - top2 at disagreeing rows (None: no flips)
    flip_margin_max: float | None

    def passed(self, argmax_min: float, max_abs: float) -> bool:
        return self.argmax_agreement >= argmax_min and self.max_abs <= max_abs


def _comparable(reference: np.ndarray, candidate: np.ndarray, what: str) -> None:
    """ValueError unless both arrays have one shape and hold something."""
    if np.shape(reference) != np.shape(candidate):
        raise ValueError(
            f"{what}: reference {list(np.shape(reference))} and candidate {list(np.shape(candidate))} differ in shape"
        )
    if np.size(reference) == 0:
        raise ValueError(f"{what}: nothing to compare (empty arrays {list(np.shape(reference))})")


def logit_stats(reference: np.ndarray, candidate: np.ndarray) -> LogitStats:
    """Compare logits [..., V] row by row (reference = PyTorch).

    Differences are taken in float64 (exact for float32 inputs). Argmax runs on the inputs as they
    are (widening to float64 keeps every value, so the order and the first of tied maxima are the
    same), and a flipped row's top-2 margin comes from a partition, not a sort: the same figures,
    at a fraction of the time on a vocabulary of 8 x 1025."""
    _comparable(reference, candidate, "logit_stats")
    ref = reference.reshape(-1, reference.shape[-1])
    got = candidate.reshape(-1, candidate.shape[-1])
    diff = np.abs(ref.astype(np.float64) - got)
    disagree = ref.argmax(-1) != got.argmax(-1)
    margins = None
    if disagree.any():
        top2 = np.partition(ref[disagree].astype(np.float64), -2, axis=-1)[:, -2:]
        margins = top2[:, 1] - top2[:, 0]
    return LogitStats(
        rows=int(ref.shape[0]),
        argmax_agreement=float(1.0 - disagree.mean()),
        max_abs=float(diff.max()),
        mean_abs=float(diff.mean()),
        flips=int(disagree.sum()),
        flip_margin_min=None if margins is None else float(margins.min()),
        flip_margin_max=None if margins is None else float(margins.max()),
    )


def code_match(reference: np.ndarray, candidate: np.ndarray) -> tuple[float, list[float]]:
    """(overall, per-codebook) exact match rate of codes [B, C, T]; a shape mismatch is 0."""
    if reference.shape != candidate.shape:
        return 0.0, [0.0] * reference.shape[1]
    _comparable(reference, candidate, "code_match")
    equal = reference == candidate
    return float(equal.mean()), [float(equal[:, c].mean()) for c in range(equal.shape[1])]


def log_spectrum(audio: np.ndarray) -> np.ndarray:
    """log10 magnitude STFT of a 1-D signal (Hann window, STFT_N_FFT / STFT_HOP, zero-padded ends)."""
    audio = np.asarray(audio, dtype=np.float64).reshape(-1)
    pad = STFT_N_FFT // 2
    padded = np.pad(audio, (pad, pad))
    count = 1 + max(0, (padded.size - STFT_N_FFT) // STFT_HOP)
    index = np.arange(STFT_N_FFT)[None, :] + STFT_HOP * np.arange(count)[:, None]
    frames = padded[index] * np.hanning(STFT_N_FFT)[None, :]
    return np.log10(np.maximum(np.abs(np.fft.rfft(frames, axis=-1)), SPECTRAL_FLOOR))


def log_spectral_l1(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Mean |log10|X| - log10|Y||; signals of different length compare over the shorter one
    (callers report the lengths separately)."""
    length = min(np.asarray(reference).size, np.asarray(candidate).size)
    if length == 0:
        raise ValueError("log_spectral_l1: nothing to compare (an empty signal)")
    return float(
        np.mean(np.abs(log_spectrum(np.ravel(reference)[:length]) - log_spectrum(np.ravel(candidate)[:length])))
    )


def spectral_params() -> dict[str, float | str]:
    return {"n_fft": STFT_N_FFT, "hop": STFT_HOP, "floor": SPECTRAL_FLOOR, "log": "log10", "window": "hann"}
