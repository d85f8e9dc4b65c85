"""What every conformance vector shares: the format name, the audio summary, and the README
written beside the vectors (FOLDER_README: what the files are and the order to compare them in).

A module of its own so that the generate/post_process vectors (vectors.record), the replay's
comparison (vectors.compare) and the rules vector (vectors.rules) all stand on it, with no import
between them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

FORMAT = "omnivoice-conformance/3"
COMMAND = "python -m omnivoice_onnx.cli.vectors"  # writes (--out) and replays (--check) a folder of vectors
ENVELOPE_BLOCK = 480  # samples per envelope block: 20 ms at 24 kHz


def audio_summary(samples: np.ndarray) -> dict[str, Any]:
    """Sample count, exact hash and tolerance-friendly statistics of one signal [T] float32."""
    samples = np.asarray(samples, dtype=np.float32)
    blocks = [samples[i : i + ENVELOPE_BLOCK] for i in range(0, samples.size, ENVELOPE_BLOCK)]
    return {
        "samples": int(samples.size),
        "sha256_f32le": hashlib.sha256(samples.astype("<f4").tobytes()).hexdigest(),
        "peak": float(np.abs(samples).max()) if samples.size else 0.0,
        "rms": float(np.sqrt(np.mean(samples.astype(np.float64) ** 2))) if samples.size else 0.0,
        "envelope_block": ENVELOPE_BLOCK,
        "envelope_min": [round(float(b.min()), 6) for b in blocks],
        "envelope_max": [round(float(b.max()), 6) for b in blocks],
    }


def short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


# The README.md vectors.record.write_vectors writes into the vectors folder.
FOLDER_README = f"""# OmniVoice conformance vectors (omnivoice-conformance/3)

Written by `{COMMAND} --onnx-dir <export> --out <this folder>` (the
folder is replaced whole); replayed by `{COMMAND} --onnx-dir <export>
--check <this folder>` and, against upstream PyTorch, by `tests/test_runtime_generate.py`.
The guide to what a port computes is `docs/runtime.md`; every table and constant it names is in
the export's `runtime-config.json` (check `export.runtime_config_sha256`). The checkpoint
(`export.model_fingerprint`) is the project's `tiny`, which builds bit-identically on any CPU.

## Files

- `<case>.json`: one `generate()` call each: `request` (its arguments; `seed` is a decimal string,
  exact for seeds >= 2**53 and negative seeds), then what each stage produced. The format (every
  field, the arithmetic of the numbers, the envelope tolerance, the FLAC rounding): docs/vectors.md.
- `<case>.decoded<i>.flac`: output i's decoded audio (the decoder's output, chunks cross-faded),
  16-bit: the input of that output's `post_process` record.
