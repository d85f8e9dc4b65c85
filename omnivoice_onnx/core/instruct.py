"""Instructs: upstream's vocabulary check (`resolve_instruct`, its three errors word for word),
whether a text makes the instruct Chinese (`instruct_use_zh`), and this runtime's reading of prose
(`read_instruct`): the vocabulary's words and a few everyday ones applied, the rest ignored and
reported, or refused when the request is strict. Every table is the bundle's runtime-config
`instruct` section; PROSE_WORDS is the runtime's own."""

from __future__ import annotations

import difflib
import re
from typing import Any

import numpy as np

from omnivoice_onnx.core.shapes import InstructReading
from omnivoice_onnx.errors import UserError


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
    if instruct is None or not instruct.strip():
        return None
    return _resolved(instruct.strip(), use_zh, instruct_data)


def _resolved(instruct_str: str, use_zh: bool, instruct_data: dict[str, Any]) -> str:
    """resolve_instruct of a stripped, non-blank instruct."""
    valid = set(instruct_data["valid"])

    normalised, unknown = [], []
    for raw in (item for item in re.split(instruct_data["split_pattern"], instruct_str) if item):
        item = raw.strip().lower()
        if item in valid:
            normalised.append(item)
        else:
            suggestion = difflib.get_close_matches(item, valid, n=1, cutoff=instruct_data["suggestion_cutoff"])
            unknown.append((raw, item, suggestion[0] if suggestion else None))
    if unknown:
        lines = [
            f"  '{raw}' -> '{item}' (unsupported; did you mean '{suggestion}'?)"
            if suggestion
            else f"  '{raw}' -> '{item}' (unsupported)"
            for raw, item, suggestion in unknown
        ]
        problem = f"Unsupported instruct items found in {instruct_str}:\n" + "\n".join(lines)
        fix = (
            "Valid English items: "
            + ", ".join(sorted(instruct_data["valid_en"]))
            + "\nValid Chinese items: "
            + "，".join(sorted(instruct_data["valid_zh"]))
            + "\n\nTip: Use only English or only Chinese instructs. English instructs should use comma + "
            "space (e.g. 'male, indian accent'),\nChinese instructs should use full-width comma "
            "(e.g. '男，河南话')."
        )
        raise UserError(_one_line(problem), _one_line(fix))

    has_dialect = any(item.endswith(instruct_data["dialect_suffix"]) for item in normalised)
    has_accent = any(instruct_data["accent_mark"] in item for item in normalised)
    if has_dialect and has_accent:
        raise UserError(
            "Cannot mix Chinese dialect and English accent in a single instruct. "
            "Dialects are for Chinese speech, accents for English speech."
        )
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
        raise UserError(
            "Conflicting instruct items within the same category: "
            + "; ".join(" vs ".join(f"'{item}'" for item in group) for group in conflicts)
            + ". Each category (gender, age, pitch, style, accent, dialect) allows at most one item."
        )

    has_chinese = any(re.search(instruct_data["zh_pattern"], item) for item in normalised)
    joiner: str = instruct_data["joiners"]["zh" if has_chinese else "en"]  # runtime-config.json's instruct section
    return joiner.join(normalised)


# Everyday words for items of upstream's English instruct vocabulary, matched as whole words in
# prose directions ("a deep voice", "an old woman", "whispering"). This runtime's own table:
# upstream reads only its items. Only unambiguous words: a bare "british" or "low" is left alone
# (an accent is matched as "british accent"), so a direction is never read as more than it says.
PROSE_WORDS = {
    **dict.fromkeys(("woman", "women", "lady", "girl", "feminine"), "female"),
    **dict.fromkeys(("man", "men", "gentleman", "boy", "masculine"), "male"),
    **dict.fromkeys(("old", "senior", "elder"), "elderly"),
    "middle aged": "middle-aged",
    "young": "young adult",
    **dict.fromkeys(("teen", "teenage", "adolescent"), "teenager"),
    **dict.fromkeys(("kid", "little kid"), "child"),
    **dict.fromkeys(("deep", "low pitched", "low-pitched"), "low pitch"),
    **dict.fromkeys(("very deep", "very low pitched", "very low-pitched"), "very low pitch"),
    **dict.fromkeys(("high pitched", "high-pitched"), "high pitch"),
    **dict.fromkeys(("very high pitched", "very high-pitched"), "very high pitch"),
    **dict.fromkeys(("whispering", "whispered", "whispers", "whispery"), "whisper"),
}
STRICT_FIX = "or let the request apply the words it knows and ignore the rest (drop strict_instructions)"


def _category(item: str, instruct_data: dict[str, Any]) -> int | None:
    return next((i for i, group in enumerate(instruct_data["mutually_exclusive"]) if item in group), None)


def _phrase_pattern(phrase: str) -> str:
    """A phrase as whole words (an English one: `male` is not found in `female`); a Chinese one anywhere."""
    if phrase.isascii():
        return r"(?<![\w-])" + re.escape(phrase) + r"(?![\w-])"
    return re.escape(phrase)


def _unknown_items(instruct: str, instruct_data: dict[str, Any]) -> list[tuple[str, str | None]]:
    """The comma-separated items of `instruct` outside the vocabulary, each with the closest item
    (difflib, upstream's cutoff) or None."""
    valid = set(instruct_data["valid"])
    unknown = []
    for raw in (item for item in re.split(instruct_data["split_pattern"], instruct.strip()) if item):
        item = raw.strip().lower()
        if item not in valid:
            close = difflib.get_close_matches(item, valid, n=1, cutoff=instruct_data["suggestion_cutoff"])
            unknown.append((raw.strip(), close[0] if close else None))
    return unknown


