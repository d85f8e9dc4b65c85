"""Artefact files for the toolchain: the runtime's omnivoice_onnx.files (atomic writes),
omnivoice_onnx.hashing (sha256, `{sha256, bytes}` entries) and omnivoice_onnx.reading (JSON
artefacts and their schemas), re-exported so there is one copy; and first_mismatch, the check of
listed files that the capture, the export and its variants share with the runtime's bundle."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from omnivoice_onnx.files import (  # noqa: F401
    atomic_dir,
    atomic_path,
    create_temporary,
    remove_stale_temporaries,
    temporary_dir,
    umask_mode,
    write_json_atomic,
)
from omnivoice_onnx.hashing import FILE_ENTRY_SCHEMA, file_entry, sha256_file  # noqa: F401
from omnivoice_onnx.reading import (  # noqa: F401
    PERMISSION_FIX,
    Each,
    existing_file,
    read_artefact,
    read_json,
    schema_problem,
)
from omnivoice_onnx.verified import VerifiedFiles


def first_mismatch(files: Iterable[tuple[Path, Mapping[str, Any]]]) -> Path | None:
    """The first of `files` ((path, `{sha256, bytes}` entry) pairs, each an existing file) that is
    not the file its entry lists, or None when all are.

    A file is hashed unless this user's processes already hashed it unchanged (the runtime's
    VerifiedFiles record: same stat identity, same expected sha256), as a bundle's files are when
    it opens; OMNIVOICE_VERIFY=full hashes every one. Steps 3, 4 and 6 read a capture of hundreds
    of files and an export of gigabytes again at every run: a file is hashed again only when its
    stat identity changes (once the first check, more than 2 s after the write, remembered it),
    not by every script that checks it."""
    record = VerifiedFiles.in_cache()
    try:
        return next((path for path, entry in files if record.matches(path, entry) is None), None)
    finally:
        record.save()
