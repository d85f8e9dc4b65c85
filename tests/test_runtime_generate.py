"""omnivoice_onnx's generate() against upstream PyTorch generate() on the tiny checkpoint.

Same arguments, same seed (torch.manual_seed(s) before upstream's call): every cell unmasked at
every step, every final token and the number of model calls must be equal (captured from the real
upstream run by wrapping its _generate_iterative and torch.topk), and the audio within 1e-4
(the ONNX decoder and the transformer differ from torch by float rounding; one int16 step of
silence removal is 3.1e-5).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

from omnivoice_onnx import OmniVoiceOnnx, Trace, UserError
from omnivoice_onnx.bundle import RUNTIME_CONFIG_FILE, TOKENIZER_FILE
from omnivoice_onnx.cli import vectors as vectors_cli
from omnivoice_onnx.contract import GRAPH_FILES
from omnivoice_onnx.program import Terminated, run_main
from omnivoice_onnx.vectors import cases
from omnivoice_onnx.vectors.compare import compare_records
from omnivoice_onnx.vectors.format import COMMAND, FOLDER_README, audio_summary
from omnivoice_onnx.vectors.record import post_process_case, run_case, scoring_record
from omnivoice_onnx.vectors.rules import RULES_CASE

WAV_TOLERANCE = 1e-4
CONFORMANCE_DIR = Path(__file__).resolve().parent / "conformance"
REGENERATE = f"{COMMAND} --onnx-dir <tiny export> --out tests/conformance"
# The folder's budget: ~2 MB of JSON and references, and each output's decoded audio as 16-bit FLAC
# (~3.3 MB: tiny's random weights speak noise, which FLAC barely compresses, ~1.7 bytes a sample).
SIZE_LIMIT = 6_000_000
SEEDS = [0, 1, 7, 42, 2**32 + 3]
LONG_TEXT = (
    "The first sentence sets the scene. A second one follows it closely, with a few more words. "
    "Then a third arrives; it is short. Finally, the fourth sentence ends this long text for good."
)
# Lowered chunking limits (seconds) so that LONG_TEXT is chunked on tiny, and 8 steps: these
# tests are about lengths, chunks and references, which the step count does not change.
FEW_STEPS = {"num_step": 8}
CHUNKED = {"audio_chunk_threshold": 3.0, "audio_chunk_duration": 2.0, **FEW_STEPS}


pytestmark = pytest.mark.slow  # the session pipeline (steps 0-2 on tiny)


@pytest.fixture(scope="module")
def export_dir(pipeline) -> Path:
    """The session's tiny export (graphs, tokenizer.json, runtime-config.json); read-only: tests
    that damage it copy it first."""
    return pipeline.onnx


@pytest.fixture(scope="module")
def tts(export_dir) -> OmniVoiceOnnx:
    return OmniVoiceOnnx.from_dir(export_dir)  # one thread: tests/conftest.py


@pytest.fixture(scope="module")
def reference(pipeline) -> tuple[str, str]:
    """The capture's matched reference (step 0): (wav path, transcript)."""
    return str(pipeline.capture / "ref_voice.wav"), (pipeline.capture / "ref_voice.txt").read_text().strip()


@contextlib.contextmanager
def recording(model):
    """Record upstream's final tokens per _generate_iterative call and, per torch.topk call on the
    flattened scores, the cells it chose (in call order: step-major, item-minor, k > 0 only)."""
    record = {"tokens": [], "cells": [], "target_lens": []}
    original_iterative, original_topk = model._generate_iterative, torch.topk

    def iterative(task, gen_config):
        record["target_lens"].append(list(task.target_lens))
        out = original_iterative(task, gen_config)
        record["tokens"].append([t.numpy().copy() for t in out])
        return out

    def topk(values, k, *args, **kwargs):
        result = original_topk(values, k, *args, **kwargs)
        if values.dim() == 1:
            record["cells"].append(np.sort(result.indices.numpy()))
        return result

    model._generate_iterative, torch.topk = iterative, topk
    try:
        yield record
    finally:
        del model._generate_iterative
        torch.topk = original_topk


