"""The flags every command shares: the bundle's (--model-dir, --variant, --voices, declared once),
the request's (each range the API's own, omnivoice_onnx.limits, so a value argparse takes is one
validate() takes), the argparse types that refuse a value out of range when the arguments are
parsed, before any model loads, and the help formatter. Used by the `omnivoice-onnx` command and
by every toolchain script (omnivoice_export.cli re-exports it), so there is one copy.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

from omnivoice_onnx.bundle import DEFAULT_MODEL_DIR
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.limits import MAX_SCORE_FACTOR, MAX_SPEED, MIN_SPEED, SEED_MAX, SEED_MIN
from omnivoice_onnx.voices import VOICES_ENV

# What each subcommand's add_parser(subparsers) receives (argparse's class is generic in its stubs only).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_bundle_flags(
    parser: Any,
    model_dir: bool = True,
    variant: bool = True,
    voices: bool = True,
    model_dest: str = "model_dir",
    model_default: Path | None = DEFAULT_MODEL_DIR,
    model_aliases: tuple[str, ...] = (),
    hub: bool = True,
) -> None:
    """--model-dir (and upstream's --model_dir), --variant and --voices, declared here once for
    every command: each adds those it uses (to a parser or an argument group). `model_dest` and
    `model_default`: for `info`, whose positional DIR the flag overrides; `model_aliases`: a
    script's older spelling of --model-dir; `hub`: hf:ORG/NAME is read (__main__.resolve_hub_model_dirs)."""
    if model_dir:
        hub_help = ", or hf:ORG/NAME for a Hugging Face repo's" if hub else ""
        parser.add_argument(
            "--model-dir",
            "--model_dir",
            *model_aliases,
            dest=model_dest,
            type=Path,
            default=model_default,
            metavar="DIR",
            help=f"the bundle (export folder){hub_help} (default: {model_default or 'DIR'})",
        )
    if variant:
        parser.add_argument(
            "--variant",
            default=None,
            help="transformer variant (fp32, fp32-fused, int8, ...; default: fp32-fused when the "
            "bundle has it, else fp32; `omnivoice-onnx info` lists them)",
        )
    if voices:
        parser.add_argument(
            "--voices",
            type=Path,
            default=None,
            metavar="DIR",
            help=f"the saved voices folder (default: ${VOICES_ENV}, else <model-dir>/voices)",
        )


def _bounds(low: float | None, high: float | None, low_open: bool = False) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"<= {high}"
    return f"in {'(' if low_open else '['}{low}, {high}]"


def int_range(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """argparse `type=` for an integer flag within [low, high] (None: unbounded on that side).

    A value out of range is refused when the arguments are parsed, before any model is loaded:
    `--num-step 0` would otherwise reach onnxruntime as a Gather index error minutes later.
    """

    def parse_int(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range: an integer {_bounds(low, high)} is needed")
        return value

    return parse_int


def float_range(low: float | None = None, high: float | None = None, low_open: bool = False) -> Callable[[str], float]:
    """argparse `type=` for a finite number within [low, high] ((low, high] when `low_open`; nan
    and inf are refused: a threshold of nan would fail every comparison silently)."""

    def parse_float(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        below = low is not None and (value <= low if low_open else value < low)
        if not math.isfinite(value) or below or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{text} is out of range: a finite number {_bounds(low, high, low_open)} is needed"
            )
        return value

    return parse_float


# The request's flags, for every command (speak, batch, the toolchain's scripts): their ranges are
# omnivoice_onnx.limits', the API's own, so a value argparse takes is one validate() takes. The
# raisable limits (MAX_NUM_STEP, MAX_DURATION_S, MAX_THREADS: $OMNIVOICE_<NAME>) are left to
# validate(), which names the variable that raises them.
SEED = int_range(SEED_MIN, SEED_MAX)
NUM_STEP = int_range(1)  # generate()'s unmasking steps: at least one
THREADS = int_range(1)  # onnxruntime intra-op threads
SPEED = float_range(MIN_SPEED, MAX_SPEED)
DURATION = float_range(0.0, low_open=True)  # seconds of speech asked for (overrides the estimate)
SCORE_FACTOR = float_range(-MAX_SCORE_FACTOR, MAX_SCORE_FACTOR)  # guidance_scale, layer_penalty_factor
T_SHIFT = float_range(0.0, low_open=True)
TEMPERATURE = float_range(0.0)  # 0: greedy; (0, MIN_TEMPERATURE) is refused by validate, with its reason
CHUNK_SECONDS = float_range(0.0, low_open=True)  # audio_chunk_duration, audio_chunk_threshold


def flag_type(check: Callable[[str], str]) -> Callable[[str], str]:
    """An argparse type of a ValueError-raising check (the check's message is the error line)."""

    def parse(value: str) -> str:
        try:
            return check(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: X)" after a flag's help, only where there is a default to show: a
    flag that is off or unset (False, None) says nothing rather than "(default: None)"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def parse_subset(text: str, flag: str, choices: tuple[str, ...]) -> list[str]:
    """A comma-separated subset of `choices` (e.g. --graphs transformer,decoder), each named once,
    or a UserError. A repeated name is refused: `--graphs decoder,decoder` would export the decoder
    twice into one staging file and install it twice."""
    picked = [item.strip() for item in text.split(",") if item.strip()]
    unknown = sorted(set(picked) - set(choices))
    if unknown or not picked:
        raise UserError(
            f"{flag}: unknown value(s) {', '.join(unknown) or '(none given)'}", f"choose from {', '.join(choices)}"
        )
    repeated = sorted({item for item in picked if picked.count(item) > 1})
    if repeated:
        raise UserError(
            f"{flag}: {', '.join(repeated)} given more than once", f"name each of {', '.join(choices)} at most once"
        )
    return picked
