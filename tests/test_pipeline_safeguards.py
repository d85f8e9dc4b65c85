"""The holes in the proof closed. A failed export is never used, batches and the mask are
checked on real inputs, wrong codec graphs and empty comparisons fail, CUDA runs in fp32 or says
why not, the bench refuses what it cannot compare, `--model` takes a hub id, and a run's stderr
holds only what concerns the user.

(The batch capture and the mask probe are also tested where their neighbours are: test_capture,
test_export, test_parity, test_infer.) What a test exercises that did not exist before this issue
it imports itself, so that against the code before, each test fails for its own reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import REPO, Pipeline, assert_hardware_recorded, install_graph, read_report, run_script
from onnx import TensorProto, helper, numpy_helper
from test_script_errors import Result, assert_one_line, edit_json, linked_copy, run_inprocess, snapshot

import export_omnivoice
import infer_onnx
import parity_check
from omnivoice_export.common import metrics
from omnivoice_export.step0_checkpoints.checkpoints import REQUIRED_FILES, load_omnivoice, model_fingerprint
from omnivoice_export.step1_capture import capture
from omnivoice_onnx.contract import GRAPH_FILES
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.hashing import sha256_file
from omnivoice_onnx.program import EXIT_BAD_INPUT, EXIT_CHECK_FAILED
from omnivoice_onnx.sessions import make_session, run

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA device")


# --- 1. a failed export is never installed, never used -------------------------------------------


def _eager_model(path: Path):
    """The model with `eager` attention: its faithful export ignores the attention mask."""
    model = load_omnivoice(path)
    model.llm.set_attn_implementation("eager")
    return model


@pytest.mark.slow
def test_export_failing_its_checks_is_not_installed(pipeline: Pipeline, tmp_path: Path, monkeypatch, capsys) -> None:
    """An export whose self-checks fail (here: a mask-ignoring transformer, caught by the mask
    probe) exits 1 naming the graph and the check, and leaves onnx/ byte for byte as it was: a
    second `make demo` cannot go on with it."""
    onnx_dir = tmp_path / "onnx"
    shutil.copytree(pipeline.onnx, onnx_dir)
    before = snapshot(onnx_dir)
    monkeypatch.setattr(export_omnivoice, "load_omnivoice", _eager_model)
    result = run_inprocess(
        export_omnivoice,
        [
            "--model",
            pipeline.model,
            "--capture-dir",
            pipeline.capture,
            "--onnx-dir",
            onnx_dir,
            "--graphs",
            "transformer",
            "--no-dynamo",
        ],
        capsys,
    )
    assert_one_line(
        result,
        EXIT_CHECK_FAILED,
        "the export of transformer failed its checks (transformer: mask probe",
        "nothing was installed",
    )
    assert "transformer failed: mask probe" in result.out
    assert snapshot(onnx_dir) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["onnx"]  # no staging directory left


@pytest.mark.slow
@pytest.mark.parametrize("script", ["parity", "infer-synthesis"])
def test_graph_marked_failed_is_refused(script: str, pipeline: Pipeline, tmp_path: Path, capsys) -> None:
    """A report that records a failed self-check (as an export before this issue installed it) is
    refused by parity and by infer_onnx.py (both modes read the report through verify_graphs), with
    one line naming the check."""
    work = Pipeline(pipeline.model, linked_copy(pipeline.capture, tmp_path / "capture"), tmp_path / "onnx")
    shutil.copytree(pipeline.onnx, work.onnx)
    failure = "mask probe: changing 25 masked keys of row 1 moved the logits ..."
    edit_json(
        work.onnx / "export-report.json",
        lambda r: r["graphs"]["transformer"]["self_checks"].update(passed=False, failures=[failure]),
    )
    argv = {
        "parity": (parity_check, ["--capture-dir", work.capture, "--onnx-dir", work.onnx]),
        "infer-synthesis": (infer_onnx, ["--onnx-dir", work.onnx, "--text", "Hello.", "--out", tmp_path / "out.wav"]),
    }[script]
    result = run_inprocess(*argv, capsys)
    assert_one_line(
        result,
        EXIT_BAD_INPUT,
        "the transformer graph failed its export checks (mask probe",
        "re-run export_omnivoice.py",
    )
    assert not (tmp_path / "out.wav").exists()


def test_make_deletes_a_target_its_failed_recipe_changed(tmp_path: Path) -> None:
    """make's .DELETE_ON_ERROR: a step that wrote its target and then failed leaves no target, so
    the next `make demo` re-runs it instead of going on from it."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    capture_dir, onnx_dir = tmp_path / "capture", tmp_path / "onnx"
    capture_dir.mkdir()
    (capture_dir / "manifest.json").write_text("{}")
    failing_python = tmp_path / "python"  # stands in for `$(PY) export_omnivoice.py`: writes, then fails
    failing_python.write_text(f"#!/bin/sh\nmkdir -p {onnx_dir}\necho '{{}}' > {onnx_dir}/export-report.json\nexit 1\n")
    failing_python.chmod(0o755)
    done = subprocess.run(
        [
            "make",
            "-C",
            str(REPO),
            f"PY={failing_python}",
            f"CAPTURE={capture_dir}",
            f"ONNX={onnx_dir}",
            "-o",
            f"{capture_dir}/manifest.json",
            f"{onnx_dir}/export-report.json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Deleting file" in done.stderr, done.stderr
    assert not (onnx_dir / "export-report.json").exists()


# --- 3. metrics refuse what they cannot compare; a verdict on nothing is an error ---------------


@pytest.mark.parametrize(
    "metric,reference,candidate,message",
    [
        (metrics.logit_stats, np.zeros((4, 1025)), np.zeros((1, 1025)), "differ in shape"),
        (metrics.logit_stats, np.zeros((0, 1025)), np.zeros((0, 1025)), "nothing to compare"),
        (metrics.code_match, np.zeros((1, 8, 0), np.int64), np.zeros((1, 8, 0), np.int64), "nothing to compare"),
        (metrics.log_spectral_l1, np.zeros(0, np.float32), np.zeros(100, np.float32), "nothing to compare"),
    ],
)
def test_metrics_refuse_mismatched_or_empty_arrays(metric, reference, candidate, message: str) -> None:
    """numpy would broadcast [4,V] against [1,V], and an empty comparison would agree 100 %: both
    are refused instead of becoming a figure."""
    with pytest.raises(ValueError, match=message):
        metric(reference, candidate)


def test_logit_stats_are_the_float64_sorted_figures() -> None:
    """logit_stats (argmax on the inputs' dtype, top-2 by partition) gives exactly the figures of
    the plain float64 computation (argmax and a full sort of float64 copies), on float32 rows with
    flips, exact ties (the first maximum wins in both) and a row whose two largest are equal."""
    rng = np.random.default_rng(7)
    ref = rng.standard_normal((300, 8 * 1025)).astype(np.float32)
    got = ref + (rng.standard_normal(ref.shape) * 1e-3).astype(np.float32)
    ref[5, [10, 20]] = got[5, [10, 20]] = 9.0  # a tie: index 10 wins on both sides
    ref[6, [30, 40]] = 8.0  # the top two equal: margin 0 if the row flips
    got[6, 40] = 8.5
    stats = metrics.logit_stats(ref, got)
    ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
    disagree = ref64.argmax(-1) != got64.argmax(-1)
    top2 = np.sort(ref64[disagree], axis=-1)[:, -2:]
    margins = top2[:, 1] - top2[:, 0]
    diff = np.abs(ref64 - got64)
    assert disagree[6] and not disagree[5] and disagree.sum() > 1
    assert (stats.flips, stats.argmax_agreement) == (int(disagree.sum()), float(1.0 - disagree.mean()))
    assert (stats.max_abs, stats.mean_abs) == (float(diff.max()), float(diff.mean()))
    assert (stats.flip_margin_min, stats.flip_margin_max) == (float(margins.min()), float(margins.max()))
    assert stats.flip_margin_min == 0.0  # row 6


@pytest.mark.slow
def test_encoder_with_nothing_to_compare_is_an_error(pipeline: Pipeline, tmp_path: Path, capsys) -> None:
    """A capture without clone mode holds no encoder input: parity of the encoder is refused with
    one line instead of a PASS on nothing."""
    work = Pipeline(pipeline.model, linked_copy(pipeline.capture, tmp_path / "capture"), tmp_path / "onnx")
    shutil.copytree(pipeline.onnx, work.onnx)
    edit_json(work.capture / "manifest.json", lambda m: m["modes"].pop("clone"))
    sha = sha256_file(work.capture / "manifest.json")
    edit_json(work.onnx / "export-report.json", lambda r: r["capture"].update(manifest_sha256=sha))
    result = run_inprocess(
        parity_check, ["--capture-dir", work.capture, "--onnx-dir", work.onnx, "--graphs", "encoder"], capsys
    )
    assert_one_line(result, EXIT_BAD_INPUT, "nothing to check the encoder on", "clone among --modes")
    assert "parity" not in json.loads((work.onnx / "export-report.json").read_text())


# --- 4. CUDA in fp32, or a reason --------------------------------------------------------------


@pytest.mark.slow
def test_capture_records_its_float32_settings(pipeline: Pipeline) -> None:
    """The manifest says under which float32 settings the reference was computed: TF32 off for
    CUDA matmuls and cuDNN convolutions (torch leaves cuDNN's on by default)."""
    manifest = capture.load_manifest(pipeline.capture, verify_hashes=False)
    assert manifest["precision"] == {"cuda_matmul_allow_tf32": False, "cudnn_allow_tf32": False}


def test_full_fp32_switches_tf32_off_and_restores() -> None:
    """capture.full_fp32 turns both TF32 switches off for its block and puts back what was set."""
    saved = capture.precision_settings()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        with capture.full_fp32() as settings:
            assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
            assert settings == capture.precision_settings()
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved["cuda_matmul_allow_tf32"]
        torch.backends.cudnn.allow_tf32 = saved["cudnn_allow_tf32"]


CUDA_FIRST = ["CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.mark.parametrize(
    "provider,providers,use_tf32,message",
    [
        ("cuda-fp32", CUDA_FIRST, "0", None),
        ("cuda-fp32", CUDA_FIRST, "1", "reports use_tf32='1' for g.onnx, so cuda-fp32 would compute in TF32"),
        ("cuda-fp32", CUDA_FIRST, None, "reports use_tf32=None"),
        ("cuda-tf32", CUDA_FIRST, "1", None),
        ("cuda-fp32", ["CPUExecutionProvider"], "0", "did not place g.onnx on CUDA"),
    ],
)
def test_cuda_session_options_are_read_back(provider: str, providers: list, use_tf32, message) -> None:
    """What a CUDA session reports (its providers, its CUDA options) decides: cuda-fp32 needs the
    CUDA provider first and use_tf32 "0" read back, not merely requested."""
    from omnivoice_onnx.sessions import check_cuda_options

    options = {"CUDAExecutionProvider": {} if use_tf32 is None else {"use_tf32": use_tf32}}
    if message is None:
        check_cuda_options("g.onnx", provider, providers, options)
    else:
        with pytest.raises(UserError, match=message.replace("(", r"\(")):
            check_cuda_options("g.onnx", provider, providers, options)


def _two_node_graph(path: Path) -> Path:
    """MatMul then Shape: a graph small enough to build here, with a compute node and a shape node."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["c"]), helper.make_node("Shape", ["c"], ["s"])],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4])],
        [
            helper.make_tensor_value_info("c", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
        [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_node_placement_reports_each_nodes_provider(tmp_path: Path) -> None:
    """node_placement reads the provider of every node from a profiled run and ends the profile
    (its file removed; later runs unprofiled). On CPU every node is a CPU node."""
    from omnivoice_onnx.sessions import node_placement

    session = make_session(_two_node_graph(tmp_path / "g.onnx"), "cpu", profile=True)
    feeds = {"a": np.ones((3, 4), np.float32)}
    run(session, feeds)
    placement = node_placement(session)
    assert placement == {"nodes": {"CPUExecutionProvider": 2}, "cpu_ops": {"MatMul": 1, "Shape": 1}}
    assert not list(Path(tempfile.gettempdir()).glob(f"omnivoice-ort-profile-{os.getpid()}*"))
    np.testing.assert_array_equal(run(session, feeds)["c"], feeds["a"])


@pytest.mark.slow
def test_compare_captures_finds_the_first_step_with_other_inputs(pipeline: Pipeline, tmp_path: Path) -> None:
    """device_check.compare on two CPU captures whose Gumbel noise differs (another seed), as a CUDA
    capture's does: step 0's inputs are equal and so are its logits, bit for bit; the inputs part
    at step 1."""
    import capture_reference
    from omnivoice_export.step34_proof import device_check

    other = tmp_path / "capture"

    capture_reference.main(
        ["--model", str(pipeline.model), "--modes", "design", "--seed", "99", "--capture-dir", str(other)]
    )
    result = device_check.compare_captures(pipeline.capture, other)
    assert list(result["modes"]) == ["design"]
    design = result["modes"]["design"]
    assert design["first_step_with_other_inputs"] == 1
    assert [row["step"] for row in design["steps_compared"]] == [0]
    assert design["steps_compared"][0]["max_abs"] == 0.0 and design["steps_compared"][0]["argmax_agreement"] == 1.0
    assert list(result["precision"].values()) == [capture.load_manifest(other, verify_hashes=False)["precision"]] * 2


@pytest.mark.slow
def test_replay_on_the_capture_device_is_exact(pipeline: Pipeline) -> None:
    """device_check.replay on the device the capture was made on reproduces it exactly: logits of
    every mode (steps 0 and 31), encoder codes and decoder audio."""
    from omnivoice_export.step34_proof import device_check

    result = device_check.replay(pipeline.capture, "cpu", steps=[0, 31])
    assert set(result["modes"]) == set(capture.MODES)
    for mode, entry in result["modes"].items():
        assert [row["step"] for row in entry["transformer"]] == [0, 31]
        assert all(row["max_abs"] == 0.0 for row in entry["transformer"]), mode
        assert entry["decoder_log_spectral_l1"] == [0.0] * len(
            capture.item_files(capture.load_manifest(pipeline.capture, verify_hashes=False), mode, "decoder.npz")
        )
    assert result["modes"]["clone"]["encoder_code_match"] == 1.0


def test_gpu_check_stops_with_one_line_without_cuda(tmp_path: Path) -> None:
    """scripts/gpu_check.sh starts with the environment: without a CUDA device it stops there with
    one line and exit 2, before building anything."""
    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without CUDA")
    done = subprocess.run(
        [str(REPO / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PY": sys.executable},
    )
    assert done.returncode == EXIT_BAD_INPUT
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "sees no CUDA device" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.gpu
@CUDA
@pytest.mark.slow
def test_cuda_replay_of_the_cpu_capture_is_fp32(pipeline: Pipeline) -> None:
    """torch on CUDA with TF32 off reproduces the CPU reference within the fp32 parity thresholds."""
    from omnivoice_export.step34_proof import device_check
    from omnivoice_onnx.contract import THRESHOLDS

    result = device_check.replay(pipeline.capture, "cuda")
    for entry in result["modes"].values():
        assert min(row["argmax_agreement"] for row in entry["transformer"]) >= THRESHOLDS["transformer_argmax_min"]
        assert max(row["max_abs"] for row in entry["transformer"]) <= THRESHOLDS["transformer_max_abs"]


@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_fp32_session_reads_back_use_tf32_0(pipeline: Pipeline) -> None:
    """onnxruntime-gpu's CUDA session of the transformer reports use_tf32 "0" and runs it."""
    import onnxruntime

    from omnivoice_onnx.sessions import node_placement

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("needs onnxruntime-gpu")
    session = make_session(pipeline.onnx / GRAPH_FILES["transformer"], "cuda-fp32", profile=True)
    assert session.get_provider_options()["CUDAExecutionProvider"]["use_tf32"] == "0"
    data = capture.load_step(pipeline.capture, "clone", 0)
    run(session, {k: data[k] for k in ("input_ids", "audio_mask", "attention_mask")})
    assert node_placement(session)["nodes"].get("CUDAExecutionProvider", 0) > 0


# --- 5. the bench measures only what it can compare ---------------------------------------------


def _model_with_other_fingerprint(tiny: Path, dst: Path) -> Path:
    """tiny's files linked, with a tokenizer_config.json one key longer: a valid checkpoint whose
    fingerprint differs."""
    for name in REQUIRED_FILES:
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        (dst / name).symlink_to(tiny / name)
    config = json.loads((tiny / "tokenizer_config.json").read_text())
    (dst / "tokenizer_config.json").unlink()
    (dst / "tokenizer_config.json").write_text(json.dumps({**config, "note": "another model"}))
    return dst


@pytest.mark.slow
def test_bench_refuses_an_export_of_another_model(pipeline: Pipeline, tmp_path: Path) -> None:
    """The bench times the export against the model it loads: another model's export is refused
    before any worker starts (exit 2, one line naming both fingerprints)."""
    other = _model_with_other_fingerprint(pipeline.model, tmp_path / "model")
    done = run_script(
        "bench/bench_omnivoice.py",
        "--model",
        str(other),
        "--onnx-dir",
        str(pipeline.onnx),
        "--capture-dir",
        str(pipeline.capture),
        "--results-dir",
        str(tmp_path / "results"),
        timeout=120,
    )
    line = assert_one_line(Result(done.returncode, done.stdout, done.stderr), EXIT_BAD_INPUT, "is of model")
    assert model_fingerprint(other) in line and model_fingerprint(pipeline.model) in line
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_bench_fails_on_other_tokens_names_the_cpu_and_times_each_variant(
    pipeline: Pipeline, variants_export: Path, perturbed_transformer: Path, tmp_path: Path
) -> None:
    """One bench run (one round, 4 steps, one call shape, 1 s codec calls, a short GEMM ceiling) for
    two properties, since each run costs most of a minute:
    - the fp32 graph installed is the perturbed one (argmax kept, confidences changed), so its
      generate() gives other tokens: the bench still writes its figures, with the CPU and GEMM
      libraries they belong to and ORT padded vs torch padded beside the split, and exits 1;
    - --variants int8 (built from the correct graph before the perturbed one replaced it): per
      call at each shape timed and generate() beside fp32 ORT's in the same round, size on disk,
      peak RSS, its own table row. (Each variant is one more pair of worker processes; the fp32
      variants' tokens are held to the fp32 verdict by infer_onnx.py --variant, test_fusion.)
    """
    onnx_dir = tmp_path / "onnx"
    shutil.copytree(variants_export, onnx_dir)
    install_graph(perturbed_transformer, onnx_dir, "transformer")
    done = run_script(
        "bench/bench_omnivoice.py",
        "--model",
        str(pipeline.model),
        "--onnx-dir",
        str(onnx_dir),
        "--capture-dir",
        str(pipeline.capture),
        "--results-dir",
        str(tmp_path / "results"),
        "--repeats",
        "1",
        "--calls",
        "1",
        "--num-step",
        "4",
        "--variants",
        "int8",
        "--shapes",
        "S~200",
        "--codec-seconds",
        "1",
        "--gemm-seconds",
        "0.05",
        timeout=900,
    )
    line = assert_one_line(
        Result(done.returncode, done.stdout, done.stderr),
        EXIT_CHECK_FAILED,
        "ONNX generate()'s final tokens differ from PyTorch's",
    )
    (results,) = (tmp_path / "results").glob("*.json")
    data = json.loads(results.read_text())
    summary, cpu = data["summary"], data["meta"]["cpu"]
    assert cpu["logical_cores"] == os.cpu_count() and cpu["model_name"] and cpu["family"] is not None
    assert_hardware_recorded(data["meta"], results)
    assert summary["gemm"]["libraries"]["onnxruntime"].startswith("MLAS")
    assert summary["generate"]["final_token_match"] < 1.0, line
    for row in summary["transformer"].values():
        assert row["speedup_ort_padded_vs_torch"] == pytest.approx(
            row["torch_padded"]["median"] / row["ort_padded"]["median"]
        )
    assert list(summary["variants"]) == ["int8"]
    entries = read_report(onnx_dir)["variants"]
    for name, variant in summary["variants"].items():
        assert variant["bytes"] == entries[name]["bytes"]
        assert variant["size_ratio"] == entries[name]["bytes"] / entries[name]["fp32_bytes"]
        assert set(variant["transformer"]) == set(summary["transformer"])
        for row in variant["transformer"].values():
            assert row["ort_split"]["n"] == 1 and row["speedup_vs_fp32"] > 0
            assert (
                0.0 <= row["vs_fp32"]["argmax_agreement"] <= 1.0 and 0.0 <= row["vs_torch"]["argmax_agreement"] <= 1.0
            )
        assert variant["generate"]["peak_rss_mb"]["median"] > 0 and variant["generate"]["speedup_vs_fp32"] > 0
        # generate() = its transformer forwards + the rest (one run: the medians add up)
        parts = variant["generate"]["parts"]
        assert parts["transformer"]["median"] > 0 and parts["rest"]["median"] > 0
        assert parts["transformer"]["median"] + parts["rest"]["median"] == pytest.approx(
            variant["generate"]["seconds"]["median"]
        )
    runtime = summary["runtime_generate"]  # the torch-free runtime's generate(), fp32 and each variant
    assert list(runtime) == ["fp32", "int8"] and runtime["fp32"]["final_token_match"] < 1.0
    for entry in runtime.values():
        parts = entry["parts"]
        assert entry["seconds"]["n"] == 1 and entry["speedup_vs_torch"] > 0 and entry["peak_rss_mb"]["median"] > 0
        assert parts["transformer"]["median"] + parts["rest"]["median"] == pytest.approx(entry["seconds"]["median"])
    text = (results.with_suffix(".md")).read_text()
    assert "torch-free runtime's generate()" in text
    assert "ORT padded vs torch" in text and cpu["model_name"] in text and " MiB" in text
    assert (data["meta"]["shapes"], data["meta"]["codec_seconds"]) == (["S~200"], [1]) and "1 s codec calls" in text
    assert all(any(row.startswith(f"| {name} |") for row in text.splitlines()) for name in ("fp32", "int8"))
    assert "generate() split" in text and sum(row.startswith("| int8 |") for row in text.splitlines()) == 3


def bench_module():
    """bench/bench_omnivoice.py as a module (bench/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_omnivoice", REPO / "bench" / "bench_omnivoice.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_load_line_flags_only_load_beyond_its_own_workers() -> None:
    """Each bench worker uses every core, so a 1-min load up to the core count is the bench itself
    (the results used to call any load "above the core count, other work shared the CPU")."""
    bench = bench_module()
    assert "no sign of other work" in bench.load_line({"min": 1.7, "max": 2.3}, 2)
    assert "other work shared the CPU" in bench.load_line({"min": 1.7, "max": 2.7}, 2)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--shapes", "S~200,S~999"], "--shapes: unknown value(s) S~999"),
        (["--shapes", "S~200,S~200"], "--shapes: S~200 given more than once"),
        (["--codec-seconds", "5,5"], "--codec-seconds: '5,5' is not a list of distinct whole seconds"),
        (["--codec-seconds", "0.5"], "--codec-seconds: '0.5' is not a list"),
        (["--gemm-seconds", "0"], "argument --gemm-seconds: 0 is out of range"),
    ],
    ids=["unknown-shape", "repeated-shape", "repeated-seconds", "fraction", "gemm-zero"],
)
def test_bench_measurement_flags_refused_before_any_worker(argv: list, message: str, tmp_path: Path, capsys) -> None:
    result = run_inprocess(
        bench_module(), [*argv, "--capture-dir", tmp_path / "none", "--results-dir", tmp_path / "r"], capsys
    )
    assert_one_line(result, EXIT_BAD_INPUT, message)
    assert sorted(tmp_path.iterdir()) == []


# --- 6. --model takes a Hugging Face repo id ----------------------------------------------------


def _hub_cache(root: Path, tiny: Path, repo: str = "k2-fsa/OmniVoice") -> Path:
    """A Hugging Face cache laid out as huggingface_hub writes it, holding `repo` = tiny's files:
    blobs named by hash, snapshots/<revision>/ of symlinks into them, refs/main naming the revision."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    store = root / f"models--{repo.replace('/', '--')}"
    for name in REQUIRED_FILES:
        blob = store / "blobs" / sha256_file(tiny / name)
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tiny / name, blob)
        link = store / "snapshots" / revision / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (store / "refs").mkdir()
    (store / "refs" / "main").write_text(revision)
    return store / "snapshots" / revision


def _hub_env(cache: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def test_hub_repo_id_resolves_from_the_cache_offline(tiny_model: Path, tmp_path: Path) -> None:
    """`--model k2-fsa/OmniVoice` with the repo in the local cache and HF_HUB_OFFLINE=1: resolved to
    its snapshot without network, validated, and fingerprinted as the very files tiny is."""
    snapshot_dir = _hub_cache(tmp_path / "hub", tiny_model)
    probe = (
        "from omnivoice_export.step0_checkpoints.checkpoints import model_fingerprint, resolve_model; "
        "path = resolve_model('k2-fsa/OmniVoice'); print(path); print(model_fingerprint(path))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=_hub_env(tmp_path / "hub"),
    )
    assert done.returncode == 0, done.stderr
    path, fingerprint = done.stdout.split()
    assert Path(path) == snapshot_dir
    assert fingerprint == model_fingerprint(tiny_model)


def test_hub_repo_id_not_cached_offline_names_the_download(tmp_path: Path) -> None:
    """Not cached, HF_HUB_OFFLINE=1: one line naming the exact command that downloads it (exit 2)."""
    (tmp_path / "hub").mkdir()
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "capture_reference.py"),
            "--model",
            "k2-fsa/OmniVoice",
            "--modes",
            "design",
            "--capture-dir",
            str(tmp_path / "capture"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=_hub_env(tmp_path / "hub"),
    )
    assert_one_line(
        Result(done.returncode, done.stdout, done.stderr),
        EXIT_BAD_INPUT,
        "no snapshot of the Hugging Face repo k2-fsa/OmniVoice",
        "HF_HUB_OFFLINE is set",
        "`hf download k2-fsa/OmniVoice`",
    )
    assert not (tmp_path / "capture").exists()


# --- 7. a run shows only what concerns the user -------------------------------------------------

NOISE = (
    "torchvision is not installed",
    "LeafSpec",
    "will not be used, since it shares the same shape constraints",
    "TracerWarning",
    "Constant folding - Only steps=1",
    "invalid value encountered in divide",
    "Couldn't find ffmpeg",
)


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_export_stderr_is_empty(request, exporter: str) -> None:
    """A full export of the three graphs, run as a user runs it, prints nothing on stderr: none of
    the exporters' harmless warnings and log lines (each silenced where it arises:
    exporting.quiet_exporter) and not pydub's "Couldn't find ffmpeg" (omnivoice imports pydub; WAV
    needs no ffmpeg: cli.py). Our own notes and warnings would still show (test_script_errors)."""
    stderr = request.getfixturevalue("pipeline" if exporter == "dynamo" else "legacy_export").export_stderr
    assert not [noise for noise in NOISE if noise in stderr], stderr[:3000]
    assert stderr == "", stderr[:3000]


def test_make_demo_prints_summaries_and_a_second_run_does_nothing(tmp_path: Path) -> None:
    """`make demo` shows each step's summary (per-call check lines go to the log only), and a second
    run with nothing changed runs no step: steps 0-2 are file targets, steps 3-4 sit behind a marker
    touched after them (they rewrite the report, so the report cannot be their target)."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    capture_dir, onnx_dir, calls = tmp_path / "capture", tmp_path / "onnx", tmp_path / "calls"
    fake_python = tmp_path / "python"  # stands in for $(PY): each script writes its target and prints a check line
    fake_python.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        echo "$1" >> {calls}
        mkdir -p {capture_dir} {onnx_dir}
        case "$1" in
          make_reference.py) touch {capture_dir}/ref_voice.wav ;;
          capture_reference.py) touch {capture_dir}/manifest.json ;;
          export_omnivoice.py) touch {onnx_dir}/export-report.json ;;
          *) touch {onnx_dir}/export-report.json ;;
        esac
        echo "[transformer] clone step  0 argmax=1.000000 OK"
        echo "OVERALL: PASS ($1)"
        """)
    )
    fake_python.chmod(0o755)
    argv = [
        "make",
        "-C",
        str(REPO),
        f"PY={fake_python}",
        f"CAPTURE={capture_dir}",
        f"ONNX={onnx_dir}",
        f"MODEL_MARK={tmp_path / 'model-mark'}",
        f"DEMO_LOG={tmp_path / 'demo.log'}",
        "-o",
        ".venv/.installed",
        "demo",
    ]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stdout + first.stderr
    assert calls.read_text().split() == [
        "make_reference.py",
        "capture_reference.py",
        "export_omnivoice.py",
        "parity_check.py",
        "infer_onnx.py",
    ]
    assert "OVERALL: PASS (parity_check.py)" in first.stdout and "[transformer]" not in first.stdout
    assert "[transformer] clone step  0" in (tmp_path / "demo.log").read_text()
    second = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and "up to date" in second.stdout
    assert len(calls.read_text().split()) == 5  # nothing ran again
