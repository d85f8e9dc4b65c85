"""The scripts' side of the runtime: it loads a transformer variant by name, infer_onnx.py --text
synthesises through it with torch, transformers, omnivoice and pydub blocked from import, and
bench/bench_runtime.py measures it against upstream on tiny.

Compare mode's runtime entry (end_to_end.<provider>.runtime) is checked in test_infer.py and
test_quantize.py, beside the compare-mode results it sits with.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile
from conftest import REPO, Pipeline, assert_hardware_recorded, import_blocker, single_stderr_line

import infer_onnx
from omnivoice_export.step1_capture.generation import DEFAULT_SEED, LANGUAGE
from omnivoice_export.step56_variants import quantize
from omnivoice_onnx import OmniVoiceOnnx, UserError
from omnivoice_onnx.audio_formats import to_pcm16
from omnivoice_onnx.bundle import Bundle
from omnivoice_onnx.contract import (
    FP32_VARIANT,
    GRAPH_FILES,
    codec_paths,
    variant_dir,
    variant_path,
    variants_present,
)
from omnivoice_onnx.program import EXIT_BAD_INPUT, run_main

BLOCKED = ("torch", "torchaudio", "transformers", "omnivoice", "pydub")
# Runs infer_onnx.py as `python infer_onnx.py ARGS` would, with BLOCKED unimportable; prints which
# of them got imported anyway (none can: the blocker raises) as its last line.
BLOCKED_INFER = import_blocker(BLOCKED) + textwrap.dedent(f"""
    import runpy
    sys.argv = ["infer_onnx.py", *sys.argv[1:]]
    try:
        runpy.run_path("infer_onnx.py", run_name="__main__")
    finally:
        print("imported:", sorted({{m.split(".")[0] for m in sys.modules}} & set({BLOCKED!r})))
""")


def infer_blocked(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCKED_INFER, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=600
    )


# --- the variant path rule ----------------------------------------------------------------------


def test_variant_path_rule_is_the_runtimes(tmp_path: Path) -> None:
    """One definition: quantize.py builds variants where the runtime looks for them."""
    assert quantize.variant_path is variant_path and quantize.variant_dir is variant_dir
    transformer = GRAPH_FILES["transformer"]
    assert variant_path(tmp_path, FP32_VARIANT) == tmp_path / transformer
    assert variant_path(tmp_path, "int8") == tmp_path / "int8" / transformer
    assert variants_present(tmp_path) == []
    for folder in ("int8", "int4-b32", "empty"):
        (tmp_path / folder).mkdir()
    for name in (tmp_path / transformer, tmp_path / "int8" / transformer, tmp_path / "int4-b32" / transformer):
        name.write_bytes(b"")
    assert variants_present(tmp_path) == [FP32_VARIANT, "int4-b32", "int8"]


def test_a_variant_uses_its_own_codec_graphs_where_it_carries_them(tmp_path: Path) -> None:
    """fp16 carries float16 codec graphs in its folder; int8 has none and takes the export's."""
    from omnivoice_onnx.sessions import CodecSessions

    for folder in ("fp16", "int8"):
        (tmp_path / folder).mkdir()
    for graph in ("encoder", "decoder"):
        (tmp_path / "fp16" / GRAPH_FILES[graph]).write_bytes(b"")
        assert variant_path(tmp_path, "fp16", graph) == tmp_path / "fp16" / GRAPH_FILES[graph]
        assert (
            variant_path(tmp_path, "int8", graph)
            == variant_path(tmp_path, FP32_VARIANT, graph)
            == tmp_path / GRAPH_FILES[graph]
        )
    assert CodecSessions(codec_paths(tmp_path, "fp16"), "cpu", 1, resident=False).paths == {
        graph: tmp_path / "fp16" / GRAPH_FILES[graph] for graph in ("encoder", "decoder")
    }


@pytest.mark.slow
def test_default_ignores_a_fused_folder_the_report_does_not_list(variants_export: Path, tmp_path: Path) -> None:
    """A re-export writes a new report without variants and leaves onnx/fp32-fused/ from the last
    export behind: the runtime must not take that graph by default (it may be another export's)."""
    onnx = tmp_path / "onnx"
    shutil.copytree(variants_export, onnx)
    assert Bundle.open(onnx, verify=False).variant == "fp32-fused"
    report_file = onnx / "export-report.json"
    report = json.loads(report_file.read_text())
    del report["variants"]
    report_file.write_text(json.dumps(report))
    assert Bundle.open(onnx, verify=False).variant == FP32_VARIANT
    report_file.unlink()
    assert Bundle.open(onnx, verify=False).variant == FP32_VARIANT


