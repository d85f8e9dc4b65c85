"""Every shell and Python block of README.md and docs/*.md runs, as a reader would run it.

The convention every page's author follows: a ```sh, ```bash or ```python block is executed; a
block right after the line `<!-- not run: REASON -->` is not (test_not_run_blocks_say_why lists
the reasons); blocks in any other language (text, console, json, jsonl) are never run.

Where a page runs: a copy of a checkout after `make demo` (the sources; `onnx/`, the session
pipeline's tiny export, copied because blocks add voices to it; `capture/`, steps 0-1's files with
`ref_voice.wav` and `ref_voice.txt`; `.venv`, this interpreter's venv), with `omnivoice-onnx` on
PATH (`python -m omnivoice_onnx` from the copy: the venv need not have the package installed).
A page's blocks run in order in one copy, so a page may build on its own earlier blocks (add a
voice, then speak with it), never on another page's. A block that talks to
http://127.0.0.1:8000 (the server's default address) gets a real `omnivoice-onnx serve` of that
copy, started before the page's first such block on a free loopback port (the address in the
block rewritten to it) and stopped with SIGTERM after the page, which must exit 0.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, Pipeline, copy_pipeline

RUN_LANGUAGES = {"sh": "shell", "bash": "shell", "python": "python"}
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>.*\S)\s*-->")
FENCE = re.compile(r"^```(?P<lang>[\w+-]*)\s*$")
SERVER_ADDRESS = "127.0.0.1:8000"
BLOCK_TIMEOUT_S = 300
SERVER_START_S = 120
# What a copy of the checkout leaves out, at any depth: git's data, the venv (linked instead), the
# pipeline's outputs (the session's are copied in), bench/out, and the tools' caches and build
# leftovers a checkout does not have (mypy's alone is ~17,000 files: copying it cost ~4 CPU-s a page).
NOT_COPIED = {
    ".git",
    ".venv",
    "onnx",
    "capture",
    "checkpoints",
    "demo.log",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    "build",
    "*.egg-info",
    "out",
}


@dataclass
class Block:
    """One fenced code block of a page."""

    page: str  # path relative to the repo
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    not_run: str | None  # the reason given by `<!-- not run: REASON -->`, None when it runs

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def doc_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks_of(page: Path) -> list[Block]:
    """The fenced blocks of `page`, in order; a `not run` marker that is not right before a block is
    an error (it would silently mark nothing)."""
    name = page.relative_to(REPO).as_posix() if page.is_relative_to(REPO) else page.name
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    index, marker = 0, None
    while index < len(lines):
        line = lines[index]
        fence = FENCE.match(line)
        if fence is None:
            if line.strip():
                if marker is not None:
                    raise AssertionError(f"{name}:{marker[0]}: `<!-- not run -->` is not followed by a code block")
                found = NOT_RUN.fullmatch(line.strip())
                marker = (index + 1, found["reason"]) if found else None
                if line.lstrip().startswith("<!--") and "not run" in line and found is None:
                    raise AssertionError(f"{name}:{index + 1}: malformed marker; write `<!-- not run: REASON -->`")
            index += 1
            continue
        end = next((i for i in range(index + 1, len(lines)) if lines[i].strip() == "```"), None)
        assert end is not None, f"{name}:{index + 1}: code block never closed"
        blocks.append(
            Block(
                name, index + 1, fence["lang"], "\n".join(lines[index + 1 : end]) + "\n", marker[1] if marker else None
            )
        )
        index, marker = end + 1, None
    assert marker is None, f"{name}:{marker[0]}: `<!-- not run -->` at the end of the page marks nothing"
    return blocks


def runnable(page: Path) -> list[Block]:
    return [block for block in blocks_of(page) if block.lang in RUN_LANGUAGES and block.not_run is None]


def test_the_convention_on_a_sample_page(tmp_path: Path) -> None:
    """What runs and what does not, as the convention says; a marker that marks nothing is an error."""
    page = tmp_path / "sample.md"
    page.write_text(
        "# T\n\n```sh\necho run\n```\n\n<!-- not run: needs a GPU -->\n```python\nimport cuda\n```\n\n"
        "```text\nnot code\n```\n```bash\necho also\n```\n"
    )
    assert [(b.lang, b.line, b.text, b.not_run) for b in blocks_of(page)] == [
        ("sh", 3, "echo run\n", None),
        ("python", 8, "import cuda\n", "needs a GPU"),
        ("text", 12, "not code\n", None),
        ("bash", 15, "echo also\n", None),
    ]
    assert [b.line for b in runnable(page)] == [3, 15]
    for broken, words in (
        ("<!-- not run: why -->\nprose\n```sh\nx\n```\n", "not followed by a code block"),
        ("<!-- not run -->\n```sh\nx\n```\n", "malformed marker"),
        ("```sh\nx\n", "never closed"),
        ("<!-- not run: why -->\n", "marks nothing"),
    ):
        page.write_text(broken)
        with pytest.raises(AssertionError, match=words):
            blocks_of(page)


def test_pages_parse_and_not_run_blocks_say_why() -> None:
    """Every page parses (closed fences, markers right before a block), and every block that is not
    run says why: printed here, so `pytest -s tests/test_docs.py` lists what the docs do not prove."""
    skipped = [block for page in doc_pages() for block in blocks_of(page) if block.not_run is not None]
    for block in skipped:
        assert block.lang in RUN_LANGUAGES, f"{block.where}: a ```{block.lang} block is never run; drop the marker"
        print(f"not run: {block.where} ({block.lang}): {block.not_run}")
    assert any(runnable(page) for page in doc_pages())


README_MAX_LINES = 250  # a README that leads (piper's is ~190, faster-whisper's ~300); the rest is in docs/


def test_readme_leads() -> None:
    """The README stays short and opens with the two commands that work on a fresh machine."""
    readme = REPO / "README.md"
    assert len(readme.read_text().splitlines()) <= README_MAX_LINES
    assert blocks_of(readme)[0].text == "make demo\nmake test\n"


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#+ (?P<title>.+)$", re.MULTILINE)


def prose(page: Path) -> str:
    """`page` without its fenced code blocks (a link or heading inside one is not one)."""
    return re.sub(r"^```.*?^```[ \t]*$", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives `page`'s headings: lower case, punctuation dropped, spaces as '-'."""
    return {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in HEADING.findall(prose(page))}


