"""The command line's room: one module per `omnivoice-onnx` subcommand, the helpers commands
share (flags: the bundle's flags and the help formatter; server_flags: serve's and wyoming's)
and the conformance vectors' command (vectors). Exit codes, the one-line error frame and the range
types are the program edge's (omnivoice_onnx.program), below this room, which the toolchain uses too.

Each command module exposes `add_parser(subparsers) -> argparse.ArgumentParser` (its flags and
--help) and `run(args) -> int | None` (the command, on a validated request; its exit code). The
program itself (the top-level parser, the registry of commands, the error-to-exit-code frame) is
omnivoice_onnx/__main__.py: the console script `omnivoice-onnx` and `python -m omnivoice_onnx`. A
command imports its heavy dependencies (onnxruntime sessions, fastapi, ray) when it runs, so
`--help` and `--version` start fast.
"""
