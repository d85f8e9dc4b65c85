"""The record of the files this user's processes already hashed (VerifiedFiles), so that opening
an unchanged bundle again hashes nothing; and how a file's version is told (stat_identity), which
the voices store uses too. bundle.Bundle.verify asks it about each file it loads, and the
toolchain's checks of capture files, graphs and variants (omnivoice_export.common.files.first_mismatch)
about each file they list.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import FolderLock, atomic_path, folder_status, make_folder
from omnivoice_onnx.hashing import sha256_stream
from omnivoice_onnx.reading import Each, read_json

VERIFY_ENV = "OMNIVOICE_VERIFY"  # "0": skip the sha256 check (verify=False for every open); "full": no record
CACHE_ENV = "OMNIVOICE_CACHE_DIR"  # where VerifiedFiles keeps its record; "" keeps none
CACHE_SUBDIR = "omnivoice-onnx"  # the folder under $XDG_CACHE_HOME or ~/.cache
VERIFIED_FILE = "verified-files.json"
VERIFIED_FORMAT, VERIFIED_VERSION = "omnivoice-onnx verified files", 1
VERIFIED_MAX = 1024  # files remembered (a variant loads 8, the toolchain checks a capture of ~150); oldest go first
VERIFIED_LOCK_S = 2.0  # another process saving the record holds its lock for milliseconds
VERIFIED_SCHEMA = {"format": str, "version": int, "files": Each({"stat": [int], "sha256": str})}
VERIFIED_MAX_BYTES = 8 << 20  # 1,024 entries of 4,096-character paths are ~4.4 MB; a larger record is not ours
# A file whose inode changed (ctime) less than this before its hash began is hashed but not
# remembered: file times tick coarsely (a kernel tick), so a write in the same tick as that ctime
# could leave the stat identity unchanged. A file older than this that changes later gets a later
# ctime. (git's "racy" index entries.) The comparison is with this machine's clock: a network
# file server whose clock runs more than this behind defeats it (docs/package.md names the limits).
RACY_NS = 2_000_000_000
MAX_ASSET_BYTES = 256 << 20  # a file read whole (bundle.READ_WHOLE) larger than this is not one an export writes


@dataclass(frozen=True)
class Seen:
    """A file found as its report entry lists it, as it was when hashed (or vouched for)."""

    identity: list[int]  # stat_identity of the opened file, taken before its bytes were read
    data: bytes | None  # its bytes, for a file read whole (bundle.READ_WHOLE); None for a graph


def file_digest(handle: Any, data: bytes | None) -> str:
    """The sha256 of a file being verified: of `data` when it was read whole, else of the rest of
    the open `handle` (the file object whose identity was taken: one open, one read)."""
    return hashlib.sha256(data).hexdigest() if data is not None else sha256_stream(handle)


def verify_mode() -> str:
    """$OMNIVOICE_VERIFY, read in this one place: "off" ("0": no sha256 check), "full" ("full":
    every file hashed, VerifiedFiles' record not trusted), else "cached" (the default)."""
    value = os.environ.get(VERIFY_ENV, "").strip().lower()
    return {"0": "off", "full": "full"}.get(value, "cached")


def cache_dir() -> Path | None:
    """The runtime's cache folder: $OMNIVOICE_CACHE_DIR, else $XDG_CACHE_HOME/omnivoice-onnx (an
    absolute one: the XDG spec ignores a relative value), else ~/.cache/omnivoice-onnx; None when
    $OMNIVOICE_CACHE_DIR is set empty or there is no home (no $HOME and no passwd entry)."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return Path(value) if value.strip() else None
    base = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(base):
        return Path(base) / CACHE_SUBDIR
    home = os.path.expanduser("~")  # "~" itself when no home can be found
    return Path(home) / ".cache" / CACHE_SUBDIR if os.path.isabs(home) else None


def stat_identity(status: os.stat_result) -> list[int]:
    """What changes when a file's content may have: device, inode, size, mtime and ctime in ns.
    On local POSIX file systems the kernel sets ctime on every write, rename and touch and a user
    cannot set it back (mtime can: `touch -d`, os.utime), so a rewrite that restores size and
    mtime still shows. (vfat/exFAT, SMB and some FUSE file systems do not keep that promise.)"""
    return [status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns]


def _put(entries: dict[str, Any], key: str, entry: dict[str, Any] | None) -> None:
    """Set `key` to `entry` last in `entries` (the most recently hashed are kept), or drop it (None)."""
    entries.pop(key, None)
    if entry is not None:
        entries[key] = entry


def _private(status: os.stat_result) -> bool:
    """Owned by this user and writable by no one else."""
    return status.st_uid == os.geteuid() and not status.st_mode & 0o022


class VerifiedFiles:
    """The files this user's processes hashed and found as an export report (or the toolchain's
    capture manifest) lists them, each with
    its stat identity: a later check of the same path with the same identity and the same
    expected sha256 is answered without reading the file (a full-size int8 `speak` spent 4.5 of
    its 6.2 s load hashing files that had not changed since the last one).

    What it trusts: that a file whose device, inode, size, mtime and ctime are unchanged holds the
    bytes it held when hashed (make's and rsync's quick check, with ctime added; stat_identity
    names the file systems where ctime can be set). The identity is taken from the opened file, so
    a network file system revalidates it. Corruption that bypasses the file system (a failing
    disk) is not seen until OMNIVOICE_VERIFY=full or `omnivoice-onnx info` hash the file again;
    a mismatch found then drops its entry. The record is read only from a folder and a file that
    belong to this user and that no one else may write, and written only there (or where this user
    may create that folder: under `sudo` with the user's HOME, root leaves the user's cache alone).
    It is written to a temporary name and renamed (files.atomic_path: never through a planted link),
    under a lock, merged with what other processes wrote since it was read. A missing, damaged,
    foreign or unwritable record only means the files are hashed: never an error.
    """

    def __init__(self, path: Path | None, reuse: bool = True) -> None:
        self.path = path  # None: nothing is remembered (no cache folder)
        self.reuse = reuse  # False: every file is hashed (the record is only refreshed)
        self.entries = self._read()
        self.updates: dict[str, dict[str, Any] | None] = {}  # this process's additions (None: dropped)

    @classmethod
    def in_cache(cls, reuse: bool = True) -> VerifiedFiles:
        """The record in cache_dir(); with `reuse` False (info), or $OMNIVOICE_VERIFY=full, every
        file is hashed and the record refreshed."""
        folder = cache_dir()
        return cls(folder / VERIFIED_FILE if folder else None, reuse=reuse and verify_mode() != "full")

    def _read(self) -> dict[str, dict[str, Any]]:
        """The record's entries; {} unless it is this user's own, private, well-formed record."""
        try:
            if self.path is None or not (_private(folder_status(self.path.parent)) and _private(os.lstat(self.path))):
                return {}
            data = read_json(
                self.path,
                "verified-files record",
                f"delete it (or set {CACHE_ENV}=)",
                limit=VERIFIED_MAX_BYTES,
                schema=VERIFIED_SCHEMA,
            )
        except (OSError, UserError):  # none yet, unreadable, damaged or of another shape: every file is hashed
            return {}
        if (data["format"], data["version"]) != (VERIFIED_FORMAT, VERIFIED_VERSION):
            return {}
        return cast("dict[str, dict[str, Any]]", data["files"])  # VERIFIED_SCHEMA's shape, checked by read_json

    def _note(self, key: str, entry: dict[str, Any] | None) -> None:
        """Record `entry` for `key` (None: drop it) here and in the updates save() writes."""
        _put(self.entries, key, entry)
        self.updates.pop(key, None)
        self.updates[key] = entry

    def matches(self, path: Path, entry: Mapping[str, Any], whole: bool = False) -> Seen | None:
        """What `path` was, when it is the file `entry` ({sha256, bytes}) lists (its size, then the
        record, then its sha256); None when it is not. One open: the identity is the opened file's
        (fstat) and the hash is of what that file object reads; with `whole`, the file is read
        into memory once and `Seen.data` holds the bytes that were hashed (or vouched for), for
        the caller to parse. A match is remembered unless the file changed while it was read or
        within RACY_NS before; otherwise what the record said of the path is dropped."""
        key = os.path.realpath(path)
        with open(path, "rb") as handle:  # opened, not only stat'ed: NFS revalidates on open
            before = os.fstat(handle.fileno())
            identity = stat_identity(before)
            if before.st_size != entry["bytes"] or (whole and before.st_size > MAX_ASSET_BYTES):
                if key in self.entries:
                    self._note(key, None)
                return None
            data = handle.read(MAX_ASSET_BYTES + 1) if whole else None
            if data is not None and stat_identity(os.fstat(handle.fileno())) != identity:
                return None  # written to while it was read: not the file the record (or a hash) vouches for
            if self.reuse and self.entries.get(key) == {"stat": identity, "sha256": entry["sha256"]}:
                return Seen(identity, data)
            started = time.time_ns()
            if file_digest(handle, data) != entry["sha256"]:
                if key in self.entries:
                    self._note(key, None)
                return None
        if stat_identity(os.stat(path)) == identity and before.st_ctime_ns < started - RACY_NS:
            self._note(key, {"stat": identity, "sha256": entry["sha256"]})
        elif key in self.entries:
            self._note(key, None)  # an earlier version's entry: of no use again
        return Seen(identity, data)

    def _folder(self, path: Path) -> Path | None:
        """The folder of the record at `path`, made 0700 if missing, when it is this user's and
        private; None when it is not, or when it is missing and its nearest existing parent is
        someone else's (root under `sudo` with the user's HOME)."""
        folder = path.parent
        if not os.path.lexists(folder):
            parent = next((p for p in folder.absolute().parents if p.exists()), None)
            if parent is None or os.stat(parent).st_uid != os.geteuid():
                return None
        # Made and checked without following a link (a planted one, even to a private folder of this
        # user's, is refused: UserError, caught by save); checked after the mkdir: it may be another's.
        status = make_folder(folder, "the verification record's folder", f"remove it (or set {CACHE_ENV}=)", 0o700)
        return folder if _private(status) else None

    def save(self) -> None:
        """Write this process's updates into the record as it is now, under the folder's lock
        (another process may have written since it was read), keeping the VERIFIED_MAX most
        recently hashed files; mode 0600 whatever the umask (a group-writable record is not read)."""
        if self.path is None or not self.updates:
            return
        try:
            folder = self._folder(self.path)
            if folder is None:
                return
            with FolderLock(folder, VERIFIED_FILE, "the verification record", wait_s=VERIFIED_LOCK_S):
                current = self._read()
                for key, entry in self.updates.items():
                    _put(current, key, entry)
                kept = dict(list(current.items())[-VERIFIED_MAX:])
                with atomic_path(self.path) as tmp:
                    tmp.write_text(
                        json.dumps({"format": VERIFIED_FORMAT, "version": VERIFIED_VERSION, "files": kept}, indent=1)
                        + "\n"
                    )
                    os.chmod(tmp, 0o600)
        except (OSError, UserError, ValueError):  # a record that cannot be written costs a hash, never the load
            pass
        self.updates = {}
