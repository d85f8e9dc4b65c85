"""The runtime's shape, computed from its source (ast, nothing imported): its import graph has no
circle and stands at most MAX_FLOORS floors tall, the ground floor imports nothing above it, no
module is longer than MAX_LINES lines, and nothing in it imports torch, onnx or the toolchain.

A module stands one floor above everything it imports (a module importing nothing of the package is
floor 1). Every import counts, at module level or inside a function (a function-level import that
dodges a circle is still a circle), except those under `if TYPE_CHECKING:`, which never run.

A reader follows more than what runs: an annotation's import under `if TYPE_CHECKING:` and the
program's command registry (`__main__.SUBCOMMANDS`, loaded by `importlib.import_module`) are
imports a reader must follow too. Counted that way too, the runtime has no circle and stands at
most MAX_FLOORS floors: one limit for both counts.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

PACKAGE = "omnivoice_onnx"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
MAX_FLOORS = 8  # by what runs and by a reader's count alike
REGISTRY = f"{PACKAGE}.__main__"  # its SUBCOMMANDS tuple names the cli/ modules it loads with importlib
COMMANDS = f"{PACKAGE}.cli"
MAX_LINES = 600
# The ground floor: what every other module may use; each imports nothing of the package but these.
GROUND = {"errors", "limits", "files", "hashing", "reading", "contract", "graphmeta", "version"}
# Never imported by the runtime (the toolchain's world: pip install omnivoice-onnx brings none of them).
FORBIDDEN = {"torch", "torchaudio", "onnx", "onnxscript", "transformers", "omnivoice", "pydub", "omnivoice_export"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (annotations only: they never run)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            skipped |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
    return skipped


@cache
def imports(name: str, annotations: bool = False) -> tuple[set[str], set[str]]:
    """(the package's modules `name` imports, the top-level names of everything else it imports);
    with `annotations`, the imports under `if TYPE_CHECKING:` too."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set() if annotations else _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside, outside = set(), set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: `from . import x`, `from ..core import y`
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            # `from package import module` imports the module; `from module import name` the module.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                while target not in MODULES:
                    target = target.rpartition(".")[0]
                if target != name:
                    inside.add(target)
            else:
                outside.add(target.partition(".")[0])
    return inside, outside


def registry(name: str) -> set[str]:
    """The modules `name` loads by name: the program's SUBCOMMANDS (`cli.<command>`) that exist."""
    if name != REGISTRY:
        return set()
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    commands = next(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "SUBCOMMANDS" for target in node.targets)
    )
    return {f"{COMMANDS}.{item.value}" for item in commands.elts} & set(MODULES)


def reader_imports(name: str) -> set[str]:
    """Every module of the package a reader of `name` must follow: annotation imports and the registry too."""
    return imports(name, annotations=True)[0] | registry(name)


def short(name: str) -> str:
    return name.removeprefix(PACKAGE + ".") if name != PACKAGE else PACKAGE


def floors(deps: Callable[[str], set[str]]) -> dict[str, int]:
    """Each module's floor over the import graph `deps`; an AssertionError names a circle."""
    levels: dict[str, int] = {}

    def floor(name: str, path: tuple[str, ...]) -> int:
        if name in path:
            circle = path[path.index(name) :] + (name,)
            raise AssertionError(f"import circle: {' -> '.join(map(short, circle))}")
        if name not in levels:
            levels[name] = 1 + max((floor(dep, path + (name,)) for dep in deps(name)), default=0)
        return levels[name]

    for name in MODULES:
        floor(name, ())
    return levels


def climb(levels: dict[str, int], deps: Callable[[str], set[str]]) -> str:
    """The tallest module's way down, one floor at a time: the imports that make the height."""
    name = max(sorted(levels), key=levels.get)
    way = [name]
    while below := sorted(dep for dep in deps(name) if levels[dep] == levels[name] - 1):
        name = below[0]
        way.append(name)
    return " -> ".join(map(short, way))


def test_no_import_circle_and_at_most_eight_floors() -> None:
    levels = floors(lambda name: imports(name)[0])
    tallest = max(levels.values())
    top = sorted(short(name) for name, level in levels.items() if level == tallest)
    assert tallest <= MAX_FLOORS, f"{tallest} floors (at most {MAX_FLOORS}); on the top floor: {', '.join(top)}"


