"""The bundle's files checked against export-report.json before the runtime uses them.

A damaged graph sidecar loads and runs: zeroed weights of the default fp32-fused graph, or of an
fp32 codec, gave audio with exit 0, and step 6 measured nothing wrong (issue 26). The export and
step 5 record every file they write as {sha256, bytes} in the report; `verify_bundle` hashes each
file OmniVoiceOnnx.from_dir is about to load (the transformer of the chosen variant, both codec
graphs, each with its sidecar, tokenizer.json and runtime-config.json) once, at load, and names
the step that remakes a file that differs: the export's own files `re-run export_omnivoice.py`,
a variant's `run quantize_omnivoice.py --variants NAME`.

Cost: one read of every file loaded (at the real dims ~3 GB, a few seconds at disk speed; tiny:
see the log, Run 26B); a server pays it once. A bundle without a report (assembled by hand, a
port's test folder) is refused unless the check is skipped, with from_dir(..., verify=False) or
OMNIVOICE_VERIFY=0 in the environment; the graphs' metadata and runtime-config.json's values are
checked either way (api.py, prompt.load_runtime_config).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omnivoice_onnx.contract import FP32_VARIANT, GRAPH_FILES, REPORT_FILE, variant_dir
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import FILE_ENTRY_SCHEMA, Each, confined, matches_entry, read_json, schema_problem
from omnivoice_onnx.prompt import RUNTIME_CONFIG_FILE, TOKENIZER_FILE

VERIFY_ENV = "OMNIVOICE_VERIFY"  # "0": skip the sha256 check (verify=False for every from_dir)
RERUN_EXPORT = "re-run export_omnivoice.py into an empty folder"
SKIP = f"or load it unchecked with from_dir(..., verify=False) / {VERIFY_ENV}=0"
# What the runtime reads of the report: the files of each graph, the runtime assets, the variants.
REPORT_FILES_SCHEMA = {"graphs": Each({"files": Each(FILE_ENTRY_SCHEMA)}),
                       "runtime_assets": Each(FILE_ENTRY_SCHEMA)}
VARIANT_SCHEMA = {"dir": str, "files": Each(FILE_ENTRY_SCHEMA)}


def verify_requested(verify: Any) -> bool:
    """Whether from_dir checks sha256: its `verify` (a bool), unless $OMNIVOICE_VERIFY is "0"."""
    if not isinstance(verify, bool):
        raise UserError(f"verify must be True or False, got {type(verify).__name__} {verify!r:.40}",
                        "pass verify=False only for a bundle without export-report.json")
    return verify and os.environ.get(VERIFY_ENV, "").strip() != "0"


def expected_files(onnx_dir: Path, variant: str) -> list[tuple[Path, dict[str, Any], str]]:
    """(path, {sha256, bytes}, fix) of every file from_dir loads for `variant`, from the report."""
    onnx_dir = Path(onnx_dir)
    path = onnx_dir / REPORT_FILE
    report = read_json(path, "export report", f"{RERUN_EXPORT}, {SKIP}")
    problem = schema_problem(report, REPORT_FILES_SCHEMA)
    if problem:  # a report of an earlier version (no runtime_assets), or a hand edit
        raise UserError(f"export report {path} is malformed: {problem}", f"{RERUN_EXPORT}, {SKIP}")
    graphs = ["encoder", "decoder"] + (["transformer"] if variant == FP32_VARIANT else [])
    files = []
    for graph in graphs:
        entry = report["graphs"].get(graph)
        if entry is None:
            raise UserError(f"export report {path} lists no {graph} graph", RERUN_EXPORT)
        files += [(confined(onnx_dir, name, f"export report {path}", RERUN_EXPORT), info, RERUN_EXPORT)
                  for name, info in entry["files"].items() if name.startswith(GRAPH_FILES[graph])]
    for name in (TOKENIZER_FILE, RUNTIME_CONFIG_FILE):
        if name not in report["runtime_assets"]:
            raise UserError(f"export report {path} lists no {name}", RERUN_EXPORT)
        files.append((onnx_dir / name, report["runtime_assets"][name], RERUN_EXPORT))
    if variant != FP32_VARIANT:
        fix = f"run quantize_omnivoice.py --variants {variant}"
        entry = report.get("variants", {}).get(variant) if isinstance(report.get("variants"), dict) else None
        if entry is None:
            raise UserError(f"export report {path} does not list variant {variant!r} (a folder left from an earlier "
                            "export, or made by hand?)", fix)
        problem = schema_problem(entry, VARIANT_SCHEMA, f"variants.{variant}")
        if problem:
            raise UserError(f"export report {path} is malformed: {problem}", fix)
        files += [(confined(variant_dir(onnx_dir, variant), name, f"export report {path}", fix), info, fix)
                  for name, info in entry["files"].items()]
    return files


def verify_bundle(onnx_dir: Path, variant: str) -> None:
    """Every file from_dir loads for `variant` is the one the report lists (size, then sha256)."""
    for path, info, fix in expected_files(onnx_dir, variant):
        if not path.is_file():
            raise UserError(f"{path} is missing", fix)
        if not matches_entry(path, info):
            raise UserError(f"{path} does not match the sha256 export-report.json records for it (damaged, "
                            "replaced or from another export)", fix)
