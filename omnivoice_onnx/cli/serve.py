"""omnivoice-onnx serve: an OpenAI-compatible speech server (POST /v1/audio/speech) on this machine.

    pip install 'omnivoice-onnx[serve]'
    omnivoice-onnx serve --model-dir onnx                       # http://127.0.0.1:8000/v1, a page at /
    curl -s http://127.0.0.1:8000/v1/audio/speech -H 'Content-Type: application/json' \\
         -d '{"model": "omnivoice", "voice": "auto", "input": "Hello.", "response_format": "wav"}' -o hello.wav

Binds 127.0.0.1 unless --host says otherwise; another host needs a key (--api-key or
$OMNIVOICE_API_KEY; an empty one is an error) or, to serve it open on purpose, --no-auth.
Browsers: requests from another page's origin are refused (--cors-origin allows one), and a
keyless loopback server answers only loopback Host names (--allowed-host adds one).
Routes: OpenAI's speech API (POST /v1/audio/speech, GET /v1/audio/voices, GET /v1/models), so
OpenAI clients and Open WebUI work unchanged; /health, /metrics, and a page to try voices at /.
SIGTERM or Ctrl-C drains the requests in flight and exits 0; 143 (130) only if --drain-timeout
cut some off.
"""

from __future__ import annotations

import argparse
import os

from omnivoice_onnx.audio_formats import RESPONSE_FORMATS
from omnivoice_onnx.cli.flags import Subparsers, flag_type
from omnivoice_onnx.cli.server_flags import add_model_flags, import_extras, server_config
from omnivoice_onnx.errors import log_lines
from omnivoice_onnx.program import int_range
from omnivoice_onnx.serve.browser import check_host_flag, check_origin_flag
from omnivoice_onnx.serve.service import API_KEY_ENV, api_key_from

INSTALL_FIX = "install the server's extra: pip install 'omnivoice-onnx[serve]'"


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve",
        help="run an OpenAI-compatible speech server and a page to try voices",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_flags(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int_range(0, 65535), default=8000, help="TCP port (default: 8000; 0: any free)")
    parser.add_argument(
        "--api-key",
        "--api_key",
        dest="api_key",
        default=None,
        help=f"require `Authorization: Bearer KEY` (default: ${API_KEY_ENV}; unset: no key, "
        "allowed on a loopback --host only; empty: an error)",
    )
    parser.add_argument(
        "--no-auth",
        "--no_auth",
        dest="no_auth",
        action="store_true",
        help="serve a non-loopback --host without a key, on purpose (logged as a warning)",
    )
    parser.add_argument(
        "--default-format",
        "--default_format",
        dest="default_format",
        choices=tuple(RESPONSE_FORMATS),
        default=None,
        help="response_format when a request names none (default: mp3 as OpenAI, where libsndfile writes it; else wav)",
    )
    parser.add_argument(
        "--no-stream",
        "--no_stream",
        dest="stream",
        action="store_false",
        help="answer a request that sets neither stream_format nor stream with the whole clip in one "
        'body with its Content-Length (default: stream it as OpenAI does; a request\'s "stream": false '
        "asks for the whole clip either way)",
    )
    parser.add_argument(
        "--model-alias",
        "--model_alias",
        dest="model_aliases",
        action="append",
        default=[],
        metavar="ID",
        type=model_alias,
        help="another `model` id that names the served variant (repeatable; tts-1, tts-1-hd and "
        "gpt-4o-mini-tts always do)",
    )
    parser.add_argument(
        "--allow-voice-save",
        "--allow_voice_save",
        dest="allow_voice_save",
        action="store_true",
        help="let POST /v1/audio/references?save_as=NAME (and the page) save a voice into the voices "
        "folder (default: off; uploaded references are then kept in memory only)",
    )
    parser.add_argument(
        "--cors-origin",
        "--cors_origin",
        dest="cors_origins",
        action="append",
        default=[],
        metavar="ORIGIN",
        type=flag_type(check_origin_flag),
        help="a web page origin (scheme://host[:port]) whose requests are answered, with a CORS "
        "preflight (repeatable; default: none: only the server's own page at / may send "
        "requests from a browser)",
    )
    parser.add_argument(
        "--allowed-host",
        "--allowed_host",
        dest="allowed_hosts",
        action="append",
        default=[],
        metavar="NAME",
        type=flag_type(check_host_flag),
        help="a Host name the server answers besides loopback ones (repeatable; default: a server "
        "without a key on loopback answers only localhost, 127.0.0.1 and [::1], refusing "
        "DNS-rebinding pages; naming one turns the check on for any server)",
    )
    return parser


def model_alias(value: str) -> str:
    """A --model-alias id: printable, no spaces, not empty (it is listed in /v1/models and matched
    against a request's `model` exactly)."""
    if not value or not value.isprintable() or any(char.isspace() for char in value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a model id (printable, no spaces, not empty), e.g. --model-alias my-tts"
        )
    return value


def run(args: argparse.Namespace) -> int:
    import_extras("serve", ("fastapi", "uvicorn", "prometheus_client"), INSTALL_FIX)
    from omnivoice_onnx.serve import app as server

    config = server_config(
        args,
        host=args.host,
        port=args.port,
        api_key=api_key_from(args.api_key, os.environ),
        no_auth=args.no_auth,
        default_format=args.default_format,
        stream=args.stream,
        model_aliases=tuple(args.model_aliases),
        allow_voice_save=args.allow_voice_save,
        cors_origins=tuple(args.cors_origins),
        allowed_hosts=tuple(args.allowed_hosts),
    )
    log_lines()
    return server.serve(config)
