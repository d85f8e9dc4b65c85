#!/usr/bin/env python3
"""Benchmark PyTorch eager vs ONNX Runtime for OmniVoice: per-call latency, end to end, memory.

Measures, for one checkpoint (tiny, full-random or a path) and its ONNX export:
    gemm         this machine's fp32 GEMM peak, in a fresh process: torch.mm (MKL) and a one-node
                 ONNX MatMul (ORT's MLAS) at square and model shapes; the higher is the ceiling
                 the transformer's achieved GFLOP/s is reported against
    transformer  one forward at representative shapes (--shapes: S ~ 200, 435, 800) with generate()'s real
                 cond/uncond layout; PyTorch padded (upstream) vs ORT padded vs ORT split
                 (cond and uncond rows each at their own length); the ONNX workers time the
                 inputs the torch worker built and load no PyTorch weights
    encoder      --codec-seconds of audio (5 s and 20 s);  decoder  the same durations as codes
    generate()   a voice clone from the ~5 s capture reference, each in a fresh process that
                 loads the model and generates once: PyTorch eager (upstream) vs the ONNX graphs
                 inside the same generate() without PyTorch weights; final tokens compared, and
                 the peak RSS of that process (load + generate) is the memory figure
    runtime      the same request and seed through the torch-free runtime (omnivoice_onnx, the
                 product: numpy host code, codec sessions opened per call as `speak` does), for
                 fp32 and every variant: its own generate() time against torch's
    variants     each transformer variant of step 5 (quantize_omnivoice.py) in --variants, against
                 the fp32 ORT graph in the same run: per call at the three shapes (split, as
                 generate() runs it; logits against fp32 ORT's and torch's), generate() with its
                 final tokens against torch's, size on disk and peak RSS; a table per variant.

Every variant runs in its own worker process (page faults and allocator state of one runtime
would otherwise bias the next), workers alternate A B A B over --repeats rounds, and figures are
medians with min..max spread. Results go to bench/results/<date>-<host>-<cpu>-<model>.json and .md,
with the CPU (model, family, cores, ISA flags; onnxruntime's version, the load average and whether
its int8 GEMM runs on AMX: measure.hardware_record) and the GEMM library each side uses (torch: its
BLAS, MKL on x86; ORT: its own MLAS): the speedup is a property of that CPU, the ORT-vs-torch padded ratio
shows the library part of it, the split the part that holds everywhere. The investigation log
keeps the history.

The export must be of the model measured (same fingerprint, every graph and variant as its report
records it), or the bench refuses to start (exit 2). The exit code is 1 when ONNX generate()'s
final tokens differ from PyTorch's, with the fp32 graph or an fp32 variant (fp32-unmasked,
fp32-fused), through upstream's host code or the runtime: a speed figure for different speech is
no figure. A quantized variant's tokens are a measurement.

    python bench/bench_omnivoice.py --model tiny --onnx-dir onnx --capture-dir capture
    python bench/bench_omnivoice.py --model full-random --onnx-dir bench/out/full/onnx \\
        --capture-dir bench/out/full/capture
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from omnivoice_export.common.edge import add_capture_dir, add_onnx_dir, parse_subset  # noqa: E402
from omnivoice_export.common.measure import cpu_description, hardware_lines, hardware_record, rate, results_stem  # noqa: E402
from omnivoice_export.step0_checkpoints.checkpoints import model_fingerprint, resolve_model  # noqa: E402
from omnivoice_export.step1_capture.capture import REF_TXT, REF_WAV  # noqa: E402
from omnivoice_export.step2_export import report  # noqa: E402
from omnivoice_export.step56_variants import quantize  # noqa: E402
from omnivoice_onnx.contract import GRAPH_NAMES, SAMPLE_RATE, codec_paths, variant_path  # noqa: E402
from omnivoice_onnx.errors import UserError  # noqa: E402
from omnivoice_onnx.files import atomic_path, write_json_atomic  # noqa: E402
from omnivoice_onnx.limits import THREADS_ENV, default_threads  # noqa: E402
from omnivoice_onnx.program import NUM_STEP, CheckFailed, float_range, int_range, parse, run_main  # noqa: E402

if TYPE_CHECKING:  # imported where a worker needs them: the runtime-e2e worker never imports torch
    import torch

    from omnivoice_export.step1_capture.generation import GenerationRequest
    from omnivoice_export.step2_export.ort_runtime import OrtGraphs

RESULTS = REPO / "bench" / "results"
# Target texts giving S ~ 200 / 435 / 800 in clone mode with the ~5 s reference (real tokenizer).
SHAPE_TEXTS = {
    "S~200": "Please call Stella and ask her to bring these things.",
    "S~435": (
        "Please call Stella and ask her to bring these things with her from the store: six spoons "
        "of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother Bob."
    ),
    "S~800": (
        "Please call Stella and ask her to bring these things with her from the store: six spoons of "
        "fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother Bob. We "
        "also need a small plastic snake and a big toy frog for the kids. She can scoop these things "
        "into three red bags, and we will go meet her Wednesday at the train station, right after "
        "lunch, unless the weather turns bad and the trains are delayed again by the storm."
    ),
}
E2E_TEXT = SHAPE_TEXTS["S~435"]
CODEC_SECONDS = "5,20"
# One round, in order: the GEMM ceiling, then each pair of variants A B. torch-calls must run before
# onnx-calls, and fp32's onnx-calls before each variant's: each writes to --scratch what the next reads.
WORKERS = ("gemm", "torch-calls", "onnx-calls", "torch-e2e", "onnx-e2e", "runtime-e2e")
# What the workers time with. `cpu` runs every side on one thread (torch and onnxruntime compute on
# the calling thread then, without spinning helpers) and reads the process's CPU time: on cores
# shared with other work, wall time measures the neighbours, CPU time the call.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
CLOCK = CLOCKS["wall"]  # the worker's, set in worker()
CPU_CLOCK_NOTE = (
    "**Clock: CPU time, one thread per side** (--clock cpu): every time below is the seconds of CPU "
    "one core spent, every GFLOP/s per CPU-second (the GEMM peak is one core's). Other work on the "
    "cores stretches wall time, not these; shared caches and memory bandwidth still slow them."
)
# GEMM shapes (m, k, n): a square one and the transformer's own at S~435 split (730 rows).
GEMM_SHAPES = ((2048, 2048, 2048), (730, 1024, 3072), (730, 3072, 1024), (730, 1024, 2048))


def export_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the flags every bench script shares: the model, its export and step 0's reference."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny | full-random | PATH (must match the export)")
    add_onnx_dir(parser, "the export to measure")
    add_capture_dir(parser, "where ref_voice.wav/.txt (step 0) are: the clone reference")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = export_parser(__doc__)
    parser.add_argument("--repeats", type=int_range(1), default=2, help="A B rounds (each variant runs once per round)")
    parser.add_argument(
        "--calls", type=int_range(1), default=3, help="timed transformer/codec calls per worker and shape"
    )
    parser.add_argument("--num-step", type=NUM_STEP, default=32, help="generate() steps")
    parser.add_argument("--skip-e2e", action="store_true", help="per-call figures only")
    parser.add_argument(
        "--shapes",
        default=",".join(SHAPE_TEXTS),
        help=f"comma-separated transformer call shapes to time, of {', '.join(SHAPE_TEXTS)}",
    )
    parser.add_argument(
        "--codec-seconds",
        default=CODEC_SECONDS,
        help="comma-separated audio durations (whole seconds) the encoder and decoder are timed at",
    )
    parser.add_argument(
        "--gemm-seconds",
        type=float_range(0.01),
        default=1.0,
        help="seconds each GEMM shape is repeated for, per library (the ceiling's precision)",
    )
    parser.add_argument(
        "--variants",
        default=None,
        help="comma-separated transformer variants (quantize_omnivoice.py) to time against fp32 ORT in "
        "the same run; default: every variant in the export report; 'none' for none",
    )
    parser.add_argument(
        "--clock",
        choices=CLOCKS,
        default="wall",
        help="wall: wall time at the threads set (torch's default, $OMNIVOICE_ORT_THREADS); cpu: one "
        "thread per side, timed by the process's CPU time (what a call costs on a shared machine, "
        "where other work stretches wall time; the GEMM peak is then one core's)",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="where the .json and .md results go")
    parser.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)
    parser.add_argument(
        "--scratch", type=Path, help=argparse.SUPPRESS
    )  # torch's call inputs and logits, for the ONNX workers
    parser.add_argument("--variant", default="fp32", help=argparse.SUPPRESS)  # an ONNX worker's transformer
    args = parse(parser, argv)
    args.shape_labels = parse_subset(args.shapes, "--shapes", tuple(SHAPE_TEXTS))
    args.codec_durations = codec_durations(args.codec_seconds)
    return args


def codec_durations(text: str) -> list[int]:
    """--codec-seconds as whole seconds, each given once, or a UserError."""
    picked = [item.strip() for item in text.split(",") if item.strip()]
    if not picked or not all(item.isdigit() and int(item) > 0 for item in picked) or len(set(picked)) < len(picked):
        raise UserError(
            f"--codec-seconds: {text!r} is not a list of distinct whole seconds",
            f"give e.g. --codec-seconds {CODEC_SECONDS}",
        )
    return [int(item) for item in picked]


# --- worker side --------------------------------------------------------------------------------


class _Stop(Exception):
    """Raised by the input recorder once generate() has built its first transformer inputs."""


def first_forward_inputs(model: Any, request: GenerationRequest) -> dict[str, np.ndarray]:
    """The exact transformer inputs generate() builds for `request` (its real cond/uncond layout)."""
    from omnivoice_export.step1_capture.capture import patched
    from omnivoice_export.step1_capture.generation import run_generate

    seen: dict[str, np.ndarray] = {}

    def recorder(
        input_ids: torch.Tensor, audio_mask: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> NoReturn:
        assert attention_mask is not None, "generate() passes the mask it builds"
        seen.update(input_ids=input_ids.numpy(), audio_mask=audio_mask.numpy(), attention_mask=attention_mask.numpy())
        raise _Stop

    with patched([(model, "forward", recorder)]):
        try:
            run_generate(model, request)
        except _Stop:
            pass
    return seen


def transformer_flop_parts(config: dict[str, Any], lengths: list[int]) -> dict[str, float]:
    """Multiply-adds x2 of the transformer over rows of the given lengths, per part: the layers'
    projections, the audio heads, attention (QK^T and PV)."""
    llm = config["llm_config"]
    hidden, layers, heads, kv, dim, inter = (
        llm["hidden_size"],
        llm["num_hidden_layers"],
        llm["num_attention_heads"],
        llm["num_key_value_heads"],
        llm["head_dim"],
        llm["intermediate_size"],
    )
    linear = layers * (hidden * heads * dim * 2 + hidden * kv * dim * 2 + 3 * hidden * inter)
    heads_out = hidden * config["num_audio_codebook"] * config["audio_vocab_size"]
    return {
        "projections": float(sum(2 * length * linear for length in lengths)),
        "heads": float(sum(2 * length * heads_out for length in lengths)),
        "attention": float(sum(layers * 4 * length * length * heads * dim for length in lengths)),
    }


def transformer_flops(config: dict[str, Any], lengths: list[int]) -> float:
    """Multiply-adds x2 of the transformer over rows of the given lengths (linear + attention)."""
    return sum(transformer_flop_parts(config, lengths).values())


def gemm_worker(seconds: float) -> dict[str, Any]:
    """fp32 GEMM GFLOP/s of torch.mm and of ORT's MatMul (weight as an initializer, as in the
    graph) per shape, all threads, before anything else is loaded. On CPUs that MKL does not
    dispatch its AVX-512 kernels for (AMD), the two differ widely: the ceiling is the higher."""
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper, numpy_helper

    result: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "torch_mkl": {},
        "ort_mlas": {},
        "libraries": gemm_libraries(),
    }
    rng = np.random.default_rng(0)
    for m, k, n in GEMM_SHAPES:
        label, flops = f"{m}x{k}x{n}", 2.0 * m * k * n
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        result["torch_mkl"][label] = rate(lambda: torch.mm(ta, tb), flops, seconds, CLOCK)
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["a", "b"], ["c"])],
            "gemm",
            [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
            [helper.make_tensor_value_info("c", TensorProto.FLOAT, [m, n])],
            [numpy_helper.from_array(b, "b")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        options = ort.SessionOptions()
        options.intra_op_num_threads = default_threads() or 0  # 0: onnxruntime's default, one per core
        session = ort.InferenceSession(
            model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
        )
        result["ort_mlas"][label] = rate(lambda: session.run(None, {"a": a}), flops, seconds, CLOCK)
    result["peak_gflops"] = max(max(result["torch_mkl"].values()), max(result["ort_mlas"].values()))
    return result


def gemm_libraries() -> dict[str, str]:
    """Which GEMM each side runs: torch's BLAS (its build configuration) and ORT's CPU provider,
    whose MatMul is its own MLAS in every build."""
    import re

    import onnxruntime as ort
    import torch

    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    mkl = torch.backends.mkl.is_available()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    return {
        "torch": f"{blas.group(1) if blas else 'unknown'} (torch {torch.__version__}, MKL {'on' if mkl else 'off'})",
        "onnxruntime": f"MLAS (onnxruntime {ort.__version__})",
    }


def check_export(args: argparse.Namespace, variants: list[str]) -> str:
    """The fingerprint of --model, once the export in --onnx-dir is proven to be of that model and
    intact (every graph and each of `variants` as its report records it, and none that failed its
    export checks)."""
    export = report.load_report(args.onnx_dir)
    model_path = resolve_model(args.model)
    fingerprint = model_fingerprint(model_path)
    if export["model"]["fingerprint"] != fingerprint:
        raise UserError(
            f"the export in {args.onnx_dir} is of model {export['model']['fingerprint']}, but --model "
            f"{args.model} is {fingerprint} ({model_path}): the bench would time one model against "
            "another",
            "pass the --model the export was made from, or re-run steps 0-2 for this one",
        )
    report.verify_graphs(args.onnx_dir, export, list(GRAPH_NAMES))
    for name in variants:
        quantize.verify_variant(args.onnx_dir, export, name)
    return fingerprint


def variant_names(args: argparse.Namespace) -> list[str]:
    """--variants as a list: the report's variants when not given, none for 'none'."""
    made = list(report.load_report(args.onnx_dir).get("variants", {}))
    if args.variants is None:
        return made
    if args.variants == "none":
        return []
    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = [name for name in names if name not in made]
    if unknown:
        raise UserError(
            f"--variants: {', '.join(unknown)} not in the export report (made so far: {', '.join(made) or 'none'})",
            f"run quantize_omnivoice.py --variants {','.join(unknown)}",
        )
    return names


