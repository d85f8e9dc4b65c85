"""Every limit and range a request is checked against, in one place: the API's validation
(core.request), the command line's flags (their `--help` ranges come from here), the server's
request model and batch lines all read these names, never a copy.

Two kinds:
- limits (MAX_*, in LIMITS) keep one request within memory and time on a CPU machine. Each can
  be raised or lowered per process with the environment variable OMNIVOICE_<NAME> (say
  OMNIVOICE_MAX_TEXT_CHARS=100000), read at each validation (docs/runtime.md, "Request limits").
- ranges are what the arithmetic can carry (a seed torch accepts, a temperature float32 can
  divide by): fixed, not resources.

Ground floor: imports nothing of the package but errors.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import re
from collections.abc import Iterator
from typing import Any, Literal, overload

import numpy as np

from omnivoice_onnx.errors import UserError

# A Hugging Face repo id as huggingface_hub.utils.validate_repo_id accepts it (2.x; tests hold the
# two to the same verdicts), namespace required: each part 1-96 of A-Z a-z 0-9 . _ -, starting and
# ending with a letter, digit or _, no `--` or `..` anywhere, not ending in `.git`. Checked by hub and
# by the toolchain's --model, so
# that huggingface_hub's HFValidationError (a traceback) is never reached.
HF_NAME_PART = r"(?=[A-Za-z0-9._-]{1,96}(?:/|$))[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?"
HF_REPO_ID = re.compile(rf"(?!.*(?:--|\.\.))(?!.*\.git$){HF_NAME_PART}/{HF_NAME_PART}")
HF_REPO_FIX = (
    "pass ORG/NAME as the Hub shows it (letters, digits, '-', '_', '.'; each part at most 96, starting "
    "and ending with a letter or digit; no '--' or '..')"
)
THREADS_ENV = "OMNIVOICE_ORT_THREADS"  # onnxruntime intra-op threads for every session of the process
LIMIT_ENV_PREFIX = "OMNIVOICE_"  # OMNIVOICE_<limit name> overrides a limit for the process
# --- limits (raise them with OMNIVOICE_<NAME>) ---
MAX_TEXT_CHARS = 20_000  # code points per text: ~20 min of English at ~15 characters per second
MAX_TEXTS = 64  # texts per call: generate() runs the short ones as ONE batch
MAX_DURATION_S = 600.0  # seconds of audio per text: a given duration, or the estimate / speed
MAX_NUM_STEP = 256  # unmasking steps (upstream's default 32): each is one transformer call per batch
MAX_THREADS = 256  # onnxruntime intra-op threads per session (from_dir(threads=...), --threads)
MAX_REF_SECONDS = 60.0  # reference audio as given, checked before it is read or resampled (3-10 s is best)
MAX_SEQUENCE = 4096  # positions in one transformer row: prompt + reference + target frames (~2.5 min)
# rows x sequence^2 of one transformer call: its attention scores are that many float32 per head
# and layer (x16 heads = 4 GiB at the real model's 16 heads, at this default); the default allows
# one item at MAX_SEQUENCE (2 rows: cond and uncond), or 32 texts of a 15 s chunk each.
MAX_ATTENTION_CELLS = 2**26
MAX_PAD_SECONDS = 60.0  # generation_config pad_duration and fade_duration
LIMITS = (
    "MAX_TEXT_CHARS",
    "MAX_TEXTS",
    "MAX_DURATION_S",
    "MAX_NUM_STEP",
    "MAX_THREADS",
    "MAX_REF_SECONDS",
    "MAX_SEQUENCE",
    "MAX_ATTENTION_CELLS",
    "MAX_PAD_SECONDS",
)

# --- ranges (what the arithmetic can carry, not resources) ---
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.manual_seed accepts
MIN_REF_SECONDS = 0.5  # a reference shorter than this after silence removal is not a voice to clone
# speed divides the length estimate (upstream sets no bounds). One range for the CLI, the Python
# API, HTTP and Wyoming: OpenAI's documented 0.25-4.0, the one its clients already send and
# validate, so a value is accepted by every front end or by none. Past 4x a word gets fewer frames
# than it has sounds; below 0.25x the estimate is stretched past anything the model was trained on.
MIN_SPEED, MAX_SPEED = 0.25, 4.0
# Silence between two pieces of speech (a script's lines; a request's sentence_silence between the
# chunks of its text), in seconds: piper's --sentence-silence and omnivoice-server's
# pause_between_speakers take such a value; past 5 s it is a gap, not a pause.
MIN_PAUSE_S, MAX_PAUSE_S = 0.0, 5.0
DEFAULT_SENTENCE_SILENCE_S = 0.0  # no silence added: upstream's join of the chunks, as before the option
# A request's volume: a linear gain on the output samples, as piper's --volume (0.5 half as loud).
# Up to 10x (+20 dB): enough to lift a clone of a reference recorded 20 dB under the level the model
# speaks at; past it speech is mostly clipped at full scale. 0 is silence.
MIN_VOLUME, MAX_VOLUME = 0.0, 10.0
DEFAULT_VOLUME = 1.0  # the samples unchanged
# Gumbel temperatures: scores / T in float32. Below this (but above 0, which is greedy) the noise
# can no longer change a choice, and at ~1e-45 float32(T) is 0 and every score becomes -inf.
MIN_TEMPERATURE = 1e-6
# guidance_scale and layer_penalty_factor multiply log-probabilities (|x| < ~1e3): beyond this
# the products overflow float32 and the scores become inf - inf = NaN.
MAX_SCORE_FACTOR = 1e3
LIMIT_FIX = (
    "raise it with the environment variable {env} (docs/runtime.md, Request limits) if the machine has the "
    "memory and time"
)
OUT_OF_MEMORY_FIX = (
    "ask for less at once (shorter text or duration, fewer texts per call), or lower the request "
    "limits (OMNIVOICE_MAX_SEQUENCE, OMNIVOICE_MAX_ATTENTION_CELLS: docs/runtime.md) to what this "
    "machine holds"
)


def limit(name: str) -> float:
    """The current value of limit `name`: $OMNIVOICE_<name> when set, else the module constant."""
    if name not in LIMITS:
        raise KeyError(f"{name} is not one of limits.LIMITS")
    return env_number(LIMIT_ENV_PREFIX + name, globals()[name])  # one of the module's constants (LIMITS)


def env_number(env: str, default: float) -> float:
    """$`env` as a positive finite number of `default`'s type (an int limit takes "1e5"), else
    `default` when it is unset or blank; a UserError naming the variable for anything else."""
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    try:
        value = type(default)(float(raw)) if isinstance(default, int) else float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or not math.isfinite(value):
        raise UserError(
            f"{env}={raw!r} is not a positive number", f"set it to a number > 0 (default {default}), or unset it"
        )
    return value


def too_large(what: str, name: str, advice: str | None = None) -> UserError:
    """The one error of a request over limit `name`: what is too large, the limit, `advice` (how
    to make the request smaller) and how to raise the limit."""
    fix = LIMIT_FIX.format(env=LIMIT_ENV_PREFIX + name)
    return UserError(f"{what} (over {name}={limit(name):g})", f"{advice}, or {fix}" if advice else fix)


@contextlib.contextmanager
def memory_errors_as_user_errors() -> Iterator[None]:
    """A MemoryError in the block (numpy's, or onnxruntime's allocation failure, which
    sessions.run raises as one) becomes the API's one error: the request was too big for this
    machine. The limits should refuse such a request first; this is what remains when the
    machine has less memory than they assume."""
    try:
        yield
    except MemoryError as exc:
        raise UserError(
            f"out of memory ({str(exc).splitlines()[0][:200] if str(exc) else 'MemoryError'})", OUT_OF_MEMORY_FIX
        ) from exc


def is_number(value: Any) -> bool:
    """A real number: int, float or a numpy scalar of either; never a bool (True is not 1 here)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