def test_no_circle_and_at_most_eight_floors_by_a_readers_count() -> None:
    """Counting annotation imports and the command registry too: no circle, and no taller."""
    levels = floors(reader_imports)
    tallest = max(levels.values())
    assert tallest <= MAX_FLOORS, (
        f"{tallest} floors by a reader's count (at most {MAX_FLOORS}): {climb(levels, reader_imports)}"
    )


def test_what_is_held_stands_below_what_makes_it() -> None:
    """By a reader's count: a request's data shapes (core/shapes.py) stand on the lowest floors, so
    whoever holds a Request or a VoiceClonePrompt need not import the code that makes one; the
    server's worker pool knows a model only as its Speaker protocol (no api, no request checks);
    the bundle reads its own files (no core module); the `cli` room registers no commands (the
    program, __main__, does)."""
    levels = floors(reader_imports)
    assert levels[f"{PACKAGE}.core.shapes"] <= 2, levels[f"{PACKAGE}.core.shapes"]
    makers = {f"{PACKAGE}.api", f"{PACKAGE}.core.request", f"{PACKAGE}.core.generate"}
    assert not reader_imports(f"{PACKAGE}.serve.pool") & makers, sorted(reader_imports(f"{PACKAGE}.serve.pool"))
    assert not [short(dep) for dep in reader_imports(f"{PACKAGE}.bundle") if dep.startswith(f"{PACKAGE}.core")]
    assert reader_imports(COMMANDS) == set()


def test_ground_floor_imports_only_the_ground_floor() -> None:
    for ground in GROUND:
        above = {short(dep) for dep in imports(f"{PACKAGE}.{ground}")[0]} - GROUND
        assert not above, f"{ground} (ground floor) imports {sorted(above)}"


def test_core_imports_nothing_above_it() -> None:
    """The host loop (core/) stands on the ground floor alone: no sessions, no files it was not
    handed, no front end."""
    for name in (name for name in MODULES if name.startswith(f"{PACKAGE}.core")):
        above = {short(dep) for dep in imports(name)[0] if not dep.startswith(f"{PACKAGE}.core")} - GROUND
        assert not above, f"{short(name)} imports {sorted(above)}"


def test_only_the_entry_points_import_a_front_end() -> None:
    """The command line (cli/) is imported by nothing but itself and `python -m omnivoice_onnx`, and
    the servers (serve/) by nothing but themselves and the command line: the rooms below them (the
    vectors, batch, the model) hold no front end's code, and a front end's helpers live in it."""
    rooms = {"cli": {"cli", "__main__"}, "serve": {"serve", "cli"}}  # a front end -> the rooms that may import it
    found = {
        f"{short(name)} -> {short(dep)}"
        for name in MODULES
        for dep in imports(name, annotations=True)[0]
        if short(dep).split(".")[0] in rooms and short(name).split(".")[0] not in rooms[short(dep).split(".")[0]]
    }
    assert not found, f"front ends imported from below them: {sorted(found)}"


