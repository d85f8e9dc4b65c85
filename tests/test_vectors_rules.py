"""The "rules" conformance vector (omnivoice_onnx/vectors/rules.py): the runtime equals upstream on
every input, each rule's competing reading gives another `expected` on at least one input of its
vector (so only one reading passes), and the record is stable.

Each competing reading is written here as a small function: what a port written from a prose
description of the rule could plausibly compute instead. Two readings turn out to be equivalent
on every input for OmniVoice's own data; those tests say so, prove it, and show the reading that
the vector does separate.
"""

from __future__ import annotations

import itertools
import json
import re
import unicodedata
from typing import Any

import numpy as np
import pytest
from tokenizers.processors import TemplateProcessing

from omnivoice_onnx.core import audio, text
from omnivoice_onnx.core.prompt import DENOISE, TextTokenizer
from omnivoice_onnx.vectors.format import FORMAT, audio_summary
from omnivoice_onnx.vectors.rules import RULE_CASES, check_rules, chunks_input, expected_value, rules_record


@pytest.fixture(scope="module")
def rate(config: dict) -> int:
    return config["model"]["sample_rate"]


@pytest.fixture(scope="module")
def record(config: dict, tokenizer: TextTokenizer, rate: int) -> dict:
    return rules_record(config, tokenizer, rate)


def expected_of(record: dict, rule: str) -> list[Any]:
    return [entry["expected"] for entry in record["rules"] if entry["rule"] == rule]


# --- (a) the runtime equals upstream on every input ---------------------------------------------


def upstream_value(rule: str, case: dict[str, Any], hf_tokenizer: Any, rate: int) -> Any:
    """Upstream's own function (omnivoice 0.2.1) on one input, in the vector's terms."""
    from omnivoice.models.omnivoice import _resolve_instruct, _tokenize_with_nonverbal_tags
    from omnivoice.utils.audio import cross_fade_chunks
    from omnivoice.utils.text import add_punctuation, chunk_text_punctuation
    from omnivoice.utils.voice_design import _ZH_RE

    if rule == "chunk_merge":
        return chunk_text_punctuation(case["text"], case["chunk_len"], case["min_chunk_len"])
    if rule == "end_punctuation":
        return add_punctuation(case["text"])
    if rule == "cross_fade":
        return audio_summary(cross_fade_chunks(chunks_input(case["chunks"]), rate)[0])
    if rule == "instruct_conflict":
        use_zh = bool(case["text"] and _ZH_RE.search(case["text"]))  # _preprocess_all
        try:
            return {"instruct": _resolve_instruct(case["instruct"], use_zh=use_zh)}
        except ValueError as error:
            return {"error": str(error)}
    assert rule == "tokenizer_fallback"
    return _tokenize_with_nonverbal_tags(case["text"], hf_tokenizer)[0].tolist()


def test_runtime_equals_upstream_on_every_input(record: dict, tiny_model, rate: int) -> None:
    from transformers import AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    assert {entry["rule"] for entry in record["rules"]} == set(RULE_CASES)
    for entry in record["rules"]:
        assert entry["expected"] == upstream_value(entry["rule"], entry["input"], hf_tokenizer, rate), entry


def test_cross_fade_bits_equal_upstream(config: dict, rate: int) -> None:
    """The summaries compare hashes; here the samples themselves, so a failure shows where."""
    from omnivoice.utils.audio import cross_fade_chunks

    for case in RULE_CASES["cross_fade"]:
        ours = audio.cross_fade_chunks(chunks_input(case["chunks"]), rate, config["audio"])
        np.testing.assert_array_equal(ours, cross_fade_chunks(chunks_input(case["chunks"]), rate))


# --- (b) each competing reading fails the vector -------------------------------------------------


def chunks_stripped_first(case: dict[str, Any], rules: dict[str, Any], separator: str) -> list[str]:
    """Reading: sentences are stripped before they are measured and merged, and joined by `separator`."""
    sentences = text.chunk_text_punctuation(case["text"], 0, rules, None)  # chunk_len 0: the stripped sentences
    merged: list[str] = []
    for sentence in sentences:
        if merged and len(merged[-1]) + len(separator) + len(sentence) <= case["chunk_len"]:
            merged[-1] += separator + sentence
        else:
            merged.append(sentence)
    final: list[str] = []
    for i, chunk in enumerate(merged):
        short_first = i == 1 and len(merged[0]) < case["min_chunk_len"]
        if final and (short_first or len(chunk) < case["min_chunk_len"]):
            final[-1] += separator + chunk
        else:
            final.append(chunk)
    return final


@pytest.mark.parametrize("separator", ["", " "])
def test_chunk_merge_stripped_first_reading_fails(record: dict, config: dict, separator: str) -> None:
    wrong = [chunks_stripped_first(case, config["text"], separator) for case in RULE_CASES["chunk_merge"]]
    assert wrong != expected_of(record, "chunk_merge")


def with_mark_endswith(value: str, rules: dict[str, Any]) -> str:
    """Reading: the text "ends with an end mark" when it ends with any entry, "……" included."""
    value = value.strip()
    if value and not any(value.endswith(mark) for mark in rules["end_punctuation"]):
        chinese = any(text.is_chinese(c, rules) for c in value)
        value += rules["chinese_full_stop"] if chinese else rules["full_stop"]
    return value


