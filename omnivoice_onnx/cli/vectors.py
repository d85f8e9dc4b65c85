"""Write or replay the conformance vectors (omnivoice_onnx.vectors) on an export's reference graph.

    python -m omnivoice_onnx.cli.vectors --onnx-dir onnx --out vectors/     # write the vectors
    python -m omnivoice_onnx.cli.vectors --onnx-dir onnx --check vectors/   # replay them here

--out is written whole: the vectors go to a temporary folder beside it, which replaces --out only
when every case is written (a full disk, Ctrl-C or SIGTERM leave --out as it was, and one line).
--check replays every vector in the folder against this runtime and prints, per case, the first
difference in the replay's order (vectors.compare; exit 1 when any case differs).

The folder's files, every field and the arithmetic of its numbers: docs/vectors.md; what must
match exactly and what within a tolerance: docs/runtime.md and the folder's README.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from omnivoice_onnx.bundle import check_folder
from omnivoice_onnx.cli.flags import add_bundle_flags
from omnivoice_onnx.errors import UserError, say
from omnivoice_onnx.files import check_output
from omnivoice_onnx.program import THREADS, CheckFailed, parse, run_main
from omnivoice_onnx.vectors.format import COMMAND
from omnivoice_onnx.vectors.record import check_vectors, write_vectors


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # The reference graph (fp32) is always the one replayed: no --variant. --onnx-dir: its older spelling.
    add_bundle_flags(parser, variant=False, voices=False, model_aliases=("--onnx-dir",), hub=False)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, help="folder to (re)write whole: references, vectors, README.md")
    mode.add_argument("--check", type=Path, help="folder of vectors to replay against this runtime")
    parser.add_argument("--threads", type=THREADS, default=None, help="onnxruntime intra-op threads (>= 1)")
    args = parse(parser, argv)
    if args.out is not None:
        check_output(args.out, "--out", "tree")  # before the model loads: a refusal costs nothing
        check_folder(args.model_dir)
        write_vectors(args.model_dir, args.out, args.threads)
        return
    if not args.check.is_dir() or not any(args.check.glob("*.json")):
        raise UserError(
            f"--check {args.check}: no vectors (*.json) there",
            "pass the folder `--out` wrote (tests/conformance holds the tiny checkpoint's)",
        )
    check_folder(args.model_dir)
    results = check_vectors(args.model_dir, args.check, args.threads)
    failed = sorted(name for name, problems in results.items() if problems)
    say(f"OVERALL: {'PASS' if not failed else 'FAIL'} ({len(results) - len(failed)}/{len(results)} cases conform)")
    if failed:
        raise CheckFailed(f"{len(failed)} case(s) differ: {', '.join(failed)}")


if __name__ == "__main__":
    run_main(main, prog=COMMAND)
