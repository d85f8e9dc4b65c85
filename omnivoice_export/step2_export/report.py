"""Provenance and `onnx/export-report.json`: its schema, written and read here alone.

The report is what users read after export and after each parity / end-to-end run. The export
writes it whole (a new export makes earlier parity and end-to-end results stale); every later
stage merges its own section into it with an atomic write, so a run for one provider never erases
another's and an interrupted update leaves the previous report intact. Every write also
re-renders the bundle's model card (onnx/README.md, omnivoice_export.step2_export.model_card) from the report,
so the card's variants and verdicts are always the report's.

    format, model {path, fingerprint}, capture {dir, fingerprint, manifest_sha256}, versions,
    provenance         license, license_from, source, random_weights, license_files
                       (omnivoice_export.step2_export.model_card.provenance)
    local_only         the fields holding a path outside the project (absolute, meaningful on the
                       machine that built the export only); every other path is relative to the project
    graphs.<graph>     file, exporter, fallback_reason, opset, signature, export_seconds,
                       peak_rss_mb, checker, original_external_files, self_checks, files
    parity.<provider>  provider, verdict, thresholds, capture_device, seconds, graphs
    end_to_end.<provider>  provider, verdict, modes, thresholds, spectral, runtime (the torch-free
                       runtime's tokens against the capture: variant, verdict, token_match, modes)
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import os
import platform
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnivoice_export.common.edge import REPO_ROOT
from omnivoice_export.common.files import first_mismatch
from omnivoice_export.step2_export import model_card
from omnivoice_onnx.contract import GRAPH_FILES, REPORT_FILE
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import write_json_atomic

if TYPE_CHECKING:
    import onnx
from omnivoice_onnx.graphmeta import read_metadata_props
from omnivoice_onnx.hashing import FILE_ENTRY_SCHEMA, file_entry, sha256_file
from omnivoice_onnx.reading import Each, existing_file, read_artefact

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
    return Path(onnx_dir) / REPORT_FILE


_LOCKS_HELD: dict[str, int] = {}  # export folder -> nesting depth of report_lock in this process
_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def report_lock(onnx_dir: Path) -> Iterator[None]:
    """Hold the export folder's lock for a read-modify-write of its report; re-entrant within a process.

    Each stage merges its section by reading the report, changing it and writing it back: two runs
    at once (ten quantize_omnivoice.py processes into one onnx/, one recipe each) would each write
    back what they read and lose the other's entry (investigation log). The lock is flock(2) on the
    folder itself, so there is no lock file to leave behind, and the kernel releases it when its
    holder dies (kill -9). flock works on local file systems; on a network mount where it does not,
    run the stages one at a time.
    """
    key = os.path.realpath(onnx_dir)
    with _LOCKS_GUARD:
        nested = _LOCKS_HELD.get(key, 0) > 0
        _LOCKS_HELD[key] = _LOCKS_HELD.get(key, 0) + 1
    fd = None
    try:
        # A second flock on a new descriptor of the same folder would wait for this one. A missing
        # folder holds no report to race on: the caller's read of it says what is wrong.
        if not nested and os.path.isdir(key):
            fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock
        with _LOCKS_GUARD:
            _LOCKS_HELD[key] -= 1


@dataclass
class ExportResult:
    """What the report records for one graph's export."""

    graph: str
    opset: int
    exporter: str = ""  # "dynamo" | "legacy"
    fallback_reason: str | None = None
    seconds: float = 0.0
    peak_rss_mb: float = 0.0
    original_external_files: list[str] = field(default_factory=list)
    checker: str = ""
    self_checks: dict[str, Any] = field(default_factory=dict)


def graph_files(onnx_dir: Path, graph: str) -> dict[str, dict[str, Any]]:
    """The `files` entry of a graph: its .onnx and its sidecar, each as {sha256, bytes}."""
    name = GRAPH_FILES[graph]
    return {f: file_entry(Path(onnx_dir) / f) for f in (name, name + ".data")}


def graph_entry(result: ExportResult, signature: dict[str, Any], files: dict[str, Any]) -> dict[str, Any]:
    """A graph's section of the report."""
    return {
        "file": GRAPH_FILES[result.graph],
        "exporter": result.exporter,
        "fallback_reason": result.fallback_reason,
        "opset": result.opset,
        "signature": signature,
        "export_seconds": result.seconds,
        "peak_rss_mb": result.peak_rss_mb,
        "checker": result.checker,
        "original_external_files": {
            "count": len(result.original_external_files),
            "locations": result.original_external_files[:50],
        },
        "self_checks": result.self_checks,
        "files": files,
    }


