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
- Data: the weight table, the Unicode ranges, the special code points, the lift's threshold and
  strength and the fallback reference are the `duration` section of the export's
  runtime-config.json (passed in as `rules`); omnivoice_export/step2_export/runtime_assets.py writes it from
  upstream's RuleDurationEstimator. docs/runtime.md states the rules.
"""

from __future__ import annotations

import bisect
import unicodedata
from collections.abc import Sequence
from typing import Any

from omnivoice_onnx.errors import UserError

ASCII_SPACE = 32  # checked before the Unicode category, as upstream does


def char_weight(char: str, rules: dict[str, Any]) -> float:
    """The speaking weight of one code point (RuleDurationEstimator._get_char_weight).

    The checks run in upstream's order: ASCII letters (latin), the ASCII space (space), tatweel
    (mark), then the Unicode category (M* mark, P* and S* punctuation, Z* space, N* digit), and
    only then the block table: the first range whose last code point is >= the code point
    (bisect_left); past the table, code points above upper_planes_start weigh as
    upper_planes_script (cjk), the rest as default. So a CJK full stop is punctuation and a
    Devanagari digit a digit.
    """
    weights: dict[str, float] = rules["weights"]  # runtime-config.json: checked at load
    code = ord(char)
    if 65 <= code <= 90 or 97 <= code <= 122:
        return weights["latin"]
    if code == ASCII_SPACE:
        return weights["space"]
    if code == rules["tatweel"]:
        return weights["mark"]
    category = unicodedata.category(char)
    if category.startswith("M"):
        return weights["mark"]
    if category.startswith("P") or category.startswith("S"):
        return weights["punctuation"]
    if category.startswith("Z"):
        return weights["space"]
    if category.startswith("N"):
        return weights["digit"]
    ranges: list[tuple[int, str]] = rules["ranges"]  # ascending [last code point, script] (checked at load)
    index = bisect.bisect_left(ranges, code, key=lambda r: r[0])
    if index < len(ranges):
        return weights[ranges[index][1]]
    if code > rules["upper_planes_start"]:
        return weights[rules["upper_planes_script"]]
    return weights["default"]


def text_weight(text: str, rules: dict[str, Any]) -> float:
    """Sum of the weights of `text`'s code points, in order, from the integer 0 (calculate_total_weight)."""
    return sum(char_weight(c, rules) for c in text)


def estimate_duration(target_text: str, ref_text: str, ref_duration: float, rules: dict[str, Any]) -> float:
    """Frames for `target_text` at the speaking rate of `ref_text` spoken in `ref_duration` frames.

    RuleDurationEstimator.estimate_duration: 0.0 when the reference is empty, has no duration or
    weighs nothing; a result below rules["low_threshold"] (50; None: never) is lifted along a
    1/rules["boost_strength"] (3) power curve.
    """
    if ref_duration <= 0 or not ref_text:
        return 0.0
    ref_weight = text_weight(ref_text, rules)
    if ref_weight == 0:
        return 0.0
    speed_factor = ref_weight / ref_duration
    estimated = text_weight(target_text, rules) / speed_factor
    low_threshold: float | None = rules["low_threshold"]
    if low_threshold is not None and estimated < low_threshold:
        alpha = 1.0 / float(rules["boost_strength"])
        lifted: float = low_threshold * (estimated / low_threshold) ** alpha  # float ** float: typeshed says Any
        return lifted
    return estimated


def rate_reference(ref_text: str | None, num_ref_audio_tokens: int | None, rules: dict[str, Any]) -> tuple[str, int]:
    """The (transcript, frames) whose speaking rate an estimate uses: the reference's, or without
    one (no frame count, or an empty/None transcript) rules["fallback_ref_text"] in
    rules["fallback_ref_frames"] frames ("Nice to meet you." in 25)."""
    if num_ref_audio_tokens is None or ref_text is None or len(ref_text) == 0:
        return rules["fallback_ref_text"], rules["fallback_ref_frames"]
    return ref_text, num_ref_audio_tokens


def estimate_target_tokens(
    text: str, ref_text: str | None, num_ref_audio_tokens: int | None, rules: dict[str, Any], speed: float = 1.0
) -> int:
    """Frames to generate for `text` (OmniVoice._estimate_target_tokens).

    Without a reference (no frame count, or an empty/None transcript) the rate is that of
    rules["fallback_ref_text"] in rules["fallback_ref_frames"] frames. The estimate is divided by
    `speed` when speed > 0 and != 1.0, truncated with int() and kept >= 1.
    """
    ref_text, num_ref_audio_tokens = rate_reference(ref_text, num_ref_audio_tokens, rules)
    estimated = estimate_duration(text, ref_text, num_ref_audio_tokens, rules)
    if speed > 0 and speed != 1.0:
        estimated = estimated / speed
    return max(1, int(estimated))


def _per_item(value: float | Sequence[float | None] | None, batch_size: int, name: str) -> list[float | None] | None:
    """A scalar repeated per item, or the given list (upstream: `[float(v)] * B` or `list(v)`)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return [float(value)] * batch_size
    values = list(value)
    if len(values) < batch_size:  # upstream indexes the list per item and fails with an IndexError
        raise UserError(
            f"{name} has {len(values)} value(s) for {batch_size} text(s)",
            f"pass one {name} for all texts or one per text",
        )
    return values


def target_lengths(
    texts: Sequence[str],
    ref_texts: Sequence[str | None],
    ref_token_counts: Sequence[int | None],
    speed: float | Sequence[float | None] | None,
    duration: float | Sequence[float | None] | None,
    frame_rate: int,
    rules: dict[str, Any],
) -> tuple[list[int], list[float] | None]:
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
            raise UserError(
                f"speed of text {i} is None and it has no duration", "give every text a speed, or omit speed"
            )
        lengths.append(estimate_target_tokens(texts[i], ref_texts[i], ref_token_counts[i], rules, speed=item_speed))

    speed_list: list[float] | None = None
    if durations is not None:
        speed_list = []
        for i in range(batch_size):
            item_duration = durations[i]
            if item_duration is not None:
                target = max(1, int(item_duration * frame_rate))
                speed_list.append(lengths[i] / target)
                lengths[i] = target
            else:
                item_speed = user_speed[i] if user_speed else None
                speed_list.append(item_speed if item_speed is not None else 1.0)
    elif user_speed is not None:
        speed_list = [s if s is not None else 1.0 for s in user_speed]
    return lengths, speed_list
