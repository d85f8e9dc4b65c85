"""Issue 26 (reliability round 3): step 5 run concurrently and killed, requests over the limits,
wrong types, non-finite values, a bundle whose own files are damaged or hand-edited.

Each case ends in one line naming the problem and the fix (a UserError in the API, exit 2 from a
script) or works; nothing is left half-written. "Before any work" is asserted by making the work
itself fail loudly (a transformer or a build that raises): the refusal must come first.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import quality_omnivoice
import quantize_omnivoice
from conftest import REPO
from omnivoice_export import quality, quantize, report
from omnivoice_export.cli import EXIT_BAD_INPUT
from test_reliability import assert_one_line, run_inprocess, snapshot

TRANSFORMER = quantize.TRANSFORMER_FILE


def quantize_process(onnx_dir: Path, variants: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPO / "quantize_omnivoice.py"), "--onnx-dir", str(onnx_dir),
                             "--variants", variants], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def assert_variants_as_reported(onnx_dir: Path, names) -> None:
    """Every variant in `names` is listed, its files match its entry, and no temporary is left."""
    export = report.load_report(onnx_dir)
    assert sorted(export["variants"]) == sorted(names)
    for name in names:
        assert quantize.verify_variant(onnx_dir, export, name) == onnx_dir / name / TRANSFORMER
    assert [p.name for p in onnx_dir.iterdir() if p.name.startswith(".")] == []


# --- step 5: concurrent runs, kill -9, outputs checked first ---------------------------------------

@pytest.mark.slow
def test_ten_concurrent_runs_one_recipe_each_keep_every_entry(onnx_copy: Path) -> None:
    """The report's read-modify-write used to lose 1-2 of 10 entries (all runs exit 0)."""
    procs = {name: quantize_process(onnx_copy, name) for name in quantize.RECIPES}
    for name, proc in procs.items():
        assert proc.wait(timeout=600) == 0, (name, proc.stderr.read()[-2000:])
    assert_variants_as_reported(onnx_copy, quantize.RECIPES)


@pytest.mark.slow
def test_concurrent_runs_of_the_same_variants_all_succeed(onnx_copy: Path) -> None:
    """Four runs building the same variants: installing and hashing used to race (FileNotFoundError)."""
    procs = [quantize_process(onnx_copy, "fp32-unmasked,int8-nbits-a0") for _ in range(4)]
    for proc in procs:
        assert proc.wait(timeout=600) == 0, proc.stderr.read()[-2000:]
    assert_variants_as_reported(onnx_copy, ["fp32-unmasked", "int8-nbits-a0"])


@pytest.mark.slow
def test_kill_9_leftovers_are_removed_by_the_next_run(onnx_copy: Path) -> None:
    """A run killed mid-build leaves its staging folder and, for the dynamic recipes, the graph-only
    input beside the fp32 sidecar (`.int8.tmp-<pid>-input.onnx`); the next run removes both."""
    proc = quantize_process(onnx_copy, "int8")
    deadline = time.monotonic() + 300
    while (not list(onnx_copy.glob(".int8.tmp-*-input.onnx")) and proc.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert list(onnx_copy.glob(".int8.tmp-*")), "the run ended before its staging could be seen"
    again = quantize_process(onnx_copy, "int8")
    assert again.wait(timeout=600) == 0, again.stderr.read()[-2000:]
    assert_variants_as_reported(onnx_copy, ["int8"])


@pytest.mark.slow
def test_variant_folder_that_is_a_file_refused_before_building(onnx_copy: Path, monkeypatch, capsys) -> None:
    (onnx_copy / "int8").write_text("not a folder")
    monkeypatch.setattr(quantize, "build_variant", lambda *a: pytest.fail("built before checking the outputs"))
    before = snapshot(onnx_copy)
    result = run_inprocess(quantize_omnivoice, ["--onnx-dir", onnx_copy, "--variants", "fp32-unmasked,int8"], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, f"{onnx_copy / 'int8'} exists and is not a directory", "move or remove it")
    assert snapshot(onnx_copy) == before


@pytest.mark.slow
def test_quality_wav_dir_that_is_a_file_refused_before_measuring(pipeline, tmp_path: Path, monkeypatch,
                                                                 capsys) -> None:
    wav_dir = tmp_path / "wavs"
    wav_dir.write_text("a file")
    monkeypatch.setattr(quality, "measure_variant", lambda *a: pytest.fail("measured before checking --wav-dir"))
    result = run_inprocess(quality_omnivoice, ["--onnx-dir", pipeline.onnx, "--capture-dir", pipeline.capture,
                                               "--wav-dir", wav_dir], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, f"--wav-dir {wav_dir} exists and is not a directory")