def compare(torch_model, tts, seed: int, config: dict | None = None, **kwargs) -> Trace:
    """Run upstream and the runtime on the same request; assert equal cells, tokens and audio."""
    upstream_config = OmniVoiceGenerationConfig(**(config or {}))
    with recording(torch_model) as record:
        torch.manual_seed(seed)
        theirs = torch_model.generate(generation_config=upstream_config, **kwargs)
    trace = Trace()
    ours = tts.generate(generation_config=config, seed=seed, trace=trace, **kwargs)

    assert [it.target_lens for it in trace.iterations] == record["target_lens"]
    our_cells = [cells for it in trace.iterations for step in it.cells for cells in step if len(cells)]
    assert len(our_cells) == len(record["cells"])
    for index, (a, b) in enumerate(zip(our_cells, record["cells"])):
        assert np.array_equal(a, b), f"topk call {index}: cells differ"
    for it, tokens in zip(trace.iterations, record["tokens"]):
        for a, b in zip(it.tokens, tokens):
            assert np.array_equal(a, b)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == np.float32 and a.shape == b.shape
        assert float(np.abs(a - b).max()) <= WAV_TOLERANCE
    return trace


@pytest.mark.parametrize("seed", SEEDS)
def test_auto_mode_equals_upstream(torch_model, tts, seed):
    compare(torch_model, tts, seed, text="Hello there, this is a test of the tiny model.", language="en")


@pytest.mark.parametrize("seed", SEEDS)
def test_design_mode_equals_upstream(torch_model, tts, seed):
    compare(torch_model, tts, seed, text="Design a voice for me, please.", instruct="female, low pitch")


@pytest.mark.parametrize("seed", SEEDS)
def test_clone_mode_equals_upstream(torch_model, tts, reference, seed):
    compare(
        torch_model,
        tts,
        seed,
        text="Clone this voice now, thank you.",
        ref_audio=reference[0],
        ref_text=reference[1],
        language="English",
    )


def test_batch_of_three_lengths_in_one_call(torch_model, tts):
    trace = compare(
        torch_model,
        tts,
        3,
        text=[
            "One.",
            "A somewhat longer second sentence is here.",
            "Three, the last one of this batch, and the longest of all!",
        ],
        language=["en", "en", "English"],
        instruct=[None, "male", None],
    )
    assert len(trace.iterations) == 1 and len(set(trace.iterations[0].target_lens)) == 3


def test_chunked_long_text_without_reference(torch_model, tts):
    trace = compare(torch_model, tts, 5, config=CHUNKED, text=LONG_TEXT)
    assert trace.long_idx == [0] and len(trace.chunks[0]) > 1 and len(trace.iterations) == len(trace.chunks[0])
    assert trace.iterations[1].ref_texts == [trace.chunks[0][0]]  # chunk 0 is the later chunks' voice


def test_chunked_long_text_with_reference_and_a_short_item(torch_model, tts, reference):
    trace = compare(
        torch_model, tts, 6, config=CHUNKED, text=["Short.", LONG_TEXT], ref_audio=reference[0], ref_text=reference[1]
    )
    assert trace.short_idx == [0] and trace.long_idx == [1]


@pytest.mark.parametrize(
    "config",
    [
        {"class_temperature": 1.0},
        {"num_step": 16, "class_temperature": 0.5},
        {"num_step": 16, "guidance_scale": 0.0, "t_shift": 0.5},
    ],
)
def test_generation_configs(torch_model, tts, config):
    compare(torch_model, tts, 11, config=config, text="Sampling the classes as well.", instruct="male, high pitch")


def test_speed_and_fixed_duration(torch_model, tts, reference):
    compare(torch_model, tts, 12, config=FEW_STEPS, text="Faster, please.", speed=1.3)
    compare(
        torch_model,
        tts,
        13,
        config=FEW_STEPS,
        text=["Exactly two seconds.", "Free."],
        duration=[2.0, None],
        ref_audio=reference[0],
        ref_text=reference[1],
    )


def test_voice_clone_prompt_equals_upstream_and_is_reusable(torch_model, tts, reference):
    theirs = torch_model.create_voice_clone_prompt(reference[0], reference[1])
    ours = tts.create_voice_clone_prompt(reference[0], reference[1])
    assert np.array_equal(ours.ref_audio_tokens, theirs.ref_audio_tokens.numpy())
    assert (ours.ref_text, ours.ref_rms) == (theirs.ref_text, theirs.ref_rms)
    wav, rate = sf.read(reference[0], dtype="float32")
    from_array = tts.create_voice_clone_prompt((wav, rate), reference[1])
    assert np.array_equal(from_array.ref_audio_tokens, ours.ref_audio_tokens)
    a = tts.generate("Reuse the prompt.", voice_clone_prompt=ours, seed=4)
    b = tts.generate("Reuse the prompt.", ref_audio=reference[0], ref_text=reference[1], seed=4)
    assert np.array_equal(a[0], b[0])


