"""The toolchain's common room: what every step stands on, below all of them.

Modules:
    edge      the repository's folders (capture/, onnx/) and the flags naming them, declared once;
              the comma-separated subsets the steps take (--graphs, --modes)
    files     first_mismatch: is each listed file the one its {sha256, bytes} entry names (cached checks)
    measure   wall time and peak RSS of a block; the CPU a figure was measured on; bench results' names
    metrics   parity metrics (argmax/max-abs, code match, log-spectral L1), one per graph with its reason
"""
