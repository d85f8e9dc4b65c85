"""The transformer's input: text tokenizer, language resolution, the prompt layout (the instruct's
resolution is core/instruct.py's).

Reproduces (omnivoice 0.2.1, omnivoice/models/omnivoice.py):
    AutoTokenizer(...)(s).input_ids      TextTokenizer.encode (from the export's tokenizer.json)
    _tokenize_with_nonverbal_tags        TextTokenizer.encode_with_nonverbal_tags
    _resolve_language                    resolve_language (an unknown language is an error here)
    _resolve_instruct                    instruct.resolve_instruct (and instruct_use_zh)
    _prepare_inference_inputs            build_item_inputs
    _generate_iterative (its top half)   batch_inputs: the 2B cond/uncond padded layout

Data: the language map, the instruct vocabularies, mappings and rules, the Chinese regex, the
non-verbal tag pattern and the text written for an absent value are read from the export's
runtime-config.json, which omnivoice_export/step2_export/runtime_assets.py writes from the installed upstream
package; none of it is copied here. The bundle checks every key's JSON type before any of it is
used (omnivoice_onnx.runtime_config: the bundle's files are not trusted); this module reads no file
but the tokenizer.json it is handed. The prompt's control tokens are the format
of the tokenizer's added tokens, checked against tokenizer.json at load.

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

import functools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from omnivoice_onnx.core import shapes
from omnivoice_onnx.core.iso639 import ISO_639_3_TO_1
from omnivoice_onnx.core.text import combine_text
from omnivoice_onnx.errors import UserError

RERUN_EXPORT = "re-run export_omnivoice.py"

# The prompt's control tokens (the literals of _prepare_inference_inputs); each must be a single
# added token of the tokenizer.
DENOISE = "<|denoise|>"
LANG_START, LANG_END = "<|lang_start|>", "<|lang_end|>"
INSTRUCT_START, INSTRUCT_END = "<|instruct_start|>", "<|instruct_end|>"
TEXT_START, TEXT_END = "<|text_start|>", "<|text_end|>"
CONTROL_TOKENS = (DENOISE, LANG_START, LANG_END, INSTRUCT_START, INSTRUCT_END, TEXT_START, TEXT_END)
# A BCP-47 / POSIX-locale tag: primary language subtag, then any subtags (region, script, ...).
BCP47_TAG = re.compile(r"([A-Za-z]{2,3})(?:[-_][A-Za-z0-9]{1,8})*")
# Primary subtags people still send whose model id is another code: deprecated ISO 639-1 codes
# (iw, in, ji, jw) and the usual code for Tagalog (the model knows it as Filipino, fil), Mandarin
# (cmn, zh's main member) and Norwegian Bokmal's 639-2 code; and the two-letter codes of Arabic and
# Odia, whose model ids are the ISO 639-3 individual languages (Standard Arabic arb, Odia ory).
TWO_LETTER_ALIASES = {"ar": "arb", "or": "ory"}
LANGUAGE_ALIASES = {
    "iw": "he",
    "in": "id",
    "ji": "yi",
    "jw": "jv",
    "tl": "fil",
    "cmn": "zh",
    "nob": "nb",
    **TWO_LETTER_ALIASES,
}
# Model ids with no two-letter code that BCP-47 tags (and so Home Assistant) still name: Cantonese.
NAMED_THREE_LETTER = ("yue",)

LANGUAGE_FIX = (
    "pass a language name (English, Chinese, ...), id (en, zh, ...) or tag (en-US, pt_BR) (all of them: "
    "omnivoice-onnx info --languages), or leave the language out and the model infers it"
)


def language_names(languages: dict[str, Any]) -> dict[str, list[str]]:
    """runtime-config.json's languages section as id -> its names (sorted), in the config's id order:
    what `info --languages`, the page and the Wyoming voices list show."""
    names: dict[str, list[str]] = {lang_id: [] for lang_id in languages["ids"]}
    for name, lang_id in languages["name_to_id"].items():
        names[lang_id].append(name)
    return {lang_id: sorted(found) for lang_id, found in names.items()}


PARSED_TOKENIZERS = 2  # tokenizer.json contents kept parsed per process (a bundle and one other)


@functools.lru_cache(maxsize=PARSED_TOKENIZERS)
def _parsed(data: bytes) -> Tokenizer:
    """The tokenizer of these tokenizer.json bytes, parsed once per process: parsing a Qwen
    tokenizer.json costs more than the rest of opening a bundle (the investigation log measures
    it), and a process that opens several bundles or variants of one model (a comparison, a bench,
    the tests) reads the same bytes each time. Keyed by the bytes themselves, so other content is
    parsed anew; the TextTokenizers sharing the result only encode with it (the library's encode
    is thread-safe and changes nothing)."""
    return Tokenizer.from_buffer(data)


class TextTokenizer:
    """The text tokenizer: `encode(s)` equals upstream's `text_tokenizer(s).input_ids`."""

    def __init__(self, backend: Tokenizer) -> None:
        self.backend = backend  # shared by every TextTokenizer of the same bytes (_parsed): read-only

    @classmethod
    def from_file(cls, path: Path, data: bytes | None = None) -> TextTokenizer:
        """Load the export's tokenizer.json at `path` (bundle.Folder.tokenizer_path); UserError when it
        is missing, unreadable, or lacks one of the prompt's control tokens (a plain Qwen tokenizer,
        say). `data`: the file's bytes as the bundle verified them (built from those, not re-read)."""
        path = Path(path)
        if data is None and not path.is_file():
            raise UserError(f"text tokenizer not found: {path}", RERUN_EXPORT)
        try:
            backend = _parsed(path.read_bytes() if data is None else data)
        except Exception as exc:  # the Rust library raises a bare Exception for any parse error; OSError: unreadable
            raise UserError(
                f"text tokenizer {path} cannot be loaded ({str(exc).splitlines()[0][:200]})", RERUN_EXPORT
            ) from exc
        missing = [token for token in CONTROL_TOKENS if backend.token_to_id(token) is None]
        if missing:
            raise UserError(
                f"text tokenizer {path} lacks OmniVoice's control token(s) {', '.join(missing)}", RERUN_EXPORT
            )
        return cls(backend)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`, as transformers' tokenizer(text, add_special_tokens=...).input_ids."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_with_nonverbal_tags(self, text: str, nonverbal_pattern: str) -> list[int]:
        """_tokenize_with_nonverbal_tags: each match of `nonverbal_pattern` (runtime-config.json
        prompt.nonverbal_pattern) and each stretch between matches tokenized on its own (no
        special tokens added), the ids concatenated; when that gives nothing, the whole text
        tokenized once with special tokens."""
        parts: list[int] = []
        last_end = 0
        for match in re.finditer(nonverbal_pattern, text):
            if match.start() > last_end:
                parts.extend(self.encode(text[last_end : match.start()], add_special_tokens=False))
            parts.extend(self.encode(match.group(), add_special_tokens=False))
            last_end = match.end()
        if last_end < len(text):
            parts.extend(self.encode(text[last_end:], add_special_tokens=False))
        return parts if parts else self.encode(text)


def advertised_languages(languages: dict[str, Any]) -> list[str]:
    """The model's languages as the BCP-47 codes Home Assistant can name, sorted: its two-letter ids,
    TWO_LETTER_ALIASES whose id it has, and NAMED_THREE_LETTER. What the Wyoming server lists
    (all 646 ids, mostly ISO 639-3, bury English in a picker); resolve_language takes each of
    these, and every other id as well."""
    ids = set(languages["ids"])
    found = {lang for lang in ids if len(lang) == 2}
    found |= {code for code, lang in TWO_LETTER_ALIASES.items() if lang in ids}
    return sorted(found | (ids & set(NAMED_THREE_LETTER)))


def resolve_language(language: str | None, languages: dict[str, Any]) -> str | None:
    """The language id for a name or id (_resolve_language); None for None or "None".

    An id must match exactly ("en"); a name matches case-insensitively ("english"); a BCP-47 or
    locale tag ("en-US", "pt_BR", "zh-Hant-TW", "EN", "eng") gives its primary language subtag,
    lower-cased, a three-letter code of a two-letter language made two-letter (iso639), and with
    LANGUAGE_ALIASES applied, when that is an id (the model's ids are
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
    names: dict[str, str] = languages["name_to_id"]  # runtime-config.json's languages section
    if key in names:
        return names[key]
    tag = BCP47_TAG.fullmatch(language)
    if tag:
        primary = tag.group(1).lower()
        if primary not in languages["ids"]:  # "eng" -> "en" (the model's own three-letter ids stay)
            primary = ISO_639_3_TO_1.get(primary, primary)
        primary = LANGUAGE_ALIASES.get(primary, primary)
        if primary in languages["ids"]:
            return primary
    raise UserError(f"unknown language {language!r}", LANGUAGE_FIX)


def prompt_text_ids(
    tokenizer: shapes.Tokenizer,
    text: str,
    ref_text: str | None,
    has_reference: bool,
    lang: str | None,
    instruct: str | None,
    denoise: bool,
    config: dict[str, Any],
) -> tuple[np.ndarray, np.ndarray]:
    """(style ids, text ids) int64 of one item's prompt: everything before its audio positions
    (build_item_inputs' layout). Also what request.py measures a prompt's length with, before any
    array of the request's size is made. `config` is runtime-config.json."""
    no_value = config["prompt"]["no_value"]
    style_text = DENOISE if denoise and has_reference else ""
    style_text += f"{LANG_START}{lang if lang else no_value}{LANG_END}"
    style_text += f"{INSTRUCT_START}{instruct if instruct else no_value}{INSTRUCT_END}"
    style_ids = np.asarray(tokenizer.encode(style_text), dtype=np.int64)
    wrapped_text = f"{TEXT_START}{combine_text(text, config['text'], ref_text=ref_text)}{TEXT_END}"
    text_ids = np.asarray(
        tokenizer.encode_with_nonverbal_tags(wrapped_text, config["prompt"]["nonverbal_pattern"]), dtype=np.int64
    )
    return style_ids, text_ids


def build_item_inputs(
    tokenizer: shapes.Tokenizer,
    text: str,
    num_target_tokens: int,
    ref_text: str | None,
    ref_audio_tokens: np.ndarray | None,
    lang: str | None,
    instruct: str | None,
    denoise: bool,
    num_codebooks: int,
    mask_id: int,
    config: dict[str, Any],
) -> tuple[np.ndarray, np.ndarray]:
    """One item's prompt (_prepare_inference_inputs):
    input_ids [1,C,N] int64, audio_mask [1,N] bool.

    Layout along N: style tokens ([<|denoise|>] <|lang_start|>lang<|lang_end|>
    <|instruct_start|>instruct<|instruct_end|>; denoise only with a reference), text tokens
    (<|text_start|>combine_text(text, ref_text)<|text_end|>, non-verbal tags tokenized alone),
    the reference's audio tokens [C,T] when given, then num_target_tokens mask ids.
    audio_mask is True from the first audio position (reference or target) to the end.
    `lang` and `instruct` are already resolved (resolve_language, resolve_instruct); an absent
    one is written as prompt.no_value ("None"). `config` is runtime-config.json.
    """
    style_ids, text_ids = prompt_text_ids(
        tokenizer, text, ref_text, ref_audio_tokens is not None, lang, instruct, denoise, config
    )
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


def batch_inputs(
    items: Sequence[tuple[np.ndarray, np.ndarray]], target_lens: Sequence[int], num_codebooks: int, mask_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
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