def project_path(path: Path) -> tuple[str, bool]:
    """(how the report writes `path`, whether it is local-only): relative to the project when it
    lies inside it (checkpoints/tiny, capture), so a copied bundle names no build machine's
    directories; else absolute, and marked local-only by the caller (`local_only`)."""
    path = Path(path)
    for candidate in (path.absolute(), path.resolve()):  # a symlinked checkpoints/ is inside by its name
        try:
            return candidate.relative_to(REPO_ROOT).as_posix(), False
        except ValueError:
            continue
    return str(path.resolve()), True


def recorded_path(path: str) -> Path:
    """A path the report recorded (project_path), as a path to open: relative ones are the project's."""
    return REPO_ROOT / path if not Path(path).is_absolute() else Path(path)


def write_export_report(
    onnx_dir: Path,
    model_path: Path,
    fingerprint: str,
    capture_dir: Path,
    capture_fingerprint: str,
    manifest_sha256: str,
    versions: dict[str, str],
    graphs: dict[str, Any],
    runtime_assets: dict[str, Any],
    provenance: dict[str, Any],
) -> None:
    """Write a new report: the export's provenance (model_card.provenance), `graphs` and the
    runtime's files (tokenizer, runtime config: {name: {sha256, bytes}}); then the model card.
    Parity and end-to-end results describe the graphs they ran on; a new export makes them stale,
    so they are not kept."""
    model, model_local = project_path(model_path)
    capture, capture_local = project_path(capture_dir)
    data = {
        "format": REPORT_FORMAT,
        "model": {"path": model, "fingerprint": fingerprint},
        "capture": {"dir": capture, "fingerprint": capture_fingerprint, "manifest_sha256": manifest_sha256},
        "local_only": [
            field for field, local in (("model.path", model_local), ("capture.dir", capture_local)) if local
        ],
        "provenance": provenance,
        "versions": versions,
        "graphs": graphs,
        "runtime_assets": runtime_assets,
    }
    with report_lock(onnx_dir):  # not between another stage's read and write of its section
        write_json_atomic(report_path(onnx_dir), data)
        model_card.write(onnx_dir, data)


# What the stages read from a report (schema_problem's notation); parity and end-to-end sections
# are only ever written.
REPORT_SCHEMA = {
    "format": int,
    "model": {"path": str, "fingerprint": str},
    "capture": {"manifest_sha256": str},
    "graphs": Each({"file": str, "exporter": str, "opset": int, "files": Each(FILE_ENTRY_SCHEMA)}),
}


def _graph_problem(report: dict[str, Any]) -> str | None:
    """A graph entry that names another graph's files, or an unknown graph (a hand edit)."""
    for graph, entry in report["graphs"].items():
        if graph not in GRAPH_FILES:
            return f"graphs.{graph} is not one of {', '.join(GRAPH_FILES)}"
        name = GRAPH_FILES[graph]
        if entry["file"] != name or set(entry["files"]) != {name, name + ".data"}:
            return f"graphs.{graph} lists {sorted(entry['files'])}, not {name} and its {name}.data"
    return None


def entry_problems(entry: dict[str, Any]) -> list[str]:
    """Why a graph's export must not be used, one line each; empty when onnx.checker and every
    self-check passed. The export installs no graph with a problem; parity and end to end refuse
    one that a report of an earlier version recorded as failed."""
    problems = [] if entry.get("checker") == "ok" else [f"onnx.checker {entry.get('checker') or 'did not run'}"]
    checks = entry.get("self_checks") or {}
    failures = checks.get("failures") or []  # reports before the failures list: only `passed`
    if checks.get("passed") is not True and not failures:
        failures = ["its self-checks did not pass"]
    return problems + failures


def load_report(onnx_dir: Path) -> dict[str, Any]:
    """The export report, or a UserError that says what is wrong with it and to re-run the export."""
    return read_artefact(
        report_path(onnx_dir),
        "export report",
        "run export_omnivoice.py (step 2) first",
        REPORT_FORMAT,
        REPORT_SCHEMA,
        _graph_problem,
        stale_fix=REEXPORT_FIX,
    )


def read_graph_metadata(path: Path) -> dict[str, str]:
    """A graph's metadata_props, read from its .onnx alone (no weights, no session, and no onnx
    package: infer_onnx.py --text runs in a runtime-only venv, where `import onnx` would import the
    repository's onnx/ export folder as a namespace package; see omnivoice_onnx.graphmeta)."""
    return read_metadata_props(path)


def save_with_sidecar(model: onnx.ModelProto, dst: Path) -> None:
    """Save the onnx.ModelProto `model` as `dst` with every tensor over 1 KB in the one sidecar
    `dst.name + '.data'`: the two files a report entry names (graph_files)."""
    import onnx

    onnx.save_model(
        model,
        str(dst),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=dst.name + ".data",
        size_threshold=1024,
    )


