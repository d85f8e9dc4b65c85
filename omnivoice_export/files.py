"""Artefact files for the toolchain: the runtime's omnivoice_onnx.files (atomic writes, sha256,
`{sha256, bytes}` entries, JSON artefacts and their schemas), re-exported so there is one copy."""

from __future__ import annotations

from omnivoice_onnx.files import (FILE_ENTRY_SCHEMA, PERMISSION_FIX, Each, atomic_dir, atomic_path,  # noqa: F401
                                  existing_file, file_entry, matches_entry, read_artefact, read_json,
                                  remove_stale_temporaries, schema_problem, sha256_file, create_temporary,
                                  temporary_dir, umask_mode, write_json_atomic)
