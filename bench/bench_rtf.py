#!/usr/bin/env python3
"""Real-time factor of the torch-free runtime: how long speech takes to make, per second of speech.

RTF = synthesis seconds / audio seconds (below 1: faster than real time). For each transformer
variant (--variants), thread count (--threads) and clone reference length (--ref-seconds: the step-0
reference cut to 3 s, or repeated to 10 s, its transcript cut or repeated alike), one voice clone of
the same ~10 s target text runs through OmniVoiceOnnx.generate() at --num-step steps in a fresh
process, with the transformer's calls timed apart from the rest (reference encoding, decoding, host
work). The transformer runs once per step at a fixed length (the sequence does not grow), so the
RTF at 32, 16 and 8 steps follows from one run: (rest + steps x seconds per step) / audio seconds;
--check-steps runs one configuration at 32 steps as well, to show the derivation holds.

Clock: one thread is timed by the process's CPU time (the cores here are shared: that is what the
call costs a free core); more threads by wall time, which on a shared machine includes the
neighbours (the results file records the load average). Configurations run interleaved over
--repeats rounds; figures are medians. Results: bench/results/<date>-<host>-<cpu>-<model>-rtf.json
and .md, with the hardware (omnivoice_export.common.measure.hardware_record). Random weights speak noise:
the figures are speed, not quality (the quality cost of fewer steps is the paper's: docs/performance.md).

    python bench/bench_rtf.py --model full-random --onnx-dir bench/out/full/onnx \\
        --capture-dir bench/out/full/capture --variants fp32-fused,int8 --threads 1,2
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# bench/ (this script's directory) is on sys.path; importing bench_omnivoice puts the repository there.
from bench_omnivoice import E2E_TEXT, RESULTS, export_parser, spread, time_calls

from omnivoice_export.common.measure import cpu_description, cpu_line, hardware_lines, hardware_record, results_stem
from omnivoice_export.step1_capture.capture import REF_TXT, REF_WAV
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import atomic_path, write_json_atomic
from omnivoice_onnx.program import NUM_STEP, int_range, parse, run_main

REF_SECONDS = (3, 10)
STEPS = (32, 16, 8)  # the RTF table's columns; the paper's quality figures exist for these
# The OmniVoice paper's LibriSpeech-PC figures per step count (SIM-o / WER % / UTMOS): what fewer
# steps cost in quality. Random weights cannot measure it; the table shows it beside the speed.
PAPER_QUALITY = {32: (0.729, 1.30, 4.28), 16: (0.728, 1.50, 4.23), 8: (0.713, 2.02, 4.02)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = export_parser(__doc__)
    parser.add_argument(
        "--variants",
        default="int8,fp32-fused",
        help="comma-separated transformer variants, each optionally VARIANT@PROVIDER (e.g. "
        "fp32@openvino-bf16; default provider cpu); the first is the one --check-steps runs",
    )
    parser.add_argument("--threads", default="1,2", help="comma-separated onnxruntime intra-op thread counts")
    parser.add_argument(
        "--ref-seconds",
        default=",".join(map(str, REF_SECONDS)),
        help="comma-separated clone reference lengths, whole seconds",
    )
    parser.add_argument("--num-step", type=NUM_STEP, default=8, help="steps of the measured generate()")
    parser.add_argument(
        "--check-steps",
        type=NUM_STEP,
        default=None,
        help="also run the first configuration at this many steps (the derivation's check)",
    )
    parser.add_argument("--repeats", type=int_range(1), default=1, help="interleaved rounds")
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="where the .json and .md results go")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # "variant:threads:steps", run in this process
    args = parse(parser, argv)
    args.variant_names = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.thread_counts, args.refs = counts(args.threads, "--threads"), counts(args.ref_seconds, "--ref-seconds")
    return args


def counts(text: str, flag: str) -> list[int]:
    """A comma-separated list of whole numbers >= 1, or a UserError naming the flag."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items or not all(item.isdecimal() and int(item) >= 1 for item in items):
        raise UserError(f"{flag}: {text!r} is not a list of whole numbers >= 1", f"give e.g. {flag} 1,2")
    return [int(item) for item in items]


