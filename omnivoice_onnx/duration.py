"""How many audio frames to generate for a text: upstream's rule-based length estimate.

Reproduces (omnivoice 0.2.1):
    omnivoice/utils/duration.py     RuleDurationEstimator._get_char_weight, .calculate_total_weight,
                                    .estimate_duration
    omnivoice/models/omnivoice.py   OmniVoice._estimate_target_tokens, and the speed/duration part
                                    of OmniVoice._preprocess_all (per-item target lengths, speed_list)

Subtle points, for a port:
- Every number here is a Python float (IEEE double), never float32, and the operations run in
  upstream's order: the weight of a text is `sum()` over its code points in string order,
  starting from the integer 0; the estimate is `target_weight / (ref_weight / ref_frames)`
  (a division by a quotient, not a multiplication by ref_frames / ref_weight).
- The "reference duration" is a frame count (25 frames/s), not seconds: without a reference the
  fallback is "Nice to meet you." spoken in 25 frames.
- Below 50 frames the estimate is lifted by `50 * (est / 50) ** (1 / 3)` (Python `**`, C pow()).
- The result is truncated with int() (towards zero), then at least 1 frame.
- `speed` divides the estimate only when it is > 0 and != 1.0; speeds <= 0 are ignored, as
  upstream ignores them.
- Characters are code points: a combining mark weighs 0 on its own, an emoji is a symbol
  (punctuation, 0.5). The Unicode category comes from Python's unicodedata (Unicode 14.0 in
  Python 3.11); a port on another Unicode version may weigh newly assigned characters otherwise.
"""

from __future__ import annotations

import bisect
import unicodedata
from typing import Sequence

from omnivoice_onnx.errors import UserError

# Relative speaking time per character, 1.0 = one Latin letter (RuleDurationEstimator.weights).
SCRIPT_WEIGHTS: dict[str, float] = {
    "cjk": 3.0,
    "hangul": 2.5,
    "kana": 2.2,
    "ethiopic": 3.0,
    "yi": 3.0,
    "indic": 1.8,
    "thai_lao": 1.5,
    "khmer_myanmar": 1.8,
    "arabic": 1.5,
    "hebrew": 1.5,
    "latin": 1.0,
    "cyrillic": 1.0,
    "greek": 1.0,
    "armenian": 1.0,
    "georgian": 1.0,
    "punctuation": 0.5,
    "space": 0.2,
    "digit": 3.5,
    "mark": 0.0,
    "default": 1.0,
}

# (last code point of a Unicode block, script), ascending (RuleDurationEstimator.ranges). A code
# point belongs to the first block whose last code point is >= it (bisect_left).
SCRIPT_RANGES: tuple[tuple[int, str], ...] = (
    (0x02AF, "latin"), (0x03FF, "greek"), (0x052F, "cyrillic"), (0x058F, "armenian"),
    (0x05FF, "hebrew"), (0x077F, "arabic"), (0x089F, "arabic"), (0x08FF, "arabic"),
    (0x097F, "indic"), (0x09FF, "indic"), (0x0A7F, "indic"), (0x0AFF, "indic"),
    (0x0B7F, "indic"), (0x0BFF, "indic"), (0x0C7F, "indic"), (0x0CFF, "indic"),
    (0x0D7F, "indic"), (0x0DFF, "indic"), (0x0EFF, "thai_lao"), (0x0FFF, "indic"),
    (0x109F, "khmer_myanmar"), (0x10FF, "georgian"), (0x11FF, "hangul"), (0x137F, "ethiopic"),
    (0x139F, "ethiopic"), (0x13FF, "default"), (0x167F, "default"), (0x169F, "default"),
    (0x16FF, "default"), (0x171F, "default"), (0x173F, "default"), (0x175F, "default"),
    (0x177F, "default"), (0x17FF, "khmer_myanmar"), (0x18AF, "default"), (0x18FF, "default"),
    (0x194F, "indic"), (0x19DF, "indic"), (0x19FF, "khmer_myanmar"), (0x1A1F, "indic"),
    (0x1AAF, "indic"), (0x1B7F, "indic"), (0x1BBF, "indic"), (0x1BFF, "indic"),
    (0x1C4F, "indic"), (0x1C7F, "indic"), (0x1C8F, "cyrillic"), (0x1CBF, "georgian"),
    (0x1CCF, "indic"), (0x1CFF, "indic"), (0x1D7F, "latin"), (0x1DBF, "latin"),
    (0x1DFF, "default"), (0x1EFF, "latin"), (0x309F, "kana"), (0x30FF, "kana"),
    (0x312F, "cjk"), (0x318F, "hangul"), (0x9FFF, "cjk"), (0xA4CF, "yi"),
    (0xA4FF, "default"), (0xA63F, "default"), (0xA69F, "cyrillic"), (0xA6FF, "default"),
    (0xA7FF, "latin"), (0xA82F, "indic"), (0xA87F, "default"), (0xA8DF, "indic"),
    (0xA8FF, "indic"), (0xA92F, "indic"), (0xA95F, "indic"), (0xA97F, "hangul"),
    (0xA9DF, "indic"), (0xA9FF, "khmer_myanmar"), (0xAA5F, "indic"), (0xAA7F, "khmer_myanmar"),
    (0xAADF, "indic"), (0xAAFF, "indic"), (0xAB2F, "ethiopic"), (0xAB6F, "latin"),
    (0xABBF, "default"), (0xABFF, "indic"), (0xD7AF, "hangul"), (0xFAFF, "cjk"),
    (0xFDFF, "arabic"), (0xFE6F, "default"), (0xFEFF, "arabic"), (0xFFEF, "latin"),
)
_BREAKPOINTS = [end for end, _ in SCRIPT_RANGES]

