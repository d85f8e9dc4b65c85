"""What every conformance vector shares: the format name and the audio summary.

A module of its own so that the generate/post_process vectors (conformance.py) and the rules
vector (rule_vectors.py) both stand on it, with no import between the two of them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

FORMAT = "omnivoice-conformance/3"
ENVELOPE_BLOCK = 480  # samples per envelope block: 20 ms at 24 kHz


def audio_summary(samples: np.ndarray) -> dict[str, Any]:
    """Sample count, exact hash and tolerance-friendly statistics of one signal [T] float32."""
    samples = np.asarray(samples, dtype=np.float32)
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


def short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."