def timed(fn: Callable[[], object], calls: int) -> list[float]:
    fn()  # warm-up: allocator, pre-packing, lazy init
    times = []
    for _ in range(calls):
        started = CLOCK()
        fn()
        times.append(CLOCK() - started)
    return times


def load_variant(args: argparse.Namespace, runtime: str, variant: str | None = None) -> tuple[Any, OrtGraphs | None]:
    """(model, graphs or None): PyTorch eager OmniVoice, or the ONNX graphs inside generate()
    (`variant`'s transformer; default: the worker's --variant)."""
    from omnivoice_export.step0_checkpoints.checkpoints import load_omnivoice
    from omnivoice_export.step2_export.ort_runtime import OrtGraphs, load_onnx_omnivoice

    if runtime == "torch":
        return load_omnivoice(resolve_model(args.model)), None
    name = variant or args.variant
    graphs = OrtGraphs.load(args.onnx_dir, "cpu", transformer=variant_path(args.onnx_dir, name), variant=name)
    return load_onnx_omnivoice(resolve_model(args.model), graphs, split=True), graphs


def clone_request(capture_dir: Path, text: str, num_step: int) -> GenerationRequest:
    """A voice clone of `text` from step 0's reference in `capture_dir`."""
    from omnivoice_export.step1_capture.generation import GenerationRequest

    return GenerationRequest(
        mode="clone",
        text=text,
        ref_audio=str(capture_dir / REF_WAV),
        ref_text=(capture_dir / REF_TXT).read_text().strip(),
        num_step=num_step,
    )


