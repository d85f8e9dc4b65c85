"""The runtime's text side equals upstream's: duration, chunking, tokenizer, language, instruct, prompt.

Every expected value comes from calling the real upstream function (omnivoice 0.2.1) on the same
input, on the tiny checkpoint (whose tokenizer is the real Qwen tokenizer rebuilt). The batch
layout is compared against the tensors upstream's generate() really feeds its first forward.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omnivoice.models import omnivoice as upstream
from omnivoice.utils import text as upstream_text
from omnivoice.utils import voice_design
from omnivoice.utils.duration import RuleDurationEstimator
from omnivoice.utils.lang_map import LANG_IDS, LANG_NAME_TO_ID, lang_display_name

from omnivoice_export.step0_checkpoints.checkpoints import model_fingerprint
from omnivoice_export.step2_export.runtime_assets import write_runtime_assets
from omnivoice_onnx import bundle
from omnivoice_onnx.core import duration, prompt, text
from omnivoice_onnx.core.instruct import instruct_use_zh, resolve_instruct
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.runtime_config import load_runtime_config

REPO = Path(__file__).resolve().parent.parent
FRAME_RATE = 25

# Texts in many scripts and shapes; each is used as target, reference, tokenizer and chunker input.
TEXTS = [
    "Hello, world.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Dr. Smith met Mr. Jones at St. Mary's on Jan. 3, e.g. at noon; approx. 5 people came, i.e. few.",
    'He said, "It\'s fine." Then he left! Really? Yes... (maybe) [not sure].',
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "我 今天 去 了 English class ， 很 好 。",
    "こんにちは、世界。カタカナとひらがな、そして漢字。",
    "안녕하세요 세계. 반갑습니다!",
    "Привет, мир! Как дела? Всё хорошо.",
    "مَرْحَبًا بِالْعَالَم. مـــرحبا",
    "שלום עולם, מה שלומך?",
    "नमस्ते दुनिया। आप कैसे हैं? १२३",
    "হ্যালো বিশ্ব। வணக்கம் உலகம்.",
    "สวัสดีชาวโลก ສະບາຍດີ",
    "សួស្តី​ពិភពលោក မင်္ဂလာပါ",
    "Γειά σου κόσμε. Բարեւ աշխարհ. გამარჯობა მსოფლიო.",
    "ሰላም ለዓለም። ꆈꌠꉙ",
    "Chào thế giới, tôi là người Việt.",
    "Call 555-1234 or 42 now! １２３ ٣٤٥",
    "e\u0301te\u0301 cafe\u0301 Z\u0351\u0352a\u0353l\u0354g\u0355o",
    "Hello 🌍! This is fun 🎉 👨‍👩‍👧 ❤️.",
    "[laughter] That's so funny [sigh] okay. [question-en] Really? [unknown-tag] hmm",
    "哈哈[laughter]真的吗[surprise-wa]太好了",
    "  spaced\ttext\n\nnew line\r\nend  ",
    "\u3000全角スペース\u3000と\u00a0nbsp\u2028line\u2029para\x1cfs\x85nel",
    "（注）这是中文括号（example）。",
    "𠀀𠀁𪜀 CJK extension B, \U0002a6d6 and \U0001f600.",
    "no punctuation at all just a long run of words that goes on and on without any stop whatsoever",
    "Mr.Smith vs. Mrs.Jones etc. Etc. fig. 3 def. x No. 5 Sept. 9",
    "…",
    "Wait…",
    "……",
    ".",
    "!?",
    " ",
    "",
    "a",
    "<|endoftext|> typed <|text_start|> by a user <|im_end|>",
    "'quoted'” closing」 marks】 >here",
]

SCRIPT_POOLS = [  # (first, last) code points random texts are drawn from
    (0x20, 0x7E),
    (0xA0, 0x24F),
    (0x300, 0x36F),
    (0x370, 0x3FF),
    (0x400, 0x4FF),
    (0x590, 0x5FF),
    (0x600, 0x6FF),
    (0x900, 0x97F),
    (0x980, 0x9FF),
    (0xB80, 0xBFF),
    (0xE00, 0xE7F),
    (0x1100, 0x11FF),
    (0x1780, 0x17FF),
    (0x1E00, 0x1EFF),
    (0x2000, 0x206F),
    (0x3000, 0x303F),
    (0x3040, 0x30FF),
    (0x4E00, 0x9FFF),
    (0xAC00, 0xD7AF),
    (0xFF00, 0xFFEF),
    (0x1F300, 0x1F64F),
    (0x20000, 0x2A6DF),
    (0xE0000, 0xE007F),
]


def random_text(rng: random.Random, max_len: int = 60) -> str:
    pools = rng.sample(SCRIPT_POOLS, rng.randint(1, 4))
    chars = []
    for _ in range(rng.randint(0, max_len)):
        roll = rng.random()
        if roll < 0.15:
            chars.append(" ")
        elif roll < 0.22:
            chars.append(rng.choice(".,;:!?。，；：！？\"')]》」\n\t"))
        else:
            first, last = rng.choice(pools)
            chars.append(chr(rng.randint(first, last)))
    return "".join(chars)


RANDOM_TEXTS = [random_text(random.Random(seed)) for seed in range(300)]


def one_line(message: str) -> str:
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


@contextlib.contextmanager
def recording(obj, name: str, record):
    """Replace obj.name by a pass-through that first calls record(*args, **kwargs); restored after."""
    original = getattr(obj, name)

    def wrapper(*args, **kwargs):
        record(*args, **kwargs)
        return original(*args, **kwargs)

    setattr(obj, name, wrapper)
    try:
        yield
    finally:
        delattr(obj, name)


# ----------------------------------------------------------------------------------------------
# Duration
# ----------------------------------------------------------------------------------------------


def test_duration_tables_are_upstreams(config):
    estimator = RuleDurationEstimator()
    assert config["duration"]["weights"] == estimator.weights
    assert [tuple(r) for r in config["duration"]["ranges"]] == estimator.ranges


def test_char_weight_every_code_point(config):
    """All 1,114,112 code points (surrogates included), against _get_char_weight."""
    estimator, rules = RuleDurationEstimator(), config["duration"]
    mismatches = [
        code
        for code in range(0x110000)
        if duration.char_weight(chr(code), rules) != estimator._get_char_weight(chr(code))
    ]
    assert mismatches == []


def test_estimate_duration_exact(config):
    estimator = RuleDurationEstimator()
    rng = random.Random(0)
    texts = TEXTS + RANDOM_TEXTS
    cases = [(t, r, f) for t in TEXTS for r in TEXTS for f in (1, 25, 125.0)]
    cases += [
        (rng.choice(texts), rng.choice(texts), rng.choice([0, -3, 1, 7, 25, 50, 125, 333, 500, 0.5]))
        for _ in range(5000)
    ]
    rules = config["duration"]
    for target, ref, frames in cases:
        assert duration.estimate_duration(target, ref, frames, rules) == estimator.estimate_duration(
            target, ref, frames
        ), (target, ref, frames)
    for target in texts:  # other thresholds and boosts, and no threshold at all
        for low, boost in ((None, 3), (10, 2), (100, 1), (50, 4)):
            other = {**rules, "low_threshold": low, "boost_strength": boost}
            assert duration.estimate_duration(target, "Nice to meet you.", 25, other) == estimator.estimate_duration(
                target, "Nice to meet you.", 25, low, boost
            )


SPEEDS = [1.0, 0.5, 0.8, 1.2, 2.0, 3.7, 0.0, -1.0, 1]


def test_estimate_target_tokens(torch_model, config):
    rng = random.Random(1)
    texts = TEXTS + RANDOM_TEXTS
    cases = [(t, None, None, s) for t in texts for s in SPEEDS]
    cases += [(t, "", 100, 1.0) for t in TEXTS] + [(t, "Hello.", None, 1.0) for t in TEXTS]
    cases += [
        (rng.choice(texts), rng.choice(TEXTS), rng.choice([1, 10, 75, 125, 250, 500]), rng.choice(SPEEDS))
        for _ in range(4000)
    ]
    for target, ref, frames, speed in cases:
        assert duration.estimate_target_tokens(
            target, ref, frames, config["duration"], speed
        ) == torch_model._estimate_target_tokens(target, ref, frames, speed=speed), (target, ref, frames, speed)


def _prompt(ref_text: str | None, frames: int | None):
    if ref_text is None:
        return None
    return upstream.VoiceClonePrompt(
        ref_audio_tokens=torch.zeros(8, frames, dtype=torch.long), ref_text=ref_text, ref_rms=0.05
    )


TARGET_LENGTH_CASES = [  # (speed, duration) as generate() takes them
    (None, None),
    (1.3, None),
    (0.7, None),
    (None, 2.5),
    (None, 0.01),
    (None, 0.0),
    (1.5, 3.0),
    (2, 1),
    ([1.2, 1.0, 0.9], None),
    (None, [None, 4.2, 0.3]),
    ([0.5, 2.0, None], [3.3, None, 2.0]),
    ([None, 1.0, 1.0], [1.0, None, None]),
    (-1.0, None),
    ([1.1, 1.2, 1.3, 1.4], None),
]


@pytest.mark.parametrize("with_ref", [False, True], ids=["no-ref", "ref"])
@pytest.mark.parametrize("speed,dur", TARGET_LENGTH_CASES)
def test_target_lengths_match_preprocess_all(torch_model, config, with_ref, speed, dur):
    texts = [TEXTS[1], TEXTS[4], TEXTS[20]]
    refs = [("The quick brown fox.", 113), ("你好世界。", 61), ("Short.", 9)] if with_ref else [(None, None)] * 3
    prompts = [_prompt(r, f) for r, f in refs] if with_ref else None
    task = torch_model._preprocess_all(text=texts, voice_clone_prompt=prompts, speed=speed, duration=dur)
    lengths, speed_list = duration.target_lengths(
        texts, [r for r, _ in refs], [f for _, f in refs], speed, dur, FRAME_RATE, config["duration"]
    )
    assert lengths == task.target_lens
    assert speed_list == task.speed
    assert torch_model.audio_tokenizer.config.frame_rate == FRAME_RATE


@pytest.mark.parametrize("speed,dur", [([1.2], None), (None, [2.0]), ([None, 1.0], None), ([1.0, None], [2.0, None])])
def test_target_lengths_user_errors_where_upstream_crashes(torch_model, config, speed, dur):
    texts = ["One.", "Two."]
    with pytest.raises((IndexError, TypeError)):
        torch_model._preprocess_all(text=texts, speed=speed, duration=dur)
    with pytest.raises(UserError):
        duration.target_lengths(texts, [None, None], [None, None], speed, dur, FRAME_RATE, config["duration"])


# ----------------------------------------------------------------------------------------------
# Text clean-up and chunking
# ----------------------------------------------------------------------------------------------


def test_text_tables_are_upstreams(config):
    rules = config["text"]
    assert set(rules["split_punctuation"]) == upstream_text.SPLIT_PUNCTUATION
    assert set(rules["closing_marks"]) == upstream_text.CLOSING_MARKS
    assert set(rules["end_punctuation"]) == upstream_text.END_PUNCTUATION
    assert set(rules["abbreviations"]) == upstream_text.ABBREVIATIONS
    assert config["prompt"]["nonverbal_pattern"] == upstream._NONVERBAL_PATTERN.pattern


def _long_texts() -> list[str]:
    rng = random.Random(2)
    sentences = [t for t in TEXTS if t.strip()]
    longs = [" ".join(rng.choice(sentences) for _ in range(rng.randint(5, 40))) for _ in range(60)]
    longs += ["".join(rng.choice(sentences) for _ in range(20)) for _ in range(20)]  # no joining spaces
    longs += [
        TEXTS[27] * 12,
        "word " * 300,
        "。" * 50 + "你好" * 100,
        "Dr. " * 100 + "end.",
        "a. " * 200,
        "，，，。。。！！！" * 10,
        "\"Quoted.\" 'Again!' (Paren.) 」】》" * 20,
    ]
    longs += [random_text(random.Random(1000 + s), 600) for s in range(40)]
    return longs


@pytest.mark.parametrize("min_chunk_len", [None, 1, 3, 10])
def test_chunk_text_punctuation(config, min_chunk_len):
    for long_text in _long_texts() + TEXTS:
        for chunk_len in (0, 1, 5, 20, 57, 100, 250, 1000):
            assert text.chunk_text_punctuation(
                long_text, chunk_len, config["text"], min_chunk_len
            ) == upstream_text.chunk_text_punctuation(long_text, chunk_len, min_chunk_len), (long_text, chunk_len)


def test_chunk_text_punctuation_min_chunk_len_is_generate_chunked_value(config):
    rules = config["text"]
    for long_text in _long_texts():
        assert text.chunk_text_punctuation(
            long_text, 80, rules, rules["min_chunk_len"]
        ) == upstream_text.chunk_text_punctuation(long_text, 80, 3)


def test_add_punctuation(config):
    for sample in TEXTS + RANDOM_TEXTS + [t + suffix for t in TEXTS[:6] for suffix in ("……", "、", "  ", "\n", "x")]:
        assert text.add_punctuation(sample, config["text"]) == upstream_text.add_punctuation(sample), sample


def test_combine_text(config):
    rng = random.Random(3)
    pairs = [(t, r) for t in TEXTS for r in (None, "", "  ", TEXTS[3], TEXTS[4], TEXTS[23], TEXTS[24])]
    pairs += [(rng.choice(RANDOM_TEXTS), rng.choice(RANDOM_TEXTS + [None])) for _ in range(500)]
    for target, ref in pairs:
        assert text.combine_text(target, config["text"], ref) == upstream._combine_text(target, ref), (target, ref)


# ----------------------------------------------------------------------------------------------
# Text tokenizer
# ----------------------------------------------------------------------------------------------


def _style_strings() -> list[str]:
    langs = sorted(LANG_IDS)[::7] + ["None", "en", "zh"]
    instructs = ["None", "male, low pitch, american accent", "女，青年，河南话", "Male, British Accent", "whisper"]
    return [
        f"{denoise}<|lang_start|>{lang}<|lang_end|><|instruct_start|>{instruct}<|instruct_end|>"
        for denoise in ("", "<|denoise|>")
        for lang in langs
        for instruct in instructs
    ]


def test_tokenizer_equals_autotokenizer(torch_model, tokenizer):
    reference = torch_model.text_tokenizer
    samples = TEXTS + RANDOM_TEXTS + _long_texts() + _style_strings()
    samples += [f"<|text_start|>{upstream._combine_text(t, r)}<|text_end|>" for t in TEXTS for r in (None, TEXTS[2])]
    for sample in samples:
        assert tokenizer.encode(sample) == reference(sample).input_ids, sample
        assert (
            tokenizer.encode(sample, add_special_tokens=False) == reference(sample, add_special_tokens=False).input_ids
        ), sample


def test_control_tokens_are_single_ids(torch_model, tokenizer):
    for token in prompt.CONTROL_TOKENS:
        assert tokenizer.encode(token) == torch_model.text_tokenizer(token).input_ids
        assert len(tokenizer.encode(token)) == 1


def test_nonverbal_tag_tokenization(torch_model, tokenizer, config):
    samples = [f"<|text_start|>{t}<|text_end|>" for t in TEXTS + RANDOM_TEXTS[:50]] + TEXTS
    samples += ["[laughter]", "[sigh][sigh]", "x[laughter]", "[laughter]x", "[Laughter] [sigh ] [question-yi]"]
    for sample in samples:
        expected = upstream._tokenize_with_nonverbal_tags(sample, torch_model.text_tokenizer)
        ours = tokenizer.encode_with_nonverbal_tags(sample, config["prompt"]["nonverbal_pattern"])
        assert ours == expected[0].tolist(), sample


# ----------------------------------------------------------------------------------------------
# Language and instruct
# ----------------------------------------------------------------------------------------------


def test_resolve_language_every_id_and_name(config):
    languages = config["languages"]
    names = list(LANG_NAME_TO_ID)
    spellings = [
        None,
        "None",
        "none",
        "NONE",
        *sorted(LANG_IDS),
        *names,
        *(n.upper() for n in names),
        *(n.title() for n in names),
        *(lang_display_name(n) for n in names),
    ]
    for spelling in spellings:
        expected = upstream._resolve_language(spelling)
        if expected is None and spelling is not None and spelling.lower() != "none":
            with pytest.raises(UserError):
                prompt.resolve_language(spelling, languages)
        else:
            assert prompt.resolve_language(spelling, languages) == expected, spelling


@pytest.mark.parametrize("bad", ["", " ", "Englsh", "klingon", "en ", " English", "xx-US", "en-", "klingon_US"])
def test_resolve_language_unknown_is_user_error(config, bad):
    """Locale tags of the model's languages ("en-US") map to their id (tests/test_speak.py); anything
    else upstream would silently ignore is refused."""
    assert upstream._resolve_language(bad) is None  # upstream: a warning, then language-agnostic
    with pytest.raises(UserError) as info:
        prompt.resolve_language(bad, config["languages"])
    assert repr(bad) in info.value.problem and "\n" not in str(info.value)


def test_runtime_languages_and_instruct_data_are_upstreams(config):
    assert set(config["languages"]["ids"]) == LANG_IDS
    assert config["languages"]["name_to_id"] == LANG_NAME_TO_ID
    data = config["instruct"]
    assert set(data["valid"]) == voice_design._INSTRUCT_ALL_VALID
    assert set(data["valid_en"]) == voice_design._INSTRUCT_VALID_EN
    assert set(data["valid_zh"]) == voice_design._INSTRUCT_VALID_ZH
    assert data["en_to_zh"] == voice_design._INSTRUCT_EN_TO_ZH
    assert data["zh_to_en"] == voice_design._INSTRUCT_ZH_TO_EN
    assert [set(c) for c in data["mutually_exclusive"]] == voice_design._INSTRUCT_MUTUALLY_EXCLUSIVE
    assert data["zh_pattern"] == voice_design._ZH_RE.pattern


def _instructs() -> list[str]:
    rng = random.Random(4)
    valid = sorted(voice_design._INSTRUCT_ALL_VALID)
    invalid = [
        "mal",
        "femal",
        "british acent",
        "男性",
        "robot",
        "low",
        "very-high pitch",
        "河南",
        "old",
        "whispr",
        "young",
        "",
        "american  accent",
        "male\nfemale",
    ]
    separators = [", ", ",", "，", " , ", "，  ", ",,", " ，"]
    instructs = [
        None,
        "",
        "   ",
        ",",
        "，，",
        "male",
        "MALE",
        " Female ",
        "男",
        "女，河南话",
        "male, 河南话",
        "female, british accent",
        "女，british accent",
        "河南话, british accent",
        "male, female",
        "男，女",
        "male, 女",
        "child, elderly, low pitch, high pitch",
        "whisper, 耳语",
        "american accent, british accent",
        "四川话，东北话",
        ", male, low pitch,",
        "，女，中年，",
    ]
    for _ in range(1500):
        items = [rng.choice(invalid) if rng.random() < 0.08 else rng.choice(valid) for _ in range(rng.randint(1, 4))]
        items = [item.upper() if rng.random() < 0.1 else item.title() if rng.random() < 0.1 else item for item in items]
        joined = items[0] + "".join(rng.choice(separators) + item for item in items[1:])
        instructs.append(rng.choice(["", " ", ","]) + joined + rng.choice(["", " ", "，"]))
    return instructs


def test_resolve_instruct(config):
    """Every outcome (value, or error and its text) equals upstream's, over ~1,500 combinations."""
    data, errors = config["instruct"], 0
    for instruct in _instructs():
        for use_zh in (False, True):
            try:
                expected = upstream._resolve_instruct(instruct, use_zh=use_zh)
            except ValueError as exc:
                errors += 1
                message = str(exc)
                with pytest.raises(UserError) as info:
                    resolve_instruct(instruct, use_zh, data)
                if message.startswith("Unsupported instruct items"):
                    head, tail = message.split("\n\nValid English items: ", 1)
                    assert info.value.problem == one_line(head)
                    assert info.value.fix == one_line("Valid English items: " + tail)
                else:
                    assert str(info.value) == message and info.value.fix is None
                assert "\n" not in info.value.problem and "\n" not in (info.value.fix or "")
                continue
            assert resolve_instruct(instruct, use_zh, data) == expected, (instruct, use_zh)
    assert errors > 300  # the combinations exercise every error path, not only the happy one


