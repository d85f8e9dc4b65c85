"""Conformance vectors: a fixed list of generate() cases, each written as one JSON trace that a
port (C#, mobile) replays step by step.

    python -m omnivoice_onnx.conformance --onnx-dir onnx --out conformance/

writes into --out:
    ref_voice.wav        the clone cases' reference: the "design-reference" case's output, as
                         16-bit PCM (an input file: ports read it, they never regenerate it)
    <case>.json          one per case (CASES), format FORMAT:
      export        the graphs' model fingerprint, sha256 of runtime-config.json and tokenizer.json
      request       generate()'s arguments (generation_config resolved to every field) and seed
      rng           the seed's first MT19937 words and float32 draws, and the words the whole call
                    drew (per step and item with k > 0: C*T*V for a class draw, C*T for a position draw)
      task          after preprocessing: per item target_len (the duration estimate), language,
                    instruct, reference transcript, rms and audio tokens (the encoder's codes)
      short_idx, long_idx, chunks   which items were chunked, and their chunk texts
      iterations    one per unmasking run (a batch): per item prompt ids (codebook 0 of the
                    style + text prompt), c_len, schedule, and the final tokens [C][T] with
                    unmask_step [C] strings: the step (one STEP_DIGITS character) at which each cell
                    was unmasked. Cells never change once unmasked, so step s unmasked exactly
                    the cells marked s and chose the final tokens there.
      outputs       per text: sample count, sha256 of the float32 little-endian samples, peak,
                    rms, and min/max per ENVELOPE_BLOCK samples (a port whose audio is within
                    a tolerance of ours has every block's min/max within it too)

What must match exactly and what within a tolerance: docs/runtime.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from omnivoice_onnx.api import OmniVoiceOnnx
from omnivoice_onnx.contract import FP32_VARIANT
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.generate import IterativeTrace, Trace
from omnivoice_onnx.prompt import RUNTIME_CONFIG_FILE, TOKENIZER_FILE
from omnivoice_onnx.rng import TorchCpuRng

FORMAT = "omnivoice-conformance/1"
REF_WAV = "ref_voice.wav"
STEP_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"  # step s -> STEP_DIGITS[s]
ENVELOPE_BLOCK = 480  # samples per envelope block: 20 ms at 24 kHz
RNG_PREVIEW = 8  # first words / float32 draws of the seed recorded
DESIGN_TEXT = "The quick brown fox jumps over the lazy dog."  # short: ref_voice.wav stays ~100 kB
LONG_TEXT = ("The first sentence sets the scene. A second one follows it closely, with a few more words. "
             "Then a third arrives; it is short. Finally, the fourth sentence ends this long text for good.")
# Chunking limits (seconds) lowered so that LONG_TEXT is chunked, and 8 steps to keep it small.
CHUNKED = {"audio_chunk_threshold": 3.0, "audio_chunk_duration": 2.0, "num_step": 8}

# name -> generate() keyword arguments. "ref_audio": REF_WAV means the file written by the
# "design-reference" case, which therefore comes first.
CASES: dict[str, dict[str, Any]] = {
    "design-reference": {"text": DESIGN_TEXT, "instruct": "female, low pitch", "language": "English", "seed": 1234},
    "auto-en": {"text": "Hello there, this is a test of the model.", "language": "en", "seed": 0},
    "design-zh-dialect": {"text": "你好，今天的天气非常好。", "instruct": "男，四川话", "language": "zh", "seed": 1},
    "clone-en": {"text": "Clone this voice now, thank you.", "ref_audio": REF_WAV, "ref_text": DESIGN_TEXT,
                 "seed": 2**32 + 5},
    "batch-scripts": {"text": ["こんにちは、元気ですか。", "안녕하세요, 만나서 반갑습니다.", "Привет, как дела?",
                               "नमस्ते, आप कैसे हैं?"], "language": ["ja", "ko", "Russian", "hi"],
                      "instruct": [None, "female", None, "male, elderly"], "seed": 7},
    "class-temperature": {"text": "Sampling the classes as well.", "instruct": "male, high pitch",
                          "generation_config": {"class_temperature": 1.0, "num_step": 16}, "seed": 11},
    "speed-duration-clone": {"text": ["Faster, please.", "Exactly two seconds."], "speed": 1.3,
                             "duration": [None, 2.0], "ref_audio": REF_WAV, "ref_text": DESIGN_TEXT,
                             "generation_config": {"num_step": 16, "guidance_scale": 0.0}, "seed": 12},
    "chunked-auto": {"text": LONG_TEXT, "generation_config": CHUNKED, "seed": 5},
    "chunked-clone": {"text": ["Short.", LONG_TEXT], "ref_audio": REF_WAV, "ref_text": DESIGN_TEXT,
                      "generation_config": CHUNKED, "seed": 6},
}


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def audio_summary(audio: np.ndarray) -> dict[str, Any]:
    """Sample count, exact hash and tolerance-friendly statistics of one output [T] float32."""
    samples = np.asarray(audio, dtype=np.float32)
    blocks = [samples[i:i + ENVELOPE_BLOCK] for i in range(0, samples.size, ENVELOPE_BLOCK)]
    return {
        "samples": int(samples.size),
        "sha256_f32le": hashlib.sha256(samples.astype("<f4").tobytes()).hexdigest(),
        "peak": float(np.abs(samples).max()) if samples.size else 0.0,
        "rms": float(np.sqrt(np.mean(samples.astype(np.float64) ** 2))) if samples.size else 0.0,
        "envelope_block": ENVELOPE_BLOCK,
        "envelope_min": [round(float(b.min()), 6) for b in blocks],
        "envelope_max": [round(float(b.max()), 6) for b in blocks],
    }


def unmask_steps(iteration: IterativeTrace, item: int) -> list[str]:
    """Per codebook, a string with each frame's unmasking step as a STEP_DIGITS character."""
    codebooks, frames = iteration.tokens[item].shape
    grid = np.full(codebooks * frames, -1, dtype=np.int64)
    for step, step_cells in enumerate(iteration.cells):
        grid[step_cells[item]] = step
    if grid.min() < 0 or grid.max() >= len(STEP_DIGITS):
        raise ValueError(f"cannot encode unmask steps 0..{grid.max()} (a cell never unmasked, or > 62 steps)")
    return ["".join(STEP_DIGITS[s] for s in row) for row in grid.reshape(codebooks, frames)]