ARABIC_TATWEEL = 0x0640  # a stretching stroke, silent: weighs as a mark although it is a letter (Lm)
UPPER_PLANES_START = 0x20000  # above it (strictly), an unlisted code point counts as CJK (Ext B...)

LOW_THRESHOLD = 50  # frames; shorter estimates are lifted (2 s at 25 frames/s)
BOOST_STRENGTH = 3  # the lift is a cube root

# Without a reference, upstream assumes this text takes this many frames (one second).
FALLBACK_REF_TEXT = "Nice to meet you."
FALLBACK_REF_FRAMES = 25


def char_weight(char: str) -> float:
    """The speaking weight of one code point (RuleDurationEstimator._get_char_weight).

    The checks run in upstream's order: ASCII letters, the ASCII space, tatweel, then the Unicode
    category (marks 0, punctuation and symbols 0.5, separators 0.2, numbers 3.5), and only then
    the block table; so a CJK full stop is punctuation and a Devanagari digit a digit.
    """
    code = ord(char)
    if 65 <= code <= 90 or 97 <= code <= 122:
        return SCRIPT_WEIGHTS["latin"]
    if code == 32:
        return SCRIPT_WEIGHTS["space"]
    if code == ARABIC_TATWEEL:
        return SCRIPT_WEIGHTS["mark"]
    category = unicodedata.category(char)
    if category.startswith("M"):
        return SCRIPT_WEIGHTS["mark"]
    if category.startswith("P") or category.startswith("S"):
        return SCRIPT_WEIGHTS["punctuation"]
    if category.startswith("Z"):
        return SCRIPT_WEIGHTS["space"]
    if category.startswith("N"):
        return SCRIPT_WEIGHTS["digit"]
    index = bisect.bisect_left(_BREAKPOINTS, code)
    if index < len(SCRIPT_RANGES):
        return SCRIPT_WEIGHTS[SCRIPT_RANGES[index][1]]
    if code > UPPER_PLANES_START:
        return SCRIPT_WEIGHTS["cjk"]
    return SCRIPT_WEIGHTS["default"]


def text_weight(text: str) -> float:
    """Sum of the weights of `text`'s code points, in order (calculate_total_weight)."""
    return sum(char_weight(c) for c in text)


