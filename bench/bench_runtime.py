#!/usr/bin/env python3
"""Benchmark the torch-free runtime (omnivoice_onnx) against upstream generate() with the ONNX graphs.

The bar: at full-random, the runtime's cold start and generate() time are no worse than
upstream's host code running the same graphs, and its peak memory is lower (no torch loaded).
Both sides run the same ONNX export, the same voice-clone request (bench_omnivoice.py's text,
step 0's reference, the same seed) and the same split transformer calls, so what differs is the
host: numpy against torch + transformers + omnivoice.

    runtime    omnivoice_onnx.OmniVoiceOnnx.from_dir(onnx_dir, variant="fp32").generate(...)
    upstream   OmniVoice built around the ONNX graphs (omnivoice_export.step2_export.ort_runtime), then
               torch.manual_seed + OmniVoice.generate(...), as infer_onnx.py's compare mode runs it

Each run is a fresh process (`--worker`), in the order runtime, upstream, runtime, upstream, ...
over --repeats rounds, so drift and a neighbour's load hit both alike. Per run:
    import_s     importing what the side needs (omnivoice_onnx; torch, omnivoice and the toolchain)
    cold_start_s process start (the interpreter launched by this script) -> ready to generate:
                 interpreter start, imports, sessions and model loaded
    generate_s   one generate() call, wall time
    peak_rss_mib the worker's ru_maxrss (whole process lifetime: load + generate)
and the final tokens of the two sides must be equal (exit 1 otherwise: a time for other speech is
no figure). Medians with min..max go to bench/results/<date>-<host>-<model>-runtime.json and .md,
with the CPU (model name, family) and the load average at the start and the end: the machine may
be shared, and a figure measured under load says so there.

    python bench/bench_runtime.py --model tiny --onnx-dir onnx --capture-dir capture
    python bench/bench_runtime.py --model full-random --onnx-dir bench/out/full/onnx \\
        --capture-dir bench/out/full/capture --repeats 2
"""

from __future__ import annotations

# Module level: the standard library only. A worker imports what its side needs inside the timed
# region, so that import_s and peak_rss_mib are the side's own.
import argparse
import datetime
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(REPO), str(BENCH)]  # the packages, and bench_omnivoice's shared helpers
SIDES = ("runtime", "upstream")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The orchestrator's flags (a worker's are worker_main's)."""
    from bench_omnivoice import RESULTS, export_parser

    from omnivoice_onnx.program import NUM_STEP, int_range, parse

    parser = export_parser(__doc__)
    parser.add_argument(
        "--repeats",
        type=int_range(1),
        default=2,
        help="rounds; each runs the runtime, then upstream, each in a fresh process",
    )
    parser.add_argument("--num-step", type=NUM_STEP, default=32, help="generate() steps")
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="where the .json and .md results go")
    return parse(parser, argv)


# --- worker side: one generate() in this fresh process, figures as JSON on the last stdout line ---


def runtime_worker(onnx_dir: Path, request: dict[str, Any]) -> tuple[float, float, Callable[[], list[list[int]]]]:
    """(import seconds, time.time() once ready, generate() returning the final tokens [8][T]) of
    omnivoice_onnx."""
    started = time.perf_counter()
    import onnxruntime  # noqa: F401  (the runtime imports it lazily, at its first session)

    from omnivoice_onnx import OmniVoiceOnnx, Trace

    imported = time.perf_counter() - started
    tts = OmniVoiceOnnx.from_dir(onnx_dir, variant="fp32")  # the graph upstream's side runs, whatever the default
    ready = time.time()
    trace = Trace()

    def generate() -> list[list[int]]:
        tts.generate(
            request["text"],
            language=request["language"],
            ref_text=request["ref_text"],
            ref_audio=request["ref_audio"],
            generation_config={"num_step": request["num_step"]},
            seed=request["seed"],
            trace=trace,
        )
        tokens = trace.results[0]
        assert not isinstance(tokens, list), "a request this short is never chunked (one array, no chunks)"
        final: list[list[int]] = tokens.tolist()
        return final

    return imported, ready, generate