def test_instruct_use_zh(config):
    for sample in TEXTS + RANDOM_TEXTS + [None]:
        expected = bool(sample and voice_design._ZH_RE.search(sample))
        assert instruct_use_zh(sample, config["instruct"]) == expected


# ----------------------------------------------------------------------------------------------
# Prompt layout
# ----------------------------------------------------------------------------------------------


def test_build_item_inputs_matches_prepare_inference_inputs(torch_model, tokenizer, config):
    rng = np.random.default_rng(5)
    model = config["model"]
    refs = [(None, None), ("The quick brown fox jumps.", 37), ("你好，世界。", 11), ("", 5), ("Hi [laughter]!", 1)]
    count = 0
    for target in TEXTS[:24] + RANDOM_TEXTS[:10]:
        for ref_text, frames in refs:
            ref_tokens = None if frames is None else rng.integers(0, 1024, (8, frames), dtype=np.int64)
            for lang, instruct, denoise in (
                ("en", None, True),
                (None, "male, low pitch", False),
                ("zh", "女，河南话", True),
                (None, None, False),
            ):
                num_target = int(rng.integers(1, 200))
                expected = torch_model._prepare_inference_inputs(
                    target,
                    num_target,
                    ref_text,
                    None if ref_tokens is None else torch.from_numpy(ref_tokens),
                    lang,
                    instruct,
                    denoise,
                )
                ids, mask = prompt.build_item_inputs(
                    tokenizer,
                    target,
                    num_target,
                    ref_text,
                    ref_tokens,
                    lang,
                    instruct,
                    denoise,
                    model["num_audio_codebook"],
                    model["audio_mask_id"],
                    config,
                )
                assert ids.dtype == np.int64 and mask.dtype == np.bool_
                np.testing.assert_array_equal(ids, expected["input_ids"].numpy())
                np.testing.assert_array_equal(mask, expected["audio_mask"].numpy())
                count += 1
    assert count == 34 * 5 * 4


