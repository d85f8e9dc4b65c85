"""The flags the `omnivoice-onnx` commands share: the bundle's (--model-dir, --variant, --voices,
declared once), a check as an argparse type, and the help formatter. The request's range types
(each range the API's own) are the program edge's (omnivoice_onnx.program), which the toolchain's
scripts use too.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

from omnivoice_onnx.bundle import DEFAULT_MODEL_DIR
from omnivoice_onnx.limits import DEFAULT_VOLUME, MAX_PAUSE_S, MAX_VOLUME, MIN_PAUSE_S, MIN_VOLUME
from omnivoice_onnx.program import PAUSE, VOLUME
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
            # %(default)s: the help formatters add no second "(default: ...)" after it
            help=f"the bundle (export folder){hub_help} (default: {'%(default)s' if model_default else 'DIR'})",
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
            help=f"the saved voices folder (default: ${VOICES_ENV}, else <model-dir>/voices; for "
            "hf:ORG/NAME, $XDG_DATA_HOME (~/.local/share)/omnivoice-onnx/voices/ORG/NAME)",
        )


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


def add_pause_volume_flags(parser: Any) -> None:
    """--sentence-silence and --volume, as piper's flags, declared once for `speak` and `wyoming`
    (to a parser or an argument group)."""
    parser.add_argument(
        "--sentence-silence",
        "--sentence_silence",
        dest="sentence_silence",
        type=PAUSE,
        default=None,
        metavar="SECONDS",
        help=f"silence added between sentence-sized chunks, as piper's ({MIN_PAUSE_S:g}-{MAX_PAUSE_S:g} s; "
        "default 0; above 0 the text is cut into chunks of about 3 s, as with --stream)",
    )
    parser.add_argument(
        "--volume",
        type=VOLUME,
        default=None,
        metavar="GAIN",
        help=f"loudness as a linear gain, as piper's (0.5 half, 2.0 twice; {MIN_VOLUME:g}-{MAX_VOLUME:g}, default "
        f"{DEFAULT_VOLUME:g}); samples past full scale are clipped",
    )
