"""Measure the built checkpoints' data-dependent scales and record them in checkpoint_scales.json.

Why a table: the builder's codec convs are scaled LSUV-style (each conv's output std set to a
target on a probe input, in forward order) and tiny-large-act's residual norms are rescaled to
keep their output scale; measured at build time, those forward passes ran through oneDNN/MKL
kernels whose bits differ between CPUs, and so did the checkpoints. Measured once here, rounded
to weights_recipe.SCALE_DIGITS digits and stored, they make the build a pure function of the seed.

Re-run this only when the builder's rules or dims change (then bump builder.BUILDER_VERSION and
update builder.FINGERPRINTS); `check_scales` (tests) shows the recorded table still calibrates.

    python -m omnivoice_export.step0_checkpoints.calibration  # rewrites step0_checkpoints/checkpoint_scales.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from types import EllipsisType
from typing import TYPE_CHECKING

from omnivoice_export.step0_checkpoints.builder import (
    BASE_OF,
    DIMS,
    LARGE_ACTIVATIONS,
    add_large_activations,
    make_modules,
    residual_norms,
)
from omnivoice_export.step0_checkpoints.weights_recipe import SCALES_FILE, normal, round_scale
from omnivoice_onnx.contract import HOP_LENGTH, NUM_CODEBOOKS
from omnivoice_onnx.program import parse, run_main

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import HiggsAudioV2TokenizerModel

# (name, network, a call of it on its probe input, the std target of its last conv)
Network = tuple[str, "nn.Module", Callable[[], object], float]

# Each conv's output std target: 1, except 0.5 on a residual branch's last conv and, on the
# network's last conv, 1.0 for the encoder and 0.1 (a speech-like level that neither clips a
# WAV nor leaves upstream's RMS handling its range) for the decoder.
ENCODER_FINAL_STD = 1.0
DECODER_FINAL_STD = 0.1
RESIDUAL_BRANCH_STD = 0.5
PROBE_FRAMES = 8
PROBE_SEED = 1  # the probes' own seed: a calibration input, not a weight


def conv_targets(network: nn.Module, final_std: float) -> list[tuple[str, nn.Conv1d | nn.ConvTranspose1d, float]]:
    """(name, conv, target output std) for every conv of `network`, in forward order."""
    from torch import nn

    convs = [(name, m) for name, m in network.named_modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]
    targets = []
    for index, (name, conv) in enumerate(convs):
        residual_end = any(name.endswith(f"res_unit{i}.conv2") for i in (1, 2, 3))
        target = final_std if index == len(convs) - 1 else RESIDUAL_BRANCH_STD if residual_end else 1.0
        targets.append((name, conv, target))
    return targets


def _output_std(module: nn.Module, run: Callable[[], object], channels: torch.Tensor | EllipsisType = ...) -> float:
    """Std of `module`'s output (over `channels` of its last axis) in one call of `run`."""
    captured: list[float] = []
    handle = module.register_forward_hook(lambda _m, _i, out: captured.append(float(out[..., channels].std())))
    try:
        run()
    finally:
        handle.remove()
    return captured[0]


def _probes(higgs: HiggsAudioV2TokenizerModel) -> tuple[torch.Tensor, torch.Tensor]:
    """(encoder input audio, decoder input latent): portable draws; codes cover every codebook."""
    import torch

    audio = torch.from_numpy(normal(PROBE_SEED, "probe/audio", (1, 1, HOP_LENGTH * PROBE_FRAMES), 0.1))
    codes = torch.arange(NUM_CODEBOOKS * PROBE_FRAMES).reshape(1, NUM_CODEBOOKS, PROBE_FRAMES) * 131 % 1024
    with torch.no_grad():
        latent = higgs.fc2(higgs.quantizer.decode(codes.transpose(0, 1)).transpose(1, 2)).transpose(1, 2)
    return audio, latent


