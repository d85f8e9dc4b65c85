"""The "rules" conformance vector: one case list per host-side rule that a port could read two ways.

A generate vector exercises these rules only where its texts happen to reach them; this vector
pins each one with inputs on which a competing reading gives another result (tests/test_vectors_rules.py
shows it, reading by reading). Two of the readings cannot change any result with
OmniVoice's data and tokenizer ("……" against the last code point; the fallback's special tokens):
their cases pin the rule, the test proves the equivalence. It needs no graph run: a port checks it
by calling its own text, prompt and audio functions on `input` and comparing with `expected`:
strings, lists of ids and {"instruct"} / {"error"} objects exactly; the cross-fade's `expected` is
an audio summary (vectors.format.audio_summary) of the joined mono samples, whose `samples` and
`sha256_f32le` a port matches exactly (float32 products with the gains docs/runtime.md gives; the
other statistics only help to find where a difference starts).

The rules and the upstream functions (omnivoice 0.2.1) they come from:
    chunk_merge        utils/text.py chunk_text_punctuation: sentences are merged as raw code
                       point lists (no separator added, nothing stripped, lengths counted with
                       their spaces), and only the final chunks are stripped
    end_punctuation    utils/text.py add_punctuation: `text[-1] in END_PUNCTUATION`, the last code
                       point after str.strip(); the two-code-point entry "……" never matches, and
                       need not (its last code point "…" is an entry), but a combining mark or
                       variation selector after a mark is a code point of its own
    cross_fade         utils/audio.py cross_fade_chunks: the fade-out covers the last
                       min(n, len(merged)) samples of everything joined so far, so after a chunk
                       of L < n samples it runs back over n - L zeros of the silence before it
                       (the chunk gets the ramp's last L gains, not a ramp of its own)
    instruct_conflict  models/omnivoice.py _resolve_instruct: the one-item-per-category check runs
                       after the EN<->ZH mapping, so "male, 男" conflicts as 'male' vs 'male';
                       every item of a conflicting category is named (three give three), and
                       each conflicting category, in mutually_exclusive's order
    tokenizer_fallback models/omnivoice.py _tokenize_with_nonverbal_tags: when no segment gives
                       an id (only the empty text), the whole text is tokenized once with
                       special tokens (add_special_tokens=True)

    rules_record(runtime_config, tokenizer, sample_rate)  -> the vector (dict, JSON-serialisable)
    check_rules(stored, runtime_config, tokenizer, sample_rate) -> differences, first = where to look
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omnivoice_onnx.core import audio, text
from omnivoice_onnx.core.instruct import instruct_use_zh, resolve_instruct
from omnivoice_onnx.core.prompt import TextTokenizer
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.vectors.format import FORMAT, audio_summary, short

RULES_CASE = "ambiguous-rules"

# Inputs per rule (docs/runtime.md states each rule; the comment says which reading each input splits).
RULE_CASES: dict[str, list[dict[str, Any]]] = {
    "chunk_merge": [
        # " Two." is 5 code points raw, 4 stripped: 4 + 5 > 8 keeps them apart, 4 + 4 <= 8 would merge
        {"text": "One. Two. Three. Four.", "chunk_len": 8, "min_chunk_len": 3},
        # the short last chunk "  B." (4 < 5) joins with both spaces kept (a " " separator would leave one)
        {"text": "Hello there.  B.", "chunk_len": 12, "min_chunk_len": 5},
        # a short first chunk takes the second in, with no separator between Chinese sentences
        {"text": "好。今天天气很好。", "chunk_len": 5, "min_chunk_len": 3},
        # no space after the comma: the merged chunk keeps none
        {"text": "Yes,no,maybe so. Fine.", "chunk_len": 16, "min_chunk_len": 3},
    ],
    "end_punctuation": [
        {"text": "你好……"},  # ends in the multi-code-point entry: its last code point "…" is an entry
        {"text": "Wait..."},
        {"text": "Well…"},
        {"text": "Stop!\ufe0f"},  # a variation selector after "!": the last code point is not a mark
        {"text": "Done.\u0301  "},  # a combining accent after "." (trailing spaces stripped first)
        {"text": "她说“好”"},  # a closing quote is an end mark
        {"text": "No mark"},
        {"text": "   "},  # empty after strip: stays empty
    ],
    "cross_fade": [
        # chunks as [samples, value]: chunk k is `samples` copies of float32 `value` (mono)
        {"chunks": [[4800, 0.5], [1000, -0.25], [4800, 0.75]]},  # a middle chunk shorter than the fade
        {"chunks": [[4800, 0.5], [2400, 0.25], [30, -0.5], [4800, 0.125]]},
        {"chunks": [[700, 0.5], [4800, 0.25]]},  # a first chunk shorter than the fade
        {"chunks": [[4800, 0.5], [4800, 0.25], [100, 0.75]]},  # a last chunk shorter than the fade
    ],
    "instruct_conflict": [
        {"instruct": "male, 男", "text": "Hello."},
        {"instruct": "耳语, Whisper", "text": "你好。"},
        {"instruct": "女, male", "text": "Hello."},
        {"instruct": "female, 青年", "text": "你好。"},
        {"instruct": "low pitch, 低音调, 四川话", "text": "Hello."},  # the dialect forces Chinese
        # three items of one category: all three are named, not a pair
        {"instruct": "male, female, 男", "text": "Hello."},
        # two categories in conflict: both named, in mutually_exclusive's order (gender before age)
        {"instruct": "elderly, 女, child, male", "text": "Hello."},
        {"instruct": "四川话, british accent", "text": "Hello."},  # a dialect and an accent: the mix error
    ],
    "tokenizer_fallback": [
        {"text": ""},  # no segment gives an id: the fallback's case
        {"text": "[laughter]"},
        {"text": "<|text_start|>[laughter] ok<|text_end|>"},
    ],
}


def chunks_input(chunks: list[list[Any]]) -> list[np.ndarray]:
    """The cross_fade case's chunks as arrays: [samples, value] -> float32 [1, samples] of value."""
    return [np.full((1, samples), value, dtype=np.float32) for samples, value in chunks]


