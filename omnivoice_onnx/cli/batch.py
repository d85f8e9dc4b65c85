"""omnivoice-onnx batch: synthesise upstream's JSONL test list, one exact WAV per line, resumable.

    omnivoice-onnx batch --test-list lines.jsonl --res-dir out/ --model-dir onnx
    omnivoice-onnx batch --test-list lines.jsonl --res-dir out/ --workers 2 --threads 1
    omnivoice-onnx batch --test-list lines.jsonl --res-dir out/ --ray            # a local Ray
    omnivoice-onnx batch --test-list lines.jsonl --res-dir out/ --ray auto       # the Ray cluster of this node

The list is upstream omnivoice-infer-batch's (one JSON object per line: id, text; ref_audio +
ref_text; instruct; language_id; duration; speed), plus `seed` and `voice`. Every line is checked
first; bad ones are listed with their line numbers and nothing runs (or --skip-bad runs the rest).
Writes res-dir/<id>.wav (16-bit PCM) and res-dir/results.jsonl; run the same command again after an
interruption (Ctrl-C, kill) and it does only what is left. A line without a seed gets its voice's
(a saved voice's or a preset's), else the first 8 bytes of sha256(id) >> 1, so every WAV is the
same bytes on any engine, worker count or order.
Upstream's underscore spellings (--test_list, --res_dir, --num_step, --lang_id, ...) are accepted.
Exit 1 when some lines failed while synthesising (each recorded with its error; the rest written).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from omnivoice_onnx.cli.flags import Subparsers, add_bundle_flags
from omnivoice_onnx.errors import say
from omnivoice_onnx.program import (
    CHUNK_SECONDS,
    EXIT_CHECK_FAILED,
    NUM_STEP,
    SCORE_FACTOR,
    T_SHIFT,
    TEMPERATURE,
    THREADS,
    int_range,
)

# Generation flags: upstream omnivoice-infer-batch's, (name, type, help). Unset ones keep the
# export's defaults (runtime-config.json: upstream's OmniVoiceGenerationConfig defaults).
GENERATION_FLAGS = (
    ("num_step", NUM_STEP, "unmasking steps"),
    ("guidance_scale", SCORE_FACTOR, "classifier-free guidance scale"),
    ("t_shift", T_SHIFT, "time-step shift (> 0)"),
    ("layer_penalty_factor", SCORE_FACTOR, "penalty per codebook layer"),
    ("position_temperature", TEMPERATURE, "Gumbel temperature of the cell choice"),
    ("class_temperature", TEMPERATURE, "Gumbel temperature of the token choice"),
    ("audio_chunk_duration", CHUNK_SECONDS, "seconds per chunk of a long text"),
    ("audio_chunk_threshold", CHUNK_SECONDS, "texts estimated longer than this (s) are chunked"),
)
BOOL_FLAGS = (
    ("denoise", "put <|denoise|> in a cloning prompt"),
    ("preprocess_prompt", "silence-trim the reference, punctuate its text"),
    ("postprocess_output", "shorten long pauses of the output"),
)


def str2bool(text: str) -> bool:
    """upstream's str2bool spellings: true/false, yes/no, 1/0 (any case)."""
    value = text.strip().lower()
    if value in ("true", "yes", "1", "t", "y"):
        return True
    if value in ("false", "no", "0", "f", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _flag(name: str) -> list[str]:
    """Both spellings of a flag: --num-step and upstream's --num_step."""
    return [f"--{name.replace('_', '-')}", f"--{name}"] if "_" in name else [f"--{name}"]


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "batch",
        help="synthesise a JSONL test list into a folder of WAVs (resumable)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        *_flag("test_list"),
        dest="test_list",
        type=Path,
        required=True,
        metavar="JSONL",
        help="the test list (upstream's format; relative ref_audio paths are against its folder)",
    )
    parser.add_argument(
        *_flag("res_dir"),
        dest="res_dir",
        type=Path,
        required=True,
        metavar="DIR",
        help="output folder: <id>.wav and results.jsonl (created if absent)",
    )
    add_bundle_flags(parser)
    parser.add_argument(
        *_flag("lang_id"),
        dest="lang_id",
        metavar="LANG",
        help="language for lines without language_id (a line's own language_id wins)",
    )
    parser.add_argument(
        "--workers",
        type=int_range(1),
        default=1,
        metavar="N",
        help="local worker processes (default 1: in this process), or Ray actors with --ray",
    )
    parser.add_argument(
        "--threads",
        type=THREADS,
        metavar="T",
        help="onnxruntime threads per worker (default: $OMNIVOICE_ORT_THREADS, else the "
        "usable cores divided by --workers)",
    )
    parser.add_argument(
        *_flag("skip_bad"),
        dest="skip_bad",
        action="store_true",
        help="run the good lines and record each bad one's reason in results.jsonl, instead of refusing to start",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run on Ray Data (pip install 'omnivoice-onnx[ray]'): alone, a local Ray; "
        "'auto' or ray://HOST:10001 for a cluster (the export must be at the same "
        "path on every node)",
    )
    group = parser.add_argument_group("generation (upstream's flags; default: the export's defaults)")
    for name, kind, text in GENERATION_FLAGS:
        group.add_argument(*_flag(name), dest=name, type=kind, help=text)
    for name, text in BOOL_FLAGS:
        group.add_argument(*_flag(name), dest=name, type=str2bool, metavar="BOOL", help=text)
    return parser


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every line has its WAV, 1 when some lines failed (each recorded in results.jsonl
    with its error; the others are written), 2 for bad input before any synthesis."""
    from omnivoice_onnx.batch.run import Options, run_batch  # onnxruntime loads here, not for --help

    names = [name for name, _, _ in GENERATION_FLAGS] + [name for name, _ in BOOL_FLAGS]
    options = Options(
        test_list=args.test_list,
        res_dir=args.res_dir,
        model_dir=args.model_dir,
        variant=args.variant,
        voices=args.voices,
        generation_config={n: getattr(args, n) for n in names if getattr(args, n) is not None},
        default_language=args.lang_id,
        workers=args.workers,
        threads=args.threads,
        skip_bad=args.skip_bad,
        ray=args.ray,
    )
    summary = run_batch(options)
    say(summary.text())
    return EXIT_CHECK_FAILED if summary.failed else 0