def _networks(higgs: HiggsAudioV2TokenizerModel) -> tuple[Network, Network]:
    audio, latent = _probes(higgs)
    return (
        ("acoustic_encoder", higgs.acoustic_encoder, lambda: higgs.acoustic_encoder(audio), ENCODER_FINAL_STD),
        ("acoustic_decoder", higgs.acoustic_decoder, lambda: higgs.acoustic_decoder(latent), DECODER_FINAL_STD),
    )


def measure_codec_scales(name: str, seed: int = 0) -> dict[str, float]:
    """Each codec conv's std of draw that gives its target output std, conv by conv in forward
    order (each measured with the earlier ones already scaled), rounded for the table."""
    import torch

    _, higgs = make_modules(name, seed, codec_scales=_UnitScales())
    scales: dict[str, float] = {}
    with torch.no_grad():
        for prefix, network, run, final_std in _networks(higgs):
            for conv_name, conv, target in conv_targets(network, final_std):
                scale = round_scale(target / _output_std(conv, run))
                conv.weight.mul_(scale)
                scales[f"{prefix}.{conv_name}.weight"] = scale
    return scales


class _UnitScales(dict[str, float]):
    """Every codec conv drawn at std 1: the measurement's starting point."""

    def __missing__(self, key: str) -> float:
        return 1.0


def measure_norm_scales(name: str, seed: int = 0) -> list[float]:
    """tiny-large-act: each residual RMSNorm's factor on its ordinary channels that restores the
    output std those channels had before the large channels were added (random probe inputs)."""
    import torch

    spec = LARGE_ACTIVATIONS[name]
    model, _ = make_modules(name, seed, codec_scales=_UnitScales())  # the codec plays no part here
    norms = residual_norms(model.llm)
    seq = 24
    ids = torch.arange(2 * NUM_CODEBOOKS * seq).reshape(2, NUM_CODEBOOKS, seq) * 7 % 1000
    audio_mask = torch.zeros(2, seq, dtype=torch.bool)
    audio_mask[:, seq // 2 :] = True  # text rows, then audio rows
    attention = torch.ones(2, 1, seq, seq, dtype=torch.bool)
    ordinary = torch.ones(model.llm.config.hidden_size, dtype=torch.bool)
    ordinary[list(spec.channels)] = False

    def output_stds() -> list[float]:
        run = lambda: model(input_ids=ids, audio_mask=audio_mask, attention_mask=attention)  # noqa: E731
        return [_output_std(norm, run, ordinary) for norm in norms]

    with torch.no_grad():
        before = output_stds()
        add_large_activations(model, spec, [1.0] * len(norms))
        scales = []
        for index, norm in enumerate(norms):
            scale = round_scale(before[index] / output_stds()[index])
            norm.weight[ordinary] *= scale
            scales.append(scale)
    return scales


def check_codec_scales(name: str, seed: int = 0) -> dict[str, tuple[float, float]]:
    """{conv: (measured output std, target)} of checkpoint `name` as built from the table."""
    import torch

    _, higgs = make_modules(name, seed)
    with torch.no_grad():
        return {
            f"{prefix}.{conv_name}": (_output_std(conv, run), target)
            for prefix, network, run, final_std in _networks(higgs)
            for conv_name, conv, target in conv_targets(network, final_std)
        }


def measure_all() -> dict[str, dict[str, dict[str, float]] | dict[str, list[float]]]:
    """The whole table: codec scales per codec size, residual-norm scales per large-act checkpoint."""
    codecs = sorted({BASE_OF.get(name, name) for name in DIMS})
    return {
        "codec": {name: measure_codec_scales(name) for name in codecs},
        "residual_norms": {name: measure_norm_scales(name) for name in LARGE_ACTIVATIONS},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    return parse(parser, argv)


def main(argv: list[str] | None = None) -> None:
    parse_args(argv)
    table = measure_all()
    SCALES_FILE.write_text(json.dumps(table, indent=1) + "\n")
    print(
        f"wrote {SCALES_FILE}: {sum(len(v) for v in table['codec'].values())} codec scales, "
        f"{sum(len(v) for v in table['residual_norms'].values())} residual-norm scales"
    )


if __name__ == "__main__":
    run_main(main)
