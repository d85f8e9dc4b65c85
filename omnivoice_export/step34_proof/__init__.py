"""Steps 3-4 (parity_check.py, infer_onnx.py): the proof that the graphs are the model.

Modules:
    parity        step 3: each graph against the capture (argmax and max-abs, code match, log-spectral L1)
    end_to_end    step 4's compare mode: the graphs inside upstream generate(), and the runtime, against the capture
    device_check  a CUDA reference against the CPU one (make gpu-check's torch side)
"""
