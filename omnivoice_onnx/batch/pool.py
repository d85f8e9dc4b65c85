"""omnivoice-onnx batch --workers N: the batch job on N local processes, each holding one model.

Like the Ray engine (omnivoice_onnx.batch.ray_engine) it knows nothing of the model: the driver
(omnivoice_onnx.batch.run) hands it `load` and its arguments, which each process calls once to
build its worker (run.Synthesizer.load: a loaded OmniVoiceOnnx), and the tasks; outcomes come
back as they finish. The processes are spawned (no fork of a process holding onnxruntime
threads), die with their driver however it dies (die_with_parent), and leave Ctrl-C to it.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from omnivoice_onnx.errors import UserError

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_S = 1.0  # elsewhere: how often a worker looks whether its driver is still there


class Worker(Protocol):
    """What `load` builds in each process: one task in, its outcome out."""

    def run(self, row: dict[str, Any]) -> dict[str, Any]: ...


Loader = Callable[..., Worker]  # picklable by reference (a module-level function or a class's method)

_WORKER: Worker | None = None
_LOAD: tuple[Loader, tuple[Any, ...]] | None = None  # (load, its arguments), set by _pool_init


def die_with_parent(parent: int) -> None:
    """End this process when `parent` (the driver) dies, however it dies: a driver killed with
    SIGKILL left its workers and the resource tracker running (~260 MB each, 79 s later). On
    Linux the kernel sends SIGKILL (prctl PR_SET_PDEATHSIG); elsewhere a daemon thread polls.
    A driver already gone before this ran is seen at once (this process was re-parented)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(PARENT_POLL_S)
            os._exit(1)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    if os.getppid() != parent:
        os._exit(1)


def _pool_init(load: Loader, load_args: tuple[Any, ...], driver: int) -> None:
    """A pool process: it dies with its driver `driver` (die_with_parent); Ctrl-C goes to the driver
    alone (it stops the pool). The worker is built by the first task, so that a load failure
    reaches the driver as itself (an initializer's error would only break the pool)."""
    global _LOAD
    die_with_parent(driver)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _LOAD = (load, load_args)


def _pool_run(row: dict[str, Any]) -> dict[str, Any]:
    global _WORKER
    if _WORKER is None:
        assert _LOAD is not None, "the pool's initializer (_pool_init) sets it"
        load, load_args = _LOAD
        _WORKER = load(*load_args)
    return _WORKER.run(row)


def run_pool(
    load: Loader, load_args: tuple[Any, ...], workers: int, tasks: list[dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    """The tasks on `workers` spawned processes, each running them on its own `load(*load_args)`;
    outcomes as they finish. Stopping early (Ctrl-C, SIGTERM, an error here) terminates the
    processes: they write nothing, so a line in progress is simply redone by the next run."""
    context = multiprocessing.get_context("spawn")  # no fork of a process holding onnxruntime threads
    pool = concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_pool_init, initargs=(load, load_args, os.getpid())
    )
    try:
        futures = [pool.submit(_pool_run, task) for task in tasks]
        for future in concurrent.futures.as_completed(futures):
            try:
                yield future.result()
            except concurrent.futures.process.BrokenProcessPool:
                raise UserError(
                    "a worker process died (killed, or out of memory); the lines finished so far are saved",
                    "re-run the same command to continue, with fewer --workers if memory is short",
                ) from None
    finally:
        # Python < 3.14 has no public terminate_workers(): without this, interpreter exit would
        # wait for every worker to finish its current line (minutes at full size).
        processes = list((pool._processes or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