def _first_forward(model, **generate_kwargs) -> dict[str, np.ndarray]:
    """The tensors generate() feeds its first transformer forward (num_step=1: one forward per batch)."""
    calls = []

    def record(**kwargs):
        calls.append(
            {name: kwargs[name].detach().clone().numpy() for name in ("input_ids", "audio_mask", "attention_mask")}
        )

    torch.manual_seed(0)
    with recording(model, "forward", record):
        model.generate(num_step=1, **generate_kwargs)
    return calls[0]


BATCHES = {
    "clone-3": dict(
        text=[TEXTS[1], TEXTS[4], "[laughter] Okay, fine."],
        language=["English", "zh", None],
        refs=[("The quick brown fox jumps over the lazy dog.", 90), ("你好，世界。今天很好。", 40), ("Hi there.", 20)],
        instruct=[None, "female, young adult", "male, british accent"],
        speed=[1.0, 0.8, 1.25],
        duration=None,
    ),
    "clone-2-duration": dict(
        text=[TEXTS[8], TEXTS[2]],
        language="ru",
        refs=[("Привет.", 30), ("Dr. Who.", 14)],
        instruct=None,
        speed=None,
        duration=[1.5, None],
    ),
    "design-2": dict(
        text=[TEXTS[0], TEXTS[5]],
        language=[None, "Chinese"],
        refs=None,
        instruct=["male, low pitch", "female"],
        speed=1.4,
        duration=None,
    ),
    "auto-1": dict(text=TEXTS[20], language=None, refs=None, instruct=None, speed=None, duration=2.0),
}


