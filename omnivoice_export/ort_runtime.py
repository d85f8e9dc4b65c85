"""onnxruntime sessions, providers, and the ONNX graphs as drop-in modules of OmniVoice.

Providers:
    cpu        CPUExecutionProvider, fp32
    cuda-fp32  CUDAExecutionProvider with use_tf32=0: full fp32, a parity path
    cuda-tf32  CUDAExecutionProvider defaults (TF32 matmuls): a speed/precision trade-off, not a
               parity verdict on the export (facts sheet: argmax 0.996, max |d| 5e-2 per step)

A requested CUDA provider that onnxruntime lacks is an error, never a quiet fall back to CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from omnivoice_export.cli import UserError
from omnivoice_export.wrappers import GRAPH_FILES

PROVIDERS = ("cpu", "cuda-fp32", "cuda-tf32")
GPU_INSTALL_HINT = "install the GPU requirements (pip install --no-deps -r requirements-gpu.txt) on a machine with an NVIDIA GPU"


def provider_chain(provider: str) -> list[Any]:
    """The onnxruntime providers list for one of PROVIDERS."""
    if provider == "cpu":
        return ["CPUExecutionProvider"]
    if provider == "cuda-fp32":
        return [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    if provider == "cuda-tf32":
        return [("CUDAExecutionProvider", {}), "CPUExecutionProvider"]
    raise UserError(f"unknown provider {provider!r}", f"choose one of {', '.join(PROVIDERS)}")


def check_provider(provider: str) -> None:
    """UserError (one line) when `provider` cannot run in this onnxruntime build."""
    import onnxruntime as ort

    provider_chain(provider)
    if provider.startswith("cuda") and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise UserError(f"--provider {provider} needs onnxruntime's CUDAExecutionProvider, which this install "
                        f"lacks (onnxruntime {ort.__version__} has {', '.join(ort.get_available_providers())})",
                        GPU_INSTALL_HINT)


def make_session(path: Path, provider: str = "cpu", threads: int | None = None,
                 optimized_model_path: Path | None = None):
    """An InferenceSession for one graph; checks the requested provider really took it."""
    import onnxruntime as ort

    path = Path(path)
    if not path.is_file():
        raise UserError(f"ONNX graph not found: {path}", "run export_omnivoice.py (step 2)")
    check_provider(provider)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    if optimized_model_path is not None:
        options.optimized_model_filepath = str(optimized_model_path)
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=provider_chain(provider))
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidProtobuf types
        raise UserError(f"onnxruntime cannot load {path} ({str(exc).splitlines()[0][:300]})",
                        "re-run export_omnivoice.py (step 2); the graph or its .onnx.data is damaged") from exc
    if provider.startswith("cuda") and session.get_providers()[0] != "CUDAExecutionProvider":
        raise UserError(f"onnxruntime did not place {path.name} on CUDA (got {session.get_providers()})",
                        GPU_INSTALL_HINT)
    return session


def run(session, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a session fed by input name; outputs by name."""
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def graph_metadata(session) -> dict[str, str]:
    return dict(session.get_modelmeta().custom_metadata_map)


@dataclass
class CodecConfig:
    """The audio tokenizer constants generate() reads, taken from the graphs' metadata."""

    sample_rate: int
    hop_length: int
    frame_rate: int


class OrtAudioTokenizer:
    """Stands in for HiggsAudioV2TokenizerModel in generate(): encode/decode served by ORT."""

    def __init__(self, encoder, decoder, config: CodecConfig) -> None:
        self.encoder, self.decoder, self.config = encoder, decoder, config
        self.device = torch.device("cpu")

    def encode(self, input_values: torch.Tensor, *args, **kwargs) -> SimpleNamespace:
        codes = run(self.encoder, {"input_values": input_values.cpu().numpy().astype(np.float32)})["audio_codes"]
        return SimpleNamespace(audio_codes=torch.from_numpy(codes))

    def decode(self, audio_codes: torch.Tensor, *args, **kwargs) -> SimpleNamespace:
        audio = run(self.decoder, {"audio_codes": audio_codes.cpu().numpy().astype(np.int64)})["audio_values"]
        return SimpleNamespace(audio_values=torch.from_numpy(audio))


