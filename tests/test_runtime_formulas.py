"""docs/runtime.md's statements, each checked against the runtime by an independent, straightforward
implementation written from the document (not from the runtime's code), reading the same
runtime-config.json a port reads.

Upstream equality is tested elsewhere (test_runtime_text.py, test_runtime_audio.py,
test_runtime_generate.py); here the point is that the *document* is enough: a port that codes
these statements gets the runtime's values.
"""

from __future__ import annotations

import inspect
import json
import math
import random
import re
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from omnivoice_onnx.core import audio, duration, generate, prompt, request, scoring, shapes, text
from omnivoice_onnx.core.instruct import instruct_use_zh, resolve_instruct
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.vectors.format import audio_summary
from omnivoice_onnx.vectors.record import write_decoded

REPO = Path(__file__).resolve().parent.parent
VECTORS = REPO / "tests" / "conformance"
SR = 24000
F32 = np.float32


# ---- Duration --------------------------------------------------------------------------------


def doc_weight(char: str, rules: dict) -> float:
    """The weight rule as docs/runtime.md states it (a linear scan of the ranges)."""
    code, weights = ord(char), rules["weights"]
    if "A" <= char <= "Z" or "a" <= char <= "z":
        return weights["latin"]
    if code == 0x20:
        return weights["space"]
    if code == rules["tatweel"]:
        return weights["mark"]
    category = unicodedata.category(char)[0]
    by_category = {"M": "mark", "P": "punctuation", "S": "punctuation", "Z": "space", "N": "digit"}
    if category in by_category:
        return weights[by_category[category]]
    for last, script in rules["ranges"]:
        if code <= last:
            return weights[script]
    return weights[rules["upper_planes_script"]] if code > rules["upper_planes_start"] else weights["default"]


def doc_estimate(target: str, ref_text: str | None, ref_frames: int | None, rules: dict, speed: float = 1.0) -> int:
    if ref_frames is None or not ref_text:
        ref_text, ref_frames = rules["fallback_ref_text"], rules["fallback_ref_frames"]
    weight = lambda s: sum((doc_weight(c, rules) for c in s), 0)  # noqa: E731
    estimate = 0.0
    if ref_frames > 0 and ref_text and weight(ref_text) != 0:
        estimate = weight(target) / (weight(ref_text) / ref_frames)
        low = rules["low_threshold"]
        if estimate < low:
            estimate = low * (estimate / low) ** (1 / rules["boost_strength"])
    if speed > 0 and speed != 1.0:
        estimate = estimate / speed
    return max(1, int(estimate))


TEXTS = [
    "Hello, world.",
    "你好，世界！今天天气很好。",
    "こんにちは、カタカナ。",
    "안녕하세요 세계.",
    "Привет, мир!",
    "مـــرحبا بالعالم",
    "नमस्ते दुनिया। १२३",
    "Call 555-1234 now! １２３",
    "e\u0301te\u0301",
    "𠀀𠀁 \U0002a6d6",
    "Hi 🌍 [laughter]",
    "x",
    "A much longer sentence, with commas; and more words than the others here.",
]


def test_char_weight_is_the_documented_rule(config):
    rules = config["duration"]
    codes = list(range(0, 0x3000)) + list(range(0x3000, 0x110000, 7))
    assert [c for c in codes if duration.char_weight(chr(c), rules) != doc_weight(chr(c), rules)] == []


def test_estimate_and_speed_list_are_the_documented_formulas(config):
    rules = config["duration"]
    refs = [(None, None), ("The quick brown fox.", 113), ("你好世界。", 7), ("", 40)]
    for target in TEXTS:
        for ref_text, frames in refs:
            for speed in (1.0, 0.7, 1.3, 0.0, -1.0):
                assert duration.estimate_target_tokens(target, ref_text, frames, rules, speed) == doc_estimate(
                    target, ref_text, frames, rules, speed
                ), (target, ref_text, frames, speed)
    texts = TEXTS[:3]
    lengths, speed_list = duration.target_lengths(
        texts, [None] * 3, [None] * 3, [1.3, 0.8, 1.0], [2.0, None, 0.5], 25, rules
    )
    assert lengths == [50, doc_estimate(texts[1], None, None, rules, 0.8), 12]
    # with a duration: the truncated estimate at speed 1 over the fixed length; else the speed
    assert speed_list == [
        doc_estimate(texts[0], None, None, rules) / 50,
        0.8,
        doc_estimate(texts[2], None, None, rules) / 12,
    ]


