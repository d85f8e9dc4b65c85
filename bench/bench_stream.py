#!/usr/bin/env python3
"""Benchmark streaming: time to the first audio byte against the whole run, `omnivoice-onnx speak --raw`.

The bar: `--raw --stream` emits its first bytes before the last chunk is generated. Each run
is the command a user types, in a fresh process, with stdout a pipe this script reads:

    omnivoice-onnx speak TEXT --raw [--stream] --model-dir DIR --seed 1 --num-step N

timed from the process start: first_byte_s (the first audio byte on the pipe) and total_s (the
pipe's end), with the audio's length in seconds. Both modes run, interleaved (stream, whole,
stream, ...) over --repeats rounds, so a neighbour's load hits both alike: without --stream the
first byte comes with the last (the whole clip is written at the end). Start-up (interpreter,
imports, sessions) is inside both figures; the chunks are STREAM_CHUNK_DEFAULTS' (3 s of speech),
counted with the runtime's own chunking. Medians with min..max go to
bench/results/<date>-<host>-<label>-stream.json and .md, with the CPU (model name, family and model
numbers) and the load average before and after.

    python bench/bench_stream.py --model-dir onnx                       # the tiny export (make demo)
    python bench/bench_stream.py --model-dir bench/out/full/onnx --label full-random --repeats 1

A tiny or full-random export speaks noise (random weights): the times are real, the audio is not speech.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(REPO), str(BENCH)]

from bench_omnivoice import RESULTS  # noqa: E402

from omnivoice_export.common.edge import add_onnx_dir  # noqa: E402
from omnivoice_export.common.measure import cpu_description, hardware_lines, hardware_record, results_stem  # noqa: E402
from omnivoice_onnx.files import atomic_path, write_json_atomic  # noqa: E402
from omnivoice_onnx.program import NUM_STEP, THREADS, int_range, parse, run_main  # noqa: E402

# Six sentences, ~18 s of speech by the duration estimate: several chunks at 3 s each.
TEXT = (
    "The morning train was late again, so the platform filled with people and their coffee. "
    "A voice announced a short delay, then another, and nobody believed either of them. "
    "Somewhere near the stairs a child was counting the pigeons out loud. "
    "When the train finally arrived, it was almost empty, which surprised everyone. "
    "The doors opened with a sigh, and the crowd stepped in without a word. "
    "Ten minutes later the city was sliding past the windows in the grey light."
)
MODES = ("stream", "whole")
SAMPLE_BYTES = 2  # s16le


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_onnx_dir(parser, "the export folder (default: ./onnx)")
    parser.add_argument("--label", default="tiny", help="names the results file (the export's model)")
    parser.add_argument("--text", default=TEXT, help="the text (default: six sentences, several chunks)")
    parser.add_argument("--num-step", type=NUM_STEP, default=32, help="unmasking steps (upstream's 32)")
    parser.add_argument("--threads", type=THREADS, default=None, help="onnxruntime threads (default: the command's)")
    parser.add_argument("--repeats", type=int_range(1), default=3, help="rounds, each running both modes")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where the .json and .md go")
    return parse(parser, argv)


def run_once(args: argparse.Namespace, mode: str) -> dict[str, float]:
    """One `speak --raw` process: seconds to its first stdout byte and to its end, audio seconds."""
    command = [
        sys.executable,
        "-m",
        "omnivoice_onnx",
        "speak",
        args.text,
        "--raw",
        "--quiet",
        "--seed",
        "1",
        "--num-step",
        str(args.num_step),
        "--model-dir",
        str(args.onnx_dir),
    ]
    command += ["--stream"] if mode == "stream" else []
    command += ["--threads", str(args.threads)] if args.threads else []
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert proc.stdout is not None and proc.stderr is not None, "both are pipes"
    first = proc.stdout.read(1)
    first_byte = time.perf_counter() - start
    size = len(first) + len(proc.stdout.read())
    total = time.perf_counter() - start
    err = proc.stderr.read().decode()
    if proc.wait() != 0 or not first:
        raise SystemExit(f"speak failed ({proc.returncode}): {err.strip()[-500:]}")
    return {"first_byte_s": first_byte, "total_s": total, "audio_s": size / SAMPLE_BYTES / 24000}


def chunk_count(args: argparse.Namespace) -> int:
    """How many chunks the stream has (the runtime's chunking of this text with the stream defaults)."""
    from omnivoice_onnx import OmniVoiceOnnx

    tts = OmniVoiceOnnx.from_dir(args.onnx_dir)
    return sum(1 for _ in tts.stream(args.text, seed=1, generation_config={"num_step": 1}))


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load_before = os.getloadavg()[0]
    hardware = hardware_record()
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for _ in range(args.repeats):
        for mode in MODES:
            runs[mode].append(run_once(args, mode))
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "host": socket.gethostname(),
        "cpu": cpu_description(),
        "label": args.label,
        "model_dir": str(args.onnx_dir),
        "num_step": args.num_step,
        "threads": args.threads,
        "repeats": args.repeats,
        "chunks": chunk_count(args),
        "text_chars": len(args.text),
        "load_1min": [load_before, os.getloadavg()[0]],
        "modes": {mode: {key: summary([run[key] for run in runs[mode]]) for key in runs[mode][0]} for mode in MODES},
        "runs": runs,
        "hardware": hardware,
    }
    stem = results_stem(f"{args.label}-stream")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out_dir / f"{stem}.json", result)
    cpu = result["cpu"]
    lines = [
        f"# Streaming: time to first audio, {args.label} ({result['date']})",
        "",
        f"CPU: {cpu['model_name']} (family {cpu['family']}, model {cpu['model']}), {cpu['logical_cores']} logical "
        f"cores; load {load_before:.2f} -> {result['load_1min'][1]:.2f}. `omnivoice-onnx speak --raw [--stream]`, "
        f"{args.num_step} steps, seed 1, {result['chunks']} chunks, {args.repeats} rounds (median, min..max); "
        "each run a fresh process (start-up included).",
        "",
        *hardware_lines(result),
        "",
        "| mode | first audio byte (s) | whole run (s) | audio (s) |",
        "| --- | --- | --- | --- |",
    ]
    for mode in MODES:
        m = result["modes"][mode]
        cells = [f"{m[k]['median']:.2f} ({m[k]['min']:.2f}..{m[k]['max']:.2f})" for k in ("first_byte_s", "total_s")]
        lines.append(f"| {mode} | {cells[0]} | {cells[1]} | {m['audio_s']['median']:.2f} |")
    lines += ["", "Random weights: the audio is noise; the times are what they are."]
    with atomic_path(args.out_dir / f"{stem}.md") as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    run_main(main)
