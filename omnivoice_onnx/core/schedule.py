"""How many cells each step unmasks: `omnivoice.models.omnivoice._get_time_steps` and the
per-item schedule built inline in `OmniVoice._generate_iterative`.

Upstream:
    timesteps = torch.linspace(0.0, 1.0, num_step + 1)                    # float32
    timesteps = t_shift * timesteps / (1 + (t_shift - 1) * timesteps)     # float32 tensor ops
    timesteps = timesteps.tolist()                                        # float32 values as Python floats
    num[step] = min(ceil(total * (timesteps[step + 1] - timesteps[step])), rem)   # Python float64
    num[last] = rem                                                       # the last step takes the rest

Subtle points (tests/test_runtime_scoring.py compares against the real `_get_time_steps` and the
upstream loop for every num_step in 1..256 and many t_shift values):
- torch's float32 linspace computes `step = (end - start) / (steps - 1)` in float32, then
  `start + step * i` for i < steps // 2 and `end - step * (steps - 1 - i)` above. In torch's
  AVX2/AVX512 CPU kernels (every x86-64 CPU of the last decade) the compiler fused each of these
  into ONE fused multiply-add, rounded once; only torch's DEFAULT (no-AVX2) kernel rounds the
  product first (it gives other values for 230 of num_step = 1..256). `fma_f32` reproduces the
  fused rounding exactly with rational arithmetic.
- The shift is three float32 tensor ops, each rounded: `float32(t_shift) * t`, then
  `1 + float32(t_shift - 1) * t` (the scalar `t_shift - 1` is formed in float64 first, then
  rounded to float32), then the division.
- The difference of consecutive timesteps and the product with the cell count are float64
  (Python floats); `math.ceil` of that.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

F32 = np.float32


def round_to_f32(value: Fraction) -> np.float32:
    """The float32 nearest to the exact rational `value` (ties to even mantissa).

    Converting through float64 could round twice; the three float32 candidates around the
    float64 approximation are compared exactly instead.
    """
    guess = F32(float(value))
    candidates = (np.nextafter(guess, F32(-np.inf)), guess, np.nextafter(guess, F32(np.inf)))
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - value), int(np.array(c).view(np.uint32)) & 1))


def fma_f32(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    """a * b + c computed exactly and rounded once to float32, as a fused multiply-add does."""
    return round_to_f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


def linspace_f32(start: float, end: float, steps: int) -> np.ndarray:
    """`torch.linspace(start, end, steps)` (float32) as torch's AVX2/AVX512 CPU kernel computes it."""
    start32, end32 = F32(start), F32(end)
    if steps == 1:
        return np.array([start32], dtype=F32)
    step = F32(end32 - start32) / F32(steps - 1)
    halfway = steps // 2
    return np.array(
        [
            fma_f32(step, F32(i), start32) if i < halfway else fma_f32(-step, F32(steps - 1 - i), end32)
            for i in range(steps)
        ],
        dtype=F32,
    )


def time_steps(num_step: int, t_shift: float) -> list[float]:
    """`_get_time_steps(0.0, 1.0, num_step, t_shift).tolist()`: num_step + 1 shifted times from
    0 to 1 (float32 values, returned as Python floats as upstream's `.tolist()` does)."""
    t = linspace_f32(0.0, 1.0, num_step + 1)
    shifted = (F32(t_shift) * t) / (F32(1.0) + F32(t_shift - 1) * t)
    return [float(v) for v in shifted]


def unmask_schedule(target_len: int, num_codebooks: int, num_step: int, t_shift: float) -> list[int]:
    """Cells unmasked at each step for one item of `target_len` frames; they sum to
    target_len * num_codebooks (the last step takes whatever is left)."""
    timesteps = time_steps(num_step, t_shift)
    total = target_len * num_codebooks
    remaining, schedule = total, []
    for step in range(num_step):
        if step == num_step - 1:
            count = remaining
        else:
            count = min(math.ceil(total * (timesteps[step + 1] - timesteps[step])), remaining)
        schedule.append(int(count))
        remaining -= int(count)
    return schedule