# ---- Text ------------------------------------------------------------------------------------


def doc_chunks(content: str, chunk_len: int, rules: dict, min_len: int) -> list[str]:
    """docs/runtime.md's chunking, written as index arithmetic over the string."""
    split, closing, abbreviations = rules["split_punctuation"], rules["closing_marks"], rules["abbreviations"]
    sentences: list[str] = []
    start = 0
    for i, char in enumerate(content):
        if i == start and sentences and (char in split or char in closing):
            sentences[-1] += char
            start = i + 1
        elif char in split:
            current = content[start : i + 1]
            words = current.strip().split()
            if char == "." and words and words[-1] in abbreviations:
                continue
            sentences.append(current)
            start = i + 1
    if start < len(content):
        sentences.append(content[start:])
    merged: list[str] = []
    for sentence in sentences:
        if merged and len(merged[-1]) + len(sentence) <= chunk_len:
            merged[-1] += sentence
        elif not merged and len(sentence) <= chunk_len:
            merged.append(sentence)
        else:
            merged.append(sentence)
    final: list[str] = []
    for i, chunk in enumerate(merged):
        if final and ((i == 1 and len(merged[0]) < min_len) or len(chunk) < min_len):
            final[-1] += chunk
        else:
            final.append(chunk)
    return [c.strip() for c in final if c.strip()]


def test_chunking_is_the_documented_rule(config):
    rules = config["text"]
    rng = random.Random(0)
    pieces = [
        "Dr. Smith came.",
        " Mr. Jones left!",
        " Why?",
        " ok.",
        ' "Quoted," he said.',
        " (Paren.)",
        " e.g. this",
        "。你好，",
        "世界！",
        " a.",
        " No. 5 is here;",
        " St. Mary's, then",
        " ..",
        " 」】",
        " word word word",
    ]
    for _ in range(400):
        content = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 25)))
        for chunk_len in (0, 5, 20, 60, 200):
            assert text.chunk_text_punctuation(content, chunk_len, rules, rules["min_chunk_len"]) == doc_chunks(
                content, chunk_len, rules, rules["min_chunk_len"]
            ), (content, chunk_len)


