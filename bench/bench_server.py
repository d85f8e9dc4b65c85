#!/usr/bin/env python3
"""Load-test `omnivoice-onnx serve` with the official `openai` client on loopback.

What a deployment asks of the server, measured as its users' client sees it:
    levels     at 1, 2, 4, 8 concurrent clients (each sends its next request as soon as the last
               returns): requests/s, p50/p95 latency, and with stream_format="audio" on a
               multi-sentence input the time to the first audio byte against the total time;
               errors must be 0 (the queue holds every client)
    overload   more clients than workers + queue: the extra requests must get 429 (with
               Retry-After), never a crash, a timeout or a 5xx
    memory     the server's RSS after 10 requests and after --memory-requests (1,000) more
    batching   in-process: generate() on a batch of 4 texts vs 4 single calls, the only way
               this runtime could batch queued requests (the server does not: see the result)

The server is started by this script (tests/serving.py.launch) from --onnx-dir, one worker
per --workers with threads = cores // workers.

    engines    with --engines 1x1,1x2,2x1 (WORKERSxTHREADS): only the levels, once per server shape,
               into one table (requests/s, p50/p95, audio seconds per wall second): which split of
               the cores serves most, what `serve`'s defaults are chosen from
               (<date>-<host>-<cpu>-<model>-server-engines.json and .md; --workers and --quick
               do not apply there). Results go to
bench/results/<date>-<host>-<cpu>-<model>-server.json and .md with the CPU (ISA flags, the AMX
check) and the load average at start and end: on a shared machine the figures are the neighbours'
too, and the .md says so.

    python bench/bench_server.py --onnx-dir onnx --model tiny
    python bench/bench_server.py --onnx-dir onnx --model tiny --quick      # 1/2 clients, 100-request memory run
    python bench/bench_server.py --onnx-dir bench/out/full/onnx --model full-random --engines 1x1,1x2,2x1 \
        --levels 1,2,4 --per-client 2 --num-step 8
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))  # tests/serving.py: the server as a child process

from omnivoice_export.common.edge import add_onnx_dir  # noqa: E402
from omnivoice_onnx.contract import SAMPLE_RATE  # noqa: E402
from omnivoice_onnx.errors import UserError  # noqa: E402
from omnivoice_onnx.program import (  # noqa: E402
    int_range,  # noqa: E402
    parse,
    run_main,
)

if TYPE_CHECKING:  # the OpenAI client (requirements.txt), imported where a level runs
    import openai

STREAM_TEXT = (
    "The first sentence is here. A second one follows it, somewhat longer than the first. "
    "Then a third, so that the stream has several chunks to send. And a fourth to end it."
)
SHORT_TEXT = "Hello there, how are you today?"
LEVELS = (1, 2, 4, 8)
# response_format="pcm": 16-bit mono at the codec's rate.
PCM_BYTES_PER_SECOND = 2 * SAMPLE_RATE


def client_levels(text: str) -> tuple[int, ...]:
    """--levels: comma-separated client counts >= 1."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items or not all(item.isdecimal() and int(item) >= 1 for item in items):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of client counts (e.g. 1,2,4)")
    return tuple(int(item) for item in items)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def timed_stream(client: openai.OpenAI, text: str, num_step: int | None) -> dict[str, Any]:
    """One streamed request: seconds to the first audio byte (None: no audio came) and to the end, bytes."""
    start = time.perf_counter()
    first = None
    size = 0
    extra = {"num_step": num_step} if num_step else {}
    with client.audio.speech.with_streaming_response.create(
        model="omnivoice", voice="auto", input=text, response_format="pcm", stream_format="audio", extra_body=extra
    ) as response:
        for piece in response.iter_bytes():
            if piece and first is None:
                first = time.perf_counter() - start
            size += len(piece)
    return {"ttfb_s": first, "total_s": time.perf_counter() - start, "bytes": size}