def upstream_worker(
    args: argparse.Namespace, request: dict[str, Any]
) -> tuple[float, float, Callable[[], list[list[int]]]]:
    """The same for upstream generate() around the ONNX graphs, loaded as bench_omnivoice's
    generate() worker loads it."""
    started = time.perf_counter()
    import omnivoice.models.omnivoice  # noqa: F401  (imported lazily by the loader: counted here)
    import onnxruntime  # noqa: F401
    import transformers  # noqa: F401
    from bench_omnivoice import load_variant

    from omnivoice_export.step1_capture.capture import Recorder
    from omnivoice_export.step1_capture.generation import GenerationRequest, run_generate

    imported = time.perf_counter() - started
    model, _ = load_variant(args, "onnx", variant="fp32")
    ready = time.time()

    def generate() -> list[list[int]]:
        recorder = Recorder(model, Path("."), steps=set())  # steps=set(): token states only, nothing written
        with recorder.active():
            run_generate(model, GenerationRequest.from_dict(request))
        final: list[list[int]] = recorder.token_states[-1][0].tolist()
        return final

    return imported, ready, generate


def worker(side: str, launched: float, args: argparse.Namespace) -> dict[str, Any]:
    """Load one side and generate once; `launched` is time.time() just before this process was started."""
    request = json.loads(args.request)
    if side == "runtime":
        imported, ready, generate = runtime_worker(args.onnx_dir, request)
    else:
        imported, ready, generate = upstream_worker(args, request)
    started = time.perf_counter()
    tokens = generate()
    return {
        "import_s": imported,
        "cold_start_s": ready - launched,
        "generate_s": time.perf_counter() - started,
        # Linux reports ru_maxrss in KiB.
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "tokens": tokens,
    }


def worker_main(argv: list[str]) -> None:
    """`--worker SIDE --launched T --model M --onnx-dir D --capture-dir C --request JSON` (internal)."""
    from omnivoice_export.common.edge import add_capture_dir, add_onnx_dir

    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=SIDES, required=True)
    parser.add_argument("--launched", type=float, required=True)
    parser.add_argument("--model", required=True)
    add_onnx_dir(parser, "the export to run", required=True)
    add_capture_dir(parser, "step 1's capture", required=True)
    parser.add_argument("--request", required=True)
    args = parser.parse_args(argv)
    print(json.dumps(worker(args.worker, args.launched, args)))


# --- orchestrator --------------------------------------------------------------------------------


