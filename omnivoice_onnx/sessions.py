"""onnxruntime sessions and providers for the three OmniVoice graphs (torch-free).

Providers:
    cpu        CPUExecutionProvider, fp32
    cuda-fp32  CUDAExecutionProvider with use_tf32=0: full fp32, a parity path
    cuda-tf32  CUDAExecutionProvider defaults (TF32 matmuls): a speed/precision trade-off, not a
               parity verdict on the export (facts sheet: argmax 0.996, max |d| 5e-2 per step)
    openvino-bf16  the transformer on the OpenVINO execution provider (PyPI onnxruntime-ep-openvino,
               a plugin for this onnxruntime: `pip install "omnivoice-onnx[openvino]"`) computing
               in bfloat16 (AMX-BF16 / AVX512-BF16 where the CPU has them): like cuda-tf32, a speed
               trade-off that changes bits, never parity (its speed and agreement with fp32 on an
               AMX Xeon: docs/performance.md, "OpenVINO bf16")
    openvino-f32   the same provider in float32: other bits than MLAS, and no faster than the default
               fp32-fused graph (docs/performance.md): kept to measure, not to use
The OpenVINO providers run the transformer only; the codec graphs stay on the CPU provider in
fp32 (codec_provider). They run the faithful fp32 graph: the default variant is chosen for the CPU
provider only (bundle.default_variant), and the fused graphs were measured there.

A requested CUDA provider that onnxruntime lacks is an error, never a quiet fall back to CPU.
A CUDA session's provider options are read back from onnxruntime: `cuda-fp32` is refused unless
the CUDA provider reports `use_tf32` "0" (an onnxruntime that ignored the option would compute in
TF32 under an fp32 verdict). onnxruntime may still run single nodes of a CUDA session on the CPU
(it keeps shape arithmetic there); `node_placement` reports which, from a profiled first run.
The toolchain (omnivoice_export) and the runtime share this module; it imports numpy and
onnxruntime only.

Threads: a session uses `threads` intra-op threads when given (the scripts' --threads), else
$OMNIVOICE_ORT_THREADS when set, else onnxruntime's default (one per physical core). Set the
variable where several processes share the cores (one process per core on a server, a test suite
on parallel workers): each session's pool would otherwise spin a thread per core, and on small
graphs that spinning costs more CPU than the call itself (investigation log).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omnivoice_onnx.contract import GRAPH_FILES
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.hardware import cpu_name
from omnivoice_onnx.limits import check_threads, default_threads

# onnxruntime's Linux wheels carry Microsoft's 1DS telemetry: at import (when its environment is
# made) it writes a device id and an event database under ~/.cache/Microsoft/DeveloperTools, and
# with a read-only HOME prints a warning line before any of ours. ORT_DISABLE_TELEMETRY=1, read at
# that import, stops both (onnxruntime 1.32); set here, where the runtime first
# comes before any onnxruntime import of its own (every module reaches this one first). A user
# who sets the variable keeps their value; a host that imported onnxruntime earlier still gets
# the events off for the sessions made here (disable_telemetry_events in make_session).
TELEMETRY_ENV = "ORT_DISABLE_TELEMETRY"
os.environ.setdefault(TELEMETRY_ENV, "1")

PROVIDERS = ("cpu", "cuda-fp32", "cuda-tf32", "openvino-bf16", "openvino-f32")
# OpenVINO's CPU plugin precision per provider (its INFERENCE_PRECISION_HINT).
OPENVINO_PRECISION = {"openvino-bf16": "bf16", "openvino-f32": "f32"}
OPENVINO_INSTALL_HINT = "pip install onnxruntime-ep-openvino (the [openvino] extra), or use --provider cpu"
GPU_INSTALL_HINT = (
    "install the GPU requirements (pip install --no-deps -r requirements-gpu.txt) on a machine with an NVIDIA GPU"
)


def provider_chain(provider: str) -> list[Any]:
    """The onnxruntime providers list for one of PROVIDERS."""
    if provider == "cpu":
        return ["CPUExecutionProvider"]
    if provider == "cuda-fp32":
        return [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    if provider == "cuda-tf32":
        return [("CUDAExecutionProvider", {}), "CPUExecutionProvider"]
    if provider in OPENVINO_PRECISION:
        return []  # a plugin provider: added to the session options (openvino_options), not listed
    raise UserError(f"unknown provider {provider!r}", f"choose one of {', '.join(PROVIDERS)}")


def check_provider(provider: str) -> None:
    """UserError (one line) when `provider` cannot run in this onnxruntime build."""
    import onnxruntime as ort

    provider_chain(provider)
    if provider in OPENVINO_PRECISION:
        openvino_device()
    if provider.startswith("cuda") and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise UserError(
            f"--provider {provider} needs onnxruntime's CUDAExecutionProvider, which this install "
            f"lacks (onnxruntime {ort.__version__} has {', '.join(ort.get_available_providers())})",
            GPU_INSTALL_HINT,
        )


def codec_provider(provider: str) -> str:
    """The provider the encoder and decoder run on: the transformer's, except under OpenVINO,
    whose precision hint is for the transformer (the codec stays fp32, as every variant's does)."""
    return "cpu" if provider in OPENVINO_PRECISION else provider


@functools.cache
def openvino_device() -> Any:
    """onnxruntime's OpenVINO CPU device, the plugin registered and the device looked up once per
    process (check_provider and openvino_options both ask); UserError when the plugin package is
    missing or finds no CPU device."""
    import onnxruntime as ort

    try:
        import onnxruntime_ep_openvino as openvino
    except ImportError as exc:
        raise UserError(
            "the OpenVINO providers need the onnxruntime-ep-openvino package, which is not installed",
            OPENVINO_INSTALL_HINT,
        ) from exc
    name = openvino.get_ep_name()
    if not any(device.ep_name == name for device in ort.get_ep_devices()):
        ort.register_execution_provider_library("openvino", openvino.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == name and d.ep_metadata.get("ov_device") == "CPU"]
    if not devices:  # the plugin installed, but it offers no device for this CPU (seen on an AMD EPYC)
        raise UserError(
            f"onnxruntime's OpenVINO provider offers no CPU device on this machine ({cpu_name()})", "use --provider cpu"
        )
    return devices[0]


def openvino_options(options: Any, provider: str, threads: int | None) -> None:
    """Put the OpenVINO provider on session `options`: its CPU device, the provider's precision,
    one inference stream (a call at a time, as the CPU provider) on `threads` threads (0: its default)."""
    config = {
        "CPU": {
            "INFERENCE_PRECISION_HINT": OPENVINO_PRECISION[provider],
            "NUM_STREAMS": 1,
            "INFERENCE_NUM_THREADS": threads or 0,
        }
    }
    options.add_provider_for_devices([openvino_device()], {"load_config": json.dumps(config)})


def cores() -> int:
    """CPUs this process may run on (the affinity mask, which containers and taskset narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def worker_threads(workers: int, threads: int | None) -> int:
    """onnxruntime threads for each of `workers` workers (the server's, batch's): `threads` when
    given, else $OMNIVOICE_ORT_THREADS, else the cores this process may use split evenly over the
    workers (at least one each). One rule for every front end that runs several models at once."""
    checked = check_threads(threads)  # None only when threads is None
    if checked is not None:
        return checked
    return default_threads() or max(1, cores() // workers)


# What onnxruntime's messages say when an allocation fails (its arena, or the C++ allocator).
ALLOCATION_FAILURES = ("Failed to allocate", "bad_alloc", "Out of memory", "out of memory")


def allocation_failure(exc: BaseException) -> bool:
    """Whether an onnxruntime exception is a failed allocation (not a broken graph or input)."""
    return isinstance(exc, MemoryError) or any(text in str(exc) for text in ALLOCATION_FAILURES)


def make_session(
    path: Path,
    provider: str = "cpu",
    threads: int | None = None,
    arena: bool = True,
    profile: bool = False,
    fix: str = "re-run export_omnivoice.py (step 2)",
) -> Any:
    """An InferenceSession for one graph; checks the requested provider really took it, with the
    options asked for (check_cuda_options).

    `arena=False` turns off the CPU memory arena and memory patterns, so a call's activations go
    back to the system when it returns instead of staying reserved for the session (see
    CODEC_ARENA). `profile=True` records which provider runs each node until `node_placement`
    is called (after one run).
    """
    import onnxruntime as ort

    path = Path(path)
    if not path.is_file():
        raise UserError(f"ONNX graph not found: {path}", "run export_omnivoice.py (step 2)")
    check_provider(provider)
    if os.environ.get(TELEMETRY_ENV) != "0":
        ort.disable_telemetry_events()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    threads = check_threads(threads) or default_threads()
    if threads:
        options.intra_op_num_threads = threads
    if not arena:
        options.enable_cpu_mem_arena = False
        options.enable_mem_pattern = False
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tempfile.gettempdir()) / f"omnivoice-ort-profile-{os.getpid()}")
    if provider in OPENVINO_PRECISION:
        openvino_options(options, provider, threads)
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=provider_chain(provider) or None)
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidProtobuf types
        if allocation_failure(exc):
            raise MemoryError(f"not enough memory to load {path} ({str(exc).splitlines()[0][:200]})") from exc
        raise UserError(
            f"onnxruntime cannot load {path} ({str(exc).splitlines()[0][:300]})",
            f"{fix}; the graph or its .onnx.data is damaged",
        ) from exc
    if provider.startswith("cuda"):
        check_cuda_options(path.name, provider, session.get_providers(), session.get_provider_options())
    return session


def check_cuda_options(name: str, provider: str, providers: list[str], options: dict[str, dict[str, str]]) -> None:
    """UserError unless a CUDA session of graph `name` runs on the CUDA provider first, and, for
    cuda-fp32, that provider reports the `use_tf32` "0" it was asked for.

    `providers` and `options` are what the session reports (get_providers, get_provider_options),
    not what was requested: an onnxruntime that dropped or ignored the option shows it here.
    """
    if not providers or providers[0] != "CUDAExecutionProvider":
        raise UserError(f"onnxruntime did not place {name} on CUDA (got {providers})", GPU_INSTALL_HINT)
    use_tf32 = options.get("CUDAExecutionProvider", {}).get("use_tf32")
    if provider == "cuda-fp32" and use_tf32 != "0":
        raise UserError(
            f"onnxruntime's CUDA provider reports use_tf32={use_tf32!r} for {name}, so cuda-fp32 would compute in TF32",
            "install the onnxruntime-gpu of requirements-gpu.txt, whose CUDA "
            "provider honours use_tf32, or use --provider cuda-tf32 for the TF32 trade-off",
        )


def node_placement(session: Any) -> dict[str, Any]:
    """Which execution provider ran each node of a session made with `profile=True`, from its
    profile of the runs so far (at least one); ends the profiling and removes its file.

    {"nodes": {provider: count}, "cpu_ops": {op type: count of nodes run on the CPU}}. Under a
    CUDA provider, nodes on CPUExecutionProvider are what onnxruntime could or would not place on
    the GPU: shape arithmetic by design, anything heavier is a copy to the host and back.
    """
    path = Path(session.end_profiling())
    try:
        events = json.loads(path.read_text())
    finally:
        path.unlink(missing_ok=True)
    nodes = {
        event["name"]: event["args"]
        for event in events
        if event.get("cat") == "Node" and "provider" in event.get("args", {})
    }
    if not nodes:
        raise ValueError("the session's profile holds no node: run it once before node_placement")
    return {
        "nodes": dict(Counter(args["provider"] for args in nodes.values())),
        "cpu_ops": dict(
            Counter(args["op_name"] for args in nodes.values() if args["provider"] == "CPUExecutionProvider")
        ),
    }


def finite_output(array: np.ndarray, graph: str, file: str | os.PathLike[str] | None = None) -> np.ndarray:
    """`array` if every value is finite; else a UserError saying the graph's weights are damaged.

    A graph whose sidecar was overwritten (and its sha256 re-recorded by hand) loads and runs,
    and returns NaN: NaN logits pick token 0 everywhere and NaN audio ends in a numpy error deep
    in post-processing. No real export produces a non-finite value (parity and the self-checks
    compare every output), so one is named here, at the graph. `file`: the graph's .onnx (default:
    the export's own file name for `graph`).
    """
    if not np.isfinite(array).all():
        raise UserError(
            f"the {graph} graph returned NaN or infinite values: its weights "
            f"({file or GRAPH_FILES[graph]}.data) are damaged",
            "re-run export_omnivoice.py (step 2)",
        )
    return array


def run(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a session fed by input name; outputs by name. An allocation onnxruntime could not
    make is raised as MemoryError (the inputs' shapes in its message), so every entry point
    treats it as numpy's: the request was too big (one line, exit 2; a UserError in the API)."""
    names = [o.name for o in session.get_outputs()]
    try:
        outputs = session.run(names, feeds)
    except Exception as exc:  # onnxruntime's RuntimeException/Fail carry the allocator's message
        if not allocation_failure(exc):
            raise
        shapes = ", ".join(f"{name}{list(array.shape)}" for name, array in feeds.items())
        raise MemoryError(f"onnxruntime could not allocate memory for {shapes}") from exc
    return dict(zip(names, outputs))


@dataclass
class CodecConfig:
    """The audio tokenizer constants generate() reads, taken from the graphs' metadata."""

    sample_rate: int
    hop_length: int
    frame_rate: int


class CodecSessions:
    """The encoder and decoder sessions: held for the graphs' lifetime (`resident`), or opened
    for each call and released when it returns.

    generate() encodes the reference once, before its 2 x num_step transformer calls, and decodes
    once at the end; a resident encoder would keep its weights (hundreds of MB at the real dims)
    through every step. Opened per call, ORT maps the weights when the call starts and unmaps them when
    the session goes, so the process holds one codec graph's weights only while it runs (what
    keeps the ONNX path's peak RSS under PyTorch's: docs/performance.md). The price is a session
    load per call; a server making many requests wants them resident.
    """

    def __init__(
        self,
        paths: dict[str, Path],
        provider: str,
        threads: int | None,
        resident: bool,
        loaded: Callable[[Path], None] = lambda path: None,
    ) -> None:
        # {"encoder": path, "decoder": path}: the variant's own codec graphs where it carries them
        # (fp16), else the export's (contract.codec_paths; a Bundle's codec_paths).
        self.paths = dict(paths)
        self.provider, self.threads = codec_provider(provider), threads
        # Called with a graph's path after each session of it is made and after each call
        # (bundle.Bundle.check_loaded: its files are still the ones verified; a session opened per
        # call reads them again, and onnxruntime maps the external data file it reads).
        self.loaded = loaded
        self.held = {name: self.open(name) for name in self.paths} if resident else {}

    def open(self, name: str) -> Any:
        session = make_session(self.paths[name], self.provider, self.threads, arena=CODEC_ARENA)
        self.loaded(self.paths[name])
        return session

    def run(self, name: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = self.held.get(name) or self.open(name)
        outputs = run(session, feeds)
        self.loaded(self.paths[name])  # a mapped weights file written to during the call shows here
        return outputs


def prefix_lengths(attention_mask: np.ndarray) -> list[int] | None:
    """Per row r, the L with mask[r] allowing exactly keys [0, L) to queries [0, L), and no query
    beyond L any key in [0, L) (padding); None when
    some row has another structure (then it cannot be run at its own length)."""
    lengths = []
    for row in attention_mask[:, 0]:
        length = int(row[0].sum())
        # Rows beyond L are dropped: they must be padding (no key in [0, L)), as generate() builds them.
        if length == 0 or not row[:length, :length].all() or row[:length, length:].any() or row[length:, :length].any():
            return None
        lengths.append(length)
    return lengths


def split_feeds(
    input_ids: np.ndarray, audio_mask: np.ndarray, attention_mask: np.ndarray
) -> list[tuple[np.ndarray, dict[str, np.ndarray]]] | None:
    """(row indices, transformer feeds cut to their length L) per group of equal-length rows;
    None when the mask is not of block form (see prefix_lengths)."""
    lengths = prefix_lengths(attention_mask)
    if lengths is None:
        return None
    groups = []
    for length in sorted(set(lengths)):
        rows = np.array([row for row, row_length in enumerate(lengths) if row_length == length])
        groups.append(
            (
                rows,
                {
                    "input_ids": input_ids[rows, :, :length],
                    "audio_mask": audio_mask[rows, :length],
                    "attention_mask": attention_mask[rows][:, :, :length, :length],
                },
            )
        )
    return groups


def run_split(session: Any, input_ids: np.ndarray, audio_mask: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """The transformer with each group of equal-length rows run at its own length.

    generate() pads the uncond half (target frames only) to the cond length S: a large share of
    its rows is padding. With the bidirectional block mask, queries in [0, L) attend only to keys in
    [0, L), so cutting a row to L changes nothing the rows [0, L) compute, mathematically; the
    rows beyond L are never read by generate() and are returned as zeros. Falls back to one
    padded call when the mask is not of that block form.
    """
    groups = split_feeds(input_ids, audio_mask, attention_mask)
    if not groups:  # not of block form (None), or no rows at all
        return run(session, {"input_ids": input_ids, "audio_mask": audio_mask, "attention_mask": attention_mask})[
            "logits"
        ]
    rows_total, codebooks, seq = input_ids.shape
    logits: np.ndarray | None = None
    for rows, feeds in groups:
        out = run(session, feeds)["logits"]
        if logits is None:
            logits = np.zeros((rows_total, codebooks, seq, out.shape[-1]), dtype=out.dtype)
        logits[rows, :, : out.shape[2]] = out
    assert logits is not None, "groups is not empty"
    return logits


# Arena per graph (the figures: the investigation log). The codec graphs' activations grow with
# the audio length (the encoder's Conv im2col buffers most) and each runs once per generate():
# without an arena that memory is returned after the call, for a small cost on that one call. The
# transformer is called 2 x num_step times at fixed shapes; without its arena every call is slower.
TRANSFORMER_ARENA, CODEC_ARENA = True, False