def test_add_punctuation_is_the_documented_rule_and_only_for_ref_text(config, tokenizer):
    rules = config["text"]
    first, last = rules["chinese_range"]
    for sample in ["hello", "hello.", "你好", "你好。", " spaced ", "", "end……", "end…", "Mixed 中文 text"]:
        stripped = sample.strip()
        expected = stripped
        if stripped and stripped[-1] not in rules["end_punctuation"]:
            chinese = any(first <= ord(c) <= last for c in stripped)
            expected += rules["chinese_full_stop"] if chinese else rules["full_stop"]
        assert text.add_punctuation(sample, rules) == expected

    # the reference transcript gets it (create_voice_clone_prompt), the target text never does
    model = shapes.Model(
        transformer=None,
        encode=lambda wav: np.zeros((1, 8, wav.shape[-1] // 960), np.int64),
        decode=None,
        tokenizer=tokenizer,
        runtime_config=config,
        sample_rate=SR,
        hop_length=960,
        frame_rate=25,
        num_codebooks=8,
        mask_id=1024,
    )
    speech = (0.3 * np.sin(np.arange(SR) * 0.05)).astype(np.float32)
    reference = request.load_reference(model, (speech, SR), "no stop here", preprocess_prompt=True)
    assert generate.encode_reference(model, reference).ref_text == "no stop here."
    ids, _ = prompt.build_item_inputs(
        tokenizer, "target without stop", 3, None, None, "en", None, False, 8, 1024, config
    )
    assert tokenizer.backend.decode(ids[0, 0, :-3].tolist(), skip_special_tokens=False).endswith(
        "<|text_start|>target without stop<|text_end|>"
    )


# ---- Prompt and instruct ------------------------------------------------------------------------


def test_absent_language_and_instruct_are_the_literal_none(config, tokenizer):
    ids, _ = prompt.build_item_inputs(tokenizer, "Hi.", 4, None, None, None, None, True, 8, 1024, config)
    style = tokenizer.encode("<|lang_start|>None<|lang_end|><|instruct_start|>None<|instruct_end|>")
    assert ids[0, 0, : len(style)].tolist() == style
    assert config["prompt"]["no_value"] == "None"


CONFLICT = "Conflicting instruct items within the same category: "
CONFLICT_END = ". Each category (gender, age, pitch, style, accent, dialect) allows at most one item."
MIX = (
    "Cannot mix Chinese dialect and English accent in a single instruct. Dialects are for Chinese speech, "
    "accents for English speech."
)


def doc_instruct(instruct: str, target_text: str, data: dict) -> str:
    """docs/runtime.md's Instruct rule, errors 2 and 3 included (their texts as the page gives them)."""
    items = [item.strip().lower() for item in re.split(data["split_pattern"], instruct.strip()) if item]
    dialect = any(item.endswith(data["dialect_suffix"]) for item in items)
    accent = any(data["accent_mark"] in item for item in items)
    if dialect and accent:
        raise UserError(MIX)
    chinese = True if dialect else False if accent else bool(re.search(data["zh_pattern"], target_text))
    mapping = data["en_to_zh"] if chinese else data["zh_to_en"]
    items = [mapping.get(item, item) for item in items]
    conflicts = [
        hits for category in data["mutually_exclusive"] if len(hits := [i for i in items if i in category]) > 1
    ]
    if conflicts:
        raise UserError(
            CONFLICT + "; ".join(" vs ".join(f"'{i}'" for i in group) for group in conflicts) + CONFLICT_END
        )
    joiner = data["joiners"]["zh" if any(re.search(data["zh_pattern"], item) for item in items) else "en"]
    return joiner.join(items)


def outcome(call) -> str:
    try:
        return call()
    except UserError as error:
        return f"error: {error}"


def test_instruct_parsing_is_the_documented_rule(config):
    data = config["instruct"]
    for instruct in [
        "female, low pitch",
        "Male，British Accent",
        "男，河南话",
        "male, 四川话",
        " female ,, elderly ",
        "女，青年",
        "whisper, female",
        "female, american accent",
        "male, female, 男",
        "elderly, 女, child, male",
        "四川话, british accent",
        "male, male",
    ]:
        for target in ("Hello there.", "你好。"):
            assert outcome(lambda: resolve_instruct(instruct, instruct_use_zh(target, data), data)) == outcome(
                lambda: doc_instruct(instruct, target, data)
            ), (instruct, target)


def test_instruct_messages_are_the_documented_texts(config):
    """The texts docs/runtime.md gives for errors 2 and 3 are on the page verbatim."""
    page = " ".join((REPO / "docs" / "runtime.md").read_text(encoding="utf-8").split())
    assert MIX in page and CONFLICT.strip() in page and CONFLICT_END.lstrip(". ") in page


# ---- Reference preparation: numpy's pairwise sum ------------------------------------------------


def doc_pairwise(a: np.ndarray, kind: type = F32) -> np.floating:
    """numpy's pairwise summation as docs/runtime.md states it, each addition rounded to `kind`
    (float32 for ref_rms, float64 for log_softmax's sum)."""
    n = a.size
    if n < 8:
        total = kind(0)
        for value in a:
            total = kind(total + value)
        return total
    if n <= 128:
        r = [kind(v) for v in a[:8]]
        i = 8
        while i < n - n % 8:
            r = [kind(r[j] + a[i + j]) for j in range(8)]
            i += 8
        total = kind(kind(kind(r[0] + r[1]) + kind(r[2] + r[3])) + kind(kind(r[4] + r[5]) + kind(r[6] + r[7])))
        for value in a[i:]:
            total = kind(total + value)
        return total
    half = n // 2 - (n // 2) % 8
    return kind(doc_pairwise(a[:half], kind) + doc_pairwise(a[half:], kind))


def sequential_sum(a: np.ndarray, kind: type = F32) -> np.floating:
    """The competing reading: the elements added one after another from 0."""
    total = kind(0)
    for value in a:
        total = kind(total + value)
    return total


def test_reference_rms_is_the_documented_pairwise_sum():
    rng = np.random.RandomState(0)
    sequential_differs = 0
    for n in [1, 5, 7, 8, 9, 127, 128, 129, 255, 1000, 4097, 24000, 70001]:
        wav = (rng.randn(1, n) * 0.05).astype(F32)
        squares = (wav * wav).ravel()
        expected = float(np.sqrt(F32(doc_pairwise(squares) / F32(n))))
        assert audio.reference_rms(wav) == expected, n
        sequential_differs += float(np.sqrt(F32(sequential_sum(squares) / F32(n)))) != expected
    assert sequential_differs > 0  # the order is part of the formula


def test_a_sequential_rms_fails_every_clone_vector(config):
    """docs/porting.md: every clone vector's `references[*].ref_rms` is the documented pairwise sum
    of its `loaded` reference, and a sequential float32 sum gets another ref_rms for each of the
    three reference files, so it fails all six clone vectors at that field, not only the quiet one."""
    vectors = [json.loads(path.read_text(encoding="utf-8")) for path in sorted(VECTORS.glob("*.json"))]
    clones = [vector for vector in vectors if vector.get("kind") == "generate" and vector["references"]]
    assert len(clones) == 6
    for vector in clones:
        for ref in vector["references"]:
            loaded = audio.load_reference(str(VECTORS / ref["file"]), SR, config["audio"])
            assert audio_summary(loaded[0]) == ref["loaded"]
            squares = (loaded * loaded).ravel()
            assert float(np.sqrt(F32(doc_pairwise(squares) / F32(squares.size)))) == ref["ref_rms"], vector["case"]
            assert float(np.sqrt(F32(sequential_sum(squares) / F32(squares.size)))) != ref["ref_rms"], vector["case"]


# ---- Scoring: log_softmax's double sum runs in numpy's pairwise order ---------------------------


def doc_log_softmax(x: np.ndarray, total) -> np.ndarray:
    """docs/runtime.md's one-step recipe for one row: s = x - max(x) in float32, the exponentials
    in float64 summed by `total`, the log rounded once to float32, subtracted in float32."""
    shifted = x - x.max()
    return shifted - F32(math.log(total(np.exp(shifted.astype(np.float64)), np.float64)))


def test_log_softmax_sums_in_pairwise_order_and_a_sequential_double_sum_fails_the_vector():
    """Every row of the scoring-recipe vector is the documented recipe with the pairwise double
    sum (and the runtime's, on the rows stacked as the loop stacks them); a sequential double sum
    gets another float32 for a row whose maximum dominates (log-sum-exp far below 1)."""
    stored = json.loads((VECTORS / "scoring-recipe.json").read_text(encoding="utf-8"))
    rows = [
        (np.array(row[f"{side}_logits"], F32), np.array(row[f"{side}_log_softmax"], F32))
        for row in stored["rows"]
        for side in ("cond", "uncond")
    ]
    stacked = scoring.log_softmax(np.stack([logits for logits, _ in rows])[np.newaxis])[0]
    failing = []
    for i, (logits, expected) in enumerate(rows):
        assert np.array_equal(doc_log_softmax(logits, doc_pairwise), expected), i
        assert np.array_equal(stacked[i], expected), i
        if not np.array_equal(doc_log_softmax(logits, sequential_sum), expected):
            failing.append(i)
            shifted = (logits - logits.max()).astype(np.float64)
            assert math.log(np.exp(shifted).sum()) < 1e-3  # the maximum dominates the row
    assert failing  # the order is part of the recipe: the vector rejects a sequential sum


# ---- Silence removal ----------------------------------------------------------------------------


class DocSegment:
    """pydub's rules as docs/runtime.md states them: ms lengths, frame positions, padded slices."""

    def __init__(self, samples: np.ndarray, rate: int) -> None:
        self.samples, self.rate = samples, rate

    def length_ms(self) -> int:
        return round(1000 * (len(self.samples) / self.rate))

    def frame(self, ms: int) -> int:
        return int(ms * (self.rate / 1000.0))

    def slice(self, a: int, b: int) -> DocSegment:
        a, b = self.frame(min(a, self.length_ms())), self.frame(min(b, self.length_ms()))
        real = self.samples[a:b]
        pad = (b - a) - len(real) if len(real) > 0 else 0
        return DocSegment(np.concatenate([real, np.zeros(max(pad, 0), np.int16)]), self.rate)

    def rms(self, a: int, b: int) -> int:
        s = self.slice(a, b).samples.astype(np.float64)
        return int(math.sqrt(np.sum(s * s) / len(s))) if len(s) else 0


def doc_remove_silence(x: np.ndarray, rate: int, mid: int, lead: int, trail: int, rules: dict) -> np.ndarray:
    thresh, step, chunk = rules["silence_thresh_dbfs"], rules["seek_step_ms"], rules["leading_chunk_ms"]
    limit = 10 ** (thresh / 20) * 32768
    seg = DocSegment(np.trunc(np.clip(x[0] * 32768.0, -32768, 32767)).astype(np.int16), rate)
    if mid > 0:
        length = seg.length_ms()
        starts = list(range(0, length - mid + 1, step)) if length >= mid else []
        if length >= mid and (length - mid) % step:
            starts.append(length - mid)
        silent = [s for s in starts if seg.rms(s, s + mid) <= limit]
        ranges: list[list[int]] = []
        for s in silent:
            if ranges and (s == ranges[-1][2] + step or s <= ranges[-1][2] + mid):
                ranges[-1][1], ranges[-1][2] = s + mid, s
            else:
                ranges.append([s, s + mid, s])
        if not ranges:
            loud = [[0, length]]
        elif ranges[0][0] == 0 and ranges[0][1] == length:
            loud = []
        else:
            loud, previous = [], 0
            for s, e, _ in ranges:
                loud.append([previous, s])
                previous = e
            if ranges[-1][1] != length:
                loud.append([previous, length])
            if loud[0] == [0, 0]:
                loud.pop(0)
        kept = [[s - mid, e + mid] for s, e in loud]
        for left, right in zip(kept, kept[1:]):
            if right[0] < left[1]:
                left[1] = right[0] = (left[1] + right[0]) // 2
        pieces = [seg.slice(max(s, 0), min(e, length)).samples for s, e in kept]
        seg = DocSegment(np.concatenate(pieces) if pieces else np.zeros(0, np.int16), rate)

    def leading(segment: DocSegment) -> int:
        t = 0
        while t < segment.length_ms():
            rms = segment.rms(t, t + chunk)
            if rms and 20 * math.log10(rms / 32768) >= thresh:
                break
            t += chunk
        return min(t, segment.length_ms())

    seg = seg.slice(max(0, leading(seg) - lead), seg.length_ms())
    seg = DocSegment(seg.samples[::-1].copy(), rate)
    seg = seg.slice(max(0, leading(seg) - trail), seg.length_ms())
    return (seg.samples[::-1].astype(F32) / F32(32768.0))[np.newaxis]


@pytest.mark.parametrize("rate", [24000, 16000, 48000])
def test_segment_length_divides_before_it_multiplies(rate):
    """A segment's length is round(1000 * (frames / rate)): the division first, in doubles, then
    Python's round (half to even). Multiplying first differs where frames / rate is a decimal
    that ends in 5 one digit after the ms (12036 frames at 24 kHz: 501.49999999999994 -> 501
    against 501.5 -> 502), as pydub's own AudioSegment says."""
    from pydub import AudioSegment

    from omnivoice_onnx.core._silence import Int16Segment

    lengths = range(1, 4 * rate)
    differs = [n for n in lengths if round(1000 * (n / rate)) != round(1000 * n / rate)]
    assert differs
    for n in differs[:12] + [1, rate // 3, rate + 7]:
        samples = np.zeros(n, np.int16)
        pydub_len = len(AudioSegment(samples.tobytes(), frame_rate=rate, sample_width=2, channels=1))
        assert len(Int16Segment(samples, rate)) == DocSegment(samples, rate).length_ms() == pydub_len, n
    assert round(1000 * (12036 / 24000)) == 501 and round(1000 * 12036 / 24000) == 502


def silences(seed: int, rate: int) -> np.ndarray:
    rng = np.random.RandomState(seed)
    parts = []
    for ms in rng.choice([0, 40, 150, 260, 499, 501, 800, 1300], size=6):
        parts.append(np.zeros(rate * int(ms) // 1000 + rng.randint(0, 7)))
        parts.append(0.2 * np.sin(np.arange(rate * rng.randint(50, 400) // 1000) * rng.uniform(0.02, 0.2)))
    parts.append(rng.uniform(-1e-3, 1e-3, rng.randint(0, 9000)))  # a faint tail below -50 dBFS
    return np.concatenate(parts).astype(F32)[np.newaxis]


@pytest.mark.parametrize("rate", [24000, 22050])
def test_silence_removal_is_the_documented_algorithm(config, rate):
    rules = config["audio"]
    trimmed = 0
    for seed in range(12):
        x = silences(seed, rate)
        for mid, lead, trail in (rules["reference_silence_ms"], rules["output_silence_ms"], [0, 100, 100], [0, 0, 30]):
            ours = audio.remove_silence(x, rate, mid, lead, trail, rules)
            expected = doc_remove_silence(x, rate, mid, lead, trail, rules)
            assert ours.shape == expected.shape and np.array_equal(ours, expected), (seed, mid, lead, trail)
            trimmed += ours.shape[-1] < x.shape[-1]
    assert trimmed > 20


# ---- Output post-processing ---------------------------------------------------------------------


def doc_fade_and_pad(x: np.ndarray, pad: float, fade: float) -> np.ndarray:
    out = x.copy()
    k = min(int(fade * SR), x.shape[-1] // 2)
    if k > 0:
        gain = np.array([0.0] if k == 1 else [i / (k - 1) for i in range(k)]).astype(F32)
        out[..., :k] = out[..., :k] * gain
        out[..., -k:] = out[..., -k:] * (np.array([1.0], F32) if k == 1 else gain[::-1])
    zeros = np.zeros((1, int(pad * SR)), F32)
    return np.concatenate([zeros, out, zeros], axis=-1)


def test_level_fade_and_pad_are_the_documented_formulas(config):
    rules = config["audio"]
    rng = np.random.RandomState(3)
    swapped_order_differs = 0
    for n in (1, 2, 3, 100, 4801, 24000):
        x = rng.uniform(-0.7, 0.7, (1, n)).astype(F32)
        peak = np.abs(x).max()
        for pad, fade in ((0.1, 0.1), (0.0, 0.3), (0.25, 0.05), (0.0, 0.0)):
            ours = audio.post_process(x, None, SR, rules, False, pad, fade)
            assert np.array_equal(ours, doc_fade_and_pad((x / peak) * F32(rules["peak_level"]), pad, fade))
            ours = audio.post_process(x, 0.05, SR, rules, False, pad, fade)
            assert np.array_equal(ours, doc_fade_and_pad((x * F32(0.05)) / F32(rules["target_rms"]), pad, fade))
            ours = audio.post_process(x, 0.3, SR, rules, False, pad, fade)  # loud reference: level unchanged
            assert np.array_equal(ours, doc_fade_and_pad(x, pad, fade))
        swapped_order_differs += not np.array_equal((x / peak) * F32(0.5), x * (F32(0.5) / peak))
    assert swapped_order_differs > 0  # "divide first" is part of the formula
    k = 2400
    gain = np.linspace(0, 1, k, dtype=F32)
    assert not np.array_equal(np.linspace(1, 0, k, dtype=F32), F32(1) - gain)  # the mirror is not 1 - g


def test_cross_fade_is_the_documented_join(config):
    rules = config["audio"]
    n = int(rules["cross_fade_silence_s"] * SR) // 3
    rng = np.random.RandomState(4)
    for lengths in ([30000, 20000], [5000, 100, 7000], [2400, 2399, 1]):
        chunks = [rng.uniform(-0.5, 0.5, (1, m)).astype(F32) for m in lengths]
        merged = chunks[0].copy()
        for chunk in chunks[1:]:
            out_n, in_n = min(n, merged.shape[-1]), min(n, chunk.shape[-1])
            merged[..., merged.shape[-1] - out_n :] *= np.linspace(1, 0, out_n, dtype=F32)
            head = chunk.copy()
            head[..., :in_n] *= np.linspace(0, 1, in_n, dtype=F32)
            merged = np.concatenate([merged, np.zeros((1, n), F32), head], axis=-1)
        assert np.array_equal(audio.cross_fade_chunks(chunks, SR, rules), merged)


# ---- The vectors' decoded FLAC files ------------------------------------------------------------


def test_decoded_flac_rounds_half_to_even(tmp_path):
    """docs/vectors.md: a decoded output is stored as round-half-to-even(x * 32768), clipped to the
    int16 range, and read back as int16 / 32768 (write_decoded, libsndfile's FLAC)."""
    import soundfile as sf

    halves = (np.arange(-40, 40) + 0.5) / 32768
    rng = np.random.RandomState(5)
    x = np.concatenate([halves, rng.uniform(-1.1, 1.1, 20000), [1.0, -1.0, 32767.5 / 32768, -32768.5 / 32768]])
    x = x.astype(F32)
    write_decoded(tmp_path / "x.flac", x, SR)
    stored = sf.read(tmp_path / "x.flac", dtype="int16")[0]
    assert np.array_equal(stored, np.clip(np.rint(x * F32(32768)), -32768, 32767).astype(np.int16))
    assert not np.array_equal(stored, np.clip(np.floor(x * F32(32768) + F32(0.5)), -32768, 32767))  # not half up
    assert np.array_equal(sf.read(tmp_path / "x.flac", dtype="float32")[0], stored.astype(F32) / F32(32768))


# ---- The module map names what exists ------------------------------------------------------------


def test_module_map_names_functions_that_exist():
    """Every `module.name` of docs/runtime.md's module map is a name in omnivoice_onnx/core/."""
    import importlib

    page = (REPO / "docs" / "runtime.md").read_text(encoding="utf-8")
    table = page[page.index("## Module map") : page.index("## What must match exactly")]
    runtime_cells = [line.split("|")[2] for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    names = [name for cell in runtime_cells[1:] for name in re.findall(r"`([a-z_]+\.[A-Za-z_/]+)`", cell)]
    assert len(names) >= 20
    for name in names:
        module, attrs = name.split(".", 1)
        for attr in attrs.split("/"):  # `audio.load_reference/prepare_reference`: two names of one module
            assert hasattr(importlib.import_module(f"omnivoice_onnx.core.{module}"), attr), name


# ---- What the metadata's codebook_weights means ---------------------------------------------------


def test_codebook_weights_are_read_by_nothing_at_inference():
    """docs/runtime.md: `codebook_weights` are the training loss's weights; generate() never reads them."""
    from omnivoice.models.omnivoice import OmniVoice

    runtime = [p.read_text(encoding="utf-8") for p in (REPO / "omnivoice_onnx").rglob("*.py")]
    assert not any("codebook_weights" in source for source in runtime)
    inference = (
        "generate",
        "_preprocess_all",
        "_generate_iterative",
        "_generate_chunked",
        "_prepare_inference_inputs",
        "_predict_tokens_with_scoring",
        "_decode_and_post_process",
        "create_voice_clone_prompt",
    )
    assert not any("codebook_weights" in inspect.getsource(getattr(OmniVoice, name)) for name in inference)
    assert "audio_codebook_weights" in inspect.getsource(OmniVoice.forward)  # the training loss


# ---- Request validation: the order and the messages ---------------------------------------------


def test_request_messages_are_the_documented_ones(config, tokenizer):
    """Each row of docs/runtime.md's request/message table, run through request.validate (with
    the bundle's data and tokenizer; validation runs no network, so the model has none), gives
    exactly the row's message."""
    page = (REPO / "docs" / "runtime.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(text=.*)` \| `(.*)` \|$", page, flags=re.MULTILINE)
    assert len(rows) >= 20
    m = config["model"]
    model = shapes.Model(
        None,
        None,
        None,
        tokenizer,
        config,
        m["sample_rate"],
        m["hop_length"],
        m["frame_rate"],
        m["num_audio_codebook"],
        m["audio_mask_id"],
    )
    for call, message in rows:
        kwargs = eval(f"dict({call})", {"__builtins__": {}, "dict": dict, "math": math})  # the page's own text
        with pytest.raises(UserError) as error:
            settings = request.generation_config(kwargs.pop("generation_config", None), config["generation"])
            request.validate(model, kwargs.pop("text"), settings, duration_s=kwargs.pop("duration", None), **kwargs)
        assert str(error.value) == message, call
