"""Hashing: sha256 of a file read in chunks, and the `{sha256, bytes}` entry with which every
artefact lists its files (file_entry), so a later stage can prove it reads what was written
(verified.VerifiedFiles.matches). Shared by the runtime (the bundle's verification, fetch, batch,
conformance) and the toolchain (omnivoice_export.common.files re-exports it).

A module of its own because proving a file is the one listed is a different job from writing it
(files) or parsing it (reading): the bundle's check hashes GBs and parses nothing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

CHUNK_BYTES = 1 << 20


def sha256_stream(handle: Any) -> str:
    """Hex sha256 of the rest of an open binary file, read in chunks (graphs and checkpoints are
    GBs) into one reused buffer: a fresh buffer per chunk is fresh memory the kernel must map and
    the read must fill, page by page, at every chunk."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    while size := handle.readinto(buffer):
        digest.update(view[:size])
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return sha256_stream(handle)


def file_entry(path: Path) -> dict[str, Any]:
    """How an artefact lists one of its files: `{"sha256": ..., "bytes": ...}`."""
    path = Path(path)
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


FILE_ENTRY_SCHEMA = {"sha256": str, "bytes": int}  # file_entry() in schema_problem's notation
