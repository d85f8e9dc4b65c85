"""A replay against a stored vector: what is compared, in which order, and how (compare_records).
The first difference names the stage to look at; everything before it was equal.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omnivoice_onnx.vectors.format import ENVELOPE_BLOCK, FORMAT, short

AUDIO_TOLERANCE = 1e-4  # the envelope tolerance --check applies (an ORT build's float differences)

# What a replay compares, in order: the first difference names the stage to look at (everything
# before it was equal). "exact": JSON-equal; "bits": audio equal bit for bit (sample count and
# sha256 of the float32 samples), on any machine; "device": audio that depends on the decoder graph's
# kernels (the CPU, the thread count): sample count exact, envelopes within a tolerance. A path's
# "*" runs over a list. Everything before the decoder, and every post_process, is exact everywhere.
COMPARE_ORDER: tuple[tuple[str, str], ...] = (
    ("kind", "exact"),
    ("rng.seed", "exact"),
    ("rng.first_words", "exact"),
    ("rng.first_floats", "exact"),
    ("references.*.sample_rate", "exact"),
    ("references.*.channels", "exact"),
    ("references.*.frames", "exact"),
    ("references.*.loaded", "bits"),
    ("references.*.ref_rms", "exact"),
    ("references.*.prepared", "bits"),
    ("task.texts", "exact"),
    ("task.langs", "exact"),
    ("task.instructs", "exact"),
    ("task.ref_texts", "exact"),
    ("task.ref_rms", "exact"),
    ("task.ref_audio_tokens", "exact"),
    ("durations", "exact"),
    ("task.target_lens", "exact"),
    ("task.speed", "exact"),
    ("short_idx", "exact"),
    ("long_idx", "exact"),
    ("chunks", "exact"),
    ("iterations.*.texts", "exact"),
    ("iterations.*.ref_texts", "exact"),
    ("iterations.*.target_lens", "exact"),
    ("iterations.*.prompt_ids", "exact"),
    ("iterations.*.c_lens", "exact"),
    ("iterations.*.ref_frames", "exact"),
    ("iterations.*.schedules", "exact"),
    ("iterations.*.items.*.unmask_step", "exact"),
    ("iterations.*.items.*.tokens", "exact"),
    ("rng.words_drawn", "exact"),
    ("outputs.*.post_process.input", "exact"),
    ("outputs.*.post_process.input_audio", "bits"),
    ("outputs.*.post_process.ref_rms", "exact"),
    ("outputs.*.post_process.postprocess_output", "exact"),
    ("outputs.*.post_process.pad_duration", "exact"),
    ("outputs.*.post_process.fade_duration", "exact"),
    ("outputs.*.post_process.silence_removed", "bits"),
    ("outputs.*.post_process.output", "bits"),
    ("outputs.*.stages.decoded", "device"),
    ("outputs.*.stages.silence_removed", "device"),
    ("outputs.*", "device"),
)
# The same for a post_process vector: all exact (its input is a file, no decoder involved).
POST_PROCESS_ORDER: tuple[tuple[str, str], ...] = (
    ("kind", "exact"),
    ("input", "bits"),
    ("runs.*.ref_rms", "exact"),
    ("runs.*.postprocess_output", "exact"),
    ("runs.*.pad_duration", "exact"),
    ("runs.*.fade_duration", "exact"),
    ("runs.*.silence_removed", "bits"),
    ("runs.*.output", "bits"),
)

# The same for the scoring vector (all exact: float32 values as JSON numbers).
SCORING_ORDER: tuple[tuple[str, str], ...] = (
    ("kind", "exact"),
    ("guidance_scale", "exact"),
    ("mask_id", "exact"),
    ("rows.*.cond_logits", "exact"),
    ("rows.*.uncond_logits", "exact"),
    ("rows.*.cond_log_softmax", "exact"),
    ("rows.*.uncond_log_softmax", "exact"),
    ("rows.*.guided_log_probs", "exact"),
    ("rows.*.token", "exact"),
    ("rows.*.confidence", "exact"),
)


def _values(record: Any, path: list[str], where: str = "") -> list[tuple[str, Any]]:
    """(location, value) pairs at a dotted path, "*" running over a list; a missing key gives None."""
    if not path:
        return [(where, record)]
    head, rest = path[0], path[1:]
    if head == "*":
        items = record if isinstance(record, list) else []
        return [pair for i, item in enumerate(items) for pair in _values(item, rest, f"{where}[{i}]")]
    value = record.get(head) if isinstance(record, dict) else None
    return _values(value, rest, f"{where}.{head}" if where else head)


def _audio_difference(ours: Any, theirs: Any, tolerance: float | None) -> str | None:
    """How two audio summaries differ (None: they conform); `tolerance` None: bit for bit."""
    if ours is None or theirs is None:
        return None if ours is theirs else "present on one side only"
    if ours["samples"] != theirs["samples"]:
        return f"samples {ours['samples']} != {theirs['samples']}"
    if tolerance is None:
        if ours["sha256_f32le"] == theirs["sha256_f32le"]:
            return None
        worst = max(
            float(np.abs(np.subtract(ours[s], theirs[s])).max()) if ours[s] else 0.0
            for s in ("envelope_min", "envelope_max")
        )
        return f"not bit-identical (sha256_f32le differs; envelopes up to {worst:.3g} apart)"
    for stat in ("envelope_min", "envelope_max"):
        worst = float(np.abs(np.subtract(ours[stat], theirs[stat])).max()) if ours[stat] else 0.0
        if worst > tolerance:
            block = int(np.argmax(np.abs(np.subtract(ours[stat], theirs[stat]))))
            return f"{stat} differs by {worst:.3g} > {tolerance:g} (block {block}, sample {block * ENVELOPE_BLOCK})"
    return None


def compare_records(expected: dict[str, Any], actual: dict[str, Any], tolerance: float = AUDIO_TOLERANCE) -> list[str]:
    """Differences between a stored vector and a replay, in COMPARE_ORDER (the first one is where
    to look); [] when the replay conforms. "bits" audio must be bit-identical, "device" audio
    compares sample counts exactly and envelopes within `tolerance`; the rest is JSON-equal."""
    problems = []
    if expected.get("format") != FORMAT:
        return [f"format {expected.get('format')!r}, this replay reads {FORMAT!r}"]
    order = {"post_process": POST_PROCESS_ORDER, "scoring": SCORING_ORDER}.get(expected.get("kind", ""), COMPARE_ORDER)
    for path, kind in order:
        theirs = dict(_values(expected, path.split(".")))
        ours = dict(_values(actual, path.split(".")))
        for where in sorted(set(theirs) | set(ours), key=lambda w: (len(w), w)):
            if kind == "exact":
                if theirs.get(where) != ours.get(where):
                    problems.append(f"{where}: expected {short(theirs.get(where))}, got {short(ours.get(where))}")
            else:
                difference = _audio_difference(
                    ours.get(where), theirs.get(where), tolerance if kind == "device" else None
                )
                if difference:
                    problems.append(f"{where}: {difference}")
    return problems
