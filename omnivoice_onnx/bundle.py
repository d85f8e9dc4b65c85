"""What an export folder (a bundle) says about itself, read without loading any graph.

`omnivoice-onnx info` and `omnivoice-onnx voice` need a graph's metadata (model fingerprint,
licence, variant) but not its weights: opening an onnxruntime session on the real transformer
takes ~6 s and ~2.5 GB, and the `onnx` package is not a runtime dependency. metadata_props()
reads the metadata straight from the .onnx protobuf (the weights are in the sidecar, so the file
is a few MB) with a ~20-line wire-format walk.

Licence: each graph's metadata carries `license` and `source` (omnivoice_export.exporting
graph_metadata); the bundle's README.md (the model card) repeats them in its YAML header.
"""

from __future__ import annotations

import re
from pathlib import Path

from omnivoice_onnx.contract import GRAPH_FILES
from omnivoice_onnx.errors import UserError

MODEL_CARD_FILE = "README.md"
# ModelProto field numbers (onnx/onnx.proto3): metadata_props is `repeated StringStringEntryProto
# metadata_props = 14`, whose entries are `string key = 1; string value = 2`.
_METADATA_FIELD, _KEY_FIELD, _VALUE_FIELD = 14, 1, 2
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes):
    """(field number, value) of each field of one protobuf message: ints for varints, bytes for
    length-delimited fields; fixed-width fields are skipped (ModelProto's metadata needs none)."""
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        field, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            value, pos = _varint(data, pos)
            yield field, value
        elif wire == _LENGTH:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ValueError("a field runs past the end of the file")
            yield field, data[pos:pos + length]
            pos += length
        elif wire in (_FIXED64, _FIXED32):
            pos += 8 if wire == _FIXED64 else 4
        else:
            raise ValueError(f"wire type {wire} is not protobuf's")


def metadata_props(path: Path) -> dict[str, str]:
    """An ONNX graph's metadata_props, read from its .onnx file alone (no weights, no session)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror})", "pass an export folder (export_omnivoice.py)") from exc
    try:
        props = {}
        for field, value in _fields(data):
            if field == _METADATA_FIELD and isinstance(value, bytes):
                entry = dict(_fields(value))
                props[entry.get(_KEY_FIELD, b"").decode()] = entry.get(_VALUE_FIELD, b"").decode()
        return props
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not a readable ONNX graph ({exc})", "re-run export_omnivoice.py") from exc


def bundle_metadata(onnx_dir: Path) -> dict[str, str]:
    """The export's own transformer graph's metadata (fingerprint, licence, source, constants);
    a UserError when the folder holds no export."""
    path = Path(onnx_dir) / GRAPH_FILES["transformer"]
    if not path.is_file():
        raise UserError(f"{onnx_dir} holds no OmniVoice export ({path.name} not found)",
                        "pass the folder export_omnivoice.py wrote (--model-dir)")
    meta = metadata_props(path)
    if not meta.get("model_fingerprint"):
        raise UserError(f"{path} has no model_fingerprint metadata: not an OmniVoice export", "re-run export_omnivoice.py")
    return meta


def card_license(onnx_dir: Path) -> str | None:
    """The `license:` of the bundle's model card YAML header, if the card is there."""
    try:
        text = (Path(onnx_dir) / MODEL_CARD_FILE).read_text(encoding="utf-8")
    except OSError:
        return None
    header = re.match(r"---\n(.*?)\n---\n", text, re.S)
    found = re.search(r"^license:\s*(\S.*)$", header.group(1), re.M) if header else None
    return found.group(1).strip() if found else None
