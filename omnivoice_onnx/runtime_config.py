"""runtime-config.json, the bundle's host tables: what it must hold (CONFIG_SCHEMA, each key's
JSON type and range, checked before any of it is used: a bundle's files are not trusted) and its
one loader, which the bundle calls on the bytes it verified (Bundle.runtime_config).

Data: the language map, the instruct vocabularies, mappings and rules, the Chinese regex, the
non-verbal tag pattern, the duration weights, the text and audio settings and the generation
defaults, which omnivoice_export/step2_export/runtime_assets.py writes from the installed upstream package;
docs/runtime.md says what each key means. The core reads these tables as the dict it is handed
(Model.runtime_config), never the file.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnivoice_onnx.core.prompt import RERUN_EXPORT
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.reading import read_json

# 2: the host tables (duration, text, prompt, audio, graphs) are data too; 3: `model` also carries the
# sample rate, hop length, frame rate and the checkpoint's fingerprint (a port reads no graph metadata)
RUNTIME_CONFIG_VERSION = 3

# the parsed form of a pattern, as re itself makes it
if sys.version_info >= (3, 11):
    import re._constants as _sre
    import re._parser as _sre_parse
else:
    import sre_constants as _sre
    import sre_parse as _sre_parse
_REPEATS = tuple(
    getattr(_sre, name) for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(_sre, name)
)
REGEX_EXPECTED = "a regular expression without nested repeats, repeated alternatives or backreferences"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _str_dict(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _backtracks(items: Any, repeated: bool = False) -> bool:
    """Whether a parsed pattern holds a shape that backtracks exponentially: a repeat or an
    alternation inside a repeat (`(a+)+`, `(a|aa)*`), or a backreference. Python's re cannot be
    stopped from another thread once it runs, and a bundle's pattern runs on every request's text:
    `(x+x+)+y` stalled `speak` on a short text. (Polynomial shapes such as `.*a.*b` are left: the
    texts they run on are bounded by MAX_TEXT_CHARS.)"""
    for op, arg in items:
        if op in (_sre.GROUPREF, _sre.GROUPREF_EXISTS):
            return True
        if op in _REPEATS:
            _, high, body = arg
            if repeated or _backtracks(body, high > 1):
                return True
        elif op == _sre.BRANCH:
            if repeated or any(_backtracks(branch, repeated) for branch in arg[1]):
                return True
        elif op == _sre.SUBPATTERN:
            if _backtracks(arg[3], repeated):
                return True
        elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
            if _backtracks(arg[1], repeated):
                return True
        elif op == getattr(_sre, "ATOMIC_GROUP", None):
            if _backtracks(arg, repeated):
                return True
    return False


def _regex(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        re.compile(value)
        return not _backtracks(_sre_parse.parse(value))
    except re.error:
        return False


def _int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= low


def _ms_triple(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 3 and all(_int_at_least(0)(v) for v in value)


def _ranges(value: Any) -> bool:
    """[[last code point, script], ...] ascending."""
    return (
        isinstance(value, list)
        and all(isinstance(r, list) and len(r) == 2 and _int_at_least(0)(r[0]) and isinstance(r[1], str) for r in value)
        and all(a[0] < b[0] for a, b in zip(value, value[1:]))
    )


def _non_negative(value: Any) -> bool:
    return _number(value) and value >= 0


def _positive(value: Any) -> bool:
    return _number(value) and value > 0


# runtime-config.json: section -> key -> (check, what it must be). docs/runtime.md says what each
# key means; omnivoice_export/step2_export/runtime_assets.py writes them.
CONFIG_SCHEMA: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "model": {
        **{
            key: (_int_at_least(1), "a positive integer")
            for key in (
                "audio_mask_id",
                "num_audio_codebook",
                "audio_vocab_size",
                "sample_rate",
                "hop_length",
                "frame_rate",
            )
        },
        "model_fingerprint": (lambda v: isinstance(v, str) and v.startswith("sha256:"), "a 'sha256:...' string"),
    },
    "generation": {},  # checked field by field by generate.GenerationConfig
    "languages": {"ids": (_str_list, "a list of strings"), "name_to_id": (_str_dict, "an object of strings")},
    "instruct": {
        "valid": (_str_list, "a list of strings"),
        "valid_en": (_str_list, "a list of strings"),
        "valid_zh": (_str_list, "a list of strings"),
        "en_to_zh": (_str_dict, "an object of strings"),
        "zh_to_en": (_str_dict, "an object of strings"),
        "mutually_exclusive": (
            lambda v: isinstance(v, list) and all(_str_list(c) for c in v),
            "a list of lists of strings",
        ),
        "zh_pattern": (_regex, REGEX_EXPECTED),
        "split_pattern": (_regex, REGEX_EXPECTED),
        "dialect_suffix": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
        "accent_mark": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
        "joiners": (lambda v: _str_dict(v) and set(v) == {"zh", "en"}, 'an object {"zh": str, "en": str}'),
        "suggestion_cutoff": (lambda v: _number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    },
    "duration": {
        "weights": (
            lambda v: (
                isinstance(v, dict)
                and all(_non_negative(w) for w in v.values())
                and {"latin", "space", "mark", "punctuation", "digit", "default"} <= set(v)
            ),
            "an object of numbers >= 0 with latin, space, mark, punctuation, digit, default",
        ),
        "ranges": (_ranges, "an ascending list of [last code point, script]"),
        "tatweel": (_int_at_least(0), "a code point"),
        "upper_planes_start": (_int_at_least(0), "a code point"),
        "upper_planes_script": (lambda v: isinstance(v, str), "a script name"),
        "low_threshold": (_positive, "a number > 0"),
        "boost_strength": (_positive, "a number > 0"),
        "fallback_ref_text": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
        "fallback_ref_frames": (_int_at_least(1), "a positive integer"),
    },
    "text": {
        "split_punctuation": (lambda v: _str_list(v) and all(len(c) == 1 for c in v), "a list of characters"),
        "closing_marks": (lambda v: _str_list(v) and all(len(c) == 1 for c in v), "a list of characters"),
        "end_punctuation": (_str_list, "a list of strings"),
        "abbreviations": (_str_list, "a list of strings"),
        "chinese_range": (
            lambda v: (
                isinstance(v, list) and len(v) == 2 and all(_int_at_least(0)(c) for c in v) and v[0] <= v[1] <= 0x10FFFF
            ),
            "[first, last] code points",
        ),
        "chinese_full_stop": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
        "full_stop": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
        "min_chunk_len": (_int_at_least(0), "an integer >= 0"),
    },
    "prompt": {
        "nonverbal_pattern": (_regex, REGEX_EXPECTED),
        "no_value": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    },
    "audio": {
        "target_rms": (_positive, "a number > 0"),
        "peak_level": (_positive, "a number > 0"),
        "min_peak": (_non_negative, "a number >= 0"),
        "reference_silence_ms": (_ms_triple, "[mid, lead, trail] ms, integers >= 0"),
        "output_silence_ms": (_ms_triple, "[mid, lead, trail] ms, integers >= 0"),
        "silence_thresh_dbfs": (lambda v: _number(v) and v <= 0, "a number <= 0 (dBFS)"),
        "seek_step_ms": (_int_at_least(1), "a positive integer"),
        "leading_chunk_ms": (_int_at_least(1), "a positive integer"),
        "cross_fade_silence_s": (_non_negative, "a number >= 0"),
        "resample": (
            lambda v: (
                isinstance(v, dict)
                and set(v) == {"lowpass_filter_width", "rolloff"}
                and _int_at_least(1)(v["lowpass_filter_width"])
                and _number(v["rolloff"])
                and 0 < v["rolloff"] <= 1
            ),
            '{"lowpass_filter_width": int >= 1, "rolloff": number in (0, 1]}',
        ),
    },
    "graphs": {name: (lambda v: isinstance(v, dict), "an object") for name in ("transformer", "encoder", "decoder")},
}


def load_runtime_config(path: Path, data: bytes | None = None) -> dict[str, Any]:
    """The export's runtime-config.json at `path` (bundle.Folder.runtime_config_path); UserError
    naming the file when it is missing, not JSON, of another version, or when a section or key
    the runtime reads is missing or of the wrong type (CONFIG_SCHEMA). `data`: the file's bytes
    as the bundle verified them (parsed instead of reading the file again)."""
    config: dict[str, Any] = read_json(
        Path(path),
        "runtime config",
        RERUN_EXPORT,
        data=data,  # bounded in size, depth
        schema={"version": int, **{section: dict for section in CONFIG_SCHEMA}},
    )
    if config["version"] != RUNTIME_CONFIG_VERSION:
        raise UserError(
            f"runtime config {path} is version {config.get('version')!r}; this runtime reads version "
            f"{RUNTIME_CONFIG_VERSION} (the host tables and audio constants as data)",
            RERUN_EXPORT,
        )
    for section, keys in CONFIG_SCHEMA.items():
        for key, (check, expected) in keys.items():
            if not check(config[section].get(key)):
                raise UserError(f"runtime config {path}: {section}.{key} is missing or not {expected}", RERUN_EXPORT)
    duration = config["duration"]
    unknown = sorted(
        {script for _, script in duration["ranges"]} - set(duration["weights"])
        | ({duration["upper_planes_script"]} - set(duration["weights"]))
    )
    if unknown:
        raise UserError(
            f"runtime config {path}: duration names script(s) {', '.join(unknown)} without a weight", RERUN_EXPORT
        )
    problem = _config_value_problem(config)
    if problem:
        raise UserError(f"runtime config {path}: {problem}", RERUN_EXPORT)
    return config


def _config_value_problem(config: dict[str, Any]) -> str | None:
    """What CONFIG_SCHEMA's per-key checks cannot see, as the runtime uses the values (None if
    nothing): the mask id inside the vocabulary, non-empty language ids, every name mapped to a
    language id the config lists. (The generation defaults are checked as a request's
    generation_config is, at load: api.py.)"""
    model = config["model"]
    if not 0 <= model["audio_mask_id"] < model["audio_vocab_size"]:
        return (
            f"model.audio_mask_id {model['audio_mask_id']} is outside the vocabulary [0, {model['audio_vocab_size']})"
        )
    languages = config["languages"]
    ids = languages["ids"]
    if not ids or not all(ids):
        return "languages.ids must be a non-empty list of language ids (strings)"
    for name, lang in languages["name_to_id"].items():
        if lang not in ids:
            return f"languages.name_to_id maps {name!r} to {lang!r}, which is not in languages.ids"
    return None
