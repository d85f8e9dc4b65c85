"""Band-limited resampling equal to `torchaudio.functional.resample` with its defaults.

Reproduces torchaudio 2.11 `torchaudio/functional/functional.py`: `resample`,
`_get_sinc_resample_kernel` and `_apply_sinc_resample_kernel` (resampling_method
"sinc_interp_hann", lowpass_filter_width 6, rolloff 0.99), which upstream `omnivoice/utils/audio.py:
load_audio` and `OmniVoice.create_voice_clone_prompt` call on the reference audio.

The subtle points, in the order torchaudio meets them:
- Rates are reduced by their gcd first (44100 -> 24000 is 147 -> 80); the filter has one row per
  output phase (`new` rows) and is slid over the input with stride `orig`.
- The kernel is computed in the waveform's own dtype: float32 for audio read from a file, float64
  for a float64 array. Every arithmetic step below follows torchaudio's order and dtype (python
  floats are rounded to the array dtype before each operation, as torch does with scalars), so the
  kernel's arguments are bit-identical. Only sin/cos differ: torch evaluates them with SLEEF's
  vector code; here each is the C library's double-precision sin/cos of the (exact) argument,
  rounded to the dtype. Any double sin/cos within 1 ULP rounds to the same float32 except with
  probability ~2**-28 per tap, and tests/test_runtime_audio.py checks the kernels of the common
  rates against correctly rounded values (mpmath). numpy's own sin/cos is not used: its SIMD
  dispatch (SVML-like code on AVX-512) makes another double than libm on other CPUs.
- The input is zero-padded by `width` on the left and `width + orig` on the right; frames start
  every `orig` samples; each frame yields `new` output samples (phase-major), and the result is cut
  to ceil(new * length / orig) samples (an integer ceil-division here; torchaudio's float division
  gives the same integer for any length below 2**53 / new).
- Each output sample is a dot product of a frame with one filter row, summed here in a fixed
  order that any language reproduces bit for bit: acc = 0, then for k = 0 .. taps-1
  acc = round(acc + round(x[k] * h[k])), every operation rounded to the dtype (no fused
  multiply-add). A BLAS product (what the first runtime used) sums in an order of its own that
  changes with the CPU's kernels and threads, and torch's conv1d in yet another one, so the result
  differs from torchaudio by float rounding only: at most a derived bound (the test's), measured
  ~1e-6 on noise in [-1, 1].
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from omnivoice_onnx.errors import UserError

# torchaudio's defaults, lowpass_filter_width 6 (zero crossings of the sinc kept on each side) and
# rolloff 0.99 (the cut-off as a fraction of the lower rate's Nyquist frequency), are the export's
# runtime-config.json audio.resample section, passed in by audio.load_reference.
# The filter bank has new x (2 * width + orig) taps for gcd-reduced rates: 80 x 171 for 44.1 kHz
# -> 24 kHz, but 24000 x 24015 (2.3 GB in float32) for 24001 Hz. Rates that need more are refused.
MAX_KERNEL_TAPS = 2**22


def kernel_width(orig: int, new: int, lowpass_filter_width: int, rolloff: float) -> int:
    """The filter's half-width in input samples, for gcd-reduced rates."""
    return math.ceil(lowpass_filter_width * orig / (min(orig, new) * rolloff))


def sinc_kernel(
    orig: int, new: int, dtype: type[np.floating], lowpass_filter_width: int, rolloff: float
) -> tuple[np.ndarray, int]:
    """The filter bank [new, 2*width + orig] and `width`, for gcd-reduced rates `orig` -> `new`."""
    base_freq = min(orig, new) * rolloff
    width = kernel_width(orig, new, lowpass_filter_width, rolloff)
    idx = np.arange(-width, width + orig, dtype=dtype)[np.newaxis, :] / dtype(orig)
    t = np.arange(0, -new, -1, dtype=dtype)[:, np.newaxis] / dtype(new) + idx
    t = np.clip(t * dtype(base_freq), -lowpass_filter_width, lowpass_filter_width).astype(dtype)
    window_arg = t * dtype(math.pi) / dtype(lowpass_filter_width) / dtype(2)
    window = _libm(math.cos, window_arg).astype(dtype) ** 2
    t = t * dtype(math.pi)
    with np.errstate(divide="ignore", invalid="ignore"):  # t == 0 is replaced by 1 just below
        sinc = _libm(math.sin, t).astype(dtype) / t
    kernel = np.where(t == 0, dtype(1.0), sinc)
    return kernel * (window * dtype(base_freq / orig)), width


def _libm(function: Callable[[float], float], values: np.ndarray) -> np.ndarray:
    """`function` (math.sin / math.cos: the C library's double precision) of every value, float64."""
    flat = [function(value) for value in values.astype(np.float64).ravel().tolist()]
    return np.array(flat, dtype=np.float64).reshape(values.shape)


def dot_sequential(frames: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """out[..., p] = sum over k of frames[..., k] * kernel[p, k], in the documented order: acc = 0,
    then acc = round(acc + round(x_k * h_k)) for k = 0, 1, ..., every operation in the dtype."""
    out = np.zeros(frames.shape[:-1] + (kernel.shape[0],), dtype=kernel.dtype)
    for k in range(kernel.shape[1]):
        out += frames[..., k, np.newaxis] * kernel[:, k]
    return out


def resample(
    waveform: np.ndarray, orig_freq: int, new_freq: int, lowpass_filter_width: int, rolloff: float
) -> np.ndarray:
    """[C, T] float32/float64 at `orig_freq` -> [C, ceil(T * new / orig)] at `new_freq`, same dtype."""
    if orig_freq == new_freq:
        return waveform
    gcd = math.gcd(orig_freq, new_freq)
    orig, new = orig_freq // gcd, new_freq // gcd
    taps = new * (2 * kernel_width(orig, new, lowpass_filter_width, rolloff) + orig)
    if taps > MAX_KERNEL_TAPS:
        raise UserError(
            f"resampling {orig_freq} Hz to {new_freq} Hz needs a {taps}-tap filter bank (rates with a "
            f"large ratio after reduction by their gcd {gcd})",
            "resample the reference to a common rate (16000, 22050, 24000, 44100 or 48000 Hz) first",
        )
    dtype = waveform.dtype.type
    kernel, width = sinc_kernel(orig, new, dtype, lowpass_filter_width, rolloff)
    length = waveform.shape[-1]
    padded = np.pad(waveform, ((0, 0), (width, width + orig)))
    # frames[c, j, :] = padded[c, j*orig : j*orig + kernel width], j = 0 .. length // orig
    frames = np.lib.stride_tricks.sliding_window_view(padded, kernel.shape[-1], axis=-1)[:, ::orig]
    resampled = dot_sequential(frames, kernel).reshape(waveform.shape[0], -1)
    target_length = -(-new * length // orig)
    return np.ascontiguousarray(resampled[:, :target_length])