def _tokens(tts: OmniVoiceOnnx, **kwargs) -> np.ndarray:
    from omnivoice_onnx import Trace

    trace = Trace()
    tts.generate(
        "Hello there, how are you?",
        language="English",
        seed=11,
        generation_config={"num_step": 8},
        trace=trace,
        **kwargs,
    )
    return trace.results[0]


@pytest.mark.slow
def test_runtime_loads_a_variant_by_name(pipeline: Pipeline, variants_export: Path) -> None:
    """from_dir(variant=NAME) runs onnx/NAME/'s transformer with the export's fp32 codecs; the
    unmasked fp32 graph gives the faithful graph's tokens exactly (every runtime call is split,
    so every mask is all True); int8 is another graph (its tokens are measured, not judged).
    No name: fp32-fused where the export holds it (the same tokens), else the faithful graph."""
    fp32 = OmniVoiceOnnx.from_dir(variants_export, variant=FP32_VARIANT)
    assert fp32.variant == FP32_VARIANT and "variant" not in fp32.metadata
    default = OmniVoiceOnnx.from_dir(variants_export)
    assert default.variant == default.metadata["variant"] == "fp32-fused"
    assert Bundle.open(pipeline.onnx, verify=False).variant == FP32_VARIANT  # step 5 not run there
    # the fused kernel is measured on CPU only
    assert Bundle.open(variants_export, verify=False, provider="cuda-fp32").variant == FP32_VARIANT
    assert fp32.codecs.paths["encoder"] == variants_export / GRAPH_FILES["encoder"]
    unmasked = OmniVoiceOnnx.from_dir(variants_export, variant="fp32-unmasked")
    int8 = OmniVoiceOnnx.from_dir(variants_export, variant="int8")
    assert unmasked.metadata["variant"] == "fp32-unmasked" and int8.metadata["variant"] == "int8"
    assert int8.codecs.paths == fp32.codecs.paths  # the variant folder holds the transformer only
    assert (
        unmasked.metadata["model_fingerprint"]
        == int8.metadata["model_fingerprint"]
        == fp32.metadata["model_fingerprint"]
    )
    reference = _tokens(fp32)
    assert np.array_equal(_tokens(unmasked), reference)
    assert np.array_equal(_tokens(default), reference)
    assert _tokens(int8).shape == reference.shape


@pytest.mark.slow
def test_missing_or_mislabelled_variant_is_one_error(variants_export: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError) as missing:
        OmniVoiceOnnx.from_dir(variants_export, variant="int4-b32")
    assert str(missing.value) == (
        f"the export in {variants_export} has no transformer variant 'int4-b32' (present: "
        "fp32, fp32-fused, fp32-unmasked, int8); download a bundle that holds variant int4-b32 (omnivoice-onnx "
        "download), or, in the export toolchain's checkout, run quantize_omnivoice.py --variants int4-b32"
    )
    # A folder holding another variant's graph under a new name: its metadata names the real one.
    onnx = tmp_path / "onnx"
    shutil.copytree(variants_export, onnx)
    shutil.copytree(onnx / "int8", onnx / "int8-plain")
    # Unverified (verify=False: a bundle without a report), so that the metadata check speaks; with
    # the report, the folder is refused first as a variant the report does not list.
    with pytest.raises(UserError, match="does not list variant 'int8-plain'"):
        OmniVoiceOnnx.from_dir(onnx, variant="int8-plain")
    with pytest.raises(
        UserError,
        match=r"int8-plain/omnivoice_transformer.onnx is variant 'int8', not 'int8-plain'; "
        r"download a bundle that holds variant int8-plain .*run quantize_omnivoice.py --variants int8-plain",
    ):
        OmniVoiceOnnx.from_dir(onnx, variant="int8-plain", verify=False)
    # The export's own graph where a variant should be: it names no variant.
    shutil.copyfile(onnx / GRAPH_FILES["transformer"], onnx / "int8" / GRAPH_FILES["transformer"])
    shutil.copyfile(
        onnx / (GRAPH_FILES["transformer"] + ".data"), onnx / "int8" / (GRAPH_FILES["transformer"] + ".data")
    )
    with pytest.raises(UserError, match="int8/omnivoice_transformer.onnx does not match the sha256"):
        OmniVoiceOnnx.from_dir(onnx, variant="int8")
    with pytest.raises(UserError, match="is variant 'fp32', not 'int8'"):
        OmniVoiceOnnx.from_dir(onnx, variant="int8", verify=False)


