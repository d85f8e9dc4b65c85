"""The ONNX graphs as drop-in modules of upstream OmniVoice (torch side of the toolchain).

Sessions, providers and split execution are the runtime's (omnivoice_onnx.sessions); this module
adapts them to upstream's torch-facing generate(): the audio tokenizer and forward() stand-ins,
and an OmniVoice built on the meta device around them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from omnivoice_export.step0_checkpoints.checkpoints import text_tokenizer
from omnivoice_export.step2_export.report import read_graph_metadata
from omnivoice_onnx.contract import CONTRACTS, FP32_VARIANT, GRAPH_FILES, codec_paths
from omnivoice_onnx.sessions import (
    TRANSFORMER_ARENA,
    CodecConfig,
    CodecSessions,
    finite_output,
    make_session,
    run,
    run_split,
)

if TYPE_CHECKING:
    from omnivoice.models.omnivoice import OmniVoice


class OrtAudioTokenizer:
    """Stands in for HiggsAudioV2TokenizerModel in generate(): encode/decode served by ORT."""

    def __init__(self, sessions: CodecSessions, config: CodecConfig) -> None:
        self.sessions, self.config = sessions, config
        self.device = torch.device("cpu")

    def encode(self, input_values: torch.Tensor, *args: Any, **kwargs: Any) -> SimpleNamespace:
        feeds = {"input_values": input_values.cpu().numpy().astype(np.float32)}
        return SimpleNamespace(audio_codes=torch.from_numpy(self.sessions.run("encoder", feeds)["audio_codes"]))

    def decode(self, audio_codes: torch.Tensor, *args: Any, **kwargs: Any) -> SimpleNamespace:
        feeds = {"audio_codes": audio_codes.cpu().numpy().astype(np.int64)}
        audio = finite_output(self.sessions.run("decoder", feeds)["audio_values"], "decoder")
        return SimpleNamespace(audio_values=torch.from_numpy(audio))


def ort_forward(session: Any, split: bool = True) -> Callable[..., Any]:
    """A replacement for OmniVoice.forward as generate() calls it: the transformer graph, with
    cond and uncond rows at their own lengths when `split` (see run_split)."""
    from omnivoice.models.omnivoice import OmniVoiceModelOutput

    # attention_mask: upstream's forward makes it optional; generate() always passes it
    def forward(
        input_ids: torch.Tensor, audio_mask: torch.Tensor, attention_mask: Any = None, **kwargs: Any
    ) -> OmniVoiceModelOutput:
        feeds = (input_ids.cpu().numpy(), audio_mask.cpu().numpy(), attention_mask.cpu().numpy())
        if split:
            logits = run_split(session, *feeds)
        else:
            logits = run(session, dict(zip(CONTRACTS["transformer"].input_names, feeds)))["logits"]
        return OmniVoiceModelOutput(logits=torch.from_numpy(finite_output(logits, "transformer")))

    return forward


@dataclass
class OrtGraphs:
    """The transformer session and the codec sessions of one export."""

    transformer: Any
    codec: CodecSessions

    @classmethod
    def load(
        cls,
        onnx_dir: Path,
        provider: str = "cpu",
        threads: int | None = None,
        resident_codec: bool = False,
        transformer: Path | None = None,
        variant: str = FP32_VARIANT,
    ) -> OrtGraphs:
        """The export in onnx_dir; `transformer` replaces its transformer graph (a variant made by
        quantize_omnivoice.py); the codec graphs are `variant`'s (contract.variant_path: its own
        where it carries them, as fp16 does, else onnx_dir's)."""
        path = Path(onnx_dir) / GRAPH_FILES["transformer"] if transformer is None else Path(transformer)
        transformer = make_session(path, provider, threads, arena=TRANSFORMER_ARENA)
        return cls(transformer, CodecSessions(codec_paths(onnx_dir, variant), provider, threads, resident_codec))

    def codec_config(self) -> CodecConfig:
        """From the encoder's metadata (read from the graph file: no session, no weights)."""
        meta = read_graph_metadata(self.codec.paths["encoder"])
        return CodecConfig(int(meta["sample_rate"]), int(meta["hop_length"]), int(meta["frame_rate"]))

    def audio_tokenizer(self) -> OrtAudioTokenizer:
        return OrtAudioTokenizer(self.codec, self.codec_config())


def load_onnx_omnivoice(model_path: Path, graphs: OrtGraphs, split: bool = True) -> OmniVoice:
    """An OmniVoice whose generate() runs on the ONNX graphs, without the PyTorch weights.

    The host orchestration needs the config, the text tokenizer and the duration estimator, not
    2.4 GB of tensors: the module tree is built on the meta device (no memory), and `device`
    is pinned to CPU so generate() builds its inputs there.
    """
    from omnivoice.models.omnivoice import OmniVoice, OmniVoiceConfig
    from omnivoice.utils.duration import RuleDurationEstimator

    class OnnxOmniVoice(OmniVoice):  # type: ignore[misc]  # upstream omnivoice is untyped: its class is Any
        @property
        def device(self) -> torch.device:
            return torch.device("cpu")

    config = OmniVoiceConfig.from_pretrained(str(model_path))
    with torch.device("meta"):
        model = OnnxOmniVoice(config)
    model.text_tokenizer = text_tokenizer(model_path)
    model.audio_tokenizer = graphs.audio_tokenizer()
    model.sampling_rate = model.audio_tokenizer.config.sample_rate
    model.duration_estimator = RuleDurationEstimator()
    model.forward = ort_forward(graphs.transformer, split)
    return model
