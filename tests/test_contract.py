"""The one contract table (omnivoice_onnx.contract): it states the design table, and its checks
name every way a graph's signature or a call's shapes can break it.

The checks are what parity_check.py runs on every graph and call; here they meet hand-made
signatures and shapes (no export needed), one defect at a time.
"""

from __future__ import annotations

import pytest
from test_export import CONTRACT as DESIGN
from test_export import LEGACY_ENCODER_LENGTH

from omnivoice_onnx.contract import (
    CONTRACTS,
    GRAPH_FILES,
    GRAPH_NAMES,
    HOP_LENGTH,
    THRESHOLDS,
    shape_problems,
    signature_problems,
)


def _signature(graph: str) -> tuple[list, list]:
    """The design table's signature of `graph` as (name, dtype, axes) triples, as ORT reports them."""
    inputs, outputs = DESIGN[graph]
    return [list(t) for t in inputs], [list(t) for t in outputs]


@pytest.mark.parametrize("graph", GRAPH_NAMES)
def test_contract_is_the_design_table(graph: str) -> None:
    inputs, outputs = DESIGN[graph]
    contract = CONTRACTS[graph]
    assert [(t.name, t.dtype, list(t.axes)) for t in contract.inputs] == inputs
    assert [(t.name, t.dtype, list(t.axes)) for t in contract.outputs] == outputs
    assert GRAPH_FILES[graph] == contract.file and contract.name == graph
    assert set(contract.tolerances) <= THRESHOLDS.keys()


@pytest.mark.parametrize("graph", GRAPH_NAMES)
def test_design_signature_has_no_problem(graph: str) -> None:
    assert signature_problems(graph, *_signature(graph)) == []


def test_legacy_encoder_length_name_is_accepted() -> None:
    """The legacy exporter cannot state 960*frames and names the axis freely; nothing else is let through."""
    inputs, outputs = _signature("encoder")
    inputs[0][2] = ["batch", 1, LEGACY_ENCODER_LENGTH]
    assert signature_problems("encoder", inputs, outputs) == []
    inputs[0][2] = ["batch", 1, "s12"]
    assert signature_problems("encoder", inputs, outputs) == [
        "input input_values axis 2 is 's12', expected '960*frames'"
    ]


@pytest.mark.parametrize(
    "defect,expected",
    [
        (
            "renamed",
            "inputs are ['ids', 'audio_mask', 'attention_mask'], "
            "expected ['input_ids', 'audio_mask', 'attention_mask']",
        ),
        ("dtype", "output logits is float16, expected float32"),
        ("rank", "input audio_mask has rank 3, expected 2 ['batch', 'seq']"),
        ("fixed-batch", "input input_ids axis 0 is 1, expected 'batch'"),
        ("axis-name", "output logits axis 2 is 's76', expected 'seq'"),
        ("vocab", "output logits axis 3 is 1024, expected 1025"),
    ],
)
def test_signature_defects_are_named(defect: str, expected: str) -> None:
    inputs, outputs = _signature("transformer")
    if defect == "renamed":
        inputs[0][0] = "ids"
    elif defect == "dtype":
        outputs[0][1] = "float16"
    elif defect == "rank":
        inputs[1][2] = ["batch", "seq", 1]
    elif defect == "fixed-batch":
        inputs[0][2] = [1, 8, "seq"]
    elif defect == "axis-name":
        outputs[0][2] = ["batch", 8, "s76", 1025]
    else:
        outputs[0][2] = ["batch", 8, "seq", 1024]
    assert signature_problems("transformer", inputs, outputs) == [expected]


def _transformer_shapes(rows: int = 4, seq: int = 37) -> dict[str, tuple[int, ...]]:
    return {
        "input_ids": (rows, 8, seq),
        "audio_mask": (rows, seq),
        "attention_mask": (rows, 1, seq, seq),
        "logits": (rows, 8, seq, 1025),
    }


def test_consistent_shapes_have_no_problem() -> None:
    assert shape_problems("transformer", _transformer_shapes()) == []
    assert shape_problems("encoder", {"input_values": (3, 1, 7 * HOP_LENGTH), "audio_codes": (3, 8, 7)}) == []
    assert shape_problems("decoder", {"audio_codes": (1, 8, 50), "audio_values": (1, 1, 50 * HOP_LENGTH)}) == []


@pytest.mark.parametrize(
    "graph,change,expected",
    [
        ("transformer", {"logits": (4, 8, 36, 1025)}, "logits has shape [4, 8, 36, 1025], but seq is 37 elsewhere"),
        ("transformer", {"logits": (2, 8, 37, 1025)}, "logits has shape [2, 8, 37, 1025], but batch is 4 elsewhere"),
        ("transformer", {"logits": (4, 8, 37, 1024)}, "logits has shape [4, 8, 37, 1024], expected 1025 for that axis"),
        (
            "transformer",
            {"audio_mask": (4, 37, 1)},
            "audio_mask has shape [4, 37, 1], expected 2 axes ['batch', 'seq']",
        ),
        (
            "decoder",
            {"audio_values": (1, 1, 50 * HOP_LENGTH - 1)},
            f"audio_values has shape [1, 1, {50 * HOP_LENGTH - 1}], expected {HOP_LENGTH} x 50 frames",
        ),
    ],
)
def test_shape_defects_are_named(graph: str, change: dict, expected: str) -> None:
    shapes = (
        _transformer_shapes()
        if graph == "transformer"
        else {"audio_codes": (1, 8, 50), "audio_values": (1, 1, 50 * HOP_LENGTH)}
    )
    assert shape_problems(graph, {**shapes, **change}) == [expected]
