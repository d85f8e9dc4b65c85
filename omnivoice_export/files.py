"""Artefact files for the toolchain: the runtime's omnivoice_onnx.files (atomic writes),
omnivoice_onnx.hashing (sha256, `{sha256, bytes}` entries) and omnivoice_onnx.reading (JSON
artefacts and their schemas), re-exported so there is one copy."""

from __future__ import annotations

from omnivoice_onnx.files import (  # noqa: F401
    atomic_dir,
    atomic_path,
    create_temporary,
    remove_stale_temporaries,
    temporary_dir,
    umask_mode,
    write_json_atomic,
)
from omnivoice_onnx.hashing import FILE_ENTRY_SCHEMA, file_entry, matches_entry, sha256_file  # noqa: F401
from omnivoice_onnx.reading import (  # noqa: F401
    PERMISSION_FIX,
    Each,
    existing_file,
    read_artefact,
    read_json,
    schema_problem,
)
