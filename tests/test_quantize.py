"""Step 5 (quantize_omnivoice.py) and step 6 (quality_omnivoice.py) on tiny.

Variants are measurements, not parity verdicts: these tests check that every recipe builds,
loads and runs inside upstream generate() in the three modes, that the files and report entries
are what a loader verifies, and that the recipe which quantizes the audio heads is measurably
worse than the one that keeps them fp32 (why the recipes are what they are).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import SHARED_VARIANTS, assert_same_bits_on_captured_calls, captured_calls, read_report, run_script
from onnx import TensorProto, helper, numpy_helper

import quality_omnivoice
import quantize_omnivoice
from omnivoice_export.step1_capture import capture
from omnivoice_export.step2_export import report
from omnivoice_export.step56_variants import quality, quantize, recipes, rotation, sensitivity
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.sessions import make_session, run, run_split

TRANSFORMER = quantize.TRANSFORMER_FILE


@pytest.fixture(scope="module")
def variants(variants_export, tmp_path_factory) -> Path:
    """A copy of the tiny export with every recipe built into it (read-only for the tests): the
    run's shared build (int8 and the fp32 graphs), then step 5 for the other recipes on top, as a
    user adds variants to an export."""
    onnx_dir = tmp_path_factory.mktemp("variants") / "onnx"
    shutil.copytree(variants_export, onnx_dir)
    rest = [name for name in recipes.DEFAULT_VARIANTS if name not in SHARED_VARIANTS]
    quantize_omnivoice.main(["--onnx-dir", str(onnx_dir), "--variants", ",".join(rest)])
    return onnx_dir


# One quantized variant per way of building one (dynamic int8 with fp16 tables, quantized heads,
# MatMulNBits, fp16 with its own codec graphs, per-row int8); the variants left out differ only in numbers passed
# to the same quantizer, in the graph they quantize (int8-pertensor: int8-unfused's quantization of a
# rewritten graph) or in how the embedding tables are stored (checked op by op in the tests above),
# and still build, load and keep the contract. The fused recipes' rewrites are tested in test_fusion (RoPE
# and RMSNorm kernels compute the same function) and below (their ops), int8's generate() by infer_onnx
# --variant int8, int8's accuracy against int8-pertensor on the outlier proxy in test_outliers;
# int8-unfused, not int8, is measured beside int8-plain so that the heads are their one difference.
# The fp32 variants are judged, not measured: their logits are the faithful graph's bits on every
# captured call (test_unmasked_fp32_is_bit_identical_through_run_split, test_fusion) and
# infer_onnx.py --variant fp32-fused passes in every mode.
MEASURED = ("int8-unfused", "int8-plain", "int4-b32", "fp16", "int8")


@pytest.fixture(scope="module")
def measured(pipeline, variants, tmp_path_factory) -> dict:
    """The quality section after measuring one variant per recipe method (MEASURED), end to end included."""
    wav_dir = tmp_path_factory.mktemp("wavs")
    quality_omnivoice.main(
        [
            "--onnx-dir",
            str(variants),
            "--capture-dir",
            str(pipeline.capture),
            "--wav-dir",
            str(wav_dir),
            "--variants",
            ",".join(MEASURED),
        ]
    )
    section = read_report(variants)["quality"]
    section["wav_dir"] = wav_dir
    return section


@pytest.mark.slow
def test_every_recipe_writes_one_graph_and_one_sidecar(variants):
    """One transformer graph and its sidecar per variant, plus each codec graph (and sidecar) the
    recipe converts itself (fp16)."""
    entries = read_report(variants)["variants"]
    assert set(entries) == set(recipes.RECIPES)
    for name, entry in entries.items():
        folder = variants / name
        graphs = quantize.recipe_files(recipes.RECIPES[name])
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            g + suffix for g in graphs for suffix in ("", ".data")
        )
        for file, info in entry["files"].items():
            assert (folder / file).stat().st_size == info["bytes"]
        assert entry["recipe"] == recipes.RECIPES[name].as_dict()
        assert quantize.verify_variant(variants, report.load_report(variants), name) == folder / TRANSFORMER


@pytest.mark.slow
def test_variant_metadata_is_the_fp32_graphs_plus_variant_and_recipe(variants):
    fp32 = {p.key: p.value for p in onnx.load(str(variants / TRANSFORMER), load_external_data=False).metadata_props}
    for name, recipe in recipes.RECIPES.items():
        meta = {
            p.key: p.value
            for p in onnx.load(str(variants / name / TRANSFORMER), load_external_data=False).metadata_props
        }
        assert {k: meta[k] for k in fp32} == fp32
        assert meta["variant"] == name and json.loads(meta["recipe"]) == recipe.as_dict()


@pytest.mark.slow
def test_heads_and_embeddings_stay_fp32_where_the_recipe_says(variants):
    fp32 = onnx.load(str(variants / TRANSFORMER), load_external_data=False)
    heads_width = 8 * 1025
    heads, embeddings = quantize.weight_nodes(fp32, heads_width)
    for name, recipe in recipes.RECIPES.items():
        model = onnx.load(str(variants / name / TRANSFORMER), load_external_data=False)
        nodes = {node.name: node for node in model.graph.node}
        float_weights = {i.name for i in model.graph.initializer if i.data_type == TensorProto.FLOAT}
        heads_kept = all(
            h in nodes and nodes[h].op_type == "MatMul" and nodes[h].input[1] in float_weights for h in heads
        )
        embeddings_kept = all(
            e in nodes and nodes[e].op_type == "Gather" and nodes[e].input[0] in float_weights for e in embeddings
        )
        assert heads_kept == recipe.keep_heads_fp32, name
        assert embeddings_kept == (recipe.embeddings == "fp32"), name
        half_tables = {i.name for i in model.graph.initializer if i.data_type == TensorProto.FLOAT16}
        half_gathers = [n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in half_tables]
        assert len(half_gathers) == (len(embeddings) if recipe.embeddings == "fp16" else 0), name
        counts = quantize.quantized_node_counts(model)
        quantized = sum(counts.get(kind, 0) for kind in ("MatMulInteger", "MatMulIntegerToFloat", "MatMulNBits"))
        # every MatMul with a weight but the heads (2 layers x 7 + heads on tiny) and those the recipe's
        # calibration kept fp32 (its report entry names them); fp16 is float, not integer
        calibration = read_report(variants)["variants"][name].get("calibration", {})
        kept = len(calibration.get("fp32", {}).get("kept", [])) + len(calibration.get("spikes", {}).get("fp32", {}))
        expected = 0 if recipe.bits >= 16 else 2 * 7 + (0 if recipe.keep_heads_fp32 else 1) - kept
        assert quantized == expected, (name, counts)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["int8", "int8-pertensor"])
def test_int8_holds_its_three_rewrites(pipeline, variants, name: str):
    """`int8` and `int8-pertensor` as step 5 builds them: per layer one Attention, two
    RotaryEmbeddings (q, k), seven integer MatMuls (q, k, v, o, gate, up, down; int8 keeps fp32 the
    ones its report names, within the budget of the quantized weights; int8 rotates their four
    inputs, two small fp32 MatMuls each) and four RMSNorm kernels
    (input, post-attention, q, k; plus the final norm), and no layout copies around attention (no
    Expand; the one Transpose lays out the logits)."""
    model = onnx.load(str(variants / name / TRANSFORMER), load_external_data=False)
    ops = [node.op_type for node in model.graph.node]
    layers = json.loads((pipeline.model / "config.json").read_text())["llm_config"]["num_hidden_layers"]
    kept = read_report(variants)["variants"][name].get("calibration", {}).get("fp32", {"kept": [], "share": 0})
    assert kept["share"] <= sensitivity.MAX_FP32_SHARE
    integer = ops.count("MatMulInteger") + ops.count("MatMulIntegerToFloat") + len(kept["kept"])
    assert (
        ops.count("Attention"),
        ops.count("RotaryEmbedding"),
        integer,
        ops.count("SimplifiedLayerNormalization"),
        ops.count("Pow"),
        ops.count("Softmax"),
        ops.count("Neg"),
        ops.count("Transpose"),
        ops.count("Expand"),
    ) == (layers, 2 * layers, 7 * layers, 4 * layers + 1, 0, 0, 0, 1, 0)
    assert recipes.RECIPES[name].fusions == ("attention", "rotary", "rms_norm")
    # int8 rotates q/k/v's, gate/up's and down's inputs online (one fp32 MatMul each), o's per head in
    # the v_proj and o_proj weights (nothing at run time)
    rotations = [node.op_type for node in model.graph.node if node.name.startswith(rotation.PREFIX)]
    assert rotations.count("MatMul") == (3 * layers if recipes.RECIPES[name].rotate else 0)


@pytest.mark.slow
def test_int8_mixed_reports_what_it_kept_and_why(variants):
    """int8-mixed: int8's folds and rotations, then the fp32 choice; its report names the target,
    the all-int8 agreement it measured and, when that missed the target, every MatMul's share of
    the logit error and the ones kept (within the budget)."""
    calibration = read_report(variants)["variants"]["int8-mixed"]["calibration"]
    fp32, matmuls = calibration["fp32"], {m for row in calibration["inputs"] for m in row["matmuls"]}
    assert len(calibration["rotated"]) == len(calibration["inputs"]) and fp32["share"] <= sensitivity.MAX_FP32_SHARE
    target = (sensitivity.TARGET_MEAN, sensitivity.TARGET_MIN)
    if fp32["all_int8_mean"] >= target[0] and fp32["all_int8_min"] >= target[1]:  # nothing to keep: no sweep
        assert fp32["reached"] and fp32["kept"] == [] and fp32["contribution"] == {}
    else:  # every MatMul measured, the kept ones among them
        assert set(fp32["contribution"]) == matmuls and set(fp32["kept"]) <= matmuls
        assert fp32["agreement_mean"] >= fp32["all_int8_mean"]


@pytest.mark.slow
def test_int8_pertensor_keeps_int8_unfused_accuracy(pipeline, variants):
    """The rewrites change float order only (attention kernel, RMSNorm kernel; the merge keeps the
    bits): on every 8th captured step of each mode int8-pertensor's logits stay at int8-unfused's
    distance from the export's and agree with them on argmax (measured on tiny: mean 0.9931 for both)."""
    fused = "int8-pertensor"
    sessions = {
        name: make_session(path)
        for name, path in (
            ("fp32", variants / TRANSFORMER),
            (fused, variants / fused / TRANSFORMER),
            ("int8-unfused", variants / "int8-unfused" / TRANSFORMER),
        )
    }
    for mode, step, feeds in captured_calls(pipeline.capture, every=8):
        logits = {name: run_split(session, *feeds) for name, session in sessions.items()}
        error = {name: float(np.max(np.abs(logits[name] - logits["fp32"]))) for name in (fused, "int8-unfused")}
        assert error[fused] <= 1.5 * error["int8-unfused"], (mode, step, error)
        agree = np.mean(logits[fused].argmax(-1) == logits["int8-unfused"].argmax(-1))
        assert agree >= 0.99, (mode, step, agree)


