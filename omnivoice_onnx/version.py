"""The one version of the runtime: pyproject.toml reads it from here (setuptools dynamic version),
the package exports it, `omnivoice-onnx --version` prints it. A module of its own so that the
command line reads it without importing the package's API (and onnxruntime with it)."""

__version__ = "0.3.0"