def codec_audio(seconds: int) -> np.ndarray:
    """The audio the encoder is timed on: seeded noise, the same in every worker."""
    return (np.random.default_rng(0).standard_normal((1, 1, seconds * SAMPLE_RATE)) * 0.1).astype(np.float32)


def torch_calls_worker(args: argparse.Namespace) -> dict[str, Any]:
    """PyTorch eager per-call latencies at each shape (padded, as upstream runs it) and of the codec.
    What it fed the transformer and the decoder goes to --scratch, with its logits: the ONNX
    workers of the round time and compare on exactly those inputs with ORT sessions alone (no
    torch import, no weights: their peak RSS is ORT's)."""
    import torch

    from omnivoice_export.step1_capture.capture import read_rows
    from omnivoice_onnx.sessions import prefix_lengths

    config = json.loads((resolve_model(args.model) / "config.json").read_text())
    result: dict[str, Any] = {"transformer": {}, "encoder": {}, "decoder": {}, "torch_threads": torch.get_num_threads()}
    model, _ = load_variant(args, "torch")
    for label in args.shape_labels:
        feeds = first_forward_inputs(model, clone_request(args.capture_dir, SHAPE_TEXTS[label], args.num_step))
        # numpy's savez takes **kwds beside allow_pickle: mypy cannot see that no key here is that name
        np.savez(args.scratch / f"inputs-{label}.npz", **feeds)  # type: ignore[arg-type]
        lengths = prefix_lengths(feeds["attention_mask"])
        assert lengths is not None, "generate() builds block-form masks"
        seq = feeds["input_ids"].shape[-1]
        entry = {
            "S": seq,
            "row_lengths": lengths,
            "flops_padded": transformer_flops(config, [seq] * len(lengths)),
            "flops_split": transformer_flops(config, lengths),
        }
        tensors = {k: torch.from_numpy(v) for k, v in feeds.items()}
        with torch.inference_mode():
            entry["torch_padded"] = timed(lambda: model(**tensors), args.calls)
            reference = model(**tensors).logits.numpy()
        np.save(args.scratch / f"{label}.npy", read_rows(reference, feeds["attention_mask"]))
        result["transformer"][label] = entry

    for seconds in args.codec_durations:
        audio = torch.from_numpy(codec_audio(seconds))
        with torch.inference_mode():
            codes = model.audio_tokenizer.encode(audio).audio_codes
            np.save(args.scratch / f"codes-{seconds}s.npy", codes.numpy())
            result["encoder"][f"{seconds}s"] = timed(lambda: model.audio_tokenizer.encode(audio), args.calls)
            result["decoder"][f"{seconds}s"] = timed(lambda: model.audio_tokenizer.decode(codes), args.calls)
    return result


