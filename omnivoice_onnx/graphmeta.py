"""Read an ONNX graph's metadata_props from its .onnx file, without the onnx package and without
loading weights or a session.

Why: the toolchain read them with `onnx.load(..., load_external_data=False)`. In a runtime-only
venv the onnx package is absent, and `import onnx` run from the repository then imports the
export folder `onnx/` as an empty namespace package, so the check failed with a misleading
"is not a readable ONNX graph (AttributeError)". The metadata are one repeated field of the
ModelProto message; reading them is a few lines of protobuf wire format, which a C# or mobile
port can do the same way (or with its own protobuf library).

ModelProto (onnx.proto): field 14 `metadata_props`, repeated StringStringEntryProto {1: key,
2: value}. Every other field is skipped by its wire type; the weights live in the sidecar file
(external data) and are never read.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

METADATA_PROPS_FIELD = 14  # ModelProto.metadata_props
GRAPH_FIELD = 7  # ModelProto.graph: every model has one
KEY_FIELD, VALUE_FIELD = 1, 2  # StringStringEntryProto
VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5  # protobuf wire types


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a message: ints for VARINT/FIXED, bytes for LENGTH_DELIMITED."""
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        value: int | bytes
        if wire == VARINT:
            value, pos = _varint(data, pos)
        elif wire in (FIXED64, FIXED32):
            size = 8 if wire == FIXED64 else 4
            value, pos = int.from_bytes(data[pos : pos + size], "little"), pos + size
        elif wire == LENGTH_DELIMITED:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(data) or number == 0:
            raise ValueError("truncated or malformed protobuf message")
        yield number, wire, value


def read_metadata_props(path: str | Path) -> dict[str, str]:
    """A graph's metadata_props as a dict; ValueError for a file that is not an ONNX ModelProto
    (malformed protobuf, or no graph field: an empty file parses as an empty message)."""
    props: dict[str, str] = {}
    has_graph = False
    for number, wire, value in _fields(Path(path).read_bytes()):
        has_graph |= number == GRAPH_FIELD and wire == LENGTH_DELIMITED
        # a LENGTH_DELIMITED value is the bytes, every other wire type's an int
        if number == METADATA_PROPS_FIELD and isinstance(value, bytes):
            entry = {n: v for n, _, v in _fields(value) if isinstance(v, bytes)}
            props[entry.get(KEY_FIELD, b"").decode("utf-8")] = entry.get(VALUE_FIELD, b"").decode("utf-8")
    if not has_graph:
        raise ValueError("no graph in it: not an ONNX model")
    return props
