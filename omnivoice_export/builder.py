"""Build the `tiny` and `full-random` OmniVoice checkpoints (random weights) from configs.

No model hub is reachable here, so the project builds its own checkpoints with the upstream
classes and saves them in exactly the layout `OmniVoice.from_pretrained` reads (see
checkpoints.REQUIRED_FILES).

`tiny`        the real structure at tiny width; builds in seconds; the default for demo and tests.
`full-random` the real architecture and dims (612,577,280 + ~201M parameters), random weights,
              for scale, memory and speed work.
`tiny-large-act`  tiny with a trained LLM's large activations (LARGE_ACTIVATIONS): a few residual
              channels in the hundreds at every position, weighted down by every residual RMSNorm;
              the check that an fp16 graph survives them (random weights never have them).

The library's default init makes degenerate models (zero codebooks: every code identical; a DAC
decoder whose output is almost constant; std-0.02 audio heads whose argmax is a near-tie
everywhere), and parity measured on such a model measures nothing. `_make_non_degenerate`
re-initialises exactly those parts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from omnivoice_export.files import atomic_dir, umask_mode
from omnivoice_onnx.contract import AUDIO_VOCAB_SIZE, HOP_LENGTH, NUM_CODEBOOKS, SAMPLE_RATE
from omnivoice_onnx.errors import UserError

# Bump when the builder changes what it writes, so cached checkpoints are rebuilt.
BUILDER_VERSION = 1
BUILD_STAMP = "omnivoice_export_build.json"

# The real checkpoint's constants (k2-fsa/OmniVoice config.json, Higgs Audio V2 tokenizer); the
# sample rate, hop, codebooks and audio vocabulary are the graphs' (omnivoice_onnx.contract).
DOWNSAMPLING_RATIOS = [8, 5, 4, 2, 3]  # product = HOP_LENGTH
AUDIO_MASK_ID = 1024
CODEBOOK_WEIGHTS = [8, 8, 6, 6, 4, 4, 2, 2]
EOS_TOKEN_ID = 151645  # <|im_end|>
PAD_TOKEN_ID = 151643  # <|endoftext|>


@dataclass(frozen=True)
class Dims:
    """Widths that differ between tiny and the real model; everything else is shared."""

    hidden: int  # Qwen3 hidden size
    layers: int  # Qwen3 decoder layers
    heads: int  # attention heads (query)
    kv_heads: int  # key/value heads: heads != kv_heads keeps grouped-query attention
    head_dim: int
    intermediate: int  # MLP width
    llm_init_std: float  # Qwen3 initializer_range
    dac_encoder_hidden: int
    dac_hidden: int
    dac_decoder_hidden: int  # >= 32: the decoder halves it five times
    codebook_dim: int
    hubert_hidden: int
    hubert_layers: int
    hubert_heads: int
    hubert_ffn: int
    hubert_conv_dim: int
    hubert_pos_conv: int  # num_conv_pos_embeddings
    hubert_pos_groups: int


# Each field of Dims for (tiny, full-random).
_WIDTHS = {
    "hidden": (64, 1024),
    "layers": (2, 28),
    "heads": (4, 16),
    "kv_heads": (2, 8),
    "head_dim": (16, 128),
    "intermediate": (128, 3072),
    "llm_init_std": (0.1, 0.02),
    "dac_encoder_hidden": (2, 64),
    "dac_hidden": (16, 256),
    "dac_decoder_hidden": (64, 1024),
    "codebook_dim": (8, 64),
    "hubert_hidden": (32, 768),
    "hubert_layers": (2, 12),
    "hubert_heads": (2, 12),
    "hubert_ffn": (64, 3072),
    "hubert_conv_dim": (32, 512),
    "hubert_pos_conv": (16, 128),
    "hubert_pos_groups": (4, 16),
}
DIMS = {name: Dims(**{field: values[index] for field, values in _WIDTHS.items()})
        for index, name in enumerate(("tiny", "full-random"))}


@dataclass(frozen=True)
class LargeActivations:
    """Residual channels that carry large values at every position, as trained Qwen models have
    (a few channels in the hundreds to thousands; |x| > 256 squares past float16's 65504)."""

    channels: tuple[int, ...]  # residual stream channels (of Dims.hidden)
    values: tuple[
        float, ...
    ]  # each one's offset at every position: text rows carry it, audio rows 1/8 each (8 codebooks are summed)
    norm_weight: float  # the residual RMSNorms' weight on those channels: weights them down, as trained norms do


LARGE_ACTIVATIONS = {"tiny-large-act": LargeActivations(channels=(3, 17, 42), values=(900.0, -600.0, 350.0),
                                                        norm_weight=1e-3)}
DIMS["tiny-large-act"] = DIMS["tiny"]


def omnivoice_config(dims: Dims, vocab_size: int):
    """OmniVoiceConfig with the real top-level values and a Qwen3 llm_config at `dims`."""
    from omnivoice.models.omnivoice import OmniVoiceConfig
    from transformers import Qwen3Config

    llm = Qwen3Config(
        vocab_size=vocab_size, hidden_size=dims.hidden, intermediate_size=dims.intermediate,
        num_hidden_layers=dims.layers, num_attention_heads=dims.heads, num_key_value_heads=dims.kv_heads,
        head_dim=dims.head_dim, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_parameters={"rope_theta": 1_000_000.0, "rope_type": "default"}, attention_bias=False,
        hidden_act="silu", tie_word_embeddings=True, initializer_range=dims.llm_init_std,
        max_window_layers=dims.layers, use_sliding_window=False,
    )
    return OmniVoiceConfig(
        audio_vocab_size=AUDIO_VOCAB_SIZE, audio_mask_id=AUDIO_MASK_ID, num_audio_codebook=NUM_CODEBOOKS,
        audio_codebook_weights=CODEBOOK_WEIGHTS, llm_config=llm,
        eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID, architectures=["OmniVoice"],
    )


def higgs_config(dims: Dims):
    """HiggsAudioV2TokenizerConfig with the real 25 Hz / 8 x 1024 layout at `dims`.

    The library defaults are traps: ratios [8,5,4,2] give hop 320 (75 Hz), the default bandwidths
    give 5 or 16 quantizers, and DacConfig recomputes hidden/upsampling unless passed explicitly.
    """
    from transformers import HiggsAudioV2TokenizerConfig

    return HiggsAudioV2TokenizerConfig(
        target_bandwidths=[0.5, 1, 1.5, 2],  # 2 kbps / (25 Hz * 10 bits) = 8 quantizers
        sample_rate=SAMPLE_RATE, semantic_sample_rate=16000, downsample_factor=320,
        codebook_size=1024, codebook_dim=dims.codebook_dim,
        acoustic_model_config={
            "model_type": "dac", "encoder_hidden_size": dims.dac_encoder_hidden,
            "downsampling_ratios": DOWNSAMPLING_RATIOS, "upsampling_ratios": DOWNSAMPLING_RATIOS,
            "decoder_hidden_size": dims.dac_decoder_hidden, "hidden_size": dims.dac_hidden,
            "sampling_rate": SAMPLE_RATE, "hop_length": HOP_LENGTH,
        },
        semantic_model_config={
            "model_type": "hubert", "hidden_size": dims.hubert_hidden, "num_hidden_layers": dims.hubert_layers,
            "num_attention_heads": dims.hubert_heads, "intermediate_size": dims.hubert_ffn,
            "conv_dim": [dims.hubert_conv_dim] * 7, "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
            "conv_stride": [5, 2, 2, 2, 2, 2, 2], "num_conv_pos_embeddings": dims.hubert_pos_conv,
            "num_conv_pos_embedding_groups": dims.hubert_pos_groups, "mask_time_prob": 0.0,
        },
    )


def _make_non_degenerate(omnivoice, higgs, seed: int) -> None:
    """Re-initialise the parts whose library init makes parity metrics meaningless."""
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        # Audio heads: std 0.02 gives near-uniform logits (argmax near-ties everywhere).
        head = omnivoice.audio_heads.weight
        head.copy_(torch.randn(head.shape, generator=gen) / head.shape[1] ** 0.5 * 4.0)
        emb = omnivoice.audio_embeddings.weight
        emb.copy_(torch.randn(emb.shape, generator=gen))
        # DAC convs: the library's trunc-normal 0.02 makes the decoder's output ~constant whatever
        # the codes, and fan-in scaling alone lets the residual units grow activations ~200x over
        # the five blocks. Draw fan-in scaled weights, then calibrate each conv's output scale.
        for module in list(higgs.acoustic_encoder.modules()) + list(higgs.acoustic_decoder.modules()):
            if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)):
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen))
                if module.bias is not None:
                    module.bias.zero_()
        # Codebooks are zero-initialised (every code identical): draw them at the scale of the
        # embeddings they quantise, which project_in leaves near unit variance.
        for quantizer in higgs.quantizer.quantizers:
            embed = quantizer.codebook.embed
            embed.copy_(torch.randn(embed.shape, generator=gen))
            quantizer.codebook.embed_avg.copy_(embed)
            for linear in (quantizer.project_in, quantizer.project_out):
                linear.weight.copy_(torch.randn(linear.weight.shape, generator=gen) / linear.weight.shape[1] ** 0.5)
        for linear in (higgs.fc, higgs.fc1, higgs.fc2):
            linear.weight.copy_(torch.randn(linear.weight.shape, generator=gen) / linear.weight.shape[1] ** 0.5)
        audio = torch.randn((1, 1, HOP_LENGTH * 8), generator=gen) * 0.1
        _calibrate_conv_scales(higgs.acoustic_encoder, lambda: higgs.acoustic_encoder(audio), final_std=1.0)
        codes = torch.randint(0, 1024, (1, NUM_CODEBOOKS, 8), generator=gen)
        latent = higgs.fc2(higgs.quantizer.decode(codes.transpose(0, 1)).transpose(1, 2)).transpose(1, 2)
        # 0.1: speech-like level, so WAVs do not clip and upstream's RMS handling stays in range.
        _calibrate_conv_scales(higgs.acoustic_decoder, lambda: higgs.acoustic_decoder(latent), final_std=0.1)


