"""The ONNX drop-in's split execution: cond and uncond rows at their own length.

run_split is a speed optimisation that must not change what generate() reads; these tests hold
it to that on captured real inputs, and check it refuses masks that are not of block form.
"""

from __future__ import annotations

import numpy as np
import pytest

from omnivoice_export.step1_capture import capture
from omnivoice_export.step2_export.ort_runtime import OrtGraphs
from omnivoice_onnx.contract import GRAPH_FILES
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.sessions import make_session, prefix_lengths, run, run_split

pytestmark = pytest.mark.slow  # every test here uses the session pipeline (steps 0-2, ~100 s)


def _feeds(pipeline, mode: str, step: int) -> dict[str, np.ndarray]:
    data = capture.load_step(pipeline.capture, mode, step)
    return {k: data[k] for k in ("input_ids", "audio_mask", "attention_mask")}


def test_prefix_lengths_reads_the_cfg_layout(pipeline) -> None:
    """Cond row: c_len; uncond row: t_len (its padding rows only see themselves)."""
    manifest = capture.load_manifest(pipeline.capture, verify_hashes=False)
    feeds = _feeds(pipeline, "clone", 0)
    rows = manifest["modes"]["clone"]["rows"][0]
    assert prefix_lengths(feeds["attention_mask"]) == [rows["c_len"], rows["t_len"]]


def test_prefix_lengths_refuses_other_masks(pipeline) -> None:
    mask = _feeds(pipeline, "clone", 0)["attention_mask"].copy()
    causal = mask & np.tril(np.ones(mask.shape[-2:], dtype=bool))
    assert prefix_lengths(causal) is None
    holed = mask.copy()
    holed[0, 0, 3, 5] = False
    assert prefix_lengths(holed) is None


def test_split_equals_padded_on_the_rows_generate_reads(pipeline) -> None:
    """Every mode, first and last step: the read rows agree to fp32 noise and argmax is equal."""
    session = make_session(pipeline.onnx / "omnivoice_transformer.onnx")
    for mode in capture.MODES:
        for step in (0, 31):
            feeds = _feeds(pipeline, mode, step)
            padded = run(session, feeds)["logits"]
            split = run_split(session, **feeds)
            assert split.shape == padded.shape
            for a, b in zip(
                capture.logits_rows(padded, feeds["attention_mask"]),
                capture.logits_rows(split, feeds["attention_mask"]),
            ):
                assert np.abs(a - b).max() < 1e-4
                assert np.array_equal(a.argmax(-1), b.argmax(-1))


def test_split_falls_back_to_one_padded_call(pipeline) -> None:
    """A mask that is not of block form is run as given, unchanged."""
    session = make_session(pipeline.onnx / "omnivoice_transformer.onnx")
    feeds = _feeds(pipeline, "design", 0)
    feeds["attention_mask"] = feeds["attention_mask"] & np.tril(np.ones(feeds["attention_mask"].shape[-2:], dtype=bool))
    assert np.array_equal(run_split(session, **feeds), run(session, feeds)["logits"])


def test_codec_graphs_run_without_arena_and_give_the_same_outputs(pipeline) -> None:
    """OrtGraphs gives the codec graphs no memory arena (their activations scale with the audio
    and are used once per generate()); the outputs are bit-identical to an arena session's."""
    graphs = OrtGraphs.load(pipeline.onnx, resident_codec=True)
    assert graphs.transformer.get_session_options().enable_cpu_mem_arena
    for name, feed_name in (("encoder", "input_values"), ("decoder", "audio_codes")):
        session = graphs.codec.held[name]
        assert not session.get_session_options().enable_cpu_mem_arena, name
        with np.load(pipeline.capture / "clone" / f"{name}.npz") as data:
            feeds = {feed_name: data[feed_name]}
        with_arena = make_session(pipeline.onnx / GRAPH_FILES[name], arena=True)
        for got, want in zip(session.run(None, feeds), with_arena.run(None, feeds)):
            assert np.array_equal(got, want), f"{name}: output changes with the arena setting"


def test_codec_sessions_per_call_equal_resident(pipeline) -> None:
    """Opening a codec session per call (the default) gives exactly what a held one gives, and
    holds nothing between calls."""
    per_call, resident = OrtGraphs.load(pipeline.onnx), OrtGraphs.load(pipeline.onnx, resident_codec=True)
    assert per_call.codec.held == {}
    with np.load(pipeline.capture / "clone" / "encoder.npz") as data:
        feeds = {"input_values": data["input_values"]}
    assert np.array_equal(
        per_call.codec.run("encoder", feeds)["audio_codes"], resident.codec.run("encoder", feeds)["audio_codes"]
    )
    assert per_call.audio_tokenizer().config == resident.audio_tokenizer().config


@pytest.mark.parametrize("env, threads, expected", [("3", None, 3), ("3", 2, 2), ("", None, 0)])
def test_session_threads_come_from_the_flag_then_the_environment(pipeline, monkeypatch, env, threads, expected) -> None:
    """--threads wins; else $OMNIVOICE_ORT_THREADS (the test suite sets 1 per worker); else ORT's
    default, which SessionOptions reports as 0."""
    monkeypatch.setenv("OMNIVOICE_ORT_THREADS", env)
    session = make_session(pipeline.onnx / GRAPH_FILES["decoder"], threads=threads)
    assert session.get_session_options().intra_op_num_threads == expected


@pytest.mark.parametrize("env", ["0", "two", "-1"])
def test_session_threads_environment_must_be_a_count(pipeline, monkeypatch, env) -> None:
    monkeypatch.setenv("OMNIVOICE_ORT_THREADS", env)
    with pytest.raises(UserError, match="OMNIVOICE_ORT_THREADS=.* is not a thread count"):
        make_session(pipeline.onnx / GRAPH_FILES["decoder"])


def test_text_tokenizer_is_parsed_once_per_state_of_its_files(tiny_model, tmp_path) -> None:
    """Step 6 loads one OmniVoice per variant, the tests many: the tokenizer parse is shared while
    the checkpoint's files are unchanged, and read again once one of them changes."""
    import os
    import shutil

    from omnivoice_export.step0_checkpoints.checkpoints import _files_state, _text_tokenizer

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_model, checkpoint, ignore=shutil.ignore_patterns("audio_tokenizer", "*.safetensors"))
    first = _text_tokenizer(str(checkpoint), _files_state(checkpoint))
    assert _text_tokenizer(str(checkpoint), _files_state(checkpoint)) is first
    config = checkpoint / "tokenizer_config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    again = _text_tokenizer(str(checkpoint), _files_state(checkpoint))
    assert again is not first and again("hello").input_ids == first("hello").input_ids
