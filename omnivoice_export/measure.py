"""Wall time and peak resident memory of a block of work.

`resource.getrusage` only gives the process's lifetime high-water mark, which cannot attribute
memory to one graph's export or one runtime; a sampling thread can.
"""

from __future__ import annotations

import threading
import time

import psutil


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

    def __enter__(self) -> "PeakRss":
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