def gather_model(table: np.ndarray, ids: np.ndarray) -> onnx.ModelProto:
    """One Gather node "emb" reading `table` (an initializer) at input `ids`: an embedding as the export has it."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], name="emb")],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, list(ids.shape))],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [*ids.shape, table.shape[1]])],
        [numpy_helper.from_array(table, "table")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_rowwise_embedding_is_q_times_scale_and_within_half_a_step():
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((50, 24)) * rng.uniform(0.01, 3, (50, 1))).astype(np.float32)
    table[7] = 0  # an all-zero row must not divide by zero
    ids = np.array([[0, 7, 49, 3], [3, 3, 12, 1]], dtype=np.int64)
    model = gather_model(table, ids)
    quantize.quantize_embeddings_rowwise(model, ["emb"])
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    q, scale = inits["emb_int8row_q"], inits["emb_int8row_scale"]
    assert q.dtype == np.int8 and scale.shape == (50, 1) and np.abs(q).max() <= 127
    session = make_session_from_model(model)
    got = session.run(None, {"ids": ids})[0]
    assert np.array_equal(got, q[ids].astype(np.float32) * scale[ids])
    assert np.all(np.abs(got - table[ids]) <= scale[ids] / 2 * (1 + 1e-6))
    assert np.array_equal(got[0, 1], np.zeros(24, np.float32))


def test_fp16_embedding_is_the_rounded_row_and_half_the_bytes():
    rng = np.random.default_rng(1)
    table = (rng.standard_normal((40, 16)) * rng.uniform(1e-6, 4, (40, 1))).astype(np.float32)
    ids = np.array([[0, 39, 5], [5, 2, 2]], dtype=np.int64)
    model = gather_model(table, ids)
    quantize.store_embeddings_fp16(model, ["emb"])
    (stored,) = [numpy_helper.to_array(i) for i in model.graph.initializer]
    assert stored.dtype == np.float16 and stored.nbytes == table.nbytes // 2
    got = make_session_from_model(model).run(None, {"ids": ids})[0]
    assert got.dtype == np.float32 and np.array_equal(got, table.astype(np.float16)[ids].astype(np.float32))
    normal = np.abs(table[ids]) >= np.finfo(np.float16).tiny
    error = np.abs(got - table[ids])
    assert np.all(error[normal] <= np.abs(table[ids])[normal] * 2.0**-11)
    assert np.all(error[~normal] <= 2.0**-25)


def make_session_from_model(model: onnx.ModelProto):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.slow
def test_variant_sessions_keep_the_transformer_contract(pipeline, variants):
    """Same inputs and output as the fp32 graph; finite logits as generate() calls them (run_split)."""
    from omnivoice_export.step1_capture import capture
    from omnivoice_onnx.sessions import run_split

    data = capture.load_step(pipeline.capture, "clone", 0)
    fp32 = make_session(variants / TRANSFORMER)
    for name in recipes.RECIPES:
        session = make_session(variants / name / TRANSFORMER)
        assert [(i.name, i.type) for i in session.get_inputs()] == [(i.name, i.type) for i in fp32.get_inputs()]
        assert [(o.name, o.type) for o in session.get_outputs()] == [(o.name, o.type) for o in fp32.get_outputs()]
        logits = run_split(session, data["input_ids"], data["audio_mask"], data["attention_mask"])
        assert logits.dtype == np.float32 and logits.shape == (*data["input_ids"].shape, 1025)
        assert np.isfinite(logits).all(), name


@pytest.mark.slow
def test_a_damaged_or_unknown_variant_is_refused(variants, tmp_path):
    copy = tmp_path / "onnx"
    shutil.copytree(variants, copy)
    export = report.load_report(copy)
    with pytest.raises(UserError, match="no variant 'int3'"):
        quantize.verify_variant(copy, export, "int3")
    with open(copy / "int8" / (TRANSFORMER + ".data"), "r+b") as handle:
        handle.seek(4096)
        handle.write(b"\x01\x02\x03\x04")
    with pytest.raises(UserError, match="sha256"):
        quantize.verify_variant(copy, export, "int8")


def test_script_help_and_unknown_variant():
    help_text = run_script("quantize_omnivoice.py", "--help").stdout
    for name in recipes.RECIPES:
        assert name in help_text
    proc = run_script("quantize_omnivoice.py", "--variants", "int3")
    assert proc.returncode == 2 and proc.stderr.startswith("error: --variants: unknown value(s) int3")


@pytest.mark.slow
def test_each_recipe_method_runs_generate_in_every_mode(measured, pipeline):
    manifest = json.loads((pipeline.capture / "manifest.json").read_text())
    assert set(measured["variants"]) == {"fp32", *MEASURED}
    assert {recipes.RECIPES[name].method for name in MEASURED} == {
        r.method for r in recipes.RECIPES.values() if r.bits < 32
    }
    for name, result in measured["variants"].items():
        assert set(result["end_to_end"]) == set(manifest["modes"]), name
        for mode, e2e in result["end_to_end"].items():
            for wav in capture.item_files(manifest, mode, f"{mode}.wav"):  # the batch mode: one per item
                assert (measured["wav_dir"] / name / wav).is_file()
            assert 0.0 <= e2e["token_match"] <= 1.0 and np.isfinite(e2e["log_spectral_l1"])
            assert 0.0 <= e2e["greedy_token_match"] <= 1.0
    # the fp32 baseline of the table is the export itself: tokens identical, as infer_onnx proves,
    # sampled and greedy (both temperatures 0, against PyTorch's greedy run)
    assert all(
        e["token_match"] == 1.0
        and e["first_divergent_step"] is None
        and e["greedy_token_match"] == 1.0
        and e["greedy_first_divergent_step"] is None
        for e in measured["variants"]["fp32"]["end_to_end"].values()
    )
    # only a variant with its own codec graphs gets codec figures: fp16's, measured on the capture
    assert [name for name, r in measured["variants"].items() if "codecs" in r] == ["fp16"]
    codecs = measured["variants"]["fp16"]["codecs"]
    assert codecs["encoder"]["code_match"] > 0.9 and codecs["decoder"]["log_spectral_l1_max"] < 1e-2


@pytest.mark.slow
def test_quantizing_the_audio_heads_is_measurably_worse(measured):
    heads_fp32, plain = measured["variants"]["int8-unfused"], measured["variants"]["int8-plain"]
    assert plain["relative_error_mean"] > 1.5 * heads_fp32["relative_error_mean"]
    assert plain["argmax_agreement_mean"] < heads_fp32["argmax_agreement_mean"]
    tokens = {
        name: np.mean([e["token_match"] for e in measured["variants"][name]["end_to_end"].values()])
        for name in ("int8-unfused", "int8-plain")
    }
    assert tokens["int8-plain"] < tokens["int8-unfused"]


@pytest.mark.slow
def test_the_table_has_a_row_per_variant_against_fp32(measured):
    text = quality.table(measured["variants"])
    lines = text.splitlines()
    assert len(lines) == 1 + 1 + len(MEASURED)
    assert lines[1].startswith("fp32") and "100.0%" in lines[1]
    assert measured["machine"]["cpu"]["logical_cores"] >= 1 and measured["machine"]["cpu"]["model_name"]


@pytest.mark.slow
def test_unmasked_fp32_is_bit_identical_through_run_split(pipeline, variants):
    """Every captured call, as generate() makes it through run_split: the same bits as the faithful graph."""
    faithful = make_session(variants / TRANSFORMER)
    unmasked = make_session(variants / "fp32-unmasked" / TRANSFORMER)
    assert_same_bits_on_captured_calls(pipeline.capture, unmasked, faithful)
    model = onnx.load(str(variants / "fp32-unmasked" / TRANSFORMER), load_external_data=False)
    ops = [node.op_type for node in model.graph.node]
    assert "IsNaN" not in ops and ops.count("Where") == 2  # the embedding select and the one output guard


@pytest.mark.slow
def test_unmasked_fp32_gives_nan_for_rows_whose_mask_is_not_all_true(pipeline, variants):
    """A padded call (upstream's layout) on the unmasked graph is loud: NaN rows, never wrong numbers."""
    from omnivoice_export.step1_capture import capture

    data = capture.load_step(pipeline.capture, "design", 5)
    feeds = {k: data[k] for k in ("input_ids", "audio_mask", "attention_mask")}
    logits = run(make_session(variants / "fp32-unmasked" / TRANSFORMER), feeds)["logits"]
    full = feeds["attention_mask"].all(axis=(1, 2, 3))
    assert not full.all() and full.any()
    assert np.isnan(logits[~full]).all() and np.isfinite(logits[full]).all()
    faithful = run(make_session(variants / TRANSFORMER), feeds)["logits"]
    assert np.array_equal(logits[full], faithful[full])


@pytest.mark.slow
def test_parity_check_variant_measures_quantized_and_judges_fp32(pipeline, variants, tmp_path):
    import parity_check

    onnx_dir = tmp_path / "onnx"
    shutil.copytree(variants, onnx_dir)
    common = ["--onnx-dir", str(onnx_dir), "--capture-dir", str(pipeline.capture)]
    parity_check.main(["--variant", "int8-plain", *common])  # a measurement: no CheckFailed whatever it finds
    parity_check.main(["--variant", "fp32-unmasked", *common])
    entries = read_report(onnx_dir)["variants"]
    measured, judged = entries["int8-plain"]["parity"]["cpu"], entries["fp32-unmasked"]["parity"]["cpu"]
    assert measured["verdict"].startswith("measurement") and measured["argmax_agreement_min"] < 1.0
    assert all(row["passed"] is None for row in measured["rows"]) and len(measured["rows"]) == len(capture.MODES) * 32
    assert judged["verdict"] == "PASS" and judged["argmax_agreement_min"] == 1.0
    assert read_report(onnx_dir).get("parity") == read_report(variants).get("parity")  # fp32 verdicts untouched


@pytest.mark.slow
def test_infer_onnx_variant_runs_generate_with_fp32_codecs(pipeline_copy, variants_export):
    """A quantized variant inside generate() and the runtime gets measurements, not verdicts; the
    fp32 variants' verdicts are test_fusion's (infer_onnx --variant fp32-fused)."""
    import infer_onnx

    shutil.rmtree(pipeline_copy.onnx)
    shutil.copytree(variants_export, pipeline_copy.onnx)  # step 5's int8, built once for the run
    common = ["--onnx-dir", str(pipeline_copy.onnx), "--capture-dir", str(pipeline_copy.capture), "--no-torch-timing"]
    infer_onnx.main(["--variant", "int8", *common])
    result = read_report(pipeline_copy.onnx)["variants"]["int8"]["end_to_end"]["cpu"]
    assert result["verdict"].startswith("measurement")
    assert all(m["passed"] is None and 0.0 <= m["token_match"] <= 1.0 for m in result["modes"].values())
    assert (result["runtime"]["variant"], result["runtime"]["verdict"]) == ("int8", "measurement")
    assert all(m["passed"] is None for m in result["runtime"]["modes"].values())
    manifest = capture.load_manifest(pipeline_copy.capture, verify_hashes=False)
    for mode in result["modes"]:
        for name in (f"onnx_int8_{mode}.wav", f"onnx_int8_{mode}_spectrogram.png"):
            for file in capture.item_files(manifest, mode, name):  # the batch mode: one per item
                assert (pipeline_copy.capture / file).is_file()
    for unmasked in ("fp32-unmasked", "int8"):  # int8 is quantized from the unmasked, fused graph
        with pytest.raises(UserError, match=f"--no-split with variant {unmasked}:"):
            infer_onnx.main(["--variant", unmasked, "--no-split", *common])
