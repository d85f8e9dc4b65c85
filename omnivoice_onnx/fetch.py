"""A model people can get: one variant of a bundle packed into a release archive, and a bundle
downloaded from a Hugging Face repo or from an archive URL, verified before it is used.

    pack(Path("onnx"), "int8", Path("omnivoice-int8.tar"))          # omnivoice-onnx pack
    download("ORG/NAME", Path("models/omnivoice"), variant="int8")     # omnivoice-onnx download
    download("https://host/omnivoice-int8.tar", Path("m"), sha256="...")

What a variant needs is derived, never listed by hand (omnivoice_onnx.hub.release_files: the files
Bundle.file_checks names for it, each with the sha256 the export report records, plus the report
itself and the model card). An archive carries them with a
manifest (MANIFEST_FILE, its first member) of every member's {sha256, bytes}; the downloaded
folder keeps a manifest too, with where it came from, so a second download of the same thing
finds it in place and fetches nothing.

Nothing half-downloaded is ever used: an archive is fetched to `.<dir>.<hash>.part` beside the
folder (files.open_regular: a link or anything else planted at that name is refused, never written
through) by omnivoice_onnx.resumable (resumed, bounded, kept only when the fetch was interrupted),
checked against the sha256 the user gave, then extracted from that same open file into a temporary
sibling folder (files.atomic_dir), each file hashed as it is written and checked against the
manifest and the export report, and only then renamed onto the folder. Any refusal removes the
`.part` and the folders the download made for --dir. A Hugging Face repo is read through
huggingface_hub (omnivoice_onnx.hub: its cache, its resumable downloads, HF_HUB_OFFLINE /
local_files_only), only the variant's files, then copied the same way. The saved voices of the
bundle a download replaces (its voices/) are carried into the new one before the swap.
Extraction takes regular files and folders only, at names inside the folder: an absolute name, a
`..` part, a link, a device or a member larger than MAX_MEMBER_BYTES is refused before anything
of it is written.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import urllib.parse
import zlib
from pathlib import Path
from typing import IO, Any, BinaryIO, Literal

from omnivoice_onnx.bundle import MANIFEST_FILE, MODEL_CARD_FILE, VARIANT_NAME, Bundle, Folder, read_report
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import (
    FolderLock,
    atomic_dir,
    atomic_path,
    confined,
    made_folders,
    open_regular,
    resolved_folder,
)
from omnivoice_onnx.hashing import FILE_ENTRY_SCHEMA, sha256_file, sha256_stream
from omnivoice_onnx.hub import check_hub_repo, check_revision, hub_snapshot, release_files
from omnivoice_onnx.reading import Each, parse_json, schema_problem
from omnivoice_onnx.resumable import HTTP_SCHEMES, fetch_resumable, kept_line
from omnivoice_onnx.verified import VerifiedFiles

MANIFEST_FORMAT, MANIFEST_VERSION = "omnivoice-onnx release", 1
MANIFEST_SCHEMA = {
    "format": str,
    "version": int,
    "variant": str,
    "model_fingerprint": str,
    "files": Each(FILE_ENTRY_SCHEMA),
}
MAX_MANIFEST_BYTES = 1 << 20  # a manifest lists a dozen files
# The largest member extraction writes: the real model's fp32 transformer sidecar is ~2.4 GB; a
# member claiming more is not a file of this model (a tar header can claim any size).
MAX_MEMBER_BYTES = 16 << 30
MAX_MEMBERS = 64  # a variant has at most a dozen files
# pack's -o suffixes (weights barely compress)
ARCHIVE_MODES: dict[str, Literal["w", "w:gz"]] = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz"}
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
SHA256_FIX = (
    "pass --sha256 HEX, the 64 hex digits its publisher gives beside the archive (`omnivoice-onnx pack` prints them)"
)
CHUNK = 1 << 20


def _manifest(
    variant: str, fingerprint: str, files: dict[str, dict[str, Any]], source: dict[str, str] | None = None
) -> dict[str, Any]:
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "variant": variant,
        "model_fingerprint": fingerprint,
        "files": files,
    }
    if source is not None:
        manifest["source"] = source  # where a downloaded folder came from (download() compares it)
    return manifest


def _manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()


def read_manifest(data: bytes, where: str, fix: str) -> dict[str, Any]:
    """A manifest's JSON, checked against MANIFEST_SCHEMA and its format."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise UserError(f"{where} is larger than a manifest ({len(data)} bytes)", fix)
    try:
        manifest: dict[str, Any] = parse_json(data.decode("utf-8"), where, fix)  # an object: schema_problem says
    except UnicodeDecodeError:
        raise UserError(f"{where} is not UTF-8 text", fix) from None
    problem = schema_problem(manifest, MANIFEST_SCHEMA)
    if problem or manifest["format"] != MANIFEST_FORMAT or manifest["version"] != MANIFEST_VERSION:
        raise UserError(
            f"{where} is not an {MANIFEST_FORMAT} manifest, version {MANIFEST_VERSION}"
            + (f" ({problem})" if problem else ""),
            fix,
        )
    return manifest