def test_seed_none_draws_a_seed_that_reproduces_the_run(tts):
    trace = Trace()
    first = tts.generate("Any seed will do.", generation_config={"num_step": 4}, trace=trace)
    again = tts.generate("Any seed will do.", generation_config={"num_step": 4}, seed=trace.seed)
    assert isinstance(trace.seed, int) and np.array_equal(first[0], again[0])


FORBIDDEN = ("torch", "torchaudio", "transformers", "omnivoice", "pydub", "omnivoice_export")
TORCH_FREE_RUN = """
import sys
for name in {forbidden!r}:
    sys.modules[name] = None  # any import of these, even lazy, now raises ImportError
from omnivoice_onnx import OmniVoiceOnnx
tts = OmniVoiceOnnx.from_dir(sys.argv[1], threads=1)
tts.generate("No torch here.", ref_audio=sys.argv[2], ref_text="Words.", generation_config={{"num_step": 2}}, seed=1)
tts.generate("Nor here.", instruct="male", generation_config={{"num_step": 2}}, seed=1)
print("ok")
"""


def test_runtime_runs_with_the_toolchain_unimportable(export_dir, reference):
    """A clone and a design run in a process where torch, transformers, omnivoice, pydub and the
    toolchain cannot be imported: the runtime never needs them, not even lazily."""
    code = TORCH_FREE_RUN.format(forbidden=FORBIDDEN)
    proc = subprocess.run(
        [sys.executable, "-c", code, str(export_dir), reference[0]],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


# ---- conformance vectors -------------------------------------------------------------------------


def test_conformance_vectors_are_committed_and_small():
    names = sorted(p.stem for p in CONFORMANCE_DIR.glob("*.json"))
    assert names == sorted([*cases.CASES, *cases.POST_PROCESS_CASES, RULES_CASE, cases.SCORING_CASE]), (
        f"vectors and cases differ; regenerate: {REGENERATE}"
    )
    assert (CONFORMANCE_DIR / cases.README).read_text(encoding="utf-8") == FOLDER_README
    decoded = sorted(p.name for p in CONFORMANCE_DIR.glob("*.flac"))
    assert decoded == sorted(
        cases.decoded_file(name, i)
        for name in cases.CASES
        for i in range(len(json.loads((CONFORMANCE_DIR / f"{name}.json").read_text())["outputs"]))
    )
    sizes = {p.name: p.stat().st_size for p in CONFORMANCE_DIR.iterdir()}
    assert max(sizes.values()) < 600_000 and sum(sizes.values()) < SIZE_LIMIT, sizes


@pytest.mark.parametrize("name", list(cases.CASES))
def test_conformance_vector_replays_and_equals_upstream(torch_model, tts, name):
    """Replay a committed vector as a port would (compare_records: everything but the
    audio exactly, the audio's envelopes within WAV_TOLERANCE); and upstream torch, given the same
    request, makes the same tokens."""
    stored = json.loads((CONFORMANCE_DIR / f"{name}.json").read_text(encoding="utf-8"))
    assert stored["export"]["model_fingerprint"] == tts.metadata["model_fingerprint"], (
        f"the vectors were made from another checkpoint; regenerate: {REGENERATE}"
    )
    case = cases.CASES[name]
    record, _ = run_case(tts, name, case, CONFORMANCE_DIR)
    assert compare_records(stored, record, WAV_TOLERANCE) == []

    kwargs = {key: value for key, value in case.items() if key not in ("seed", "generation_config")}
    if "ref_audio" in kwargs:
        kwargs["ref_audio"] = str(CONFORMANCE_DIR / kwargs["ref_audio"])
    with recording(torch_model) as upstream:
        torch.manual_seed(case["seed"])
        torch_model.generate(generation_config=OmniVoiceGenerationConfig(**case.get("generation_config", {})), **kwargs)
    stored_tokens = [[np.array(item["tokens"]) for item in it["items"]] for it in stored["iterations"]]
    assert len(upstream["tokens"]) == len(stored_tokens)
    for theirs, ours in zip(upstream["tokens"], stored_tokens):
        assert len(theirs) == len(ours) and all(np.array_equal(a, b) for a, b in zip(theirs, ours))
    # Post-processing of each output's stored decoded audio: upstream's gives the recorded bits.
    for output in stored["outputs"]:
        post = output["post_process"]
        decoded = sf.read(CONFORMANCE_DIR / post["input"], dtype="float32")[0][np.newaxis]
        config = OmniVoiceGenerationConfig(
            postprocess_output=post["postprocess_output"],
            pad_duration=post["pad_duration"],
            fade_duration=post["fade_duration"],
        )
        theirs = torch_model._post_process_audio(decoded.copy(), ref_rms=post["ref_rms"], gen_config=config)
        assert audio_summary(theirs[0]) == post["output"]


@pytest.mark.parametrize("name", list(cases.POST_PROCESS_CASES))
def test_post_process_vector_replays_and_equals_upstream(torch_model, tts, name):
    """The post_process vectors: the runtime replays them, and upstream _post_process_audio on the
    same input gives the stored outputs bit for bit (no resampling is involved)."""
    stored = json.loads((CONFORMANCE_DIR / f"{name}.json").read_text(encoding="utf-8"))
    record = post_process_case(tts, name, cases.POST_PROCESS_CASES[name], CONFORMANCE_DIR)
    assert compare_records(stored, record, WAV_TOLERANCE) == []
    decoded = sf.read(CONFORMANCE_DIR / stored["input"]["file"], dtype="float32")[0][np.newaxis]
    trimmed = 0
    for run in stored["runs"]:
        config = OmniVoiceGenerationConfig(
            postprocess_output=run["postprocess_output"],
            pad_duration=run["pad_duration"],
            fade_duration=run["fade_duration"],
        )
        theirs = torch_model._post_process_audio(decoded.copy(), ref_rms=run["ref_rms"], gen_config=config)
        assert audio_summary(theirs[0]) == run["output"]
        trimmed += run["postprocess_output"] and run["silence_removed"]["samples"] < stored["input"]["samples"]
    assert trimmed  # long inner and edge silences were removed


def sequential_f32_log_softmax(x: np.ndarray) -> np.ndarray:
    """The wrong recipe: float32 exp and log, the sum taken sequentially in float32."""
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.cumsum(np.exp(shifted), axis=-1, dtype=np.float32)[..., -1:])


