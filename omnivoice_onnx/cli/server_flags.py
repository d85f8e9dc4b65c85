"""The flags `serve` and `wyoming` share: what a server loads and how it queues work, and the
ServerConfig they give. A module of its own (not a command: __main__.SUBCOMMANDS does not list it) so
that neither command imports the other, nor the HTTP server to read its defaults.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from omnivoice_onnx.bundle import check_folder
from omnivoice_onnx.cli.flags import add_bundle_flags
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.program import NUM_STEP, SCORE_FACTOR, THREADS, float_range, int_range
from omnivoice_onnx.serve import door
from omnivoice_onnx.serve.service import (
    DEFAULT_DRAIN_S,
    DEFAULT_QUEUE,
    DEFAULT_TIMEOUT_S,
    REQUEST_DEFAULT_FIELDS,
    ServerConfig,
)


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of what a server loads and how it queues work: `serve`'s and `wyoming`'s."""
    add_bundle_flags(parser)
    parser.add_argument(
        "--num-step",
        "--num_step",
        dest="num_step",
        type=NUM_STEP,
        default=None,
        help="unmasking steps of a request that sets none (default: the bundle's, upstream's 32; "
        "fewer is faster and rougher)",
    )
    parser.add_argument(
        "--guidance-scale",
        "--guidance_scale",
        dest="guidance_scale",
        type=SCORE_FACTOR,
        default=None,
        help="classifier-free guidance of a request that sets none (default: the bundle's, upstream's 2.0)",
    )
    parser.add_argument(
        "--language",
        default=None,
        help="language of a request that names none: a name, id or tag (default: none: the model infers it)",
    )
    parser.add_argument(
        "--workers",
        type=int_range(1, 64),
        default=1,
        help="inference workers, each with its own model sessions (default: 1)",
    )
    parser.add_argument(
        "--threads",
        type=THREADS,
        default=None,
        help="onnxruntime threads per worker (default: $OMNIVOICE_ORT_THREADS, else cores // workers)",
    )
    parser.add_argument(
        "--queue",
        type=int_range(1, 10_000),
        default=DEFAULT_QUEUE,
        help=f"requests that may wait for a worker; more are refused (default: {DEFAULT_QUEUE})",
    )
    parser.add_argument(
        "--timeout",
        type=float_range(1.0, 86_400.0),
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds a request may take, queue wait included (default: {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--drain-timeout",
        "--drain_timeout",
        dest="drain_timeout",
        type=float_range(0.0, 86_400.0),
        default=DEFAULT_DRAIN_S,
        help=f"on SIGTERM, seconds in-flight requests may take to finish; the rest end with an error "
        f"(default: {DEFAULT_DRAIN_S:g})",
    )


def server_config(args: argparse.Namespace, **more: Any) -> ServerConfig:
    """The ServerConfig of add_model_flags' flags (and `more` fields); the model folder and the
    door's timeouts (a bad OMNIVOICE_HEADER_TIMEOUT_S, say) checked before any model loads."""
    check_folder(args.model_dir)
    for name in door.TIMEOUTS:
        door.timeout(name)
    defaults = {name: getattr(args, name) for name in REQUEST_DEFAULT_FIELDS if getattr(args, name) is not None}
    return ServerConfig(
        model_dir=args.model_dir,
        voices_dir=args.voices,
        workers=args.workers,
        threads=args.threads,
        queue_size=args.queue,
        timeout_s=args.timeout,
        drain_s=args.drain_timeout,
        variant=args.variant,
        request_defaults=defaults,
        **more,
    )


def import_extras(command: str, packages: tuple[str, ...], fix: str) -> None:
    """Import an extra's `packages` now, before any model loads, so that one missing (named, with
    `fix`) or installed but broken (its own import fails: a wheel for another Python, a damaged
    install) is one line rather than a traceback at the first client."""
    for package in packages:
        try:
            importlib.import_module(package)
        except ModuleNotFoundError as exc:
            raise UserError(f"omnivoice-onnx {command} needs {exc.name}, which is not installed", fix) from None
        except Exception as exc:  # any failure of a third-party package's own import code
            raise UserError(
                f"omnivoice-onnx {command} needs {package}, which is installed but fails to import "
                f"({type(exc).__name__}: {str(exc)[:200]})",
                f"reinstall it (pip install --force-reinstall {package}), or {fix}",
            ) from None
