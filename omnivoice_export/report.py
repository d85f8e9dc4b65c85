"""Provenance and `onnx/export-report.json`.

The report is what users read after export and after each parity / end-to-end run. Every stage
merges its own section into it with an atomic write, so a run for one provider never erases
another's and an interrupted update leaves the previous report intact.
"""

from __future__ import annotations

import importlib.metadata
import platform
from pathlib import Path
from typing import Any

from omnivoice_export import capture
from omnivoice_export.checkpoints import sha256_file
from omnivoice_export.cli import UserError, read_json, write_json_atomic
from omnivoice_export.ort_runtime import read_graph_metadata

REPORT_NAME = "export-report.json"
REPORT_FORMAT = 1
REEXPORT_FIX = "re-run export_omnivoice.py (step 2)"
_PACKAGES = ("torch", "transformers", "omnivoice", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu", "numpy")


def package_versions() -> dict[str, str]:
    """Versions of the packages whose behaviour the artefacts depend on (absent ones omitted)."""
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def report_path(onnx_dir: Path) -> Path:
    return Path(onnx_dir) / REPORT_NAME


def load_report(onnx_dir: Path) -> dict[str, Any]:
    """The export report, or a UserError that says to re-run the export."""
    report = read_json(report_path(onnx_dir), "export report", "run export_omnivoice.py (step 2) first")
    try:
        well_formed = report["format"] == REPORT_FORMAT and isinstance(report["model"]["fingerprint"], str) and all(
            isinstance(entry["files"], dict) and {"file", "exporter", "opset"} <= entry.keys()
            for entry in report["graphs"].values())
    except (KeyError, TypeError, AttributeError):
        well_formed = False
    if not well_formed:
        raise UserError(f"export report {report_path(onnx_dir)} is malformed or from another version", REEXPORT_FIX)
    return report


def check_graph_metadata(path: Path, graph: str, entry: dict[str, Any], fingerprint: str) -> None:
    """The graph's own metadata_props name the exporter, opset and model the report says.

    Catches a graph copied in from another export (another opset, the legacy exporter, another
    model) with a name that error messages can act on; sha256 alone would only say "differs".
    """
    try:
        meta = read_graph_metadata(path)
    except Exception as exc:  # onnx raises protobuf DecodeError and others for a non-ONNX file
        raise UserError(f"{path} is not a readable ONNX graph ({type(exc).__name__})", REEXPORT_FIX) from exc
    found = (meta.get("graph"), meta.get("exporter"), meta.get("opset"), meta.get("model_fingerprint"))
    said = (graph, entry["exporter"], str(entry["opset"]), fingerprint)
    if found != said:
        raise UserError(f"{path} is the {found[0]} graph by the {found[1]} exporter at opset {found[2]} of model "
                        f"{found[3]}, but the export report says {said[0]} by {said[1]} at opset {said[2]} of "
                        f"{said[3]} (copied from another export?)", REEXPORT_FIX)


def verify_graphs(onnx_dir: Path, export: dict[str, Any], graphs: list[str]) -> None:
    """Every file of `graphs` exists, carries the report's metadata and matches its sha256."""
    onnx_dir = Path(onnx_dir)
    for graph in graphs:
        entry = export["graphs"].get(graph)
        if entry is None:
            raise UserError(f"the export report has no {graph} graph", f"run export_omnivoice.py --graphs {graph}")
        for name in entry["files"]:
            if not (onnx_dir / name).is_file():
                raise UserError(f"{onnx_dir / name} is missing", REEXPORT_FIX)
        check_graph_metadata(onnx_dir / entry["file"], graph, entry, export["model"]["fingerprint"])
        for name, info in entry["files"].items():
            path = onnx_dir / name
            if path.stat().st_size != info["bytes"] or sha256_file(path) != info["sha256"]:
                raise UserError(f"{path} does not match the export report's sha256 (truncated, modified or from "
                                "another export)", REEXPORT_FIX)


def verify_against_capture(capture_dir: Path, onnx_dir: Path, graphs: list[str]) -> tuple[dict, dict]:
    """(manifest, report) once they are proven comparable: same model, the very capture the export
    was made from, and every capture and graph file as recorded.

    A capture re-made after the export (another seed, num_step, steps or modes; another device)
    is refused rather than compared: the report is the one provenance record, and results merged
    into it must describe the capture it names.
    """
    capture_dir = Path(capture_dir)
    manifest = capture.load_manifest(capture_dir)
    export = load_report(onnx_dir)
    if manifest["model"]["fingerprint"] != export["model"]["fingerprint"]:
        raise UserError(f"the capture is of model {manifest['model']['fingerprint']} but the export of "
                        f"{export['model']['fingerprint']}: they cannot be compared",
                        "re-run steps 1-2 with the same --model")
    recorded = export.get("capture", {}).get("manifest_sha256")
    if sha256_file(capture_dir / capture.MANIFEST_NAME) != recorded:
        raise UserError(f"the capture in {capture_dir} is not the one the export was made from (its manifest changed: "
                        f"seed {manifest.get('seed')}, num_step {manifest.get('num_step')}, "
                        f"modes {','.join(manifest['modes'])})",
                        "re-run export_omnivoice.py (step 2) on this capture, or pass the --capture-dir it was made from")
    verify_graphs(onnx_dir, export, graphs)
    return manifest, export


def merge_section(onnx_dir: Path, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """Set report[path[0]][path[1]]... = value, keeping every other section; atomic write."""
    report = load_report(onnx_dir)
    node = report
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    write_json_atomic(report_path(onnx_dir), report)
    return report
