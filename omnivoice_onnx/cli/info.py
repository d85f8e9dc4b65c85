"""What a bundle (an export folder) holds: model, graphs, variants, languages, instruct items, licence, voices;
and the CPU it would run on, with the ISA flags its speed depends on (docs/performance.md).

    omnivoice-onnx info                 # the bundle in ./onnx
    omnivoice-onnx info path/to/onnx
    omnivoice-onnx info --languages     # every language id and its names

Read from the graphs' metadata (no session is opened), runtime-config.json, the export report
and the model card; each file is hashed (sha256, the first 12 hex digits shown; the export report
records the full ones). The licence is what the export recorded from the checkpoint: copying the
bundle copies its terms (see the bundle's README.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from omnivoice_onnx.bundle import MODEL_CARD_FILE, bundle_metadata, card_license, metadata_props
from omnivoice_onnx.cli.speak import DEFAULT_MODEL_DIR
from omnivoice_onnx.contract import FP32_VARIANT, GRAPH_FILES, REPORT_FILE, variant_path, variants_present
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import read_json, sha256_file
from omnivoice_onnx.hardware import isa_line
from omnivoice_onnx.prompt import language_names, load_runtime_config
from omnivoice_onnx.voices import list_voices, voices_dir

NO_LICENSE = "not recorded (exported before licences were recorded: re-run export_omnivoice.py)"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("info", help="what a bundle holds: model, graphs, variants, languages, licence",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", nargs="?", type=Path, default=DEFAULT_MODEL_DIR, metavar="DIR",
                        help="the export folder (default: onnx)")
    parser.add_argument("--model-dir", dest="model_dir_flag", type=Path, help="the same, as a flag (as in speak)")
    parser.add_argument("--languages", action="store_true", help="list every language id and its names, then stop")
    parser.add_argument("--voices", type=Path, default=None, help="the voices folder (default: $OMNIVOICE_VOICES, "
                                                                   "else <DIR>/voices)")
    return parser


def _files_line(path: Path) -> str:
    return f"{path.name}  {path.stat().st_size / 2**20:.1f} MiB  sha256 {sha256_file(path)[:12]}"


def _report(onnx_dir: Path) -> dict:
    """The export report's verdict sections (empty when absent or unreadable: info describes, it
    does not judge; the pipeline's own steps check the report)."""
    try:
        data = read_json(onnx_dir / REPORT_FILE, "export report", "")
    except UserError:
        return {}
    return data if isinstance(data, dict) else {}


def _verdicts(report: dict) -> str:
    found = [f"{section.replace('_', ' ')} {provider} {entry.get('verdict')}"
             for section in ("parity", "end_to_end") for provider, entry in (report.get(section) or {}).items()
             if isinstance(entry, dict)]
    return "; ".join(found) or "none recorded (run parity_check.py and infer_onnx.py)"


def run(args: argparse.Namespace) -> int:
    onnx_dir = args.model_dir_flag or args.model_dir
    meta = bundle_metadata(onnx_dir)
    config = load_runtime_config(onnx_dir)
    languages = config["languages"]
    if args.languages:
        for lang_id, names in language_names(languages).items():
            print(f"{lang_id:<8} {', '.join(names)}")
        return 0

    from omnivoice_onnx.api import default_variant  # opens nothing; imports onnxruntime

    print(f"bundle      {onnx_dir}")
    print(f"model       fingerprint {meta['model_fingerprint']}")
    print(f"source      {meta.get('source', 'not recorded')}")
    print(f"licence     {meta.get('license') or card_license(onnx_dir) or NO_LICENSE}"
          f"  (terms: {onnx_dir / MODEL_CARD_FILE})")
    print("graphs")
    for graph, name in GRAPH_FILES.items():
        for path in (onnx_dir / name, onnx_dir / (name + ".data")):
            print(f"  {_files_line(path) if path.is_file() else path.name + '  MISSING'}")
    variants = variants_present(onnx_dir)
    default = default_variant(onnx_dir)
    print(f"variants    {', '.join(v + (' (default)' if v == default else '') for v in variants)}")
    for variant in variants:
        if variant != FP32_VARIANT:
            path = variant_path(onnx_dir, variant)
            label = metadata_props(path).get("variant", "?")
            print(f"  {variant}/{_files_line(path)}  (metadata variant {label})")
            sidecar = path.with_name(path.name + ".data")
            if sidecar.is_file():
                print(f"  {variant}/{_files_line(sidecar)}")
    print(f"verdicts    {_verdicts(_report(onnx_dir))}")
    print(f"languages   {len(languages['ids'])} (list them: omnivoice-onnx info --languages; --language takes a "
          "name or an id)")
    instruct = config["instruct"]
    print(f"instruct    {', '.join(instruct['valid_en'])} (and {len(instruct['valid_zh'])} Chinese items)")
    voices = voices_dir(onnx_dir, args.voices)
    try:
        found = [voice.name for voice in list_voices(voices)]
        print(f"voices      {len(found)} in {voices}" + (f": {', '.join(found)}" if found else ""))
    except UserError as exc:  # a damaged voice file: named, and the rest of info still shown
        print(f"voices      unreadable: {exc}")
    print(f"cpu         {isa_line()}")
    return 0
