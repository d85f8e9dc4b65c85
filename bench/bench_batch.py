#!/usr/bin/env python3
"""Benchmark `omnivoice-onnx batch` (omnivoice_onnx.batch.run) on its three engines, same list, same cores.

A list of --lines lines (default 50) mixing the three modes in turn — auto (language given), voice
design (an instruct), voice cloning (step 0's reference, shared by every clone line, so it is
encoded once per worker) — over sentences of different lengths, run three times into fresh folders:

    local 1x2   one worker in this process, 2 onnxruntime threads
    local 2x1   two worker processes (spawned), 1 thread each
    ray 2x1     a local Ray (started and stopped by the run, as `--ray` does), 2 actors x 1 thread

(--engines picks others: the workers x threads table, e.g. --engines 1x1,1x2,2x1,2x2.)

Per engine: wall seconds of the whole run (model loads, the up-front check of every line, Ray's
start and stop included: what a user waits for), lines per wall second, seconds of audio per wall
second, the workers' summed generate() seconds and their CPU seconds (audio seconds per CPU second:
the engine's efficiency, which neighbours on shared cores do not stretch); Ray's overhead against
local 2x1 (the same workers and threads). --repeats N runs N rounds, the engine order rotated each
round, and reports medians (min..max). Every engine's WAVs must be the same bytes (exit 1
otherwise: a speed for other audio is no figure). Results:
bench/results/<date>-<host>-<cpu>-<model>-batch.json and .md, with the CPU and the load average at
the start and end (the machine may be shared with other work; the markdown says so when it was).

    python bench/bench_batch.py --model tiny --onnx-dir onnx --capture-dir capture
    python bench/bench_batch.py --model full-random --onnx-dir bench/out/full/onnx \\
        --capture-dir bench/out/full/capture --lines 12 --num-step 8
    python bench/bench_batch.py --lines 50 --num-step 8 --repeats 3     # the README's tiny figures
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(REPO), str(BENCH)]

# The engines run by default, as --engines spells them: (workers)x(threads per worker), local or Ray.
DEFAULT_ENGINES = "1x2,2x1,ray:2x1"
SENTENCES = (
    "Good morning.",
    "The weather today is mild, with a light breeze from the west.",
    "Please remember to bring the documents to the meeting on Thursday afternoon.",
    "She opened the window, listened to the rain for a while, and then went back to her book.",
    "Numbers such as 42 and 1999 take longer to say than their digits suggest.",
)
INSTRUCTS = ("female, low pitch", "male, high pitch", "female, whisper")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from omnivoice_export.common.edge import add_capture_dir, add_onnx_dir
    from omnivoice_onnx.program import NUM_STEP, int_range, parse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="tiny", help="the model's name, for the results' file name")
    add_onnx_dir(parser, "the export to run")
    add_capture_dir(parser, "step 0's folder: its ref_voice.wav/.txt are the clone lines' reference")
    parser.add_argument("--lines", type=int_range(3), default=50, help="lines in the list")
    parser.add_argument("--num-step", type=NUM_STEP, default=32, help="unmasking steps per line")
    parser.add_argument(
        "--repeats",
        type=int_range(1),
        default=1,
        help="rounds; each runs every engine, the order rotated per round so that a "
        "neighbour's load falls on all of them alike; figures are medians",
    )
    parser.add_argument(
        "--engines",
        default=DEFAULT_ENGINES,
        help="comma-separated WORKERSxTHREADS, local or ray:WORKERSxTHREADS (the workers x threads "
        "table: e.g. 1x1,1x2,2x1,2x2)",
    )
    parser.add_argument("--results-dir", type=Path, default=BENCH / "results", help="where the results go")
    args = parse(parser, argv)
    args.engines = engines(args.engines)
    return args


def engines(text: str) -> list[tuple[str, int, int, bool]]:
    """--engines as (name, workers, threads, ray) tuples, or a UserError naming the bad item."""
    from omnivoice_onnx.errors import UserError

    found = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        ray, _, shape = item.rpartition(":")
        workers, _, threads = shape.partition("x")
        if (
            ray not in ("", "ray")
            or not (workers.isdecimal() and threads.isdecimal())
            or min(int(workers), int(threads)) < 1
        ):
            raise UserError(
                f"--engines: {item!r} is not WORKERSxTHREADS or ray:WORKERSxTHREADS",
                f"give e.g. --engines {DEFAULT_ENGINES}",
            )
        found.append((f"{ray or 'local'} {shape}", int(workers), int(threads), bool(ray)))
    if not found:
        raise UserError("--engines is empty", f"give e.g. --engines {DEFAULT_ENGINES}")
    return found


def write_list(folder: Path, count: int, ref_wav: Path, ref_text: str) -> Path:
    """The bench's test list in upstream's format; clone lines name the reference relatively."""
    (folder / "ref.wav").write_bytes(ref_wav.read_bytes())
    rows = []
    for i in range(count):
        row = {"id": f"line_{i:03d}", "text": SENTENCES[(i // 3) % len(SENTENCES)]}
        mode = i % 3
        if mode == 0:
            row["language_id"] = "en"
        elif mode == 1:
            row["instruct"] = INSTRUCTS[(i // 3) % len(INSTRUCTS)]
        else:
            row.update(ref_audio="ref.wav", ref_text=ref_text)
        rows.append(json.dumps(row))
    path = folder / "lines.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def run_engine(
    name: str, workers: int, threads: int, ray: bool, args: argparse.Namespace, lines: Path, out: Path
) -> dict[str, Any]:
    from omnivoice_onnx.batch.run import Options, run_batch

    options = Options(
        test_list=lines,
        res_dir=out,
        model_dir=args.onnx_dir,
        workers=workers,
        threads=threads,
        generation_config={"num_step": args.num_step},
        ray="local" if ray else None,
        progress=False,
    )
    print(f"bench: {name} ...", file=sys.stderr, flush=True)
    summary = run_batch(options, log=lambda message: None)
    return {
        "engine": name,
        "workers": workers,
        "threads": threads,
        "ray": ray,
        "made": summary.made,
        "failed": summary.failed,
        "wall_s": summary.wall_seconds,
        "audio_s": summary.audio_seconds,
        "synth_s": summary.synth_seconds,
        "cpu_s": summary.cpu_seconds,
        "lines_per_s": summary.made / summary.wall_seconds,
        "audio_s_per_wall_s": summary.audio_seconds / summary.wall_seconds,
        "audio_s_per_cpu_s": summary.audio_seconds / summary.cpu_seconds,
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per engine and figure: median, min, max over the rounds."""
    from bench_omnivoice import spread

    figures = ("wall_s", "lines_per_s", "audio_s_per_wall_s", "synth_s", "cpu_s", "audio_s_per_cpu_s")
    return {
        name: {f: spread([r[f] for r in runs if r["engine"] == name]) for f in figures}
        for name in dict.fromkeys(r["engine"] for r in runs)
    }


