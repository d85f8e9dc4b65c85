"""Files: atomic writes, sha256 and the `{sha256, bytes}` entry, JSON artefacts and their schemas,
modes. Shared by the runtime (audio output, voices) and the toolchain (omnivoice_export.files
re-exports it): one copy.

Users run the scripts for minutes at a time on multi-GB files. An interrupted run must never
leave a half-written artefact where a complete one was: every file and directory is written
under a hidden temporary name beside its destination and renamed into place only when complete
(rename within one directory is atomic on POSIX); what a killed run left is removed by the next
write beside it. Temporary names are random and created exclusively, never followed through a
symlink (create_temporary): a shared writable folder cannot redirect a write. Every artefact
records each file it lists as a `{sha256, bytes}` entry, so a later stage can prove it reads what
was written; its reader checks it against a schema, so a hand-edited or damaged artefact is one
line naming the field, never a KeyError. Every JSON file is read bounded in size and depth.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

from omnivoice_onnx.errors import ENVIRONMENT, UserError

PERMISSION_FIX = "give this user read access to it (chmod/chown), or run as its owner"


def _temp_prefix(path: Path) -> str:
    """How a temporary beside `path` starts: `.<name>.tmp-<pid>-` (remove_stale_temporaries reads the pid)."""
    return f".{path.name}.tmp-{os.getpid()}-"


def _umask() -> int:
    """This process's umask, read without changing it (os.umask sets it: a race with other threads)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as status:
            return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def create_temporary(path: Path) -> Path:
    """A new empty file beside `path` to write before it is renamed onto `path`, with the mode a
    plain open() gives. Created by tempfile.mkstemp (O_CREAT|O_EXCL|O_NOFOLLOW, a random name):
    a name of the form `.<name>.tmp-<pid>` could be planted in a shared folder as a symlink ahead
    of the pid, and the write would go through it into a file of the planter's choosing."""
    handle, name = tempfile.mkstemp(prefix=_temp_prefix(path), dir=path.parent)
    try:
        os.fchmod(handle, 0o666 & ~_umask())
    finally:
        os.close(handle)
    return Path(name)


