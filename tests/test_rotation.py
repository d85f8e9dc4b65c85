"""int8's Hadamard rotation (omnivoice_export.step56_variants.rotation) on small graphs: the matrix and
its block, the function kept in fp32, and the outlier channel it exists to spread.

The rotation on the real graphs (every tiny checkpoint's int8, SmolLM2 in the judge), o_proj's per
head included, is held in test_outliers (argmax and logits of the rotated fp32 graph) and
test_quantize (one online rotation per quantized input but o_proj's).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from omnivoice_export.step56_variants import rotation, rowwise
from omnivoice_onnx.sessions import make_session

WIDTH = 192  # 3 blocks of 64: not a power of two, as SmolLM2's 1536 and Qwen3's 3072 are not


@pytest.mark.parametrize("size", [1, 2, 8, 16, 64, 128])
def test_hadamard_is_symmetric_orthogonal_with_entries_of_one_size(size: int) -> None:
    matrix = rotation.hadamard(size)
    np.testing.assert_allclose(matrix, matrix.T)
    np.testing.assert_allclose(matrix @ matrix.T, np.eye(size), atol=1e-6)
    np.testing.assert_allclose(np.abs(matrix), 1 / np.sqrt(size), rtol=1e-6)  # every channel spread evenly


def test_block_is_the_largest_power_of_two_that_divides_up_to_the_limit() -> None:
    assert [rotation.block_size(width) for width in (16, 48, 96, 576, 1024, 1536, 3072)] == [
        16, 16, 32, 64, 64, 64, 64,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="power of two"):
        rotation.hadamard(12)


def test_rotated_weight_is_the_block_diagonal_transpose_times_w() -> None:
    weight = np.random.default_rng(0).standard_normal((WIDTH, 10)).astype(np.float32)
    dense = np.kron(np.eye(WIDTH // 64), rotation.hadamard(64))
    np.testing.assert_allclose(rotation.rotate_weight(weight, 64), dense.T @ weight, atol=1e-5)


def shared_input_graph(weights: dict[str, np.ndarray], tied: bool = False) -> onnx.ModelProto:
    """x [2, 5, WIDTH] read by one MatMul per weight (q/k/v-like: one input, several readers); with
    `tied`, one more MatMul reads the first weight (a tied weight: no reader may be rotated alone)."""
    names = list(weights)
    nodes = [helper.make_node("MatMul", ["x", name], [f"y_{name}"], name=f"mm_{name}") for name in names]
    outputs = [f"y_{name}" for name in names]
    if tied:
        nodes.append(helper.make_node("MatMul", ["z", names[0]], ["y_tied"], name="mm_tied"))
        outputs.append("y_tied")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, WIDTH])]
    if tied:
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 5, WIDTH]))
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def run(model: onnx.ModelProto, tmp_path: Path, name: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    session = make_session(path)
    return [np.asarray(out) for out in session.run(None, feeds)]


def test_rotation_keeps_the_function_and_spreads_an_outlier_channel(tmp_path: Path) -> None:
    """Two readers of one input: one rotation before both (one fp32 MatMul by H), their
    weights rotated; in fp32 the outputs are the same function (float order only). With an input
    channel 100x the others, per-row int8 of the rotated graph is several times closer to fp32 than
    per-row int8 of the plain one: what the rotation is for."""
    rng = np.random.default_rng(1)
    weights = {name: rng.standard_normal((WIDTH, 16)).astype(np.float32) / 8 for name in ("wa", "wb")}
    x = rng.standard_normal((2, 5, WIDTH)).astype(np.float32)
    x[..., 7] *= 100.0
    plain = shared_input_graph(weights)
    reference = run(plain, tmp_path, "plain", {"x": x})

    rotated = shared_input_graph(weights)
    rows, constant = rotation.rotate_inputs(rotated, [])
    assert rows == [{"input": "x", "matmuls": ["mm_wa", "mm_wb"], "block": 64, "how": "online"}]
    assert constant == ["hadamard0_matmul"]
    assert [node.op_type for node in rotated.graph.node].count("MatMul") == 2 + 1
    for got, want in zip(run(rotated, tmp_path, "rotated", {"x": x}), reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))

    error = {}
    for name, model in (("plain", shared_input_graph(weights)), ("rotated", rotated)):
        excluded = constant if name == "rotated" else []
        assert rowwise.quantize_rowwise(model, excluded) == 2
        outputs = run(model, tmp_path, f"{name}-int8", {"x": x})
        error[name] = max(float(np.abs(got - want).max() / np.abs(want).max()) for got, want in zip(outputs, reference))
    assert error["rotated"] * 4 < error["plain"], error


def test_an_input_read_through_a_tied_weight_is_left_alone() -> None:
    """A weight another MatMul also reads (tied embeddings, lm_head) cannot take R^T for one reader."""
    weights = {"wa": np.ones((WIDTH, 4), dtype=np.float32)}
    model = shared_input_graph(weights, tied=True)
    rows, constant = rotation.rotate_inputs(model, [])
    assert [row["input"] for row in rows] == [] and constant == []