# --- infer_onnx.py --text through the runtime ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["clone", "design"])
def test_infer_text_synthesises_without_torch(mode: str, pipeline: Pipeline, tmp_path: Path) -> None:
    """Synthesis with torch, transformers, omnivoice and pydub unimportable writes the WAV that
    OmniVoiceOnnx.generate gives for the same request and seed, sample for sample."""
    out = tmp_path / "out.wav"
    ref_text = (pipeline.capture / "ref_voice.txt").read_text().strip()
    flags = (
        ["--ref-audio", pipeline.capture / "ref_voice.wav", "--ref-text", ref_text]
        if mode == "clone"
        else ["--instruct", "female, low pitch", "--language", "None"]
    )
    done = infer_blocked(
        "--onnx-dir",
        pipeline.onnx,
        "--text",
        "Hello there, this is a test.",
        "--out",
        out,
        "--num-step",
        "4",
        "--seed",
        "5",
        *flags,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "imported: []"
    assert f"[synthesis] {mode}:" in done.stdout and "no PyTorch" in done.stdout
    written, rate = soundfile.read(out, dtype="int16")  # 16-bit PCM: the one audio writer (audio_out)
    tts = OmniVoiceOnnx.from_dir(pipeline.onnx)
    request = (
        {"ref_audio": str(pipeline.capture / "ref_voice.wav"), "ref_text": ref_text, "language": LANGUAGE}
        if mode == "clone"
        else {"instruct": "female, low pitch", "language": None}
    )
    (expected,) = tts.generate("Hello there, this is a test.", seed=5, generation_config={"num_step": 4}, **request)
    assert rate == tts.sample_rate
    assert np.array_equal(written, to_pcm16(expected))


@pytest.mark.slow
def test_infer_text_default_seed_and_variant(pipeline: Pipeline, variants_export: Path, tmp_path: Path) -> None:
    """No --seed: the documented default seed; --variant: that transformer, in the same process."""
    for variant in (None, "int8"):
        out = tmp_path / f"{variant}.wav"
        infer_onnx.main(
            [
                "--onnx-dir",
                str(variants_export),
                "--text",
                "Good morning.",
                "--out",
                str(out),
                "--num-step",
                "4",
                *(["--variant", variant] if variant else []),
            ]
        )
        tts = OmniVoiceOnnx.from_dir(variants_export, variant=variant)
        (expected,) = tts.generate(
            "Good morning.", language=LANGUAGE, seed=DEFAULT_SEED, generation_config={"num_step": 4}
        )
        assert np.array_equal(soundfile.read(out, dtype="int16")[0], to_pcm16(expected))


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags,message",
    [
        (["--variant", "int4-b32"], "has no transformer variant 'int4-b32' (present: fp32)"),
        (["--model", "tiny"], "--model only apply to compare mode"),
        (["--no-split"], "--no-split only apply to compare mode"),
        (["--language", "Klingon"], "unknown language 'Klingon'"),
        (["--instruct", "mal, low pitch"], "did you mean 'male'?"),
    ],
)
def test_infer_text_refusals_are_one_line(flags: list[str], message: str, pipeline: Pipeline, tmp_path: Path) -> None:
    """The runtime's UserErrors reach the CLI as its one line and exit 2, torch still blocked."""
    done = infer_blocked("--onnx-dir", pipeline.onnx, "--text", "Hello.", "--out", tmp_path / "out.wav", *flags)
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    line = single_stderr_line(done)
    assert line.startswith("error: ") and message in line
    assert not (tmp_path / "out.wav").exists()


