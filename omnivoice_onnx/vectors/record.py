"""The vectors as this runtime records them: each case of vectors.cases run on the reference graph
and written as one JSON trace that a port (C#, Node, mobile) replays stage by stage
(write_vectors), and the replay that checks a folder of them (check_vectors: each case run again
here, then vectors.compare). The command line: omnivoice_onnx.cli.vectors.

write_vectors writes its folder whole: the vectors go to a temporary folder beside it, which
replaces it only when every case is written (a full disk, Ctrl-C or SIGTERM leave it as it was).

The folder holds (FORMAT "omnivoice-conformance/3"; 3 adds the decoded files and post_process
records, and marks what is exact everywhere: COMPARE_ORDER's "bits" and "exact" kinds):
    README.md            what the files are and the order to compare them in (FOLDER_README)
    ref_voice.wav        the "design-reference" case's output, 24 kHz mono 16-bit PCM
    ref_quiet_44k_stereo.wav  ref_voice.wav's first 1.2 s at 44.1 kHz, stereo, quiet (RMS 0.03), with
                         0.3 s of silence before, 0.7 s inside and 0.5 s after the speech: the reference
                         path's resampling, channel mean, RMS boost, silence trimming, output rescale
    ref_16k.wav          ref_voice.wav at 16 kHz mono: resampling up
    decoded_with_silences.wav  stretches of ref_voice.wav between long silences (SILENCES_LAYOUT_MS):
                         the input of the post_process vectors
    <case>.decoded<i>.flac  output i's decoded audio at 16 bits: the input of its post_process record
    <case>.json          one per case of CASES ("kind": "generate"):
      format, case
      export        the graphs' model fingerprint, sha256 of runtime-config.json and tokenizer.json
      request       generate()'s arguments (generation_config resolved to every field); the seed
                    as a decimal STRING (seeds >= 2**53 and negative ones stay exact in readers that
                    parse JSON numbers as doubles)
      rng           the seed (string), its first MT19937 words and float32 draws, and the words
                    the whole call drew (per step and item with k > 0: C*T*V for a class draw, C*T
                    for a position draw)
      references    per reference file of the request: its rate, channels and frames; `loaded`
                    (mono at 24 kHz, before anything else), ref_rms (the RMS before the boost, as
                    a JSON double), `prepared` (what the encoder gets: boosted, silence-trimmed,
                    clipped to a multiple of 960), each an audio summary
      task          after preprocessing: per item target_len (the duration estimate), language,
                    instruct, reference transcript, rms and audio tokens (the encoder's codes)
      durations     per item: text_weight, ref_weight, ref_frames (the reference's or the
                    fallback's) and estimate, the float before speed, int() and the 1-frame floor
      short_idx, long_idx, chunks   which items were chunked, and their chunk texts
      iterations    one per unmasking run (a batch): per item prompt ids (codebook 0 of the
                    style + text prompt), c_len, schedule, and the final tokens [C][T] with
                    unmask_step [C] strings: the step (one STEP_DIGITS character) at which each cell
                    was unmasked. Cells never change once unmasked, so step s unmasked exactly
                    the cells marked s and chose the final tokens there.
      outputs       per text: the final audio's summary, with `stages`: `decoded` (the decoder's
                    audio, chunks cross-faded) and `silence_removed` (after the output's silence
                    removal; absent when postprocess_output is off), and `post_process`: the
                    post-processing of <case>.decoded<i>.flac with this request's settings (input,
                    input_audio, ref_rms, postprocess_output, pad/fade durations, silence_removed,
                    output), exact on any machine while the decoder's own audio is not
    An audio summary: sample count, sha256 of the float32 little-endian samples, peak, rms, and
    min/max per ENVELOPE_BLOCK samples (a port whose audio is within a tolerance of ours has every
    block's min/max within it too).

    <name>.json          one per POST_PROCESS_CASES entry ("kind": "post_process"): `input` (the
                         file's summary) and per run its settings (ref_rms, postprocess_output,
                         pad_duration, fade_duration), `silence_removed` and `output` summaries

What must match exactly and what within a tolerance: docs/runtime.md, and FOLDER_README. The
format as a port reads it (every field, the arithmetic of the numbers): docs/vectors.md.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from omnivoice_onnx.api import OmniVoiceOnnx
from omnivoice_onnx.contract import FP32_VARIANT
from omnivoice_onnx.core import audio, duration, scoring
from omnivoice_onnx.core.generate import IterativeTrace, Trace, decode
from omnivoice_onnx.core.rng import TorchCpuRng
from omnivoice_onnx.errors import say
from omnivoice_onnx.files import atomic_dir
from omnivoice_onnx.hashing import sha256_file
from omnivoice_onnx.reading import Maybe, read_json
from omnivoice_onnx.vectors.cases import (
    CASES,
    POST_PROCESS_CASES,
    README,
    SCORING_CASE,
    SCORING_GUIDANCE,
    SCORING_SCALES,
    SCORING_SEED,
    SILENCES_WAV,
    decoded_file,
    write_references,
)
from omnivoice_onnx.vectors.compare import compare_records
from omnivoice_onnx.vectors.format import COMMAND, FOLDER_README, FORMAT, audio_summary
from omnivoice_onnx.vectors.rules import RULES_CASE, check_rules, rules_record
from omnivoice_onnx.verified import stat_identity

STEP_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"  # step s -> STEP_DIGITS[s]
RNG_PREVIEW = 8  # first words / float32 draws of the seed recorded


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
        "texts": iteration.texts,
        "ref_texts": iteration.ref_texts,
        "target_lens": iteration.target_lens,
        "c_lens": iteration.c_lens,
        "ref_frames": iteration.ref_frames,
        "prompt_ids": iteration.prompt_ids,
        "schedules": iteration.schedules,
        "items": [
            {"unmask_step": unmask_steps(iteration, i), "tokens": iteration.tokens[i].tolist()}
            for i in range(len(iteration.texts))
        ],
    }


def reference_record(tts: OmniVoiceOnnx, path: Path, preprocess: bool) -> dict[str, Any]:
    """A reference file as the clone path prepares it (audio.load_reference, audio.prepare_reference)."""
    info = sf.info(str(path))
    loaded = audio.load_reference(str(path), tts.sample_rate, tts.runtime_config["audio"])
    prepared, ref_rms = audio.prepare_reference(
        loaded, tts.sample_rate, tts.model.hop_length, tts.runtime_config["audio"], preprocess=preprocess
    )
    return {
        "file": path.name,
        "sample_rate": info.samplerate,
        "channels": info.channels,
        "frames": info.frames,
        "loaded": audio_summary(loaded[0]),
        "ref_rms": ref_rms,
        "prepared": audio_summary(prepared[0]),
    }


def duration_records(task: Any, rules: dict[str, Any]) -> list[dict[str, Any]]:
    """Per item, the doubles the duration estimate is made of (duration.rate_reference, text_weight,
    estimate_duration): the speaking rate's reference and the estimate before speed and int()."""
    records = []
    for text, ref_text, tokens in zip(task.texts, task.ref_texts, task.ref_audio_tokens):
        rate_text, rate_frames = duration.rate_reference(
            ref_text, tokens.shape[-1] if tokens is not None else None, rules
        )
        records.append(
            {
                "text_weight": duration.text_weight(text, rules),
                "ref_weight": duration.text_weight(rate_text, rules),
                "ref_frames": rate_frames,
                "estimate": duration.estimate_duration(text, rate_text, rate_frames, rules),
            }
        )
    return records


