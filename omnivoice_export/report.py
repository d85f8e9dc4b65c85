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

from omnivoice_export.cli import UserError, read_json, write_json_atomic

REPORT_NAME = "export-report.json"
REPORT_FORMAT = 1
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
    if not isinstance(report, dict) or report.get("format") != REPORT_FORMAT or "graphs" not in report:
        raise UserError(f"export report {report_path(onnx_dir)} is malformed or from another version",
                        "re-run export_omnivoice.py (step 2)")
    return report


def merge_section(onnx_dir: Path, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """Set report[path[0]][path[1]]... = value, keeping every other section; atomic write."""
    report = load_report(onnx_dir)
    node = report
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    write_json_atomic(report_path(onnx_dir), report)
    return report