def saved_inputs(args: argparse.Namespace, label: str) -> dict[str, np.ndarray]:
    """The transformer inputs the round's torch-calls worker built for shape `label`."""
    with np.load(args.scratch / f"inputs-{label}.npz") as data:
        return {name: data[name] for name in data.files}


def onnx_calls_worker(args: argparse.Namespace) -> dict[str, Any]:
    """ORT per-call latencies at each shape (padded and split) and of the codec graphs, on the
    torch-calls worker's inputs; logits against its. A variant's worker times its transformer
    split only (fp32-unmasked and fp32-fused are valid only there) and compares its logits with
    fp32 ORT's and torch's; the codec graphs are fp32's, not retimed."""
    from omnivoice_export.common.metrics import logit_stats
    from omnivoice_export.step1_capture.capture import read_rows
    from omnivoice_onnx.sessions import TRANSFORMER_ARENA, CodecSessions, make_session, prefix_lengths, run, run_split

    fp32 = args.variant == "fp32"
    session = make_session(variant_path(args.onnx_dir, args.variant), "cpu", arena=TRANSFORMER_ARENA)
    result: dict[str, Any] = {"transformer": {}, "encoder": {}, "decoder": {}} if fp32 else {"transformer": {}}
    for label in args.shape_labels:
        feeds = saved_inputs(args, label)
        entry: dict[str, Any] = {
            "S": feeds["input_ids"].shape[-1],
            "row_lengths": prefix_lengths(feeds["attention_mask"]),
        }
        if fp32:
            entry["ort_padded"] = timed(lambda: run(session, feeds), args.calls)
        entry["ort_split"] = timed(lambda: run_split(session, **feeds), args.calls)
        rows = read_rows(run_split(session, **feeds), feeds["attention_mask"])
        if fp32:
            np.save(args.scratch / f"ort-{label}.npy", rows)  # what each variant is compared with
            entry["split_vs_torch_max_abs"] = float(np.abs(rows - np.load(args.scratch / f"{label}.npy")).max())
        else:
            for against, file in (("fp32", f"ort-{label}.npy"), ("torch", f"{label}.npy")):
                stats = logit_stats(np.load(args.scratch / file), rows)
                entry[f"vs_{against}"] = {"argmax_agreement": stats.argmax_agreement, "max_abs": stats.max_abs}
        result["transformer"][label] = entry

    if fp32:
        # resident: a call's time, not a session load
        codec = CodecSessions(codec_paths(args.onnx_dir), "cpu", None, resident=True)
        for seconds in args.codec_durations:
            audio, codes = codec_audio(seconds), np.load(args.scratch / f"codes-{seconds}s.npy")
            result["encoder"][f"{seconds}s"] = timed(lambda: codec.run("encoder", {"input_values": audio}), args.calls)
            result["decoder"][f"{seconds}s"] = timed(lambda: codec.run("decoder", {"audio_codes": codes}), args.calls)
    return result


def e2e_worker(args: argparse.Namespace, runtime: str) -> dict[str, Any]:
    """Load the model and run one clone generate(): wall times and final tokens. The worker's
    peak RSS (taken by the caller) is then what a user running this once sees."""
    import torch

    from omnivoice_export.step1_capture.capture import Recorder
    from omnivoice_export.step1_capture.generation import run_generate

    started = time.perf_counter()
    model, _ = load_variant(args, runtime)
    result: dict[str, Any] = {"load_seconds": time.perf_counter() - started, "torch_threads": torch.get_num_threads()}
    # The transformer's share, timed where generate() calls it: the rest of generate() (reference
    # encoding, decoding, host work) does not depend on the transformer variant.
    transformer_seconds = time_calls(model, "forward", CLOCK)
    recorder = Recorder(model, Path("."), steps=set())  # steps=set(): tokens only, nothing written
    started = CLOCK()
    with recorder.active():
        run_generate(model, clone_request(args.capture_dir, E2E_TEXT, args.num_step))
    result["e2e_seconds"] = CLOCK() - started
    result["e2e_transformer_seconds"] = sum(transformer_seconds)
    result["e2e_final_tokens"] = recorder.token_states[-1].tolist()
    return result