def markdown(result: dict[str, Any]) -> str:
    from omnivoice_export.common.measure import hardware_lines

    meta, cpu, load = result["meta"], result["meta"]["cpu"], result["meta"]["load_average"]
    shared = (
        (
            " — **measured on a shared machine under load**: other work used the same cores, so the figures "
            "are pessimistic and their ratios approximate"
        )
        if load["start"][0] > 0.5
        else ""
    )
    lines = [
        f"# omnivoice-onnx batch: local vs Ray, {meta['model']} on {meta['host']} ({meta['date']})",
        "",
        f"CPU: {cpu['model_name']} ({cpu['vendor']} family {cpu['family']} model {cpu['model']}), "
        f"{cpu['logical_cores']} logical / {cpu['physical_cores']} physical cores. Load average (1/5/15 min) "
        f"at start {load['start'][0]:.2f} / {load['start'][1]:.2f} / {load['start'][2]:.2f}, at end "
        f"{load['end'][0]:.2f} / {load['end'][1]:.2f} / {load['end'][2]:.2f}{shared}.",
        "",
        *hardware_lines(meta),
        "",
        f"{meta['lines']} lines (auto / design / clone in turn), {meta['num_step']} steps each, "
        f"{meta['repeats']} round(s), engine order rotated per round; medians (min..max). Wall time is the "
        f"whole run (model loads, the up-front check of every line, Ray's start and stop included). WAVs "
        f"byte-identical across every engine and round: **{'yes' if result['bytes_equal'] else 'NO'}**.",
        "",
        "| engine | wall s | lines/s | audio s per wall s | workers' generate() s | their CPU s | audio s per CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, figures in result["summary"].items():
        cells = [
            f"{figures[f]['median']:.{d}f} ({figures[f]['min']:.{d}f}..{figures[f]['max']:.{d}f})"
            for f, d in (
                ("wall_s", 1),
                ("lines_per_s", 2),
                ("audio_s_per_wall_s", 2),
                ("synth_s", 1),
                ("cpu_s", 1),
                ("audio_s_per_cpu_s", 2),
            )
        ]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    overhead = result["ray_overhead"]
    lines += [
        "",
        (
            f"Ray's overhead against local 2x1 (same workers and threads), medians: "
            f"{overhead['seconds']:+.1f} s wall ({overhead['ratio']:.2f}x); "
            if overhead
            else ""
        )
        + f"{result['runs'][0]['audio_s']:.1f} s of audio per run.",
        "",
        "generate() s: wall time inside the workers' generate() calls, summed (stretched by any other "
        "work on the cores); CPU s: those calls' CPU time in the workers, all threads (what the work itself "
        "cost: 2 onnxruntime threads spend about twice the CPU of 1 on tiny's small graphs); audio s per CPU s: "
        "the engine's own efficiency, which other work on the cores does not stretch (on C free cores, "
        "W x T <= C engines reach about C times it in audio s per wall s).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from omnivoice_export.common.measure import cpu_description, hardware_record, results_stem
    from omnivoice_export.step1_capture.capture import REF_TXT, REF_WAV
    from omnivoice_onnx.files import atomic_path, write_json_atomic
    from omnivoice_onnx.program import CheckFailed

    load_start = os.getloadavg()
    hardware = hardware_record()
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as scratch_name:
        scratch = Path(scratch_name)
        lines = write_list(
            scratch, args.lines, args.capture_dir / REF_WAV, (args.capture_dir / REF_TXT).read_text().strip()
        )
        runs, reference, equal = [], None, True
        for round_index in range(args.repeats):
            shift = round_index % len(args.engines)
            for name, workers, threads, ray in args.engines[shift:] + args.engines[:shift]:
                out = scratch / f"{round_index}-{name.replace(' ', '-')}"
                runs.append({**run_engine(name, workers, threads, ray, args, lines, out), "round": round_index})
                wavs = {p.name: p.read_bytes() for p in sorted(out.glob("*.wav"))}
                reference = wavs if reference is None else reference
                equal = equal and wavs == reference and len(wavs) == args.lines
                shutil.rmtree(out)
    summary = summarise(runs)
    pair = [summary.get(name, {}).get("wall_s", {}).get("median") for name in ("local 2x1", "ray 2x1")]
    date = datetime.date.today().isoformat()
    result = {
        "meta": {
            "model": args.model,
            "host": socket.gethostname(),
            "date": date,
            "lines": args.lines,
            "num_step": args.num_step,
            "repeats": args.repeats,
            "cpu": cpu_description(),
            "load_average": {"start": load_start, "end": os.getloadavg()},
            "hardware": hardware,
        },
        "runs": runs,
        "summary": summary,
        "bytes_equal": equal,
        "ray_overhead": {"seconds": pair[1] - pair[0], "ratio": pair[1] / pair[0]} if all(pair) else None,
    }
    stem = args.results_dir / results_stem(f"{args.model}-batch")
    write_json_atomic(stem.with_suffix(".json"), result)
    with atomic_path(stem.with_suffix(".md")) as tmp:
        tmp.write_text(markdown(result))
    print(markdown(result))
    if not equal:
        raise CheckFailed("the engines' WAVs differ: the batch is not order-free")


if __name__ == "__main__":
    from omnivoice_onnx.program import run_main

    run_main(main)
