"""torch's CPU random generator reproduced bit for bit: `torch.manual_seed(seed)` then
`torch.rand(shape)` / `torch.rand_like(float32 tensor)`.

Upstream's only random draws are `omnivoice.models.omnivoice._gumbel_sample`'s
`torch.rand_like(scaled_logits)` (float32, CPU). What torch 2.13 does, measured against it
(tests/test_runtime_rng.py):

- `torch.manual_seed(seed)` accepts -2**63 <= seed < 2**64; a negative seed is read as its 64-bit
  two's complement (-1 -> 2**64 - 1). The CPU generator is MT19937 (`at::mt19937`) initialised by
  the reference `init_genrand` with the LOW 32 BITS of that value: seeds s and s + 2**32 give the
  same stream.
- Its state after seeding is the reference one: 624 words, and the first draw regenerates
  ("twists") all of them. numpy's `MT19937` bit generator, given that state, yields the same raw
  32-bit words (`random_raw`), so the twist and tempering are numpy's and only the seeding is
  written here.
- A float32 uniform draw (`uniform_real_distribution<float>`, a serial CPU kernel for every size
  and shape) takes ONE 32-bit word w and returns `(w & 0xFFFFFF) * 2**-24`, in the tensor's
  C-contiguous element order. Exact in float32: a 24-bit integer times a power of two.

A float64 draw would take two words; upstream never makes one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MT_N = 624  # MT19937 state words
MT_INIT_MULTIPLIER = 1812433253  # Knuth's multiplier in the reference init_genrand
FLOAT32_MANTISSA_BITS = 24  # torch keeps the low 24 bits of a word for a float32 draw


def init_genrand(seed: int) -> np.ndarray:
    """The MT19937 state torch.manual_seed(seed) leaves: the reference init_genrand of the seed's
    low 32 bits (after reading a negative seed as 64-bit two's complement). uint32[624].
    `seed` is trusted: request.validate checked it once (limits.check_seed), before any model work."""
    word = int(seed) % 2**64 & 0xFFFFFFFF
    state = [word]
    for i in range(1, MT_N):
        word = (MT_INIT_MULTIPLIER * (word ^ (word >> 30)) + i) & 0xFFFFFFFF
        state.append(word)
    return np.array(state, dtype=np.uint32)


class TorchCpuRng:
    """torch's default CPU generator after `torch.manual_seed(seed)`, for float32 `rand` draws.

    Every draw consumes one 32-bit MT19937 word per element, so the stream position after a
    sequence of draws is the total element count drawn so far (`words_drawn`).
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)  # trusted: checked once, by request.validate (limits.check_seed)
        self._mt = np.random.MT19937()
        # pos 624: the next word triggers a full twist, as after the reference init_genrand.
        self._mt.state = {"bit_generator": "MT19937", "state": {"key": init_genrand(self.seed), "pos": MT_N}}
        self.words_drawn = 0

    def words(self, count: int) -> np.ndarray:
        """The next `count` raw 32-bit words of the stream, uint32."""
        self.words_drawn += count
        return self._mt.random_raw(count).astype(np.uint32)

    def rand(self, shape: Sequence[int] | int) -> np.ndarray:
        """float32 uniforms in [0, 1) of `shape`, equal to `torch.rand(shape)` (and to
        `torch.rand_like(t)` for a float32 tensor t of that shape) at this stream position."""
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        low_bits = self.words(math.prod(shape)) & ((1 << FLOAT32_MANTISSA_BITS) - 1)
        return (low_bits.astype(np.float32) * np.float32(2.0**-FLOAT32_MANTISSA_BITS)).reshape(shape)


def fresh_seed() -> int:
    """A random seed for `seed=None`, in [0, 2**32): the generator reads only the low 32 bits, so
    a wider seed would add nothing. Reported back so the run can be repeated."""
    return int(np.random.SeedSequence().generate_state(1, np.uint32)[0])