def time_calls(owner: Any, name: str, clock: Callable[[], float]) -> list[float]:
    """Time every call of `owner.name` by `clock` (upstream's model.forward, the runtime's
    model.transformer: the transformer where generate() calls it): the list, filled as it runs."""
    function, seconds = getattr(owner, name), []

    def timed(*inputs: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return function(*inputs, **kwargs)
        finally:
            seconds.append(clock() - started)

    setattr(owner, name, timed)
    return seconds


def runtime_e2e_worker(args: argparse.Namespace) -> dict[str, Any]:
    """The torch-free runtime's generate() (omnivoice_onnx: what `omnivoice-onnx speak` runs, the
    codec sessions opened per call) on the e2e workers' request and seed, with --variant's
    transformer: the product's own time, where onnx-e2e is upstream's host code around the graphs."""
    from omnivoice_onnx import OmniVoiceOnnx, Trace

    started = time.perf_counter()
    tts = OmniVoiceOnnx.from_dir(args.onnx_dir, variant=args.variant)
    result: dict[str, Any] = {"load_seconds": time.perf_counter() - started}
    transformer_seconds = time_calls(tts.model, "transformer", CLOCK)
    request, trace = clone_request(args.capture_dir, E2E_TEXT, args.num_step), Trace()
    started = CLOCK()
    tts.generate(
        request.text,
        language=request.language,
        ref_text=request.ref_text,
        ref_audio=request.ref_audio,
        generation_config={"num_step": request.num_step},
        seed=request.seed,
        trace=trace,
    )
    result["e2e_seconds"] = CLOCK() - started
    result["e2e_transformer_seconds"] = sum(transformer_seconds)
    tokens = trace.results[0]
    assert isinstance(tokens, np.ndarray), "a request this short is never chunked"
    result["e2e_final_tokens"] = [tokens.tolist()]  # [1, 8, T], as the Recorder keeps them
    return result


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One worker's measurements, in this process; printed as JSON on the last stdout line. The
    runtime-e2e worker never imports torch, so its peak RSS is the torch-free runtime's own."""
    from omnivoice_export.common.measure import PeakRss

    global CLOCK
    CLOCK = CLOCKS[args.clock]
    if args.clock == "cpu" and args.worker != "runtime-e2e":
        import torch  # one thread per side: CPU time is then the call's own (spawn() sets ORT's)

        torch.set_num_threads(1)

    load_before = os.getloadavg()[0]
    with PeakRss() as peak:
        if args.worker == "gemm":
            result = gemm_worker(args.gemm_seconds)
        elif args.worker == "torch-calls":
            result = torch_calls_worker(args)
        elif args.worker == "onnx-calls":
            result = onnx_calls_worker(args)
        elif args.worker == "runtime-e2e":
            result = runtime_e2e_worker(args)
        else:
            result = e2e_worker(args, args.worker.split("-")[0])
    result["peak_rss_mb"] = peak.peak_mb
    # Other work on the machine slows every figure: the 1-min load average before and after.
    result["load_1min"] = [load_before, os.getloadavg()[0]]
    return result


# --- orchestrator -------------------------------------------------------------------------------


def spawn(args: argparse.Namespace, worker: str, variant: str = "fp32") -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--worker",
        worker,
        "--model",
        args.model,
        "--onnx-dir",
        str(args.onnx_dir),
        "--capture-dir",
        str(args.capture_dir),
        "--calls",
        str(args.calls),
        "--num-step",
        str(args.num_step),
        "--scratch",
        str(args.scratch),
        "--variant",
        variant,
        "--shapes",
        args.shapes,
        "--codec-seconds",
        args.codec_seconds,
        "--gemm-seconds",
        str(args.gemm_seconds),
        "--clock",
        args.clock,
    ]
    env = {**os.environ, THREADS_ENV: "1"} if args.clock == "cpu" else None
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{worker} worker ({variant}) failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def round_workers(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(result key, worker, transformer variant) in the order one round runs them: each ONNX
    worker is followed by the same worker for every variant, so drift hits them alike."""
    order = []
    for worker_name in WORKERS:
        if args.skip_e2e and worker_name.endswith("-e2e"):
            continue
        order.append((worker_name, worker_name, "fp32"))
        if worker_name.startswith(("onnx-", "runtime-")):
            order += [(f"{worker_name}@{name}", worker_name, name) for name in args.variant_names]
    return order


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def token_match(run: dict[str, Any], reference: np.ndarray) -> float:
    """The fraction of an e2e run's final tokens equal to `reference`'s (0 when the shapes differ)."""
    tokens = np.array(run["e2e_final_tokens"])
    return float(np.mean(tokens == reference)) if tokens.shape == reference.shape else 0.0


def runtime_generate(rounds: list[dict[str, dict[str, Any]]], names: list[str]) -> dict[str, dict[str, Any]]:
    """Per transformer variant (fp32, then `names`), the torch-free runtime's generate() against
    torch's of the same rounds: seconds, its parts, the ratio, final tokens against torch's."""
    torch_e2e = [r["torch-e2e"] for r in rounds if "torch-e2e" in r]
    if not torch_e2e:
        return {}
    torch_tokens = np.array(torch_e2e[0]["e2e_final_tokens"])
    torch_median = statistics.median(r["e2e_seconds"] for r in torch_e2e)
    result = {}
    for name in ["fp32", *names]:
        key = "runtime-e2e" if name == "fp32" else f"runtime-e2e@{name}"
        e2e = [r[key] for r in rounds if key in r]
        if e2e:
            seconds = spread([r["e2e_seconds"] for r in e2e])
            result[name] = {
                "seconds": seconds,
                "parts": generate_parts(e2e),
                "speedup_vs_torch": torch_median / seconds["median"],
                "final_token_match": min(token_match(r, torch_tokens) for r in e2e),
                "peak_rss_mb": spread([r["peak_rss_mb"] for r in e2e]),
            }
    return result


def runtime_generate_markdown(summary: dict[str, Any]) -> list[str]:
    """The runtime's generate() per variant, beside torch's of the same rounds."""
    runtime = summary.get("runtime_generate")
    if not runtime:
        return []
    lines = [
        "The torch-free runtime's generate() (omnivoice_onnx, as `omnivoice-onnx speak` runs it: codec sessions "
        f"opened per call), the same request and seed; torch {summary['generate']['torch']['median']:.1f} s:",
        "",
        "| variant | generate() s | transformer calls s | rest s | vs torch | tokens vs torch | peak RSS MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, g in runtime.items():
        t, parts = g["seconds"], g["parts"]
        lines.append(
            f"| {name} | {t['median']:.1f} ({t['min']:.1f}..{t['max']:.1f}) | "
            f"{parts['transformer']['median']:.1f} | {parts['rest']['median']:.1f} | "
            f"**{g['speedup_vs_torch']:.2f}x** | {100 * g['final_token_match']:.2f}% | "
            f"{g['peak_rss_mb']['median']:.0f} |"
        )
    return lines + [""]


def generate_parts(e2e: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """generate()'s seconds in the transformer calls and in the rest (reference encoding, decoding,
    host work: the same for every transformer variant), over the e2e workers' runs."""
    return {
        "transformer": spread([r["e2e_transformer_seconds"] for r in e2e]),
        "rest": spread([r["e2e_seconds"] - r["e2e_transformer_seconds"] for r in e2e]),
    }


def generate_parts_markdown(summary: dict[str, Any], num_step: int) -> list[str]:
    """Per variant: generate() as transformer calls + the rest, and the transformer time a 3x
    generate() would need at that rest (the speed bar, read against what is left to gain)."""
    generate = summary.get("generate")
    if not generate or not summary["variants"]:
        return []
    fp32 = generate["parts"]["onnx"]
    lines = [
        f"generate() split (medians): the transformer (one forward per step, {num_step} steps) + the rest "
        "(reference encoding, decoding, host work: the same graphs for every variant). fp32 ORT: "
        f"{fp32['transformer']['median']:.1f} s + {fp32['rest']['median']:.1f} s.",
        "",
        "| variant | transformer calls s | rest s | transformer vs fp32 | generate() vs fp32 | "
        "transformer calls for 3x fp32's generate() at this rest |",
        "|---|---|---|---|---|---|",
    ]
    for name, variant in summary["variants"].items():
        g = variant.get("generate")
        if g:
            parts, target = g["parts"], generate["onnx"]["median"] / 3 - g["parts"]["rest"]["median"]
            lines.append(
                f"| {name} | {parts['transformer']['median']:.1f} | {parts['rest']['median']:.1f} | "
                f"{g['transformer_speedup_vs_fp32']:.2f}x | {g['speedup_vs_fp32']:.2f}x | "
                + (
                    f"<= {target:.1f} s ({target / num_step:.3f} s per step) |"
                    if target > 0
                    else "none: the rest alone is over a third of fp32's generate() |"
                )
            )
    return lines + [""]