def pairwise_f32_log_softmax(x: np.ndarray) -> np.ndarray:
    """Also wrong: float32 exp and log with numpy's pairwise float32 sum."""
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True, dtype=np.float32))


def sequential_rms(wav: np.ndarray) -> float:
    """The wrong recipe for ref_rms: the float32 squares summed one after another."""
    total = np.float32(0)
    for value in (wav * wav).ravel():
        total = np.float32(total + value)
    return float(np.sqrt(np.float32(total / np.float32(wav.size))))


@pytest.mark.parametrize(
    "target, wrong, case, first_difference",
    [
        ("omnivoice_onnx.core.scoring.log_softmax", sequential_f32_log_softmax, cases.SCORING_CASE, "log_softmax"),
        ("omnivoice_onnx.core.scoring.log_softmax", pairwise_f32_log_softmax, cases.SCORING_CASE, "log_softmax"),
        ("omnivoice_onnx.core.audio.reference_rms", sequential_rms, "clone-quiet-44k-stereo", "ref_rms"),
    ],
    ids=["sequential-f32-log-softmax", "pairwise-f32-log-softmax", "sequential-rms"],
)
def test_a_wrong_float_recipe_fails_its_vector(tts, monkeypatch, target, wrong, case, first_difference):
    """docs/runtime.md's recipes are not interchangeable with the obvious float32 ones: with one
    swapped into the runtime, the vector made to tell them apart no longer replays."""
    stored = json.loads((CONFORMANCE_DIR / f"{case}.json").read_text(encoding="utf-8"))
    monkeypatch.setattr(target, wrong)
    if case == cases.SCORING_CASE:
        record = scoring_record(tts, stored)
    else:
        record, _ = run_case(tts, case, cases.CASES[case], CONFORMANCE_DIR)
    problems = compare_records(stored, record, WAV_TOLERANCE)
    assert problems and first_difference in problems[0], problems[:3]


