"""Text clean-up and long-text chunking, as upstream applies them before tokenizing.

Reproduces (omnivoice 0.2.1):
    omnivoice/utils/text.py         chunk_text_punctuation, add_punctuation
    omnivoice/models/omnivoice.py   _combine_text, and the chunk length of OmniVoice._generate_chunked

Subtle points, for a port:
- Everything works on code points (Python str), not bytes or UTF-16 units: `list(text)`,
  `len(text)`, `text[-1]`. A port on UTF-16 strings must iterate code points (surrogate pairs
  for emoji and CJK extension B).
- Whitespace is Python's: str.strip()/split() and the regex `\\s` take every code point for which
  str.isspace() holds, which includes U+001C..U+001F and U+0085 as well as U+00A0, U+3000 and
  the U+2000 block; .NET's char.IsWhiteSpace and `\\s` differ on some of these.
- "Chinese" always means the code point range text.chinese_range, U+4E00..U+9FFF (CJK Unified
  Ideographs, main block only): kana, Hangul and CJK extension A are not Chinese here.
- chunk_text_punctuation splits after every . , ; : ! ? (ASCII or full-width), except a "." that
  ends a known abbreviation (the last whitespace-separated word, case-sensitive); a sentence
  that would start with punctuation or a closing mark gives it to the previous one instead.
  Chunk lengths are counted in code points and the chunks are stripped afterwards.
- end_punctuation holds "……" (two code points), which `text[-1] in` never matches; a text that
  ends in "…" is matched by the single "…" entry.

Data: every set and number here (split punctuation, closing marks, end punctuation,
abbreviations, the Chinese range and full stops, min_chunk_len) is the `text` section of the
export's runtime-config.json, passed in as `rules`; omnivoice_export/step2_export/runtime_assets.py writes it
from upstream's utils/text.py.
"""

from __future__ import annotations

import re
from typing import Any

# _combine_text's substitutions, in its order (the Chinese one is built from rules["chinese_range"]).
_LINE_BREAKS = re.compile(r"[\r\n]+")
_SPACES_AND_TABS = re.compile(r"[ \t]+")
FULL_WIDTH_PARENTHESES = {"\uff08": "(", "\uff09": ")"}  # _combine_text's two str.replace calls


def is_chinese(char: str, rules: dict[str, Any]) -> bool:
    """Whether one code point is "Chinese" in upstream's sense (rules["chinese_range"])."""
    first: int
    last: int
    first, last = rules["chinese_range"]  # runtime-config.json's text section
    return first <= ord(char) <= last


def chunk_text_punctuation(text: str, chunk_len: int, rules: dict[str, Any], min_chunk_len: int | None) -> list[str]:
    """Split `text` at punctuation into chunks of at most `chunk_len` code points where possible.

    utils/text.py chunk_text_punctuation. Sentences (split as the module docstring says) are
    merged greedily while the merged length stays <= chunk_len; a longer single sentence is a
    chunk of its own. Then a chunk shorter than `min_chunk_len` is appended to the previous one;
    a short first chunk takes the second one in. OmniVoice._generate_chunked passes
    rules["min_chunk_len"] (3); None (upstream's own default) skips that step.
    """
    split, closing = set(rules["split_punctuation"]), set(rules["closing_marks"])
    abbreviations = set(rules["abbreviations"])
    sentences: list[list[str]] = []
    current: list[str] = []
    for char in text:
        if not current and sentences and (char in split or char in closing):
            sentences[-1].append(char)
            continue
        current.append(char)
        if char in split:
            is_abbreviation = False
            if char == ".":
                stripped = "".join(current).strip()
                if stripped and stripped.split()[-1] in abbreviations:
                    is_abbreviation = True
            if not is_abbreviation:
                sentences.append(current)
                current = []
    if current:
        sentences.append(current)

    merged: list[list[str]] = []
    chunk: list[str] = []
    for sentence in sentences:
        if len(chunk) + len(sentence) <= chunk_len:
            chunk.extend(sentence)
        else:
            if chunk:
                merged.append(chunk)
            chunk = sentence
    if chunk:
        merged.append(chunk)

    if min_chunk_len is None:
        final = merged
    else:
        first_is_short = len(merged) > 0 and len(merged[0]) < min_chunk_len
        final = []
        for i, chunk in enumerate(merged):
            if i == 1 and first_is_short:
                final[-1].extend(chunk)
            elif len(chunk) >= min_chunk_len or not final:
                final.append(chunk)
            else:
                final[-1].extend(chunk)
    return ["".join(chunk).strip() for chunk in final if "".join(chunk).strip()]


def text_chunk_len(text: str, target_len: int, audio_chunk_duration: float, frame_rate: int) -> int:
    """The chunk_len, in code points, that OmniVoice._generate_chunked passes for this text.

    The text's frames per code point, from its whole-text estimate `target_len`, scaled to
    `audio_chunk_duration` seconds: int(duration * frame_rate / (target_len / len(text))), in
    that order.
    """
    avg_tokens_per_char = target_len / len(text)
    return int(audio_chunk_duration * frame_rate / avg_tokens_per_char)


def add_punctuation(text: str, rules: dict[str, Any]) -> str:
    """`text` stripped, with rules["full_stop"] "." (or rules["chinese_full_stop"] "。" if it holds
    any Chinese character) appended when its last code point is not in rules["end_punctuation"];
    an empty text stays empty (utils/text.py add_punctuation). Upstream applies it to ref_text only."""
    text = text.strip()
    if not text:
        return text
    if text[-1] not in set(rules["end_punctuation"]):
        text += rules["chinese_full_stop"] if any(is_chinese(c, rules) for c in text) else rules["full_stop"]
    return text


def combine_text(text: str, rules: dict[str, Any], ref_text: str | None = None) -> str:
    """The text the model reads: reference transcript + " " + target text, cleaned
    (omnivoice.py _combine_text).

    In order: join (each stripped; a None or empty ref_text is left out), delete CR/LF, turn
    full-width parentheses into ASCII ones, collapse runs of spaces/tabs into one space, and
    delete any whitespace next to a Chinese character (rules["chinese_range"]).
    """
    full_text = ref_text.strip() + " " + text.strip() if ref_text else text.strip()
    full_text = _LINE_BREAKS.sub("", full_text)
    for full_width, ascii_char in FULL_WIDTH_PARENTHESES.items():
        full_text = full_text.replace(full_width, ascii_char)
    full_text = _SPACES_AND_TABS.sub(" ", full_text)
    first, last = (f"\\U{code:08x}" for code in rules["chinese_range"])
    chinese = f"[{first}-{last}]"
    return re.sub(rf"(?<={chinese})\s+|\s+(?={chinese})", "", full_text)