def with_mark_last_visible(value: str, rules: dict[str, Any]) -> str:
    """Reading: the "last character" is the last visible one (combining marks, variation selectors
    and format characters belong to the character before them, as in a grapheme-based string)."""
    value = value.strip()
    visible = value.rstrip("".join(c for c in set(value) if unicodedata.category(c) in ("Mn", "Me", "Cf")))
    if visible and visible[-1] not in rules["end_punctuation"]:
        chinese = any(text.is_chinese(c, rules) for c in value)
        value += rules["chinese_full_stop"] if chinese else rules["full_stop"]
    return value


def test_end_mark_endswith_reading_is_equivalent(record: dict, config: dict) -> None:
    """ "……" against the last code point: no input tells them apart, because every entry longer
    than one code point ends in a code point that is itself an entry ("……" in "…"). docs/runtime.md
    says so; this pins the data fact it rests on."""
    rules = config["text"]
    marks = set(rules["end_punctuation"])
    assert "……" in marks and all(mark[-1] in marks for mark in marks)
    assert [with_mark_endswith(case["text"], rules) for case in RULE_CASES["end_punctuation"]] == expected_of(
        record, "end_punctuation"
    )


def test_end_mark_last_visible_reading_fails(record: dict, config: dict) -> None:
    wrong = [with_mark_last_visible(case["text"], config["text"]) for case in RULE_CASES["end_punctuation"]]
    assert wrong != expected_of(record, "end_punctuation")


def cross_fade_own_chunk(chunks: list[np.ndarray], rate: int, rules: dict[str, Any]) -> np.ndarray:
    """Reading: a chunk shorter than the fade fades out over its own length only (not over the
    silence and the chunk before it)."""
    fade_n = int(rules["cross_fade_silence_s"] * rate) // 3
    merged, previous = chunks[0].copy(), chunks[0].shape[-1]
    for chunk in chunks[1:]:
        n = min(fade_n, previous)
        if n > 0:
            merged[..., -n:] *= np.linspace(1, 0, n, dtype=np.float32)
        fade_in = chunk.copy()
        n = min(fade_n, chunk.shape[-1])
        if n > 0:
            fade_in[..., :n] *= np.linspace(0, 1, n, dtype=np.float32)
        merged = np.concatenate([merged, np.zeros((1, fade_n), np.float32), fade_in], axis=-1)
        previous = chunk.shape[-1]
    return merged


def test_cross_fade_own_chunk_reading_fails(record: dict, config: dict, rate: int) -> None:
    wrong = [
        audio_summary(cross_fade_own_chunk(chunks_input(case["chunks"]), rate, config["audio"])[0])
        for case in RULE_CASES["cross_fade"]
    ]
    expected = expected_of(record, "cross_fade")
    assert wrong != expected
    # the lengths agree: only the gains differ, so the vector catches it by the samples' hash
    assert [w["samples"] for w in wrong] == [e["samples"] for e in expected]


def instruct_checked_before_mapping(
    case: dict[str, Any], instruct_data: dict[str, Any], runtime_outcome: dict
) -> dict[str, Any]:
    """Reading: the one-item-per-category check runs on the items as written, before EN<->ZH mapping."""
    items = [
        item.strip().lower() for item in re.split(instruct_data["split_pattern"], case["instruct"].strip()) if item
    ]
    conflicts = [
        hits
        for category in instruct_data["mutually_exclusive"]
        if len(hits := [item for item in items if item in category]) > 1
    ]
    if not conflicts:
        return runtime_outcome
    return {
        "error": "Conflicting instruct items within the same category: "
        + "; ".join(" vs ".join(f"'{item}'" for item in group) for group in conflicts)
        + ". Each category (gender, age, pitch, style, accent, dialect) allows at most one item."
    }


def test_instruct_conflict_before_mapping_reading_fails(record: dict, config: dict) -> None:
    expected = expected_of(record, "instruct_conflict")
    wrong = [
        instruct_checked_before_mapping(case, config["instruct"], outcome)
        for case, outcome in zip(RULE_CASES["instruct_conflict"], expected)
    ]
    assert wrong != expected
    assert wrong[0] == {"error": expected[0]["error"].replace("'male' vs 'male'", "'male' vs '男'")}


def instruct_conflict_named_otherwise(
    case: dict[str, Any], instruct_data: dict[str, Any], runtime_outcome: dict, first_pair: bool
) -> dict[str, Any]:
    """Readings of which items the conflict message names: only the first two of a category
    (`first_pair`), or the categories in the order their first item appears in the instruct."""
    error = runtime_outcome.get("error", "")
    prefix = "Conflicting instruct items within the same category: "
    if not error.startswith(prefix):
        return runtime_outcome
    groups, suffix = error[len(prefix) :].split(". Each category", 1)
    parts = [group.split(" vs ") for group in groups.split("; ")]
    if first_pair:
        parts = [group[:2] for group in parts]
    else:
        items = [item.strip().lower() for item in re.split(instruct_data["split_pattern"], case["instruct"].strip())]
        first_seen = {item: i for i, item in reversed(list(enumerate(items)))}
        mapped = {**instruct_data["en_to_zh"], **instruct_data["zh_to_en"]}
        parts.sort(
            key=lambda group: min(
                first_seen.get(g.strip("'"), first_seen.get(mapped.get(g.strip("'")), 99)) for g in group
            )
        )
    return {"error": prefix + "; ".join(" vs ".join(group) for group in parts) + ". Each category" + suffix}


