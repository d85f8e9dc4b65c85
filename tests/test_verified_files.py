"""The verification record (omnivoice_onnx.bundle.VerifiedFiles): a bundle loaded twice is hashed
once, and what the record trusts cannot hide a changed file.

The record keys each file on its stat identity with ctime, which a user cannot set back: the
rewrite below restores size and mtime, as `touch -d` or an unpacker would, and is still caught.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omnivoice_onnx import bundle as bundle_module
from omnivoice_onnx.bundle import (
    CACHE_ENV,
    RACY_NS,
    VERIFIED_FILE,
    VERIFY_ENV,
    Bundle,
    cache_dir,
)
from omnivoice_onnx.errors import UserError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    monkeypatch.delenv(VERIFY_ENV, raising=False)
    return folder


@pytest.fixture
def hashed(monkeypatch) -> list[Path]:
    """The files bundle hashes, in order (sha256_file wrapped)."""
    seen: list[Path] = []
    real = bundle_module.sha256_file

    def counting(path, *args):
        seen.append(Path(path))
        return real(path, *args)

    monkeypatch.setattr(bundle_module, "sha256_file", counting)
    return seen


def settled_copy(source: Path, target: Path) -> Path:
    """A copy of the export whose files' ctimes are older than RACY_NS (waits what is left)."""
    shutil.copytree(source, target)
    newest = max(path.stat().st_ctime_ns for path in target.rglob("*") if path.is_file())
    time.sleep(max(0.0, (newest + RACY_NS - time.time_ns()) / 1e9 + 0.1))
    return target


@pytest.fixture(scope="module")
def settled(pipeline, tmp_path_factory) -> Path:
    """One settled copy of the session export, for the tests that only read it."""
    return settled_copy(pipeline.onnx, tmp_path_factory.mktemp("settled") / "onnx")


def record(cache: Path) -> dict:
    return json.loads((cache / VERIFIED_FILE).read_text())["files"]


@pytest.mark.slow
def test_second_load_hashes_nothing_and_a_rewrite_keeping_size_and_mtime_is_caught(
        pipeline, tmp_path: Path, cache: Path, hashed: list[Path]) -> None:
    onnx_dir = settled_copy(pipeline.onnx, tmp_path / "onnx")
    Bundle.open(onnx_dir)
    first = list(hashed)
    assert len(first) >= 6 and sorted(record(cache)) == sorted(os.path.realpath(p) for p in first)
    hashed.clear()
    Bundle.open(onnx_dir)
    assert hashed == []  # every file vouched for by the record
    sidecar = next(p for p in first if p.name.endswith(".onnx.data"))
    status = sidecar.stat()
    with open(sidecar, "r+b") as handle:  # same size: one byte changed in place
        handle.seek(status.st_size // 2)
        byte = handle.read(1)
        handle.seek(status.st_size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(sidecar, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert (sidecar.stat().st_size, sidecar.stat().st_mtime_ns) == (status.st_size, status.st_mtime_ns)
    with pytest.raises(UserError, match=f"{sidecar.name} does not match the sha256"):
        Bundle.open(onnx_dir)
    assert sidecar in hashed


@pytest.mark.slow
def test_files_changed_moments_ago_are_hashed_every_time(pipeline, tmp_path: Path, cache: Path,
                                                        hashed: list[Path]) -> None:
    """A file whose ctime is within RACY_NS of the hash is not remembered: a write in the same
    clock tick could leave its stat identity as it was."""
    onnx_dir = tmp_path / "onnx"
    shutil.copytree(pipeline.onnx, onnx_dir)
    (onnx_dir / "tokenizer.json").touch()  # its ctime now, whatever the copy took
    Bundle.open(onnx_dir)
    assert str(onnx_dir / "tokenizer.json") not in (record(cache) if (cache / VERIFIED_FILE).exists() else {})
    hashed.clear()
    Bundle.open(onnx_dir)
    assert onnx_dir / "tokenizer.json" in hashed


@pytest.mark.slow
@pytest.mark.parametrize("planted", ["garbage", "foreign", "symlink", "folder"])
def test_a_damaged_or_planted_record_is_ignored_and_replaced(planted: str, settled: Path, tmp_path: Path, cache: Path,
                                                            hashed: list[Path]) -> None:
    onnx_dir = settled
    cache.mkdir()
    target = tmp_path / "elsewhere.json"
    target.write_text("keep me\n")
    path = cache / VERIFIED_FILE
    if planted == "garbage":
        path.write_bytes(b"\xff{not json")
    elif planted == "foreign":  # another tool's JSON claiming every file: not our format, not trusted
        path.write_text(json.dumps({"files": {str(p): {} for p in onnx_dir.iterdir()}}))
    elif planted == "symlink":
        path.symlink_to(target)
    else:
        path.mkdir()
    Bundle.open(onnx_dir)
    assert len(hashed) >= 6  # nothing vouched for
    assert target.read_text() == "keep me\n"  # never written through the link
    if planted != "folder":  # a folder in the record's place cannot be replaced: the record is skipped
        assert not path.is_symlink() and len(record(cache)) == len(hashed)


@pytest.mark.slow
def test_verify_full_and_info_hash_every_file(settled: Path, tmp_path: Path, cache: Path, hashed: list[Path],
                                              monkeypatch, capsys) -> None:
    from omnivoice_onnx.cli import main as cli_main

    onnx_dir = settled
    Bundle.open(onnx_dir)
    loaded = list(hashed)
    monkeypatch.setenv(VERIFY_ENV, "full")
    hashed.clear()
    Bundle.open(onnx_dir)
    assert hashed == loaded
    monkeypatch.delenv(VERIFY_ENV)
    hashed.clear()
    assert cli_main(["info", str(onnx_dir)]) == 0
    assert set(loaded) <= set(hashed)
    assert "OK" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("where", ["under a file", "empty"])
def test_no_usable_cache_folder_costs_a_hash_not_an_error(where: str, settled: Path, tmp_path: Path, monkeypatch,
                                                          hashed: list[Path]) -> None:
    onnx_dir = settled
    monkeypatch.setenv(CACHE_ENV, "/dev/null/omnivoice" if where == "under a file" else "")
    for _ in range(2):
        Bundle.open(onnx_dir)
    assert len(hashed) >= 12  # hashed both times


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.setenv(CACHE_ENV, " ")
    assert cache_dir() is None
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "omnivoice-onnx"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "omnivoice-onnx"


@pytest.mark.slow
def test_a_cli_load_writes_only_its_record_under_home_and_prints_nothing_when_home_is_unwritable(
        settled: Path, tmp_path: Path) -> None:
    onnx_dir = settled
    home = tmp_path / "home"
    home.mkdir()
    base = {key: value for key, value in os.environ.items() if key not in (CACHE_ENV, "XDG_CACHE_HOME")}
    code = f"from omnivoice_onnx.bundle import Bundle; Bundle.open({str(onnx_dir)!r}); print('ok')"
    for home_dir in (str(home), "/dev/null"):
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                              env={**base, "HOME": home_dir}, timeout=120)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok\n", "")
    assert [p.relative_to(home).as_posix() for p in home.rglob("*") if p.is_file()] == [
        f".cache/omnivoice-onnx/{VERIFIED_FILE}"]
    assert oct((home / ".cache" / "omnivoice-onnx").stat().st_mode & 0o777) == "0o700"
