#!/usr/bin/env python3
"""Load time of the torch-free runtime: `OmniVoiceOnnx.from_dir` per transformer variant, in a fresh
process per run, with every file it loads hashed against the export report and with those files
vouched for by the verification record (omnivoice_onnx.verified.VerifiedFiles).

    hashed    OMNIVOICE_CACHE_DIR empty: no record, every file sha256-hashed (a first load, or
              OMNIVOICE_VERIFY=full)
    recorded  OMNIVOICE_CACHE_DIR a private folder of this run, primed by one load per variant
              before the rounds (not counted): a later load of the same unchanged files

Per run: `from_dir_s` (onnxruntime's import at the first session, verification, tokenizer, the
three sessions opened; the codec sessions are released again) and `ready_s`, from the process's
launch to the bundle loaded (interpreter, imports and from_dir: close to what `omnivoice-onnx
speak` waits before its first step, which imports its command-line modules too). The check
before the rounds hashes every file once with no record (a damaged file is one line, before any
worker) and leaves the user's own record alone. The modes alternate over --repeats rounds, each
mode first in every other round, so drift and the page cache hit both alike; the priming load
warms the page cache, so the figures are warm-cache figures (from disk the hash costs more:
docs/performance.md). Medians with min..max go to bench/results/<date>-<host>-<cpu>-load.json
and .md with the CPU, its ISA flags and the load average: the hash is I/O and SHA-256, so the
figures carry over to another machine only as far as its disk and its SHA instructions do.

    python bench/bench_load.py --onnx-dir bench/out/full/onnx --variants int8,fp32-fused
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Module level: the standard library only. A worker imports the runtime inside its timed region.
REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(REPO), str(BENCH)]  # the packages, and bench_omnivoice's shared helpers
MODES = ("hashed", "recorded")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The orchestrator's flags (a worker's are worker_main's)."""
    from bench_omnivoice import RESULTS

    from omnivoice_export.common.edge import add_onnx_dir
    from omnivoice_onnx.program import int_range, parse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_onnx_dir(parser, "the export to load (default: ./onnx)")
    parser.add_argument(
        "--variants",
        default="int8,fp32-fused",
        help="comma-separated transformer variants to load (default: int8,fp32-fused)",
    )
    parser.add_argument(
        "--repeats",
        type=int_range(1),
        default=3,
        help="rounds; each loads every variant hashed, then recorded (default: 3)",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="where the .json and .md results go")
    return parse(parser, argv)


def worker(onnx_dir: Path, variant: str, launched: float) -> dict[str, float]:
    """Load `variant` in this fresh process, launched at time.time() `launched`; the two times."""
    from omnivoice_onnx import OmniVoiceOnnx

    started = time.perf_counter()
    OmniVoiceOnnx.from_dir(onnx_dir, variant=variant)
    return {"from_dir_s": time.perf_counter() - started, "ready_s": time.time() - launched}


def worker_main(argv: list[str]) -> None:
    """`--worker VARIANT --launched T --onnx-dir D` (internal): the two times as JSON on the last stdout line."""
    from omnivoice_export.common.edge import add_onnx_dir

    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", required=True)
    parser.add_argument("--launched", type=float, required=True)
    add_onnx_dir(parser, "the export to load", required=True)
    args = parser.parse_args(argv)
    print(json.dumps(worker(args.onnx_dir, args.worker, args.launched)))