class _Hashing:
    """A file object read through, hashing what passes: tarfile reads each member once."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle, self.digest, self.bytes = handle, hashlib.sha256(), 0

    def read(self, size: int = -1) -> bytes:
        block = self.handle.read(size)
        self.digest.update(block)
        self.bytes += len(block)
        return block


def pack(model_dir: Path, variant: str | None, out: Path) -> tuple[dict[str, Any], str]:
    """Write the release archive of `variant` of the bundle in `model_dir` to `out` (.tar or
    .tar.gz): the manifest first, then release_files in order, each checked against the report
    before and hashed again as it is written (a file changed meanwhile is refused). Deterministic:
    the same bundle gives the same bytes (no times, owners or modes from this machine). The archive
    appears at `out` only when complete. Returns (the manifest, the archive's sha256: what its
    publisher gives beside it, and `download URL --sha256` requires)."""
    mode = next((m for suffix, m in ARCHIVE_MODES.items() if out.name.endswith(suffix)), None)
    if mode is None:
        raise UserError(
            f"-o {out}: an archive name must end in {', '.join(ARCHIVE_MODES)}", "name it e.g. omnivoice-int8.tar"
        )
    bundle = Bundle.open(model_dir, variant)  # every file the variant loads checked against the report
    report = bundle.report
    if report is None:  # opened unchecked (OMNIVOICE_VERIFY=0) without a readable report
        why = bundle.report_error.problem if bundle.report_error is not None else f"{bundle.report_path} was not read"
        raise UserError(
            f"cannot pack without the export report, which lists the files to ship and their sha256: {why}",
            "re-run export_omnivoice.py into an empty folder (OMNIVOICE_VERIFY=0 does not skip the report for pack)",
        )
    expected = {check.path.relative_to(bundle.dir).as_posix(): check.entry for check in bundle.file_checks()}
    files: dict[str, dict[str, Any]] = {}
    for name in release_files(report, bundle.variant):
        path = bundle.member(name)
        if not path.is_file():
            raise UserError(
                f"{path} is missing (the bundle's {'model card' if name == MODEL_CARD_FILE else name})",
                "re-run export_omnivoice.py into an empty folder",
            )
        files[name] = expected.get(name) or {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    manifest = _manifest(bundle.variant, bundle.fingerprint, files)
    with atomic_path(out) as tmp:
        with tarfile.open(tmp, mode, format=tarfile.PAX_FORMAT) as archive:
            head = _manifest_bytes(manifest)
            archive.addfile(_member(MANIFEST_FILE, len(head)), _Hashing(io.BytesIO(head)))
            for name, entry in files.items():
                with open(bundle.member(name), "rb") as handle:
                    reader = _Hashing(handle)
                    archive.addfile(_member(name, entry["bytes"]), reader)
                if reader.digest.hexdigest() != entry["sha256"]:
                    raise UserError(
                        f"{bundle.member(name)} changed while it was packed", "pack again when nothing writes it"
                    )
        digest = sha256_file(tmp)  # of the bytes renamed onto `out`: what `download --sha256` checks
    return manifest, digest


def _member(name: str, size: int) -> tarfile.TarInfo:
    """A regular-file member with nothing of this machine in it (owner, time, mode)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info