def output_record(
    tts: OmniVoiceOnnx,
    result: Any,
    final: np.ndarray,
    ref_rms: float | None,
    config: Any,
    decoded_path: Path,
    write: bool,
) -> dict[str, Any]:
    """The final audio's summary with its stages (the decoder's audio, chunks cross-faded; after
    silence removal) and `post_process`: post-processing of `decoded_path`, the decoded audio at
    16 bits (written first when `write`), exact on any machine whatever its decoder gives."""
    decoded = decode(tts.model, result)
    stages = {"decoded": audio_summary(decoded[0])}
    if config.postprocess_output:
        stages["silence_removed"] = _silence_removed(tts, decoded)
    if write:
        write_decoded(decoded_path, decoded[0], tts.sample_rate)
    settings = {
        "ref_rms": ref_rms,
        "postprocess_output": config.postprocess_output,
        "pad_duration": config.pad_duration,
        "fade_duration": config.fade_duration,
    }
    if not decoded_path.is_file():
        return {**audio_summary(final), "stages": stages, "post_process": None}
    stored = _read_float32(decoded_path)
    return {
        **audio_summary(final),
        "stages": stages,
        "post_process": {
            "input": decoded_path.name,
            "input_audio": audio_summary(stored[0]),
            **post_process_run(tts, stored, settings),
        },
    }


