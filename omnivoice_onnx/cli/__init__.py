"""The command line's room: one module per `omnivoice-onnx` subcommand, and the helpers two
commands share (server_flags).

Each command module exposes `add_parser(subparsers) -> argparse.ArgumentParser` (its flags and
--help) and `run(args) -> int | None` (the command, on a validated request; its exit code). The
program itself (the top-level parser, the registry of commands, the error-to-exit-code frame) is
omnivoice_onnx/__main__.py: the console script `omnivoice-onnx` and `python -m omnivoice_onnx`. A
command imports its heavy dependencies (onnxruntime sessions, fastapi, ray) when it runs, so
`--help` and `--version` start fast.
"""