@pytest.mark.parametrize("name", list(BATCHES))
def test_batch_inputs_match_generate_first_forward(torch_model, tokenizer, config, name):
    """The whole host path (language, instruct, duration, prompt, 2B layout) against upstream's
    real first forward inputs."""
    case = BATCHES[name]
    texts = case["text"] if isinstance(case["text"], list) else [case["text"]]
    batch = len(texts)
    rng = np.random.default_rng(6)
    refs = case["refs"] or [(None, None)] * batch
    ref_tokens = [None if f is None else rng.integers(0, 1024, (8, f), dtype=np.int64) for _, f in refs]
    prompts = (
        None
        if case["refs"] is None
        else [
            upstream.VoiceClonePrompt(torch.from_numpy(tokens), ref_text, 0.05)
            for (ref_text, _), tokens in zip(refs, ref_tokens)
        ]
    )
    captured = _first_forward(
        torch_model,
        text=case["text"],
        language=case["language"],
        voice_clone_prompt=prompts,
        instruct=case["instruct"],
        speed=case["speed"],
        duration=case["duration"],
    )

    model, data = config["model"], config["instruct"]
    per_item = lambda value: value if isinstance(value, list) else [value] * batch  # noqa: E731
    langs = [prompt.resolve_language(lang, config["languages"]) for lang in per_item(case["language"])]
    instructs = [
        resolve_instruct(instruct, instruct_use_zh(t, data), data)
        for instruct, t in zip(per_item(case["instruct"]), texts)
    ]
    target_lens, _ = duration.target_lengths(
        texts,
        [r for r, _ in refs],
        [f for _, f in refs],
        case["speed"],
        case["duration"],
        FRAME_RATE,
        config["duration"],
    )
    items = [
        prompt.build_item_inputs(
            tokenizer,
            t,
            n,
            r,
            tokens,
            lang,
            instruct,
            True,
            model["num_audio_codebook"],
            model["audio_mask_id"],
            config,
        )
        for t, n, (r, _), tokens, lang, instruct in zip(texts, target_lens, refs, ref_tokens, langs, instructs)
    ]
    input_ids, audio_mask, attention_mask, c_lens = prompt.batch_inputs(
        items, target_lens, model["num_audio_codebook"], model["audio_mask_id"]
    )

    assert c_lens == [ids.shape[2] for ids, _ in items]
    for ours, key in ((input_ids, "input_ids"), (audio_mask, "audio_mask"), (attention_mask, "attention_mask")):
        assert ours.dtype == captured[key].dtype, key
        np.testing.assert_array_equal(ours, captured[key], err_msg=key)