def _safe_member(member: tarfile.TarInfo, where: str) -> str:
    """The member's name, when extraction may write it: a regular file at a relative name with no
    `..` part, of a size this model's files can have. Anything else is a UserError."""
    fix = "this is not a release archive written by omnivoice-onnx pack: get the archive from its publisher again"
    name = member.name
    if not member.isfile():
        kind = (
            "a link"
            if member.issym() or member.islnk()
            else "a device or special file"
            if member.isdev() or member.isfifo()
            else "a folder"
            if member.isdir()
            else "not a regular file"
        )
        raise UserError(f"{where} holds {name!r}, {kind}: refused", fix)
    parts = Path(name).parts
    if name.startswith(("/", "\\")) or ".." in parts or "\\" in name or "\0" in name or not parts:
        raise UserError(f"{where} holds a member named {name!r}, a path outside the folder: refused", fix)
    if member.size > MAX_MEMBER_BYTES:
        raise UserError(
            f"{where} holds {name!r} of {member.size} bytes, larger than any file of this model: refused", fix
        )
    return Path(name).as_posix()


def _copy_hashed(source: IO[bytes], target: Path, limit: int) -> dict[str, Any]:
    """Copy `source` into the new file `target`, at most `limit` bytes; its {sha256, bytes}."""
    digest, size = hashlib.sha256(), 0
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "xb") as out:
        while block := source.read(CHUNK):
            size += len(block)
            if size > limit:
                raise UserError(f"{target.name} is longer than its manifest says", "get the archive again")
            digest.update(block)
            out.write(block)
    return {"sha256": digest.hexdigest(), "bytes": size}


