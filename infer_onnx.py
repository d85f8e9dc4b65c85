#!/usr/bin/env python3
"""Step 4: the ONNX graphs as drop-in replacements inside the real generate(), token-exact.

Compare mode (default): for each mode of the capture (same texts, seeds and generation config),
upstream's OmniVoice.generate() runs with the transformer forward, audio_tokenizer.encode and
audio_tokenizer.decode served by onnxruntime, and is compared with the PyTorch reference:

    final tokens     exact-match rate overall and per codebook; the first step at which the
                     token state diverges, if it does
    output WAV       log-spectral L1 against the reference WAV, and duration equality

It writes capture/onnx_<mode>.wav and capture/onnx_<mode>_spectrogram.png (PyTorch | ONNX |
difference; per item i of the batch mode: onnx_batch_<i>.wav, onnx_batch_spectrogram_<i>.png),
prints a summary table with the wall time of PyTorch and ONNX generate() measured
in the same run (informational), and merges the results into onnx/export-report.json under
end_to_end.<provider>. Exit code 1 when tokens differ. It replays the capture's requests, so it
refuses a --seed or --num-step other than the capture's, a capture re-made after the export, and a
ref_voice.wav re-made after the capture (exit 2), rather than compare different runs.

--variant NAME runs a transformer variant of step 5 (quantize_omnivoice.py) with the export's fp32
codec graphs, or the variant's own where it carries them (fp16) (files capture/onnx_<variant>_<mode>.*,
results under variants.<name>.end_to_end in
the report). A quantized variant is measured, never judged (exit 0 whatever its tokens); an fp32
variant (fp32-unmasked) gets the fp32 verdict.

Compare mode also runs the torch-free runtime (omnivoice_onnx.OmniVoiceOnnx) on each capture
request and reports its final tokens against PyTorch's under end_to_end.<provider>.runtime: an
fp32 verdict (100 % of tokens equal, exit 1 otherwise), a measurement for a quantized variant.

Synthesis mode (--text): speak any text with the torch-free runtime, omnivoice_onnx, which
needs no torch, transformers, omnivoice or pydub: they are never imported on this path, and the
export folder (graphs, tokenizer.json, runtime-config.json) is all it reads. A given --seed gives
what upstream PyTorch generate() gives after torch.manual_seed(seed) on CPU. The graphs are
checked against the export report first (sha256, metadata); the transformer is the --variant
named, else fp32-fused when step 5 made it for this export (the faithful graph's logits, faster),
else the faithful graph, and a variant is checked by its own metadata (variant name, model).
Long text is split into chunks as upstream does. A reference WAV at another rate or with several
channels is resampled/averaged (a note says so); an unknown --language is an error ('None'
selects upstream's language-agnostic mode). It writes with the runtime's audio writer
(omnivoice_onnx.audio_out, which `omnivoice-onnx speak` uses too): --out's extension picks 16-bit
PCM WAV, FLAC or raw PCM, '-' is stdout, and the file is written atomically. In a venv with the
runtime alone (requirements-runtime.txt, or `pip install .`), --text works and compare mode says
in one line which install it needs; `omnivoice-onnx speak` is the same synthesis with every flag.

    python infer_onnx.py
    python infer_onnx.py --text "Hello there." --out hello.wav
    python infer_onnx.py --text "Hello." --ref-audio capture/ref_voice.wav --ref-text "..." --out clone.wav
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omnivoice_export.common.edge import add_capture_dir, add_onnx_dir
from omnivoice_export.step1_capture.generation import DEFAULT_SEED, LANGUAGE, GenerationRequest, check_reference_audio
from omnivoice_export.step2_export import report
from omnivoice_onnx import OmniVoiceOnnx, audio_out
from omnivoice_onnx.bundle import Bundle
from omnivoice_onnx.contract import FP32_VARIANT
from omnivoice_onnx.core.instruct import instruct_use_zh, resolve_instruct
from omnivoice_onnx.core.prompt import resolve_language
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import check_input_dir
from omnivoice_onnx.program import NUM_STEP, SEED, THREADS, parse, run_main
from omnivoice_onnx.runtime_config import load_runtime_config
from omnivoice_onnx.sessions import PROVIDERS, check_provider

# What compare mode imports beyond the runtime (requirements.txt); synthesis (--text) needs none of them.
TOOLCHAIN_MODULES = ("torch", "torchaudio", "transformers", "omnivoice", "pydub", "onnx", "accelerate", "onnxscript")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--provider", default="cpu", help=f"one of {', '.join(PROVIDERS)}")
    add_capture_dir(parser, "step 1's capture")
    add_onnx_dir(parser, "step 2's export")
    parser.add_argument(
        "--model",
        default=None,
        help="compare mode: checkpoint for upstream's generate() (tiny | full-random | PATH | Hugging "
        "Face repo id); default: the one named in the export report",
    )
    parser.add_argument(
        "--threads", type=THREADS, default=None, help="onnxruntime intra-op threads (default: all cores)"
    )
    parser.add_argument(
        "--no-split",
        action="store_true",
        help="compare mode: run cond and uncond rows as one padded transformer call (upstream's "
        "layout) instead of each at its own length",
    )
    parser.add_argument(
        "--variant",
        default=None,
        help="run a transformer variant made by quantize_omnivoice.py (int8, int4-b32, fp32-fused, ...) "
        "with the export's fp32 codec graphs; compare mode then reports a quantized variant as "
        "measurements under variants.<name> in the report, not as a verdict. Default: compare "
        "mode the faithful fp32 graph; --text fp32-fused when the export holds it, else fp32",
    )
    parser.add_argument(
        "--no-torch-timing", action="store_true", help="compare mode: skip the PyTorch generate() timing run"
    )
    synth = parser.add_argument_group("synthesis mode (needs no capture, no PyTorch)")
    synth.add_argument("--text", default=None, help="text to speak; selects synthesis mode")
    synth.add_argument(
        "--out",
        type=Path,
        default=Path("out.wav"),
        help="output audio: .wav (16-bit PCM, 24 kHz), .flac or .pcm (raw s16le); '-' for stdout",
    )
    synth.add_argument("--ref-audio", type=Path, default=None, help="voice clone: reference WAV")
    synth.add_argument("--ref-text", default=None, help="voice clone: transcript of --ref-audio")
    synth.add_argument("--instruct", default=None, help="voice design: e.g. 'female, low pitch, british accent'")
    synth.add_argument("--language", default=None, help=f"language name or id, or 'None' (default: {LANGUAGE})")
    # None = not given: compare mode then takes the capture's, and refuses a different value.
    synth.add_argument(
        "--seed",
        type=SEED,
        default=None,
        help=f"torch seed before generate() (default: {DEFAULT_SEED}; compare mode: the capture's)",
    )
    synth.add_argument(
        "--num-step",
        type=NUM_STEP,
        default=None,
        help=f"unmasking steps (default: {GenerationRequest.num_step}; compare mode: the capture's)",
    )
    return parse(parser, argv)


def check_synthesis_flags(args: argparse.Namespace) -> None:
    """Synthesis's own checks, before any work (after --out's): text, reference, flags of compare mode only."""
    if not args.text.strip():
        raise UserError("--text is empty", "pass the text to speak")
    if (args.ref_audio is None) != (args.ref_text is None):
        raise UserError("voice clone needs both --ref-audio and --ref-text")
    if args.ref_text is not None and not args.ref_text.strip():
        raise UserError("--ref-text is empty", "pass the transcript of --ref-audio")
    # The runtime reads the export folder alone and always runs cond and uncond rows at their own lengths.
    given = [flag for flag, value in (("--model", args.model), ("--no-split", args.no_split)) if value]
    if given:
        raise UserError(
            f"{', '.join(given)} only apply to compare mode (synthesis reads the export folder alone, split)",
            f"drop {', '.join(given)}",
        )


def synthesize(args: argparse.Namespace) -> None:
    """Speak --text with omnivoice_onnx.OmniVoiceOnnx: numpy + onnxruntime, no torch."""
    fmt = audio_out.check_destination(args.out, None, "--out")
    check_synthesis_flags(args)
    check_input_dir(args.onnx_dir, "--model-dir")
    if args.ref_audio is not None:
        check_reference_audio(args.ref_audio)
    language = LANGUAGE if args.language is None else args.language
    # The runtime checks these in generate(); checked here too, before minutes of graph loading.
    config = load_runtime_config(args.onnx_dir / "runtime-config.json")
    resolve_language(language, config["languages"])
    resolve_instruct(args.instruct, instruct_use_zh(args.text, config["instruct"]), config["instruct"])
    export = report.load_report(args.onnx_dir)
    variant = Bundle.open(args.onnx_dir, args.variant, verify=False, provider=args.provider).variant
    # A variant's transformer is checked by the runtime (its metadata names the variant and the
    # codecs' model): the report's sha256 check of variants (quantize.verify_variant) imports torch.
    report.verify_graphs(
        args.onnx_dir,
        export,
        ["transformer", "encoder", "decoder"] if variant == FP32_VARIANT else ["encoder", "decoder"],
    )
    mode = "clone" if args.ref_audio else "design" if args.instruct else "auto"
    tts = OmniVoiceOnnx.from_dir(args.onnx_dir, provider=args.provider, threads=args.threads, variant=variant)
    num_step = GenerationRequest.num_step if args.num_step is None else args.num_step
    kwargs = {
        "language": language,
        "ref_text": args.ref_text,
        "instruct": args.instruct,
        "ref_audio": None if args.ref_audio is None else str(args.ref_audio),
        "generation_config": {"num_step": num_step},
    }
    req = tts.validate(args.text, **kwargs, seed=DEFAULT_SEED if args.seed is None else args.seed)
    # The runtime command's audio writer: atomic, closed on success, aborted (nothing left) on an error.
    with audio_out.open_output(args.out, fmt, tts.sample_rate, what="--out") as sink:
        (audio,) = tts.generate(req)
        sink.write(audio)
    print(
        f"[synthesis] {mode}: {sink.frames / tts.sample_rate:.2f} s of audio -> {args.out} "
        f"(omnivoice_onnx, transformer {variant}, no PyTorch)",
        file=sys.stderr if str(args.out) == "-" else sys.stdout,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_provider(args.provider)
    if args.text is not None:
        synthesize(args)
    else:
        try:
            from omnivoice_export.step34_proof.end_to_end import compare  # torch and omnivoice: compare mode only
        except ImportError as exc:
            # Not installed; or, for onnx, the export folder onnx/ in the repository taken as an empty
            # namespace package (`cannot import name 'helper' from 'onnx' (unknown location)`).
            if exc.name is None or exc.name.split(".")[0] not in TOOLCHAIN_MODULES:
                raise
            raise UserError(
                f"compare mode needs the toolchain, and {exc.name} is not installed",
                "pip install --no-deps -r requirements.txt (make venv), or speak with --text "
                "(or omnivoice-onnx speak), which needs the runtime only",
            ) from exc
        compare(args)


if __name__ == "__main__":
    run_main(main)
