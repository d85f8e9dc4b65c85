"""The fp16 variant on the large-activation checkpoint (builder's `tiny-large-act`).

Trained Qwen residual streams carry a few channels in the hundreds to thousands at every
position; random weights never do, so tiny and full-random cannot show what float16 does to
them. On `tiny-large-act` these tests show that onnxruntime's naive conversion squares the
residual in float16 (graph inspection, and a numpy float16 emulation of its RMSNorm chain that
overflows to inf: onnxruntime's CPU provider runs float16 Pow through float32 casts and hides the
overflow, so a CPU run is no proof either way), and that the `fp16` variant keeps every square
and reduction of the residual in float32 and stays within its measured tolerance (THRESHOLDS) at
every onnxruntime optimisation level.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import shared_build

from omnivoice_export.step0_checkpoints.builder import LARGE_ACTIVATIONS, build_checkpoint
from omnivoice_export.step0_checkpoints.checkpoints import load_omnivoice, model_fingerprint
from omnivoice_export.step2_export import exporting, model_card, report, wrappers
from omnivoice_export.step56_variants import fp16, quantize, recipes
from omnivoice_onnx.contract import AUDIO_VOCAB_SIZE, NUM_CODEBOOKS, THRESHOLDS
from omnivoice_onnx.sessions import run

LARGE_ACT = "tiny-large-act"
TRANSFORMER = quantize.TRANSFORMER_FILE
FLOAT16_MAX = float(np.finfo(np.float16).max)
OPT_LEVELS = {
    "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def transformer_feeds(batch: int, seq: int, text: int, seed: int) -> dict[str, np.ndarray]:
    """A transformer call as generate() makes one: `text` text positions, then audio positions
    (codes and mask ids), every row attending to every position (run_split's calls)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 1025, (batch, 8, seq))
    ids[:, :, :text] = rng.integers(0, 151676, (batch, 1, text))
    audio_mask = np.zeros((batch, seq), dtype=bool)
    audio_mask[:, text:] = True
    return {
        "input_ids": ids.astype(np.int64),
        "audio_mask": audio_mask,
        "attention_mask": np.ones((batch, 1, seq, seq), dtype=bool),
    }


CALLS = [transformer_feeds(2, 40, 12, 0), transformer_feeds(4, 57, 20, 1)]


@pytest.fixture(scope="module")
def large_act(tmp_path_factory) -> Path:
    """tiny-large-act built (into this run's temporary tree, not the checkpoint cache), its
    transformer exported (dynamo, the export's opset and metadata) and the fp16 variant built
    from it by the recipe step 5 uses. Read-only."""

    def build(root: Path) -> None:
        model_dir = build_checkpoint(LARGE_ACT, root / "model")
        model = load_omnivoice(model_dir)
        example = tuple(torch.from_numpy(CALLS[0][name]) for name in ("input_ids", "audio_mask", "attention_mask"))
        onnx_dir = root / "onnx"
        exporting.export_graph(
            wrappers.make_wrappers(model)["transformer"].eval(),
            "transformer",
            example,
            onnx_dir,
            dynamo=True,
            opset=exporting.DEFAULT_OPSET,
            log=lambda *_: None,
        )
        config = json.loads((model_dir / "config.json").read_text())
        exporting.set_metadata(
            onnx_dir / TRANSFORMER,
            "transformer",
            exporting.graph_metadata(
                "transformer",
                config,
                model_fingerprint(model_dir),
                "dynamo",
                exporting.DEFAULT_OPSET,
                report.package_versions(),
                model_card.provenance(model_dir),
            ),
        )
        # The fp16 recipe's transformer conversion, as step 5 makes it (this export has no report and no codecs).
        source = onnx_dir / TRANSFORMER
        recipe = recipes.RECIPES["fp16"]
        heads, _ = quantize.weight_nodes(
            onnx.load(str(source), load_external_data=False), NUM_CODEBOOKS * AUDIO_VOCAB_SIZE
        )
        variant, _ = fp16.convert_transformer(onnx.load(str(source)), heads[0], recipe.keep_fp32)
        quantize.set_variant_metadata(variant, report.read_graph_metadata(source), recipe, source)
        (onnx_dir / "fp16").mkdir()
        report.save_with_sidecar(variant, onnx_dir / "fp16" / TRANSFORMER)

    return shared_build(tmp_path_factory, LARGE_ACT, build)


@pytest.fixture(scope="module")
def torch_large_act(large_act: Path):
    return load_omnivoice(large_act / "model")


def session(path: Path, level: str = "all"):
    options = ort.SessionOptions()
    options.graph_optimization_level = OPT_LEVELS[level]
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def residual_inputs(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """What each residual RMSNorm reads (input/post-attention norms of every layer, the final norm),
    as torch computes it."""
    llm = model.llm
    norms = [norm for layer in llm.layers for norm in (layer.input_layernorm, layer.post_attention_layernorm)]
    captured: list[np.ndarray] = []
    handles = [
        norm.register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0].numpy().copy()))
        for norm in norms + [llm.norm]
    ]
    try:
        with torch.no_grad():
            model(**{name: torch.from_numpy(value) for name, value in feeds.items()})
    finally:
        for handle in handles:
            handle.remove()
    return captured