def test_scoring_vector_replays_and_equals_upstream(torch_model, tts):
    """The scoring vector replays here bit for bit, and upstream's _predict_tokens_with_scoring
    (greedy) picks the same token per row; its log-probs are torch's float32 kernels, so they are
    compared by the token and within ULPs, not bit for bit (docs/runtime.md: tolerances)."""
    stored = json.loads((CONFORMANCE_DIR / f"{cases.SCORING_CASE}.json").read_text(encoding="utf-8"))
    assert compare_records(stored, scoring_record(tts, stored)) == []
    for row in stored["rows"]:
        cond = torch.tensor(row["cond_logits"]).reshape(1, 1, 1, -1)
        uncond = torch.tensor(row["uncond_logits"]).reshape(1, 1, 1, -1)
        tokens, scores = torch_model._predict_tokens_with_scoring(cond, uncond, _greedy_config(stored))
        assert int(tokens.flatten()[0]) == row["token"]
        assert abs(float(scores.flatten()[0]) - row["confidence"]) <= 1e-5 * max(1.0, abs(row["confidence"]))


def _greedy_config(stored: dict) -> OmniVoiceGenerationConfig:
    return OmniVoiceGenerationConfig(guidance_scale=stored["guidance_scale"], class_temperature=0.0)


def test_vectors_cli_check_replays_the_committed_vectors(export_dir, tmp_path):
    """The port's replay entry point, on a copy holding two vectors: OVERALL: PASS, exit 0; a
    changed token: the case and its first difference named, exit 1."""
    folder = tmp_path / "vectors"
    folder.mkdir()
    for name in ("auto-en.json", cases.decoded_file("auto-en", 0), "post-process-silences.json", cases.SILENCES_WAV):
        shutil.copyfile(CONFORMANCE_DIR / name, folder / name)
    command = [
        sys.executable,
        "-m",
        "omnivoice_onnx.cli.vectors",
        "--onnx-dir",
        str(export_dir),
        "--check",
        str(folder),
    ]

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parent.parent
        )

    done = run()
    assert done.returncode == 0 and "OVERALL: PASS (2/2" in done.stdout, done.stdout + done.stderr
    vector = json.loads((folder / "auto-en.json").read_text(encoding="utf-8"))
    vector["iterations"][0]["items"][0]["tokens"][3][5] += 1
    (folder / "auto-en.json").write_text(json.dumps(vector), encoding="utf-8")
    done = run()
    assert done.returncode == 1 and "[auto-en] FAIL: iterations[0].items[0].tokens" in done.stdout, done.stdout
    assert done.stderr.strip().count("\n") == 0 and "auto-en" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("threads", ["1", "8"])
def test_conformance_check_passes_with_any_thread_count(export_dir, tmp_path, threads):
    """The decoder's bits change with the intra-op thread count (onnxruntime sums its convolutions
    otherwise from 8 threads on); --check compares the decoder's audio within the tolerance and
    everything else, post-processing of the stored decoded audio and a resampled reference
    included, bit for bit: it passes with $OMNIVOICE_ORT_THREADS 1 and 8 alike."""
    folder = tmp_path / "vectors"
    folder.mkdir()
    for name in ("clone-16k.json", cases.decoded_file("clone-16k", 0), cases.REF_16K):
        shutil.copyfile(CONFORMANCE_DIR / name, folder / name)
    done = subprocess.run(
        [sys.executable, "-m", "omnivoice_onnx.cli.vectors", "--onnx-dir", str(export_dir), "--check", str(folder)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMNIVOICE_ORT_THREADS": threads},
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0 and "OVERALL: PASS (1/1" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize(
    "stop, code, words",
    [
        (KeyboardInterrupt, 130, "interrupted"),
        (lambda: Terminated(), 143, "terminated"),
        (lambda: OSError(errno.ENOSPC, "No space left on device"), 2, "disk full"),
    ],
    ids=["ctrl-c", "sigterm", "disk-full"],
)
def test_vectors_cli_leaves_out_as_it_was(export_dir, tmp_path, monkeypatch, capsys, stop, code, words):
    """Writing stops in the third case: one line, the exit code, --out untouched, no temporary left."""
    out = tmp_path / "vectors"
    out.mkdir()
    (out / "keep.txt").write_text("earlier vectors")
    calls = []
    original = run_case

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise stop()
        return original(*args, **kwargs)

    monkeypatch.setattr("omnivoice_onnx.vectors.record.run_case", failing)
    with pytest.raises(SystemExit) as info:
        run_main(vectors_cli.main, ["--onnx-dir", str(export_dir), "--out", str(out), "--threads", "1"], prog=COMMAND)
    assert info.value.code == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vectors"]
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


# ---- expected bad input: one-line UserErrors ---------------------------------------------------


def one_line_user_error(call) -> str:
    with pytest.raises(UserError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and message
    return message


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"text": ""}, "empty"),
        ({"text": "   "}, "empty"),
        ({"text": []}, "non-empty"),
        ({"text": "Hi.", "language": "Klingon"}, "unknown language"),
        ({"text": "Hi.", "instruct": "purple voice", "strict_instructions": True}, "voice-design vocabulary"),
        ({"text": "Hi.", "instruct": "male, female"}, "Conflicting"),
        ({"text": "Hi.", "generation_config": {"num_steps": 8}}, "unknown generation_config field"),
        ({"text": "Hi.", "generation_config": {"num_step": 0}}, "num_step 0 is out of range [1,"),
        ({"text": "Hi.", "seed": 2**64}, "seed"),
        ({"text": ["a.", "b.", "c."], "language": ["en", "en"]}, "language has 2 values"),
        ({"text": "Hi.", "ref_text": "no audio"}, "without ref_audio"),
    ],
)
def test_bad_requests_are_one_line_user_errors(tts, kwargs, words):
    assert words in one_line_user_error(lambda: tts.generate(**kwargs))


