"""The verification record (omnivoice_onnx.verified.VerifiedFiles): a bundle loaded twice is hashed
once, and what the record trusts cannot hide a changed file.

The record keys each file on its stat identity with ctime, which a user cannot set back: the
rewrite below restores size and mtime, as `touch -d` or an unpacker would, and is still caught.
A record that is damaged, planted, someone else's or unwritable costs a hash, never an error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from omnivoice_onnx import verified as verified_module
from omnivoice_onnx.bundle import Bundle
from omnivoice_onnx.contract import REPORT_FILE
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.verified import CACHE_ENV, RACY_NS, VERIFIED_FILE, VERIFY_ENV, cache_dir

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    monkeypatch.delenv(VERIFY_ENV, raising=False)
    return folder


@pytest.fixture
def hashed(monkeypatch) -> list[Path]:
    """The files bundle hashes, in order (file_digest wrapped)."""
    seen: list[Path] = []
    real = verified_module.file_digest

    def counting(handle, data):
        seen.append(Path(handle.name))
        return real(handle, data)

    monkeypatch.setattr(verified_module, "file_digest", counting)
    return seen


def settled_copy(source: Path, target: Path) -> Path:
    """A copy of the export whose files' ctimes are older than RACY_NS (waits what is left)."""
    shutil.copytree(source, target)
    newest = max(path.stat().st_ctime_ns for path in target.rglob("*") if path.is_file())
    time.sleep(max(0.0, (newest + RACY_NS - time.time_ns()) / 1e9 + 0.1))
    return target


@pytest.fixture
def clock_ahead(monkeypatch) -> None:
    """The verification record's clock RACY_NS + 1 s ahead: files copied a moment ago count as settled
    (the tests that change files need no wait; the racy window itself is tested on a stopped clock)."""
    ahead = types.SimpleNamespace(time_ns=lambda: time.time_ns() + RACY_NS + 10**9)
    monkeypatch.setattr(verified_module, "time", ahead)


@pytest.fixture(scope="module")
def settled(pipeline, tmp_path_factory) -> Path:
    """One settled copy of the session export, for the tests that only read it."""
    return settled_copy(pipeline.onnx, tmp_path_factory.mktemp("settled") / "onnx")


def record(cache: Path) -> dict:
    return json.loads((cache / VERIFIED_FILE).read_text())["files"]


def real(paths) -> list[str]:
    return sorted(os.path.realpath(p) for p in paths)


