"""Reading files the runtime did not write itself, or must not trust: every one a UserError of one
line, never a traceback. `existing_file` says which of "not found, a directory, a link loop,
permission denied" a path is; reads are bounded in size (`/dev/zero` is refused after the limit,
never read whole), text is strict UTF-8, JSON is bounded in depth, and each artefact's reader
checks it against a schema (schema_problem), so a hand-edited or damaged file is one line naming
the field, never a KeyError deep in a stage. Shared by the runtime and the toolchain
(omnivoice_export.common.files re-exports it).

A module of its own because reading hostile input is a different job from writing atomically
(files) or proving a file is the one listed (hashing): each is read and changed on its own.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from omnivoice_onnx.errors import UserError

PERMISSION_FIX = "give this user read access to it (chmod/chown), or run as its owner"


def existing_file(path: Path, what: str, fix: str | None) -> Path:
    """`path` if it is a regular file this process can open for reading; otherwise a UserError
    that says which of those it is not (not found, a directory, a symlink loop, permission
    denied), with `fix` or, for a permission, how to grant it."""
    path = Path(path)
    try:
        mode = path.stat().st_mode  # follows symlinks
    except FileNotFoundError:
        if path.is_symlink():
            raise UserError(f"{what} {path} is a symlink to a missing file ({os.readlink(path)})", fix) from None
        raise UserError(f"{what} not found: {path}", fix) from None
    except OSError as exc:  # a symlink loop, a parent that is a file or may not be entered
        raise UserError(
            f"{what} {path} cannot be reached ({exc.strerror})",
            PERMISSION_FIX if exc.errno in (errno.EACCES, errno.EPERM) else fix,
        ) from exc
    if stat.S_ISDIR(mode):
        raise UserError(f"{what} {path} is a directory, not a file", fix)
    if not stat.S_ISREG(mode):
        raise UserError(f"{what} {path} is not a regular file", fix)
    try:
        open(path, "rb").close()
    except OSError as exc:
        raise UserError(
            f"cannot read {what} {path} ({exc.strerror})",
            PERMISSION_FIX if exc.errno in (errno.EACCES, errno.EPERM) else fix,
        ) from exc
    return path


# Every JSON file the runtime reads (reports, runtime-config.json, voice files, results.jsonl) is
# far below these: a report is ~10 KB, a 60 s voice ~30 KB, nothing nests deeper than 6 levels. The
# bounds keep a hostile file from exhausting memory or the parser's recursion (200k-deep `[[[...`
# raised RecursionError, a traceback).
MAX_JSON_BYTES = 64 << 20
MAX_JSON_DEPTH = 64
_JSON_NESTING = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # strings (skipped whole) and brackets


def read_limited(handle: IO[bytes], limit: int, where: str, fix: str) -> bytes:
    """At most `limit` bytes from a binary `handle` (a file, a FIFO, stdin), read as limit + 1 so
    that a longer input (`/dev/zero`) is refused after `limit` bytes, never read into memory whole."""
    data = handle.read(limit + 1)
    if len(data) > limit:
        raise UserError(f"{where} is larger than {limit:,} bytes", fix)
    return data


def read_bounded(path: Path, limit: int, what: str, fix: str) -> bytes:
    """At most `limit` bytes of the file `path` (read_limited); an unreadable one is one line."""
    try:
        with open(path, "rb") as handle:
            return read_limited(handle, limit, f"{what} {path}", fix)
    except OSError as exc:
        raise UserError(
            f"cannot read {what} {path} ({exc.strerror or exc})",
            PERMISSION_FIX if exc.errno in (errno.EACCES, errno.EPERM) else fix,
        ) from exc


def decode_text(data: bytes, where: str, fix: str) -> str:
    """`data` as UTF-8, strictly: an invalid byte is one line naming `where`, the line and the offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UserError(
            f"{where} is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}, offset {exc.start})", fix
        ) from None