def _member_bytes(archive: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    """A regular member's bytes (extractfile has none for anything else, refused before this)."""
    handle = archive.extractfile(member)
    if handle is None:
        raise tarfile.ReadError(f"{member.name} is not a regular file")
    return handle


def extract(source: IO[bytes], folder: Path, where: str) -> dict[str, Any]:
    """Extract the release archive read from `source` (an open file, at its start: the one the
    download wrote and hashed, never its name looked up again) into the empty `folder`, checking
    every member (_safe_member) and its bytes against the manifest (the first member) as it is
    written; the manifest."""
    fix = "get the archive from its publisher again (damaged, or not written by omnivoice-onnx pack)"
    try:
        with tarfile.open(fileobj=source, mode="r:*") as archive:
            first = archive.next()
            if first is None or first.name != MANIFEST_FILE or not first.isfile():
                raise UserError(
                    f"{where} does not start with {MANIFEST_FILE}: not an omnivoice-onnx release archive", fix
                )
            manifest = read_manifest(
                _member_bytes(archive, first).read(MAX_MANIFEST_BYTES + 1), f"{where}'s manifest", fix
            )
            found: dict[str, dict[str, Any]] = {}
            for count, member in enumerate(iter(archive.next, None)):
                name = _safe_member(member, where)
                entry = manifest["files"].get(name)
                if count >= MAX_MEMBERS or entry is None or name in found:
                    raise UserError(f"{where} holds {name!r}, which its manifest does not list (once)", fix)
                if member.size != entry["bytes"]:
                    raise UserError(f"{where}: {name} is {member.size} bytes, its manifest says {entry['bytes']}", fix)
                found[name] = _copy_hashed(
                    _member_bytes(archive, member), confined(folder, name, where, fix), entry["bytes"]
                )
                if found[name] != entry:
                    raise UserError(f"{where}: {name} does not match the sha256 its manifest lists", fix)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:  # truncated or not an archive
        raise UserError(f"{where} is not a readable archive ({str(exc) or type(exc).__name__})", fix) from None
    missing = sorted(set(manifest["files"]) - set(found))
    if missing:
        raise UserError(f"{where} lacks {missing[0]}, which its manifest lists", fix)
    return manifest


def check_folder(folder: Path, variant: str, found: dict[str, dict[str, Any]], where: str) -> str:
    """Every file `variant` needs is in `found` ({name: {sha256, bytes}} of what was written into
    `folder`) as the folder's own export report records it; the model fingerprint."""
    fix = f"{where} is damaged or not a bundle of this runtime: get it from its publisher again"
    report = read_report(folder)
    bundle = Bundle(folder, variant, report)
    for check in bundle.file_checks():
        name = check.path.relative_to(folder).as_posix()
        if name not in found:
            raise UserError(f"{where} lacks {name}, which variant {variant} needs", fix)
        if found[name] != check.entry:
            raise UserError(f"{where}: {name} does not match the sha256 its export report records", fix)
    return bundle.metadata["model_fingerprint"]


def installed(target: Path, source: dict[str, str], variant: str | None) -> dict[str, Any] | None:
    """The manifest of the download already in `target` when it came from `source`, is of
    `variant` (None: any) and every file is still as listed (VerifiedFiles: hashed again only
    when changed since last checked); else None."""
    where = Folder(target).manifest_path
    try:
        manifest = read_manifest(where.read_bytes(), str(where), "")
    except (OSError, UserError):
        return None
    if manifest.get("source") != source or variant not in (None, manifest["variant"]):
        return None
    verified = VerifiedFiles.in_cache()
    try:
        for name, entry in manifest["files"].items():
            path = confined(target, name, str(where), "")
            if not (path.is_file() and verified.matches(path, entry)):
                return None
    except (OSError, UserError):
        return None
    finally:
        verified.save()
    return manifest


def check_target(target: Path) -> None:
    """`target` may receive a download: absent, empty, or a folder an earlier download wrote
    holding nothing else but saved voices in its voices/ (carried into the new bundle:
    _carry_voices); a file of the user's elsewhere is never replaced."""
    if not target.exists():
        return
    if not target.is_dir():
        raise UserError(f"--dir {target} exists and is not a folder", "pass a new folder")
    voices = Folder(target).voices_path.relative_to(target).as_posix()
    present = {
        name
        for p in target.rglob("*")
        if p.is_symlink() or not p.is_dir()
        if (name := p.relative_to(target).as_posix()) != voices and not name.startswith(voices + "/")
    }
    if not present:
        return
    where = Folder(target).manifest_path
    try:
        manifest = read_manifest(where.read_bytes(), str(where), "")
    except (OSError, UserError):
        raise UserError(
            f"--dir {target} is not empty and holds no earlier download", "pass a new or empty folder"
        ) from None
    others = sorted(present - set(manifest["files"]) - {MANIFEST_FILE})
    if others:
        raise UserError(
            f"--dir {target} holds {others[0]}, which a new download would remove",
            "move it out first, or pass a new folder",
        )


def _carry_voices(target: Path, staged: Path) -> None:
    """The saved voices of the bundle a download replaces (its voices/: a folder, or a link as it
    is), copied into the staged new bundle last, once all of it has passed: the rename that
    installs it (files.atomic_dir) brings them along, and a run that fails or is stopped before
    that rename leaves the old bundle and its voices as they were."""
    voices, into = Folder(target).voices_path, Folder(staged).voices_path
    if os.path.islink(voices):
        os.symlink(os.readlink(voices), into)
    elif voices.is_dir():
        shutil.copytree(voices, into, symlinks=True)


def download(
    source: str,
    target: Path,
    variant: str | None = None,
    sha256: str | None = None,
    local_files_only: bool = False,
    revision: str | None = None,
) -> tuple[dict[str, Any], bool]:
    """Get the bundle `source` (a Hugging Face repo id, or an http(s) URL of a release archive
    with its `sha256`) into the folder `target`, verified; (its manifest, whether anything was
    fetched). A download already there from the same source is kept as it is."""
    target = Path(target)
    if variant is not None and not VARIANT_NAME.fullmatch(variant):
        raise UserError(f"--variant {variant!r:.60} is not a variant name", "pass e.g. int8, fp32-fused or fp32")
    if "://" in source:
        if urllib.parse.urlsplit(source).scheme.lower() not in HTTP_SCHEMES:
            raise UserError(
                f"{source!r:.120} is not an http(s) URL: a download fetches http(s) only",
                "pass https://.../ARCHIVE.tar with --sha256 HEX, or a Hugging Face repo id ORG/NAME",
            )
        if sha256 is None or not SHA256_HEX.fullmatch(sha256.lower().removeprefix("sha256:")):
            raise UserError(
                "an archive URL needs --sha256 HEX, the archive's sha256, to check what arrives"
                if sha256 is None
                else f"--sha256 {sha256!r:.80} is not a sha256 (64 hex digits)",
                SHA256_FIX,
            )
        sha256 = sha256.lower().removeprefix("sha256:")
        origin = {"url_sha256": sha256}
    else:
        check_hub_repo(source, "SOURCE")
        check_revision(revision)
        if sha256 is not None:
            raise UserError("--sha256 is for an archive URL", "leave it out for a Hugging Face repo")
        origin = {"hf_repo": source, "revision": revision or "main"}
    # A --dir that is a link is the folder it names, resolved once: the lock, the .part and the
    # staging folder lie beside that folder, and a link swapped later redirects nothing.
    target = resolved_folder(target, "--dir", "pass a folder (or a path to create one at)")
    with made_folders(target.parent), FolderLock(target.parent, target.name, f"the download into {target}"):
        done = installed(target, origin, variant)
        if done is not None:
            if sha256 is not None:  # a run stopped after its swap kept the .part it no longer needs
                archive_part(target, sha256).unlink(missing_ok=True)
            return done, False
        check_target(target)
        if sha256 is not None:  # an archive URL (a hub repo was refused one above)
            manifest = _download_archive(source, sha256, target, variant)
        else:
            manifest = _download_hub(source, target, variant, local_files_only, revision)
        return manifest, True


def archive_part(target: Path, sha256: str) -> Path:
    """Where the archive of `sha256` for `target` is fetched to: hidden, beside it."""
    return target.with_name(f".{target.name}.{sha256[:16]}.part")


def _download_archive(url: str, sha256: str, target: Path, variant: str | None) -> dict[str, Any]:
    """Fetch, check and extract the archive. Its `.part` is kept when the run is stopped (Ctrl-C,
    SIGTERM) during the fetch or the check of the whole file, and the last line says so: the same
    command resumes it. Once the fetch is whole, any other end removes it (the bytes are the ones
    asked for, or refused: fetching them again gives the same)."""
    part = archive_part(target, sha256)
    fd = open_regular(part, os.O_RDWR | os.O_CREAT, "the partial download")
    with open(fd, "r+b") as handle:
        fetch_resumable(url, handle, part)
        try:
            manifest = _install_archive(url, sha256, handle, target, variant)
        except KeyboardInterrupt as exc:
            raise type(exc)(kept_line(part, handle.seek(0, os.SEEK_END))) from None
        except BaseException:
            part.unlink(missing_ok=True)
            raise
    part.unlink(missing_ok=True)
    return manifest


def _install_archive(url: str, sha256: str, handle: BinaryIO, target: Path, variant: str | None) -> dict[str, Any]:
    handle.seek(0)
    got = sha256_stream(handle)
    if got != sha256:
        raise UserError(
            f"the archive at {url} has sha256 {got}, not the {sha256} given (changed, damaged in transit, "
            "or a wrong hash); nothing was kept",
            "check the hash its publisher gives, then run again",
        )
    handle.seek(0)
    with atomic_dir(target) as tmp:  # renamed onto target (an earlier download replaced whole) only if all passes
        manifest = extract(handle, tmp, url)
        if variant not in (None, manifest["variant"]):
            raise UserError(
                f"the archive at {url} holds variant {manifest['variant']}, not {variant}",
                f"pass --variant {manifest['variant']}, or the URL of the {variant} archive",
            )
        fingerprint = check_folder(tmp, manifest["variant"], manifest["files"], url)
        if fingerprint != manifest["model_fingerprint"]:
            raise UserError(
                f"the archive at {url} says model {manifest['model_fingerprint']}, its graphs {fingerprint}",
                "get the archive from its publisher again",
            )
        result = {**manifest, "source": {"url_sha256": sha256}}
        Folder(tmp).manifest_path.write_bytes(_manifest_bytes(result))
        _carry_voices(target, tmp)
    return result


def _download_hub(
    repo: str, target: Path, variant: str | None, local_files_only: bool, revision: str | None
) -> dict[str, Any]:
    snapshot, variant = hub_snapshot(repo, variant, local_files_only, revision)
    with atomic_dir(target) as tmp:  # renamed onto target (an earlier download replaced whole) only if all passes
        found = {}
        for name in release_files(read_report(snapshot), variant):
            with open(Folder(snapshot).member(name), "rb") as handle:
                found[name] = _copy_hashed(handle, Folder(tmp).member(name), MAX_MEMBER_BYTES)
        fingerprint = check_folder(tmp, variant, found, f"Hugging Face repo {repo}")
        manifest = _manifest(variant, fingerprint, found, {"hf_repo": repo, "revision": revision or "main"})
        Folder(tmp).manifest_path.write_bytes(_manifest_bytes(manifest))
        _carry_voices(target, tmp)
    return manifest