def summarise(
    rounds: list[dict[str, dict[str, Any]]], variants: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Pool every round's timings per variant and shape; ratios of medians. `variants`: the export
    report's entries of the transformer variants timed (their files' sizes)."""

    def runs(variant: str) -> list[dict[str, Any]]:
        return [r[variant] for r in rounds if variant in r]

    gemm = runs("gemm")
    peak = max(r["peak_gflops"] for r in gemm)
    summary: dict[str, Any] = {
        "gemm": {
            "peak_gflops": peak,
            "torch_mkl_best": max(max(r["torch_mkl"].values()) for r in gemm),
            "ort_mlas_best": max(max(r["ort_mlas"].values()) for r in gemm),
            "torch_threads": gemm[0]["torch_threads"],
            "libraries": gemm[0]["libraries"],
        },
        "transformer": {},
        "codec": {},
    }
    torch_calls, onnx_calls = runs("torch-calls"), runs("onnx-calls")
    for label in torch_calls[0]["transformer"]:  # the shapes timed (--shapes)
        first = torch_calls[0]["transformer"][label]
        row = {"S": first["S"], "row_lengths": first["row_lengths"]}
        for key, calls in (("torch_padded", torch_calls), ("ort_padded", onnx_calls), ("ort_split", onnx_calls)):
            row[key] = spread([t for r in calls for t in r["transformer"][label][key]])
        row["gflops"] = {
            "torch_padded": first["flops_padded"] / row["torch_padded"]["median"] / 1e9,
            "ort_padded": first["flops_padded"] / row["ort_padded"]["median"] / 1e9,
            "ort_split": first["flops_split"] / row["ort_split"]["median"] / 1e9,
        }
        row["fraction_of_gemm_peak"] = {k: v / peak for k, v in row["gflops"].items()}
        # Like for like (the GEMM library's part, CPU-specific) beside the split (fewer FLOPs).
        row["speedup_ort_padded_vs_torch"] = row["torch_padded"]["median"] / row["ort_padded"]["median"]
        row["speedup_ort_split_vs_ort_padded"] = row["ort_padded"]["median"] / row["ort_split"]["median"]
        row["speedup_ort_split_vs_torch"] = row["torch_padded"]["median"] / row["ort_split"]["median"]
        row["split_vs_torch_max_abs"] = max(r["transformer"][label]["split_vs_torch_max_abs"] for r in onnx_calls)
        summary["transformer"][label] = row
    for part in ("encoder", "decoder"):
        for key in torch_calls[0][part]:  # the durations timed (--codec-seconds)
            torch_t = spread([t for r in torch_calls for t in r[part][key]])
            onnx_t = spread([t for r in onnx_calls for t in r[part][key]])
            summary["codec"][f"{part} {key}"] = {
                "torch": torch_t,
                "ort": onnx_t,
                "speedup": torch_t["median"] / onnx_t["median"],
            }
    summary["peak_rss_mb_calls"] = {
        "torch": max(r["peak_rss_mb"] for r in torch_calls),
        "onnx": max(r["peak_rss_mb"] for r in onnx_calls),
    }
    torch_e2e, onnx_e2e = runs("torch-e2e"), runs("onnx-e2e")
    if torch_e2e:
        reference = np.array(torch_e2e[0]["e2e_final_tokens"])
        matches = [token_match(r, reference) for r in torch_e2e[1:] + onnx_e2e]
        torch_t = spread([r["e2e_seconds"] for r in torch_e2e])
        onnx_t = spread([r["e2e_seconds"] for r in onnx_e2e])
        summary["generate"] = {
            "torch": torch_t,
            "onnx": onnx_t,
            "speedup": torch_t["median"] / onnx_t["median"],
            "parts": {"torch": generate_parts(torch_e2e), "onnx": generate_parts(onnx_e2e)},
            "final_token_match": min(matches),
            "target_frames": int(reference.shape[-1]),
            "load_seconds": {
                "torch": spread([r["load_seconds"] for r in torch_e2e]),
                "onnx": spread([r["load_seconds"] for r in onnx_e2e]),
            },
            "peak_rss_mb": {
                "torch": spread([r["peak_rss_mb"] for r in torch_e2e]),
                "onnx": spread([r["peak_rss_mb"] for r in onnx_e2e]),
            },
        }
    loads = [load for r in rounds for run in r.values() for load in run.get("load_1min", [])]
    summary["load_1min"] = spread(loads) if loads else None
    summary["variants"] = {
        name: summarise_variant(rounds, name, entry, summary) for name, entry in (variants or {}).items()
    }
    summary["runtime_generate"] = runtime_generate(rounds, list(variants or {}))
    return summary


def summarise_variant(
    rounds: list[dict[str, dict[str, Any]]], name: str, entry: dict[str, Any], summary: dict[str, Any]
) -> dict[str, Any]:
    """One variant against fp32 ORT of the same rounds: per-call medians and ratios, logits against
    fp32 ORT's and torch's (worst over rounds), generate() and its tokens against torch's, size."""
    calls = [r[f"onnx-calls@{name}"] for r in rounds]
    fp32_calls = [r["onnx-calls"] for r in rounds]
    result: dict[str, Any] = {
        "recipe": entry["recipe"],
        "bytes": entry["bytes"],
        "fp32_bytes": entry["fp32_bytes"],
        "size_ratio": entry["bytes"] / entry["fp32_bytes"],
        "transformer": {},
    }
    for label in summary["transformer"]:
        mine = spread([t for r in calls for t in r["transformer"][label]["ort_split"]])
        fp32 = spread([t for r in fp32_calls for t in r["transformer"][label]["ort_split"]])
        row = {"ort_split": mine, "fp32_ort_split": fp32, "speedup_vs_fp32": fp32["median"] / mine["median"]}
        for against in ("fp32", "torch"):
            stats = [r["transformer"][label][f"vs_{against}"] for r in calls]
            row[f"vs_{against}"] = {
                "argmax_agreement": min(s["argmax_agreement"] for s in stats),
                "max_abs": max(s["max_abs"] for s in stats),
            }
        result["transformer"][label] = row
    e2e = [r[f"onnx-e2e@{name}"] for r in rounds if f"onnx-e2e@{name}" in r]
    if e2e and "generate" in summary:
        torch_tokens = np.array(rounds[0]["torch-e2e"]["e2e_final_tokens"])
        seconds = spread([r["e2e_seconds"] for r in e2e])
        parts = generate_parts(e2e)
        result["generate"] = {
            "seconds": seconds,
            "speedup_vs_fp32": summary["generate"]["onnx"]["median"] / seconds["median"],
            "parts": parts,
            "transformer_speedup_vs_fp32": summary["generate"]["parts"]["onnx"]["transformer"]["median"]
            / parts["transformer"]["median"],
            "speedup_vs_torch": summary["generate"]["torch"]["median"] / seconds["median"],
            "final_token_match": min(token_match(r, torch_tokens) for r in e2e),
            "peak_rss_mb": spread([r["peak_rss_mb"] for r in e2e]),
        }
    return result