def level(base_url: str, clients: int, per_client: int, num_step: int | None) -> dict[str, Any]:
    """`clients` closed-loop clients, `per_client` streamed requests each."""
    import openai

    results: list[dict[str, Any]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def run_client() -> None:
        client = openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=600)
        for _ in range(per_client):
            try:
                result = timed_stream(client, STREAM_TEXT, num_step)
            except Exception as exc:  # counted, not raised: the figure is how many fail
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            with lock:
                results.append(result)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(run_client) for _ in range(clients)]:
            future.result()
    wall = time.perf_counter() - start
    totals = [r["total_s"] for r in results]
    ttfb = [r["ttfb_s"] for r in results]
    audio_s = sum(r["bytes"] for r in results) / PCM_BYTES_PER_SECOND
    return {
        "clients": clients,
        "requests": len(results),
        "errors": len(errors),
        "error_samples": errors[:3],
        "wall_s": wall,
        "requests_per_s": len(results) / wall,
        "audio_s_per_wall_s": audio_s / wall,
        "latency_p50_s": percentile(totals, 0.5),
        "latency_p95_s": percentile(totals, 0.95),
        "ttfb_p50_s": percentile(ttfb, 0.5),
        "ttfb_p95_s": percentile(ttfb, 0.95),
    }


def overload(base_url: str, clients: int, num_step: int | None) -> dict[str, Any]:
    """`clients` simultaneous whole-clip requests against a small queue: statuses counted."""
    import openai

    def one(_: int) -> str:
        client = openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=600)
        try:
            client.audio.speech.create(
                model="omnivoice",
                voice="auto",
                input=STREAM_TEXT,
                response_format="pcm",
                extra_body={"num_step": num_step} if num_step else {},
            ).read()
            return "200"
        except openai.RateLimitError as exc:
            return f"429 retry-after={exc.response.headers.get('retry-after')}"
        except openai.APIStatusError as exc:
            return str(exc.status_code)
        except Exception as exc:  # a timeout or a dropped connection: exactly what must not happen
            return type(exc).__name__

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        outcomes = list(pool.map(one, range(clients)))
    counts: dict[str, int] = {}
    for outcome in outcomes:
        key = outcome.split()[0]
        counts[key] = counts.get(key, 0) + 1
    return {
        "clients": clients,
        "outcomes": counts,
        "retry_after": sorted({o.split("=")[1] for o in outcomes if o.startswith("429")}),
    }


def memory(base_url: str, pid: int, total: int) -> dict[str, Any]:
    """RSS after 10 whole-clip requests and after `total` (2 clients, short text, 4 steps: the
    loop's allocations, not its speed, are the point)."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=600)

    def one(_: int) -> None:
        client.audio.speech.create(
            model="omnivoice", voice="auto", input=SHORT_TEXT, response_format="wav", extra_body={"num_step": 4}
        ).read()

    marks = {}
    done = 0
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for target in (10, total):
            list(pool.map(one, range(target - done)))
            done = target
            marks[target] = rss_mib(pid)
    return {
        "requests": total,
        "rss_mib_after_10": marks[10],
        "rss_mib_after_all": marks[total],
        "growth_mib": marks[total] - marks[10],
    }


def batching(onnx_dir: Path, threads: int, variant: str | None, repeats: int = 3) -> dict[str, Any]:
    """generate() of 4 texts as one batch vs one at a time (same texts, seeds differ by design:
    a batch shares one generator), best of `repeats`."""
    from omnivoice_onnx import OmniVoiceOnnx

    tts = OmniVoiceOnnx.from_dir(onnx_dir, threads=threads, variant=variant, resident_codecs=True)
    texts = [STREAM_TEXT.split(". ")[i] + "." for i in range(4)]
    tts.generate(texts[0], seed=0)  # warm-up
    single, batch = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for text in texts:
            tts.generate(text, seed=0)
        single.append(time.perf_counter() - start)
        start = time.perf_counter()
        tts.generate(texts, seed=0)
        batch.append(time.perf_counter() - start)
    return {
        "texts": len(texts),
        "four_single_calls_s": min(single),
        "one_batch_of_four_s": min(batch),
        "batch_speedup": min(single) / min(batch),
    }


def header_lines(meta: dict[str, Any], what: str, note: str = "") -> list[str]:
    """A results page's title ("# omnivoice-onnx serve" + `what`), CPU, load average and hardware record."""
    from omnivoice_export.common.measure import hardware_lines

    title = f"# omnivoice-onnx serve{what} — {meta['model']} ({meta['date']})"
    return [
        title,
        "",
        f"CPU: {meta['cpu']['model_name']} ({meta['cores']} cores available); load average at start "
        f"{meta['load_start']}, at end {meta['load_end']}." + (f" {note}" if note else ""),
        "",
        *hardware_lines(meta),
        "",
    ]