@overload
def checked_number(
    value: Any,
    name: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    *,
    integer: Literal[True],
    fix: str | None = None,
) -> int: ...
@overload
def checked_number(
    value: Any,
    name: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    integer: bool = False,
    fix: str | None = None,
) -> float: ...
def checked_number(
    value: Any,
    name: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    integer: bool = False,
    fix: str | None = None,
) -> float:
    """`value` as a Python float (int when `integer`) within [low, high] ((low, high] when
    `low_open`), finite; UserError naming `name` otherwise."""
    bounds = (
        f"{'(' if low_open else '['}{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}]"
    )
    fix = fix or f"pass a {'whole number' if integer else 'number'} in {bounds}"
    if not is_number(value):
        raise UserError(f"{name} must be a number, got {type(value).__name__} {value!r:.60}", fix)
    if not math.isfinite(value):
        raise UserError(f"{name} must be finite, got {value!r}", fix)
    if integer and int(value) != value:
        raise UserError(f"{name} must be a whole number, got {value!r}", fix)
    number = int(value) if integer else float(value)
    if (low is not None and (number <= low if low_open else number < low)) or (high is not None and number > high):
        raise UserError(f"{name} {value!r} is out of range {bounds}", fix)
    return number


def check_speed(speed: Any, label: str = "speed") -> float:
    """`speed` in the one closed range [MIN_SPEED, MAX_SPEED] every front end states (OpenAI's
    0.25-4.0, both ends included); UserError naming `label` otherwise."""
    return checked_number(speed, label, MIN_SPEED, MAX_SPEED)