def _chunk_plan(texts, refs, target_lens, speed_list, generated_lens, config):
    """Our prediction of _generate_chunked's sub-tasks: (texts, target_lens, ref_texts) per call.

    `generated_lens[i]` is the frame count of item i's chunk 0 (its own estimate, as generated)."""
    rules = config["text"]
    chunks = [
        text.chunk_text_punctuation(t, text.text_chunk_len(t, n, 15.0, FRAME_RATE), rules, rules["min_chunk_len"])
        for t, n in zip(texts, target_lens)
    ]
    speeds = speed_list or [1.0] * len(texts)
    calls = []
    has_ref = refs[0][0] is not None
    for ci in range(max(len(c) for c in chunks)):
        indices = [i for i in range(len(texts)) if ci < len(chunks[i])]
        if has_ref:
            ref_texts, ref_lens = [refs[i][0] for i in indices], [refs[i][1] for i in indices]
        elif ci == 0:
            ref_texts, ref_lens = [None] * len(indices), [None] * len(indices)
        else:
            ref_texts, ref_lens = [chunks[i][0] for i in indices], [generated_lens[i] for i in indices]
        chunk_texts = [chunks[i][ci] for i in indices]
        lens = [
            duration.estimate_target_tokens(t, r, n, config["duration"], speed=speeds[i])
            for t, r, n, i in zip(chunk_texts, ref_texts, ref_lens, indices)
        ]
        calls.append((chunk_texts, lens, ref_texts))
    return calls