def test_infer_help_says_no_torch(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        run_main(infer_onnx.main, ["--help"])
    assert exit_.value.code == 0
    assert "no torch, transformers, omnivoice or" in " ".join(capsys.readouterr().out.split())


# --- bench/bench_runtime.py ----------------------------------------------------------------------


@pytest.mark.slow
def test_bench_runtime_on_tiny(pipeline: Pipeline, tmp_path: Path) -> None:
    """One round, two steps: fresh processes, equal tokens, every figure recorded with the CPU and
    the load average."""
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_runtime.py"),
            "--model",
            str(pipeline.model),
            "--onnx-dir",
            str(pipeline.onnx),
            "--capture-dir",
            str(pipeline.capture),
            "--repeats",
            "1",
            "--num-step",
            "2",
            "--results-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = tmp_path.glob("*-runtime.json")
    data = json.loads(result.read_text())
    summary, meta = data["summary"], data["meta"]
    assert summary["tokens_equal"] is True
    for side in ("runtime", "upstream"):
        for figure in ("import_s", "cold_start_s", "generate_s", "peak_rss_mib"):
            assert summary[side][figure]["n"] == 1 and summary[side][figure]["median"] > 0
        assert summary[side]["cold_start_s"]["median"] > summary[side]["import_s"]["median"]
    assert meta["cpu"]["model_name"] and len(meta["load_average"]["start"]) == 3
    assert_hardware_recorded(meta, result)
    assert meta["request"]["mode"] == "clone" and meta["request"]["num_step"] == 2
    text = result.with_suffix(".md").read_text()
    assert meta["cpu"]["model_name"] in text and "Load average" in text and "Final tokens equal: **yes**" in text


# --- bench/bench_load.py ---------------------------------------------------------------------------


@pytest.mark.slow
def test_bench_load_on_tiny(pipeline: Pipeline, tmp_path: Path) -> None:
    """One round: each mode in a fresh process; the recorded loads were vouched for (the record
    written by the priming load), the CPU named."""
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_load.py"),
            "--onnx-dir",
            str(pipeline.onnx),
            "--variants",
            "fp32",
            "--repeats",
            "1",
            "--results-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = tmp_path.glob("*-load.json")
    data = json.loads(result.read_text())
    entry = data["summary"]["fp32"]
    assert entry["files"] >= 6  # every one of them in the primed record, or the bench exits 2
    for mode in ("hashed", "recorded"):
        assert entry[mode]["from_dir_s"]["n"] == 1
        assert entry[mode]["ready_s"]["median"] > entry[mode]["from_dir_s"]["median"] > 0
    assert entry["files_mib"] > 1
    assert_hardware_recorded(data["meta"], result)
    assert data["meta"]["cpu"]["model_name"] in result.with_suffix(".md").read_text()


# --- bench/bench_server.py --engines ------------------------------------------------------------


@pytest.mark.slow
def test_bench_server_engines_table_on_tiny(pipeline: Pipeline, tmp_path: Path) -> None:
    """The workers x threads table: one real server per shape, started and stopped in turn, every
    request answered, each row with requests/s, audio seconds per wall second and p50/p95, and the
    hardware named. A batch engine (ray:) is refused with one line."""
    bench = [
        sys.executable,
        str(REPO / "bench" / "bench_server.py"),
        "--onnx-dir",
        str(pipeline.onnx),
        "--model",
        "tiny",
        "--levels",
        "1,2",
        "--per-client",
        "1",
        "--num-step",
        "2",
        "--out-dir",
        str(tmp_path),
    ]
    done = subprocess.run([*bench, "--engines", "1x1,2x1"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = tmp_path.glob("*-server-engines.json")
    data = json.loads(result.read_text())
    rows = [
        (engine["workers"], engine["threads"], row["clients"], row["requests"], row["errors"])
        for engine in data["engines"]
        for row in engine["levels"]
    ]
    assert rows == [(1, 1, 1, 1, 0), (1, 1, 2, 2, 0), (2, 1, 1, 1, 0), (2, 1, 2, 2, 0)]
    assert all(engine["exit_code"] == 0 for engine in data["engines"])
    assert all(
        row["audio_s_per_wall_s"] > 0 and row["latency_p95_s"] >= row["latency_p50_s"] > 0
        for engine in data["engines"]
        for row in engine["levels"]
    )
    assert_hardware_recorded(data["meta"], result)
    assert "| 2 x 1 | 2 | 2 | 0 |" in result.with_suffix(".md").read_text()
    refused = subprocess.run(
        [*bench, "--engines", "ray:2x1"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert refused.returncode == 2 and "is a batch engine" in single_stderr_line(refused)
