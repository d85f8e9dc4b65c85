"""omnivoice_export: export k2-fsa OmniVoice to three faithful fp32 ONNX graphs and prove them.

The toolchain (torch) behind the numbered scripts at the repository's root, one room per stage of
the pipeline, in the scripts' order; a room imports only from rooms before it and from `common`,
except that the proof (steps 3-4) measures variants with step 6's code. Each room's `__init__`
lists its modules. The graphs' I/O contract, thresholds and audio constants are the runtime's
(omnivoice_onnx.contract), and so are exit codes and flag ranges (omnivoice_onnx.program).

Rooms:
    common             the folders and their flags, artefact files, measurements, parity metrics
    step0_checkpoints  make_reference.py: resolve, build, check and load checkpoints
    step1_capture      capture_reference.py: upstream generate() run and recorded
    step2_export       export_omnivoice.py: the graphs, the files beside them, export-report.json
    step34_proof       parity_check.py, infer_onnx.py: per-graph parity and end-to-end comparison
    step56_variants    quantize_omnivoice.py, quality_omnivoice.py: variants and their measured cost

Modules beside the rooms (make venv's, before step 0):
    install         install torch's CPU build; prove the venv imports what the pipeline needs
    torchaudio_cpu  make torchaudio importable beside a CPU torch
"""

import warnings

# pydub warns at import time when ffmpeg is absent; omnivoice imports pydub at module level but
# only needs it for silence trimming of in-memory arrays, which does not use ffmpeg. Set here,
# where every module of the toolchain passes first.
warnings.filterwarnings("ignore", message="Couldn't find ffmpeg or avconv", category=RuntimeWarning)
