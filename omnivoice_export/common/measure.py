"""Wall time and peak resident memory of a block of work; the CPU a figure was measured on, its
ISA flags, and whether onnxruntime's int8 GEMM runs on AMX there (measured, amx_check).

`resource.getrusage` only gives the process's lifetime high-water mark, which cannot attribute
memory to one graph's export or one runtime; a sampling thread can.
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from omnivoice_onnx.hardware import cpu_isa, cpuinfo_fields


def cpu_description() -> dict[str, Any]:
    """The CPU the figures belong to, for every results file (bench and quality JSONs): vendor,
    model name, family/model numbers, logical and physical cores, clock as reported, and the ISA
    flags the kernels choose by (omnivoice_onnx.hardware.ISA_FLAGS: int8 and fp16 speed and int8
    quality depend on them). `vnni` (AVX-512 or AVX VNNI) is kept for older readers. From
    /proc/cpuinfo on Linux; the fields stay None elsewhere."""
    fields = cpuinfo_fields()
    isa = cpu_isa(fields)
    has_flags = isa["avx2"] is not None
    return {
        "vendor": fields.get("vendor_id"),
        "model_name": fields.get("model name") or platform.processor() or None,
        "family": fields.get("cpu family"),
        "model": fields.get("model"),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "mhz": float(fields["cpu MHz"]) if "cpu MHz" in fields else None,
        "vnni": bool(isa["avx512_vnni"] or isa["avx_vnni"]) if has_flags else None,
        "avx512_fp16": isa["avx512_fp16"],
        "isa": isa,
    }


# The AVX-512 VNNI int8 peak a core can reach, in ops (multiply and add counted apart) per cycle:
# one 512-bit VPDPBUSD multiplies 16 int32 lanes x 4 u8*s8 byte pairs and accumulates them (64
# multiply-adds = 128 ops), and a server core issues two per cycle (ports 0 and 5): 2 x 128 = 256.
# AVX-VNNI (256-bit) and one-port parts reach half of it, so 256 bounds every VNNI kernel from above.
VNNI_OPS_PER_CYCLE = 256
# The reported clock is the base clock (a KVM guest reports nothing else); turbo may run a core up
# to ~1.5x faster under AVX-512 (2.6 -> 3.9 GHz). A rate above the VNNI peak at 1.5x the reported
# clock cannot come from VNNI: only AMX tiles (TDPBUSD: 1,024 int8 multiply-adds per cycle) reach it.
TURBO_MARGIN = 1.5
# The one-node integer GEMM of the AMX check: u8 activations x s8 constant weights at the
# transformer's own dims (an S~800 call's 920 rows, hidden 1024 -> intermediate 3072).
AMX_CHECK_DIMS = (920, 1024, 3072)


def rate(fn: Callable[[], object], ops: float, seconds: float, clock: Callable[[], float] = time.perf_counter) -> float:
    """G(FL)OP/s of `fn` repeated for about `seconds` of `clock` (wall time, or the process's CPU
    time for one-thread figures on a shared machine), after one warm-up call."""
    fn()
    started, count = clock(), 0
    while clock() - started < seconds:
        fn()
        count += 1
    return ops * count / (clock() - started) / 1e9


def integer_gemm_session(
    rows: int, inner: int, width: int, op: str = "MatMulInteger", threads: int | None = None
) -> tuple[Any, dict[str, Any]]:
    """(session, feeds) of one onnxruntime node [rows, inner] x constant int8 [inner, width]:
    `MatMulInteger` (u8 x s8 -> int32, the bare integer GEMM) or `DynamicQuantizeMatMul` (fp32 in,
    activation quantized inside, per-column scales, as quantize_dynamic's graphs run it). The
    weight is an initializer, so MLAS prepacks it once as in the model; all threads unless given."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray[Any, np.dtype[Any]]]
    weight = numpy_helper.from_array(rng.integers(-127, 128, size=(inner, width), dtype=np.int8), "w")
    if op == "MatMulInteger":
        node = helper.make_node("MatMulInteger", ["x", "w"], ["y"])
        x_type, y_type, initializers = TensorProto.UINT8, TensorProto.INT32, [weight]
        feeds = {"x": rng.integers(0, 256, size=(rows, inner), dtype=np.uint8)}
    elif op == "DynamicQuantizeMatMul":
        scale = numpy_helper.from_array(np.full(width, 0.01, dtype=np.float32), "w_scale")
        node = helper.make_node("DynamicQuantizeMatMul", ["x", "w", "w_scale"], ["y"], domain="com.microsoft")
        x_type, y_type, initializers = TensorProto.FLOAT, TensorProto.FLOAT, [weight, scale]
        feeds = {"x": rng.standard_normal((rows, inner), dtype=np.float32)}
    else:
        raise ValueError(f"unknown integer GEMM op {op!r}")
    graph = helper.make_graph(
        [node],
        "gemm",
        [helper.make_tensor_value_info("x", x_type, [rows, inner])],
        [helper.make_tensor_value_info("y", y_type, [rows, width])],
        initializer=initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(
        model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
    ), feeds


def amx_check(calls: int = 40) -> dict[str, Any]:
    """Whether onnxruntime's int8 GEMM runs on AMX here, measured: a one-node MatMulInteger at
    AMX_CHECK_DIMS on one thread, timed by that thread's CPU time (other work on shared cores
    steals wall time, not the CPU time a call needs), best of `calls`, against one core's VNNI peak
    (reported GHz x VNNI_OPS_PER_CYCLE). `amx_ran` is True when the rate exceeds that peak at
    TURBO_MARGIN x the clock (only AMX gets there), False when the CPU has no AMX-INT8, None when
    it has AMX-INT8 but the rate stays below the bound (not shown: an OS that does not grant the
    tile state (XCR0), or a clock that was not reported)."""
    cpu = cpu_description()
    rows, inner, width = AMX_CHECK_DIMS
    session, feeds = integer_gemm_session(rows, inner, width, "MatMulInteger", threads=1)
    session.run(None, feeds)
    seconds = []
    for _ in range(calls):
        started = time.thread_time()
        session.run(None, feeds)
        seconds.append(time.thread_time() - started)
    ops = 2 * rows * inner * width
    best, median = ops / min(seconds) / 1e9, ops / sorted(seconds)[len(seconds) // 2] / 1e9
    peak = cpu["mhz"] / 1e3 * VNNI_OPS_PER_CYCLE if cpu["mhz"] else None
    if not cpu["isa"]["amx_int8"]:
        amx_ran: bool | None = False
    elif peak is not None and best > TURBO_MARGIN * peak:
        amx_ran = True
    else:
        amx_ran = None
    return {
        "op": "MatMulInteger u8 x s8 (constant B)",
        "dims": list(AMX_CHECK_DIMS),
        "threads": 1,
        "gops_per_core": round(best, 1),
        "gops_per_core_median": round(median, 1),
        "vnni_peak_gops_per_core": round(peak, 1) if peak else None,
        "vnni_peak_formula": f"{cpu['mhz']} MHz x {VNNI_OPS_PER_CYCLE} int8 ops/cycle",
        "amx_bound_gops_per_core": round(TURBO_MARGIN * peak, 1) if peak else None,
        "amx_ran": amx_ran,
    }


def hardware_record(check_amx: bool = True) -> dict[str, Any]:
    """What every results file records beside its `cpu` (cpu_description: model string, ISA flags):
    onnxruntime's version, the load average when the run started (1, 5, 15 min; these machines are
    shared, so a figure without it cannot be judged), and amx_check() unless `check_amx` is False
    (it costs about half a second of CPU)."""
    import onnxruntime as ort

    return {
        "onnxruntime": ort.__version__,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "amx_check": amx_check() if check_amx else None,
    }


def cpu_tag(cpu: dict[str, Any] | None = None) -> str:
    """A file-name tag for the CPU, e.g. intel-f6m167 or amd-f25m17: results files of one host name
    (every VM here is `vm`) and one date would otherwise overwrite each other across CPUs."""
    cpu = cpu or cpu_description()
    vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(cpu["vendor"] or "", platform.machine().lower())
    return f"{vendor}-f{cpu['family']}m{cpu['model']}" if cpu["family"] else vendor


def results_stem(label: str) -> str:
    """<date>-<host>-<cpu tag>-<label>: the name of a results file pair (.json, .md) in bench/results."""
    return f"{datetime.date.today().isoformat()}-{socket.gethostname()}-{cpu_tag()}-{label}"


def amx_line(check: dict[str, Any] | None) -> str:
    """One line for a results markdown: the integer GEMM rate per core and what it says about AMX."""
    if check is None:
        return "int8 GEMM on AMX: not checked"
    verdict = {
        True: "**AMX ran**",
        False: "no AMX (the CPU has no AMX-INT8)",
        None: "AMX not shown (the CPU has AMX-INT8; the rate stays below the bound)",
    }[check["amx_ran"]]
    return (
        f"int8 GEMM check: one {check['op']} node {'x'.join(map(str, check['dims']))}, one thread, "
        f"{check['gops_per_core']:.0f} GOP/s per CPU-second (median {check['gops_per_core_median']:.0f}) vs one "
        f"core's AVX-512 VNNI peak {check['vnni_peak_gops_per_core']} ({check['vnni_peak_formula']}; bound "
        f"{check['amx_bound_gops_per_core']} at {TURBO_MARGIN}x the clock): {verdict}"
    )


def hardware_lines(meta: dict[str, Any]) -> list[str]:
    """A results file's ISA flags, onnxruntime version, load average and AMX check, as markdown lines
    (meta["cpu"] from cpu_description, meta["hardware"] from hardware_record; files from before
    they were recorded have no "hardware": nothing is printed for them)."""
    hardware = meta.get("hardware")
    if not hardware:
        return []
    isa = meta["cpu"].get("isa") or {}
    flags = ", ".join(flag for flag, has in isa.items() if has) or "none recorded"
    return [
        f"ISA: {flags}; onnxruntime {hardware['onnxruntime']}; load average at the start "
        f"{' / '.join(map(str, hardware['load_average']))} (1/5/15 min)",
        "",
        amx_line(hardware["amx_check"]),
    ]


def cpu_line(cpu: dict[str, Any]) -> str:
    """One line naming a cpu_description(), for printed tables."""
    return (
        f"{cpu['model_name']} ({cpu['vendor']} family {cpu['family']} model {cpu['model']}), "
        f"{cpu['logical_cores']} logical / {cpu['physical_cores']} physical cores"
    )


class PeakRss:
    """Context manager: samples this process's RSS every `interval` s; `.peak_mb`, `.seconds` after."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.peak_bytes = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._process = psutil.Process()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, self._process.memory_info().rss)
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRss:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, self._process.memory_info().rss)
        self.seconds = time.perf_counter() - self._started

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / 2**20