def spawn(args: argparse.Namespace, side: str, request: dict[str, Any]) -> dict[str, Any]:
    """One worker in a fresh interpreter; its result."""
    command = [
        sys.executable,
        __file__,
        "--worker",
        side,
        "--launched",
        repr(time.time()),
        "--model",
        args.model,
        "--onnx-dir",
        str(args.onnx_dir),
        "--capture-dir",
        str(args.capture_dir),
        "--request",
        json.dumps(request),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"{side} worker failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def summarise(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per side and figure: median, min, max; ratios runtime / upstream of the medians."""
    from bench_omnivoice import spread

    figures = ("import_s", "cold_start_s", "generate_s", "peak_rss_mib")
    summary: dict[str, Any] = {side: {f: spread([r[side][f] for r in rounds]) for f in figures} for side in SIDES}
    summary["runtime_vs_upstream"] = {
        f: summary["runtime"][f]["median"] / summary["upstream"][f]["median"] for f in figures
    }
    reference = rounds[0]["upstream"]["tokens"]
    summary["tokens_equal"] = all(r[side]["tokens"] == reference for r in rounds for side in SIDES)
    summary["target_frames"] = len(reference[0])
    return summary


def markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    from omnivoice_export.common.measure import hardware_lines

    cpu, load = meta["cpu"], meta["load_average"]
    # Only the start says whether other work shared the cores: at the end the 1-minute average
    # counts this bench's own workers (ORT keeps both cores busy).
    loaded = load["start"][0] > 0.5
    lines = [
        f"# omnivoice_onnx runtime vs upstream generate() (ONNX graphs): {meta['model']} on {meta['host']} "
        f"({meta['date']})",
        "",
        f"CPU: {cpu['model_name']} ({cpu['vendor']} family {cpu['family']} model {cpu['model']}), "
        f"{cpu['logical_cores']} logical / {cpu['physical_cores']} physical cores. Load average (1/5/15 min) "
        f"at start {load['start'][0]:.2f} / {load['start'][1]:.2f} / {load['start'][2]:.2f}, at end "
        f"{load['end'][0]:.2f} / {load['end'][1]:.2f} / {load['end'][2]:.2f} (the bench's own workers included)"
        f"{' — **measured under load**: other work shared the cores' if loaded else ''}.",
        "",
        *hardware_lines(meta),
        "",
        f"One clone generate(), {summary['target_frames']} target frames, {meta['num_step']} steps, a fresh "
        f"process per run, {meta['repeats']} interleaved rounds; medians (min..max). Final tokens equal: "
        f"**{'yes' if summary['tokens_equal'] else 'NO'}**.",
        "",
        "| figure | runtime (omnivoice_onnx) | upstream + ONNX graphs | runtime / upstream |",
        "|---|---|---|---|",
    ]
    for figure, label, unit in (
        ("import_s", "imports", "s"),
        ("cold_start_s", "cold start (process start -> ready)", "s"),
        ("generate_s", "generate()", "s"),
        ("peak_rss_mib", "peak RSS (ru_maxrss)", "MiB"),
    ):
        cells = []
        for side in SIDES:
            s = summary[side][figure]
            digits = 0 if unit == "MiB" else 2
            cells.append(f"{s['median']:.{digits}f} ({s['min']:.{digits}f}..{s['max']:.{digits}f}) {unit}")
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {summary['runtime_vs_upstream'][figure]:.3g}x |")
    return "\n".join(lines + [""])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker_main(argv)
        return
    from bench_omnivoice import E2E_TEXT, check_export, clone_request

    from omnivoice_export.common.measure import cpu_description, hardware_record, results_stem
    from omnivoice_export.step1_capture.capture import REF_WAV
    from omnivoice_onnx.core.prompt import TextTokenizer
    from omnivoice_onnx.errors import UserError
    from omnivoice_onnx.files import atomic_path, write_json_atomic
    from omnivoice_onnx.program import CheckFailed
    from omnivoice_onnx.runtime_config import load_runtime_config

    args = parse_args(argv)
    # Workers run in the repository (cwd=REPO): they get absolute paths.
    args.onnx_dir, args.capture_dir = args.onnx_dir.resolve(), args.capture_dir.resolve()
    if not (args.capture_dir / REF_WAV).is_file():
        raise UserError(f"{args.capture_dir / REF_WAV} not found", "run make_reference.py (step 0) first")
    fingerprint = check_export(args, [])
    load_runtime_config(args.onnx_dir / "runtime-config.json")  # the runtime's own files: an older export lacks them
    TextTokenizer.from_file(args.onnx_dir / "tokenizer.json")
    request = clone_request(args.capture_dir, E2E_TEXT, args.num_step).to_dict()
    load_start = os.getloadavg()
    hardware = hardware_record()
    rounds = []
    for index in range(args.repeats):
        round_ = {}
        for side in SIDES:
            print(f"round {index + 1}/{args.repeats}: {side} ...", flush=True)
            round_[side] = spawn(args, side, request)
        rounds.append(round_)
    summary = summarise(rounds)
    for round_ in rounds:  # compared in summarise(); keep the result file small
        for run in round_.values():
            run.pop("tokens")
    meta = {
        "model": args.model,
        "fingerprint": fingerprint,
        "host": socket.gethostname(),
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_description(),
        "repeats": args.repeats,
        "num_step": args.num_step,
        "request": request,
        "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
        "hardware": hardware,
    }
    stem = args.results_dir / results_stem(f"{Path(args.model).name}-runtime")
    write_json_atomic(stem.with_suffix(".json"), {"meta": meta, "summary": summary, "rounds": rounds})
    text = markdown(summary, meta)
    with atomic_path(stem.with_suffix(".md")) as tmp:
        tmp.write_text(text)
    print(text)
    print(f"results: {stem.with_suffix('.json')}")
    if not summary["tokens_equal"]:
        raise CheckFailed(
            "the runtime's final tokens differ from upstream generate()'s with the same graphs: its time "
            "is not comparable; run infer_onnx.py (compare mode) on this export"
        )


if __name__ == "__main__":
    from omnivoice_onnx.program import run_main  # the standard library only, as every script's one-line errors

    run_main(main)