def check_sentence_silence(value: Any, label: str = "sentence_silence") -> float:
    """Seconds of silence added between a text's chunks: DEFAULT_SENTENCE_SILENCE_S for None, else
    a number in [MIN_PAUSE_S, MAX_PAUSE_S]; UserError naming `label` otherwise."""
    return DEFAULT_SENTENCE_SILENCE_S if value is None else checked_number(value, label, MIN_PAUSE_S, MAX_PAUSE_S)


def check_volume(value: Any, label: str = "volume") -> float:
    """The output's linear gain: DEFAULT_VOLUME for None, else a number in [MIN_VOLUME, MAX_VOLUME];
    UserError naming `label` otherwise."""
    return DEFAULT_VOLUME if value is None else checked_number(value, label, MIN_VOLUME, MAX_VOLUME)


def check_threads(threads: Any) -> int | None:
    """onnxruntime intra-op threads: None (onnxruntime decides) or a whole number in [1, MAX_THREADS]."""
    if threads is None:
        return None
    if is_number(threads) and isinstance(threads, numbers.Integral) and int(threads) > limit("MAX_THREADS"):
        raise too_large(f"threads={int(threads)}", "MAX_THREADS")
    return checked_number(
        threads,
        "threads",
        1,
        None,
        integer=True,
        fix="pass a whole number of threads >= 1, or None for onnxruntime's default",
    )


def default_threads() -> int | None:
    """$OMNIVOICE_ORT_THREADS as a thread count (None when unset or empty: onnxruntime decides)."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return None
    if not value.isdecimal() or int(value) < 1:
        raise UserError(f"{THREADS_ENV}={value!r} is not a thread count", "set it to an integer >= 1, or unset it")
    return check_threads(int(value))


def check_seed(seed: int) -> int:
    """`seed` as torch.manual_seed reads it (an int in [SEED_MIN, SEED_MAX]); UserError otherwise."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise UserError(
            f"seed must be an integer, got {type(seed).__name__} {seed!r}",
            f"pass an int in [{SEED_MIN}, {SEED_MAX}] or None for a fresh seed",
        )
    seed = int(seed)
    if not SEED_MIN <= seed <= SEED_MAX:
        raise UserError(f"seed {seed} is outside torch.manual_seed's range", f"pass an int in [{SEED_MIN}, {SEED_MAX}]")
    return seed
