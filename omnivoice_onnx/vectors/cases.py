"""The fixed cases the vectors are made of: generate() requests (CASES), post-processing runs
(POST_PROCESS_CASES), the scoring vector's logit rows, and the reference files the clone cases
read, made from the first case's output (write_references). Data and the files' names; what each
case covers: tests/conformance/README.md's table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from omnivoice_onnx.core import audio

REF_WAV = "ref_voice.wav"
REF_QUIET = "ref_quiet_44k_stereo.wav"
REF_16K = "ref_16k.wav"
README = "README.md"
DESIGN_TEXT = "The quick brown fox jumps over the lazy dog."  # short: ref_voice.wav stays ~100 kB
LONG_TEXT = (
    "The first sentence sets the scene. A second one follows it closely, with a few more words. "
    "Then a third arrives; it is short. Finally, the fourth sentence ends this long text for good."
)
# Abbreviations (no split after "Dr." or "e.g."), closing marks and punctuation that follow a split
# (they join the previous sentence), a short sentence merged into its neighbour.
ABBREVIATED_TEXT = (
    'Dr. Smith met Mr. Jones at St. Mary\'s on Jan. 3. "We should go," he said. (They left.) '
    "Why? Prof. Lee, i.e. the host, agreed; approx. five people came, e.g. Ann. Ok."
)
# Chunking limits (seconds) lowered so that the long texts are chunked, and 8 steps to keep it small.
CHUNKED = {"audio_chunk_threshold": 3.0, "audio_chunk_duration": 2.0, "num_step": 8}
# The quiet reference: its RMS (below the 0.1 boost threshold) and silences (ms at 44.1 kHz).
QUIET_RATE, QUIET_RMS, QUIET_SILENCES_MS, QUIET_SPEECH_S = 44100, 0.03, (300, 700, 500), 1.2

# name -> generate() keyword arguments. A ref_audio names a file of the folder: REF_WAV is the
# "design-reference" case's output (so that case comes first); REF_QUIET and REF_16K are made from it.
CASES: dict[str, dict[str, Any]] = {
    "design-reference": {"text": DESIGN_TEXT, "instruct": "female, low pitch", "language": "English", "seed": 1234},
    "auto-en": {"text": "Hello there, this is a test of the model.", "language": "en", "seed": 0},
    "design-zh-dialect": {"text": "你好，今天的天气非常好。", "instruct": "男，四川话", "language": "zh", "seed": 1},
    "clone-en": {
        "text": "Clone this voice now, thank you.",
        "ref_audio": REF_WAV,
        "ref_text": DESIGN_TEXT,
        "seed": 2**32 + 5,
    },
    "batch-scripts": {
        "text": ["こんにちは、元気ですか。", "안녕하세요, 만나서 반갑습니다.", "Привет, как дела?", "नमस्ते, आप कैसे हैं?"],
        "language": ["ja", "ko", "Russian", "hi"],
        "instruct": [None, "female", None, "male, elderly"],
        "seed": 7,
    },
    "class-temperature": {
        "text": "Sampling the classes as well.",
        "instruct": "male, high pitch",
        "generation_config": {"class_temperature": 1.0, "num_step": 16},
        "seed": 11,
    },
    "speed-duration-clone": {
        "text": ["Faster, please.", "Exactly two seconds."],
        "speed": 1.3,
        "duration": [None, 2.0],
        "ref_audio": REF_WAV,
        "ref_text": DESIGN_TEXT,
        "generation_config": {"num_step": 16, "guidance_scale": 0.0},
        "seed": 12,
    },
    "chunked-auto": {"text": LONG_TEXT, "generation_config": CHUNKED, "seed": 5},
    "chunked-clone": {
        "text": ["Short.", LONG_TEXT],
        "ref_audio": REF_WAV,
        "ref_text": DESIGN_TEXT,
        "generation_config": CHUNKED,
        "seed": 6,
    },
    # --- version 2 ---
    "clone-quiet-44k-stereo": {
        "text": "A quiet voice, read from a stereo file.",
        "ref_audio": REF_QUIET,
        "ref_text": DESIGN_TEXT,
        "generation_config": {"num_step": 16},
        "seed": 21,
    },
    "clone-16k": {
        "text": "Sixteen kilohertz, resampled up.",
        "ref_audio": REF_16K,
        "ref_text": DESIGN_TEXT,
        "generation_config": {"num_step": 16},
        "seed": 2**53 + 1,
    },
    "nonverbal-tags": {
        "text": "[laughter] That is so funny! [sigh] Okay then, [question-en] really?",
        "language": "en",
        "generation_config": {"num_step": 16},
        "seed": 2**64 - 1,
    },
    "chunked-abbreviations": {
        "text": ABBREVIATED_TEXT,
        "ref_audio": REF_WAV,
        "ref_text": DESIGN_TEXT,
        "generation_config": CHUNKED,
        "seed": 9,
    },
    "design-accent-dialect": {
        "text": ["Good morning, my friends.", "你好，朋友们，今天很好。", "Hello from the west."],
        "instruct": ["female, british accent", "男，河南话", "male, 四川话"],
        "language": [None, "zh", None],
        "generation_config": {"num_step": 16},
        "seed": -7,
    },
    # Greedy cells (position_temperature 0): no position draw, the top-k of the layer-penalised
    # confidences alone.
    "greedy-positions": {
        "text": ["Hello there, this is a test of the model.", "Sampling the classes as well."],
        "duration": 4.0,
        "generation_config": {"num_step": 16, "position_temperature": 0.0},
        "seed": 0,
    },
}

# name -> audio.post_process runs over one input file (SILENCES_WAV: decoder-like audio with long
# inner and edge silences, which the tiny checkpoint's noise-like speech never has): the output
# silence trimming, peak normalisation, rescale by ref_rms / 0.1, fades and padding.
SILENCES_WAV = "decoded_with_silences.wav"
SILENCES_LAYOUT_MS = (
    ("silence", 800),
    ("speech", 600),
    ("silence", 1200),
    ("speech", 400),
    ("silence", 300),
    ("speech", 600),
    ("silence", 1000),
)  # 0.3 s pause kept; 0.8/1.2/1.0 s trimmed
POST_PROCESS_CASES: dict[str, list[dict[str, Any]]] = {
    "post-process-silences": [
        {"ref_rms": None, "postprocess_output": True, "pad_duration": 0.1, "fade_duration": 0.1},
        {"ref_rms": 0.05, "postprocess_output": True, "pad_duration": 0.1, "fade_duration": 0.1},
        {"ref_rms": 0.2, "postprocess_output": True, "pad_duration": 0.25, "fade_duration": 0.05},
        {"ref_rms": None, "postprocess_output": False, "pad_duration": 0.0, "fade_duration": 0.3},
    ],
}


# The scoring vector: cond/uncond logit rows (float32, stored in the vector) at these scales, with
# guidance SCORING_GUIDANCE; expected log_softmax, guided log-probs, tokens and confidences.
SCORING_CASE = "scoring-recipe"
SCORING_SCALES = (1.0, 3.0, 10.0, 30.0)
SCORING_GUIDANCE = 2.0
SCORING_SEED = 35


def decoded_file(case: str, index: int) -> str:
    """The file holding output `index`'s decoded audio (16-bit FLAC): the post-processing input."""
    return f"{case}.decoded{index}.flac"