def check_graph_metadata(path: Path, graph: str, entry: dict[str, Any], fingerprint: str) -> None:
    """The graph's own metadata_props name the exporter, opset and model the report says.

    Catches a graph copied in from another export (another opset, the legacy exporter, another
    model) with a name that error messages can act on; sha256 alone would only say "differs".
    """
    existing_file(path, f"the {graph} graph", REEXPORT_FIX)  # not found, a directory, permission denied
    try:
        meta = read_graph_metadata(path)
    except Exception as exc:  # onnx raises protobuf DecodeError and others for a non-ONNX file
        raise UserError(f"{path} is not a readable ONNX graph ({type(exc).__name__})", REEXPORT_FIX) from exc
    found = (meta.get("graph"), meta.get("exporter"), meta.get("opset"), meta.get("model_fingerprint"))
    said = (graph, entry["exporter"], str(entry["opset"]), fingerprint)
    if found != said:
        raise UserError(
            f"{path} is the {found[0]} graph by the {found[1]} exporter at opset {found[2]} of model "
            f"{found[3]}, but the export report says {said[0]} by {said[1]} at opset {said[2]} of "
            f"{said[3]} (copied from another export?)",
            REEXPORT_FIX,
        )


def verify_graphs(onnx_dir: Path, export: dict[str, Any], graphs: list[str]) -> None:
    """Every graph of `graphs` passed its export checks, and each of its files exists, carries the
    report's metadata and matches its sha256."""
    onnx_dir = Path(onnx_dir)
    for graph in graphs:
        entry = export["graphs"].get(graph)
        if entry is None:
            raise UserError(f"the export report has no {graph} graph", f"run export_omnivoice.py --graphs {graph}")
        for name in entry["files"]:
            if not (onnx_dir / name).is_file():
                raise UserError(f"{onnx_dir / name} is missing", REEXPORT_FIX)
        problems = entry_problems(entry)
        if problems:
            raise UserError(
                f"the export report says the {graph} graph failed its export checks ({problems[0]}): it is not used",
                REEXPORT_FIX,
            )
        check_graph_metadata(onnx_dir / entry["file"], graph, entry, export["model"]["fingerprint"])
        changed = first_mismatch((onnx_dir / name, info) for name, info in entry["files"].items())
        if changed is not None:
            raise UserError(
                f"{changed} does not match the export report's sha256 (truncated, modified or from another export)",
                REEXPORT_FIX,
            )


def verify_against_capture(
    capture_dir: Path, onnx_dir: Path, graphs: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, report) once they are proven comparable: same model, the very capture the export
    was made from, and every capture and graph file as recorded.

    A capture re-made after the export (another seed, num_step, steps or modes; another device)
    is refused rather than compared: the report is the one provenance record, and results merged
    into it must describe the capture it names.
    """
    from omnivoice_export.step1_capture import (
        capture,  # needs torch: kept out of synthesis's imports (infer_onnx.py --text)
    )

    capture_dir = Path(capture_dir)
    manifest = capture.load_manifest(capture_dir)
    export = load_report(onnx_dir)
    if manifest["model"]["fingerprint"] != export["model"]["fingerprint"]:
        raise UserError(
            f"the capture is of model {manifest['model']['fingerprint']} but the export of "
            f"{export['model']['fingerprint']}: they cannot be compared",
            "re-run steps 1-2 with the same --model",
        )
    recorded = export["capture"]["manifest_sha256"]
    if sha256_file(capture_dir / capture.MANIFEST_NAME) != recorded:
        raise UserError(
            f"the capture in {capture_dir} is not the one the export was made from (its manifest changed: "
            f"seed {manifest.get('seed')}, num_step {manifest.get('num_step')}, "
            f"modes {','.join(manifest['modes'])})",
            "re-run export_omnivoice.py (step 2) on this capture, or pass the --capture-dir it was made from",
        )
    verify_graphs(onnx_dir, export, graphs)
    return manifest, export


def write_parity(
    onnx_dir: Path,
    provider: str,
    verdict: str,
    thresholds: dict[str, float],
    capture_device: str,
    seconds: float,
    graphs: dict[str, Any],
) -> None:
    """Merge parity_check.py's results for `provider` into the report."""
    merge_section(
        onnx_dir,
        ("parity", provider),
        {
            "provider": provider,
            "verdict": verdict,
            "thresholds": thresholds,
            "capture_device": capture_device,
            "seconds": round(seconds, 2),
            "graphs": graphs,
        },
    )


def merge_section(onnx_dir: Path, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """Set report[path[0]][path[1]]... = value, keeping every other section; atomic write, under
    report_lock so that concurrent stages each keep the other's sections; then the model card."""
    with report_lock(onnx_dir):
        report = load_report(onnx_dir)
        node = report
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
        write_json_atomic(report_path(onnx_dir), report)
        model_card.write(onnx_dir, report)
    return report
