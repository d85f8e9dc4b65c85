"""The outlier proxy (builder's `tiny-outliers`) and the int8 recipe that holds on it.

Random weights have none of a trained backbone's activation outliers, so an int8 recipe that
breaks on the trained model passes on them. tiny-outliers carries them (builder.Outliers); these
tests show that the proxy has them, that fp32 stays faithful on it, that the SmoothQuant fold of
`int8` is exact in fp32, and that `int8` holds on the proxy where per-tensor activation scales
(`int8-pertensor`) do not. One tiny-outliers pipeline and one quantize pass are shared by the run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import Pipeline, assert_same_bits_on_captured_calls, export_as_user, read_report, shared_build
from onnx import numpy_helper

import capture_reference
import infer_onnx
import make_reference
import parity_check
import quantize_omnivoice
from omnivoice_export import capture, quality, quantize, rowwise
from omnivoice_export.builder import OUTLIERS, build_checkpoint, trigger_token_ids
from omnivoice_export.checkpoints import load_omnivoice
from omnivoice_export.files import sha256_file
from omnivoice_export.report import save_with_sidecar
from omnivoice_onnx.sessions import make_session

pytestmark = pytest.mark.slow  # one tiny-outliers pipeline: steps 0-2, then step 5 for two recipes
NAME = "tiny-outliers"
SPEC = OUTLIERS[NAME]
MEASURED = ("int8", "int8-pertensor")


CODEC_FILES = ("audio_tokenizer/config.json", "audio_tokenizer/model.safetensors")


@pytest.fixture(scope="session")
def outliers(tiny_model: Path, tmp_path_factory) -> Pipeline:
    """tiny-outliers built into this run's temporary tree, steps 0-2 on it, and step 5's int8 and
    int8-pertensor (read-only for the tests).

    Step 2 in two runs, as a user adds graphs to an export: the transformer (where the outliers
    are, what step 5 quantizes) by dynamo, the codecs by the legacy exporter. The proxy's codec is
    tiny's, file for file (asserted): its dynamo graphs are the session pipeline's, proven there on
    tiny's captured calls (here the legacy graphs are proven on the proxy's); the legacy exporter
    writes the same function at a third of dynamo's cost."""

    def build(root: Path) -> None:
        model = build_checkpoint(NAME, root / "model")
        for name in CODEC_FILES:
            assert sha256_file(model / name) == sha256_file(tiny_model / name), name
        make_reference.main(["--model", str(model), "--out-dir", str(root / "capture")])
        capture_reference.main(["--model", str(model), "--capture-dir", str(root / "capture")])
        export_as_user(model, root / "capture", root / "onnx", "--graphs", "transformer")
        export_as_user(model, root / "capture", root / "onnx", "--graphs", "encoder,decoder", "--no-dynamo")
        quantize_omnivoice.main(["--onnx-dir", str(root / "onnx"), "--variants", ",".join(MEASURED)])

    root = shared_build(tmp_path_factory, "outliers-pipeline", build)
    return Pipeline(model=root / "model", capture=root / "capture", onnx=root / "onnx")


def test_the_proxy_carries_the_documented_outliers(outliers: Pipeline) -> None:
    """On a captured clone call: massive residual values (hundreds to thousands) in the massive
    channels at the delimiter positions and nowhere else, a spike at that layer's down_proj input
    there, and outlier channels ~100x the others in the normed input of every linear layer."""
    model = load_omnivoice(outliers.model)
    seen: dict[str, torch.Tensor] = {}
    layer = model.llm.layers[SPEC.massive_layer]
    hooks = [
        layer.mlp.down_proj.register_forward_pre_hook(lambda _m, args: seen.__setitem__("down", args[0])),
        model.llm.norm.register_forward_pre_hook(lambda _m, args: seen.__setitem__("residual", args[0])),
        model.llm.layers[-1].input_layernorm.register_forward_hook(
            lambda _m, _args, out: seen.__setitem__("normed", out)
        ),
    ]
    data = capture.load_step(outliers.capture, "clone", 0)
    with torch.no_grad():
        model(
            input_ids=torch.from_numpy(data["input_ids"][:1]),
            audio_mask=torch.from_numpy(data["audio_mask"][:1]),
            attention_mask=torch.from_numpy(data["attention_mask"][:1]),
        )
    for hook in hooks:
        hook.remove()
    ids = data["input_ids"][0, 0]
    triggers = np.isin(ids, trigger_token_ids()) & ~data["audio_mask"][0]
    assert triggers[0] and 3 <= triggers.sum() <= 8  # the first position and the delimiters
    massive = seen["residual"][0][:, list(SPEC.massive_channels)].abs().numpy()
    assert massive[triggers].min() > 300 and massive[triggers].max() < 5000
    assert massive[~triggers].max() < 30
    down = seen["down"][0].abs().numpy()
    assert down[triggers].max() > 1000 * np.median(down)  # against the median value
    assert down[triggers].max() > 20 * np.median(down.max(axis=1))  # against the median row's peak
    normed = seen["normed"][0].abs().numpy()
    ordinary = [c for c in range(normed.shape[1]) if c not in SPEC.outlier_channels]
    ratio = np.median(normed[:, list(SPEC.outlier_channels)]) / np.median(normed[:, ordinary])
    assert 30 < ratio < 300