@pytest.mark.slow
def test_second_load_hashes_nothing_and_a_rewrite_keeping_size_and_mtime_is_caught(
    pipeline, tmp_path: Path, cache: Path, hashed: list[Path], clock_ahead: None
) -> None:
    onnx_dir = Path(shutil.copytree(pipeline.onnx, tmp_path / "onnx"))
    Bundle.open(onnx_dir)
    first = list(hashed)
    assert len(first) >= 6 and sorted(record(cache)) == real(first)
    hashed.clear()
    Bundle.open(onnx_dir)
    assert hashed == []  # every file vouched for by the record
    # The record vouches for a file's bytes, not for another expected sha256: a report that now
    # expects something else is answered by hashing.
    report_path = onnx_dir / REPORT_FILE
    original = report_path.read_bytes()
    report = json.loads(original)
    report["runtime_assets"]["tokenizer.json"]["sha256"] = "0" * 64
    report_path.write_text(json.dumps(report))
    with pytest.raises(UserError, match="tokenizer.json does not match the sha256"):
        Bundle.open(onnx_dir)
    report_path.write_bytes(original)
    sidecar = next(p for p in first if p.name.endswith(".onnx.data"))
    status = sidecar.stat()
    with open(sidecar, "r+b") as handle:  # same size: one byte changed in place
        handle.seek(status.st_size // 2)
        byte = handle.read(1)
        handle.seek(status.st_size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(sidecar, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert (sidecar.stat().st_size, sidecar.stat().st_mtime_ns) == (status.st_size, status.st_mtime_ns)
    hashed.clear()
    with pytest.raises(UserError, match=f"{sidecar.name} does not match the sha256"):
        Bundle.open(onnx_dir)
    assert sidecar in hashed


@pytest.mark.slow
def test_the_record_is_private_and_used_whatever_the_umask(settled: Path, cache: Path, hashed: list[Path]) -> None:
    """Under umask 002 (user accounts on Debian and Ubuntu) the record was written group-writable,
    so it was never trusted again: every load hashed."""
    mask = os.umask(0o002)
    try:
        Bundle.open(settled)
        hashed.clear()
        Bundle.open(settled)
    finally:
        os.umask(mask)
    assert hashed == []
    assert oct((cache / VERIFIED_FILE).stat().st_mode & 0o777) == "0o600"
    assert oct(cache.stat().st_mode & 0o777) == "0o700"


@pytest.mark.slow
def test_files_changed_moments_ago_or_while_hashed_are_not_remembered(
    pipeline, tmp_path: Path, cache: Path, hashed: list[Path], monkeypatch
) -> None:
    """A file whose ctime is within RACY_NS of its hash is not remembered (a write in the same
    clock tick could leave its stat identity as it was), nor one that changed while it was read."""
    onnx_dir = Path(shutil.copytree(pipeline.onnx, tmp_path / "onnx"))
    tokenizer, config = onnx_dir / "tokenizer.json", onnx_dir / "runtime-config.json"
    time.sleep(0.1)  # past a coarse clock tick (<= 10 ms): the copy's ctimes are older than the touch's
    tokenizer.touch()
    # A window of 50 ms on a clock stopped 20 ms after the touch, however long the load takes: the
    # copy is outside the window, the touched tokenizer inside.
    monkeypatch.setattr(verified_module, "RACY_NS", 50_000_000)
    frozen = tokenizer.stat().st_ctime_ns + 20_000_000
    monkeypatch.setattr(verified_module, "time", types.SimpleNamespace(time_ns=lambda: frozen))
    Bundle.open(onnx_dir)
    assert sorted(record(cache)) == real(p for p in hashed if p != tokenizer)
    monkeypatch.setattr(verified_module, "time", time)
    # With the racy window closed, the tokenizer is remembered; the config, written to while it is
    # hashed (a byte appended: visible whatever the clock's tick), is not.
    monkeypatch.setattr(verified_module, "RACY_NS", 0)
    counting = verified_module.file_digest

    def appending(handle, data):
        digest = counting(handle, data)
        if Path(handle.name) == config:
            with open(config, "ab") as appended:
                appended.write(b" ")
        return digest

    monkeypatch.setattr(verified_module, "file_digest", appending)
    os.utime(config)  # a new ctime: hashed again below
    Bundle.open(onnx_dir)
    kept = record(cache)
    assert os.path.realpath(tokenizer) in kept and os.path.realpath(config) not in kept


def planted_record(kind: str, cache: Path, onnx_dir: Path, elsewhere: Path, monkeypatch) -> None:
    """Put a record of `kind` in `cache`: every one either unreadable or not to be trusted."""
    if kind in ("foreign", "shared", "another user's"):  # a real record of these very files first
        Bundle.open(onnx_dir)
    path = cache / VERIFIED_FILE
    cache.mkdir(mode=0o700, exist_ok=True)
    if kind == "garbage":
        path.write_bytes(b"\xff{not json")
    elif kind == "huge number":  # over Python's int conversion limit: json.loads raises ValueError
        path.write_text('{"format": ' + "9" * 5000 + "}")
    elif kind == "foreign":  # the right entries, but not in this record's format
        path.write_text(json.dumps({"files": json.loads(path.read_text())["files"]}))
    elif kind == "symlink":
        path.symlink_to(elsewhere)
    elif kind == "folder":
        path.mkdir()
    elif kind == "planted temporary":  # a temporary's name whose pid no process can have
        (cache / f".{VERIFIED_FILE}.tmp-{'9' * 30}-x").write_text("{}")
    elif kind == "shared":  # a folder others may write: its record may be theirs
        cache.chmod(0o777)
    elif kind == "another user's":  # sudo keeping the user's HOME: root neither trusts nor writes it
        monkeypatch.setattr(os, "geteuid", lambda: os.stat(cache).st_uid + 1)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind", ["garbage", "huge number", "foreign", "symlink", "folder", "planted temporary", "shared", "another user's"]
)
def test_a_damaged_planted_or_foreign_record_costs_a_hash_never_an_error(
    kind: str, settled: Path, tmp_path: Path, cache: Path, hashed: list[Path], monkeypatch
) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("keep me\n")
    planted_record(kind, cache, settled, elsewhere, monkeypatch)
    path = cache / VERIFIED_FILE
    before = path.read_bytes() if path.is_file() else None
    hashed.clear()
    Bundle.open(settled)
    assert len(hashed) >= 6  # nothing vouched for
    assert elsewhere.read_text() == "keep me\n"  # never written through the link
    if kind in ("shared", "another user's"):
        assert path.read_bytes() == before  # not rewritten either
    elif kind == "folder":
        assert path.is_dir()  # cannot be replaced: the record is skipped
    else:
        assert not path.is_symlink() and sorted(record(cache)) == real(hashed)


@pytest.mark.slow
def test_full_and_info_hash_every_file_and_a_mismatch_they_find_drops_the_entry(
    settled: Path, cache: Path, hashed: list[Path], monkeypatch, capsys
) -> None:
    from omnivoice_onnx.__main__ import main as cli_main

    Bundle.open(settled)
    loaded = list(hashed)
    hashed.clear()
    assert cli_main(["info", str(settled)]) == 0
    assert set(loaded) <= set(hashed)
    assert "DAMAGED" not in capsys.readouterr().out
    # A failing disk: the bytes change under an unchanged stat identity. Only a full hash sees it,
    # and the record must not vouch for the file afterwards.
    tokenizer = settled / "tokenizer.json"
    counting = verified_module.file_digest
    monkeypatch.setattr(
        verified_module,
        "file_digest",
        lambda handle, data: "f" * 64 if Path(handle.name) == tokenizer else counting(handle, data),
    )
    monkeypatch.setenv(VERIFY_ENV, "full")
    hashed.clear()
    with pytest.raises(UserError, match="tokenizer.json does not match the sha256"):
        Bundle.open(settled)
    assert os.path.realpath(tokenizer) not in record(cache)
    monkeypatch.setattr(verified_module, "file_digest", counting)
    monkeypatch.delenv(VERIFY_ENV)
    hashed.clear()
    Bundle.open(settled)
    assert hashed == [tokenizer]  # hashed again (and as recorded): the rest still vouched for


@pytest.mark.slow
def test_the_record_keeps_the_most_recently_hashed(settled: Path, cache: Path, hashed: list[Path], monkeypatch) -> None:
    monkeypatch.setattr(verified_module, "VERIFIED_MAX", 3)
    Bundle.open(settled)
    assert sorted(record(cache)) == real(hashed[-3:])


@pytest.mark.slow
@pytest.mark.parametrize("where", ["under a file", "empty"])
def test_no_usable_cache_folder_costs_a_hash_not_an_error(
    where: str, settled: Path, monkeypatch, hashed: list[Path]
) -> None:
    monkeypatch.setenv(CACHE_ENV, "/dev/null/omnivoice" if where == "under a file" else "")
    Bundle.open(settled)
    once = len(hashed)
    Bundle.open(settled)
    assert once >= 6 and len(hashed) == 2 * once


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.setenv(CACHE_ENV, " ")
    assert cache_dir() is None
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "omnivoice-onnx"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: a relative value is ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "omnivoice-onnx"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)  # no $HOME and no passwd entry
    assert cache_dir() is None


@pytest.mark.slow
def test_a_load_writes_only_its_record_under_home_and_nothing_on_stderr_when_home_is_unwritable(
    settled: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    base = {key: value for key, value in os.environ.items() if key not in (CACHE_ENV, "XDG_CACHE_HOME")}
    code = f"from omnivoice_onnx.bundle import Bundle; Bundle.open({str(settled)!r}); print('ok')"
    for home_dir in (str(home), "/dev/null"):
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            capture_output=True,
            text=True,
            env={**base, "HOME": home_dir},
            timeout=120,
        )
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok\n", "")
    assert [p.relative_to(home).as_posix() for p in home.rglob("*") if p.is_file()] == [
        f".cache/omnivoice-onnx/{VERIFIED_FILE}"
    ]
    assert oct((home / ".cache" / "omnivoice-onnx").stat().st_mode & 0o777) == "0o700"


def test_the_toolchain_checks_through_the_same_record(
    tmp_path: Path, cache: Path, hashed: list[Path], clock_ahead, monkeypatch
) -> None:
    """files.first_mismatch, the check of capture files, graphs and variants in steps 2-6: a second
    check of unchanged files hashes nothing; a file rewritten with other bytes of its size is
    hashed again and named; OMNIVOICE_VERIFY=full hashes every file."""
    from omnivoice_export.common.files import first_mismatch
    from omnivoice_onnx.hashing import file_entry

    files = []
    for name in ("a.npz", "b.npz"):
        (tmp_path / name).write_bytes(name.encode() * 1000)
        files.append((tmp_path / name, file_entry(tmp_path / name)))
    assert first_mismatch(files) is None and real(hashed) == real(path for path, _ in files)
    hashed.clear()
    assert first_mismatch(files) is None and hashed == []
    (tmp_path / "b.npz").write_bytes(b"B" * len(b"b.npz" * 1000))
    assert first_mismatch(files) == tmp_path / "b.npz" and real(hashed) == real([tmp_path / "b.npz"])
    hashed.clear()
    monkeypatch.setenv(VERIFY_ENV, "full")
    assert first_mismatch(files[:1]) is None and real(hashed) == real([tmp_path / "a.npz"])
