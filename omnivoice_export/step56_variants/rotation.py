"""Online Hadamard rotations of the quantized MatMul inputs: the `int8` recipe's answer to outlier
channels that no fold removes.

Why (docs/variants.md, the int8 judge): on a trained model the outlier channels sit in every kind of
MatMul input, and SmoothQuant's migration (omnivoice_export.step56_variants.smoothing) can only move
part of them into the weights (past its best alpha the weights lose the resolution the activations
gain); on the trained judge smoothing alone stayed under the bar however many MatMuls the budget
kept fp32, and smoothing followed by this rotation passed it with none. For an orthogonal R,
x W = (x R)(R^T W): each MatMul that reads x reads x R instead and stores R^T W (quantized as any
weight). A Hadamard R spreads every channel over the b channels of its block, so an outlier channel
no longer sets the per-row int8 scale of the whole row (QuaRot, Ashkboos et al. 2024). The inputs
are an RMSNorm's output, silu(gate) * up, or attention's output, and none of them commutes with R,
so R runs in the graph (online), before the MatMuls that read the input.

R = blockdiag(H, ..., H) over K / b blocks, H the normalised Sylvester-Hadamard matrix of the largest
power of two b <= MAX_BLOCK that divides K. H_b = H_b1 (x) H_b2 (Kronecker, b1 * b2 = b), so the
product is two small MatMuls on x reshaped to [..., K / b, b1, b2]: Y = H_b1 X H_b2 (Sylvester
matrices are symmetric), K * (b1 + b2) multiply-adds per row instead of K * b. In fp32 the rotated
graph computes the same function in another float order: not the same bits (a test holds its argmax
and its logits' relative error on the captured calls), unlike smoothing's power-of-two folds.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from omnivoice_export.step56_variants.fusion import GraphIndex
from omnivoice_export.step56_variants.rowwise import matmuls_by_input

MAX_BLOCK = 1024  # the real dims' hidden size (Qwen3-0.6B: 1024; its MLP's 3072 = 3 x 1024)
PREFIX = "hadamard"  # the inserted nodes' and initializers' names start with it


def hadamard(size: int) -> np.ndarray:
    """The normalised Sylvester-Hadamard matrix (size a power of two): symmetric and orthogonal."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"a Sylvester-Hadamard matrix needs a power of two, not {size}")
    matrix = np.ones((1, 1))
    while matrix.shape[0] < size:
        matrix = np.block([[matrix, matrix], [matrix, -matrix]])
    normalised: np.ndarray = (matrix / np.sqrt(size)).astype(np.float32)
    return normalised


def block_size(width: int) -> int:
    """The largest power of two <= MAX_BLOCK that divides `width`."""
    block = MAX_BLOCK
    while width % block:
        block //= 2
    return block


def factors(block: int) -> tuple[int, int]:
    """b1 >= b2, both powers of two, b1 * b2 = block, as equal as they can be."""
    small = 1 << (block.bit_length() - 1) // 2
    return block // small, small


def rotate_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """R^T W for the R of the module docstring ([K, N] weight, K a multiple of block)."""
    rows, columns = weight.shape
    first, second = factors(block)
    blocks = weight.astype(np.float64).reshape(rows // block, first, second, columns)
    left = np.einsum("ia,kabn->kibn", hadamard(first).astype(np.float64), blocks, optimize=True)
    both = np.einsum("jb,kibn->kijn", hadamard(second).astype(np.float64), left, optimize=True)
    result: np.ndarray = both.reshape(rows, columns).astype(np.float32)
    return result


def rotate_inputs(model: onnx.ModelProto, exclude: list[str]) -> tuple[list[dict[str, object]], list[str]]:
    """Rotate every input of the MatMuls a recipe quantizes (a constant weight, not `exclude`); in
    place. Returns one report row per input (its readers and block) and the names of the inserted
    MatMuls whose second input is a constant (the rotation's own: they stay fp32, the caller
    excludes them from quantization)."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    readers_of = GraphIndex(graph).consumers
    position = {id(node): index for index, node in enumerate(graph.node)}
    added: dict[int, list[onnx.NodeProto]] = {}  # before which node (id) the rotation goes
    rows: list[dict[str, object]] = []
    constant_matmuls: list[str] = []
    for index, (source, readers) in enumerate(matmuls_by_input(graph, set(exclude)).items()):
        if any(len(readers_of[reader.input[1]]) != 1 for reader in readers):
            continue  # a weight another node reads (tied) cannot be rotated for one reader
        width = int(inits[readers[0].input[1]].dims[0])
        block = block_size(width)
        first, second = factors(block)
        name = f"{PREFIX}{index}"
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.array([-1, first, second], dtype=np.int64), f"{name}_blocks"),
                numpy_helper.from_array(hadamard(first), f"{name}_h_left"),
                numpy_helper.from_array(hadamard(second), f"{name}_h_right"),
            ]
        )
        nodes = [
            helper.make_node("Shape", [source], [f"{name}_shape"], name=f"{name}_shape"),
            helper.make_node("Reshape", [source, f"{name}_blocks"], [f"{name}_x"], name=f"{name}_x"),
            helper.make_node("MatMul", [f"{name}_x", f"{name}_h_right"], [f"{name}_xh"], name=f"{name}_right"),
            helper.make_node("MatMul", [f"{name}_h_left", f"{name}_xh"], [f"{name}_hxh"], name=f"{name}_left"),
            helper.make_node("Reshape", [f"{name}_hxh", f"{name}_shape"], [f"{name}_out"], name=f"{name}_out"),
        ]
        constant_matmuls.append(f"{name}_right")
        first_reader = min(readers, key=lambda node: position[id(node)])
        added[id(first_reader)] = nodes
        for reader in readers:
            reader.input[0] = f"{name}_out"
            weight = inits[reader.input[1]]
            weight.CopyFrom(numpy_helper.from_array(rotate_weight(numpy_helper.to_array(weight), block), weight.name))
        rows.append({"input": source, "matmuls": [reader.name for reader in readers], "block": block})
    ordered = [new for node in graph.node for new in [*added.get(id(node), []), node]]
    del graph.node[:]
    graph.node.extend(ordered)
    return rows, constant_matmuls
