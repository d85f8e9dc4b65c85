"""omnivoice-onnx: speak text with an OmniVoice ONNX export (numpy + onnxruntime, no torch).

    omnivoice-onnx speak "Hello there." --out hello.wav     # a 16-bit PCM WAV, 24 kHz
    echo "Hello." | omnivoice-onnx speak --raw | aplay -r 24000 -f S16_LE -c 1
    omnivoice-onnx serve                                     # OpenAI-compatible server + a page at /
    omnivoice-onnx wyoming                                   # Home Assistant's Wyoming protocol
    omnivoice-onnx download ORG/NAME --dir onnx              # a bundle from Hugging Face (or an archive URL)
    omnivoice-onnx COMMAND --help                            # every command's flags

`speak` prints a one-line summary with its seed on stderr (--quiet: nothing); the same --seed
repeats it. The bundle folder is ./onnx unless --model-dir says otherwise; --model-dir hf:ORG/NAME
reads a Hugging Face repo's bundle through its cache (fetched the first time; HF_HUB_OFFLINE=1: cache only).
"""


# How commands register (for developers, kept out of --help): each is a module
# omnivoice_onnx/cli/<name>.py listed in SUBCOMMANDS (the registry lives here, where the program
# starts, so the `cli` room depends on none of its commands), exposing `add_parser(subparsers) ->
# argparse.ArgumentParser` and `run(args) -> int | None`; a listed module that is not installed is
# left out. Commands import their heavy dependencies (onnxruntime sessions, fastapi, ray) when they
# run, so `--help` and `--version` start fast.

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

from omnivoice_onnx.program import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    prepare,
    run_main,
)
from omnivoice_onnx.version import __version__

PROG = "omnivoice-onnx"
COMMANDS_PACKAGE = "omnivoice_onnx.cli"  # where the commands live (this module runs as __main__ too)
SUBCOMMANDS = ("speak", "voice", "info", "serve", "wyoming", "batch", "download", "pack")
EXIT_CODES = (
    f"exit codes: 0 success, {EXIT_BAD_INPUT} bad or missing input (one line on stderr names the fix), "
    f"{EXIT_INTERRUPTED} interrupted (Ctrl-C), {EXIT_TERMINATED} terminated (SIGTERM), {EXIT_BROKEN_PIPE} "
    "output pipe closed; --debug shows the traceback of an error"
)


def subcommand_modules() -> dict[str, ModuleType]:
    """The SUBCOMMANDS modules that exist, by name. Only a missing module itself is skipped: a module
    that exists but fails to import (a bug, a missing dependency of its own) raises."""
    found = {}
    for name in SUBCOMMANDS:
        module_name = f"{COMMANDS_PACKAGE}.{name}"
        try:
            found[name] = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
    return found


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the top-level parser with one sub-parser per installed command."""
    parser = prepare(
        argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter),
        EXIT_CODES,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in subcommand_modules().values():
        sub = prepare(module.add_parser(subparsers), EXIT_CODES)
        sub.set_defaults(run=module.run)
    return parser


def resolve_hub_model_dirs(args: argparse.Namespace) -> None:
    """Replace a --model-dir (or info's DIR) of the form hf:ORG/NAME by the huggingface_hub
    snapshot of the variant the command names (omnivoice_onnx.hub.resolve_model_dir): every
    command then opens a folder, checked as any folder is. Its saved voices, unless --voices or
    $OMNIVOICE_VOICES names a folder, live in the user's data folder (hub.hub_voices_dir), never
    in the snapshot, which belongs to the cache (the next revision or a clean-up replaces it)."""
    for name in ("model_dir", "model_dir_flag"):
        value = getattr(args, name, None)
        if value is not None and os.fspath(value).startswith("hf:"):
            from omnivoice_onnx.hub import hub_repo, hub_voices_dir, resolve_model_dir
            from omnivoice_onnx.voices import VOICES_ENV

            voices = hub_voices_dir(str(hub_repo(value)))
            if hasattr(args, "voices") and args.voices is None and not os.environ.get(VOICES_ENV) and voices:
                args.voices = voices
            setattr(args, name, resolve_model_dir(value, getattr(args, "variant", None)))


def main(argv: list[str] | None = None) -> int:
    """The `omnivoice-onnx` console script: parse, run the command, map errors to one line + exit code
    (omnivoice_onnx.program.run_main). Returns the command's exit code."""
    code = 0

    def run(argv: list[str] | None) -> None:
        nonlocal code
        args = build_parser().parse_args(argv)
        resolve_hub_model_dirs(args)
        code = args.run(args) or 0

    run_main(run, argv, prog=PROG)
    return code


if __name__ == "__main__":
    sys.exit(main())
