"""The ONNX drop-in's split execution: cond and uncond rows at their own length.

run_split is a speed optimisation that must not change what generate() reads; these tests hold
it to that on captured real inputs, and check it refuses masks that are not of block form.
"""

from __future__ import annotations

import numpy as np

from omnivoice_export import capture
from omnivoice_export.ort_runtime import make_session, prefix_lengths, run, run_split


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
            for a, b in zip(capture.logits_rows(padded, feeds["attention_mask"]),
                            capture.logits_rows(split, feeds["attention_mask"])):
                assert np.abs(a - b).max() < 1e-4
                assert np.array_equal(a.argmax(-1), b.argmax(-1))


def test_split_falls_back_to_one_padded_call(pipeline) -> None:
    """A mask that is not of block form is run as given, unchanged."""
    session = make_session(pipeline.onnx / "omnivoice_transformer.onnx")
    feeds = _feeds(pipeline, "design", 0)
    feeds["attention_mask"] = feeds["attention_mask"] & np.tril(np.ones(feeds["attention_mask"].shape[-2:], dtype=bool))
    assert np.array_equal(run_split(session, **feeds), run(session, feeds)["logits"])