def estimate_duration(target_text: str, ref_text: str, ref_duration: float,
                      low_threshold: float | None = LOW_THRESHOLD, boost_strength: float = BOOST_STRENGTH) -> float:
    """Frames for `target_text` at the speaking rate of `ref_text` spoken in `ref_duration` frames.

    RuleDurationEstimator.estimate_duration: 0.0 when the reference is empty, has no duration or
    weighs nothing; a result below `low_threshold` is lifted along a 1/boost_strength power curve.
    """
    if ref_duration <= 0 or not ref_text:
        return 0.0
    ref_weight = text_weight(ref_text)
    if ref_weight == 0:
        return 0.0
    speed_factor = ref_weight / ref_duration
    estimated = text_weight(target_text) / speed_factor
    if low_threshold is not None and estimated < low_threshold:
        alpha = 1.0 / boost_strength
        return low_threshold * (estimated / low_threshold) ** alpha
    return estimated


def estimate_target_tokens(text: str, ref_text: str | None, num_ref_audio_tokens: int | None,
                           speed: float = 1.0) -> int:
    """Frames to generate for `text` (OmniVoice._estimate_target_tokens).

    Without a reference (no frame count, or an empty/None transcript) the rate is that of
    FALLBACK_REF_TEXT in FALLBACK_REF_FRAMES frames. The estimate is divided by `speed` when
    speed > 0 and != 1.0, truncated with int() and kept >= 1.
    """
    if num_ref_audio_tokens is None or ref_text is None or len(ref_text) == 0:
        ref_text, num_ref_audio_tokens = FALLBACK_REF_TEXT, FALLBACK_REF_FRAMES
    estimated = estimate_duration(text, ref_text, num_ref_audio_tokens)
    if speed > 0 and speed != 1.0:
        estimated = estimated / speed
    return max(1, int(estimated))


def _per_item(value: float | Sequence[float | None] | None, batch_size: int, name: str) -> list | None:
    """A scalar repeated per item, or the given list (upstream: `[float(v)] * B` or `list(v)`)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return [float(value)] * batch_size
    values = list(value)
    if len(values) < batch_size:  # upstream indexes the list per item and fails with an IndexError
        raise UserError(f"{name} has {len(values)} value(s) for {batch_size} text(s)",
                        f"pass one {name} for all texts or one per text")
    return values


def target_lengths(texts: Sequence[str], ref_texts: Sequence[str | None], ref_token_counts: Sequence[int | None],
                   speed: float | Sequence[float | None] | None, duration: float | Sequence[float | None] | None,
                   frame_rate: int) -> tuple[list[int], list[float] | None]:
    """(target_lens, speed_list) for a batch, as OmniVoice._preprocess_all derives them.

    texts, ref_texts, ref_token_counts: one per item (None where an item has no reference).
    speed, duration: None, one number for all items, or one value (or None) per item.

    An item's duration (seconds) overrides its speed: its length is max(1, int(d * frame_rate))
    and its speed_list entry is estimate / length, the speed ratio that chunked generation then
    applies to every chunk's estimate (the estimate taken at speed 1.0). speed_list is None when
    neither speed nor duration is given; otherwise missing values are 1.0.
    """
    batch_size = len(texts)
    user_speed = _per_item(speed, batch_size, "speed")
    durations = _per_item(duration, batch_size, "duration")

    lengths = []
    for i in range(batch_size):
        has_duration = durations is not None and durations[i] is not None
        item_speed = 1.0 if has_duration else (user_speed[i] if user_speed else 1.0)
        if item_speed is None:  # upstream compares None > 0 and fails with a TypeError
            raise UserError(f"speed of text {i} is None and it has no duration",
                            "give every text a speed, or omit speed")
        lengths.append(estimate_target_tokens(texts[i], ref_texts[i], ref_token_counts[i], speed=item_speed))

    speed_list: list[float] | None = None
    if durations is not None:
        speed_list = []
        for i in range(batch_size):
            if durations[i] is not None:
                target = max(1, int(durations[i] * frame_rate))
                speed_list.append(lengths[i] / target)
                lengths[i] = target
            else:
                item_speed = user_speed[i] if user_speed else None
                speed_list.append(item_speed if item_speed is not None else 1.0)
    elif user_speed is not None:
        speed_list = [s if s is not None else 1.0 for s in user_speed]
    return lengths, speed_list
