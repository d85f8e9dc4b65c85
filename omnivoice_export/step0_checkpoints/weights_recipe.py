"""The built checkpoints' weights, from a recipe that gives the same bits on every CPU.

Why: the conformance vectors and every fingerprint-keyed artefact are only portable if `tiny`
(and `full-random`, `tiny-large-act`) are bit-identical wherever they are built. The first builder
was not: torch's `normal_` draws through SLEEF's vectorised log/cos/sin (another result under
`ATEN_CPU_CAPABILITY=default`, i.e. on any CPU without AVX2, aarch64 included), and the codec's
conv scales were calibrated by forward passes through oneDNN/MKL, whose kernels and reduction
order differ between AMD Zen 4 and an Intel Xeon with AMX (log: the 16 DAC tensors that differed).

The recipe touches no CPU-dispatched kernel:
- every random value comes from PCG64 (numpy, plain C integer code) seeded per tensor by
  SeedSequence([seed, sha256(name)]), so a tensor's values depend on its name and the seed only;
- a "normal" value is an Irwin-Hall sum of four 16-bit uniforms taken from one 64-bit word by
  shifts and masks (integers, exact), centred and scaled by one float64 multiply, then rounded to
  float32: integer arithmetic, one correctly rounded IEEE multiply and one conversion, the same
  bits on any IEEE-754 machine whatever the SIMD width (no transcendental function, no reduction);
- data-dependent scales (the codec convs' LSUV-style calibration, tiny-large-act's norm weights)
  are constants in `checkpoint_scales.json`, measured once by `calibration.py` and rounded to
  SCALE_DIGITS significant digits; the build itself runs no forward pass.
Library init still runs when the modules are constructed, but every tensor it filled at random is
overwritten here; a tensor with no rule that is not a constant fill stops the build.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

if TYPE_CHECKING:
    import torch

SCALES_FILE = Path(__file__).with_name("checkpoint_scales.json")
# Calibration scales are stored with this many significant digits: enough to calibrate (the
# targets are +-1 %), few enough that re-measuring on another CPU rounds to the same table.
SCALE_DIGITS = 4
# Irwin-Hall of four uniforms on {0..65535}: mean 2 * 65535, variance 4 * (65536**2 - 1) / 12.
_IRWIN_HALL_CENTRE = 2 * 65535
_IRWIN_HALL_UNIT = math.sqrt(3.0) / 65536.0  # 1 / its standard deviation, to 1e-10 relative
_CHUNK = 1 << 22  # values drawn per block (32 MiB of uint64): bounds the temporaries at full-random


def normal(seed: int, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    """float32 array of `shape`, zero mean, standard deviation `std`, bell-shaped on +-3.46 std.

    Bit-identical on every CPU (module docstring). `std` enters as one float64 multiply of the
    centred integer sum, so the same (seed, name, std) always gives the same bits.
    """
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    bits = np.random.PCG64(np.random.SeedSequence([seed, key]))
    count = math.prod(shape)
    out = np.empty(count, dtype=np.float32)
    unit = _IRWIN_HALL_UNIT * std
    for start in range(0, count, _CHUNK):
        raw = bits.random_raw(min(_CHUNK, count - start))
        total = (raw & 0xFFFF) + ((raw >> 16) & 0xFFFF) + ((raw >> 32) & 0xFFFF) + (raw >> 48)
        out[start : start + raw.size] = (total.astype(np.int64) - _IRWIN_HALL_CENTRE) * unit
    return out.reshape(shape)


def fan_in(shape: tuple[int, ...]) -> int:
    """Inputs per output value of a Linear [out, in] or Conv1d [out, in, k] weight."""
    return math.prod(shape[1:])


# A rule is a std (float), a StdOf callable (name, shape) -> std, or one of these fixed fills.
StdOf = Callable[[str, tuple[int, ...]], float]
ZEROS = "zeros"
ONES = "ones"
Rule = float | str | StdOf


@overload
def load_scales(name: Literal["codec"]) -> dict[str, dict[str, float]]: ...
@overload
def load_scales(name: Literal["residual_norms"]) -> dict[str, list[float]]: ...
def load_scales(name: str) -> dict[str, Any]:
    """One table of checkpoint_scales.json: "codec" ({codec size: {conv weight: scale}}) or
    "residual_norms" ({checkpoint: [scale of each residual norm]})."""
    tables: dict[str, dict[str, Any]] = json.loads(SCALES_FILE.read_text())
    return tables[name]


def round_scale(value: float) -> float:
    """`value` to SCALE_DIGITS significant digits, through its decimal text (what the table stores)."""
    return float(f"{value:.{SCALE_DIGITS - 1}e}")


def draw_all(module: torch.nn.Module, rules: Sequence[tuple[str, Rule]], seed: int, prefix: str = "") -> list[str]:
    """Overwrite every floating tensor of `module`'s state_dict by the first rule whose regex
    matches its name: a std (float) or a callable (name, shape) -> std draws `normal`; ZEROS/ONES
    fill. A tensor no rule matches must already be a constant fill (norm weights, Snake alphas,
    buffers), or the build stops: a library-random tensor would make the build CPU-dependent.
    Returns the names drawn or filled, in state_dict order. `prefix` keeps the two safetensors
    files' names apart in the seeding (the same name in both files draws different values)."""
    import torch

    compiled = [(re.compile(pattern), rule) for pattern, rule in rules]
    assigned = []
    with torch.no_grad():
        for name, tensor in module.state_dict(keep_vars=True).items():
            if not tensor.is_floating_point():
                continue
            rule = next((rule for pattern, rule in compiled if pattern.search(name)), None)
            if rule is None:
                flat = tensor.detach().reshape(-1)
                if flat.numel() and not bool((flat == flat[0]).all()):
                    raise RuntimeError(
                        f"{prefix}{name}: no weight rule and not a constant fill; add a rule "
                        "(omnivoice_export/step0_checkpoints/builder.py) so its values are portable"
                    )
                continue
            if rule == ZEROS or rule == ONES:
                tensor.data.fill_(0.0 if rule == ZEROS else 1.0)
            else:
                shape = tuple(tensor.shape)
                std = rule(name, shape) if callable(rule) else float(rule)
                tensor.data.copy_(torch.from_numpy(normal(seed, prefix + name, shape, std)))
            assigned.append(name)
    return assigned