def float16_rmsnorm(x: np.ndarray, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """The exported RMSNorm chain (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul) with every tensor
    float16, as a provider with float16 kernels (CUDA, mobile) runs the naive graph: (mean of
    squares, normalised x)."""
    x16 = x.astype(np.float16)
    with np.errstate(over="ignore"):
        mean = np.mean(np.square(x16), axis=-1, keepdims=True, dtype=np.float16)
        inverse = np.reciprocal(np.sqrt(mean + np.float16(eps)))
    return mean, x16 * inverse


@pytest.mark.slow
def test_large_act_checkpoint_has_large_channels_at_every_position_and_sane_fp32(large_act, torch_large_act):
    spec = LARGE_ACTIVATIONS[LARGE_ACT]
    for feeds in CALLS:
        for x in residual_inputs(torch_large_act, feeds):
            peak = np.abs(x[..., list(spec.channels)]).max(axis=-1)
            assert peak.min() > 256, "a large channel must overflow a float16 square at every position"
        with torch.no_grad():
            logits = torch_large_act(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy()
        got = run(session(large_act / "onnx" / TRANSFORMER), feeds)["logits"]
        # fp32 behaves normally: finite logits of the usual spread, argmax varying, ORT = torch.
        assert np.isfinite(logits).all() and 1.0 < logits.std() < 20.0
        assert len(np.unique(logits.argmax(-1))) > logits.shape[-1] // 10
        assert np.abs(got - logits.reshape(got.shape)).max() <= THRESHOLDS["transformer_max_abs"]
        assert (got.argmax(-1) == logits.reshape(got.shape).argmax(-1)).mean() >= THRESHOLDS["transformer_argmax_min"]


@pytest.mark.slow
def test_naive_conversion_squares_the_residual_in_float16_and_overflows(large_act, torch_large_act):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    source = onnx.load(str(large_act / "onnx" / TRANSFORMER))
    fp32_pows = [node.name for node in source.graph.node if node.op_type == "Pow"]
    naive = convert_float_to_float16(source, keep_io_types=True, op_block_list=[])
    squares = fp16.float16_squares(naive)
    # Every RMSNorm's Pow, ReduceMean, Sqrt and Reciprocal reads or writes float16.
    assert set(fp32_pows) <= set(squares) and len(squares) == 4 * len(fp32_pows)
    # What those nodes compute on a float16 device: the residual's square overflows, the norm is 0.
    for x in residual_inputs(torch_large_act, CALLS[0]):
        assert np.abs(x).max() < FLOAT16_MAX  # the residual itself is representable ...
        mean, normalised = float16_rmsnorm(x)
        assert np.isinf(mean).all()  # ... its mean square is not, at every position
        assert not np.any(
            normalised[..., [c for c in range(x.shape[-1]) if c not in LARGE_ACTIVATIONS[LARGE_ACT].channels]]
        )


@pytest.mark.slow
def test_a_blocked_op_list_is_not_an_fp32_island_until_the_round_trips_are_joined(large_act, tmp_path):
    """The converter's op_block_list keeps the RMSNorm ops float32 but hands each one's output to
    the next through float16: explicit casts, which every provider runs, so the mean of squares
    overflows on the CPU too and the logits are all zeros. join_fp32_islands makes them islands."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    blocked = convert_float_to_float16(
        onnx.load(str(large_act / "onnx" / TRANSFORMER)), keep_io_types=True, op_block_list=list(fp16.SQUARE_AND_REDUCE)
    )
    assert fp16.float16_squares(blocked) == [] and fp16.island_round_trips(blocked)
    onnx.save_model(blocked, str(tmp_path / "blocked.onnx"))
    assert not run(session(tmp_path / "blocked.onnx"), CALLS[0])["logits"].any()
    assert fp16.make_islands(blocked) == 2 * len([n for n in blocked.graph.node if n.op_type == "Pow"])
    assert fp16.island_round_trips(blocked) == []
    onnx.save_model(blocked, str(tmp_path / "joined.onnx"))
    want = run(session(large_act / "onnx" / TRANSFORMER), CALLS[0])["logits"]
    got = run(session(tmp_path / "joined.onnx"), CALLS[0])["logits"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= THRESHOLDS["fp16_relative_error_max"]


@pytest.mark.slow
def test_fp16_variant_keeps_every_residual_square_and_reduction_in_float32(large_act):
    variant = onnx.load(str(large_act / "onnx" / "fp16" / TRANSFORMER))
    fp32_graph = onnx.load(str(large_act / "onnx" / TRANSFORMER), load_external_data=False)
    types = fp16.value_types(variant)
    squares = [node for node in variant.graph.node if node.op_type in fp16.SQUARE_AND_REDUCE]
    assert len(squares) == sum(node.op_type in fp16.SQUARE_AND_REDUCE for node in fp32_graph.graph.node)
    assert fp16.float16_squares(variant) == [] and fp16.island_round_trips(variant) == []
    for node in squares:  # the data in and out float32 (other inputs: exponent, axes), never a float16 round trip
        assert types[node.input[0]] == types[node.output[0]] == onnx.TensorProto.FLOAT, node.name
    # float16 is what the weights are: every MatMul but the audio heads reads a float16 weight.
    weights = {init.name: init.data_type for init in variant.graph.initializer}
    matmul_weights = [
        weights[node.input[1]] for node in variant.graph.node if node.op_type == "MatMul" and node.input[1] in weights
    ]
    assert matmul_weights.count(onnx.TensorProto.FLOAT) == 1 and len(matmul_weights) > 1
    meta = {prop.key: prop.value for prop in variant.metadata_props}
    assert json.loads(meta["recipe"])["keep_fp32"] == list(fp16.TRANSFORMER_KEEP) and meta["variant"] == "fp16"
    assert [i.type.tensor_type.elem_type for i in variant.graph.output] == [onnx.TensorProto.FLOAT]


@pytest.mark.slow
@pytest.mark.parametrize("level", list(OPT_LEVELS))
def test_fp16_variant_within_tolerance_at_every_optimisation_level(large_act, level):
    reference = session(large_act / "onnx" / TRANSFORMER)
    candidate = session(large_act / "onnx" / "fp16" / TRANSFORMER, level)
    for feeds in CALLS:
        want, got = run(reference, feeds)["logits"], run(candidate, feeds)["logits"]
        assert np.isfinite(got).all()
        relative = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        assert relative <= THRESHOLDS["fp16_relative_error_max"], (level, relative)
        assert (got.argmax(-1) == want.argmax(-1)).mean() >= THRESHOLDS["fp16_argmax_min"], level


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="needs onnxruntime's CUDA provider (onnxruntime-gpu on an NVIDIA machine)",
)
def test_on_cuda_naive_fp16_breaks_and_the_fp16_variant_holds(large_act, tmp_path):
    """Where float16 kernels exist (CUDA), the naive graph's RMSNorm squares in float16 and its
    logits stop following fp32's; the fp16 variant stays within its tolerance (make gpu-check)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    naive = convert_float_to_float16(
        onnx.load(str(large_act / "onnx" / TRANSFORMER)), keep_io_types=True, op_block_list=[]
    )
    onnx.save_model(naive, str(tmp_path / "naive.onnx"))
    cuda = [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    want = run(session(large_act / "onnx" / TRANSFORMER), CALLS[0])["logits"]
    naive_logits = run(ort.InferenceSession(str(tmp_path / "naive.onnx"), providers=cuda), CALLS[0])["logits"]
    ours = run(ort.InferenceSession(str(large_act / "onnx" / "fp16" / TRANSFORMER), providers=cuda), CALLS[0])["logits"]
    assert not np.isfinite(naive_logits).all() or (naive_logits.argmax(-1) == want.argmax(-1)).mean() < 0.5
    assert np.linalg.norm(ours - want) / np.linalg.norm(want) <= THRESHOLDS["fp16_relative_error_max"]
