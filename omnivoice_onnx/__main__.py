"""`python -m omnivoice_onnx` runs the `omnivoice-onnx` command (omnivoice_onnx.cli)."""

import sys

from omnivoice_onnx.cli import main

if __name__ == "__main__":
    sys.exit(main())
