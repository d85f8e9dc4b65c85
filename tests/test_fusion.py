"""The fused fp32 transformer (`fp32-fused`, omnivoice_export/step56_variants/fusion.py) on tiny.

It must pass the same fp32 verdicts as the faithful export (parity_check.py --variant: argmax
1.000000 and max |d| within the fp32 threshold on every captured call; infer_onnx.py --variant:
final tokens 100 % in every mode), hold one ONNX Attention per layer and no Softmax, keep the
unmasked graph's guard (a padded call gives NaN rows), and refuse a graph it cannot fully fuse.
The int8 recipe's two further rewrites are checked here too: the RoPE and RMSNorm kernels compute
the same functions within float32 rounding.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import assert_same_bits_on_captured_calls, captured_calls, read_report, run_script

import parity_check
import quantize_omnivoice
from omnivoice_export.step1_capture import capture
from omnivoice_export.step56_variants import fusion, quantize, recipes
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.sessions import make_session, run, run_split

TRANSFORMER = quantize.TRANSFORMER_FILE
FUSED = "fp32-fused"


@pytest.fixture(scope="module")
def fused(pipeline, tmp_path_factory) -> Path:
    """A copy of the tiny export with fp32-unmasked and fp32-fused built into it (read-only)."""
    onnx_dir = tmp_path_factory.mktemp("fused") / "onnx"
    shutil.copytree(pipeline.onnx, onnx_dir)
    quantize_omnivoice.main(["--onnx-dir", str(onnx_dir), "--variants", f"fp32-unmasked,{FUSED}"])
    return onnx_dir


def layers(pipeline) -> int:
    return json.loads((pipeline.model / "config.json").read_text())["llm_config"]["num_hidden_layers"]


@pytest.mark.slow
def test_one_attention_per_layer_and_no_softmax(pipeline, fused):
    """One grouped-query Attention per layer reading the kv heads as they are (repeat_kv's Expand
    gone), at opset 23."""
    model = onnx.load(str(fused / FUSED / TRANSFORMER), load_external_data=False)
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("Attention") == layers(pipeline) >= 2
    assert "Softmax" not in ops and "IsNaN" not in ops and "Expand" not in ops
    attention = [node for node in model.graph.node if node.op_type == "Attention"]
    config = json.loads((pipeline.model / "config.json").read_text())["llm_config"]
    for node in attention:
        assert node.domain == ""
        # the graph's two scale factors (head_dim ** -0.25 each) multiplied in float32
        assert np.float32(fusion.attribute(node, "scale")) == np.float32(config["head_dim"] ** -0.25) ** 2
    assert next(entry.version for entry in model.opset_import if entry.domain == "") == fusion.ATTENTION_OPSET
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # grouped-query: the repeat mattered
    entry = read_report(fused)["variants"][FUSED]
    assert entry["node_counts"]["Attention"] == layers(pipeline) and "Softmax" not in entry["node_counts"]
    assert entry["recipe"] == recipes.RECIPES[FUSED].as_dict() and entry["recipe"]["fusions"] == ["attention"]


@pytest.mark.slow
def test_fused_equals_unmasked_bit_for_bit_on_every_captured_call(pipeline, fused):
    """On tiny (head_dim 16) the graph's scale factor 16 ** -0.25 = 0.5 is exact, so scaling q and kT
    by 0.5 each or the product by 0.25 rounds alike: the fused kernel gives the same bits as the
    unmasked graph on all 128 captured calls, as generate() makes them (run_split). At the real dims
    (head_dim 128) the factor is not a power of two and the logits move by float32 rounding only:
    measured by bench/bench_omnivoice.py and parity_check.py --variant (investigation log)."""
    fused_session = make_session(fused / FUSED / TRANSFORMER)
    unmasked = make_session(fused / "fp32-unmasked" / TRANSFORMER)
    assert_same_bits_on_captured_calls(pipeline.capture, fused_session, unmasked)


@pytest.mark.slow
def test_parity_check_judges_fused_by_the_fp32_verdict(pipeline, fused, tmp_path):
    onnx_dir = tmp_path / "onnx"
    shutil.copytree(fused, onnx_dir)
    parity_check.main(["--variant", FUSED, "--onnx-dir", str(onnx_dir), "--capture-dir", str(pipeline.capture)])
    judged = read_report(onnx_dir)["variants"][FUSED]["parity"]["cpu"]
    assert judged["verdict"] == "PASS" and judged["argmax_agreement_min"] == 1.0
    assert judged["max_abs_max"] <= judged["thresholds"]["transformer_max_abs"]
    assert len(judged["rows"]) == len(capture.MODES) * 32 and all(row["passed"] for row in judged["rows"])


@pytest.mark.slow
def test_infer_onnx_fused_keeps_every_token_in_every_mode(pipeline_copy, fused):
    import infer_onnx

    onnx_dir = pipeline_copy.onnx
    shutil.rmtree(onnx_dir)
    shutil.copytree(fused, onnx_dir)
    infer_onnx.main(
        [
            "--variant",
            FUSED,
            "--onnx-dir",
            str(onnx_dir),
            "--capture-dir",
            str(pipeline_copy.capture),
            "--no-torch-timing",
        ]
    )
    result = read_report(onnx_dir)["variants"][FUSED]["end_to_end"]["cpu"]
    manifest = capture.load_manifest(pipeline_copy.capture)
    assert result["verdict"] == "PASS" and set(result["modes"]) == set(manifest["modes"])
    assert all(
        m["token_match"] == 1.0 and m["first_divergent_step"] is None and m["passed"] for m in result["modes"].values()
    )
    # The runtime replayed every request with the same variant, under the fp32 verdict too.
    assert (result["runtime"]["variant"], result["runtime"]["verdict"], result["runtime"]["token_match"]) == (
        FUSED,
        "PASS",
        1.0,
    )


@pytest.mark.slow
def test_a_padded_call_gives_nan_rows_and_no_split_is_refused(pipeline, fused, tmp_path):
    """The fused graph is valid for all-True masks only, like fp32-unmasked: a padded call is loud."""
    data = capture.load_step(pipeline.capture, "design", 5)
    feeds = {k: data[k] for k in ("input_ids", "audio_mask", "attention_mask")}
    logits = run(make_session(fused / FUSED / TRANSFORMER), feeds)["logits"]
    full = feeds["attention_mask"].all(axis=(1, 2, 3))
    assert not full.all() and full.any()
    assert np.isnan(logits[~full]).all() and np.isfinite(logits[full]).all()
    proc = run_script(
        "infer_onnx.py",
        "--variant",
        FUSED,
        "--no-split",
        "--onnx-dir",
        str(fused),
        "--capture-dir",
        str(pipeline.capture),
        "--no-torch-timing",
    )
    assert proc.returncode == 2 and "--no-split with variant fp32-fused" in proc.stderr


@pytest.mark.slow
def test_a_graph_it_cannot_fully_fuse_is_refused(fused):
    """The faithful graph (mask Add before each Softmax) matches at no layer; removing one layer's
    pattern from the unmasked graph leaves the others: refused either way, never half fused."""
    faithful = onnx.load(str(fused / TRANSFORMER), load_external_data=False)
    with pytest.raises(UserError, match="at 0 of the graph's 2 Softmax nodes"):
        fusion.fuse_attention(faithful)
    unmasked = onnx.load(str(fused / "fp32-unmasked" / TRANSFORMER), load_external_data=False)
    softmax = next(node for node in unmasked.graph.node if node.op_type == "Softmax")
    softmax.attribute[0].i = 1  # a Softmax over another axis is not attention's
    with pytest.raises(UserError, match="at 1 of the graph's 2 Softmax nodes"):
        fusion.fuse_attention(unmasked)


@pytest.mark.slow
def test_bench_refuses_a_variant_the_export_does_not_have(pipeline, fused, tmp_path):
    done = run_script(
        "bench/bench_omnivoice.py",
        "--model",
        str(pipeline.model),
        "--onnx-dir",
        str(fused),
        "--capture-dir",
        str(pipeline.capture),
        "--results-dir",
        str(tmp_path / "results"),
        "--variants",
        f"{FUSED},int3",
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --variants: int3 not in the export report (made so far: fp32-unmasked, fp32-fused); "
        "run quantize_omnivoice.py --variants int3"
    ]
    assert not (tmp_path / "results").exists()


def assert_same_function_as_unmasked(pipeline, fused: Path, model: onnx.ModelProto, folder: Path) -> None:
    """`model` (a rewrite of fp32-unmasked in its own float order), saved in `folder`, gives
    fp32-unmasked's logits within float32 rounding (1e-5 of the largest |logit|) through run_split
    on every 8th captured step of each mode."""
    folder.mkdir()
    quantize.save_with_sidecar(model, folder / TRANSFORMER)
    session, reference = make_session(folder / TRANSFORMER), make_session(fused / "fp32-unmasked" / TRANSFORMER)
    for mode, step, feeds in captured_calls(pipeline.capture, every=8):
        got, want = run_split(session, *feeds), run_split(reference, *feeds)
        assert np.max(np.abs(got - want)) <= 1e-5 * max(1.0, float(np.max(np.abs(want)))), (mode, step)


@pytest.mark.slow
def test_rotary_fusion_replaces_every_rope_with_the_same_function(pipeline, fused, tmp_path):
    """Each layer's two rotations (q, k) become one com.microsoft.RotaryEmbedding each on the
    graph's own angles, no Neg (rotate_half) is left, and on the fp32 graph the logits stay within
    float32 rounding of the exported nodes' (the kernel's own order: why only the int8 recipe uses
    it), on every 8th captured step of each mode. With the attention fusion after it, Attention
    reads q, k and v as [B, S, N * D] with no layout copy (the int8 graph; its ops:
    test_quantize), grouped as the model's heads are and within the same bound. A graph where one
    rotation does not match is refused, never half fused."""
    model = onnx.load(str(fused / "fp32-unmasked" / TRANSFORMER))
    assert fusion.fuse_rotary(model) == 2 * layers(pipeline)
    fusion.prune_dead_nodes(model)
    ops = [node.op_type for node in model.graph.node]
    assert "Neg" not in ops and ops.count("RotaryEmbedding") == 2 * layers(pipeline)
    assert ops.count("Cos") == ops.count("Sin") == 1  # one angle table for every layer
    assert_same_function_as_unmasked(pipeline, fused, model, tmp_path / "rewritten")
    flat = onnx.load(str(fused / "fp32-unmasked" / TRANSFORMER))
    fusion.apply_fusions(flat, ("attention", "rotary"))
    attention = [node for node in flat.graph.node if node.op_type == "Attention"]
    config = json.loads((pipeline.model / "config.json").read_text())["llm_config"]
    assert [(fusion.attribute(node, "q_num_heads"), fusion.attribute(node, "kv_num_heads")) for node in attention] == [
        (config["num_attention_heads"], config["num_key_value_heads"])
    ] * layers(pipeline)
    ops = [node.op_type for node in flat.graph.node]
    assert "Expand" not in ops and ops.count("Transpose") == 1  # the one left lays out the logits [B, 8, S, V]
    assert_same_function_as_unmasked(pipeline, fused, flat, tmp_path / "flat")
    broken = onnx.load(str(fused / "fp32-unmasked" / TRANSFORMER), load_external_data=False)
    negation = next(node for node in broken.graph.node if node.op_type == "Neg")
    halves = next(node for node in broken.graph.node if negation.output[0] in node.input)
    halves.attribute[0].i = 2  # one rotate_half joins its halves along another axis: not RoPE
    with pytest.raises(UserError, match=f"at {2 * layers(pipeline) - 1} of the graph's {2 * layers(pipeline)} "):
        fusion.fuse_rotary(broken)


@pytest.mark.slow
def test_rms_norm_fusion_replaces_every_norm_with_the_same_function(pipeline, fused, tmp_path):
    """Every RMSNorm (input, post-attention, q and k per layer, the final one) becomes one
    SimplifiedLayerNormalization with the graph's 1-D weight and epsilon, no Pow is left, and on
    the fp32 graph the logits stay within float32 rounding of the exported nodes' (measured
    1.0e-5 at |logits| ~10; the kernel's own order: why only the int8 recipe uses it), on every
    8th captured step of each mode. A graph where one norm does not match is refused, never half
    fused."""
    model = onnx.load(str(fused / "fp32-unmasked" / TRANSFORMER))
    weights = {init.name: list(init.dims) for init in model.graph.initializer}
    assert fusion.fuse_rms_norm(model) == 4 * layers(pipeline) + 1
    fusion.prune_dead_nodes(model)
    ops = [node.op_type for node in model.graph.node]
    assert "Pow" not in ops and "Reciprocal" not in ops
    llm = json.loads((pipeline.model / "config.json").read_text())["llm_config"]
    norms = [node for node in model.graph.node if node.op_type == "SimplifiedLayerNormalization"]
    assert all(np.float32(fusion.attribute(node, "epsilon")) == np.float32(llm["rms_norm_eps"]) for node in norms)
    # the scale is the graph's own norm weight: hidden-wide for the layer norms, head_dim for q/k
    assert all(weights.get(node.input[1]) in ([llm["hidden_size"]], [llm["head_dim"]]) for node in norms)
    assert_same_function_as_unmasked(pipeline, fused, model, tmp_path / "rewritten")
    broken = onnx.load(str(fused / "fp32-unmasked" / TRANSFORMER), load_external_data=False)
    square = next(node for node in broken.graph.node if node.op_type == "Pow")
    square.op_type = "Mul"  # one norm no longer of the pattern
    square.input[1] = square.input[0]
    with pytest.raises(
        UserError, match=f"at {4 * layers(pipeline)} of the graph's {4 * layers(pipeline) + 1} ReduceMean"
    ):
        fusion.fuse_rms_norm(broken)