def spawn(onnx_dir: Path, variant: str, cache: str) -> dict[str, float]:
    """One worker in a fresh interpreter with OMNIVOICE_CACHE_DIR=`cache` ("" keeps no record)."""
    done = subprocess.run(
        [sys.executable, __file__, "--worker", variant, "--launched", repr(time.time()), "--onnx-dir", str(onnx_dir)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "OMNIVOICE_CACHE_DIR": cache, "OMNIVOICE_VERIFY": "1"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{variant} worker failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    """The results page: the CPU and its hardware lines, then one row per variant and figure."""
    from omnivoice_export.common.measure import cpu_line, hardware_lines

    lines = [
        f"# omnivoice_onnx load time: {meta['onnx_dir']} on {meta['host']} ({meta['date']})",
        "",
        f"CPU: {cpu_line(meta['cpu'])}.",
        "",
        *hardware_lines(meta),
        "",
        f"Load average at the end: {' / '.join(f'{x:.2f}' for x in meta['load_average_end'])} (the bench's own "
        "workers included).",
        "",
        f"`OmniVoiceOnnx.from_dir` in a fresh process per run, {meta['repeats']} rounds, each mode first in "
        "every other round, warm page cache; medians (min..max). hashed: every file sha256-hashed (no "
        "record); recorded: the files vouched for by the verification record of an earlier load.",
        "",
        "| variant | files loaded | figure | hashed | recorded | hashed / recorded |",
        "|---|---|---|---|---|---|",
    ]
    for variant, entry in summary.items():
        for figure, label in (("from_dir_s", "from_dir"), ("ready_s", "launch to loaded")):
            hashed, recorded = entry["hashed"][figure], entry["recorded"][figure]
            lines.append(
                f"| {variant} | {entry['files_mib']:,.0f} MiB | {label} | "
                f"{hashed['median']:.2f} s ({hashed['min']:.2f}..{hashed['max']:.2f}) | "
                f"{recorded['median']:.2f} s ({recorded['min']:.2f}..{recorded['max']:.2f}) | "
                f"{hashed['median'] / recorded['median']:.2f}x |"
            )
    return "\n".join(lines + [""])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker_main(argv)
        return
    from bench_omnivoice import spread

    from omnivoice_export.common.measure import cpu_description, hardware_record, results_stem
    from omnivoice_onnx.bundle import Bundle
    from omnivoice_onnx.errors import UserError
    from omnivoice_onnx.files import atomic_path, write_json_atomic
    from omnivoice_onnx.verified import CACHE_ENV, RACY_NS, VERIFIED_FILE, VerifiedFiles

    args = parse_args(argv)
    onnx_dir = args.onnx_dir.resolve()
    variants = list(dict.fromkeys(name.strip() for name in args.variants.split(",") if name.strip()))
    if not variants:
        raise UserError(f"--variants {args.variants!r} names no variant", "pass e.g. --variants int8,fp32-fused")
    hardware = hardware_record()  # before the check below hashes GBs: the load average is other work's
    os.environ[CACHE_ENV] = ""  # that check hashes every file and leaves the user's own record alone
    files: dict[str, list[Path]] = {}
    for variant in variants:  # refused here, in one line, before any worker: an unknown variant, a damaged file
        files[variant] = [check.path for check in Bundle.open(onnx_dir, variant).file_checks()]
    newest = max(path.stat().st_ctime_ns for paths in files.values() for path in paths)
    wait = (newest + RACY_NS - time.time_ns()) / 1e9
    if wait > 0:  # a file written moments ago would not be recorded (verified.RACY_NS)
        print(f"waiting {wait:.1f} s: the export's files changed within the last {RACY_NS / 1e9:.0f} s", flush=True)
        time.sleep(wait + 0.1)
    with tempfile.TemporaryDirectory(prefix="omnivoice-bench-load-") as scratch:
        cache = Path(scratch) / "cache"
        for variant in variants:  # primes the record and the page cache
            spawn(onnx_dir, variant, str(cache))
        recorded = VerifiedFiles(cache / VERIFIED_FILE).entries  # read as a load reads it
        missing = sorted({os.path.realpath(p) for paths in files.values() for p in paths} - set(recorded))
        if missing:
            raise UserError(
                f"the priming loads left {len(missing)} file(s) out of the verification record in {cache} "
                f"(first: {missing[0]}): the recorded loads would hash",
                "check that TMPDIR can be written",
            )
        runs: dict[str, dict[str, list[dict[str, float]]]] = {v: {m: [] for m in MODES} for v in variants}
        for index in range(args.repeats):
            for variant in variants:
                # Each mode first in every other round: the page cache then favours neither.
                for mode in MODES if index % 2 == 0 else MODES[::-1]:
                    print(f"round {index + 1}/{args.repeats}: {variant} {mode} ...", flush=True)
                    runs[variant][mode].append(spawn(onnx_dir, variant, str(cache) if mode == "recorded" else ""))
    summary = {
        variant: {
            "files": len(files[variant]),
            "files_mib": sum(path.stat().st_size for path in files[variant]) / 2**20,
            **{
                mode: {
                    figure: spread([run[figure] for run in runs[variant][mode]]) for figure in ("from_dir_s", "ready_s")
                }
                for mode in MODES
            },
        }
        for variant in variants
    }
    meta = {
        "onnx_dir": str(args.onnx_dir),
        "host": socket.gethostname(),
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_description(),
        "hardware": hardware,
        "load_average_end": list(os.getloadavg()),
        "repeats": args.repeats,
    }
    text = markdown(summary, meta)
    print(text)
    stem = args.results_dir / results_stem("load")
    write_json_atomic(stem.with_suffix(".json"), {"meta": meta, "summary": summary, "runs": runs})
    with atomic_path(stem.with_suffix(".md")) as tmp:
        tmp.write_text(text)
    print(f"results: {stem}.json, .md")


if __name__ == "__main__":
    from omnivoice_onnx.program import run_main  # the standard library only, as every script's one-line errors

    run_main(main)