def write_decoded(path: Path, samples: np.ndarray, rate: int) -> None:
    """A decoded output as the vectors store it: 16-bit FLAC, each sample libsndfile's FLAC
    conversion of float32 x, round-half-to-even(x * 32768) clipped to [-32768, 32767]
    (docs/vectors.md; tests/test_runtime_formulas.py holds libsndfile to it)."""
    sf.write(path, samples, rate, subtype="PCM_16", format="FLAC")


def post_process_run(tts: OmniVoiceOnnx, decoded: np.ndarray, settings: dict[str, Any]) -> dict[str, Any]:
    """audio.post_process of `decoded` [1, T] with `settings`: the settings and the summaries after
    silence removal and of the output. Silence is removed once: post_process with it on is
    remove_silence, then the level, fades and padding that post_process with it off applies."""
    rules = tts.runtime_config["audio"]
    trim = settings["postprocess_output"]
    mid, lead, trail = rules["output_silence_ms"]
    removed = audio.remove_silence(decoded, tts.sample_rate, mid, lead, trail, rules) if trim else decoded
    output = audio.post_process(
        removed, settings["ref_rms"], tts.sample_rate, rules, False, settings["pad_duration"], settings["fade_duration"]
    )
    return {
        **settings,
        "silence_removed": audio_summary(removed[0]) if trim else None,
        "output": audio_summary(output[0]),
    }


def _read_float32(path: Path) -> np.ndarray:
    """A 16-bit file of the folder as the port reads it: float32 [1, T], sample / 32768."""
    samples: np.ndarray = sf.read(path, dtype="float32")[0][np.newaxis]  # soundfile has no stubs
    return samples


def _silence_removed(tts: OmniVoiceOnnx, decoded: np.ndarray) -> dict[str, Any]:
    """The summary of `decoded` [1, T] after the output's silence removal (post_process's first stage)."""
    rules = tts.runtime_config["audio"]
    mid, lead, trail = rules["output_silence_ms"]
    return audio_summary(audio.remove_silence(decoded, tts.sample_rate, mid, lead, trail, rules)[0])


