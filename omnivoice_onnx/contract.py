"""The graph files of an export: one place that names them, for the toolchain and the runtime."""

from __future__ import annotations

GRAPH_FILES = {
    "transformer": "omnivoice_transformer.onnx",
    "encoder": "higgs_encoder.onnx",
    "decoder": "higgs_decoder.onnx",
}
GRAPH_NAMES = tuple(GRAPH_FILES)