def variants_markdown(summary: dict[str, Any]) -> list[str]:
    """The table per variant: fp32 ORT first, then each variant measured in the same rounds."""
    if not summary["variants"]:
        return []
    labels = list(summary["transformer"])
    lines = [
        "Transformer variants against fp32 ORT in the same run (per call: split, as generate() runs it; "
        "argmax and max |d| on the rows generate() reads, against fp32 ORT's logits of the same call; tokens: "
        "generate()'s final tokens against torch's):",
        "",
        "| variant | size MiB (of fp32) | "
        + " | ".join(f"{label} s (vs fp32)" for label in labels)
        + " | argmax vs fp32 (min) | max abs d vs fp32 | generate() s | vs fp32 ORT | vs torch | tokens vs torch"
        " | peak RSS MiB |",
        "|---|---|" + "---|" * len(labels) + "---|---|---|---|---|---|---|",
    ]
    first = next(iter(summary["variants"].values()))
    generate = summary.get("generate")
    fp32_cells = [f"{first['transformer'][label]['fp32_ort_split']['median']:.3f}" for label in labels]
    fp32_generate = (
        f"{generate['onnx']['median']:.1f} | 1.00x | {generate['speedup']:.2f}x | "
        f"{100 * generate['final_token_match']:.2f}% | {generate['peak_rss_mb']['onnx']['median']:.0f}"
        if generate
        else "- | - | - | - | -"
    )
    lines.append(
        f"| fp32 | {first['fp32_bytes'] / 2**20:.1f} (100%) | "
        + " | ".join(fp32_cells)
        + f" | 1.000000 | 0 | {fp32_generate} |"
    )
    for name, variant in summary["variants"].items():
        rows = variant["transformer"]
        cells = [
            f"{rows[label]['ort_split']['median']:.3f} ({rows[label]['speedup_vs_fp32']:.2f}x)" for label in labels
        ]
        argmax = min(rows[label]["vs_fp32"]["argmax_agreement"] for label in labels)
        max_abs = max(rows[label]["vs_fp32"]["max_abs"] for label in labels)
        g = variant.get("generate")
        e2e = (
            f"{g['seconds']['median']:.1f} | {g['speedup_vs_fp32']:.2f}x | {g['speedup_vs_torch']:.2f}x | "
            f"{100 * g['final_token_match']:.2f}% | {g['peak_rss_mb']['median']:.0f}"
            if g
            else "- | - | - | - | -"
        )
        lines.append(
            f"| {name} | {variant['bytes'] / 2**20:.1f} ({100 * variant['size_ratio']:.1f}%) | "
            + " | ".join(cells)
            + f" | {argmax:.6f} | {max_abs:.1e} | {e2e} |"
        )
    return lines + [""]


def load_line(load: dict[str, float], cores: int) -> str:
    """The 1-min load average during the workers, read against the core count: each worker uses
    every core, so a load up to the core count is the bench itself; above it (by more than the
    average's lag from one worker to the next, ~0.5) other work shared the CPU."""
    crowded = load["max"] > cores + 0.5
    return f"1-min load average during the workers: {load['min']:.1f}..{load['max']:.1f} on {cores} logical cores " + (
        "(above the core count: other work shared the CPU, so the times are slower than this CPU's and their "
        "ratios noisier)"
        if crowded
        else "(about the bench's own workers, which use every core: no sign of other work)"
    )


def markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    gemm, cpu = summary["gemm"], meta["cpu"]
    lines = [
        f"# OmniVoice benchmark: {meta['model']} on {meta['host']} ({meta['date']})",
        "",
        f"CPU: {cpu['model_name']} ({cpu['vendor']} family {cpu['family']} model {cpu['model']}), "
        f"{cpu['logical_cores']} logical / {cpu['physical_cores']} physical cores; torch "
        f"{gemm['torch_threads']} threads, GEMM {gemm['libraries']['torch']}; ORT GEMM "
        f"{gemm['libraries']['onnxruntime']}, {meta.get('ort_threads') or 'default (one per core)'} intra-op "
        f"threads (${THREADS_ENV}).",
        "",
        *hardware_lines(meta),
        "",
        *([CPU_CLOCK_NOTE, ""] if meta.get("clock") == "cpu" else []),
        f"fp32 GEMM peak {gemm['peak_gflops']:.0f} GFLOP/s (best of torch.mm {gemm['torch_mkl_best']:.0f} and "
        f"ORT MatMul {gemm['ort_mlas_best']:.0f}, fresh process, same run); "
        f"{meta['repeats']} interleaved rounds, medians (min..max). Speedups are of this CPU: ORT padded vs "
        "torch padded is the GEMM libraries' difference here; ORT split vs ORT padded is the split's, "
        "which does not depend on the CPU.",
        "",
        *([load_line(summary["load_1min"], cpu["logical_cores"]), ""] if summary.get("load_1min") else []),
        "| transformer call | rows | torch padded s | ORT padded s | ORT split s | ORT padded vs torch | "
        "split vs ORT padded | split vs torch | GFLOP/s torch / ORT split (% of peak) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, row in summary["transformer"].items():
        t, p, s = row["torch_padded"], row["ort_padded"], row["ort_split"]
        lines.append(
            f"| {label} (S={row['S']}) | {row['row_lengths']} | {t['median']:.3f} ({t['min']:.3f}..{t['max']:.3f}) | "
            f"{p['median']:.3f} | {s['median']:.3f} ({s['min']:.3f}..{s['max']:.3f}) | "
            f"{row['speedup_ort_padded_vs_torch']:.2f}x | {row['speedup_ort_split_vs_ort_padded']:.2f}x | "
            f"{row['speedup_ort_split_vs_torch']:.2f}x | {row['gflops']['torch_padded']:.0f} "
            f"({100 * row['fraction_of_gemm_peak']['torch_padded']:.0f}%) / {row['gflops']['ort_split']:.0f} "
            f"({100 * row['fraction_of_gemm_peak']['ort_split']:.0f}%) |"
        )
    lines += ["", "| codec call | torch s | ORT s | speedup |", "|---|---|---|---|"]
    for label, row in summary["codec"].items():
        lines.append(f"| {label} | {row['torch']['median']:.3f} | {row['ort']['median']:.3f} | {row['speedup']:.2f}x |")
    if "generate" in summary:
        g = summary["generate"]
        rss = g["peak_rss_mb"]
        lines += [
            "",
            f"generate() clone, {g['target_frames']} target frames, {meta['num_step']} steps, a fresh "
            f"process per run: torch {g['torch']['median']:.1f} s ({g['torch']['min']:.1f}..{g['torch']['max']:.1f}), "
            f"ONNX {g['onnx']['median']:.1f} s ({g['onnx']['min']:.1f}..{g['onnx']['max']:.1f}): "
            f"**{g['speedup']:.2f}x**; final tokens equal: {100 * g['final_token_match']:.2f}%",
            "",
            f"Peak RSS of that process (load + generate): torch {rss['torch']['median']:.0f} MiB "
            f"({rss['torch']['min']:.0f}..{rss['torch']['max']:.0f}), ONNX {rss['onnx']['median']:.0f} MiB "
            f"({rss['onnx']['min']:.0f}..{rss['onnx']['max']:.0f}): "
            f"**{rss['onnx']['median'] / rss['torch']['median']:.2f}x**",
        ]
    calls = summary["peak_rss_mb_calls"]
    lines += [
        f"Peak RSS of the per-call workers (every shape above, {max(meta['codec_seconds'])} s codec calls): "
        f"torch {calls['torch']:.0f} MiB, "
        f"ONNX {calls['onnx']:.0f} MiB",
        "",
    ]
    return "\n".join(
        lines
        + variants_markdown(summary)
        + generate_parts_markdown(summary, meta["num_step"])
        + runtime_generate_markdown(summary)
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if not (args.capture_dir / REF_WAV).is_file():
        raise UserError(f"{args.capture_dir / REF_WAV} not found", "run make_reference.py (step 0) first")
    args.variant_names = variant_names(args)
    fingerprint = check_export(args, args.variant_names)
    hardware = hardware_record()  # before the workers: the load average is other work's, the AMX check idle-ish
    args.scratch = Path(tempfile.mkdtemp(prefix="omnivoice-bench-"))
    rounds = []
    try:
        for index in range(args.repeats):
            round_ = {}
            for key, worker_name, variant in round_workers(args):  # A B A B: drift hits both alike
                print(f"round {index + 1}/{args.repeats}: {key} ...", flush=True)
                round_[key] = spawn(args, worker_name, variant)
            rounds.append(round_)
    finally:  # the workers' inputs and logits, also when one failed or the run was interrupted
        shutil.rmtree(args.scratch, ignore_errors=True)
    entries = report.load_report(args.onnx_dir).get("variants", {})
    summary = summarise(rounds, {name: entries[name] for name in args.variant_names})
    for round_ in rounds:  # the tokens were compared in summarise(); keep the result file small
        for run in round_.values():
            run.pop("e2e_final_tokens", None)
    meta = {
        "model": args.model,
        "fingerprint": fingerprint,
        "host": socket.gethostname(),
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_description(),
        "repeats": args.repeats,
        "calls": args.calls,
        "shapes": args.shape_labels,
        "codec_seconds": args.codec_durations,
        "gemm_seconds": args.gemm_seconds,
        "num_step": args.num_step,
        "python": platform.python_version(),
        "ort_threads": 1 if args.clock == "cpu" else default_threads(),  # None: one per core
        "clock": args.clock,
        "hardware": hardware,
    }
    stem = args.results_dir / results_stem(Path(args.model).name)
    write_json_atomic(stem.with_suffix(".json"), {"meta": meta, "summary": summary, "rounds": rounds})
    text = markdown(summary, meta)
    with atomic_path(stem.with_suffix(".md")) as tmp:
        tmp.write_text(text)
    print(text)
    print(f"results: {stem.with_suffix('.json')}")
    fp32_variants = [
        name
        for name, v in summary["variants"].items()
        if v["recipe"]["bits"] == 32 and "generate" in v and v["generate"]["final_token_match"] < 1.0
    ]
    fp32_variants += [
        f"{name} (runtime)"
        for name, g in summary["runtime_generate"].items()
        if name != "fp32" and summary["variants"][name]["recipe"]["bits"] == 32 and g["final_token_match"] < 1.0
    ]
    if fp32_variants:
        raise CheckFailed(
            f"fp32 variant(s) {', '.join(fp32_variants)}: generate()'s final tokens differ from PyTorch's; "
            "check them with parity_check.py --variant and infer_onnx.py --variant"
        )
    runtime_match = summary["runtime_generate"].get("fp32", {}).get("final_token_match", 1.0)
    if "generate" in summary and min(summary["generate"]["final_token_match"], runtime_match) < 1.0:
        raise CheckFailed(
            f"ONNX generate()'s final tokens differ from PyTorch's "
            f"({100 * summary['generate']['final_token_match']:.2f} % equal through upstream's host code, "
            f"{100 * runtime_match:.2f} % through the runtime): its time is not comparable; check the export "
            "with parity_check.py and infer_onnx.py"
        )


if __name__ == "__main__":
    run_main(main)