# Each estimated at 35-50 s, just over the 30 s chunking threshold, with or without the references.
LONG_A = " ".join([TEXTS[1], TEXTS[2], TEXTS[3], TEXTS[28]] * 2)
LONG_B = "".join([TEXTS[4], TEXTS[22]] * 5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "with_ref,speed,dur",
    [(False, None, None), (True, None, None), (True, 0.8, None), (False, [0.9, 1.0], [None, 40.0])],
    ids=["no-ref", "ref", "ref-speed", "no-ref-duration"],
)
def test_chunk_plan_matches_generate_chunked(torch_model, config, with_ref, speed, dur):
    """Long texts (> 30 s estimated): chunk texts, per-chunk lengths and references equal those
    upstream's _generate_chunked passes to _generate_iterative."""
    texts = [LONG_A, LONG_B]
    refs = (
        [("The quick brown fox jumps over the lazy dog.", 90), ("你好，世界。", 30)] if with_ref else [(None, None)] * 2
    )
    prompts = [_prompt(r, f) for r, f in refs] if with_ref else None
    calls = []

    def record(task, gen_config):
        calls.append((list(task.texts), list(task.target_lens), list(task.ref_texts)))

    torch.manual_seed(0)
    with recording(torch_model, "_generate_iterative", record):
        torch_model.generate(text=texts, voice_clone_prompt=prompts, speed=speed, duration=dur, num_step=1)

    target_lens, speed_list = duration.target_lengths(
        texts, [r for r, _ in refs], [f for _, f in refs], speed, dur, FRAME_RATE, config["duration"]
    )
    assert all(n > int(30.0 * FRAME_RATE) for n in target_lens)  # both items take the chunked path
    chunk0_lens = calls[0][1]
    assert _chunk_plan(texts, refs, target_lens, speed_list, chunk0_lens, config) == calls
    assert len(calls) > 2


