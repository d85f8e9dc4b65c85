"""A model people can get: one variant of a bundle packed into a release archive, and a bundle
downloaded from a Hugging Face repo or from an archive URL, verified before it is used.

    pack(Path("onnx"), "int8", Path("omnivoice-int8.tar"))          # omnivoice-onnx pack
    download("ORG/NAME", Path("models/omnivoice"), variant="int8")     # omnivoice-onnx download
    download("https://host/omnivoice-int8.tar", Path("m"), sha256="...")
    resolve_model_dir("hf:ORG/NAME", "int8")                          # --model-dir hf:ORG/NAME

What a variant needs is derived, never listed by hand: the files Bundle.file_checks names for it
(its transformer, the codec graphs, tokenizer.json, runtime-config.json, each with the sha256 the
export report records), plus the report itself and the model card. An archive carries them with a
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
huggingface_hub (its cache, its resumable downloads, HF_HUB_OFFLINE / local_files_only), only the
variant's files, then copied the same way. Extraction takes regular files and folders only, at
names inside the folder: an absolute name, a `..` part, a link, a device or a member
larger than MAX_MEMBER_BYTES is refused before anything of it is written.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO, Literal

from omnivoice_onnx.bundle import (
    DEFAULT_VARIANT_ORDER,
    MANIFEST_FILE,
    MODEL_CARD_FILE,
    VARIANT_NAME,
    Bundle,
    Folder,
    read_report,
    report_variants,
)
from omnivoice_onnx.contract import FP32_VARIANT, REPORT_FILE
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
from omnivoice_onnx.reading import Each, parse_json, schema_problem
from omnivoice_onnx.resumable import HTTP_SCHEMES, fetch_resumable
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
HF_PREFIX = "hf:"  # --model-dir hf:ORG/NAME (__main__.resolve_hub_model_dirs looks for it)
# A Hugging Face repo id as huggingface_hub.utils.validate_repo_id accepts it (2.x; tests hold the
# two to the same verdicts), namespace required: each part 1-96 of A-Z a-z 0-9 . _ -, starting and
# ending with a letter, digit or _, no `--` or `..` anywhere, not ending in `.git`. Checked here so
# that huggingface_hub's HFValidationError (a traceback) is never reached.
HF_NAME_PART = r"(?=[A-Za-z0-9._-]{1,96}(?:/|$))[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?"
HF_REPO_ID = re.compile(rf"(?!.*(?:--|\.\.))(?!.*\.git$){HF_NAME_PART}/{HF_NAME_PART}")
HF_REPO_FIX = (
    "pass ORG/NAME as the Hub shows it (letters, digits, '-', '_', '.'; each part at most 96, starting "
    "and ending with a letter or digit; no '--' or '..')"
)
# A --revision: a branch, tag or commit as git names them (git check-ref-format's main rules).
REVISION = re.compile(r"(?!.*(?:\.\.|@\{|//))(?!/)(?!.*[/.]$)(?!.*\.lock(?:/|$))[^\x00-\x20\x7f~^:?*\[\\]{1,256}")
# pack's -o suffixes (weights barely compress)
ARCHIVE_MODES: dict[str, Literal["w", "w:gz"]] = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz"}
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
CHUNK = 1 << 20


def release_files(report: dict[str, Any], variant: str) -> list[str]:
    """The names, relative to a bundle, of what `variant` needs: what Bundle.file_checks checks
    (its transformer, the codecs, the runtime assets), then the report and the model card."""
    if variant != FP32_VARIANT and variant not in report_variants(report):
        raise UserError(
            f"the bundle has no variant {variant!r} (it has: {', '.join([FP32_VARIANT, *report_variants(report)])})",
            "pass --variant one of those",
        )
    root = Path("/bundle")  # file_checks names paths; none is opened
    names = [check.path.relative_to(root).as_posix() for check in Bundle(root, variant, report).file_checks()]
    return names + [REPORT_FILE, MODEL_CARD_FILE]


def default_release_variant(report: dict[str, Any]) -> str:
    """The variant a download takes when none is named: the runtime's default order among those
    the report lists (bundle.default_variant, without a folder to look in)."""
    listed = report_variants(report)
    return next((name for name in DEFAULT_VARIANT_ORDER if name == FP32_VARIANT or name in listed), FP32_VARIANT)


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


def pack(model_dir: Path, variant: str | None, out: Path) -> dict[str, Any]:
    """Write the release archive of `variant` of the bundle in `model_dir` to `out` (.tar or
    .tar.gz): the manifest first, then release_files in order, each checked against the report
    before and hashed again as it is written (a file changed meanwhile is refused). Deterministic:
    the same bundle gives the same bytes (no times, owners or modes from this machine). The archive
    appears at `out` only when complete. Returns the manifest."""
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
    with atomic_path(out) as tmp, tarfile.open(tmp, mode, format=tarfile.PAX_FORMAT) as archive:
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
    return manifest


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
    holding nothing else (a saved voice, a file of the user's, is never replaced)."""
    if not target.exists():
        return
    if not target.is_dir():
        raise UserError(f"--dir {target} exists and is not a folder", "pass a new folder")
    present = {p.relative_to(target).as_posix() for p in target.rglob("*") if not p.is_dir()}
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
            "move it out first (voices: pass --voices elsewhere), or pass a new folder",
        )


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
                f"an archive URL needs its sha256: got {sha256!r:.80}",
                "pass --sha256 HEX (64 hex digits), the hash its publisher gives",
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
            return done, False
        check_target(target)
        if sha256 is not None:  # an archive URL (a hub repo was refused one above)
            manifest = _download_archive(source, sha256, target, variant)
        else:
            manifest = _download_hub(source, target, variant, local_files_only, revision)
        return manifest, True


