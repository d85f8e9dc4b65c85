#!/usr/bin/env python3
"""Step 1: record the real, deterministic I/O of the three modules during generate().

Runs the upstream OmniVoice.generate() (seeded: the gumbel position noise and any sampling
included) in all three modes, with the transformer forward, audio_tokenizer.encode and
audio_tokenizer.decode wrapped by a recorder that copies what they see:

    clone   voice clone from capture/ref_voice.wav + ref_voice.txt (step 0)
    design  voice design from an instruct
    auto    neither; the model picks a voice
    batch   voice design of two texts of different lengths in one generate() call, as upstream
            batches a list: 2B = 4 transformer rows, the shorter item's padded

Per mode, under capture/<mode>/: the transformer's inputs and the logits rows generate() reads at
every step (--steps picks a subset), the token state after each step and the final tokens, the
encoder's audio and codes, the decoder's codes and audio, the final WAV. capture/manifest.json
records the model fingerprint, versions, device, seeds, generation config, texts, tensor
shapes/dtypes and a sha256 per file. Two captures on the same machine and device are
bit-identical. On CUDA the reference is full fp32: TF32 is switched off for matmuls and cuDNN
convolutions (torch leaves cuDNN's on by default), and the manifest records the settings. The
previous capture is replaced only once the new one is complete.

Clone mode checks ref_voice.wav before loading the model: missing, empty, unreadable or silent
is an error; another sample rate or several channels are resampled/averaged as upstream does
(a note says so); longer than 20 s gets upstream's warning.

    python capture_reference.py --model tiny
    python capture_reference.py --model full-random --steps 0,15,31
"""

from __future__ import annotations

import argparse
import time

from tqdm import tqdm

from omnivoice_export.common.edge import add_capture_dir, parse_subset
from omnivoice_export.step0_checkpoints.checkpoints import (
    add_model_arg,
    load_omnivoice,
    model_fingerprint,
    resolve_model,
)
from omnivoice_export.step1_capture import capture
from omnivoice_export.step1_capture.capture import REF_TXT, REF_WAV
from omnivoice_export.step1_capture.generation import (
    DEFAULT_SEED,
    check_reference_audio,
    generate_waveforms,
    mode_request,
    write_wav,
)
from omnivoice_export.step2_export.report import package_versions
from omnivoice_onnx.contract import SAMPLE_RATE
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import atomic_dir, check_output
from omnivoice_onnx.hashing import file_entry
from omnivoice_onnx.program import NUM_STEP, SEED, parse, run_main


def parse_steps(text: str, num_step: int) -> set[int] | None:
    """'all' -> None (every step); '0,15,31' -> {0, 15, 31}, each within [0, num_step)."""
    if text == "all":
        return None
    try:
        steps = {int(part) for part in text.split(",") if part.strip()}
    except ValueError as exc:
        raise UserError(
            f"--steps {text!r} is not 'all' or a comma-separated list of integers", "pass all, or steps such as 0,15,31"
        ) from exc
    if not steps or min(steps) < 0 or max(steps) >= num_step:
        raise UserError(
            f"--steps {text!r} must name steps in 0..{num_step - 1}", f"pass all, or steps below --num-step {num_step}"
        )
    return steps


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_arg(parser)
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="device of the PyTorch reference; validate ONNX against a capture made on the "
        "same device (RVQ codes flip between devices)",
    )
    parser.add_argument("--steps", default="all", help="transformer calls to record: 'all' or e.g. '0,15,31'")
    parser.add_argument(
        "--modes", default=",".join(capture.MODES), help=f"comma-separated subset of {','.join(capture.MODES)}"
    )
    parser.add_argument("--seed", type=SEED, default=DEFAULT_SEED, help="torch seed before each generate()")
    parser.add_argument("--num-step", type=NUM_STEP, default=32, help="unmasking steps of generate()")
    add_capture_dir(parser, "where the capture is written")
    return parse(parser, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    modes = parse_subset(args.modes, "--modes", capture.MODES)
    steps = parse_steps(args.steps, args.num_step)
    check_output(args.capture_dir, "--capture-dir", "tree")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError(
                "--device cuda was requested but torch sees no CUDA device",
                "use --device cpu, or install requirements-gpu.txt on a machine with an NVIDIA GPU",
            )
    ref_wav, ref_txt = args.capture_dir / REF_WAV, args.capture_dir / REF_TXT
    if "clone" in modes and not (ref_wav.is_file() and ref_txt.is_file()):
        raise UserError(f"clone mode needs {ref_wav} and {ref_txt}", "run make_reference.py (step 0) first")
    ref_text = None
    if "clone" in modes:
        try:
            ref_text = ref_txt.read_text().strip()
        except UnicodeDecodeError as exc:
            raise UserError(f"{ref_txt} is not UTF-8 text", "re-run make_reference.py (step 0)") from exc
        if not ref_text:
            raise UserError(f"{ref_txt} is empty", "re-run make_reference.py (step 0)")
        check_reference_audio(ref_wav)

    model_path = resolve_model(args.model)
    fingerprint = model_fingerprint(model_path)
    print(f"[step 1] model {model_path} ({fingerprint}), device {args.device}", flush=True)
    model = load_omnivoice(model_path).to(args.device)
    if args.device == "cuda":
        model.audio_tokenizer.to("cuda")

    with atomic_dir(args.capture_dir) as tmp, capture.full_fp32() as precision:
        manifest_modes = {}
        for mode in modes:
            request = mode_request(mode, args.seed, args.num_step, ref_wav, ref_text)
            print(f"[step 1] {mode}: {request.text!r}", flush=True)
            started = time.perf_counter()
            with tqdm(total=args.num_step, desc=f"  {mode} steps", unit="step", leave=False) as bar:
                recorder = capture.Recorder(model, tmp / mode, steps, progress=bar)
                with recorder.active():
                    audios = generate_waveforms(model, request)
                record = recorder.finish()
            for index, audio in enumerate(audios):
                name = capture.item_file(capture.OUTPUT_WAV, index, len(audios))
                write_wav(tmp / mode / name, audio)
                record.files[name] = file_entry(tmp / mode / name)
            manifest_modes[mode] = capture.mode_record_entry(record, request.to_dict())
            size = sum(f["bytes"] for f in record.files.values())
            seconds = " + ".join(f"{audio.size / SAMPLE_RATE:.2f}" for audio in audios)
            print(
                f"[step 1] {mode}: S={record.seq_len} rows={record.rows} {record.steps_called} steps, "
                f"{seconds} s audio, {size / 1e6:.1f} MB in {time.perf_counter() - started:.1f} s",
                flush=True,
            )
        for name in (REF_WAV, REF_TXT):
            if (args.capture_dir / name).is_file():
                (tmp / name).write_bytes((args.capture_dir / name).read_bytes())
        manifest = capture.write_manifest(
            tmp,
            model={"spec": args.model or str(model_path), "path": str(model_path), "fingerprint": fingerprint},
            device=args.device,
            precision=precision,
            versions=package_versions(),
            seed=args.seed,
            num_step=args.num_step,
            steps=steps,
            modes=manifest_modes,
        )
    print(f"[step 1] capture complete: {args.capture_dir} ({manifest['total_bytes'] / 1e6:.1f} MB)")


if __name__ == "__main__":
    run_main(main)
