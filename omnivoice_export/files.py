"""Artefact files: atomic writes, sha256 and the `{sha256, bytes}` entry, JSON artefacts, modes.

Users run the scripts for minutes at a time on multi-GB files. An interrupted run must never
leave a half-written artefact where a complete one was: every file and directory is written
under a hidden temporary name beside its destination and renamed into place only when complete
(rename within one directory is atomic on POSIX). Every artefact records each file it lists as a
`{sha256, bytes}` entry, so a later stage can prove it reads what was written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

from omnivoice_onnx.errors import UserError


def temp_path_for(path: Path) -> Path:
    """The hidden sibling a file or directory is written to before it is renamed into place."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds.

    Readers see the old file or the new one, never a partial write. On any exception (Ctrl-C
    included) the temporary file is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def temporary_dir(path: Path) -> Iterator[Path]:
    """A fresh empty directory beside `path` (same filesystem, so renames out of it are atomic),
    removed when the block ends, whatever happens."""
    tmp = temp_path_for(Path(path))
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a fresh directory to fill; it replaces the directory `path` only if the block succeeds.

    Until then an interrupted run has touched nothing in `path`. The old directory is renamed
    aside before the new one is renamed in, so `path` is absent for an instant but never mixed.
    """
    path = Path(path)
    with temporary_dir(path) as tmp:
        yield tmp
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)


def umask_mode(*paths: Path) -> None:
    """Give each file the mode a plain open() gives (0666 minus the umask).

    onnx's external-data writer and safetensors create their files 0600, so an exported graph's
    sidecar or a built checkpoint would be unreadable to other users of a shared machine or
    container while its `.onnx` is readable.
    """
    mask = os.umask(0)
    os.umask(mask)
    for path in paths:
        os.chmod(path, 0o666 & ~mask)


def sha256_file(path: Path, chunk: int = 16 << 20) -> str:
    """Hex sha256 of a file, read in chunks (graphs and checkpoints are GBs)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_entry(path: Path) -> dict[str, Any]:
    """How an artefact lists one of its files: `{"sha256": ..., "bytes": ...}`."""
    path = Path(path)
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def matches_entry(path: Path, entry: dict[str, Any]) -> bool:
    """Whether `path` is the file `entry` lists (size first: a truncated file costs no hashing)."""
    return Path(path).stat().st_size == entry["bytes"] and sha256_file(path) == entry["sha256"]


def existing_file(path: Path, what: str, fix: str | None) -> Path:
    """`path`, or a UserError `<what> not found: <path>` naming the fix."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found: {path}", fix)
    return path


def write_json_atomic(path: Path, data: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: Path, what: str, fix: str) -> Any:
    """Load JSON or raise a UserError naming the file and how to regenerate it."""
    path = existing_file(path, what, fix)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{what} is not valid JSON ({path}: {exc})", fix) from exc


def read_artefact(path: Path, what: str, fix: str, version: int, well_formed: Callable[[dict], bool],
                  stale_fix: str | None = None) -> dict[str, Any]:
    """A JSON artefact (capture manifest, export report) whose `format` is `version` and whose
    structure `well_formed` accepts; otherwise a UserError saying it is malformed or from another
    version (fix: `stale_fix`, else `fix`)."""
    data = read_json(path, what, fix)
    try:
        valid = data["format"] == version and well_formed(data)
    except (KeyError, TypeError, AttributeError):
        valid = False
    if not valid:
        raise UserError(f"{what} {path} is malformed or from another version", stale_fix or fix)
    return data
