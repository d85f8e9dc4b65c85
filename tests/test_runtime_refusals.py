"""Refusals: step 5 run concurrently and killed, requests over the limits, wrong types, non-finite
values, a bundle whose own files are damaged or hand-edited.

Each case ends in one line naming the problem and the fix (a UserError in the API, exit 2 from a
script) or works; nothing is left half-written. "Before any work" is asserted by making the work
itself fail loudly (a transformer or a build that raises): the refusal must come first.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import REPO
from test_script_errors import assert_one_line, run_inprocess, snapshot

import infer_onnx
import quality_omnivoice
import quantize_omnivoice
from omnivoice_export.step2_export import report
from omnivoice_export.step56_variants import quality, quantize, recipes
from omnivoice_onnx import OmniVoiceOnnx, UserError, VoiceClonePrompt, limits, sessions
from omnivoice_onnx.bundle import variant_fix
from omnivoice_onnx.contract import GRAPH_FILES
from omnivoice_onnx.core import generate as gen
from omnivoice_onnx.program import EXIT_BAD_INPUT

TRANSFORMER = quantize.TRANSFORMER_FILE


def quantize_process(onnx_dir: Path, variants: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(REPO / "quantize_omnivoice.py"), "--onnx-dir", str(onnx_dir), "--variants", variants],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_variants_as_reported(onnx_dir: Path, names) -> None:
    """Every variant in `names` is listed, its files match its entry, and no temporary is left."""
    export = report.load_report(onnx_dir)
    assert sorted(export["variants"]) == sorted(names)
    for name in names:
        assert quantize.verify_variant(onnx_dir, export, name) == onnx_dir / name / TRANSFORMER
    assert [p.name for p in onnx_dir.iterdir() if p.name.startswith(".")] == []


# --- step 5: concurrent runs, kill -9, outputs checked first ---------------------------------------


# The report's writers: every recipe that measures nothing on the capture. The ones that calibrate
# (int8's sensitivity, int8-normfold's spike rule) write the same report entry after more CPU, and
# are built on their own by the session export (conftest.variants_export) and test_outliers.
WRITERS = [name for name, recipe in recipes.RECIPES.items() if not (recipe.calibrate or recipe.spikes_fp32)]


@pytest.mark.slow
def test_concurrent_runs_one_recipe_each_keep_every_entry(onnx_copy: Path) -> None:
    """The report's read-modify-write used to lose 1-2 of 10 entries (all runs exit 0); every
    WRITERS recipe (13 today) runs at once."""
    procs = {name: quantize_process(onnx_copy, name) for name in WRITERS}
    for name, proc in procs.items():
        assert proc.wait(timeout=600) == 0, (name, proc.stderr.read()[-2000:])
    assert_variants_as_reported(onnx_copy, WRITERS)


@pytest.mark.slow
def test_concurrent_runs_of_the_same_variants_all_succeed(onnx_copy: Path) -> None:
    """Four runs building the same variants: installing and hashing used to race (FileNotFoundError)."""
    procs = [quantize_process(onnx_copy, "fp32-unmasked,int8-nbits-a0") for _ in range(4)]
    for proc in procs:
        assert proc.wait(timeout=600) == 0, proc.stderr.read()[-2000:]
    assert_variants_as_reported(onnx_copy, ["fp32-unmasked", "int8-nbits-a0"])


@pytest.mark.slow
def test_kill_9_leftovers_are_removed_by_the_next_run(onnx_copy: Path) -> None:
    """A run killed mid-build leaves its staging folder and, for a dynamic recipe on the faithful
    graph (int8-unfused; int8 quantizes a rewritten copy inside its staging folder), the graph-only
    input beside the fp32 sidecar (`.int8-unfused.tmp-<pid>-input.onnx`); the next run removes both."""
    proc = quantize_process(onnx_copy, "int8-unfused")
    deadline = time.monotonic() + 300
    while (
        not list(onnx_copy.glob(".int8-unfused.tmp-*-input.onnx"))
        and proc.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert list(onnx_copy.glob(".int8-unfused.tmp-*-input.onnx")), "the run ended before its input could be seen"
    again = quantize_process(onnx_copy, "int8-unfused")
    assert again.wait(timeout=600) == 0, again.stderr.read()[-2000:]
    assert_variants_as_reported(onnx_copy, ["int8-unfused"])


@pytest.mark.slow
def test_variant_folder_that_is_a_file_refused_before_building(onnx_copy: Path, monkeypatch, capsys) -> None:
    (onnx_copy / "int8").write_text("not a folder")
    monkeypatch.setattr(quantize, "build_variant", lambda *a: pytest.fail("built before checking the outputs"))
    before = snapshot(onnx_copy)
    result = run_inprocess(quantize_omnivoice, ["--onnx-dir", onnx_copy, "--variants", "fp32-unmasked,int8"], capsys)
    assert_one_line(result, EXIT_BAD_INPUT, f"{onnx_copy / 'int8'} exists and is not a directory", "move or remove it")
    assert snapshot(onnx_copy) == before


@pytest.mark.slow
def test_quality_wav_dir_that_is_a_file_refused_before_measuring(pipeline, tmp_path: Path, monkeypatch, capsys) -> None:
    wav_dir = tmp_path / "wavs"
    wav_dir.write_text("a file")
    monkeypatch.setattr(quality, "measure_variant", lambda *a: pytest.fail("measured before checking --wav-dir"))
    result = run_inprocess(
        quality_omnivoice,
        ["--onnx-dir", pipeline.onnx, "--capture-dir", pipeline.capture, "--wav-dir", wav_dir],
        capsys,
    )
    assert_one_line(result, EXIT_BAD_INPUT, f"--wav-dir {wav_dir} exists and is not a directory")


# --- requests: one validation, before any model work ---------------------------------------------


def _refuse_model_work(*args):
    raise AssertionError("model work before the request was refused")


@pytest.fixture(scope="module")
def tts(pipeline):
    """The session export, loaded once (read-only)."""
    return OmniVoiceOnnx.from_dir(pipeline.onnx)


@pytest.fixture
def guarded(tts):
    """`tts` whose graphs fail the test if called: a refusal must come before any model work
    (and so before any array of the request's size is allocated)."""
    real = tts.model
    tts.model = dataclasses.replace(
        real, transformer=_refuse_model_work, encode=_refuse_model_work, decode=_refuse_model_work
    )
    yield tts
    tts.model = real


def one_line(call) -> UserError:
    with pytest.raises(UserError) as raised:
        call()
    assert "\n" not in str(raised.value) and raised.value.fix, str(raised.value)
    return raised.value


def _prompt(tokens) -> VoiceClonePrompt:
    return VoiceClonePrompt(ref_audio_tokens=tokens, ref_text="A reference.", ref_rms=0.05)


SPEECH = (0.3 * np.sin(np.linspace(0, 3000, 24000 * 3))).astype(np.float32)

BAD_REQUESTS = {  # case -> (generate kwargs, words of the one line)
    # wrong types (numpy scalars are numbers; bool is not)
    "language-int": ({"language": 5}, "language must be a string or None, got int"),
    "instruct-dict": ({"instruct": {"a": 1}}, "instruct must be a string or None, got dict"),
    "prompt-str": ({"voice_clone_prompt": "x"}, "voice_clone_prompt must be a VoiceClonePrompt, got str"),
    "speed-str": ({"speed": "fast"}, "speed must be a number, got str"),
    "duration-str": ({"duration": "5"}, "duration must be a number, got str"),
    "duration-bool": ({"duration": True}, "duration must be a number, got bool"),
    "config-str": ({"generation_config": "num_step=4"}, "generation_config must be a dict"),
    "config-bool-number": ({"generation_config": {"num_step": True}}, "num_step must be a number, got bool"),
    "trace-int": ({"trace": 5}, "trace must be a Trace or None"),
    "ref-audio-int": ({"ref_audio": 5, "ref_text": "x"}, "ref_audio must be a file path or a (waveform, sample_rate)"),
    "ref-text-int": ({"ref_audio": (SPEECH, 24000), "ref_text": 5}, "ref_text must be a string"),
    "text-int": ({"text": 5}, "text must be a string or a non-empty list"),
    "text-list-none": ({"text": ["Hi.", None]}, "text 1 is NoneType, not str"),
    "seed-float": ({"seed": 1.5}, "seed must be an integer"),
    "seed-bool": ({"seed": True}, "seed must be an integer, got bool"),
    # values that pass a type check but break the float32 arithmetic or mean nothing
    "duration-nan": ({"duration": float("nan")}, "duration must be finite"),
    "duration-inf": ({"duration": float("inf")}, "duration must be finite"),
    "duration-0": ({"duration": 0}, "duration 0 is out of range (0,"),
    "duration-negative": ({"duration": -5}, "duration -5 is out of range"),
    "speed-nan": ({"speed": float("nan")}, "speed must be finite"),
    "speed-inf": ({"speed": float("inf")}, "speed must be finite"),
    "speed-0": ({"speed": 0}, "speed 0 is out of range"),
    "speed-tiny": ({"speed": 1e-6}, "speed 1e-06 is out of range"),
    "config-nan": ({"generation_config": {"guidance_scale": float("nan")}}, "guidance_scale must be finite"),
    "position-temperature-tiny": ({"generation_config": {"position_temperature": 1e-50}}, "too small for float32"),
    "class-temperature-tiny": ({"generation_config": {"class_temperature": 1e-30}}, "too small for float32"),
    "t-shift-huge": ({"generation_config": {"t_shift": 1e39}}, "time-step schedule that is not finite"),
    "guidance-huge": ({"generation_config": {"guidance_scale": 1e30}}, "guidance_scale 1e+30 is out of range"),
    "chunk-duration-0": ({"generation_config": {"audio_chunk_duration": 0}}, "audio_chunk_duration 0 is out of range"),
    # nonsense accepted before
    "zero-width-text": ({"text": "\u200b\u200c\u2060"}, "holds nothing to speak"),
    "ref-text-empty": ({"ref_audio": (SPEECH, 24000), "ref_text": ""}, "ref_text is empty"),
    "ref-silent-short": ({"ref_audio": (np.zeros(2400, np.float32), 24000), "ref_text": "x"}, "is silent"),
    "ref-too-short": (
        {"ref_audio": (SPEECH[:4800], 24000), "ref_text": "x", "generation_config": {"preprocess_prompt": False}},
        "0.20 s long after preparation, under 0.5 s",
    ),
    "prompt-list-with-none": (
        {"text": ["One.", "Two."], "voice_clone_prompt": [None, "p"]},
        "voice_clone_prompt[0] must be a VoiceClonePrompt, got NoneType",
    ),
    "prompt-out-of-codebook": (
        {"voice_clone_prompt": _prompt(np.full((8, 30), 5000, np.int64))},
        "codes outside the codebook [0, 1024)",
    ),
    "prompt-wrong-shape": ({"voice_clone_prompt": _prompt(np.zeros((30,), np.int64))}, "integer array [codebooks"),
    "prompt-float-tokens": ({"voice_clone_prompt": _prompt(np.zeros((8, 30), np.float32))}, "integer array"),
    # over a limit (each names the limit and the variable that raises it)
    "duration-over": ({"duration": 1e6}, "over MAX_DURATION_S=600"),
    "pad-over": ({"generation_config": {"pad_duration": 1e9}}, "over MAX_PAD_SECONDS=60"),
    "num-step-over": ({"generation_config": {"num_step": 10**7}}, "over MAX_NUM_STEP=256"),
    "text-over": ({"text": "a" * 20_001}, "has 20001 characters (over MAX_TEXT_CHARS=20000)"),
    "texts-over": ({"text": ["Hi."] * 65}, "65 texts in one call (over MAX_TEXTS=64)"),
    "words-without-punctuation": ({"text": "word " * 1500}, "without punctuation (. , ; : ! ?) cannot be split"),
    "estimate-over": ({"text": "word " * 4000}, "would be 1191 s of audio"),
    "short-text-long-duration": ({"duration": 590.0}, "over MAX_SEQUENCE=4096"),
    "ref-5-minutes": (
        {"ref_audio": (np.tile(SPEECH, 100), 24000), "ref_text": "x"},
        "300.0 s long (7200000 samples at 24000 Hz) (over MAX_REF_SECONDS=60)",
    ),
    "ref-at-1-hz": ({"ref_audio": (SPEECH, 1), "ref_text": "x"}, "72000.0 s long"),
    "ref-odd-rate": ({"ref_audio": (SPEECH, 24001), "ref_text": "x"}, "resample the reference to a common rate"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_request_refused_before_model_work(case: str, guarded) -> None:
    kwargs, words = BAD_REQUESTS[case]
    kwargs = {"text": "Hello there.", "seed": 1, **kwargs}
    if case == "prompt-list-with-none":
        kwargs["voice_clone_prompt"] = [None, _prompt(np.zeros((8, 30), np.int64))]
    error = one_line(lambda: guarded.generate(**kwargs))
    assert words in str(error), str(error)
    if "over MAX_" in words:
        assert f"raise it with the environment variable OMNIVOICE_{words.split('over ')[1].split('=')[0]}" in str(error)
    if case != "trace-int":  # validate() takes generate()'s request, not its trace
        assert words in str(one_line(lambda: guarded.validate(**kwargs)))


@pytest.mark.slow
def test_stream_goes_through_the_same_validation(guarded) -> None:
    for kwargs, words in (BAD_REQUESTS["duration-nan"], BAD_REQUESTS["config-str"], BAD_REQUESTS["zero-width-text"]):
        kwargs = {"text": "Hello there.", **kwargs}
        assert words in str(one_line(lambda: list(guarded.stream(**kwargs))))


@pytest.mark.slow
def test_too_many_attention_cells_refused(guarded, monkeypatch) -> None:
    monkeypatch.setenv("OMNIVOICE_MAX_ATTENTION_CELLS", "1000")
    error = one_line(lambda: guarded.generate(["Hello there.", "And you."], seed=1))
    assert "texts of up to" in str(error) and "pass fewer texts per call" in error.fix


@pytest.mark.slow
def test_limits_are_raised_and_checked_through_the_environment(guarded, tts, monkeypatch) -> None:
    monkeypatch.setenv("OMNIVOICE_MAX_TEXT_CHARS", "5")
    assert "over MAX_TEXT_CHARS=5" in str(one_line(lambda: guarded.validate("Hello there.")))
    monkeypatch.setenv("OMNIVOICE_MAX_TEXT_CHARS", "lots")
    assert "OMNIVOICE_MAX_TEXT_CHARS='lots' is not a positive number" in str(
        one_line(lambda: guarded.validate("Hello there."))
    )
    monkeypatch.setenv("OMNIVOICE_MAX_TEXT_CHARS", "30000")
    monkeypatch.setenv("OMNIVOICE_MAX_DURATION_S", "2000")
    assert guarded.validate("Hello there. " * 1900).target_lens[0] > 600 * 25


@pytest.mark.slow
def test_numpy_scalars_are_numbers(guarded) -> None:
    plain = guarded.validate("Hello there.", duration=2, speed=None, seed=3, generation_config={"num_step": 8})
    for kind in (np.float32, np.float64, np.int64):
        request = guarded.validate(
            "Hello there.",
            duration=kind(2),
            seed=np.int64(3),
            generation_config={"num_step": np.int64(8), "t_shift": np.float32(0.1)},
        )
        assert request.target_lens == plain.target_lens == [50]
        assert request.config.num_step == 8 and type(request.config.num_step) is int
    assert guarded.validate("Hello there.", speed=np.float32(1.5)).speed == [1.5]


@pytest.mark.slow
def test_validate_loads_the_reference_without_encoding_it(guarded, pipeline) -> None:
    ref = str(pipeline.capture / "ref_voice.wav")
    request = guarded.validate(["One.", "Two."], ref_audio=ref, ref_text="A reference.")
    (reference,) = {id(r): r for r in request.references}.values()  # one reference, shared
    assert reference.frames == reference.wav.shape[-1] // guarded.model.hop_length > 0
    assert request.calls == [(4, request.calls[0][1])]


@pytest.mark.slow
def test_tiny_temperatures_leak_no_numpy_warning(tts) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        audio = tts.generate(
            "Hello there.",
            seed=3,
            generation_config={
                "num_step": 4,
                "position_temperature": limits.MIN_TEMPERATURE,
                "class_temperature": 1e-6,
            },
        )[0]
    assert np.isfinite(audio).all() and audio.size


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs,words",
    [
        ({"threads": "2"}, "threads must be a number, got str"),
        ({"threads": -1}, "threads -1 is out of range"),
        ({"threads": 2.5}, "threads must be a whole number"),
        ({"threads": 100_000}, "over MAX_THREADS=256"),
        ({"variant": 8}, "variant must be a variant's name"),
        ({"variant": "../int8"}, "variant must be a variant's name"),
        ({"verify": "no"}, "verify must be True or False"),
        ({"resident_codecs": "yes"}, "resident_codecs must be True"),
        ({"provider": 5}, "provider must be a string"),
    ],
)
def test_from_dir_arguments_checked(kwargs: dict, words: str, pipeline) -> None:
    assert words in str(one_line(lambda: OmniVoiceOnnx.from_dir(pipeline.onnx, **kwargs)))


@pytest.mark.slow
def test_ort_threads_env_over_the_limit_refused(pipeline, monkeypatch) -> None:
    monkeypatch.setenv("OMNIVOICE_ORT_THREADS", "100000")
    assert "over MAX_THREADS=256" in str(one_line(lambda: OmniVoiceOnnx.from_dir(pipeline.onnx)))


# --- memory errors: one line, exit 2 ------------------------------------------------------------


class _AllocatingSession:
    """A session whose run fails as onnxruntime's arena does when an allocation is refused."""

    def get_outputs(self):
        return [SimpleNamespace(name="logits")]

    def run(self, names, feeds):
        raise RuntimeError(
            "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running "
            "MatMul node. Name:'m' Status Message: Failed to allocate memory for requested buffer of "
            "size 93458821120"
        )


def test_onnxruntime_allocation_failure_is_a_memory_error() -> None:
    with pytest.raises(MemoryError, match=r"could not allocate memory for input_ids\[2, 8, 9\]"):
        sessions.run(_AllocatingSession(), {"input_ids": np.zeros((2, 8, 9), np.int64)})


@pytest.mark.slow
def test_memory_error_is_one_user_error_in_the_api_and_exit_2_in_the_cli(
    pipeline, tmp_path, monkeypatch, capsys
) -> None:
    def out_of_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 1.19 PiB for an array with shape (2, 8, 300000000, 1025)")

    monkeypatch.setattr(gen, "generate_iterative", out_of_memory)
    tts = OmniVoiceOnnx.from_dir(pipeline.onnx, verify=False)
    error = one_line(lambda: tts.generate("Hello there.", seed=1))
    assert "out of memory (Unable to allocate 1.19 PiB" in str(error) and "OMNIVOICE_MAX_SEQUENCE" in error.fix
    result = run_inprocess(
        infer_onnx,
        ["--onnx-dir", pipeline.onnx, "--text", "Hello there.", "--out", tmp_path / "out.wav", "--num-step", "2"],
        capsys,
    )
    assert_one_line(result, EXIT_BAD_INPUT, "out of memory")
    assert not (tmp_path / "out.wav").exists()


# --- the bundle's own files ----------------------------------------------------------------------

VARIANTS = ("fp32-fused", "fp32-unmasked", "int8")


@pytest.fixture(scope="module")
def bundle(pipeline, tmp_path_factory) -> Path:
    """A copy of the session export with the variants VARIANTS (read-only: tests copy it)."""
    onnx_dir = tmp_path_factory.mktemp("bundle") / "onnx"
    shutil.copytree(pipeline.onnx, onnx_dir)
    quantize_omnivoice.main(["--onnx-dir", str(onnx_dir), "--variants", ",".join(VARIANTS)])
    return onnx_dir


def _copy(bundle: Path, tmp_path: Path) -> Path:
    shutil.copytree(bundle, tmp_path / "onnx")
    return tmp_path / "onnx"


def _zero(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


EXPORT_FILES = [
    GRAPH_FILES["transformer"] + ".data",
    GRAPH_FILES["encoder"] + ".data",
    GRAPH_FILES["decoder"] + ".data",
    GRAPH_FILES["decoder"],
    "tokenizer.json",
    "runtime-config.json",
]


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_zeroed_weights_of_every_variant_refused_naming_step_5(variant: str, bundle: Path, tmp_path: Path) -> None:
    onnx_dir = _copy(bundle, tmp_path)
    _zero(onnx_dir / variant / (GRAPH_FILES["transformer"] + ".data"))
    error = one_line(lambda: OmniVoiceOnnx.from_dir(onnx_dir, variant=variant))
    assert f"{variant}/omnivoice_transformer.onnx.data does not match the sha256" in str(error)
    assert error.fix == variant_fix(variant) and "omnivoice-onnx download" in error.fix  # a pip user's way too
    if variant == "fp32-fused":  # the default: infer_onnx.py --text takes it unnamed
        assert "does not match the sha256" in str(one_line(lambda: OmniVoiceOnnx.from_dir(onnx_dir)))


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPORT_FILES)
def test_zeroed_export_file_refused_naming_step_2(name: str, bundle: Path, tmp_path: Path) -> None:
    onnx_dir = _copy(bundle, tmp_path)
    _zero(onnx_dir / name)
    error = one_line(lambda: OmniVoiceOnnx.from_dir(onnx_dir, variant="fp32"))
    assert f"{name} does not match the sha256" in str(error) and "export_omnivoice.py" in error.fix


@pytest.mark.slow
def test_infer_text_refuses_a_zeroed_default_variant(bundle: Path, tmp_path: Path, capsys) -> None:
    onnx_dir = _copy(bundle, tmp_path)
    _zero(onnx_dir / "fp32-fused" / (GRAPH_FILES["transformer"] + ".data"))
    result = run_inprocess(
        infer_onnx,
        ["--onnx-dir", onnx_dir, "--text", "Hello there.", "--out", tmp_path / "out.wav", "--num-step", "2"],
        capsys,
    )
    assert_one_line(
        result,
        EXIT_BAD_INPUT,
        "fp32-fused/omnivoice_transformer.onnx.data does not match the sha256",
        "run quantize_omnivoice.py --variants fp32-fused",
    )
    assert not (tmp_path / "out.wav").exists()


@pytest.mark.slow
def test_bundle_without_report_needs_verify_false(bundle: Path, tmp_path: Path, monkeypatch) -> None:
    onnx_dir = _copy(bundle, tmp_path)
    (onnx_dir / "export-report.json").unlink()
    error = one_line(lambda: OmniVoiceOnnx.from_dir(onnx_dir))
    assert "export report not found" in str(error) and "verify=False" in error.fix and "OMNIVOICE_VERIFY=0" in error.fix
    assert OmniVoiceOnnx.from_dir(onnx_dir, verify=False).variant == "fp32"
    monkeypatch.setenv("OMNIVOICE_VERIFY", "0")
    assert OmniVoiceOnnx.from_dir(onnx_dir, variant="int8").variant == "int8"


def _set_metadata(path: Path, **values) -> None:
    import onnx

    graph = onnx.load(str(path), load_external_data=False)
    for prop in graph.metadata_props:
        if prop.key in values:
            prop.value = str(values[prop.key])
    onnx.save(graph, str(path))


@pytest.mark.slow
def test_variant_of_another_model_blames_the_variant(bundle: Path, tmp_path: Path) -> None:
    onnx_dir = _copy(bundle, tmp_path)
    _set_metadata(onnx_dir / "int8" / GRAPH_FILES["transformer"], model_fingerprint="0" * 64)
    error = one_line(lambda: OmniVoiceOnnx.from_dir(onnx_dir, variant="int8", verify=False))
    assert "int8/omnivoice_transformer.onnx was made from another export" in str(error)
    assert error.fix == variant_fix("int8") and "higgs_encoder" not in str(error)


@pytest.mark.slow
@pytest.mark.parametrize(
    "values,words",
    [
        ({"sample_rate": 0}, "sample_rate=0 (must be > 0)"),
        ({"hop_length": 0}, "hop_length=0 (must be > 0)"),
        ({"frame_rate": 0}, "frame_rate=0 (must be > 0)"),
        ({"audio_mask_id": 5000}, "audio_mask_id=5000 is not"),
        ({"frame_rate": 24}, "sample_rate=24000 is not hop_length x frame_rate"),
        ({"sample_rate": "fast"}, "non-integer metadata"),
    ],
)
def test_impossible_graph_metadata_refused(values: dict, words: str, bundle: Path, tmp_path: Path) -> None:
    onnx_dir = _copy(bundle, tmp_path)
    _set_metadata(onnx_dir / GRAPH_FILES["decoder"], **values)
    assert "higgs_decoder.onnx does not match the sha256" in str(one_line(lambda: OmniVoiceOnnx.from_dir(onnx_dir)))
    error = one_line(lambda: OmniVoiceOnnx.from_dir(onnx_dir, verify=False))
    assert "higgs_decoder.onnx" in str(error) and words in str(error) and "export_omnivoice.py" in error.fix


def _edit_config(section: str, key: str, value):
    def edit(config: dict) -> None:
        config[section][key] = value

    return edit


@pytest.mark.slow
@pytest.mark.parametrize(
    "edit,words",
    [
        (_edit_config("instruct", "zh_pattern", "[\u4e00-"), "instruct.zh_pattern"),
        (_edit_config("languages", "ids", [5, "en"]), "languages.ids is missing or not a list of strings"),
        (_edit_config("languages", "name_to_id", {"english": "xx"}), "maps 'english' to 'xx', which is not in"),
        (_edit_config("instruct", "valid", ["male", 3]), "instruct.valid is missing or not a list of strings"),
        (
            _edit_config("instruct", "mutually_exclusive", ["male"]),
            "instruct.mutually_exclusive is missing or not a list of lists of strings",
        ),
        (_edit_config("model", "audio_vocab_size", 0), "model.audio_vocab_size is missing or not a positive integer"),
        (_edit_config("generation", "num_step", "32"), "its generation defaults are wrong (generation_config.num_step"),
        (_edit_config("generation", "t_shift", 1e39), "its generation defaults are wrong"),
    ],
    ids=[
        "regex",
        "ids-types",
        "id-out-of-range",
        "instruct-types",
        "exclusive-shape",
        "vocab-0",
        "num-step-str",
        "t-shift-huge",
    ],
)
def test_bad_runtime_config_values_refused(edit, words: str, bundle: Path, tmp_path: Path) -> None:
    onnx_dir = _copy(bundle, tmp_path)
    path = onnx_dir / "runtime-config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))
    error = one_line(lambda: OmniVoiceOnnx.from_dir(onnx_dir, verify=False))
    assert "runtime-config.json" in str(error) and words in str(error) and "export_omnivoice.py" in error.fix
