#!/usr/bin/env python3
"""Step 0: make a matched voice-clone reference (capture/ref_voice.wav + capture/ref_voice.txt).

Voice cloning conditions on (ref_audio, ref_text) and expects them to correspond; a mismatched
transcript derails the diffusion into quiet or unintelligible output. So the model itself speaks
a known transcript in voice-design mode with a fixed seed, and the pair is saved:

    capture/ref_voice.wav   24 kHz mono float WAV, what the model said
    capture/ref_voice.txt   the transcript it was asked to say

The same command twice gives bit-identical files on the same machine and device.

    python make_reference.py --model tiny
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from omnivoice_export.common.edge import DEFAULT_CAPTURE_DIR
from omnivoice_export.step0_checkpoints.checkpoints import (
    add_model_arg,
    load_omnivoice,
    model_fingerprint,
    resolve_model,
)
from omnivoice_export.step1_capture.capture import REF_TXT, REF_WAV
from omnivoice_export.step1_capture.generation import (
    DEFAULT_SEED,
    REFERENCE_INSTRUCT,
    REFERENCE_TEXT,
    GenerationRequest,
    run_generate,
    write_wav,
)
from omnivoice_onnx.contract import SAMPLE_RATE
from omnivoice_onnx.files import atomic_path, check_output
from omnivoice_onnx.program import NUM_STEP, SEED, parse, run_main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_arg(parser)
    parser.add_argument("--text", default=REFERENCE_TEXT, help="the transcript the model speaks")
    parser.add_argument(
        "--instruct",
        default=REFERENCE_INSTRUCT,
        help="voice-design instruct (upstream's items, e.g. 'male, low pitch')",
    )
    parser.add_argument("--seed", type=SEED, default=DEFAULT_SEED, help="torch seed for generate()")
    parser.add_argument("--num-step", type=NUM_STEP, default=32, help="unmasking steps of generate()")
    parser.add_argument(
        "--out-dir", type=Path, default=DEFAULT_CAPTURE_DIR, help="where ref_voice.wav and ref_voice.txt are written"
    )
    return parse(parser, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_output(args.out_dir, "--out-dir", "dir")
    model_path = resolve_model(args.model)
    print(f"[step 0] model {model_path} ({model_fingerprint(model_path)})", flush=True)
    model = load_omnivoice(model_path)
    request = GenerationRequest(
        mode="design", text=args.text, seed=args.seed, instruct=args.instruct, num_step=args.num_step
    )
    started = time.perf_counter()
    audio = run_generate(model, request)
    write_wav(args.out_dir / REF_WAV, audio)
    with atomic_path(args.out_dir / REF_TXT) as tmp:
        tmp.write_text(args.text.strip() + "\n")
    print(
        f"[step 0] {args.out_dir / REF_WAV}: {audio.size / SAMPLE_RATE:.2f} s in "
        f"{time.perf_counter() - started:.1f} s; transcript -> {args.out_dir / REF_TXT}"
    )


if __name__ == "__main__":
    run_main(main)