def check_hub_repo(repo: str, what: str) -> str:
    """`repo` if it is a Hugging Face repo id ORG/NAME that huggingface_hub accepts (HF_REPO_ID),
    else one line naming `what`: the one check of a repo id, for `download` and `--model-dir hf:`."""
    if not HF_REPO_ID.fullmatch(repo):
        raise UserError(f"{what} {repo!r:.120} is not a Hugging Face repo id ORG/NAME", HF_REPO_FIX)
    return repo


def check_revision(revision: str | None) -> str | None:
    """`revision` if it is None or a name git and the Hub accept (REVISION), else one line."""
    if revision is not None and not REVISION.fullmatch(revision):
        raise UserError(
            f"--revision {revision!r:.120} is not a branch, tag or commit name",
            "pass a branch, tag or commit as the Hub shows it (no spaces, '..', '~', '^', ':' or control characters)",
        )
    return revision


def _download_archive(url: str, sha256: str, target: Path, variant: str | None) -> dict[str, Any]:
    """Fetch, check and extract the archive; its `.part` is removed however this ends once the fetch
    is whole (the bytes are the ones asked for, or refused: fetching them again gives the same)."""
    part = target.with_name(f".{target.name}.{sha256[:16]}.part")
    fd = open_regular(part, os.O_RDWR | os.O_CREAT, "the partial download")
    with open(fd, "r+b") as handle:
        fetch_resumable(url, handle, part)
        try:
            return _install_archive(url, sha256, handle, target, variant)
        finally:
            part.unlink(missing_ok=True)


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
    return result


@contextlib.contextmanager
def _hub_errors(repo: str) -> Iterator[None]:
    """huggingface_hub's errors as one line each."""
    from huggingface_hub import errors

    try:
        yield
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM mid-fetch: the run's last line says what stays
        raise type(exc)(
            f"huggingface_hub keeps what it had fetched of {repo} in its cache (HF_HUB_CACHE): the same "
            "command resumes it"
        ) from None
    except errors.LocalEntryNotFoundError:
        raise UserError(
            f"{repo} is not in the Hugging Face cache and may not be fetched (offline: HF_HUB_OFFLINE "
            "or --local-files-only)",
            "run once with the network, or pass another cache (HF_HUB_CACHE)",
        ) from None
    except errors.RepositoryNotFoundError:
        raise UserError(
            f"Hugging Face repo {repo} not found (or private)", "check ORG/NAME, or log in (hf auth login)"
        ) from None
    except errors.RevisionNotFoundError:
        raise UserError(
            f"{repo} has no such revision", "pass an existing --revision (a branch, tag or commit)"
        ) from None
    except errors.EntryNotFoundError as exc:
        raise UserError(
            f"{repo} lacks a file a bundle needs ({exc})", "it is not an omnivoice-onnx bundle repo"
        ) from None
    except errors.HfHubHTTPError as exc:
        raise UserError(
            f"the Hugging Face Hub refused {repo} ({str(exc).splitlines()[0]})", "run again later"
        ) from None


def hub_snapshot(
    repo: str, variant: str | None = None, local_files_only: bool = False, revision: str | None = None
) -> tuple[Path, str]:
    """`variant`'s files of the Hugging Face repo `repo` in the huggingface_hub cache, only
    those (release_files of the repo's export report); (the snapshot folder, the variant)."""
    from huggingface_hub import hf_hub_download, snapshot_download

    check_hub_repo(repo, "the Hugging Face repo id")
    check_revision(revision)
    with _hub_errors(repo):
        report_path = hf_hub_download(repo, REPORT_FILE, revision=revision, local_files_only=local_files_only)
        report = read_report(Path(report_path).parent)
        variant = variant or default_release_variant(report)
        names = release_files(report, variant)
        folder = Path(
            snapshot_download(repo, revision=revision, allow_patterns=names, local_files_only=local_files_only)
        )
    missing = [name for name in names if not Folder(folder).member(name).is_file()]
    if missing:
        raise UserError(
            f"Hugging Face repo {repo} lacks {missing[0]} (variant {variant})",
            "name a variant the repo holds (--variant), or check the repo",
        )
    return folder, variant


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
    return manifest


def resolve_model_dir(
    model_dir: str | os.PathLike[str], variant: str | None = None, local_files_only: bool = False
) -> Path:
    """`model_dir` as a folder: itself, or for `hf:ORG/NAME` the huggingface_hub snapshot of the
    variant's files (fetched unless cached; HF_HUB_OFFLINE honoured). The files are checked when
    the bundle opens, as any folder's are."""
    text = os.fspath(model_dir)
    if not text.startswith(HF_PREFIX):
        return Path(model_dir)
    repo = check_hub_repo(text.removeprefix(HF_PREFIX), "--model-dir hf:")
    return hub_snapshot(repo, variant, local_files_only)[0]
