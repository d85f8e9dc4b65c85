"""The vectors CLI (omnivoice_onnx.cli.vectors) keeps the one-line promise before any work: a bad --out or
--threads is one line naming the fix, exit 2, and nothing is written. The writing itself (Ctrl-C,
SIGTERM, a full disk leave --out as it was) and --check are tested with the session export in
test_runtime_generate.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def vectors_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omnivoice_onnx.cli.vectors", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--threads", "-3"], "--threads"),
        (["--threads", "two"], "--threads"),
        ([], "--out"),  # neither --out nor --check
    ],
    ids=["negative-threads", "word-threads", "no-mode"],
)
def test_bad_flags_are_one_line(tmp_path, flags, words):
    done = vectors_cli("--onnx-dir", str(tmp_path), *(flags + ["--out", str(tmp_path / "v")] if flags else []))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert not (tmp_path / "v").exists()


def test_out_that_cannot_be_a_folder_is_refused_before_work(tmp_path):
    existing_file = tmp_path / "vectors.json"
    existing_file.write_text("{}")
    for out in (existing_file, existing_file / "inside"):
        done = vectors_cli("--onnx-dir", str(tmp_path / "no-export"), "--out", str(out))
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--out" in done.stderr, done.stderr
        assert "export folder not found" not in done.stderr  # refused before the model is looked at
    assert existing_file.read_text() == "{}"


def test_check_of_a_folder_without_vectors_is_one_line(tmp_path):
    done = vectors_cli("--onnx-dir", str(tmp_path), "--check", str(tmp_path))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no vectors" in done.stderr, done.stderr