def test_unusable_references_are_user_errors(tts, reference, tmp_path):
    silent = tmp_path / "silent.wav"
    sf.write(silent, np.zeros(24000, dtype=np.float32), 24000)
    one_line_user_error(lambda: tts.generate("Hi.", ref_audio=str(silent), ref_text="Nothing."))
    assert "no speech recogniser" in one_line_user_error(lambda: tts.generate("Hi.", ref_audio=reference[0]))
    one_line_user_error(lambda: tts.generate("Hi.", ref_audio=str(tmp_path / "missing.wav"), ref_text="x"))
    one_line_user_error(lambda: tts.generate("Hi.", ref_audio=(np.zeros(100, np.float32), 24000), ref_text="x"))


def test_missing_files_are_user_errors(export_dir, tmp_path):
    for name in [GRAPH_FILES["transformer"], GRAPH_FILES["decoder"], RUNTIME_CONFIG_FILE, TOKENIZER_FILE]:
        broken = tmp_path / name.replace(".", "_")
        shutil.copytree(export_dir, broken)
        (broken / name).unlink()
        assert name in one_line_user_error(lambda: OmniVoiceOnnx.from_dir(broken))
    one_line_user_error(lambda: OmniVoiceOnnx.from_dir(tmp_path / "nowhere"))


def test_foreign_graphs_are_user_errors(export_dir, tmp_path):
    import onnx

    swapped = tmp_path / "swapped"
    shutil.copytree(export_dir, swapped)
    for suffix in ("", ".data"):  # the decoder's files under the encoder's name
        shutil.copyfile(export_dir / (GRAPH_FILES["decoder"] + suffix), swapped / (GRAPH_FILES["encoder"] + suffix))
    assert "higgs_encoder.onnx does not match the sha256" in one_line_user_error(
        lambda: OmniVoiceOnnx.from_dir(swapped)
    )
    # Unverified (a bundle without a report), each graph's own metadata and the config still speak.
    assert "not an OmniVoice encoder graph" in one_line_user_error(
        lambda: OmniVoiceOnnx.from_dir(swapped, verify=False)
    )

    foreign = tmp_path / "foreign"
    shutil.copytree(export_dir, foreign)
    path = foreign / GRAPH_FILES["decoder"]
    graph = onnx.load(str(path), load_external_data=False)
    for prop in graph.metadata_props:
        if prop.key == "model_fingerprint":
            prop.value = "0" * 64
    onnx.save(graph, str(path))
    assert "another export" in one_line_user_error(lambda: OmniVoiceOnnx.from_dir(foreign, verify=False))

    mismatched = tmp_path / "mismatched"
    shutil.copytree(export_dir, mismatched)
    config = json.loads((mismatched / RUNTIME_CONFIG_FILE).read_text())
    config["model"]["audio_mask_id"] += 1
    (mismatched / RUNTIME_CONFIG_FILE).write_text(json.dumps(config))
    assert "audio_mask_id" in one_line_user_error(lambda: OmniVoiceOnnx.from_dir(mismatched, verify=False))

    config["model"]["audio_mask_id"] -= 1
    config["graphs"]["transformer"]["inputs"][0]["dtype"] = "int32"  # a contract table that is not the graphs'
    (mismatched / RUNTIME_CONFIG_FILE).write_text(json.dumps(config))
    assert "graphs section" in one_line_user_error(lambda: OmniVoiceOnnx.from_dir(mismatched, verify=False))