- `scoring-recipe.json` (`"kind": "scoring"`): the scoring recipe on stored float32 logit rows
  (cond and uncond, scales 1 to 30, guidance 2): each row's log_softmax, the guided
  log-probabilities (the mask id's entry, -inf, written as 0), the token and its confidence, every
  float32 exactly (JSON numbers that read back to the same float32).
- `post-process-silences.json`: output post-processing alone (`"kind": "post_process"`) on
  `decoded_with_silences.wav` (decoder-like audio with 0.8 s, 1.2 s and 1.0 s silences and a
  0.3 s pause): silence trimming, peak normalisation, rescale, fades and padding, per run.
- `ambiguous-rules.json` (`"kind": "rules"`): host rules a port could read two ways (chunk merging,
  end punctuation, the cross-fade of a short chunk, the instruct conflict check, the tokenizer
  fallback), each as inputs and the `expected` result: call your function on each `input` and
  compare (JSON-equal; the cross-fade's audio by `samples` and `sha256_f32le`). docs/runtime.md
  states each rule; `omnivoice_onnx/vectors/rules.py` says which reading each input rules out.
- `ref_voice.wav` (24 kHz mono), `ref_quiet_44k_stereo.wav` (44.1 kHz stereo, RMS 0.03, with edge
  and inner silences) and `ref_16k.wav` (16 kHz mono): the clone cases' references, 16-bit PCM.
  They, the `.flac` files and `decoded_with_silences.wav` are inputs: read them (as float32,
  sample / 32768), never regenerate them.

## What is exact everywhere, and what depends on the machine

Every field is **exact on any machine** (JSON-equal; audio bit for bit: `samples` and
`sha256_f32le` of the float32 little-endian samples) except the decoder's audio and what is made
from it in the same call (`outputs[*].stages.*` and the output summary itself): the decoder graph's
convolution kernels and their summation order differ between CPUs and with the intra-op thread
count (onnxruntime 1.30-1.32: up to 7 threads one result, 8 or more another), so those compare
`samples` exactly and `envelope_min`/`envelope_max` (per 480 samples, **stored rounded to 6
decimals**: round yours the same way) within 1e-4. Post-processing is still checked exactly: each output's `post_process`
record is post-processing of its `.flac` file, which every machine reads identically.
The encoder's `ref_audio_tokens` are exact too: RVQ argmin is robust to the encoder's last bits
on CPUs (across devices, CPU against CUDA, it can flip: compare on a CPU).

## Replay, in this order

Load the export whose graphs carry `export.model_fingerprint`, call generate with `request`
(a `ref_audio` is a file of this folder) and compare, stopping at the first difference:

1. `rng.seed`, `rng.first_words`, `rng.first_floats`: your MT19937 and float32 draws.
2. `references[*]`: `sample_rate`/`channels`/`frames` of the file as read; `loaded` (channels
   averaged, resampled to 24 kHz: docs/runtime.md's kernel and sequential sum) bit for bit;
   `ref_rms` exactly (numpy's pairwise float32 sum: docs/runtime.md); `prepared` (boost,
   silence trimming, hop clip) bit for bit.
3. `task`: texts, languages, normalised instructs, reference texts (punctuated), `ref_rms`, the
   encoder's `ref_audio_tokens`.
4. `durations[*]`: `text_weight`, `ref_weight`, `ref_frames`, `estimate` (doubles, exact), then
   `task.target_lens` and `task.speed` (the speed list).
5. `short_idx`, `long_idx`, `chunks` (chunk texts, exact).
6. Per `iterations[*]`: `texts`, `ref_texts`, `target_lens`, `prompt_ids`, `c_lens`,
   `ref_frames`, `schedules`, then per item `unmask_step` (one character of `0-9a-zA-Z` per cell:
   the step that unmasked it) and `tokens`. The first step that differs is where to look; its
   inputs were the earlier steps' tokens, which were equal.
7. `rng.words_drawn`.
8. Per `outputs[*].post_process`: read `input` (the `.flac`) as float32, post-process it with the
   record's `ref_rms`, `postprocess_output`, `pad_duration`, `fade_duration`; `input_audio`,
   `silence_removed` and `output` bit for bit.
9. Per `outputs[*]`: `stages.decoded`, `stages.silence_removed`, then the output itself: `samples`
   exactly, envelopes within 1e-4 (machine-dependent: the decoder).

## Cases

| case | what it covers |
|---|---|
| design-reference | voice design; its output is ref_voice.wav |
| auto-en | auto voice, language id |
| design-zh-dialect | Chinese text, a dialect instruct |
| clone-en | cloning, a seed >= 2**32 (only the low 32 bits seed MT19937) |
| batch-scripts | four scripts in one batch (ja, ko, ru, hi), mixed instructs |
| class-temperature | class_temperature 1: the class draw (C*T*1025 words per step) |
| speed-duration-clone | speed, a fixed duration (the speed list), guidance 0 |
| chunked-auto | chunked long text without a reference (chunk 0 becomes the voice) |
| chunked-clone | a short and a chunked item with a reference |
| clone-quiet-44k-stereo | 44.1 kHz stereo reference: channel mean, resampling, RMS boost, reference silence trimming (edge and inner), output rescale by ref_rms/0.1; a sequential float32 sum gets its ref_rms wrong (and every clone case's) |
| clone-16k | 16 kHz reference (resampling up); seed 2**53 + 1 |
| nonverbal-tags | [laughter], [sigh], [question-en] tokenized alone; seed 2**64 - 1 |
| chunked-abbreviations | abbreviations, closing marks and merged short sentences in chunked text |
| design-accent-dialect | an accent (English items), a dialect (Chinese items), a dialect forcing Chinese for English text; seed -7 |
| greedy-positions | position_temperature 0: cells chosen by the top-k of the penalised confidences alone |
| scoring-recipe | the scoring recipe on stored logits: log_softmax of cond and uncond rows, the guided log-probs, tokens and confidences, bit for bit; a float32 log_softmax (sequential or pairwise sum), or a float64 one with a sequential sum, fails it |
| ambiguous-rules | chunk merging, end punctuation, a cross-fade over a short chunk, the instruct conflict check and its message, the tokenizer fallback: inputs and results, no generate() call |
| post-process-silences | output silence trimming (long inner and edge silences), peak normalisation, rescale by ref_rms/0.1, fades, padding |

For a post_process vector: read `input`'s file as float32, run post-processing with each run's
settings and compare `silence_removed` then `output`, bit for bit.
"""
