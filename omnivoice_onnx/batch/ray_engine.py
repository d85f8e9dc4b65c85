"""omnivoice-onnx batch --ray [ADDRESS]: the batch job on Ray Data (extra `omnivoice-onnx[ray]`).

Imported only for --ray. The driver (omnivoice_onnx.batch.run.run_batch) checks the list, plans the
lines and writes every file; Ray only computes: a dataset of the planned tasks, longest first, cut
into small blocks, mapped by an actor pool whose actors each hold one loaded OmniVoiceOnnx
(omnivoice_onnx.batch.run.SynthActor). An actor returns each line's WAV bytes and timings; the
driver writes `<id>.wav` and its record as rows arrive, exactly as the local engines do, so a
Ray run's files are the local run's files, byte for byte, and a resume works across engines.

A worker that dies (a killed process, a lost node) is restarted by Ray and its unfinished block
is run again (Ray Data's actor-pool retries, see run_ray): its lines had not reached the driver, so
nothing is written twice and nothing is lost.

On a cluster (`--ray ray://head:10001` or `--ray auto` on a node of it):
- every node needs Python with `pip install 'omnivoice-onnx[ray]'` (onnxruntime, tokenizers,
  soundfile); this package's own code is shipped to the workers by Ray (runtime_env py_modules),
  so a driver's edited checkout runs as is;
- the export folder (--model-dir) must be readable at the SAME absolute path on every node: shared
  storage (NFS, a mounted bucket), or copied there beforehand (`ray rsync-up`, an image); at full
  size it is ~3.2 GB, too big for Ray's runtime_env upload. References and voices too, as the
  list names them (relative paths are made absolute against the list's folder on the driver);
- res_dir is written by the driver alone, so it need not be shared.
A worker whose export differs (another fingerprint or variant) stops the run with one line.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omnivoice_onnx.errors import UserError

# ray is imported inside the functions that use it: every runtime module must import without an
# extra's package (tests/test_runtime_install.py imports them all, as `omnivoice-onnx --help` may).

# Lines per Ray block: small, so the longest-first order is kept at a fine grain and the actors
# finish together, and a retried block redoes little; at least BLOCKS_PER_ACTOR blocks per actor.
MAX_LINES_PER_BLOCK = 8
# The omnivoice_onnx package folder, the one above batch/ (a path: this engine imports nothing of the package).
PACKAGE_DIR = os.fspath(Path(__file__).resolve().parent.parent)
BLOCKS_PER_ACTOR = 4


CONNECT_TIMEOUT_S = 10.0  # a cluster address must accept a TCP connection within this
CLIENT_PREFIX = "ray://"
ADDRESS_FIX = (
    "pass --ray alone (a local Ray), --ray auto on a node of a running cluster, --ray HOST:PORT (its GCS) "
    "or --ray ray://HOST:10001 (Ray Client)"
)


def check_address(address: str) -> None:
    """Before any output: `address` is one Ray can use, and a cluster's answers within
    CONNECT_TIMEOUT_S. ray.init with a bad one raised a traceback (garbage, `auto` with no
    cluster, `ray://` without Ray Client's grpcio) or hung (`127.0.0.1:1`), after results.jsonl was
    made; here each is one line."""
    if address == "local":
        return
    from ray._private import services  # ray's own parsing of the forms ray.init accepts

    target = address.removeprefix(CLIENT_PREFIX)
    if address.startswith(CLIENT_PREFIX) and importlib.util.find_spec("grpc") is None:
        raise UserError(f"--ray {address} needs Ray Client, which is not installed", "pip install 'ray[client]'")
    if target == "auto":
        try:
            found = services.canonicalize_bootstrap_address("auto")
        except Exception as exc:  # ray raises ConnectionError, ValueError or its own types here
            raise UserError(f"--ray auto: no running Ray cluster found on this node ({exc})", ADDRESS_FIX) from None
        if found is None:
            raise UserError(
                "--ray auto: no running Ray cluster found on this node (start one with `ray start --head`)", ADDRESS_FIX
            )
        target = found
    # ray 2.60 imports parse_address into services from ray._common.network_utils without re-exporting
    # it; older ray (the extra's >= 2.40) defines it in services itself
    parsed = services.parse_address(target)  # type: ignore[attr-defined]
    if parsed is None or not parsed[0] or not str(parsed[1]).isdecimal() or not 0 < int(parsed[1]) < 65536:
        raise UserError(f"--ray {address} is not a Ray address", ADDRESS_FIX)
    host, port = parsed[0], int(parsed[1])
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise UserError(
            f"--ray {address}: nothing answers at {host}:{port} within {CONNECT_TIMEOUT_S:g} s ({exc.strerror or exc})",
            "start the cluster, or check the address and the network",
        ) from None


def connect(address: str, cpus_wanted: int) -> bool:
    """Join Ray: the running one (a test's, an application's), a cluster at `address`, or a new
    local instance ("local") with room for every actor. True when this call started it."""
    import ray

    if ray.is_initialized():
        return False
    local = address == "local"
    try:
        ray.init(
            address=None if local else address,
            num_cpus=max(cpus_wanted, len(os.sched_getaffinity(0))) if local else None,
            logging_level=logging.WARNING,
            include_dashboard=False,
            runtime_env={"py_modules": [PACKAGE_DIR]},
        )  # this package's code, to every worker
    except (ConnectionError, TimeoutError, ValueError) as exc:  # the cluster went away after check_address
        raise UserError(
            f"--ray {address}: Ray could not connect ({str(exc).splitlines()[0][:200]})", ADDRESS_FIX
        ) from None
    return True


def run_ray(
    address: str,
    actor: type,
    actor_kwargs: dict[str, Any],
    workers: int,
    tasks: list[dict[str, Any]],
    estimates: list[float],
    threads: int,
) -> Iterator[dict[str, Any]]:
    """The tasks (rows of str/bytes columns, already longest first; `estimates` their seconds,
    kept as a column for inspection) on `workers` instances of `actor` (built with `actor_kwargs`; the driver passes
    omnivoice_onnx.batch.run.SynthActor, so this engine knows nothing of the model) of `threads` CPUs
    each, on Ray at `address` (see connect); outcomes as blocks finish."""
    import ray
    import ray.data

    started = connect(address, workers * threads)
    data_logger = logging.getLogger("ray.data")
    level = data_logger.level
    data_logger.setLevel(logging.WARNING)  # Ray Data's per-dataset INFO lines; the driver reports progress
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # the driver has its own bar, per line
        per_block = max(1, min(MAX_LINES_PER_BLOCK, len(tasks) // (BLOCKS_PER_ACTOR * workers)))
        items = [{**task, "estimate": estimate} for task, estimate in zip(tasks, estimates)]
        blocks = max(1, math.ceil(len(items) / per_block))
        dataset: ray.data.Dataset = ray.data.from_items(items, override_num_blocks=blocks)
        dataset = dataset.map_batches(
            actor,
            fn_constructor_kwargs=actor_kwargs,
            batch_size=None,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=workers),
            num_cpus=threads,
        )
        # Retries: Ray Data gives a map_batches actor pool max_restarts=-1 and max_task_retries=-1
        # unless told otherwise (ray/data/_internal/execution/operators/actor_pool_map_operator.py;
        # passing them explicitly is deprecated since 2.60): a dead actor is restarted without limit
        # and its block retried. An application error is not retried, which is why
        # Synthesizer.run returns a line's failure as data instead of raising it.
        for row in dataset.iter_rows():
            yield {**json.loads(row["outcome"]), "wav": row["wav"] or None}
    finally:
        data_logger.setLevel(level)
        if started:
            ray.shutdown()
