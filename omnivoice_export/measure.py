"""Wall time and peak resident memory of a block of work; the CPU a figure was measured on.

`resource.getrusage` only gives the process's lifetime high-water mark, which cannot attribute
memory to one graph's export or one runtime; a sampling thread can.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

import psutil


def cpu_description() -> dict[str, Any]:
    """The CPU the figures belong to, for every results file (bench and quality JSONs): vendor,
    model name, family/model numbers, logical and physical cores, whether it has VNNI (int8 dot
    products: quality and speed of the int8 variants depend on it) and native float16 arithmetic
    (AVX512-FP16: the fp16 variant's CPU speed does). From /proc/cpuinfo on Linux; the fields
    stay None elsewhere."""
    fields: dict[str, str] = {}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for text in cpuinfo.read_text().splitlines():
            key, _, value = text.partition(":")
            fields.setdefault(key.strip(), value.strip())
    flags = fields.get("flags", "").split()
    return {"vendor": fields.get("vendor_id"), "model_name": fields.get("model name") or platform.processor() or None,
            "family": fields.get("cpu family"), "model": fields.get("model"),
            "logical_cores": os.cpu_count(), "physical_cores": psutil.cpu_count(logical=False),
            "vnni": ("avx512_vnni" in flags or "avx_vnni" in flags) if flags else None,
            "avx512_fp16": "avx512_fp16" in flags if flags else None}


def cpu_line(cpu: dict[str, Any]) -> str:
    """One line naming a cpu_description(), for printed tables."""
    return (f"{cpu['model_name']} ({cpu['vendor']} family {cpu['family']} model {cpu['model']}), "
            f"{cpu['logical_cores']} logical / {cpu['physical_cores']} physical cores")


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

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, self._process.memory_info().rss)
        self.seconds = time.perf_counter() - self._started

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / 2**20
