"""docs/runtime.md's layer map is the code's: its table of floors and its table of rooms are
computed here from the source (the structure test's reader count: annotation imports and the
CLI registry included) and must match the page line for line.

A map drawn by hand goes stale at the first move; drawn from the code and checked, it is the map a
porter or a new maintainer can trust. When a module moves, the failure prints the tables to paste.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_structure import MODULES, floors, reader_imports, short

PAGE = Path(__file__).resolve().parent.parent / "docs" / "runtime.md"
SECTION = "## Layers and rooms"


def floor_table() -> list[str]:
    """One row per floor, its modules by name (a reader's count: what they import sits below)."""
    levels = floors(reader_imports)
    rows = ["| floor | modules (each imports only from floors below it) |", "|---|---|"]
    for level in range(1, max(levels.values()) + 1):
        names = sorted(short(name) for name, at in levels.items() if at == level)
        rows.append(f"| {level} | {', '.join(f'`{name}`' for name in names)} |")
    return rows


def room_table() -> list[str]:
    """One row per package (the root and each subpackage): its docstring's first paragraph, its job."""
    rows = ["| room | its job (the first paragraph of its `__init__` docstring) |", "|---|---|"]
    for name, path in MODULES.items():
        if path.name == "__init__.py":
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            job = " ".join(doc.split("\n\n", 1)[0].split())
            rows.append(f"| `{name.replace('.', '/')}/` | {job} |")
    return rows


def documented() -> list[str]:
    """The lines of the page's layer-map section, blank lines dropped."""
    text = PAGE.read_text(encoding="utf-8")
    assert SECTION in text, f"docs/runtime.md has no '{SECTION}' section"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [line for line in body.splitlines() if line.strip()]


def documented_table(header: str) -> list[str]:
    """The page's table under that header row, whole: from the header to the last `|` line after it."""
    lines = documented()
    if header not in lines:
        return []
    start = lines.index(header)
    end = next((at for at in range(start, len(lines)) if not lines[at].startswith("|")), len(lines))
    return lines[start:end]


def assert_on_page(want: list[str], what: str) -> None:
    assert documented_table(want[0]) == want, (
        f"docs/runtime.md's {what} table is stale; paste this under '{SECTION}':\n" + "\n".join(want)
    )


def test_the_floor_table_is_the_code_s() -> None:
    assert_on_page(floor_table(), "floor")


def test_the_room_table_is_the_code_s() -> None:
    assert_on_page(room_table(), "room")


def test_every_room_says_its_job() -> None:
    silent = [row for row in room_table()[2:] if row.endswith("|  |")]
    assert not silent, f"packages whose __init__ has no docstring: {silent}"