def instruct_outcome(instruct: str, target_text: str, instruct_data: dict[str, Any]) -> dict[str, Any]:
    """{"instruct": the normalised instruct} or {"error": the problem line} for one instruct and the
    target text that chooses its language (instruct_use_zh)."""
    try:
        return {"instruct": resolve_instruct(instruct, instruct_use_zh(target_text, instruct_data), instruct_data)}
    except UserError as error:
        return {"error": error.problem}


def expected_value(
    rule: str, case: dict[str, Any], runtime_config: dict[str, Any], tokenizer: TextTokenizer, sample_rate: int
) -> Any:
    """What the runtime computes for one input of one rule (the vector's `expected`)."""
    if rule == "chunk_merge":
        return text.chunk_text_punctuation(
            case["text"], case["chunk_len"], runtime_config["text"], case["min_chunk_len"]
        )
    if rule == "end_punctuation":
        return text.add_punctuation(case["text"], runtime_config["text"])
    if rule == "cross_fade":
        merged = audio.cross_fade_chunks(chunks_input(case["chunks"]), sample_rate, runtime_config["audio"])
        return audio_summary(merged[0])
    if rule == "instruct_conflict":
        return instruct_outcome(case["instruct"], case["text"], runtime_config["instruct"])
    if rule == "tokenizer_fallback":
        return tokenizer.encode_with_nonverbal_tags(case["text"], runtime_config["prompt"]["nonverbal_pattern"])
    raise ValueError(f"no rule {rule!r} in RULE_CASES")


def rules_record(runtime_config: dict[str, Any], tokenizer: TextTokenizer, sample_rate: int) -> dict[str, Any]:
    """The vector: every input of RULE_CASES with what this runtime computes for it.

    `runtime_config` is the bundle's runtime-config.json (loaded), `tokenizer` its tokenizer.json,
    `sample_rate` the graphs' rate (the cross-fade's length is a third of
    audio.cross_fade_silence_s at that rate)."""
    return {
        "format": FORMAT,
        "kind": "rules",
        "case": RULES_CASE,
        "sample_rate": sample_rate,
        "rules": [
            {
                "rule": rule,
                "input": case,
                "expected": expected_value(rule, case, runtime_config, tokenizer, sample_rate),
            }
            for rule, cases in RULE_CASES.items()
            for case in cases
        ],
    }


def check_rules(
    stored: dict[str, Any], runtime_config: dict[str, Any], tokenizer: TextTokenizer, sample_rate: int
) -> list[str]:
    """Differences between a stored rules vector and this runtime, one line each (a rule the vector
    lacks first, then its entries in order: the first line is where to look); [] when it conforms.
    Every `expected` must be JSON-equal, the cross-fade's audio summaries included: given the same
    float32 input, the fade is exact."""
    if stored.get("format") != FORMAT:
        return [f"format {stored.get('format')!r}, this replay reads {FORMAT!r}"]
    if stored.get("sample_rate") != sample_rate:
        return [f"sample_rate {stored.get('sample_rate')!r}, the bundle's is {sample_rate}"]
    entries = stored.get("rules", [])
    problems = [
        f"rules: no case of {rule} (an older vector: regenerate it)"
        for rule in RULE_CASES
        if rule not in {entry.get("rule") for entry in entries}
    ]
    for i, entry in enumerate(entries):
        if entry.get("rule") not in RULE_CASES:
            problems.append(
                f"rules[{i}]: rule {entry.get('rule')!r} is not one this replay knows ({', '.join(RULE_CASES)})"
            )
            continue
        ours = expected_value(entry["rule"], entry["input"], runtime_config, tokenizer, sample_rate)
        if ours != entry["expected"]:
            problems.append(
                f"rules[{i}] {entry['rule']} {short(entry['input'])}: expected "
                f"{short(entry['expected'])}, got {short(ours)}"
            )
    return problems