@pytest.mark.parametrize("first_pair", [True, False], ids=["first-pair", "instruct-order"])
def test_instruct_conflict_naming_readings_fail(record: dict, config: dict, first_pair: bool) -> None:
    """All items of a conflicting category are named (three give three), and the categories in
    mutually_exclusive's order: a port naming a pair, or ordering by the instruct, fails the vector."""
    expected = expected_of(record, "instruct_conflict")
    wrong = [
        instruct_conflict_named_otherwise(case, config["instruct"], outcome, first_pair)
        for case, outcome in zip(RULE_CASES["instruct_conflict"], expected)
    ]
    assert wrong != expected


def fallback_without_special_tokens(tokenizer: TextTokenizer, value: str, pattern: str) -> list[int]:
    """Reading: the whole-text fallback tokenizes like the segments, without special tokens."""
    cuts = sorted({0, len(value)} | {edge for match in re.finditer(pattern, value) for edge in match.span()})
    ids = [
        i
        for start, end in itertools.pairwise(cuts)
        for i in tokenizer.encode(value[start:end], add_special_tokens=False)
    ]
    return ids or tokenizer.encode(value, add_special_tokens=False)


def test_tokenizer_fallback_readings_agree_for_omnivoice_tokenizer(
    record: dict, config: dict, tokenizer: TextTokenizer
) -> None:
    """OmniVoice's tokenizer (Qwen2 byte-level BPE, no BOS/EOS template) adds nothing for
    add_special_tokens=True, so both readings give the same ids: the vector cannot and need not
    separate them for this bundle (docs/runtime.md)."""
    pattern = config["prompt"]["nonverbal_pattern"]
    assert tokenizer.encode("ok", add_special_tokens=True) == tokenizer.encode("ok", add_special_tokens=False)
    assert [
        fallback_without_special_tokens(tokenizer, case["text"], pattern) for case in RULE_CASES["tokenizer_fallback"]
    ] == expected_of(record, "tokenizer_fallback")


def test_tokenizer_fallback_reading_fails_with_a_template(config: dict, tokenizer: TextTokenizer, rate: int) -> None:
    """A tokenizer whose template adds a token (a stand-in BOS here): the vector's empty text then
    separates the readings, so a bundle with such a tokenizer gets a vector only one reading passes."""
    backend = TextTokenizer(tokenizer.backend.__class__.from_str(tokenizer.backend.to_str()))
    bos = backend.backend.token_to_id(DENOISE)
    backend.backend.post_processor = TemplateProcessing(single=f"{DENOISE} $A", special_tokens=[(DENOISE, bos)])
    pattern = config["prompt"]["nonverbal_pattern"]
    expected = [
        expected_value("tokenizer_fallback", case, config, backend, rate) for case in RULE_CASES["tokenizer_fallback"]
    ]
    assert expected[0] == [bos]
    assert [
        fallback_without_special_tokens(backend, case["text"], pattern) for case in RULE_CASES["tokenizer_fallback"]
    ] != expected


# --- (c) the record is stable, and check_rules reads it back --------------------------------------


def test_record_is_stable(record: dict, config: dict, tokenizer: TextTokenizer, rate: int) -> None:
    stored = json.loads(json.dumps(record, ensure_ascii=False))
    assert stored == record
    assert rules_record(config, tokenizer, rate) == record
    assert record["format"] == FORMAT and record["kind"] == "rules"
    assert check_rules(stored, config, tokenizer, rate) == []


def test_check_rules_names_the_first_difference(
    record: dict, config: dict, tokenizer: TextTokenizer, rate: int
) -> None:
    stored = json.loads(json.dumps(record))
    index = next(i for i, entry in enumerate(stored["rules"]) if entry["rule"] == "instruct_conflict")
    stored["rules"][index]["expected"] = {
        "error": "Conflicting instruct items within the same category: 'male' vs '男'. ..."
    }
    problems = check_rules(stored, config, tokenizer, rate)
    assert len(problems) == 1 and problems[0].startswith(f"rules[{index}] instruct_conflict")
    assert check_rules({**stored, "format": "other"}, config, tokenizer, rate)[0].startswith("format")
    assert check_rules(record, config, tokenizer, rate + 1)[0].startswith("sample_rate")
    renamed = {
        **stored,
        "rules": [{**entry, "rule": "other"} if entry["rule"] == "cross_fade" else entry for entry in stored["rules"]],
    }
    problems = check_rules(renamed, config, tokenizer, rate)
    assert problems[0].startswith("rules: no case of cross_fade") and "'other' is not one" in problems[1]
