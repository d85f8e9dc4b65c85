"""No lab notes in source: run numbers and issue numbers belong in the investigation log, not in
the code, the tests or the pages a user reads (the house rule; a figure's provenance is the log's).

A note like "measured in Run <n>" ages the moment the next run changes the figure, and a reader of
the code cannot follow it without the log open; the log keeps the history, the source keeps the
fact (or cites the doc section that holds it).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAB_NOTE = re.compile(r"\b(Run|issue) [0-9]+")
LOG = REPO / "lab" / "investigation.md"
TEXT = {".py", ".json", ".md", ".txt", ".html", ".sh"}


def sources() -> list[Path]:
    """Every text file of the packages, scripts and bench (the notes in bench/results included: the
    log entry cites the results file, not the other way round), the tests' Python, the top-level
    scripts, pyproject.toml and the requirements, the Makefile, .ci/run and pytest.ini, and the
    README and docs pages except the investigation log."""
    text = [
        path
        for folder in ("omnivoice_onnx", "omnivoice_export", "scripts", "bench")
        for path in sorted((REPO / folder).rglob("*"))
        if path.suffix in TEXT and "__pycache__" not in path.parts
    ]
    tests = sorted((REPO / "tests").rglob("*.py"))
    top = [*sorted(REPO.glob("*.py")), *sorted(REPO.glob("*.toml")), *sorted(REPO.glob("*.txt"))]
    build = [path for path in (REPO / "Makefile", REPO / ".ci" / "run", REPO / "pytest.ini") if path.is_file()]
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return text + tests + top + build + [page for page in pages if page != LOG]


def test_no_run_or_issue_numbers_outside_the_log() -> None:
    files = sources()
    assert len(files) > 100 and any(path.parent.name == "tests" for path in files)
    hits = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if LAB_NOTE.search(line)
    ]
    assert hits == [], "\n".join(hits)


def test_the_docs_shelf_holds_pages_not_a_notebook() -> None:
    """docs/ is what a user reads: no page over 1,000 lines (the investigation log lives in lab/)."""
    long = {page.name: n for page in (REPO / "docs").glob("*.md") if (n := len(page.read_text().splitlines())) > 1000}
    assert not long, f"docs pages over 1,000 lines: {long}"
