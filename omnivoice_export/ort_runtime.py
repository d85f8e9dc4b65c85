"""onnxruntime sessions, providers, and the ONNX graphs as drop-in modules of OmniVoice.

Providers:
    cpu        CPUExecutionProvider, fp32
    cuda-fp32  CUDAExecutionProvider with use_tf32=0: full fp32, a parity path
    cuda-tf32  CUDAExecutionProvider defaults (TF32 matmuls): a speed/precision trade-off, not a
               parity verdict on the export (facts sheet: argmax 0.996, max |d| 5e-2 per step)

A requested CUDA provider that onnxruntime lacks is an error, never a quiet fall back to CPU.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

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


def ort_forward(session):
    """A replacement for OmniVoice.forward as generate() calls it: the transformer graph."""
    from omnivoice.models.omnivoice import OmniVoiceModelOutput

    def forward(input_ids, audio_mask, attention_mask=None, **kwargs):
        logits = run(session, {"input_ids": input_ids.cpu().numpy(), "audio_mask": audio_mask.cpu().numpy(),
                               "attention_mask": attention_mask.cpu().numpy()})["logits"]
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


@contextlib.contextmanager
def onnx_modules(model, graphs: OrtGraphs) -> Iterator[None]:
    """Within the block, `model` (a loaded PyTorch OmniVoice) runs its transformer forward and
    audio tokenizer through the ONNX graphs; everything else is upstream's generate()."""
    original_tokenizer = model.audio_tokenizer
    model.forward = ort_forward(graphs.transformer)
    model.audio_tokenizer = graphs.audio_tokenizer()
    try:
        yield
    finally:
        del model.forward
        model.audio_tokenizer = original_tokenizer


def load_onnx_omnivoice(model_path: Path, graphs: OrtGraphs):
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
    model.forward = ort_forward(graphs.transformer)
    return model


def metadata_json(session, key: str) -> Any:
    return json.loads(graph_metadata(session)[key])
