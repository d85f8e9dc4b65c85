"""The bundle describes itself: onnx/README.md (a model card) and the licences it inherits.

Whoever copies an export folder copies terms with it: upstream OmniVoice's code is Apache-2.0, the
OmniVoice weights are CC-BY-NC-4.0 (non-commercial), and the Higgs audio tokenizer inside the
checkpoint has its own licence file. The export records them, so no one has to guess:

- provenance(model_path) reads what the checkpoint declares: the `license:` of its README.md
  YAML header (Hugging Face's model-card convention), else a `license` key of its config.json;
  a tiny / full-random build of omnivoice_export.step0_checkpoints.builder holds random weights and no trained
  ones, and says so (licence "other"). Licence files in the checkpoint and in its
  audio_tokenizer/ are copied into the bundle (copy_licence_files).
- The graphs' metadata gets `license` and `source` (omnivoice_export.step2_export.exporting.graph_metadata).
- The report records the provenance; write(onnx_dir, report) renders README.md from the report
  and the folder alone (files, variants, verdicts, licences), and omnivoice_export.step2_export.report calls
  it on every report write, so the card never describes an older state than the report.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from omnivoice_export.step0_checkpoints.builder import BUILD_STAMP
from omnivoice_onnx.bundle import MODEL_CARD_FILE, RUNTIME_CONFIG_FILE, TOKENIZER_FILE
from omnivoice_onnx.contract import CONTRACTS, GRAPH_FILES, variants_present
from omnivoice_onnx.files import atomic_path

BASE_MODEL = "k2-fsa/OmniVoice"
UNKNOWN_LICENSE = "other"  # the hub's value for a licence outside its list, or one not declared
UPSTREAM_CODE_LICENSE = "Apache-2.0"  # k2-fsa/OmniVoice's code (and this project's: LICENSE)
LICENSE_NAME = re.compile(r"(?i)^(licen[cs]e|copying)([._-].*)?$")
# Where a copied licence file goes in the bundle: the checkpoint's own, and its audio tokenizer's.
LICENSE_SOURCES = {"": "checkpoint-", "audio_tokenizer": "audio_tokenizer-"}
HF_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]+)")
REPORT_FILE_NOTE = (
    "export-report.json",
    "provenance, sha256 of every file, and every check's verdict (export self-checks, parity, end to end, variants)",
)


def _yaml_license(readme: Path) -> str | None:
    try:
        text = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    header = re.match(r"---\r?\n(.*?)\r?\n---", text, re.S)
    found = re.search(r"^license:\s*['\"]?([^'\"\s]+)", header.group(1), re.M) if header else None
    return found.group(1) if found else None


def provenance(model_path: Path) -> dict[str, Any]:
    """What the checkpoint at `model_path` declares about itself, for the report, the graphs'
    metadata and the card: license (a hub licence id), license_from (where that was read, or why
    it is unknown), source (where the weights came from, without this machine's paths),
    random_weights, and the licence files it ships (relative paths)."""
    model_path = Path(model_path)
    license_files = [
        str(file.relative_to(model_path))
        for folder in LICENSE_SOURCES
        if (model_path / folder).is_dir()
        for file in sorted((model_path / folder).iterdir())
        if file.is_file() and LICENSE_NAME.match(file.name)
    ]
    stamp = model_path / BUILD_STAMP
    if stamp.is_file():
        build = json.loads(stamp.read_text())
        what = (
            f"random-weight {build.get('checkpoint')} checkpoint "
            f"(omnivoice_export.step0_checkpoints.builder, seed {build.get('seed')})"
        )
        return {
            "license": UNKNOWN_LICENSE,
            "random_weights": True,
            "source": what,
            "license_files": license_files,
            "license_from": f"none inherited: a {what} holds no trained weights (it speaks noise)",
        }
    snapshot = HF_SNAPSHOT.search(model_path.resolve().as_posix())
    source = (
        f"huggingface.co/{snapshot['org']}/{snapshot['name']} @ {snapshot['rev'][:12]}"
        if snapshot
        else f"local checkpoint '{model_path.name}'"
    )
    declared = _yaml_license(model_path / "README.md")
    license_from = "declared by the checkpoint's README.md (license: in its YAML header)"
    if declared is None:
        try:
            declared = json.loads((model_path / "config.json").read_text()).get("license")
        except (OSError, ValueError, AttributeError):
            declared = None
        license_from = "declared by the checkpoint's config.json (license)"
    if not isinstance(declared, str) or not declared:
        declared, license_from = (
            UNKNOWN_LICENSE,
            (
                "unknown: the checkpoint declares no licence (no license: in a "
                "README.md header, none in config.json); check where it came from"
            ),
        )
    return {
        "license": declared.lower(),
        "random_weights": False,
        "source": source,
        "license_files": license_files,
        "license_from": license_from,
    }


def copy_licence_files(model_path: Path, onnx_dir: Path, found: list[str]) -> list[str]:
    """Copy the checkpoint's licence files (provenance()["license_files"]) into the bundle as
    checkpoint-<name> / audio_tokenizer-<name>; returns the bundle's file names."""
    copied = []
    for relative in found:
        folder, _, name = relative.rpartition("/")
        target = Path(onnx_dir) / f"{LICENSE_SOURCES[folder]}{name}"
        with atomic_path(target) as tmp:
            shutil.copyfile(Path(model_path) / relative, tmp)
        copied.append(target.name)
    return copied


def _mib(entries: dict[str, Any]) -> str:
    return f"{sum(e.get('bytes', 0) for e in entries.values()) / 2**20:.1f}"


def _verdict(section: Any) -> str:
    if not isinstance(section, dict) or not section:
        return "not run"
    return "; ".join(
        f"{provider}: {entry.get('verdict')}" for provider, entry in section.items() if isinstance(entry, dict)
    )


def render(onnx_dir: Path, report: dict[str, Any]) -> str:
    """README.md's text for the bundle `onnx_dir` whose export report is `report`."""
    onnx_dir = Path(onnx_dir)
    prov = report.get("provenance") or {}
    licence = prov.get("license", UNKNOWN_LICENSE)
    fingerprint = (report.get("model") or {}).get("fingerprint", "unknown")
    graphs = report.get("graphs") or {}
    variants = report.get("variants") or {}
    lines = [
        "---",
        f"license: {licence}",
        f"base_model: {BASE_MODEL}",
        "pipeline_tag: text-to-speech",
        "library_name: onnx",
        "tags:",
        "- onnx",
        "- text-to-speech",
        "- omnivoice",
        "---",
        "",
        f"# OmniVoice, exported to ONNX (model {fingerprint})",
        "",
    ]
    if prov.get("random_weights"):
        lines += [
            f"**Random weights.** This bundle was exported from a {prov.get('source')}: it speaks noise, "
            "by design (it exists to prove the export and runtime). Real speech needs the real checkpoint "
            f"({BASE_MODEL}).",
            "",
        ]
    lines += [
        f"Source: {prov.get('source', 'not recorded')}. Exported by this project's exporter "
        "(export_omnivoice.py); run by the torch-free runtime `omnivoice-onnx` (numpy + onnxruntime).",
        "",
        "## Files",
        "",
        "| file | what it is | MiB |",
        "|---|---|---|",
    ]
    for graph, name in GRAPH_FILES.items():
        if graph in graphs:
            lines.append(
                f"| {name} (+ {name}.data) | the {graph}: `{CONTRACTS[graph].summary}` | "
                f"{_mib(graphs[graph].get('files') or {})} |"
            )
    assets = report.get("runtime_assets") or {}
    notes = {
        TOKENIZER_FILE: "the text tokenizer (the backend upstream loads)",
        RUNTIME_CONFIG_FILE: "languages, instruct items and generation defaults the runtime needs",
    }
    for name, note in notes.items():
        if name in assets:
            lines.append(f"| {name} | {note} | {_mib({name: assets[name]})} |")
    lines.append(f"| {REPORT_FILE_NOTE[0]} | {REPORT_FILE_NOTE[1]} | |")
    for name in sorted(
        p.name for p in onnx_dir.iterdir() if p.is_file() and p.name.startswith(tuple(LICENSE_SOURCES.values()))
    ):
        lines.append(f"| {name} | a licence file copied from the checkpoint | |")
    present = variants_present(onnx_dir)
    lines += [
        "",
        "## Variants",
        "",
        "The transformer in each variant folder is used with the fp32 codec graphs "
        "above (`omnivoice-onnx speak --variant NAME`; quantize_omnivoice.py makes them).",
        "",
        "| variant | MiB | parity | end to end |",
        "|---|---|---|---|",
        f"| fp32 (the export) | {_mib((graphs.get('transformer') or {}).get('files') or {})} | "
        f"{_verdict(report.get('parity'))} | {_verdict(report.get('end_to_end'))} |",
    ]
    for name in present:
        entry = variants.get(name)
        if isinstance(entry, dict):
            lines.append(
                f"| {name}/ | {_mib(entry.get('files') or {})} | {_verdict(entry.get('parity'))} | "
                f"{_verdict(entry.get('end_to_end'))} |"
            )
    lines += [
        "",
        "Verdicts come from export-report.json: parity_check.py (each graph against PyTorch on the "
        "captured inputs, step 3) and infer_onnx.py (generate() end to end, tokens and audio, step 4); a "
        'quantized variant\'s are measurements, not parity verdicts. "not run" means the step has not '
        "run on this export.",
        "",
        "## How to run",
        "",
        "```bash",
        "pip install <the omnivoice_export repository>   # installs the runtime `omnivoice-onnx` (no torch)",
        "omnivoice-onnx info --model-dir .                # this card's facts, read from the files",
        'omnivoice-onnx speak "Hello there." --model-dir . --out hello.wav',
        'omnivoice-onnx voice add me --ref-audio me.wav --ref-text "What me.wav says." --model-dir .',
        "```",
        "",
        "## Licences this bundle inherits",
        "",
        f"- **Code**: upstream OmniVoice ({BASE_MODEL}) is {UPSTREAM_CODE_LICENSE}; the exporter and the runtime "
        f"that made and run this bundle are {UPSTREAM_CODE_LICENSE} too.",
        f"- **Weights** (the graphs' initializers): `{licence}`, {prov.get('license_from', 'not recorded')}. "
        f"The real {BASE_MODEL} weights are CC-BY-NC-4.0: non-commercial use only.",
        "- **Audio tokenizer** (higgs_encoder / higgs_decoder): the Higgs audio tokenizer inside the checkpoint "
        "has its own licence; "
        + (
            "its licence file is copied here: "
            + ", ".join(
                f"`{LICENSE_SOURCES['audio_tokenizer']}{Path(f).name}`"
                for f in prov.get("license_files", [])
                if f.startswith("audio_tokenizer/")
            )
            if any(f.startswith("audio_tokenizer/") for f in prov.get("license_files", []))
            else "this checkpoint's audio_tokenizer/ holds no licence file to copy: check the terms where the "
            "checkpoint came from."
        ),
        "- **Use**: upstream forbids using the model for unauthorised voice cloning, impersonation, fraud, "
        "scams or any other illegal or unethical purpose; users must comply with local laws and ethical "
        "standards, and upstream's developers accept no liability for misuse. Clone only voices you have "
        "the right to use.",
        "",
    ]
    return "\n".join(lines)


def write(onnx_dir: Path, report: dict[str, Any]) -> Path:
    """(Re)write onnx/README.md from `report` and the folder's contents, atomically -> its path."""
    path = Path(onnx_dir) / MODEL_CARD_FILE
    with atomic_path(path) as tmp:
        tmp.write_text(render(onnx_dir, report), encoding="utf-8")
    return path