def requests_phrase(meta: dict[str, Any]) -> str:
    """What every timed request is, as both results pages say it."""
    steps = f", num_step {meta['num_step']}" if meta["num_step"] else ""
    return f"streamed requests (stream_format=audio, pcm) of a {len(STREAM_TEXT)}-character, 4-sentence text{steps}."


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        *header_lines(meta, " under load", meta["note"]),
        f"Server: {meta['workers']} worker(s) x {meta['threads']} thread(s), queue {meta['queue']}; client: the "
        f"official openai {meta['openai']} Python client on loopback; {requests_phrase(meta)}",
        "",
        "| clients | requests | errors | req/s | p50 latency s | p95 latency s | p50 first byte s | p95 first byte s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["levels"]:
        lines.append(
            f"| {row['clients']} | {row['requests']} | {row['errors']} | {row['requests_per_s']:.2f} | "
            f"{row['latency_p50_s']:.2f} | {row['latency_p95_s']:.2f} | {row['ttfb_p50_s']:.2f} | "
            f"{row['ttfb_p95_s']:.2f} |"
        )
    over = result["overload"]
    mem = result["memory"]
    bat = result["batching"]
    lines += [
        "",
        f"Overload: {over['clients']} simultaneous requests against 1 worker + queue {over['queue']}: "
        f"{over['outcomes']} (Retry-After values {', '.join(over['retry_after']) or '-'}).",
        "",
        f"Memory: server RSS {mem['rss_mib_after_10']:.0f} MiB after 10 requests, "
        f"{mem['rss_mib_after_all']:.0f} MiB after {mem['requests']} "
        f"({mem['growth_mib']:+.1f} MiB).",
        "",
        f"Batching (in-process, not in the server): 4 texts one at a time {bat['four_single_calls_s']:.2f} s, "
        f"as one generate() batch {bat['one_batch_of_four_s']:.2f} s (x{bat['batch_speedup']:.2f}).",
    ]
    return "\n".join(lines) + "\n"