def parse_json(text: str, where: str, fix: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`text` parsed as JSON, its nesting checked first (no recursion of the parser's can run out);
    anything but valid JSON within `max_depth` levels is one line naming `where`."""
    depth = 0
    for token in _JSON_NESTING.finditer(text):
        bracket = token.group()
        if bracket in "[{":
            depth += 1
            if depth > max_depth:
                raise UserError(f"{where} nests deeper than {max_depth} levels: not a file this project writes", fix)
        elif bracket in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, and an integer over Python's 4,300-digit conversion limit
        raise UserError(f"{where} is not valid JSON ({str(exc)[:200]})", fix) from None


def read_json(
    path: Path, what: str, fix: str, limit: int = MAX_JSON_BYTES, data: bytes | None = None, schema: Any = None
) -> Any:
    """A JSON file of at most `limit` bytes and MAX_JSON_DEPTH levels, strictly UTF-8, meeting
    `schema` (checked(); None: any JSON), else a UserError naming the file and how to regenerate it.
    `data`: its bytes as the caller read (and verified) them, parsed instead of reading `path`."""
    if data is None:
        path = existing_file(path, what, fix)
        data = read_bounded(path, limit, what, fix)
    elif len(data) > limit:
        raise UserError(f"{what} {path} is larger than {limit:,} bytes", fix)
    value = parse_json(decode_text(data, f"{what} {path}", fix), f"{what} {path}", fix)
    return checked(value, schema, f"{what} {path}", fix)


@dataclass(frozen=True)
class Each:
    """Schema of a JSON object whose keys are data (graph names, file names): every value is `schema`."""

    schema: Any


@dataclass(frozen=True)
class Maybe:
    schema: Any  # the schema of an optional field: absent, null, or meeting `schema`


_KINDS = {
    type(None): "null",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
}


def _json_kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _at(where: str, key: Any) -> str:
    key = str(key)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{where}.{key}" if where else key
    return f'{where}["{key}"]'


def schema_problem(value: Any, schema: Any, where: str = "") -> str | None:
    """The first place where the JSON `value` departs from `schema`, as one phrase
    (`graphs.decoder.files["higgs_decoder.onnx"].bytes is missing`), or None.

    A schema is a type or a tuple of types (None: null is allowed); a dict {key: schema}, an
    object holding at least those keys (a Maybe key may be absent); Each(schema), an object of any
    keys; [schema], a list; Maybe(schema), null or `schema`.
    An integer is a number; a boolean is neither. Keys beyond the schema are allowed: readers use
    only what it names, and every reader of an artefact goes through its schema, so a hand-edited
    or truncated file is refused in one line rather than met as a KeyError deep in a stage.
    """
    name = where or "the top level"
    if isinstance(schema, Maybe):
        return None if value is None else schema_problem(value, schema.schema, where)
    if isinstance(schema, (dict, Each)):
        if not isinstance(value, dict):
            return f"{name} is {_json_kind(value)}, expected an object"
        pairs = schema.items() if isinstance(schema, dict) else ((key, schema.schema) for key in value)
        for key, sub in pairs:
            if key not in value:
                if isinstance(sub, Maybe):
                    continue
                return f"{_at(where, key)} is missing"
            problem = schema_problem(value[key], sub, _at(where, key))
            if problem:
                return problem
        return None
    if isinstance(schema, list):
        if not isinstance(value, list):
            return f"{name} is {_json_kind(value)}, expected a list"
        for index, item in enumerate(value):
            problem = schema_problem(item, schema[0], f"{where}[{index}]")
            if problem:
                return problem
        return None
    types = tuple(type(None) if t is None else t for t in (schema if isinstance(schema, tuple) else (schema,)))
    accepted = types + ((int,) if float in types else ())
    if type(value) not in accepted:  # exact types: JSON gives no subclasses, and a bool is not an int here
        return f"{name} is {_json_kind(value)}, expected {' or '.join(_KINDS[t] for t in types)}"
    return None


def checked(value: Any, schema: Any, where: str, fix: str) -> Any:
    """`value` (parsed JSON) if it meets `schema` (schema_problem; None: anything), else the one-line
    UserError `<where> is malformed: <the first departure>` every JSON reader's fields pass."""
    problem = None if schema is None else schema_problem(value, schema)
    if problem:
        raise UserError(f"{where} is malformed: {problem}", fix)
    return value


def read_artefact(
    path: Path,
    what: str,
    fix: str,
    version: int,
    schema: dict[str, Any],
    check: Callable[[dict[str, Any]], str | None] = lambda data: None,
    stale_fix: str | None = None,
) -> dict[str, Any]:
    """A JSON artefact (capture manifest, export report) whose `format` is `version`, that meets
    `schema` (see schema_problem) and whose values `check` accepts (it returns a problem or None);
    otherwise a UserError saying what is wrong with it (fix: `stale_fix`, else `fix`)."""
    data = read_json(path, what, fix)
    found = data.get("format") if isinstance(data, dict) else None
    # `"format": true` is not version 1
    if not isinstance(data, dict) or type(found) is not int or found != version:
        raise UserError(
            f"{what} {path} is of format {found!r}, not {version}: it is from another version, or not one",
            stale_fix or fix,
        )
    problem = schema_problem(data, schema) or check(data)
    if problem:
        raise UserError(f"{what} {path} is malformed: {problem}", stale_fix or fix)
    return data
