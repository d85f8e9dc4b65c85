"""omnivoice_onnx.graphmeta reads a graph's metadata_props from the protobuf as onnx.load does,
without the onnx package (which a runtime-only venv lacks, and whose name the export folder onnx/
would otherwise take)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from omnivoice_onnx.graphmeta import read_metadata_props


def test_same_as_onnx_load(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, producer_name="test")
    helper.set_model_props(model, {"graph": "decoder", "model_fingerprint": "sha256:ab", "note": "ünï 名"})
    onnx.save(model, tmp_path / "m.onnx")
    expected = {p.key: p.value for p in onnx.load(tmp_path / "m.onnx", load_external_data=False).metadata_props}
    assert (
        read_metadata_props(tmp_path / "m.onnx")
        == expected
        == {"graph": "decoder", "model_fingerprint": "sha256:ab", "note": "ünï 名"}
    )


@pytest.mark.parametrize("content", [b"", b"\xff" * 64, b"\x08\x07"])
def test_not_a_model_is_a_value_error(content: bytes, tmp_path: Path) -> None:
    (tmp_path / "x.onnx").write_bytes(content)
    with pytest.raises(ValueError):
        read_metadata_props(tmp_path / "x.onnx")