# ----------------------------------------------------------------------------------------------
# Runtime assets and their loaders
# ----------------------------------------------------------------------------------------------


def test_write_runtime_assets_entries(tiny_model, assets, config, tmp_path):
    import hashlib

    from transformers import AutoTokenizer

    entries = write_runtime_assets(tiny_model, tmp_path)
    assert sorted(entries) == sorted([bundle.TOKENIZER_FILE, bundle.RUNTIME_CONFIG_FILE])
    for name, entry in entries.items():
        data = (tmp_path / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        assert data == (assets / name).read_bytes()  # deterministic
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(entries)  # no temporary file left
    # written from the process's parsed tokenizer (checkpoints.text_tokenizer), which models loaded
    # earlier in this process share: still what a fresh load of the checkpoint gives
    fresh = AutoTokenizer.from_pretrained(str(tiny_model)).backend_tokenizer.to_str()
    assert (tmp_path / bundle.TOKENIZER_FILE).read_text(encoding="utf-8") == fresh


def test_runtime_config_model_and_generation_defaults(tiny_model, config):
    model_config = upstream.OmniVoiceConfig.from_pretrained(str(tiny_model))
    codec = json.loads((tiny_model / "audio_tokenizer" / "config.json").read_text())  # the checkpoint's own
    hop = int(np.prod(codec["acoustic_model_config"]["downsampling_ratios"]))
    assert config["model"] == {
        "audio_mask_id": model_config.audio_mask_id,
        "num_audio_codebook": model_config.num_audio_codebook,
        "audio_vocab_size": model_config.audio_vocab_size,
        "sample_rate": codec["sample_rate"],
        "hop_length": hop,
        "frame_rate": codec["sample_rate"] // hop,
        "model_fingerprint": model_fingerprint(tiny_model),
    }
    defaults = upstream.OmniVoiceGenerationConfig()
    assert config["generation"] == {f: getattr(defaults, f) for f in defaults.__dataclass_fields__}
    assert upstream.OmniVoiceGenerationConfig.from_dict(config["generation"]) == defaults


def _expect_user_error(call, *fragments: str) -> None:
    with pytest.raises(UserError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and "re-run export_omnivoice.py" in message
    for fragment in fragments:
        assert fragment in message


def test_loaders_reject_missing_and_damaged_files(assets, tmp_path):
    _expect_user_error(lambda: load_runtime_config(tmp_path / "runtime-config.json"), "runtime-config.json")
    _expect_user_error(lambda: prompt.TextTokenizer.from_file(tmp_path / "tokenizer.json"), "tokenizer.json")

    (tmp_path / "runtime-config.json").write_text("{not json")
    _expect_user_error(lambda: load_runtime_config(tmp_path / "runtime-config.json"), "not valid JSON")
    (tmp_path / "runtime-config.json").write_text("[1, 2]")
    _expect_user_error(
        lambda: load_runtime_config(tmp_path / "runtime-config.json"), "the top level is a list, expected an object"
    )
    good = json.loads((assets / "runtime-config.json").read_text(encoding="utf-8"))
    damages = [
        ("instruct", None, None),
        ("languages", "name_to_id", "oops"),
        ("model", "audio_mask_id", "oops"),
        ("instruct", "zh_pattern", "[unclosed"),
        ("prompt", "nonverbal_pattern", "(bad"),
        ("duration", "ranges", [[0x2AF, "latin"], [0x100, "greek"]]),
        ("duration", "weights", {"latin": "1"}),
        ("text", "abbreviations", [1, 2]),
        ("text", "split_punctuation", [".."]),
        ("audio", "reference_silence_ms", [200, 100]),
        ("audio", "seek_step_ms", 0),
        ("audio", "min_peak", float("nan")),
        ("graphs", None, None),
        ("version", None, 1),
    ]
    for section, key, value in damages:
        damaged = json.loads(json.dumps(good))
        if key is None and value is None:
            del damaged[section]
        elif key is None:
            damaged[section] = value
        else:
            damaged[section][key] = value
        (tmp_path / "runtime-config.json").write_text(json.dumps(damaged))
        _expect_user_error(lambda: load_runtime_config(tmp_path / "runtime-config.json"), section)

    (tmp_path / "tokenizer.json").write_text('{"version": ')
    _expect_user_error(lambda: prompt.TextTokenizer.from_file(tmp_path / "tokenizer.json"), "cannot be loaded")
    plain = json.loads((assets / "tokenizer.json").read_text(encoding="utf-8"))
    plain["added_tokens"] = [t for t in plain["added_tokens"] if t["content"] != "<|denoise|>"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(plain))
    _expect_user_error(lambda: prompt.TextTokenizer.from_file(tmp_path / "tokenizer.json"), "<|denoise|>")


@pytest.mark.slow
def test_qwen2_tokenizer_class_checkpoint(tiny_model, tmp_path):
    """A checkpoint whose tokenizer_config names Qwen2Tokenizer (as Qwen3's does): transformers
    rebuilds the BPE on load, and the written tokenizer.json is that rebuilt one, id for id."""
    from transformers import AutoTokenizer

    checkpoint = tmp_path / "checkpoint"  # whole: runtime-config.json records the model's fingerprint
    shutil.copytree(tiny_model, checkpoint)
    tokenizer_config = json.loads((tiny_model / "tokenizer_config.json").read_text())
    tokenizer_config["tokenizer_class"] = "Qwen2Tokenizer"
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))

    write_runtime_assets(checkpoint, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "tokenizer.json").read_text(encoding="utf-8"))
    original = json.loads((checkpoint / "tokenizer.json").read_text(encoding="utf-8"))
    assert (written["model"]["ignore_merges"], original["model"]["ignore_merges"]) == (False, True)

    reference = AutoTokenizer.from_pretrained(str(checkpoint))
    ours = prompt.TextTokenizer.from_file(tmp_path / "out" / "tokenizer.json")
    for sample in TEXTS + RANDOM_TEXTS + _style_strings():
        assert ours.encode(sample) == reference(sample).input_ids, sample


