"""Files the runtime and the toolchain write: atomic writes of files and folders, folders made
without following a planted link, locks, modes, and the checks that an output can be written
before any work. Shared by the runtime (audio output, voices, batch) and the toolchain
(omnivoice_export.common.files re-exports it): one copy. Hashing is in omnivoice_onnx.hashing, reading
(bounded, strict, checked against a schema) in omnivoice_onnx.reading.

Users run the scripts for minutes at a time on multi-GB files. An interrupted run must never
leave a half-written artefact where a complete one was: every file and directory is written
under a hidden temporary name beside its destination and renamed into place only when complete
(rename within one directory is atomic on POSIX); what a killed run left is removed by the next
write beside it. Temporary names are random and created exclusively, never followed through a
symlink (create_temporary): a shared writable folder cannot redirect a write.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from omnivoice_onnx.errors import ENVIRONMENT, UserError


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


# How open_regular opens: never through a link at the name itself (O_NOFOLLOW), never blocking on a
# fifo planted there (O_NONBLOCK: fstat then tells what it is), never inherited by a child process.
_REGULAR_FLAGS = getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def open_regular(path: Path, flags: int, what: str) -> int:
    """A descriptor of the regular file `path` (os.open `flags`, O_CREAT to make it), for a file this
    program writes at a fixed name beside the user's (a lock, a download's `.part`, a results file):
    a link, a folder, a fifo, a device or a second name of another file (a hard link) planted at
    that name is a UserError naming it, never written through. The one place such files are opened."""
    path = Path(path)
    try:
        with _errors_name(path):
            fd = os.open(path, flags | _REGULAR_FLAGS, 0o666)  # os.open applies the umask itself
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):  # ENXIO: a fifo with no reader
            raise
        raise _planted(path, what, os.lstat(path).st_mode if os.path.lexists(path) else 0) from None
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or status.st_nlink > 1:
        os.close(fd)
        raise _planted(path, what, status.st_mode)
    os.set_blocking(fd, True)
    return fd


def _planted(path: Path, what: str, mode: int) -> UserError:
    kind = (
        "a symbolic link"
        if stat.S_ISLNK(mode)
        else "a folder"
        if stat.S_ISDIR(mode)
        else "a second name of another file (a hard link)"
        if stat.S_ISREG(mode)
        else "a fifo, device or socket"
    )
    return UserError(
        f"{path} ({what}) is {kind}, not a file this program made: refused, never written through",
        f"remove {path} (something else put it there), then run again",
    )


def open_append(path: Path) -> TextIO:
    """`path` opened to append text lines (open_regular: a link planted in its place is refused,
    not written through)."""
    return os.fdopen(
        open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "a file it appends to"), "a", encoding="utf-8"
    )


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
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(tmp-(\d+)(?:-[^/]+)?|old-(\d+)(?:-[^/]+)?)")
    for sibling in path.parent.iterdir():
        match = pattern.fullmatch(sibling.name)
        if match is None or _process_alive(int(match.group(2) or match.group(3))):
            continue
        if match.group(3) and not os.path.lexists(path) and sibling.is_dir() and not sibling.is_symlink():
            os.replace(sibling, path)  # only a real folder: atomic_dir never sets a link aside
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
    aside before the new one is renamed in, so `path` is absent for an instant but never mixed:
    onto a fresh empty folder of a random name (`.<name>.old-<pid>-...`, made by mkdtemp; rename(2)
    replaces an empty folder), so a link planted at a fixed name cannot receive it. A link at `path`
    itself is removed (never its target) and replaced by the directory: callers that write into a
    user's linked folder resolve it first (resolved_folder).
    """
    path = Path(path)
    with temporary_dir(path) as tmp:
        yield tmp
        if os.path.islink(path):
            os.unlink(path)
            replace_into(tmp, path)
        elif os.path.isdir(path):
            old = tempfile.mkdtemp(prefix=f".{path.name}.old-{os.getpid()}-", dir=path.parent)
            os.replace(path, old)
            replace_into(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            replace_into(tmp, path)


@contextlib.contextmanager
def made_folders(folder: Path) -> Iterator[None]:
    """Make `folder` and its missing parents for the block; when the block fails, remove again the
    ones it made, deepest first, and only while empty (os.rmdir never removes what another wrote
    there): a refused run leaves the tree as it found it."""
    missing = []
    current = Path(os.path.abspath(folder))
    while not os.path.lexists(current) and current != current.parent:
        missing.append(current)
        current = current.parent
    Path(folder).mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        for made in missing:
            with contextlib.suppress(OSError):
                os.rmdir(made)
        raise


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
        kind = (
            "a symbolic link, not a folder (a folder made for the runtime is never followed through a link)"
            if os.path.islink(path)
            else "not a folder"
        )
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
        while True:
            fd = open_regular(self.path, os.O_RDWR | os.O_CREAT, f"the lock of {self.what}")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
                os.close(fd)
                if time.monotonic() >= deadline:
                    raise UserError(
                        f"{self.what} is in use by another process (pid {holder}, lock {self.path})",
                        "wait for it to finish, then re-run",
                    ) from None
                time.sleep(0.05)
                continue
            try:
                current = os.stat(self.path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                break
            os.close(fd)  # the holder removed this file as it released it: lock the new one
        self._fd = fd
        try:
            with _errors_name(self.path):  # a full disk fails here, on the pid: the lock goes with it
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            self.release()
            raise

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


def write_json_atomic(path: Path, data: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


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
        raise UserError(
            f"{flag} {path}: cannot create files in {existing} ({problem.strerror})",
            "choose a writable location, or fix its permissions",
        )


def check_input_dir(path: Path, flag: str) -> None:
    """`path` is a directory (an existing artefact directory: --capture-dir, --onnx-dir to read)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is not a directory", "pass the directory the earlier step wrote")