def test_no_module_over_600_lines() -> None:
    long = {
        short(name): n
        for name, path in MODULES.items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_runtime_imports_no_torch_onnx_or_toolchain() -> None:
    found = {short(name): sorted(imports(name)[1] & FORBIDDEN) for name in MODULES if imports(name)[1] & FORBIDDEN}
    assert not found, f"the runtime imports the toolchain's packages: {found}"


def test_the_graph_is_read_right() -> None:
    """The reader itself: it sees function-level imports and `from package import module`, and
    skips TYPE_CHECKING (a check that cannot see an import proves nothing)."""
    assert f"{PACKAGE}.batch.ray_engine" in imports(f"{PACKAGE}.batch.run")[0]  # imported inside load_ray_engine()
    assert f"{PACKAGE}.core.audio" in imports(f"{PACKAGE}.core.request")[0]  # from omnivoice_onnx.core import audio
    annotated = ast.parse(
        "import typing\nif typing.TYPE_CHECKING:\n    from omnivoice_onnx.api import X\n"
        "from omnivoice_onnx.core.shapes import Request\n"
    )
    skipped = _type_checking_only(annotated)  # under TYPE_CHECKING: skipped by what runs, followed by a reader
    assert [
        node.module for node in ast.walk(annotated) if isinstance(node, ast.ImportFrom) and id(node) in skipped
    ] == [f"{PACKAGE}.api"]
    assert f"{PACKAGE}.cli.speak" in reader_imports(REGISTRY) - imports(REGISTRY)[0]  # the registry
    assert "numpy" in imports(f"{PACKAGE}.core.rng")[1]


# --- the bundle owns its folder --------------------------------------------------------------------

OWNERS = {"bundle", "contract"}  # bundle.Folder joins every path; contract.variant_path is the graphs' layout rule
# A path built inside a bundle folder, as the runtime wrote them before bundle.Folder held them all:
# `/` onto the folder (model_dir, onnx_dir, a Bundle's .dir), `/` with one of the bundle's file or
# folder names (its constants or their literal spellings), a graph's file name from GRAPH_FILES
# joined or suffixed, and the layout rule called directly.
BUNDLE_FILE_NAMES = (
    "REPORT_FILE",
    "RUNTIME_CONFIG_FILE",
    "TOKENIZER_FILE",
    "MODEL_CARD_FILE",
    "VOICES_SUBDIR",
    "MANIFEST_FILE",
)
BUNDLE_LITERALS = (
    "export-report.json",
    "runtime-config.json",
    "tokenizer.json",
    "README.md",
    "voices",
    "release-manifest.json",
)
BUNDLE_JOINS = {
    "a join onto the bundle folder": r"\b(model_dir|onnx_dir|bundle_dir)\b\)?\s*/",
    "a join onto a Bundle's .dir": r"\.dir\)?\s*/",
    "a join with a bundle file's name": rf"/\s*({'|'.join(BUNDLE_FILE_NAMES)})\b",
    "a join with a bundle file's literal name": rf"/\s*[\"']({'|'.join(map(re.escape, BUNDLE_LITERALS))})[\"']",
    "a graph's file name joined or suffixed": r"/\s*\(?GRAPH_FILES\[|GRAPH_FILES\[[^\]]*\]\s*\+",
    "the layout rule called outside the bundle": r"(?<![.\w])(variant_path|variant_dir|variants_present|codec_paths)\(",
}


def bundle_joins(text: str) -> list[str]:
    """`text`'s lines that build a path inside a bundle folder (BUNDLE_JOINS), each with the rule it breaks."""
    return [
        f"{number}: {why}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        for why, pattern in BUNDLE_JOINS.items()
        if re.search(pattern, line)
    ]


def test_no_module_but_the_bundle_joins_a_path_inside_the_bundle_folder() -> None:
    """Every path inside a bundle comes from bundle.Folder (a Bundle, or Folder(dir) where none is opened)."""
    found = {
        short(name): joins
        for name, path in MODULES.items()
        if short(name) not in OWNERS and (joins := bundle_joins(path.read_text(encoding="utf-8")))
    }
    assert not found, f"paths joined inside the bundle folder outside bundle.Folder: {found}"


def test_the_bundle_join_patterns_see_what_they_guard() -> None:
    """The guard itself: each way a path into the bundle was built finds its pattern; a path the
    bundle hands out, or a join in a folder that is not the bundle, finds none."""
    built = [
        "Path(model_dir) / VOICES_SUBDIR",
        "tts.model_dir / RUNTIME_CONFIG_FILE",
        "bundle.dir / name",
        "model_dir / MODEL_CARD_FILE",
        "path = Path(directory) / TOKENIZER_FILE",
        'onnx_dir / "tokenizer.json"',
        'self.dir / "voices"',
        'folder / GRAPH_FILES["encoder"]',
        'GRAPH_FILES[graph] + ".data"',
        "variant_path(onnx_dir, variant, name)",
        "variants_present(service.config.model_dir)",
        "(target / MANIFEST_FILE).read_bytes()",
    ]
    assert [line for line in built if not bundle_joins(line)] == []
    fine = [
        "bundle.runtime_config_path",
        "self.bundle.codec_paths(self.variant)",
        "voices_dir(tts.bundle, args.voices)",
        "Folder(target).manifest_path",
        'out / "vectors.json"',
        'options.res_dir / f"{line.id}.wav"',
        'f"({file or GRAPH_FILES[graph]}.data) are damaged"',
    ]
    assert [line for line in fine if bundle_joins(line)] == []
