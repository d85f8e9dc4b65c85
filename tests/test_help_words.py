"""Every `omnivoice-onnx` help text speaks to someone who installed the package: no module path
(`omnivoice_onnx.`), no class attribute (`OmniVoiceOnnx.STREAM_CHUNK_DEFAULTS`), no docs file a
wheel does not install (`docs/`), no "(default: X)" said twice, no Python `None` offered as a value.
The walk reads the parser the program builds, so a new subcommand or action is covered unasked."""

from __future__ import annotations

import argparse
import re

import pytest

from omnivoice_onnx.__main__ import build_parser

UNSEEN = {
    "a module path": re.compile(r"\bomnivoice_onnx\."),
    "a class attribute": re.compile(r"\b[A-Z][A-Za-z]+\.[A-Z][A-Z_]{2,}\b"),
    "a docs file a wheel does not install": re.compile(r"\bdocs/"),
    "a doubled default": re.compile(r"\(default: [^)]*\)\s*\(default:"),
    "Python's None as a value": re.compile(r"\bor None\b"),
}


def _parsers(parser: argparse.ArgumentParser, prog: str) -> list[tuple[str, argparse.ArgumentParser]]:
    """`parser` and every subcommand's parser under it, with the command line that shows its help."""
    found = [(prog, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _parsers(sub, f"{prog} {name}")
    return found


PARSERS = _parsers(build_parser(), "omnivoice-onnx")


def test_the_walk_reaches_every_subcommand() -> None:
    names = {prog for prog, _ in PARSERS}
    assert {"omnivoice-onnx speak", "omnivoice-onnx voice add", "omnivoice-onnx info", "omnivoice-onnx pack"} <= names


@pytest.mark.parametrize("prog", [prog for prog, _ in PARSERS])
def test_help_has_no_words_for_developers(prog: str) -> None:
    text = " ".join(dict(PARSERS)[prog].format_help().split())  # lines joined as argparse wraps them
    found = {what: pattern.findall(text) for what, pattern in UNSEEN.items()}
    assert not any(found.values()), f"`{prog} --help` shows { ({k: v for k, v in found.items() if v}) }"
