"""The whole house's shape, computed from the source (ast, nothing imported): the runtime, the
toolchain (omnivoice_export), the numbered step scripts and the bench, drawn as a reader draws
them.

A room is a package's folder (omnivoice_onnx/core/, omnivoice_export/step2_export/ ...) or a module
outside any subpackage (omnivoice_onnx/bundle.py, a step script, a bench file); a room stands one
floor above every room it imports. Every import counts: at module level or inside a function,
under `if TYPE_CHECKING:` too, and the runtime's command registry (test_structure.registry). The
runtime's own module-level rules (its floors, ground floor, front ends) are test_structure's; these
hold the toolchain to the same walls: no circle, a floor limit for the house, the line cap, the
documented map equal to the code, and no step script, toolchain module or bench standing on one of
the runtime's front ends (its command line, its servers, its program entry).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from test_structure import registry

REPO = Path(__file__).resolve().parent.parent
RUNTIME, TOOLCHAIN = "omnivoice_onnx", "omnivoice_export"
MAX_HOUSE_FLOORS = 9  # the whole house, rooms drawn as above
MAX_RUNTIME_FLOORS = 9  # the runtime alone, drawn the same way
MAX_LINES = 600
# The runtime's front ends: what a toolchain module, a step script or a bench must not stand on
# (the server's bench reads the server's own names: it measures that front end).
FRONT_ENDS = (f"{RUNTIME}.cli", f"{RUNTIME}.__main__", f"{RUNTIME}.serve")
MEASURED = {"bench.bench_server": f"{RUNTIME}.serve"}
STEP_SCRIPTS = tuple(sorted(path.name for path in REPO.glob("*.py")))


def _name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {
    _name(path): path
    for path in sorted(
        [
            *(REPO / RUNTIME).rglob("*.py"),
            *(REPO / TOOLCHAIN).rglob("*.py"),
            *REPO.glob("*.py"),
            *(REPO / "bench").glob("*.py"),
        ]
    )
}


def room(name: str) -> str:
    """The room a module stands in: its subpackage's folder, else itself."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] in (RUNTIME, TOOLCHAIN) and len(parts) > 2 else name


@cache
def imports(name: str) -> frozenset[str]:
    """The house's modules `name` imports, every import counted (function-level, TYPE_CHECKING)."""
    path = FILES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in FILES else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in (RUNTIME, TOOLCHAIN):
                while target not in FILES and "." in target:
                    target = target.rpartition(".")[0]
                if target in FILES and target != name:
                    found.add(target)
    return frozenset(found | registry(name))


@cache
def room_imports() -> dict[str, frozenset[str]]:
    rooms: dict[str, set[str]] = {}
    for name in FILES:
        rooms.setdefault(room(name), set()).update(room(dep) for dep in imports(name) if room(dep) != room(name))
    return {name: frozenset(deps) for name, deps in rooms.items()}


def floors() -> dict[str, int]:
    """Each room's floor; an AssertionError names a circle."""
    deps, levels = room_imports(), {}

    def floor(name: str, path: tuple[str, ...]) -> int:
        if name in path:
            raise AssertionError(f"room circle: {' -> '.join(path[path.index(name) :] + (name,))}")
        if name not in levels:
            levels[name] = 1 + max((floor(dep, path + (name,)) for dep in deps[name]), default=0)
        return levels[name]

    for name in deps:
        floor(name, ())
    return levels


def way_down(levels: dict[str, int], top: str) -> str:
    way = [top]
    while below := sorted(dep for dep in room_imports()[way[-1]] if levels[dep] == levels[way[-1]] - 1):
        way.append(below[0])
    return " -> ".join(way)


def test_the_house_has_no_circle_and_at_most_nine_floors() -> None:
    levels = floors()
    tallest = max(levels, key=levels.__getitem__)
    assert levels[tallest] <= MAX_HOUSE_FLOORS, f"{levels[tallest]} floors: {way_down(levels, tallest)}"
    runtime = max((name for name in levels if name.startswith(RUNTIME)), key=levels.__getitem__)
    assert levels[runtime] <= MAX_RUNTIME_FLOORS, f"the runtime: {way_down(levels, runtime)}"


def test_no_toolchain_script_or_bench_stands_on_a_runtime_front_end() -> None:
    found = sorted(
        f"{name} -> {dep}"
        for name in FILES
        if not name.startswith(RUNTIME)
        for dep in imports(name)
        if dep.startswith(FRONT_ENDS) and not (name in MEASURED and dep.startswith(MEASURED[name]))
    )
    assert not found, f"imports of the runtime's command line or servers (use omnivoice_onnx.program): {found}"


def test_the_runtime_never_imports_the_toolchain() -> None:
    found = sorted(
        f"{name} -> {dep}"
        for name in FILES
        if name.startswith(RUNTIME)
        for dep in imports(name)
        if dep.startswith(TOOLCHAIN)
    )
    assert not found, found


def test_no_toolchain_module_over_600_lines() -> None:
    long = {
        name: n
        for name, path in FILES.items()
        if name.startswith(TOOLCHAIN) and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"toolchain modules over {MAX_LINES} lines: {long}"


def documented(package: Path, heading: str) -> list[str]:
    """The names listed under `heading:` in a package's __init__ docstring (one per line, indented four
    spaces; a description's continuation lines are indented further)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    listed, inside = [], False
    for line in doc.splitlines():
        if line.strip() == f"{heading}:":
            inside = True
        elif inside and (found := re.match(r" {4}(\w+)\s", line)):
            listed.append(found.group(1))
        elif inside and line.strip() and not line.startswith(" " * 5):
            inside = False
    return listed


def test_the_toolchain_map_is_the_code() -> None:
    """omnivoice_export/__init__ lists every room and every module beside them; each room's
    __init__ lists every module in it: a reader's map, kept equal to the folders."""
    top = REPO / TOOLCHAIN
    rooms = sorted(path.name for path in top.iterdir() if (path / "__init__.py").is_file())
    beside = sorted(path.stem for path in top.glob("*.py") if path.name != "__init__.py")
    assert sorted(documented(top, "Rooms")) == rooms
    assert sorted(documented(top, "Modules beside the rooms (make venv's, before step 0)")) == beside
    for name in rooms:
        modules = sorted(path.stem for path in (top / name).glob("*.py") if path.name != "__init__.py")
        assert sorted(documented(top / name, "Modules")) == modules, f"{TOOLCHAIN}/{name}/__init__.py's map"


def test_the_house_is_read_right() -> None:
    """The reader itself: a function-level import and a subpackage's folder drawn as one room."""
    assert f"{TOOLCHAIN}.common.edge" in imports("bench.bench_load")  # imported inside worker_main()
    assert room(f"{TOOLCHAIN}.step2_export.report") == f"{TOOLCHAIN}.step2_export"
    assert room(f"{RUNTIME}.bundle") == f"{RUNTIME}.bundle"
    assert f"{RUNTIME}.cli" in room_imports()[f"{RUNTIME}.__main__"]  # the registry
    assert "parity_check" in FILES and len(STEP_SCRIPTS) == 7
