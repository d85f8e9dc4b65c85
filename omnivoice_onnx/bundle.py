"""What an export folder (a bundle) says about itself, read without loading any graph.

`omnivoice-onnx info` and `omnivoice-onnx voice` need a graph's metadata (model fingerprint,
licence, variant) but not its weights: opening an onnxruntime session on the real transformer
takes ~6 s and ~2.5 GB, and the `onnx` package is not a runtime dependency. metadata_props()
reads them from the .onnx protobuf (omnivoice_onnx.graphmeta; the weights are in the sidecar).

Licence: each graph's metadata carries `license` and `source` (omnivoice_export.exporting
graph_metadata); the bundle's README.md (the model card) repeats them in its YAML header.
"""

from __future__ import annotations

import re
from pathlib import Path

from omnivoice_onnx.contract import GRAPH_FILES
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.graphmeta import read_metadata_props

MODEL_CARD_FILE = "README.md"


def metadata_props(path: Path) -> dict[str, str]:
    """An ONNX graph's metadata_props, read from its .onnx file alone (omnivoice_onnx.graphmeta);
    a UserError naming the file when it cannot be read or is not an ONNX graph."""
    path = Path(path)
    try:
        return read_metadata_props(path)
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror})", "pass an export folder (export_omnivoice.py)") from exc
    except (ValueError, UnicodeDecodeError) as exc:
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
        raise UserError(
            f"{path} has no model_fingerprint metadata: not an OmniVoice export", "re-run export_omnivoice.py"
        )
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
