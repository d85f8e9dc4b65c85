"""omnivoice-onnx download: get a bundle without the export toolchain, verified before it is used.

    omnivoice-onnx download ORG/NAME --dir models/omnivoice --variant int8      # a Hugging Face repo
    omnivoice-onnx download https://host/omnivoice-int8.tar --sha256 HEX --dir models/omnivoice
    omnivoice-onnx speak "Hello." --model-dir models/omnivoice --out hello.wav

A Hugging Face repo is read through huggingface_hub (its cache, $HF_HUB_CACHE; $HF_TOKEN for a
private repo): only the files the variant loads (derived from the repo's export report), the
report and the model card. HF_HUB_OFFLINE=1 or --local-files-only reads the cache alone.
`--model-dir hf:ORG/NAME` on any command reads the same files straight from that cache.

If the Hub cannot be reached and the cache lacks the repo, that is one line at once.

A release archive (omnivoice-onnx pack) needs the sha256 its publisher gives (pack prints it). It
is fetched beside --dir as a hidden .part file, at most $OMNIVOICE_MAX_DOWNLOAD_BYTES (default 8
GiB) whatever the server announces or sends; an interrupted fetch (a dropped connection, Ctrl-C,
SIGTERM) keeps it, says so, and is resumed by running the same command again (an HTTP Range
request; a server that ignores ranges restarts it). Any other end removes it. Redirects are
followed to http(s) only. On a terminal, a progress line on stderr (none when stderr is a pipe or
a file); a summary line at the end either way, and the folder on stdout.

Either way every file is checked against the bundle's export report (and an archive's manifest)
in a hidden folder beside --dir, which is renamed onto --dir only when all of it is right: a
failed or interrupted download leaves --dir as it was. A second download of the same source
into the same --dir finds it in place (each file checked) and fetches nothing. An earlier
download in --dir is replaced whole, its saved voices (DIR/voices) carried into the new one by the
same rename; a --dir holding anything else is refused. A --dir that is a link is the folder it
names. A link or special file planted where the download writes (its .part, its lock) is refused,
never written through; a refused download removes the folders it made for --dir.
Licence: the bundle's README.md (its model card) states the terms it inherits.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from omnivoice_onnx.cli.flags import Subparsers, add_bundle_flags
from omnivoice_onnx.files import check_output


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "download",
        help="get a bundle from a Hugging Face repo or a release archive URL",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "source", metavar="SOURCE", help="a Hugging Face repo id (ORG/NAME), or the http(s) URL of a release archive"
    )
    parser.add_argument(
        "--dir",
        dest="target",
        type=Path,
        required=True,
        metavar="DIR",
        help="the folder to put the bundle in (created, or replaced when an earlier download)",
    )
    add_bundle_flags(parser, model_dir=False, voices=False)
    parser.add_argument("--sha256", default=None, metavar="HEX", help="the archive's sha256 (required with a URL)")
    parser.add_argument("--revision", default=None, help="a Hugging Face branch, tag or commit (default: main)")
    parser.add_argument(
        "--local-files-only",
        "--local_files_only",
        dest="local_files_only",
        action="store_true",
        help="read the Hugging Face cache only, never the network (as HF_HUB_OFFLINE=1)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    from omnivoice_onnx import fetch

    check_output(args.target, "--dir", "tree")
    started = time.monotonic()
    manifest, fetched = fetch.download(
        args.source, args.target, args.variant, args.sha256, args.local_files_only, args.revision
    )
    size = sum(entry["bytes"] for entry in manifest["files"].values())
    what = "downloaded and verified" if fetched else "already there, verified (nothing fetched)"
    print(
        f"{what}: variant {manifest['variant']} of model {manifest['model_fingerprint'][:23]}, "
        f"{len(manifest['files'])} files, {size / 2**20:.1f} MiB in {args.target} "
        f"({time.monotonic() - started:.1f} s)",
        file=sys.stderr,
    )
    print(os.fspath(args.target))
    return 0