def iteration_record(iteration: IterativeTrace) -> dict[str, Any]:
    return {
        "texts": iteration.texts, "ref_texts": iteration.ref_texts, "target_lens": iteration.target_lens,
        "c_lens": iteration.c_lens, "ref_frames": iteration.ref_frames, "prompt_ids": iteration.prompt_ids,
        "schedules": iteration.schedules,
        "items": [{"unmask_step": unmask_steps(iteration, i), "tokens": iteration.tokens[i].tolist()}
                  for i in range(len(iteration.texts))],
    }


def run_case(tts: OmniVoiceOnnx, name: str, case: dict[str, Any], folder: Path) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Generate one case (ref_audio names a file in `folder`) -> (its JSON record, its audio)."""
    kwargs = {key: value for key, value in case.items() if key != "seed"}
    if kwargs.get("ref_audio") is not None:
        kwargs["ref_audio"] = str(folder / kwargs["ref_audio"])
    trace = Trace()
    audios = tts.generate(**kwargs, seed=case["seed"], trace=trace)
    preview = TorchCpuRng(case["seed"])
    words = preview.words(RNG_PREVIEW)
    task = trace.task
    record = {
        "format": FORMAT,
        "case": name,
        "export": {"model_fingerprint": tts.metadata["model_fingerprint"],
                   "runtime_config_sha256": sha256_file(tts.onnx_dir / RUNTIME_CONFIG_FILE),
                   "tokenizer_sha256": sha256_file(tts.onnx_dir / TOKENIZER_FILE)},
        "request": {**case, "generation_config": asdict(tts.generation_config(case.get("generation_config")))},
        "rng": {"seed": case["seed"], "first_words": words.tolist(),
                "first_floats": [float(x) for x in TorchCpuRng(case["seed"]).rand(RNG_PREVIEW)],
                "words_drawn": trace.words_drawn},
        "task": {"texts": task.texts, "target_lens": task.target_lens, "langs": task.langs,
                 "instructs": task.instructs, "ref_texts": task.ref_texts, "ref_rms": task.ref_rms,
                 "speed": task.speed,
                 "ref_audio_tokens": [t.tolist() if t is not None else None for t in task.ref_audio_tokens]},
        "short_idx": trace.short_idx, "long_idx": trace.long_idx,
        "chunks": {str(item): chunks for item, chunks in trace.chunks.items()},
        "iterations": [iteration_record(it) for it in trace.iterations],
        "outputs": [audio_summary(a) for a in audios],
    }
    return record, audios


def write_vectors(onnx_dir: Path, out: Path, threads: int | None = None) -> list[Path]:
    """Run every case of CASES on the export at `onnx_dir`; write ref_voice.wav and one JSON each."""
    tts = OmniVoiceOnnx.from_dir(onnx_dir, threads=threads, variant=FP32_VARIANT)  # the reference graph
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, case in CASES.items():
        record, audios = run_case(tts, name, case, out)
        if name == "design-reference":
            sf.write(out / REF_WAV, audios[0], tts.sample_rate, subtype="PCM_16")
            written.append(out / REF_WAV)
        path = out / f"{name}.json"
        path.write_text(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
        written.append(path)
        print(f"{path}  {path.stat().st_size / 1024:.0f} kB  {len(record['iterations'])} run(s), "
              f"target_lens {record['task']['target_lens']}")
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onnx-dir", type=Path, default=Path("onnx"), help="the export folder")
    parser.add_argument("--out", type=Path, required=True, help="folder for ref_voice.wav and the JSON vectors")
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    args = parser.parse_args(argv)
    try:
        write_vectors(args.onnx_dir, args.out, args.threads)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