def reference(capture_dir: Path, seconds: int) -> tuple[tuple[Any, int], str]:
    """((waveform, sample rate), transcript) of the step-0 reference cut to, or repeated up to,
    `seconds`; the transcript's words cut or repeated in the same proportion (its length sets the
    prompt's text tokens, as a real transcript's would)."""
    import numpy as np
    import soundfile

    wav, rate_hz = soundfile.read(capture_dir / REF_WAV, dtype="float32")
    words = (capture_dir / REF_TXT).read_text().split()
    repeats = -(-seconds * rate_hz // len(wav))
    out = np.tile(wav, repeats)[: seconds * rate_hz]
    share = len(out) / len(wav)
    text = " ".join((words * repeats)[: max(1, round(len(words) * share))])
    return (out, rate_hz), text


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration in this process: per reference, generate() once, transformer calls timed apart."""
    from omnivoice_onnx import OmniVoiceOnnx

    name, threads, steps = args.worker.split(":")
    threads, steps = int(threads), int(steps)
    variant, _, provider = name.partition("@")
    clock = time.process_time if threads == 1 else time.perf_counter
    tts = OmniVoiceOnnx.from_dir(args.onnx_dir, variant=variant, threads=threads, provider=provider or "cpu")
    spent = time_calls(tts.model, "transformer", clock)
    runs = {}
    for seconds in args.refs:
        ref_audio, ref_text = reference(args.capture_dir, seconds)
        prompt = tts.create_voice_clone_prompt(ref_audio, ref_text)
        spent.clear()
        started = clock()
        (audio,) = tts.generate(E2E_TEXT, voice_clone_prompt=prompt, seed=1, generation_config={"num_step": steps})
        total = clock() - started
        runs[f"{seconds}s"] = {
            "seconds": total,
            "transformer_seconds": sum(spent),
            "calls": len(spent),
            "audio_seconds": len(audio) / tts.sample_rate,
            "ref_text_words": len(ref_text.split()),
        }
    return {
        "variant": name,
        "threads": threads,
        "steps": steps,
        "clock": "cpu" if threads == 1 else "wall",
        "runs": runs,
        "load_1min": os.getloadavg()[0],
    }


def spawn(args: argparse.Namespace, variant: str, threads: int, steps: int) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--worker",
        f"{variant}:{threads}:{steps}",
        "--model",
        args.model,
        "--onnx-dir",
        str(args.onnx_dir),
        "--capture-dir",
        str(args.capture_dir),
        "--ref-seconds",
        args.ref_seconds,
    ]
    print(f"rtf: {variant}, {threads} thread(s), {steps} steps ...", file=sys.stderr, flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"worker {variant}:{threads} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def rtf_table(results: list[dict[str, Any]]) -> dict[str, Any]:
    """{variant: {threads: {ref: {...medians, "rtf": {steps: RTF}}}}} from the measured runs."""
    table: dict[str, Any] = {}
    for variant in dict.fromkeys(r["variant"] for r in results):
        for threads in dict.fromkeys(r["threads"] for r in results if r["variant"] == variant):
            picked = [r for r in results if (r["variant"], r["threads"]) == (variant, threads)]
            steps = picked[0]["steps"]
            for ref in picked[0]["runs"]:
                per_step = spread([r["runs"][ref]["transformer_seconds"] / steps for r in picked])
                rest = spread([r["runs"][ref]["seconds"] - r["runs"][ref]["transformer_seconds"] for r in picked])
                audio = picked[0]["runs"][ref]["audio_seconds"]
                table.setdefault(variant, {}).setdefault(str(threads), {})[ref] = {
                    "measured_steps": steps,
                    "per_step_s": per_step,
                    "rest_s": rest,
                    "audio_s": audio,
                    "clock": picked[0]["clock"],
                    "rtf": {str(n): (rest["median"] + n * per_step["median"]) / audio for n in STEPS},
                }
    return table


def markdown(meta: dict[str, Any], table: dict[str, Any], check: dict[str, Any] | None) -> str:
    audio = min(
        row["audio_s"] for by_threads in table.values() for by_ref in by_threads.values() for row in by_ref.values()
    )
    lines = [
        f"# Real-time factor: {meta['model']} on {meta['host']} ({meta['date']})",
        "",
        f"CPU: {cpu_line(meta['cpu'])}",
        "",
        *hardware_lines(meta),
        "",
        f"One voice clone of a ~{audio:.1f} s target, measured at {meta['num_step']} steps with the "
        "transformer timed apart; RTF at 32/16/8 steps = "
        "(rest + steps x seconds per step) / audio seconds. 1 thread: CPU time (the cost on a free core); "
        "2 threads: wall time on a shared machine (neighbours included: see the load average). Random "
        "weights: the audio is noise; these are speed figures.",
        "",
        "| variant | threads | reference | s per step | rest s | RTF 32 steps | RTF 16 | RTF 8 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant, by_threads in table.items():
        for threads, by_ref in by_threads.items():
            for ref, row in by_ref.items():
                rtf = row["rtf"]
                lines.append(
                    f"| {variant} | {threads} ({row['clock']}) | {ref} | {row['per_step_s']['median']:.2f} | "
                    f"{row['rest_s']['median']:.2f} | {rtf['32']:.2f} | {rtf['16']:.2f} | {rtf['8']:.2f} |"
                )
    if check:
        lines += [
            "",
            f"Check: {check['variant']}, {check['threads']} thread(s), {check['ref']} reference, "
            f"generate() measured at {check['steps']} steps: RTF {check['measured']:.2f}, derived "
            f"{check['derived']:.2f}.",
        ]
    lines += [
        "",
        "Quality cost of fewer steps (OmniVoice paper, LibriSpeech-PC; not measurable with random weights):",
        "",
        "| steps | SIM-o | WER % | UTMOS |",
        "|---|---|---|---|",
    ]
    lines += [f"| {n} | {q[0]:.3f} | {q[1]:.2f} | {q[2]:.2f} |" for n, q in PAPER_QUALITY.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    hardware = hardware_record()
    results = []
    for _ in range(args.repeats):
        for variant in args.variant_names:
            for threads in args.thread_counts:
                results.append(spawn(args, variant, threads, args.num_step))
    table = rtf_table(results)
    check = None
    if args.check_steps:
        variant, threads = args.variant_names[0], args.thread_counts[0]
        run = spawn(args, variant, threads, args.check_steps)
        ref = f"{args.refs[0]}s"
        row = table[variant][str(threads)][ref]
        measured = run["runs"][ref]["seconds"] / run["runs"][ref]["audio_seconds"]
        derived = (row["rest_s"]["median"] + args.check_steps * row["per_step_s"]["median"]) / row["audio_s"]
        check = {
            "variant": variant,
            "threads": threads,
            "ref": ref,
            "steps": args.check_steps,
            "measured": measured,
            "derived": derived,
            "run": run,
        }
    meta = {
        "model": args.model,
        "host": socket.gethostname(),
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_description(),
        "hardware": hardware,
        "num_step": args.num_step,
        "repeats": args.repeats,
        "text": E2E_TEXT,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
    }
    stem = args.results_dir / results_stem(f"{Path(args.model).name}-rtf")
    write_json_atomic(stem.with_suffix(".json"), {"meta": meta, "table": table, "check": check, "runs": results})
    text = markdown(meta, table, check)
    with atomic_path(stem.with_suffix(".md")) as tmp:
        tmp.write_text(text)
    print(text)
    print(f"results: {stem.with_suffix('.json')}")


if __name__ == "__main__":
    run_main(main)