def _add_large_activations(omnivoice, spec: LargeActivations, seed: int) -> None:
    """Give the residual stream spec's large channels at every position, keeping the fp32 model's
    behaviour: every RMSNorm that reads the residual gets spec.norm_weight on those channels and
    its other channels rescaled, in forward order, so that their output has the scale it had
    before (measured on random inputs, LSUV-style). q_norm/k_norm read projections: unchanged."""
    import torch

    llm = omnivoice.llm
    gen = torch.Generator().manual_seed(seed + 2)
    norms = [norm for layer in llm.layers for norm in (layer.input_layernorm, layer.post_attention_layernorm)]
    norms.append(llm.norm)
    seq = 24
    ids = torch.randint(0, 1024, (2, NUM_CODEBOOKS, seq), generator=gen)
    ids[:, :, : seq // 2] = torch.randint(0, 1000, (2, 1, seq // 2), generator=gen)  # text rows, then audio
    audio_mask = torch.zeros(2, seq, dtype=torch.bool)
    audio_mask[:, seq // 2:] = True
    attention = torch.ones(2, 1, seq, seq, dtype=torch.bool)
    channels = torch.tensor(spec.channels)
    ordinary = torch.ones(llm.config.hidden_size, dtype=torch.bool)
    ordinary[channels] = False

    def output_scales() -> list[torch.Tensor]:
        captured: list[torch.Tensor] = []
        handles = [norm.register_forward_hook(lambda _m, _i, out: captured.append(out[..., ordinary].std()))
                   for norm in norms]
        try:
            omnivoice(input_ids=ids, audio_mask=audio_mask, attention_mask=attention)
        finally:
            for handle in handles:
                handle.remove()
        return captured

    with torch.no_grad():
        before = output_scales()
        values = torch.tensor(spec.values)
        llm.embed_tokens.weight[:, channels] += values
        omnivoice.audio_embeddings.weight[:, channels] += values / NUM_CODEBOOKS
        for norm in norms:
            norm.weight[channels] = spec.norm_weight
        for index, norm in enumerate(norms):
            norm.weight[ordinary] *= before[index] / output_scales()[index]


def _calibrate_conv_scales(network, run, final_std: float) -> None:
    """Scale each conv, in forward order, so its output std is 1 (0.5 on a residual branch's last
    conv, final_std on the network's last conv): data-dependent init in the manner of LSUV."""
    import torch
    from torch import nn

    convs = [(name, m) for name, m in network.named_modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]
    for index, (name, conv) in enumerate(convs):
        target = final_std if index == len(convs) - 1 else 0.5 if name.endswith("res_unit1.conv2") or \
            name.endswith("res_unit2.conv2") or name.endswith("res_unit3.conv2") else 1.0
        captured: list[torch.Tensor] = []
        handle = conv.register_forward_hook(lambda _m, _i, out: captured.append(out.std()))  # returns None
        try:
            run()
        finally:
            handle.remove()
        conv.weight.mul_(target / captured[0])


def count_parameters(name: str) -> int:
    """OmniVoice parameter count for a built config, on the meta device (no allocation)."""
    import torch
    from omnivoice.models.omnivoice import OmniVoice

    from omnivoice_export.qwen_tokenizer import QWEN_VOCAB_SIZE

    with torch.device("meta"):
        model = OmniVoice(omnivoice_config(DIMS[name], QWEN_VOCAB_SIZE))
    return sum(p.numel() for p in model.parameters())


def build_checkpoint(name: str, out_dir: Path, seed: int = 0) -> Path:
    """Build checkpoint `name` into `out_dir` (written beside it, then renamed into place)."""
    import torch
    from omnivoice.models.omnivoice import OmniVoice
    from transformers import DacFeatureExtractor, HiggsAudioV2TokenizerModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    from omnivoice_export.qwen_tokenizer import QWEN_VOCAB_SIZE, save_qwen_tokenizer

    if name not in DIMS:
        raise UserError(f"unknown checkpoint '{name}'", f"choose one of {', '.join(DIMS)}")
    started = time.perf_counter()
    with atomic_dir(out_dir) as tmp:
        tokenizer_provenance = save_qwen_tokenizer(tmp)
        torch.manual_seed(seed)
        config = omnivoice_config(DIMS[name], QWEN_VOCAB_SIZE)
        config.omnivoice_export = {"checkpoint": name, "seed": seed, "builder_version": BUILDER_VERSION,
                                   "text_tokenizer": tokenizer_provenance}
        model = OmniVoice(config).eval()
        higgs = HiggsAudioV2TokenizerModel(higgs_config(DIMS[name])).eval()
        _make_non_degenerate(model, higgs, seed)
        if name in LARGE_ACTIVATIONS:
            _add_large_activations(model, LARGE_ACTIVATIONS[name], seed)
        model.save_pretrained(tmp)
        higgs.save_pretrained(tmp / "audio_tokenizer")
        DacFeatureExtractor(feature_size=1, sampling_rate=SAMPLE_RATE, hop_length=HOP_LENGTH,
                            padding_value=0.0).save_pretrained(tmp / "audio_tokenizer")
        (tmp / BUILD_STAMP).write_text(json.dumps(
            {"checkpoint": name, "seed": seed, "builder_version": BUILDER_VERSION,
             "build_seconds": round(time.perf_counter() - started, 2)}, indent=2) + "\n")
        umask_mode(*(f for f in tmp.rglob("*") if f.is_file()))
    return Path(out_dir)