def test_runtime_modules_import_no_torch():
    forbidden = ["torch", "torchaudio", "transformers", "omnivoice", "pydub", "omnivoice_export"]
    code = (
        "import sys; import omnivoice_onnx.core.prompt, omnivoice_onnx.core.duration, omnivoice_onnx.core.text; "
        f"print([m for m in {forbidden!r} if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_same_tokenizer_bytes_are_parsed_once(assets, tmp_path):
    """Bundles opened in one process share the parse of equal tokenizer.json bytes (prompt._parsed);
    other bytes, even of the same vocabulary, are parsed anew, and a damaged file is still refused."""
    data = (assets / "tokenizer.json").read_bytes()
    first = prompt.TextTokenizer.from_file(assets / "tokenizer.json", data)
    (tmp_path / "tokenizer.json").write_bytes(data)
    again = prompt.TextTokenizer.from_file(tmp_path / "tokenizer.json")
    other = prompt.TextTokenizer.from_file(tmp_path / "tokenizer.json", data + b"\n")
    assert again.backend is first.backend and other.backend is not first.backend
    assert other.encode("<|text_start|>hi<|text_end|>") == first.encode("<|text_start|>hi<|text_end|>")
    (tmp_path / "tokenizer.json").write_bytes(data[: len(data) // 2])
    _expect_user_error(lambda: prompt.TextTokenizer.from_file(tmp_path / "tokenizer.json"), "cannot be loaded")