def test_relative_links_reach_their_page_and_heading() -> None:
    """Every relative link of README.md and docs/*.md names a file of the checkout and, with a
    #fragment into a Markdown page, one of its headings: a moved section breaks a test, not a reader."""
    broken = []
    for page in doc_pages():
        for link in LINK.finditer(prose(page)):
            target = link["target"]
            if re.match(r"[a-z]+:", target):
                continue
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif fragment and file.suffix == ".md" and fragment not in anchors(file):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


LIMIT_ROW = re.compile(r"^\| `(?P<name>MAX_\w+)` \| (?P<value>[\d^]+) \|", re.MULTILINE)


def test_limits_table_is_the_codes() -> None:
    """The request limits package.md lists are the runtime's own, all of them, with their values."""
    from omnivoice_onnx import limits

    rows = {row["name"]: row["value"] for row in LIMIT_ROW.finditer((REPO / "docs" / "package.md").read_text())}
    assert sorted(rows) == sorted(limits.LIMITS)
    for name, shown in rows.items():
        base, _, power = shown.partition("^")
        assert int(base) ** int(power or 1) == getattr(limits, name), name


class Checkout:
    """A copy of the checkout after `make demo`, where one page's blocks run, and its server."""

    def __init__(self, pipeline: Pipeline, root: Path) -> None:
        self.root = root / "checkout"
        shutil.copytree(REPO, self.root, ignore=shutil.ignore_patterns(*NOT_COPIED), symlinks=True)
        copy_pipeline(pipeline, self.root)
        (self.root / ".venv").symlink_to(Path(sys.prefix))
        if (REPO / "checkpoints").is_dir():  # the tiny checkpoint the session built (--model tiny)
            (self.root / "checkpoints").symlink_to(REPO / "checkpoints")
        bin_dir = root / "bin"
        bin_dir.mkdir()
        command = bin_dir / "omnivoice-onnx"
        command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m omnivoice_onnx "$@"\n')
        command.chmod(0o755)
        self.env = {
            **os.environ,
            "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "PYTHONPATH": str(self.root),
            "HOME": str(root),
        }  # caches a block writes stay in tmp
        self.env.pop("OMNIVOICE_VOICES", None)  # voices are the bundle's, as after make demo
        self.server = None

    def serve(self) -> int:
        """The port of this copy's `omnivoice-onnx serve` (started on first use)."""
        from serving import launch

        if self.server is None:
            self.server = launch(
                self.root / "onnx",
                self.root.parent / "serve.log",
                "--threads",
                "1",
                env=self.env,
                start_timeout=SERVER_START_S,
            )
        return self.server.port

    def run(self, block: Block) -> subprocess.CompletedProcess:
        text = block.text
        if SERVER_ADDRESS in text:
            text = text.replace(SERVER_ADDRESS, f"127.0.0.1:{self.serve()}")
        if RUN_LANGUAGES[block.lang] == "shell":
            argv = ["bash", "-e", "-o", "pipefail", "-c", text]
        else:
            argv = [sys.executable, "-c", text]
        return subprocess.run(
            argv, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
        )

    def stop(self) -> int | None:
        return None if self.server is None else self.server.stop(SERVER_START_S)


PAGES_WITH_BLOCKS = [page for page in doc_pages() if runnable(page)]


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_WITH_BLOCKS, ids=[p.relative_to(REPO).as_posix() for p in PAGES_WITH_BLOCKS])
def test_page_blocks_run(page: Path, pipeline: Pipeline, tmp_path: Path) -> None:
    """Each runnable block of `page`, in order, exits 0 in a fresh checkout copy after `make demo`."""
    checkout = Checkout(pipeline, tmp_path)
    try:
        for block in runnable(page):
            done = checkout.run(block)
            assert done.returncode == 0, (
                f"{block.where} exited {done.returncode}:\n{block.text}\n--- stdout\n"
                f"{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-3000:]}"
            )
    finally:
        code = checkout.stop()
    assert code in (None, 0), f"the server exited {code}: {(tmp_path / 'serve.log').read_text()[-3000:]}"
