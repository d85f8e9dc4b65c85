"""The outlier proxies (builder's `tiny-outliers`, `tiny-outliers2`) and the int8 recipe that holds on them.

Random weights have none of a trained backbone's activation outliers, so an int8 recipe that
breaks on the trained model passes on them. The proxies carry them (builder.Outliers); these
tests show that each proxy has them, that fp32 stays faithful on tiny-outliers, that every fold
of `int8` is exact in fp32, and that `int8` holds where per-tensor activation scales
(`int8-pertensor`) and phase 5's rule (`int8-normfold`) do not: on both proxies, and on a
checkpoint made outside the project's builder (tiny's own function with o_proj input outliers,
an exact reparametrization). One pipeline and one quantize pass per checkpoint, shared by the run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import (
    Pipeline,
    assert_same_bits_on_captured_calls,
    captured_calls,
    export_as_user,
    read_report,
    shared_build,
)

import capture_reference
import infer_onnx
import make_reference
import parity_check
import quantize_omnivoice
from omnivoice_export.step0_checkpoints.builder import OUTLIERS, build_checkpoint, trigger_token_ids
from omnivoice_export.step0_checkpoints.checkpoints import load_omnivoice
from omnivoice_export.step1_capture import capture
from omnivoice_export.step2_export.report import read_graph_metadata, save_with_sidecar
from omnivoice_export.step56_variants import quality, quantize, recipes, rotation, smoothing
from omnivoice_onnx.hashing import sha256_file
from omnivoice_onnx.sessions import make_session, run_split

pytestmark = pytest.mark.slow  # one tiny-outliers pipeline: steps 0-2, then step 5 for two recipes
NAME = "tiny-outliers"
SPEC = OUTLIERS[NAME]
MEASURED = ("int8", "int8-normfold", "int8-pertensor")
PROXY2 = "tiny-outliers2"


CODEC_FILES = ("audio_tokenizer/config.json", "audio_tokenizer/model.safetensors")


# The checkpoints that only steps 5-6 read are captured at every fourth step (8 of 32 per mode, 32
# calls): a quarter of the capture to write and to replay; the calibration reads steps 0, 8, 16, 24
# either way (quantize.CALIBRATION_STEPS spread over what is captured).
EVERY_FOURTH_STEP = ",".join(str(step) for step in range(0, 32, 4))


def _pipeline(
    tmp_path_factory, name: str, make_model, codecs: bool, steps: str = "all", measured: tuple[str, ...] = MEASURED
) -> Pipeline:
    """Steps 0-2 on the checkpoint `make_model(folder)` writes, and step 5's `measured` recipes
    (read-only for the tests). Step 2 in two runs, as a user adds graphs to an export: the
    transformer (where the outliers are, what step 5 quantizes) by dynamo; with `codecs`, the
    codecs by the legacy exporter (the checkpoints' codec is tiny's, file for file: its dynamo
    graphs are the session pipeline's, proven there on tiny's captured calls; the legacy exporter
    writes the same function at a third of dynamo's cost)."""

    def build(root: Path) -> None:
        model = make_model(root / "model")
        make_reference.main(["--model", str(model), "--out-dir", str(root / "capture")])
        capture_reference.main(["--model", str(model), "--capture-dir", str(root / "capture"), "--steps", steps])
        export_as_user(model, root / "capture", root / "onnx", "--graphs", "transformer")
        if codecs:
            export_as_user(model, root / "capture", root / "onnx", "--graphs", "encoder,decoder", "--no-dynamo")
        quantize_omnivoice.main(["--onnx-dir", str(root / "onnx"), "--variants", ",".join(measured)])

    root = shared_build(tmp_path_factory, f"{name}-pipeline", build)
    return Pipeline(model=root / "model", capture=root / "capture", onnx=root / "onnx")


def _built(name: str, tiny_model: Path):
    def make(folder: Path) -> Path:
        model = build_checkpoint(name, folder)
        for file in CODEC_FILES:
            assert sha256_file(model / file) == sha256_file(tiny_model / file), file
        return model

    return make


@pytest.fixture(scope="session")
def outliers(tiny_model: Path, tmp_path_factory) -> Pipeline:
    """tiny-outliers, steps 0-2 (all three graphs: test_fp32_is_faithful_on_the_proxy) and step 5."""
    return _pipeline(tmp_path_factory, NAME, _built(NAME, tiny_model), codecs=True)


@pytest.fixture(scope="session")
def outliers2(tiny_model: Path, tmp_path_factory) -> Pipeline:
    """tiny-outliers2 (proxy 2), steps 0-2 (the transformer) and step 5."""
    return _pipeline(tmp_path_factory, PROXY2, _built(PROXY2, tiny_model), codecs=False, steps=EVERY_FOURTH_STEP)


# The reparametrized checkpoint: in every layer these v_proj output rows times GAIN, and the o_proj
# input columns that read them (each q head of the kv group) divided by GAIN: tiny's function, with
# o_proj input channels ~100x the median (phase 5's int8 fell furthest on this form).
V_ROWS = (3, 20)
GAIN = 64.0  # a power of two: fp32 cannot tell the checkpoint from tiny's


def reparametrized_tiny(tiny_model: Path):
    """tiny's checkpoint edited in its safetensors file, as a user's own model would come: nothing
    of the project's builder knows where these outliers are."""
    from safetensors.torch import load_file, save_file

    def make(folder: Path) -> Path:
        shutil.copytree(tiny_model, folder)
        weights = load_file(folder / "model.safetensors")
        config = json.loads((folder / "config.json").read_text())["llm_config"]
        head_dim = config["head_dim"]
        group = config["num_attention_heads"] // config["num_key_value_heads"]
        for layer in range(config["num_hidden_layers"]):
            prefix = f"llm.layers.{layer}.self_attn."
            v, o = weights[prefix + "v_proj.weight"], weights[prefix + "o_proj.weight"]
            for row in V_ROWS:
                v[row] *= GAIN
                head, dim = divmod(row, head_dim)
                for q_head in range(head * group, (head + 1) * group):
                    o[:, q_head * head_dim + dim] /= GAIN
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
        return folder

    return make


@pytest.fixture(scope="session")
def reparametrized(tiny_model: Path, tmp_path_factory) -> Pipeline:
    """The reparametrized tiny, steps 0-2 (the transformer) and step 5."""
    return _pipeline(
        tmp_path_factory,
        "tiny-reparametrized",
        reparametrized_tiny(tiny_model),
        codecs=False,
        steps=EVERY_FOURTH_STEP,
        measured=("int8", "int8-normfold"),  # its test compares int8 with phase 5's rule (no per-tensor figure)
    )


def per_call_agreement(pipeline: Pipeline) -> dict[str, list[float]]:
    """Argmax agreement with the fp32 capture per captured call (every step of every mode, as
    generate() makes them), for each MEASURED recipe the pipeline built."""
    manifest = capture.load_manifest(pipeline.capture, verify_hashes=False)
    return {
        name: [
            row["argmax_agreement"]
            for row in quality.step_quality(
                make_session(pipeline.onnx / name / quantize.TRANSFORMER_FILE), pipeline.capture, manifest
            )
        ]
        for name in MEASURED
        if (pipeline.onnx / name).is_dir()
    }


def run_first_clone_call(model, capture_dir: Path, hooks: list) -> dict[str, np.ndarray]:
    """Run the first captured clone call's cond row through the torch model, then remove `hooks`
    (which recorded what the test reads); returns the captured step."""
    data = capture.load_step(capture_dir, "clone", 0)
    try:
        with torch.no_grad():
            model(
                input_ids=torch.from_numpy(data["input_ids"][:1]),
                audio_mask=torch.from_numpy(data["audio_mask"][:1]),
                attention_mask=torch.from_numpy(data["attention_mask"][:1]),
            )
    finally:
        for hook in hooks:
            hook.remove()
    return data


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
    data = run_first_clone_call(model, outliers.capture, hooks)
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


# The rotated fp32 graph against the plain one: max |d logits| relative to max |logits| (float order
# alone: measured on the three checkpoints ~1e-6).
ROTATION_TOLERANCE = 1e-5


@pytest.mark.parametrize("checkpoint", ["outliers", "outliers2", "reparametrized"])
def test_every_fold_is_exact_in_fp32(checkpoint: str, request, tmp_path: Path) -> None:
    """int8's folds (powers of two, scales measured on the capture's calls) leave the fp32 graph's
    logits the same bits on steps 0, 8, 16 and 24 of every mode; they fold every kind of site (norms, up_proj,
    v_proj), and where the checkpoint's outliers sit (the norm inputs of tiny-outliers, the o_proj
    input of the reparametrized tiny) the channel ratio after the fold is a fraction of before. The
    rotation that follows (every quantized input) keeps the function: the same argmax on every row
    read, the logits within float order's error."""
    pipeline: Pipeline = request.getfixturevalue(checkpoint)
    recipe = recipes.RECIPES["int8"]
    source = pipeline.onnx / quantize.TRANSFORMER_FILE
    export = read_report(pipeline.onnx)
    exclude = export["variants"]["int8"]["excluded_nodes"]
    calls = quantize.calibration_calls(pipeline.capture, read_graph_metadata(source))
    plain, folded = quantize.prepared_graph(source, recipe), quantize.prepared_graph(source, recipe)
    rows = smoothing.smooth(folded, exclude, calls, tmp_path)
    assert {row["fold"] for row in rows} == {"norm", "up_proj", "v_proj"}
    assert sum(row["alpha"] is not None for row in rows) >= len(rows) // 2
    sites = smoothing.find_sites(folded, exclude)
    after = smoothing.measure_inputs(folded, [site.input for site in sites], calls[::4], tmp_path)
    worst = max(rows, key=lambda row: row["channel_ratio"] if row["fold"] != "up_proj" else 0)
    assert worst["channel_ratio"] >= 50 and after[worst["input"]].channel_ratio() < worst["channel_ratio"] / 4
    rotated = onnx.ModelProto()
    rotated.CopyFrom(folded)
    rotated_rows, _ = rotation.rotate_inputs(rotated, exclude)
    assert len(rotated_rows) == len(rows)  # every quantized input, whatever its fold
    for name, model in (("plain", plain), ("folded", folded), ("rotated", rotated)):
        (tmp_path / name).mkdir()
        save_with_sidecar(model, tmp_path / name / quantize.TRANSFORMER_FILE)
    session = {name: make_session(tmp_path / name / quantize.TRANSFORMER_FILE) for name in ("plain", "folded")}
    session["rotated"] = make_session(tmp_path / "rotated" / quantize.TRANSFORMER_FILE)
    captured = len(capture.mode_steps(capture.load_manifest(pipeline.capture, verify_hashes=False), "clone"))
    every = 8 * captured // 32  # steps 0, 8, 16, 24 of every mode
    assert_same_bits_on_captured_calls(pipeline.capture, session["folded"], session["plain"], every=every)
    # the rotation is the same function in another float order: the same argmax on every row read
    for mode, step, feeds in captured_calls(pipeline.capture, every):
        want, got = run_split(session["plain"], *feeds), run_split(session["rotated"], *feeds)
        assert np.array_equal(got.argmax(-1), want.argmax(-1)), (mode, step)
        assert np.abs(got - want).max() <= ROTATION_TOLERANCE * np.abs(want).max(), (mode, step)


def test_int8_holds_where_per_tensor_scales_break(outliers: Pipeline) -> None:
    """tiny-outliers (the regression case): int8 keeps argmax agreement >= 0.98 on average over
    every captured call; int8-pertensor falls to <= 0.95. Phase 5's int8-normfold still holds
    >= 0.95 on every call there (its spike rule keeps the massive layer's down_proj fp32); the
    report says what int8 measured: each input's fold, alpha and rotation."""
    export = read_report(outliers.onnx)
    agreement = per_call_agreement(outliers)
    assert np.mean(agreement["int8"]) >= 0.98, agreement["int8"]
    assert np.mean(agreement["int8-normfold"]) >= 0.98 and min(agreement["int8-normfold"]) >= 0.95
    assert np.mean(agreement["int8-pertensor"]) <= 0.95
    assert len(export["variants"]["int8-normfold"]["calibration"]["spikes"]["fp32"]) == 1
    calibration = export["variants"]["int8"]["calibration"]
    assert len(calibration["inputs"]) == len(calibration["rotated"]) == 4 * 2 and calibration["calls"] >= 12
    # online by 64-blocks (tiny's hidden and MLP widths are 64 and 128), o_proj's input per head (16)
    assert {(row["how"], row["block"]) for row in calibration["rotated"]} == {("online", 64), ("heads", 16)}
    assert "fp32" not in calibration  # int8 keeps nothing fp32 (int8-mixed measures what to keep)


@pytest.mark.parametrize("checkpoint", ["outliers2", "reparametrized"])
def test_int8_holds_where_the_outliers_are_not_in_the_norms(checkpoint: str, request) -> None:
    """Proxy 2 (down_proj input units ~250x, residual channels, massive rows) and the reparametrized
    tiny (o_proj input channels ~100x): int8 keeps argmax agreement >= 0.98 on average and >= 0.95
    on every captured call, above phase 5's rule; on proxy 2 int8-pertensor falls to <= 0.95."""
    agreement = per_call_agreement(request.getfixturevalue(checkpoint))
    assert np.mean(agreement["int8"]) >= 0.98 and min(agreement["int8"]) >= 0.95, agreement["int8"]
    assert np.mean(agreement["int8"]) > np.mean(agreement["int8-normfold"])
    if checkpoint == "outliers2":
        assert np.mean(agreement["int8-pertensor"]) <= 0.95


def test_proxy2_carries_its_outliers(outliers2: Pipeline) -> None:
    """On a captured clone call of tiny-outliers2: in the down_proj input of every layer, each GLU
    unit's median over the positions is >= 30x the median unit's (tens to hundreds: persistent,
    not a spike), and the residual channels' median stands >= 10x above the median channel's in
    the input of every q/k/v projection, with flat norm weights on them (the norm weights show
    nothing of them: a rule read off the weights cannot find them)."""
    spec = OUTLIERS[PROXY2]
    model = load_omnivoice(outliers2.model)
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for index, layer in enumerate(model.llm.layers):
        hooks.append(
            layer.mlp.down_proj.register_forward_pre_hook(lambda _m, a, i=index: seen.__setitem__(f"down{i}", a[0]))
        )
        hooks.append(
            layer.self_attn.q_proj.register_forward_pre_hook(lambda _m, a, i=index: seen.__setitem__(f"q{i}", a[0]))
        )
    run_first_clone_call(model, outliers2.capture, hooks)
    for index in range(len(model.llm.layers)):
        down = seen[f"down{index}"][0].abs().numpy()
        typical = np.median(down, axis=0)  # each unit's median |x| over the positions
        assert typical[list(spec.glu_units)].min() >= 30 * np.median(typical), index
        q = seen[f"q{index}"][0].abs().numpy()
        typical = np.median(q, axis=0)  # each channel's median |x| over the positions
        assert typical[list(spec.residual_channels)].min() >= 10 * np.median(typical), index
        norm = model.llm.layers[index].input_layernorm.weight[list(spec.residual_channels)]
        assert float(norm.abs().max()) < 2 and float(norm.abs().min()) > 0.5  # flat where the outliers are