def prefix_lengths(attention_mask: np.ndarray) -> list[int] | None:
    """Per row r, the L with mask[r] allowing exactly keys [0, L) to queries [0, L), and no query
    beyond L any key in [0, L) (padding); None when
    some row has another structure (then it cannot be run at its own length)."""
    lengths = []
    for row in attention_mask[:, 0]:
        length = int(row[0].sum())
        # Rows beyond L are dropped: they must be padding (no key in [0, L)), as generate() builds them.
        if (length == 0 or not row[:length, :length].all() or row[:length, length:].any()
                or row[length:, :length].any()):
            return None
        lengths.append(length)
    return lengths


def run_split(session, input_ids: np.ndarray, audio_mask: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """The transformer with each group of equal-length rows run at its own length.

    generate() pads the uncond half (target frames only) to the cond length S: ~40% of its rows
    are padding. With the bidirectional block mask, queries in [0, L) attend only to keys in
    [0, L), so cutting a row to L changes nothing the rows [0, L) compute, mathematically; the
    rows beyond L are never read by generate() and are returned as zeros. Falls back to one
    padded call when the mask is not of that block form.
    """
    lengths = prefix_lengths(attention_mask)
    if lengths is None:
        return run(session, {"input_ids": input_ids, "audio_mask": audio_mask, "attention_mask": attention_mask})["logits"]
    rows_total, codebooks, seq = input_ids.shape
    logits = None
    for length in sorted(set(lengths)):
        rows = np.array([r for r, l in enumerate(lengths) if l == length])
        out = run(session, {"input_ids": input_ids[rows, :, :length], "audio_mask": audio_mask[rows, :length],
                            "attention_mask": attention_mask[rows][:, :, :length, :length]})["logits"]
        if logits is None:
            logits = np.zeros((rows_total, codebooks, seq, out.shape[-1]), dtype=out.dtype)
        logits[rows, :, :length] = out
    return logits


def ort_forward(session, split: bool = True):
    """A replacement for OmniVoice.forward as generate() calls it: the transformer graph, with
    cond and uncond rows at their own lengths when `split` (see run_split)."""
    from omnivoice.models.omnivoice import OmniVoiceModelOutput

    def forward(input_ids, audio_mask, attention_mask=None, **kwargs):
        feeds = (input_ids.cpu().numpy(), audio_mask.cpu().numpy(), attention_mask.cpu().numpy())
        if split:
            logits = run_split(session, *feeds)
        else:
            logits = run(session, dict(zip(("input_ids", "audio_mask", "attention_mask"), feeds)))["logits"]
        return OmniVoiceModelOutput(logits=torch.from_numpy(logits))
    return forward


@dataclass
class OrtGraphs:
    """The three sessions of one export."""

    transformer: Any
    encoder: Any
    decoder: Any

    @classmethod
    def load(cls, onnx_dir: Path, provider: str = "cpu", threads: int | None = None) -> "OrtGraphs":
        return cls(*(make_session(Path(onnx_dir) / GRAPH_FILES[name], provider, threads)
                     for name in ("transformer", "encoder", "decoder")))

    def codec_config(self) -> CodecConfig:
        meta = graph_metadata(self.encoder)
        return CodecConfig(int(meta["sample_rate"]), int(meta["hop_length"]), int(meta["frame_rate"]))

    def audio_tokenizer(self) -> OrtAudioTokenizer:
        return OrtAudioTokenizer(self.encoder, self.decoder, self.codec_config())


def load_onnx_omnivoice(model_path: Path, graphs: OrtGraphs, split: bool = True):
    """An OmniVoice whose generate() runs on the ONNX graphs, without the PyTorch weights.

    The host orchestration needs the config, the text tokenizer and the duration estimator, not
    2.4 GB of tensors: the module tree is built on the meta device (no memory), and `device`
    is pinned to CPU so generate() builds its inputs there.
    """
    from omnivoice.models.omnivoice import OmniVoice, OmniVoiceConfig
    from omnivoice.utils.duration import RuleDurationEstimator
    from transformers import AutoTokenizer

    class OnnxOmniVoice(OmniVoice):
        @property
        def device(self) -> torch.device:
            return torch.device("cpu")

    config = OmniVoiceConfig.from_pretrained(str(model_path))
    with torch.device("meta"):
        model = OnnxOmniVoice(config)
    model.text_tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    model.audio_tokenizer = graphs.audio_tokenizer()
    model.sampling_rate = model.audio_tokenizer.config.sample_rate
    model.duration_estimator = RuleDurationEstimator()
    model.forward = ort_forward(graphs.transformer, split)
    return model

