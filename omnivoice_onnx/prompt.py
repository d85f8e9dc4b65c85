"""The transformer's input: text tokenizer, language and instruct resolution, the prompt layout.

Reproduces (omnivoice 0.2.1, omnivoice/models/omnivoice.py):
    AutoTokenizer(...)(s).input_ids      TextTokenizer.encode (from the export's tokenizer.json)
    _tokenize_with_nonverbal_tags        TextTokenizer.encode_with_nonverbal_tags
    _resolve_language                    resolve_language (an unknown language is an error here)
    _resolve_instruct                    resolve_instruct; the use_zh test of _preprocess_all
                                         (_ZH_RE on the target text) is instruct_use_zh
    _prepare_inference_inputs            build_item_inputs
    _generate_iterative (its top half)   batch_inputs: the 2B cond/uncond padded layout

Data: the language map, the instruct vocabularies and mappings, and the Chinese regex are read
from the export's runtime-config.json, which omnivoice_export/runtime_assets.py writes from the
installed upstream package; none of it is copied here. The prompt's control tokens and the
non-verbal tag pattern are literals in upstream's code, and are literals here.

Subtle points, for a port:
- The tokenizer.json is the backend AutoTokenizer really runs (transformers may rebuild the
  checkpoint's file on load, see runtime_assets.py); encode() adds what its post-processor adds,
  which for Qwen is nothing (no BOS/EOS). Special tokens in the text (<|lang_start|>, ...,
  also <|endoftext|> typed by a user) are matched as whole added tokens.
- The style prompt is tokenized in one piece; the text prompt is tokenized piecewise: each
  non-verbal tag ([laughter], ...) alone and the stretches between them alone, so BPE merges never
  cross a tag boundary.
- Token ids are int64 and repeated over the C codebooks: text positions carry the same id in
  every codebook row.
- The uncond half of the batch holds only the last target_len positions of each item (its masked
  target frames), left-aligned and padded with the mask id; its padding rows attend to
  themselves only (a True diagonal) so no softmax row is empty. Cond padding rows stay all False
  (generate() never reads them).
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tokenizers import Tokenizer

from omnivoice_onnx.errors import UserError
from omnivoice_onnx.text import combine_text, is_chinese

TOKENIZER_FILE = "tokenizer.json"
RUNTIME_CONFIG_FILE = "runtime-config.json"
RERUN_EXPORT = "re-run export_omnivoice.py"

# The prompt's control tokens (the literals of _prepare_inference_inputs); each must be a single
# added token of the tokenizer.
DENOISE = "<|denoise|>"
LANG_START, LANG_END = "<|lang_start|>", "<|lang_end|>"
INSTRUCT_START, INSTRUCT_END = "<|instruct_start|>", "<|instruct_end|>"
TEXT_START, TEXT_END = "<|text_start|>", "<|text_end|>"
CONTROL_TOKENS = (DENOISE, LANG_START, LANG_END, INSTRUCT_START, INSTRUCT_END, TEXT_START, TEXT_END)
NO_VALUE = "None"  # written in the prompt for an absent language or instruct

NONVERBAL_PATTERN = re.compile(
    r"\[(laughter|sigh|confirmation-en|question-en|question-ah|question-oh|"
    r"question-ei|question-yi|surprise-ah|surprise-oh|surprise-wa|"
    r"surprise-yo|dissatisfaction-hnn)\]"
)

# _resolve_instruct: items are separated by an ASCII or a full-width comma and any spaces.
INSTRUCT_SPLIT = re.compile(r"\s*[,，]\s*")
DIALECT_SUFFIX = "话"  # a Chinese dialect item ends in it (河南话, ...)
ACCENT_MARK = " accent"  # an English accent item contains it
SUGGESTION_CUTOFF = 0.6  # difflib.get_close_matches cutoff for "did you mean"

# A BCP-47 / POSIX-locale tag: primary language subtag, then any subtags (region, script, ...).
BCP47_TAG = re.compile(r"([A-Za-z]{2,3})(?:[-_][A-Za-z0-9]{1,8})*")
# Primary subtags people still send whose model id is another code: deprecated ISO 639-1 codes
# (iw, in, ji, jw) and the usual code for Tagalog (the model knows it as Filipino, fil), Mandarin
# (cmn, zh's main member) and Norwegian Bokmal's 639-2 code.
LANGUAGE_ALIASES = {"iw": "he", "in": "id", "ji": "yi", "jw": "jv", "tl": "fil", "cmn": "zh", "nob": "nb"}

LANGUAGE_FIX = ("pass a language name (English, Chinese, ...), id (en, zh, ...) or tag (en-US, pt_BR), or None "
                "for language-agnostic mode")

# runtime-config.json: section -> key -> expected JSON type.
CONFIG_SCHEMA: dict[str, dict[str, type]] = {
    "model": {"audio_mask_id": int, "num_audio_codebook": int, "audio_vocab_size": int},
    "generation": {},
    "languages": {"ids": list, "name_to_id": dict},
    "instruct": {"valid": list, "valid_en": list, "valid_zh": list, "en_to_zh": dict, "zh_to_en": dict,
                 "mutually_exclusive": list, "zh_pattern": str},
}


def load_runtime_config(directory: Path) -> dict[str, Any]:
    """The export's runtime-config.json (written by omnivoice_export.runtime_assets); UserError
    naming the file when it is missing, not JSON, or lacks a section or key the runtime reads."""
    path = Path(directory) / RUNTIME_CONFIG_FILE
    if not path.is_file():
        raise UserError(f"runtime config not found: {path}", RERUN_EXPORT)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"runtime config {path} is not valid JSON ({exc})", RERUN_EXPORT) from exc
    if not isinstance(config, dict):
        raise UserError(f"runtime config {path} is not a JSON object", RERUN_EXPORT)
    for section, keys in CONFIG_SCHEMA.items():
        if not isinstance(config.get(section), dict):
            raise UserError(f"runtime config {path} lacks the section {section!r}", RERUN_EXPORT)
        for key, kind in keys.items():
            value = config[section].get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise UserError(f"runtime config {path}: {section}.{key} is missing or not a "
                                f"{kind.__name__}", RERUN_EXPORT)
    problem = _config_value_problem(config)
    if problem:
        raise UserError(f"runtime config {path}: {problem}", RERUN_EXPORT)
    return config


def _config_value_problem(config: dict[str, Any]) -> str | None:
    """What is wrong inside runtime-config.json's sections, as the runtime uses them (None if
    nothing): positive sizes, the mask id inside the vocabulary, strings where strings are
    matched, every name mapped to a language id the config lists, a Chinese pattern that compiles.
    (The generation defaults are checked as a request's generation_config is, at load: api.py.)"""
    model = config["model"]
    for key in ("num_audio_codebook", "audio_vocab_size"):
        if model[key] <= 0:
            return f"model.{key} is {model[key]}, not a positive size"
    if not 0 <= model["audio_mask_id"] < model["audio_vocab_size"]:
        return f"model.audio_mask_id {model['audio_mask_id']} is outside the vocabulary [0, {model['audio_vocab_size']})"
    languages, instruct = config["languages"], config["instruct"]
    ids = languages["ids"]
    if not ids or not all(isinstance(i, str) and i for i in ids):
        return "languages.ids must be a non-empty list of language ids (strings)"
    for name, lang in languages["name_to_id"].items():
        if lang not in ids:
            return f"languages.name_to_id maps {name!r} to {lang!r}, which is not in languages.ids"
    for key in ("valid", "valid_en", "valid_zh"):
        if not all(isinstance(item, str) for item in instruct[key]):
            return f"instruct.{key} must list strings"
    for key in ("en_to_zh", "zh_to_en"):
        if not all(isinstance(v, str) for v in instruct[key].values()):
            return f"instruct.{key} must map strings to strings"
    if not all(isinstance(group, list) and all(isinstance(item, str) for item in group)
               for group in instruct["mutually_exclusive"]):
        return "instruct.mutually_exclusive must be a list of lists of strings"
    try:
        re.compile(instruct["zh_pattern"])
    except re.error as exc:
        return f"instruct.zh_pattern {instruct['zh_pattern']!r} is not a regular expression ({exc})"
    return None


class TextTokenizer:
    """The text tokenizer: `encode(s)` equals upstream's `text_tokenizer(s).input_ids`."""

    def __init__(self, backend: Tokenizer) -> None:
        self.backend = backend

    @classmethod
    def from_dir(cls, directory: Path) -> "TextTokenizer":
        """Load the export's tokenizer.json; UserError when it is missing, unreadable, or lacks one
        of the prompt's control tokens (a plain Qwen tokenizer, say)."""
        path = Path(directory) / TOKENIZER_FILE
        if not path.is_file():
            raise UserError(f"text tokenizer not found: {path}", RERUN_EXPORT)
        try:
            backend = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust library raises a bare Exception for any parse error
            raise UserError(f"text tokenizer {path} cannot be loaded ({str(exc).splitlines()[0][:200]})",
                            RERUN_EXPORT) from exc
        missing = [token for token in CONTROL_TOKENS if backend.token_to_id(token) is None]
        if missing:
            raise UserError(f"text tokenizer {path} lacks OmniVoice's control token(s) {', '.join(missing)}",
                            RERUN_EXPORT)
        return cls(backend)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`, as transformers' tokenizer(text, add_special_tokens=...).input_ids."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_with_nonverbal_tags(self, text: str) -> list[int]:
        """_tokenize_with_nonverbal_tags: each non-verbal tag and each stretch between tags
        tokenized on its own (no special tokens added), the ids concatenated; when that gives
        nothing, the whole text tokenized once with special tokens."""
        parts: list[int] = []
        last_end = 0
        for match in NONVERBAL_PATTERN.finditer(text):
            if match.start() > last_end:
                parts.extend(self.encode(text[last_end:match.start()], add_special_tokens=False))
            parts.extend(self.encode(match.group(), add_special_tokens=False))
            last_end = match.end()
        if last_end < len(text):
            parts.extend(self.encode(text[last_end:], add_special_tokens=False))
        return parts if parts else self.encode(text)


def resolve_language(language: str | None, languages: dict[str, Any]) -> str | None:
    """The language id for a name or id (_resolve_language); None for None or "None".

    An id must match exactly ("en"); a name matches case-insensitively ("english"); a BCP-47 or
    locale tag ("en-US", "pt_BR", "zh-Hant-TW", "EN") gives its primary language subtag,
    lower-cased and with LANGUAGE_ALIASES applied, when that is an id (the model's ids are
    ISO 639 codes without region or script: "pt-BR" and "pt-PT" are both "pt"). Upstream
    logs a warning for anything else and goes language-agnostic; here it is a UserError, so a
    typo never silently changes the output (None is the explicit language-agnostic choice).
    `languages` is runtime-config.json's "languages" section.
    """
    if language is None or language.lower() == "none":
        return None
    if language in languages["ids"]:
        return language
    key = language.lower()
    if key in languages["name_to_id"]:
        return languages["name_to_id"][key]
    tag = BCP47_TAG.fullmatch(language)
    if tag:
        primary = tag.group(1).lower()
        primary = LANGUAGE_ALIASES.get(primary, primary)
        if primary in languages["ids"]:
            return primary
    raise UserError(f"unknown language {language!r}", LANGUAGE_FIX)


def instruct_use_zh(text: str, instruct_data: dict[str, Any]) -> bool:
    """Whether an instruct for `text` is normalised to Chinese (_preprocess_all: _ZH_RE found in
    the target text)."""
    return bool(text and re.search(instruct_data["zh_pattern"], text))


def _one_line(text: str) -> str:
    """Upstream's multi-line message as one line: its lines stripped and joined by a space."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def resolve_instruct(instruct: str | None, use_zh: bool, instruct_data: dict[str, Any]) -> str | None:
    """The normalised voice-design instruct (_resolve_instruct), or None for None/blank.

    Items are lower-cased and validated; a dialect forces Chinese items, an accent English ones,
    otherwise `use_zh` decides; items are translated to that language and joined by "，" when any
    is Chinese, else ", ". Upstream's ValueErrors become UserErrors carrying its text: an
    unsupported item gives problem = the items with suggestions, fix = the valid items and the
    tip (each joined to one line); mixing dialect and accent, or two items of one category, give
    upstream's one-line message as the problem. `instruct_data` is runtime-config.json's
    "instruct" section.
    """
    if instruct is None:
        return None
    instruct_str = instruct.strip()
    if not instruct_str:
        return None
    valid = set(instruct_data["valid"])

    normalised, unknown = [], []
    for raw in (item for item in INSTRUCT_SPLIT.split(instruct_str) if item):
        item = raw.strip().lower()
        if item in valid:
            normalised.append(item)
        else:
            suggestion = difflib.get_close_matches(item, valid, n=1, cutoff=SUGGESTION_CUTOFF)
            unknown.append((raw, item, suggestion[0] if suggestion else None))
    if unknown:
        lines = [f"  '{raw}' -> '{item}' (unsupported; did you mean '{suggestion}'?)" if suggestion
                 else f"  '{raw}' -> '{item}' (unsupported)" for raw, item, suggestion in unknown]
        problem = f"Unsupported instruct items found in {instruct_str}:\n" + "\n".join(lines)
        fix = ("Valid English items: " + ", ".join(sorted(instruct_data["valid_en"]))
               + "\nValid Chinese items: " + "，".join(sorted(instruct_data["valid_zh"]))
               + "\n\nTip: Use only English or only Chinese instructs. English instructs should use comma + "
               "space (e.g. 'male, indian accent'),\nChinese instructs should use full-width comma "
               "(e.g. '男，河南话').")
        raise UserError(_one_line(problem), _one_line(fix))

    has_dialect = any(item.endswith(DIALECT_SUFFIX) for item in normalised)
    has_accent = any(ACCENT_MARK in item for item in normalised)
    if has_dialect and has_accent:
        raise UserError("Cannot mix Chinese dialect and English accent in a single instruct. "
                        "Dialects are for Chinese speech, accents for English speech.")
    if has_dialect:
        use_zh = True
    elif has_accent:
        use_zh = False

    mapping = instruct_data["en_to_zh"] if use_zh else instruct_data["zh_to_en"]
    normalised = [mapping.get(item, item) for item in normalised]

    conflicts = []
    for category in instruct_data["mutually_exclusive"]:
        hits = [item for item in normalised if item in category]
        if len(hits) > 1:
            conflicts.append(hits)
    if conflicts:
        raise UserError("Conflicting instruct items within the same category: "
                        + "; ".join(" vs ".join(f"'{item}'" for item in group) for group in conflicts)
                        + ". Each category (gender, age, pitch, style, accent, dialect) allows at most one item.")

    has_chinese = any(any(is_chinese(c) for c in item) for item in normalised)
    return ("，" if has_chinese else ", ").join(normalised)


def prompt_text_ids(tokenizer: TextTokenizer, text: str, ref_text: str | None, has_reference: bool,
                    lang: str | None, instruct: str | None, denoise: bool) -> tuple[np.ndarray, np.ndarray]:
    """(style ids, text ids) int64 of one item's prompt: everything before its audio positions
    (build_item_inputs' layout). Also what request.py measures a prompt's length with, before any
    array of the request's size is made."""
    style_text = DENOISE if denoise and has_reference else ""
    style_text += f"{LANG_START}{lang if lang else NO_VALUE}{LANG_END}"
    style_text += f"{INSTRUCT_START}{instruct if instruct else NO_VALUE}{INSTRUCT_END}"
    style_ids = np.asarray(tokenizer.encode(style_text), dtype=np.int64)
    wrapped_text = f"{TEXT_START}{combine_text(text, ref_text=ref_text)}{TEXT_END}"
    text_ids = np.asarray(tokenizer.encode_with_nonverbal_tags(wrapped_text), dtype=np.int64)
    return style_ids, text_ids


def build_item_inputs(tokenizer: TextTokenizer, text: str, num_target_tokens: int, ref_text: str | None,
                      ref_audio_tokens: np.ndarray | None, lang: str | None, instruct: str | None, denoise: bool,
                      num_codebooks: int, mask_id: int) -> tuple[np.ndarray, np.ndarray]:
    """One item's prompt (_prepare_inference_inputs):
    input_ids [1,C,N] int64, audio_mask [1,N] bool.

    Layout along N: style tokens ([<|denoise|>] <|lang_start|>lang<|lang_end|>
    <|instruct_start|>instruct<|instruct_end|>; denoise only with a reference), text tokens
    (<|text_start|>combine_text(text, ref_text)<|text_end|>, non-verbal tags tokenized alone),
    the reference's audio tokens [C,T] when given, then num_target_tokens mask ids.
    audio_mask is True from the first audio position (reference or target) to the end.
    `lang` and `instruct` are already resolved (resolve_language, resolve_instruct).
    """
    style_ids, text_ids = prompt_text_ids(tokenizer, text, ref_text, ref_audio_tokens is not None, lang, instruct,
                                          denoise)
    parts = [np.tile(style_ids, (num_codebooks, 1)), np.tile(text_ids, (num_codebooks, 1))]
    if ref_audio_tokens is not None:
        parts.append(np.asarray(ref_audio_tokens, dtype=np.int64))
    parts.append(np.full((num_codebooks, num_target_tokens), mask_id, dtype=np.int64))
    input_ids = np.concatenate(parts, axis=1)[None]

    total = input_ids.shape[2]
    audio_start = total - num_target_tokens - (ref_audio_tokens.shape[-1] if ref_audio_tokens is not None else 0)
    audio_mask = np.zeros((1, total), dtype=bool)
    audio_mask[0, audio_start:] = True
    return input_ids, audio_mask


def batch_inputs(items: Sequence[tuple[np.ndarray, np.ndarray]], target_lens: Sequence[int], num_codebooks: int,
                 mask_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """The classifier-free-guidance batch of _generate_iterative, from B items of build_item_inputs:
    input_ids [2B,C,S] int64, audio_mask [2B,S] bool, attention_mask [2B,1,S,S] bool, c_lens.

    S = the longest item. Row i < B is item i's full prompt (cond), row B + i its last
    target_lens[i] positions only (uncond: no style, text or reference), both left-aligned and
    padded with mask_id. Each row attends bidirectionally within its own length; an uncond row's
    padding positions attend to themselves (True diagonal). c_lens[i] is item i's length N.
    """
    batch = len(items)
    c_lens = [ids.shape[2] for ids, _ in items]
    seq = max(c_lens)
    input_ids = np.full((2 * batch, num_codebooks, seq), mask_id, dtype=np.int64)
    audio_mask = np.zeros((2 * batch, seq), dtype=bool)
    attention_mask = np.zeros((2 * batch, 1, seq, seq), dtype=bool)
    for i, ((ids, mask), c_len, u_len) in enumerate(zip(items, c_lens, target_lens)):
        input_ids[i, :, :c_len] = ids[0]
        audio_mask[i, :c_len] = mask[0]
        attention_mask[i, :, :c_len, :c_len] = True

        input_ids[batch + i, :, :u_len] = ids[0, :, -u_len:]
        audio_mask[batch + i, :u_len] = mask[0, -u_len:]
        attention_mask[batch + i, :, :u_len, :u_len] = True
        pad = np.arange(u_len, seq)
        attention_mask[batch + i, :, pad, pad] = True
    return input_ids, audio_mask, attention_mask, c_lens