def silences_input(voice: np.ndarray, rate: int) -> np.ndarray:
    """SILENCES_WAV's samples: stretches of ref_voice.wav and of zeros, as SILENCES_LAYOUT_MS says."""
    parts, used = [], 0
    for kind, ms in SILENCES_LAYOUT_MS:
        n = rate * ms // 1000
        parts.append(voice[used : used + n] if kind == "speech" else np.zeros(n, np.float32))
        used += n if kind == "speech" else 0
    return np.concatenate(parts)


def quiet_stereo_reference(voice: np.ndarray, rate: int, rules: dict[str, Any]) -> np.ndarray:
    """REF_QUIET's samples [T, 2] at QUIET_RATE from ref_voice.wav's float32 [T]: its first
    QUIET_SPEECH_S resampled, split in two halves with QUIET_SILENCES_MS of zeros before, between
    and after, scaled to RMS QUIET_RMS, the right channel at 0.6 of the left."""
    speech = audio.resample(
        voice[np.newaxis, : int(QUIET_SPEECH_S * rate)].astype(np.float32), rate, QUIET_RATE, rules
    )[0]
    speech = speech * np.float32(QUIET_RMS / float(np.sqrt(np.mean(speech.astype(np.float64) ** 2))))
    gaps = [np.zeros(QUIET_RATE * ms // 1000, np.float32) for ms in QUIET_SILENCES_MS]
    half = speech.size // 2
    left = np.concatenate([gaps[0], speech[:half], gaps[1], speech[half:], gaps[2]])
    return np.stack([left, left * np.float32(0.6)], axis=1)


def write_references(folder: Path, voice: np.ndarray, rate: int, rules: dict[str, Any]) -> list[Path]:
    """REF_WAV (the design-reference output) and the two references made from it, 16-bit PCM."""
    sf.write(folder / REF_WAV, voice, rate, subtype="PCM_16")
    voice, rate = sf.read(folder / REF_WAV, dtype="float32")  # what the cases will read
    sf.write(folder / REF_QUIET, quiet_stereo_reference(voice, rate, rules), QUIET_RATE, subtype="PCM_16")
    sf.write(folder / REF_16K, audio.resample(voice[np.newaxis], rate, 16000, rules)[0], 16000, subtype="PCM_16")
    sf.write(folder / SILENCES_WAV, silences_input(voice, rate), rate, subtype="PCM_16")
    return [folder / REF_WAV, folder / REF_QUIET, folder / REF_16K, folder / SILENCES_WAV]
