"""omnivoice-onnx pack: one variant of a bundle as a release archive, for others to download.

    omnivoice-onnx pack onnx --variant int8 -o omnivoice-int8.tar > omnivoice-int8.tar.sha256

The archive holds what the variant loads (its transformer, the codec graphs, tokenizer.json,
runtime-config.json), the export report and the model card (README.md: the licence the bundle
inherits), after a manifest of every file's sha256 and size. Each file is checked against the
export report first and hashed again as it is written. The same bundle gives the same bytes.
`.tar` (the weights barely compress) or `.tar.gz`. The archive's sha256 is printed on stdout as
sha256sum does (`HEX  FILE`: `sha256sum -c` checks it), with the summary and the command that
downloads it on stderr: publish the hash beside the archive, `omnivoice-onnx download URL --sha256
HEX --dir DIR` requires it and gets the bundle back, verified. A folder laid out as the extracted
archive is also a Hugging Face repo `download ORG/NAME` reads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omnivoice_onnx.cli.flags import Subparsers, add_bundle_flags
from omnivoice_onnx.files import check_output


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "pack",
        help="write one variant of a bundle as a release archive with its hashes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model_dir", type=Path, metavar="DIR", help="the bundle (export folder) to pack")
    add_bundle_flags(parser, model_dir=False, voices=False)
    parser.add_argument(
        "-o",
        "--out",
        type=Path,
        required=True,
        metavar="FILE",
        help="the archive to write (.tar or .tar.gz); written whole or not at all",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    from omnivoice_onnx import fetch

    check_output(args.out, "-o", "file")
    manifest, sha256 = fetch.pack(args.model_dir, args.variant, args.out)
    size = sum(entry["bytes"] for entry in manifest["files"].values())
    print(
        f"packed variant {manifest['variant']} of model {manifest['model_fingerprint'][:23]}: "
        f"{len(manifest['files'])} files, {size / 2**20:.1f} MiB -> {args.out}; publish its sha256 beside it. "
        f"Downloaded with: omnivoice-onnx download https://HOST/PATH/{args.out.name} --sha256 {sha256} --dir DIR",
        file=sys.stderr,
    )
    print(f"{sha256}  {args.out}")
    return 0
