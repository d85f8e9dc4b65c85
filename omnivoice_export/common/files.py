"""first_mismatch: the check of listed files that the capture, the export and its variants share
with the runtime's bundle. Atomic writes, sha256 entries and JSON artefacts are the runtime's own
(omnivoice_onnx.files, .hashing, .reading), which the toolchain imports where it uses them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

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
