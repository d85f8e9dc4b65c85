"""The three exportable modules.

Each wrapper is the exact computation `generate()` performs through the upstream module, with
plain tensors in and out so the exporters see one graph per job. Capture, export, parity and
inference all use these. Their I/O contract (names, dtypes, axes) is the table in
omnivoice_onnx.contract; the docstrings restate it for the reader.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from omnivoice.models.omnivoice import OmniVoice
    from transformers import HiggsAudioV2TokenizerModel


class TransformerWrapper(nn.Module):
    """Embeddings + Qwen3 (bidirectional, sdpa) + audio_heads: OmniVoice.forward without labels.

    input_ids[2B,8,S] int64, audio_mask[2B,S] bool, attention_mask[2B,1,S,S] bool
    -> logits[2B,8,S,1025] float32

    The bool 4-D mask is the contract: it makes attention bidirectional within each item and
    keeps the uncond half from seeing its padding. Rows whose mask row is all False (padding
    queries) are never read by generate() and are undefined in both torch and ONNX.
    """

    def __init__(self, omnivoice: OmniVoice) -> None:
        super().__init__()
        self.omnivoice = omnivoice

    def forward(self, input_ids: torch.Tensor, audio_mask: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.omnivoice(
            input_ids=input_ids, audio_mask=audio_mask, attention_mask=attention_mask
        ).logits
        return logits


class _AudioTokenizerWrapper(nn.Module):
    """Holds the HiggsAudioV2TokenizerModel whose encode or decode a subclass exports."""

    def __init__(self, audio_tokenizer: HiggsAudioV2TokenizerModel) -> None:
        super().__init__()
        # Any: encode/decode declare Tensor | ModelOutput, and with return_dict=False they give the
        # Tensor; a narrowing check in forward would be traced into the graph.
        self.audio_tokenizer: Any = audio_tokenizer


class EncoderWrapper(_AudioTokenizerWrapper):
    """HiggsAudioV2TokenizerModel.encode at full bandwidth (8 quantizers).

    input_values[B,1,T] float32 at 24 kHz, T a multiple of the hop (960) -> audio_codes[B,8,T/960] int64

    encode() compares conv output lengths in Python and pads when they differ; for T = 960*k they
    never differ, and OmniVoice always trims reference audio to a hop multiple. The exported graph
    holds only that branch, so its length axis is declared as 960*frames.
    """

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        audio_codes: torch.Tensor = self.audio_tokenizer.encode(input_values, return_dict=False)
        return audio_codes


class DecoderWrapper(_AudioTokenizerWrapper):
    """HiggsAudioV2TokenizerModel.decode.

    audio_codes[B,8,Tc] int64 -> audio_values[B,1,960*Tc] float32 at 24 kHz
    """

    def forward(self, audio_codes: torch.Tensor) -> torch.Tensor:
        audio_values: torch.Tensor = self.audio_tokenizer.decode(audio_codes, return_dict=False)
        return audio_values


def make_wrappers(model: OmniVoice) -> dict[str, nn.Module]:
    """The three wrappers of a loaded OmniVoice, keyed by graph name, in eval mode."""
    return {
        "transformer": TransformerWrapper(model).eval(),
        "encoder": EncoderWrapper(model.audio_tokenizer).eval(),
        "decoder": DecoderWrapper(model.audio_tokenizer).eval(),
    }


def _resample_with_integer_length(waveform: torch.Tensor, orig_freq: int, new_freq: int, **kwargs: Any) -> torch.Tensor:
    """torchaudio's sinc resampling with the output length computed by integer ceil-division.

    torchaudio computes the length as ceil(new * length / orig) with a float division, which the
    dynamo exporter cannot trace on a symbolic length (`int_truediv` in control flow). The kernel
    and convolution are torchaudio's own; only the length arithmetic differs, and it is exact for
    integers, so the result is bit-identical.
    """
    import math

    from torchaudio.functional.functional import _get_sinc_resample_kernel

    if orig_freq == new_freq:
        return waveform
    gcd = math.gcd(int(orig_freq), int(new_freq))
    kernel, width = _get_sinc_resample_kernel(
        orig_freq,
        new_freq,
        gcd,
        kwargs.get("lowpass_filter_width", 6),
        kwargs.get("rolloff", 0.99),
        kwargs.get("resampling_method", "sinc_interp_hann"),
        kwargs.get("beta"),
        waveform.device,
        waveform.dtype,
    )
    orig, new = int(orig_freq) // gcd, int(new_freq) // gcd
    shape = waveform.shape
    flat = waveform.reshape(-1, shape[-1])
    length = flat.shape[-1]
    padded = nn.functional.pad(flat, (width, width + orig))
    resampled = nn.functional.conv1d(padded[:, None], kernel, stride=orig).transpose(1, 2).reshape(flat.shape[0], -1)
    target_length = -((-new * length) // orig)  # ceil(new * length / orig) in integers
    return resampled[..., :target_length].reshape(*shape[:-1], -1)


@contextlib.contextmanager
def exportable_resample() -> Iterator[None]:
    """Within the block, torchaudio.functional.resample is the integer-length version (restored after)."""
    import torchaudio.functional

    original = torchaudio.functional.resample
    torchaudio.functional.resample = _resample_with_integer_length
    try:
        yield
    finally:
        torchaudio.functional.resample = original