def run_case(
    tts: OmniVoiceOnnx, name: str, case: dict[str, Any], folder: Path, write: bool = False
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Generate one case (ref_audio names a file in `folder`) -> (its JSON record, its audio);
    `write` also writes each output's decoded audio into `folder` (decoded_file)."""
    kwargs = {key: value for key, value in case.items() if key != "seed"}
    ref_files = sorted({kwargs["ref_audio"]} if isinstance(kwargs.get("ref_audio"), str) else set())
    if ref_files:
        kwargs["ref_audio"] = str(folder / kwargs["ref_audio"])
    config = tts.generation_config(case.get("generation_config"))
    trace = Trace()
    audios = tts.generate(**kwargs, seed=case["seed"], trace=trace)
    task = trace.task
    assert task is not None, "generate() fills the trace it is given"
    record = {
        "format": FORMAT,
        "kind": "generate",
        "case": name,
        "export": _export_hashes(tts),
        "request": {**case, "seed": str(case["seed"]), "generation_config": asdict(config)},
        "rng": {
            "seed": str(case["seed"]),
            "first_words": TorchCpuRng(case["seed"]).words(RNG_PREVIEW).tolist(),
            "first_floats": [float(x) for x in TorchCpuRng(case["seed"]).rand(RNG_PREVIEW)],
            "words_drawn": trace.words_drawn,
        },
        "references": [reference_record(tts, folder / file, config.preprocess_prompt) for file in ref_files],
        "task": {
            "texts": task.texts,
            "target_lens": task.target_lens,
            "langs": task.langs,
            "instructs": task.instructs,
            "ref_texts": task.ref_texts,
            "ref_rms": task.ref_rms,
            "speed": task.speed,
            "ref_audio_tokens": [t.tolist() if t is not None else None for t in task.ref_audio_tokens],
        },
        "durations": duration_records(task, tts.runtime_config["duration"]),
        "short_idx": trace.short_idx,
        "long_idx": trace.long_idx,
        "chunks": {str(item): chunks for item, chunks in trace.chunks.items()},
        "iterations": [iteration_record(it) for it in trace.iterations],
        "outputs": [
            output_record(tts, result, final, task.ref_rms[i], config, folder / decoded_file(name, i), write)
            for i, (result, final) in enumerate(zip(trace.results, audios))
        ],
    }
    return record, audios


def scoring_record(tts: OmniVoiceOnnx, stored: dict[str, Any] | None = None) -> dict[str, Any]:
    """The scoring recipe (docs/runtime.md, "One step of the loop") on logit rows: those of
    `stored` when replaying, else drawn (numpy's RandomState(SCORING_SEED), float32, scaled).
    Every value is float32, written as the shortest decimal that reads back to the same float32."""
    mask_id = tts.runtime_config["model"]["audio_mask_id"]
    vocab = tts.runtime_config["model"]["audio_vocab_size"]
    if stored is None:
        draws = np.random.RandomState(SCORING_SEED).standard_normal((len(SCORING_SCALES), 2, vocab))
        rows = (draws * np.array(SCORING_SCALES)[:, None, None]).astype(np.float32)
    else:
        rows = np.array([[case["cond_logits"], case["uncond_logits"]] for case in stored["rows"]], dtype=np.float32)
    records = []
    for cond, uncond in rows:
        guided = scoring.guided_log_probs(cond[None], uncond[None], SCORING_GUIDANCE, mask_id)[0]
        c_lp, u_lp = scoring.log_softmax(cond), scoring.log_softmax(uncond)
        records.append(
            {
                "cond_logits": _floats(cond),
                "uncond_logits": _floats(uncond),
                "cond_log_softmax": _floats(c_lp),
                "uncond_log_softmax": _floats(u_lp),
                "guided_log_probs": _floats(np.where(np.isinf(guided), 0.0, guided).astype(np.float32)),
                "token": int(guided.argmax()),
                "confidence": float(guided.max()),
            }
        )
    return {
        "format": FORMAT,
        "kind": "scoring",
        "case": SCORING_CASE,
        "export": _export_hashes(tts),
        "guidance_scale": SCORING_GUIDANCE,
        "mask_id": mask_id,
        "rows": records,
    }


def _floats(values: np.ndarray) -> list[float]:
    """float32 values as JSON numbers: Python's repr of the exact double reads back to the same bits."""
    return [float(v) for v in np.asarray(values, dtype=np.float32)]


def _export_hashes(tts: OmniVoiceOnnx) -> dict[str, str]:
    """The export a vector was made from: the graphs' model fingerprint, the host files' sha256."""
    return {
        "model_fingerprint": tts.metadata["model_fingerprint"],
        "runtime_config_sha256": _file_sha256(tts.bundle.runtime_config_path),
        "tokenizer_sha256": _file_sha256(tts.bundle.tokenizer_path),
    }


def _file_sha256(path: Path) -> str:
    """sha256_file, computed once per version of the file (verified.stat_identity, the verification
    record's key): every case of a vector set records the same export, and the tokenizer is megabytes."""
    return _sha256_of_version(str(path), *stat_identity(path.stat()))


@functools.lru_cache(maxsize=16)
def _sha256_of_version(path: str, *identity: int) -> str:
    return sha256_file(Path(path))


def post_process_case(tts: OmniVoiceOnnx, name: str, runs: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
    """One POST_PROCESS_CASES entry: audio.post_process on SILENCES_WAV with each run's settings."""
    decoded = _read_float32(folder / SILENCES_WAV)
    return {
        "format": FORMAT,
        "kind": "post_process",
        "case": name,
        "export": {"runtime_config_sha256": _file_sha256(tts.bundle.runtime_config_path)},
        "input": {"file": SILENCES_WAV, **audio_summary(decoded[0])},
        "runs": [post_process_run(tts, decoded, run) for run in runs],
    }


def write_vectors(onnx_dir: Path, out: Path, threads: int | None = None) -> list[Path]:
    """Run every case of CASES on the export at `onnx_dir` into a temporary folder that replaces
    `out` when all are written: the references, one JSON per case, README.md."""
    tts = OmniVoiceOnnx.from_dir(onnx_dir, threads=threads, variant=FP32_VARIANT)  # the reference graph
    names = []
    with atomic_dir(out) as folder:
        for name, case in CASES.items():
            record, audios = run_case(tts, name, case, folder, write=True)
            if name == "design-reference":
                names += [
                    p.name for p in write_references(folder, audios[0], tts.sample_rate, tts.runtime_config["audio"])
                ]
            path = folder / f"{name}.json"
            path.write_text(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
            names += [decoded_file(name, i) for i in range(len(record["outputs"]))] + [path.name]
            say(
                f"{out / path.name}  {path.stat().st_size / 1024:.0f} kB  {len(record['iterations'])} run(s), "
                f"target_lens {record['task']['target_lens']}"
            )
        for name, runs in POST_PROCESS_CASES.items():
            path = folder / f"{name}.json"
            record = post_process_case(tts, name, runs, folder)
            path.write_text(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
            names.append(path.name)
            say(f"{out / path.name}  {path.stat().st_size / 1024:.0f} kB  {len(runs)} post_process run(s)")
        path = folder / f"{SCORING_CASE}.json"
        record = scoring_record(tts)
        path.write_text(json.dumps(record, separators=(",", ":")) + "\n", encoding="utf-8")
        names.append(path.name)
        path = folder / f"{RULES_CASE}.json"
        record = {**rules_record(tts.runtime_config, tts.tokenizer, tts.sample_rate), "export": _export_hashes(tts)}
        path.write_text(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
        names.append(path.name)
        say(f"{out / path.name}  {path.stat().st_size / 1024:.0f} kB  {len(record['rules'])} rule inputs")
        (folder / README).write_text(FOLDER_README, encoding="utf-8")
        names.append(README)
    return [out / name for name in names]


def check_vectors(onnx_dir: Path, folder: Path, threads: int | None = None) -> dict[str, list[str]]:
    """Replay every <case>.json of `folder` on the export at `onnx_dir` -> {case: its differences}."""
    tts = OmniVoiceOnnx.from_dir(onnx_dir, threads=threads, variant=FP32_VARIANT)
    results = {}
    for path in sorted(folder.glob("*.json")):
        stored = read_json(
            path, "conformance vector", f"write the vectors again ({COMMAND} --out)", schema={"case": Maybe(str)}
        )
        name = stored.get("case", path.stem)
        if name in CASES:
            record, _ = run_case(tts, name, CASES[name], folder)
        elif name in POST_PROCESS_CASES:
            record = post_process_case(tts, name, POST_PROCESS_CASES[name], folder)
        elif name == SCORING_CASE:
            record = scoring_record(tts, stored)
        elif name == RULES_CASE:
            results[name] = check_rules(stored, tts.runtime_config, tts.tokenizer, tts.sample_rate)
            say(f"[{name}] {'OK' if not results[name] else 'FAIL: ' + results[name][0]}")
            continue
        else:
            results[name] = [f"{path.name}: case {name!r} is not one of this runtime's cases"]
            continue
        results[name] = compare_records(stored, record)
        say(f"[{name}] {'OK' if not results[name] else 'FAIL: ' + results[name][0]}")
    return results