def replace_into(temp: Path, path: Path) -> None:
    """Rename `temp` onto `path`; a refusal (the target a directory, a read-only folder) names
    `path`, the file the user asked for, not the hidden temporary."""
    try:
        os.replace(temp, path)
    except IsADirectoryError:
        raise UserError(f"{path} is a directory", "remove it, or write the file elsewhere") from None
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def open_append(path: Path) -> TextIO:
    """`path` opened to append text lines (O_NOFOLLOW: a symlink planted in its place is refused,
    not written through)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, 0o666), "a", encoding="utf-8")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: a planted name's pid no process can have
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries(path: Path) -> None:
    """Clear what a killed run left beside `path`: its `.<name>.tmp-<pid>` files and directories
    whose process is gone (SIGKILL, a power cut: no `finally` ran), GBs for an export's staging.

    A run's other temporaries beside `path` carry its temporary name plus a suffix
    (`.<name>.tmp-<pid>-input.onnx`: quantize's graph-only input and the `-inferred` copy
    onnxruntime writes beside it), and go with it. A `.<name>.old-<pid>` is atomic_dir's previous
    `path`, renamed aside an instant before the new one was renamed in; if the run died in that
    instant and `path` is absent, it is put back.
    Another live run's temporaries (a concurrent export) are left alone. Process ids are this
    machine's: two machines writing one network folder at once are not told apart.
    """
    path = Path(path)
    if not path.parent.is_dir():
        return
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(tmp-(\d+)(?:-[^/]+)?|old-(\d+))")
    for sibling in path.parent.iterdir():
        match = pattern.fullmatch(sibling.name)
        if match is None or _process_alive(int(match.group(2) or match.group(3))):
            continue
        if match.group(3) and not os.path.lexists(path):
            os.replace(sibling, path)
        elif sibling.is_dir() and not sibling.is_symlink():
            shutil.rmtree(sibling, ignore_errors=True)
        else:
            sibling.unlink(missing_ok=True)


@contextlib.contextmanager
def _errors_name(path: Path) -> Iterator[None]:
    """Give a machine error (full disk, denied access) raised without a file name the name of
    `path`: a write through an open file object raises ENOSPC with none, and the user must know
    which disk to free."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno not in ENVIRONMENT:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a new temporary file beside `path` (create_temporary) to write by name; rename it
    onto `path` only if the block succeeds.

    Readers see the old file or the new one, never a partial write. The rename replaces a symlink
    at `path` by the file (it never writes through it). On any exception (Ctrl-C included) the
    temporary file is removed; an error names `path`, not the temporary.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    with _errors_name(path):
        tmp = create_temporary(path)
    try:
        with _errors_name(path):
            yield tmp
        replace_into(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def temporary_dir(path: Path) -> Iterator[Path]:
    """A fresh empty directory beside `path` (same filesystem, so renames out of it are atomic),
    removed when the block ends, whatever happens. Created by tempfile.mkdtemp (a random name,
    mode 0700 until filled: nobody else can plant a file in it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    with _errors_name(path):
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # the mode a plain mkdir gives: the folder may be renamed into place
        with _errors_name(tmp):
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
        replace_into(tmp, path)
        shutil.rmtree(old, ignore_errors=True)


def resolved_folder(path: Path, what: str, fix: str, within: Path | None = None) -> Path:
    """`path` resolved once (symlinks followed, made absolute), for a folder the runtime writes
    into: later writes go to what it named now, not to wherever a swapped link points then. A path
    that exists and is not a folder is a UserError; so is one that leads outside `within` (a
    bundle's voices/ that is a symlink out of the bundle)."""
    resolved = Path(os.path.realpath(path))
    if os.path.lexists(path) and not resolved.is_dir():
        raise UserError(f"{what} {path} is not a folder", fix)
    if within is not None:
        root = Path(os.path.realpath(within))
        if resolved != root and root not in resolved.parents:
            raise UserError(f"{what} {path} leads outside {within} (to {resolved})", fix)
    return resolved


_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def folder_status(path: Path) -> os.stat_result:
    """The status of the folder `path` itself, never a link's target: opened O_NOFOLLOW|O_DIRECTORY,
    then fstat'ed (one object, not a name looked up twice); a link or file there is ELOOP/ENOTDIR."""
    fd = os.open(path, _FOLDER_FLAGS)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def make_folder(path: Path, what: str, fix: str, mode: int = 0o777) -> os.stat_result:
    """The status of the folder `path`, made if missing (parents too: they may be the user's links):
    a folder the runtime makes for itself (voices, res-dir, cache) is used only if `path` itself is
    one (folder_status), so a link planted there, before or after the mkdir, is a UserError, never
    followed. Callers that accept a user's link resolve it first (resolved_folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    try:
        return folder_status(path)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        kind = ("a symbolic link, not a folder (a folder made for the runtime is never followed through a link)"
                if os.path.islink(path) else "not a folder")
        raise UserError(f"{what} {path} is {kind}", fix) from None


def confined(folder: Path, name: str, what: str, fix: str) -> Path:
    """`folder / name` for a relative `name` read from a file (a report's file list), checked
    BEFORE anything opens it: an absolute name or one with a `..` part (`../../x.data`) would name a
    file outside the bundle, so it is a UserError, never opened or hashed."""
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts or "\0" in name:
        raise UserError(f"{what} names {name!r}, a path outside its folder {folder}", fix)
    return Path(folder) / name


LOCK_WAIT_S = 10.0  # how long a second writer of the same voice waits for the first before it is refused


class FolderLock:
    """An exclusive lock on `<folder>/.<name>.lock` (fcntl.flock, so the kernel releases it when its
    holder dies, however it dies): two writers of one voice name, or two batch runs into one
    res-dir, never interleave a check and a write. A second holder waits up to `wait_s` seconds,
    then is refused with one line naming the holder's pid. The holder removes the file when it
    releases; a waiter that then wins the lock on the removed file sees that the path no longer
    leads to it and tries again, so two processes never both hold the lock. The folder must exist."""

    def __init__(self, folder: Path, name: str, what: str, wait_s: float = LOCK_WAIT_S) -> None:
        self.path, self.what, self.wait_s = Path(folder) / f".{name}.lock", what, wait_s
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        deadline = time.monotonic() + self.wait_s
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        while True:
            with _errors_name(self.path):
                fd = os.open(self.path, flags, 0o666)  # os.open applies the umask itself
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
                os.close(fd)
                if time.monotonic() >= deadline:
                    raise UserError(f"{self.what} is in use by another process (pid {holder}, lock {self.path})",
                                    "wait for it to finish, then re-run") from None
                time.sleep(0.05)
                continue
            try:
                current = os.stat(self.path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                break
            os.close(fd)  # the holder removed this file as it released it: lock the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # while still held: see the class docstring
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = None

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def umask_mode(*paths: Path) -> None:
    """Give each file the mode a plain open() gives (0666 minus the umask).

    onnx's external-data writer and safetensors create their files 0600, so an exported graph's
    sidecar or a built checkpoint would be unreadable to other users of a shared machine or
    container while its `.onnx` is readable.
    """
    mask = _umask()
    for path in paths:
        os.chmod(path, 0o666 & ~mask)


def sha256_stream(handle: Any, chunk: int = 16 << 20) -> str:
    """Hex sha256 of the rest of an open binary file, read in chunks (graphs and checkpoints are GBs)."""
    digest = hashlib.sha256()
    while block := handle.read(chunk):
        digest.update(block)
    return digest.hexdigest()


def sha256_file(path: Path, chunk: int = 16 << 20) -> str:
    with open(path, "rb") as handle:
        return sha256_stream(handle, chunk)


def file_entry(path: Path) -> dict[str, Any]:
    """How an artefact lists one of its files: `{"sha256": ..., "bytes": ...}`."""
    path = Path(path)
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


FILE_ENTRY_SCHEMA = {"sha256": str, "bytes": int}  # file_entry() in schema_problem's notation


def matches_entry(path: Path, entry: Mapping[str, object]) -> bool:
    """Whether `path` is the file `entry` lists (size first: a truncated file costs no hashing)."""
    return Path(path).stat().st_size == entry["bytes"] and sha256_file(path) == entry["sha256"]


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
        raise UserError(f"{what} {path} cannot be reached ({exc.strerror})",
                        PERMISSION_FIX if exc.errno in (errno.EACCES, errno.EPERM) else fix) from exc
    if stat.S_ISDIR(mode):
        raise UserError(f"{what} {path} is a directory, not a file", fix)
    if not stat.S_ISREG(mode):
        raise UserError(f"{what} {path} is not a regular file", fix)
    try:
        open(path, "rb").close()
    except OSError as exc:
        raise UserError(f"cannot read {what} {path} ({exc.strerror})",
                        PERMISSION_FIX if exc.errno in (errno.EACCES, errno.EPERM) else fix) from exc
    return path


def write_json_atomic(path: Path, data: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


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
        raise UserError(f"cannot read {what} {path} ({exc.strerror or exc})",
                        PERMISSION_FIX if exc.errno in (errno.EACCES, errno.EPERM) else fix) from exc


def decode_text(data: bytes, where: str, fix: str) -> str:
    """`data` as UTF-8, strictly: an invalid byte is one line naming `where`, the line and the offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UserError(f"{where} is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}, offset "
                        f"{exc.start})", fix) from None


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


def read_json(path: Path, what: str, fix: str, limit: int = MAX_JSON_BYTES, data: bytes | None = None,
              schema: Any = None) -> Any:
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


_KINDS = {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string",
          list: "a list", dict: "an object"}


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


def read_artefact(path: Path, what: str, fix: str, version: int, schema: dict[str, Any],
                  check: Callable[[dict[str, Any]], str | None] = lambda data: None,
                  stale_fix: str | None = None) -> dict[str, Any]:
    """A JSON artefact (capture manifest, export report) whose `format` is `version`, that meets
    `schema` (see schema_problem) and whose values `check` accepts (it returns a problem or None);
    otherwise a UserError saying what is wrong with it (fix: `stale_fix`, else `fix`)."""
    data = read_json(path, what, fix)
    found = data.get("format") if isinstance(data, dict) else None
    # `"format": true` is not version 1
    if not isinstance(data, dict) or type(found) is not int or found != version:
        raise UserError(f"{what} {path} is of format {found!r}, not {version}: it is from another version, or "
                        "not one", stale_fix or fix)
    problem = schema_problem(data, schema) or check(data)
    if problem:
        raise UserError(f"{what} {path} is malformed: {problem}", stale_fix or fix)
    return data


def _nearest_existing(path: Path) -> Path:
    """`path` or the closest of its ancestors that exists (what mkdir(parents=True) starts from)."""
    path = Path(os.path.abspath(path))
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _can_create_in(directory: Path) -> OSError | None:
    """None when a file can be created in `directory` (tried, then removed), else the OSError.

    Tried rather than judged from the mode bits: os.access says yes to root on a read-only mount,
    and ACLs or a full quota say no where the mode bits say yes.
    """
    try:
        handle, name = tempfile.mkstemp(prefix=".write-test-", dir=directory)
    except OSError as exc:
        return exc
    os.close(handle)
    os.unlink(name)
    return None


def check_output(path: Path, flag: str, kind: str) -> None:
    """Before any work: `path` can be written as the script will write it; else a UserError
    naming `flag`. A run that fails only when it saves its result has thrown minutes away.

    kind  "file": written by files.atomic_path (a sibling renamed into place): `path` must not be
              a directory, and its directory must accept new files.
          "dir":  files are written inside it: `path` must be a directory or absent, and it (or the
              ancestor it will be created in) must accept new files.
          "tree": replaced whole by files.atomic_dir (a sibling directory renamed into place):
              `path` must be a directory or absent, and its parent must accept new files.
    """
    path = Path(path)
    if kind == "file" and path.is_dir():
        raise UserError(f"{flag} {path} is a directory", f"pass the path of a file to write, e.g. {path / 'out.wav'}")
    if kind in ("dir", "tree") and os.path.lexists(path) and not path.is_dir():
        raise UserError(f"{flag} {path} exists and is not a directory", "pass a directory (or a path to create one at)")
    existing = _nearest_existing(path if kind == "dir" else path.parent)
    if not existing.is_dir():
        raise UserError(f"{flag} {path}: {existing} is not a directory", "pass a path whose parents are directories")
    problem = _can_create_in(existing)
    if problem is not None:
        raise UserError(f"{flag} {path}: cannot create files in {existing} ({problem.strerror})",
                        "choose a writable location, or fix its permissions")


def check_input_dir(path: Path, flag: str) -> None:
    """`path` is a directory (an existing artefact directory: --capture-dir, --onnx-dir to read)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is not a directory", "pass the directory the earlier step wrote")