def test_fp32_is_faithful_on_the_proxy(outliers: Pipeline, tmp_path: Path) -> None:
    """Steps 3 and 4 pass on tiny-outliers: parity of every graph (the encoder sweep too) and
    generate() token-exact end to end."""
    onnx_dir = tmp_path / "onnx"
    shutil.copytree(outliers.onnx, onnx_dir)
    parity_check.main(["--capture-dir", str(outliers.capture), "--onnx-dir", str(onnx_dir)])
    infer_onnx.main(["--capture-dir", str(outliers.capture), "--onnx-dir", str(onnx_dir), "--no-torch-timing"])
    report = read_report(onnx_dir)
    assert report["parity"]["cpu"]["verdict"] == "PASS"
    assert report["end_to_end"]["cpu"]["verdict"] == "PASS"


def test_the_fold_is_exact_in_fp32(outliers: Pipeline, tmp_path: Path) -> None:
    """int8's SmoothQuant fold (powers of two) leaves the fp32 graph's logits the same bits on
    every 8th captured call, while it moves the outlier channels' scale out of every norm it folds
    (the four that only quantized MatMuls read; the final norm feeds the fp32 audio heads)."""
    recipe = quantize.RECIPES["int8"]
    source = outliers.onnx / quantize.TRANSFORMER_FILE
    export = read_report(outliers.onnx)
    exclude = export["variants"]["int8"]["excluded_nodes"]
    plain = quantize.prepared_graph(source, quantize.RECIPES["int8-pertensor"], exclude)
    folded = quantize.prepared_graph(source, quantize.RECIPES["int8-pertensor"], exclude)
    assert recipe.fold_norms and rowwise.fold_norm_scales(folded, exclude) == 2 * 2  # two norms per layer
    gains = [
        {
            node.name: numpy_helper.to_array(inits[node.input[1]])
            for node in model.graph.node
            if node.op_type == "SimplifiedLayerNormalization"
        }
        for model in (plain, folded)
        for inits in [{init.name: init for init in model.graph.initializer}]
    ]
    spread = lambda gain: float(np.abs(gain).max() / np.median(np.abs(gain)))  # noqa: E731
    changed = [name for name in gains[0] if not np.array_equal(gains[0][name], gains[1][name])]
    assert len(changed) == 4 and all(spread(gains[0][n]) >= 50 and spread(gains[1][n]) <= 10 for n in changed)
    for name, model in (("plain", plain), ("folded", folded)):
        (tmp_path / name).mkdir()
        save_with_sidecar(model, tmp_path / name / quantize.TRANSFORMER_FILE)
    assert_same_bits_on_captured_calls(
        outliers.capture,
        make_session(tmp_path / "folded" / quantize.TRANSFORMER_FILE),
        make_session(tmp_path / "plain" / quantize.TRANSFORMER_FILE),
        every=8,
    )


def test_int8_holds_where_per_tensor_scales_break(outliers: Pipeline) -> None:
    """Per captured call (every step of every mode, as generate() makes them): int8 keeps argmax
    agreement >= 0.98 on average and >= 0.95 on every call; int8-pertensor falls to <= 0.95 on
    average. The massive layer's down_proj is the one MatMul int8 keeps fp32."""
    export = read_report(outliers.onnx)
    manifest = capture.load_manifest(outliers.capture, verify_hashes=False)
    agreement = {}
    for name in MEASURED:
        rows = quality.step_quality(
            make_session(outliers.onnx / name / quantize.TRANSFORMER_FILE), outliers.capture, manifest
        )
        agreement[name] = [row["argmax_agreement"] for row in rows]
    assert np.mean(agreement["int8"]) >= 0.98 and min(agreement["int8"]) >= 0.95, agreement["int8"]
    assert np.mean(agreement["int8-pertensor"]) <= 0.95
    assert len(export["variants"]["int8"]["spikes"]["fp32"]) == 1
