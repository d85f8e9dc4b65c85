"""Hadamard rotations of the quantized MatMul inputs: the `int8` recipe's answer to outlier
channels that no fold removes.

Why (docs/variants.md, the int8 judge): on a trained model the outlier channels sit in every kind of
MatMul input, and SmoothQuant's migration (omnivoice_export.step56_variants.smoothing) can only move
part of them into the weights (past its best alpha the weights lose the resolution the activations
gain); on the trained judge smoothing alone stayed under the bar however many MatMuls the budget
kept fp32, and smoothing followed by rotations passed it with none. For an orthogonal R,
x W = (x R)(R^T W): each MatMul that reads x reads x R instead and stores R^T W (quantized as any
weight). A Hadamard R spreads every channel over the b channels of its block, so an outlier channel
no longer sets the per-row int8 scale of the whole row (QuaRot, Ashkboos et al. 2024).

R = blockdiag(H, ..., H) over K / b blocks, H the normalised Sylvester-Hadamard matrix of the largest
power of two b <= MAX_BLOCK that divides K (symmetric: R^T = R). Where it runs, by input:
- "heads": attention's output (o_proj's input) is linear in v within each head, so rotating every
  head's channels (b = head_dim) is folded offline: v_proj's output columns by R, o_proj's rows by
  R^T (the query heads that share a kv head read the same rotated channels). No runtime cost.
- "online": the others (an RMSNorm's output, read by q/k/v or gate/up; down_proj's input
  silu(gate) * up; any input whose graph has no such fold) commute with no offline R once smoothing
  has divided them by its scales, so R runs in the graph before their readers: x reshaped to
  [rows * K / b, b], one MatMul by H, reshaped back. Carrying the residual stream rotated (QuaRot's
  offline form for the norm outputs) gives up smoothing's scales on those inputs: on the judge it
  scored lower than smoothing then this online R.
In fp32 the rotated graph computes the same function in another float order: not the same bits (a
test holds its argmax and its logits' relative error on the captured calls), unlike smoothing's
power-of-two folds.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from omnivoice_export.step56_variants import smoothing
from omnivoice_export.step56_variants.fusion import GraphIndex
from omnivoice_export.step56_variants.rowwise import matmuls_by_input

# The online block: one GEMM by a b x b matrix costs b multiply-adds per element, and on the judge
# b = 64 agreed with fp32 as well as b = 1,024 (docs/variants.md): spreading an outlier over 64
# channels is enough once smoothing has divided it down.
MAX_BLOCK = 64
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


def rotate_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """R^T W for the R of the module docstring ([K, N] weight, K a multiple of block)."""
    rows, columns = weight.shape
    blocks = weight.astype(np.float64).reshape(rows // block, block, columns)
    rotated = np.einsum("ab,kbn->kan", hadamard(block).astype(np.float64), blocks, optimize=True)
    result: np.ndarray = rotated.reshape(rows, columns).astype(np.float32)
    return result


def rotate_columns(weight: np.ndarray, block: int) -> np.ndarray:
    """W R ([K, N] weight, N a multiple of block): a producer's output columns rotated."""
    return np.ascontiguousarray(rotate_weight(weight.T, block).T)


def _store(inits: dict[str, onnx.TensorProto], name: str, value: np.ndarray) -> None:
    inits[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))


def _weight(inits: dict[str, onnx.TensorProto], node: onnx.NodeProto) -> np.ndarray:
    return numpy_helper.to_array(inits[node.input[1]])


def rotate_inputs(model: onnx.ModelProto, exclude: list[str]) -> tuple[list[dict[str, object]], list[str]]:
    """Rotate every input of the MatMuls a recipe quantizes (a constant weight, not `exclude`), each
    where the module docstring says; in place. Returns one report row per input (its readers, block
    and how) and the names of the inserted MatMuls (a constant second input: they stay fp32, the
    caller excludes them from quantization)."""
    graph = model.graph
    index = GraphIndex(graph)
    inits = index.initializers
    nodes = list(graph.node)  # held, so that the ids below stay these nodes' while the graph is edited
    position = {id(node): number for number, node in enumerate(nodes)}
    added: dict[int, list[onnx.NodeProto]] = {}  # before which node (id) a rotation goes
    rows: list[dict[str, object]] = []
    inserted: list[str] = []
    done: set[str] = set()
    for site in smoothing.find_sites(model, exclude):
        head_dim = site.head_dim or 0
        if site.kind != "v_proj" or site.fold_node is None or head_dim & (head_dim - 1):
            continue
        _store(inits, site.fold_node.input[1], rotate_columns(_weight(inits, site.fold_node), head_dim))
        for reader in site.readers:
            _store(inits, reader.input[1], rotate_weight(_weight(inits, reader), head_dim))
        rows.append({"input": site.input, "matmuls": [r.name for r in site.readers], "block": head_dim, "how": "heads"})
        done.add(site.input)
    for source, readers in matmuls_by_input(graph, set(exclude)).items():
        if source in done or any(len(index.consumers[reader.input[1]]) != 1 for reader in readers):
            continue  # rotated per head; or a weight another node reads (tied) cannot be rotated for one reader
        block = block_size(int(inits[readers[0].input[1]].dims[0]))
        name, shape, matrix = f"{PREFIX}{len(inserted)}", f"{PREFIX}_blocks{block}", f"{PREFIX}_h{block}"
        if matrix not in inits:  # one H and one shape per block size, shared by its rotations
            graph.initializer.extend(
                [
                    numpy_helper.from_array(np.array([-1, block], dtype=np.int64), shape),
                    numpy_helper.from_array(hadamard(block), matrix),
                ]
            )
            inits[matrix] = graph.initializer[-1]
        first_reader = min(readers, key=lambda node: position[id(node)])
        added[id(first_reader)] = [
            helper.make_node("Shape", [source], [f"{name}_shape"], name=f"{name}_shape"),
            helper.make_node("Reshape", [source, shape], [f"{name}_x"], name=f"{name}_x"),
            helper.make_node("MatMul", [f"{name}_x", matrix], [f"{name}_xh"], name=f"{name}_matmul"),
            helper.make_node("Reshape", [f"{name}_xh", f"{name}_shape"], [f"{name}_out"], name=f"{name}_out"),
        ]
        inserted.append(f"{name}_matmul")
        for reader in readers:
            reader.input[0] = f"{name}_out"
            _store(inits, reader.input[1], rotate_weight(_weight(inits, reader), block))
        rows.append({"input": source, "matmuls": [r.name for r in readers], "block": block, "how": "online"})
    del graph.node[:]
    graph.node.extend(new for node in nodes for new in [*added.get(id(node), []), node])
    return rows, inserted