def engines_markdown(result: dict[str, Any]) -> str:
    """The workers x threads table: one row per server shape and client count."""
    meta = result["meta"]
    lines = [
        *header_lines(meta, ": workers x threads"),
        f"Variant {meta['variant']}; client: the official openai {meta['openai']} Python client on loopback, "
        f"closed loop ({meta['per_client']} requests per client); {requests_phrase(meta)}",
        "",
        "| workers x threads | clients | requests | errors | req/s | audio s per wall s | p50 latency s | "
        "p95 latency s | p50 first byte s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for engine in result["engines"]:
        for row in engine["levels"]:
            lines.append(
                f"| {engine['workers']} x {engine['threads']} | {row['clients']} | {row['requests']} | "
                f"{row['errors']} | {row['requests_per_s']:.3f} | {row['audio_s_per_wall_s']:.3f} | "
                f"{row['latency_p50_s']:.2f} | {row['latency_p95_s']:.2f} | {row['ttfb_p50_s']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def server_shapes(text: str) -> list[tuple[int, int]]:
    """--engines as (workers, threads) server shapes (bench_batch's syntax; Ray's engines are batch's)."""
    from bench_batch import engines

    shapes = []
    try:
        found = engines(text)
    except UserError as exc:  # bench_batch's hint names its Ray engines, which a server has not
        raise UserError(exc.problem, "give WORKERSxTHREADS items, e.g. --engines 1x1,1x2,2x1") from None
    for name, workers, threads, ray in found:
        if ray:
            raise UserError(f"--engines: {name!r} is a batch engine", "give WORKERSxTHREADS items, e.g. 1x1,1x2,2x1")
        shapes.append((workers, threads))
    return shapes


def variant_flags(args: argparse.Namespace) -> list[str]:
    """`serve`'s --variant for every server this bench starts (none: the export's default)."""
    return ["--variant", args.variant] if args.variant else []


def run_engines(args: argparse.Namespace, env: dict[str, str], tmp: Path) -> list[dict[str, Any]]:
    """The levels once per --engines server shape, each server started and stopped in turn."""
    from serving import launch

    found = []
    for workers, threads in args.engines:
        flags = [
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            "--queue",
            str(max(args.levels)),
            *variant_flags(args),
        ]
        launched = launch(args.onnx_dir, tmp / f"server-{workers}x{threads}.log", *flags, env=env, start_timeout=600.0)
        try:
            rows = []
            for clients in args.levels:
                rows.append(level(launched.base_url, clients, args.per_client, args.num_step))
                print(
                    f"{workers}x{threads}, {clients} clients: {rows[-1]['requests_per_s']:.3f} req/s, "
                    f"p50 {rows[-1]['latency_p50_s']:.2f} s, p95 {rows[-1]['latency_p95_s']:.2f} s, "
                    f"errors {rows[-1]['errors']}",
                    file=sys.stderr,
                )
        finally:
            code = launched.stop()
        found.append({"workers": workers, "threads": threads, "levels": rows, "exit_code": code})
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_onnx_dir(parser, "the export to serve")
    parser.add_argument(
        "--model", default="tiny", help="label of the export's model in the results (tiny, full-random)"
    )
    parser.add_argument("--workers", type=int_range(1, 64), default=1, help="server workers")
    parser.add_argument("--per-client", type=int_range(1), default=6, help="requests per client at each level")
    parser.add_argument("--num-step", type=int_range(1), default=None, help="num_step of the timed requests")
    parser.add_argument("--memory-requests", type=int_range(11), default=1000, help="requests of the memory run")
    parser.add_argument(
        "--quick", action="store_true", help="1 and 2 clients, 100 memory requests: a look, not a figure"
    )
    parser.add_argument(
        "--engines",
        default=None,
        help="comma-separated WORKERSxTHREADS server shapes (e.g. 1x1,1x2,2x1): run only the levels, "
        "once per shape, into one table (no memory, overload or batching runs)",
    )
    parser.add_argument(
        "--levels",
        type=client_levels,
        default=LEVELS,
        help="comma-separated concurrent-client counts (default: 1,2,4,8)",
    )
    parser.add_argument("--variant", default=None, help="transformer variant the server runs (default: its own)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    args = parse(parser, argv)
    if args.engines:  # checked before any measurement starts
        args.engines = server_shapes(args.engines)
    if not (args.onnx_dir / "runtime-config.json").is_file():
        raise UserError(f"--onnx-dir {args.onnx_dir} holds no export", "pass the folder export_omnivoice.py wrote")
    import openai
    from serving import launch

    from omnivoice_export.common.measure import hardware_record, results_stem
    from omnivoice_onnx import sessions
    from omnivoice_onnx.serve import service as server_service

    cores = sessions.cores()
    if args.engines:
        load_start = os.getloadavg()
        hardware = hardware_record()
        env = {key: value for key, value in os.environ.items() if key != server_service.API_KEY_ENV}
        with tempfile.TemporaryDirectory() as tmp:
            found = run_engines(args, env, Path(tmp))
        result = {
            "meta": run_meta(
                args,
                cores,
                load_start,
                hardware,
                openai.__version__,
                variant=args.variant or "default",
                per_client=args.per_client,
            ),
            "engines": found,
        }
        write_results(args.out_dir, results_stem(f"{args.model}-server-engines"), result, engines_markdown(result))
        return
    threads = max(1, cores // args.workers)
    levels = args.levels[:2] if args.quick else args.levels
    memory_requests = 100 if args.quick else args.memory_requests
    load_start = os.getloadavg()
    hardware = hardware_record()
    with tempfile.TemporaryDirectory() as tmp:
        env = {key: value for key, value in os.environ.items() if key != server_service.API_KEY_ENV}
        launched = launch(
            args.onnx_dir,
            Path(tmp) / "server.log",
            "--workers",
            str(args.workers),
            "--queue",
            str(max(levels)),
            *variant_flags(args),
            env=env,
        )
        try:
            rows = []
            for clients in levels:
                rows.append(level(launched.base_url, clients, args.per_client, args.num_step))
                print(
                    f"{clients} clients: {rows[-1]['requests_per_s']:.2f} req/s, "
                    f"p50 {rows[-1]['latency_p50_s']:.2f} s, "
                    f"first byte p50 {rows[-1]['ttfb_p50_s']:.2f} s, errors {rows[-1]['errors']}",
                    file=sys.stderr,
                )
            mem = memory(launched.base_url, launched.process.pid, memory_requests)
            print(f"memory: {mem}", file=sys.stderr)
        finally:
            code = launched.stop()
        queue = 2
        small = launch(
            args.onnx_dir,
            Path(tmp) / "small.log",
            "--workers",
            "1",
            "--queue",
            str(queue),
            *variant_flags(args),
            env=env,
        )
        try:
            over = {**overload(small.base_url, 4 * (queue + 1), args.num_step), "queue": queue}
            print(f"overload: {over}", file=sys.stderr)
        finally:
            small_code = small.stop()
    bat = batching(args.onnx_dir, cores, args.variant)
    print(f"batching: {bat}", file=sys.stderr)
    result = {
        "meta": run_meta(
            args,
            cores,
            load_start,
            hardware,
            openai.__version__,
            workers=args.workers,
            threads=threads,
            queue=max(levels),
            quick=args.quick,
            server_exit_codes=[code, small_code],
            note="The machine is shared with other sessions' jobs: these figures include their load.",
        ),
        "levels": rows,
        "overload": over,
        "memory": mem,
        "batching": bat,
    }
    write_results(args.out_dir, results_stem(f"{args.model}-server"), result, markdown(result))


def run_meta(
    args: argparse.Namespace,
    cores: int,
    load_start: tuple[float, ...],
    hardware: dict[str, Any],
    openai_version: str,
    **extra: Any,
) -> dict[str, Any]:
    """A results file's meta, both runs: model, UTC time, host, CPU, cores, steps, client version,
    the load average at start and now, the hardware record; then the run's own `extra` fields."""
    from omnivoice_export.common.measure import cpu_description

    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "model": args.model,
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "host": socket.gethostname(),
        "cpu": cpu_description(),
        "cores": cores,
        "num_step": args.num_step,
        "openai": openai_version,
        "load_start": [round(x, 2) for x in load_start],
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "hardware": hardware,
        **extra,
    }


def write_results(out_dir: Path, stem: str, result: dict[str, Any], text: str) -> None:
    """The .json and .md results, each written to a temporary name and renamed into place."""
    from omnivoice_onnx.files import atomic_path, write_json_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / f"{stem}.json", result)
    with atomic_path(out_dir / f"{stem}.md") as tmp:
        tmp.write_text(text)
    print(f"wrote {out_dir / stem}.json and .md", file=sys.stderr)


if __name__ == "__main__":
    run_main(main)
