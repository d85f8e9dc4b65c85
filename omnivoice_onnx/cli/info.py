"""What a bundle (an export folder) holds: model, graphs, variants, languages, instruct items, licence,
voices; whether its files are the ones the export recorded; and the CPU it would run on, with the
ISA flags its speed depends on.

    omnivoice-onnx info                 # the bundle in ./onnx
    omnivoice-onnx info path/to/onnx
    omnivoice-onnx info --languages     # every language id of the model and its names

Read from the graphs' metadata (no session is opened), runtime-config.json, the export report
and the model card. Every file a variant in the folder loads is checked against export-report.json
(size, then sha256; the first 12 hex digits shown), each hashed anew, where
loading skips a file hashed before and unchanged since (info refreshes that record): a missing,
truncated or replaced file is listed, and the command ends with one line naming it and
exit 2. --no-verify (or OMNIVOICE_VERIFY=0) describes a bundle without a report. The licence is
what the export recorded from the checkpoint: copying the bundle copies its terms (see the
bundle's README.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from omnivoice_onnx.bundle import (
    DEFAULT_MODEL_DIR,
    Bundle,
    FileCheck,
    card_license,
    metadata_props,
    verify_requested,
)
from omnivoice_onnx.cli.flags import Subparsers, add_bundle_flags
from omnivoice_onnx.contract import FP32_VARIANT
from omnivoice_onnx.core.prompt import language_names
from omnivoice_onnx.errors import UserError, say
from omnivoice_onnx.hardware import isa_line
from omnivoice_onnx.verified import VerifiedFiles
from omnivoice_onnx.voices import list_voices, voices_dir

NO_LICENSE = "not recorded (exported before licences were recorded: re-run export_omnivoice.py)"


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "info",
        help="what a bundle holds: model, graphs, variants, languages, licence",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "model_dir",
        nargs="?",
        type=Path,
        default=DEFAULT_MODEL_DIR,
        metavar="DIR",
        help="the export folder (default: onnx)",
    )
    add_bundle_flags(parser, variant=False, model_dest="model_dir_flag", model_default=None)
    parser.add_argument(
        "--languages",
        action="store_true",
        help="list every language id of the bundle's model and its names, then stop (the table is "
        "model data each bundle carries, so it reads a bundle too: ./onnx, DIR or --model-dir)",
    )
    parser.add_argument(
        "--no-verify",
        "--no_verify",
        dest="verify",
        action="store_false",
        help="do not check the files against export-report.json (a bundle without a report)",
    )
    return parser


def _size(path: Path) -> str:
    return f"{path.stat().st_size / 2**20:.1f} MiB" if path.is_file() else "MISSING"


def _verdicts(report: dict[str, Any], damaged: bool) -> str:
    """The verdicts the pipeline recorded; void when the files are not the ones they were made on."""
    found = [
        f"{section.replace('_', ' ')} {provider} {entry.get('verdict')}"  # bundle.REPORT_SCHEMA's shape
        for section in ("parity", "end_to_end")
        for provider, entry in (report.get(section) or {}).items()
    ]
    if not found:
        return "none recorded (run parity_check.py and infer_onnx.py)"
    return "; ".join(found) + (" - NOT for these files: they differ from those checked (above)" if damaged else "")


def _checked_files(bundle: Bundle) -> tuple[list[tuple[FileCheck, str | None]], dict[str, UserError]]:
    """Each file every variant in the folder loads, once, with its problem (None: as recorded),
    and why the report cannot vouch for a variant (no report, not listed, a malformed entry)."""
    seen: dict[Path, tuple[FileCheck, str | None]] = {}
    unvouched = {}
    verified = VerifiedFiles.in_cache(reuse=False)
    for variant in [bundle.variant] + [v for v in bundle.variants if v != bundle.variant]:
        try:
            checks = bundle.file_checks(variant)
        except UserError as exc:
            unvouched[variant] = exc
            continue
        for check in checks:
            if check.path not in seen:
                seen[check.path] = (check, check.problem(verified))
    verified.save()
    return list(seen.values()), unvouched


def run(args: argparse.Namespace) -> int:
    model_dir = args.model_dir_flag or args.model_dir
    bundle = Bundle.open(model_dir, verify=False)  # hashed below, every variant's files, not only one
    meta, config = bundle.metadata, bundle.runtime_config
    languages = config["languages"]
    if args.languages:
        for lang_id, names in language_names(languages).items():
            say(f"{lang_id:<8} {', '.join(names)}")
        return 0

    say(f"bundle      {model_dir}")
    say(f"model       fingerprint {meta['model_fingerprint']}")
    say(f"source      {meta.get('source', 'not recorded')}")
    say(f"licence     {meta.get('license') or card_license(bundle.dir) or NO_LICENSE}  (terms: {bundle.card_path})")
    verify = verify_requested(args.verify)
    problems: list[tuple[str, str | None]] = []  # (problem, fix)
    if verify:
        checked, unvouched = _checked_files(bundle)
        say("files       (checked against export-report.json)")
        for check, problem in checked:
            verdict = "OK" if problem is None else ("MISSING" if not check.path.is_file() else "DAMAGED")
            say(
                f"  {check.path.relative_to(model_dir)}  {_size(check.path)}  sha256 "
                f"{check.entry['sha256'].removeprefix('sha256:')[:12]}  {verdict}"
            )
            if problem is not None:
                problems.append((problem, check.fix))
        for variant, exc in unvouched.items():
            say(f"  {variant}: not checked: {exc.problem}")
        if bundle.variant in unvouched:  # what loading would refuse
            problems.insert(0, (unvouched[bundle.variant].problem, unvouched[bundle.variant].fix))
    else:
        say("files       (not checked: --no-verify)")
        for path in bundle.export_files():
            say(f"  {path.name}  {_size(path)}")
    default = bundle.variant
    say(f"variants    {', '.join(v + (' (default)' if v == default else '') for v in bundle.variants)}")
    for variant in (v for v in bundle.variants if v != FP32_VARIANT):
        label = metadata_props(bundle.path("transformer", variant)).get("variant", "?")
        say(f"  {variant}: metadata variant {label}")
    say(f"verdicts    {_verdicts(bundle.report or {}, bool(problems))}")
    say(
        f"languages   {len(languages['ids'])} (list them: omnivoice-onnx info --languages; --language takes a "
        "name or an id)"
    )
    instruct = config["instruct"]
    say(f"instruct    {', '.join(instruct['valid_en'])} (and {len(instruct['valid_zh'])} Chinese items)")
    voices = voices_dir(bundle, args.voices)
    try:
        found = [voice.name for voice in list_voices(voices)]
        say(f"voices      {len(found)} in {voices}" + (f": {', '.join(found)}" if found else ""))
    except UserError as exc:  # a damaged voice file: named, and the rest of info still shown
        say(f"voices      unreadable: {exc}")
    say(f"cpu         {isa_line()}")
    if problems:
        more = f" (+{len(problems) - 1} more file(s), listed above)" if len(problems) > 1 else ""
        raise UserError(problems[0][0] + more, problems[0][1])
    return 0