def vocabulary_error(instruct: str, use_zh: bool, instruct_data: dict[str, Any]) -> UserError:
    """The refusal of an instruct with items outside the vocabulary (strict_instructions): the input
    named once, each unknown item with its closest item, and the vocabulary in the request's
    language (Chinese items for a Chinese text, English items otherwise)."""
    unknown = _unknown_items(instruct, instruct_data)
    hints = [f"did you mean {close!r} for {raw!r}?" for raw, close in unknown if close]
    vocabulary, joiner = (
        (instruct_data["valid_zh"], instruct_data["joiners"]["zh"])
        if use_zh
        else (instruct_data["valid_en"], instruct_data["joiners"]["en"])
    )
    problem = f"instruct {instruct.strip()!r} is not OmniVoice's voice-design vocabulary" + (
        f" ({'; '.join(hints)})" if hints else ""
    )
    example = "'男，河南话'" if use_zh else "'male, indian accent'"
    return UserError(
        problem, f"write comma-separated items from: {joiner.join(sorted(vocabulary))} (e.g. {example}), {STRICT_FIX}"
    )


def read_instruct(
    instruct: str | None, use_zh: bool, instruct_data: dict[str, Any], strict: bool = False
) -> InstructReading:
    """A request's instruct read as the model takes it.

    An instruct of vocabulary items ("female, low pitch") resolves as upstream's (resolve_instruct:
    its refusals of conflicting items stand). Anything else is a prose direction ("Speak in a
    cheerful tone", OpenAI's `instructions`): with `strict` it is refused (vocabulary_error); else
    the vocabulary's items and PROSE_WORDS found in it as whole words are applied (the first of a
    category wins; an accent after a dialect, or the reverse, is ignored as resolve_instruct would
    refuse the pair) and the rest is ignored, both reported. OmniVoice has no free-form style
    control, so the words it cannot read are dropped rather than failing a client that sends them.
    """
    if instruct is None or not instruct.strip():
        return InstructReading(None, (), ())
    if not _unknown_items(instruct, instruct_data):
        resolved = _resolved(instruct.strip(), use_zh, instruct_data)
        return InstructReading(resolved, tuple(re.split(instruct_data["split_pattern"], resolved)), ())
    if strict:
        raise vocabulary_error(instruct, use_zh, instruct_data)
    lowered = instruct.lower()
    phrases = {
        **{item: item for item in instruct_data["valid"]},
        **{word: item for word, item in PROSE_WORDS.items() if item in instruct_data["valid"]},
    }
    taken = np.zeros(len(lowered), dtype=bool)
    found: list[tuple[int, int, str]] = []
    for phrase in sorted(phrases, key=len, reverse=True):  # "very low pitch" before "low pitch"
        for match in re.finditer(_phrase_pattern(phrase), lowered):
            if not taken[match.start() : match.end()].any():
                taken[match.start() : match.end()] = True
                found.append((match.start(), match.end(), phrases[phrase]))
    applied: list[str] = []
    ignored: list[str] = []
    categories: dict[int, str] = {}
    for start, end, item in sorted(found):
        category = _category(item, instruct_data)
        is_dialect, is_accent = item.endswith(instruct_data["dialect_suffix"]), instruct_data["accent_mark"] in item
        clash = categories.get(category) if category is not None else None
        if clash is None and (is_dialect or is_accent):
            clash = next(
                (
                    other
                    for other in applied
                    if (is_dialect and instruct_data["accent_mark"] in other)
                    or (is_accent and other.endswith(instruct_data["dialect_suffix"]))
                ),
                None,
            )
        if clash is not None:
            ignored.append(f"{instruct[start:end]} (conflicts with {clash})")
            continue
        if category is not None:
            categories[category] = item
        applied.append(item)
    pieces = re.split(r"[,，.。;；:!?！？\n]+", "".join(" " if hit else char for char, hit in zip(instruct, taken)))
    ignored = [
        _with_suggestion(" ".join(piece.split()), instruct_data) for piece in pieces if any(c.isalnum() for c in piece)
    ] + ignored
    if not applied:
        return InstructReading(None, (), tuple(ignored))
    resolved = _resolved(instruct_data["joiners"]["en"].join(applied).strip(), use_zh, instruct_data)
    return InstructReading(resolved, tuple(re.split(instruct_data["split_pattern"], resolved)), tuple(ignored))


def instructions_note(reading: InstructReading) -> str:
    """One line saying what of a prose instruct was applied and what ignored: the CLI's note, the
    server's log line (its response headers carry the two lists)."""
    applied = ", ".join(reading.applied) if reading.applied else "nothing"
    return f"instructions: applied {applied}; ignored {'; '.join(reading.ignored) or 'nothing'}"


def _with_suggestion(piece: str, instruct_data: dict[str, Any]) -> str:
    """An ignored piece, with the vocabulary item it may be a typo of ("mal" -> male)."""
    close = difflib.get_close_matches(
        piece.lower(), instruct_data["valid"], n=1, cutoff=instruct_data["suggestion_cutoff"]
    )
    return f"{piece} (did you mean {close[0]!r}?)" if close else piece
