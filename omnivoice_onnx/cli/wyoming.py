"""omnivoice-onnx wyoming: a Wyoming server for Home Assistant's local voice pipeline.

    pip install 'omnivoice-onnx[wyoming]'
    omnivoice-onnx wyoming --model-dir onnx --uri tcp://127.0.0.1:10200

Then in Home Assistant: Settings > Devices & services > Add integration > "Wyoming Protocol",
host and port of this machine, or --zeroconf and Home Assistant finds it. The protocol has no
key: a --uri other machines can reach (e.g. tcp://0.0.0.0:10200, for Home Assistant on another
machine or in a container) needs --allow-remote, and is then for a trusted network only.
For a reply faster than real time on a CPU: --variant int8 --num-step 8 or 16.
Voices: the reference voices of --ref-dir, the saved ones, the OpenAI-named presets and auto.
The protocol carries no seed and no speed: each request's seed is logged and --seed fixes it;
--speed sets every request's speaking rate, --sentence-silence and --volume its pauses and loudness.
--ref-dir DIR (wyoming-piper's --omnivoice-ref-dir layout): DIR/LANGUAGE/NAME/ref.wav + ref.txt
is a cloned voice NAME, DIR/LANGUAGE/NAME/instruct.txt a designed one; each is read at start and
advertised with its language.
SIGTERM or Ctrl-C drains it (exit 0; 143/130 if --drain-timeout cut a request off).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from omnivoice_onnx.cli.flags import Subparsers, add_pause_volume_flags, flag_type
from omnivoice_onnx.cli.server_flags import add_model_flags, import_extras, server_config
from omnivoice_onnx.errors import log_lines
from omnivoice_onnx.limits import MAX_SPEED, MIN_SPEED
from omnivoice_onnx.program import SEED, SPEED

INSTALL_FIX = "install the Wyoming extra: pip install 'omnivoice-onnx[wyoming]'"


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    from omnivoice_onnx.serve import wyoming as wyoming_server

    parser = subparsers.add_parser(
        "wyoming",
        help="run a Wyoming server (Home Assistant's local voice protocol)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_flags(parser)
    parser.add_argument(
        "--uri",
        default=wyoming_server.DEFAULT_URI,
        help=f"where to listen, tcp://HOST:PORT (default: {wyoming_server.DEFAULT_URI}; port 0: any)",
    )
    parser.add_argument(
        "--voice",
        default=wyoming_server.DEFAULT_VOICE,
        help=f"the voice of a request that names none (default: {wyoming_server.DEFAULT_VOICE})",
    )
    parser.add_argument(
        "--seed",
        type=SEED,
        default=None,
        help="every request's seed (default: a preset's own, else a fresh one per request, logged)",
    )
    parser.add_argument(
        "--speed",
        type=SPEED,
        default=None,
        help=f"every request's speaking rate factor (1.0 normal, {MIN_SPEED:g}-{MAX_SPEED:g}; the protocol "
        "carries none)",
    )
    add_pause_volume_flags(parser)  # every request's: the protocol carries neither
    parser.add_argument(
        "--ref-dir",
        "--omnivoice-ref-dir",
        dest="ref_dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="a folder of reference voices, LANGUAGE/NAME/ref.wav + ref.txt (a clone) or "
        "LANGUAGE/NAME/instruct.txt (a design), as wyoming-piper's --omnivoice-ref-dir; each is a voice",
    )
    parser.add_argument(
        "--allow-remote",
        "--allow_remote",
        dest="allow_remote",
        action="store_true",
        help="listen on a --uri other machines can reach (default: refused; the protocol has no key, "
        "so anyone who can reach the port can use it)",
    )
    parser.add_argument(
        "--zeroconf",
        nargs="?",
        const=wyoming_server.ZEROCONF_NAME,
        default=None,
        type=flag_type(wyoming_server.check_zeroconf_name),
        metavar="NAME",
        help=f"announce the server over mDNS (_wyoming._tcp) for Home Assistant to discover, as NAME "
        f"(default name: {wyoming_server.ZEROCONF_NAME}); needs the zeroconf package (the "
        "wyoming extra)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    import_extras("wyoming", ("wyoming", "zeroconf") if args.zeroconf is not None else ("wyoming",), INSTALL_FIX)
    from omnivoice_onnx.serve import wyoming as wyoming_server
    from omnivoice_onnx.serve.app import load_service
    from omnivoice_onnx.serve.wyoming_voices import check_ref_dir

    config = server_config(args)
    log_lines()
    settings = wyoming_server.WyomingConfig(
        uri=args.uri,
        seed=args.seed,
        voice=args.voice,
        allow_remote=args.allow_remote,
        zeroconf=args.zeroconf,
        speed=args.speed,
        sentence_silence=args.sentence_silence,
        volume=args.volume,
        ref_dir=args.ref_dir,
    )
    if args.ref_dir is not None:  # a --ref-dir that is no folder is named before the models load
        check_ref_dir(args.ref_dir)
    listener = wyoming_server.listen(settings)  # a bad --uri or a busy port is named before the models load
    return wyoming_server.serve(load_service(config), settings, listener)
