#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, on the tiny checkpoint, in under 8 minutes (make gpu-check).
#
#   scripts/gpu_check.sh [OUT_DIR]        (default gpu-check/; PY=python to use another interpreter)
#
# torch side (needs a CUDA build of torch):
#   1. a capture on cpu and one on cuda of the same requests (capture_reference.py switches TF32
#      off for matmuls and cuDNN and records it in the manifest), then device_check compare:
#      logits at every step whose inputs are equal (the CUDA generator draws other noise, so the
#      token states part after step 0), encoder codes on the same reference audio;
#   2. device_check replay of the cpu capture's inputs through torch on cuda, TF32 off (the CUDA
#      reference is the CPU one to fp32 noise) and on (what TF32 costs).
# onnxruntime side (needs onnxruntime-gpu; skipped, saying so, where onnxruntime lacks the CUDA
# provider): an export from each capture; parity --provider cuda-fp32 and cuda-tf32 against the
# cuda capture (same-device reference; each graph's node placement is printed); infer_onnx.py
# --provider cuda-fp32 against the cpu capture (generate() draws its noise on the CPU host, so
# only a CPU capture can be replayed token for token). The fp16 variant (float16 is what a GPU
# runs fast): built into both exports, its transformer measured against the cuda capture, its
# generate() (float16 codecs too) against the cpu capture, and tests/test_fp16.py on CUDA, where
# the naive conversion's float16 RMSNorm really overflows (the CPU provider hides it).
# Exit status: that of the first step that failed (parity and end to end exit 1 on a finding).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${1:-gpu-check}
status=0
step() {  # run one step, timed; remember the first failure and go on
    echo "== $*"
    local started=$SECONDS
    "$@"
    local rc=$?
    echo "== exit $rc after $((SECONDS - started)) s"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
    return "$rc"
}

step "$PY" -m omnivoice_export.step34_proof.device_check env || exit $?
mkdir -p "$OUT"
step "$PY" make_reference.py --model tiny --out-dir "$OUT/cpu" || exit $status
mkdir -p "$OUT/cuda" && cp "$OUT"/cpu/ref_voice.* "$OUT/cuda/"
step "$PY" capture_reference.py --model tiny --device cpu --capture-dir "$OUT/cpu" || exit $status
step "$PY" capture_reference.py --model tiny --device cuda --capture-dir "$OUT/cuda" || exit $status
step "$PY" -m omnivoice_export.step34_proof.device_check compare "$OUT/cpu" "$OUT/cuda"
step "$PY" -m omnivoice_export.step34_proof.device_check replay "$OUT/cpu" --device cuda
step "$PY" -m omnivoice_export.step34_proof.device_check replay "$OUT/cpu" --device cuda --tf32

if ! "$PY" -c 'import onnxruntime, sys; sys.exit("CUDAExecutionProvider" not in onnxruntime.get_available_providers())'; then
    echo "== ORT CUDA part skipped: onnxruntime $("$PY" -c 'import onnxruntime; print(onnxruntime.__version__, onnxruntime.get_available_providers())') has no CUDAExecutionProvider (install requirements-gpu.txt: onnxruntime-gpu)"
    exit $status
fi
step "$PY" export_omnivoice.py --model tiny --capture-dir "$OUT/cuda" --onnx-dir "$OUT/onnx-cuda" || exit $status
step "$PY" parity_check.py --provider cuda-fp32 --capture-dir "$OUT/cuda" --onnx-dir "$OUT/onnx-cuda"
step "$PY" parity_check.py --provider cuda-tf32 --capture-dir "$OUT/cuda" --onnx-dir "$OUT/onnx-cuda"
step "$PY" export_omnivoice.py --model tiny --capture-dir "$OUT/cpu" --onnx-dir "$OUT/onnx-cpu" || exit $status
step "$PY" infer_onnx.py --provider cuda-fp32 --capture-dir "$OUT/cpu" --onnx-dir "$OUT/onnx-cpu" --no-torch-timing
step "$PY" quantize_omnivoice.py --onnx-dir "$OUT/onnx-cuda" --variants fp16
step "$PY" parity_check.py --provider cuda-fp32 --variant fp16 --capture-dir "$OUT/cuda" --onnx-dir "$OUT/onnx-cuda"
step "$PY" quantize_omnivoice.py --onnx-dir "$OUT/onnx-cpu" --variants fp16
step "$PY" infer_onnx.py --provider cuda-fp32 --variant fp16 --capture-dir "$OUT/cpu" --onnx-dir "$OUT/onnx-cpu" --no-torch-timing
step "$PY" -m pytest -q -p no:cacheprovider tests/test_fp16.py
exit $status
