"""The host loop of upstream `OmniVoice.generate()` (omnivoice 0.2.1), torch-free: what a porter
reads, in this order.

    shapes    the data shapes of a request (Model, GenerationConfig, Request, VoiceClonePrompt, ...)
    rng       torch's CPU generator (manual_seed + rand) in numpy, bit for bit
    schedule  the unmasking schedule (time steps, cells per step)
    scoring   one unmasking step: guided log-probs, Gumbel draws, penalty, top-k cells
    text      long-text chunking, reference-text punctuation
    duration  the rule-based duration estimate, speed and fixed durations
    prompt    text tokenizer, language/instruct resolution, prompt ids, the 2B batch layout
    plan      which texts are chunked, and the chunk batches
    audio     reference loading and preparation, post-processing, chunk cross-fade
              (_resample: torchaudio's sinc resampler; _silence: pydub's silence search)
    request   the request's one validation (limits: omnivoice_onnx.limits)
    generate  generate() and its steps: preprocessing, the unmasking loop, chunking, decoding

Nothing here loads an onnxruntime session or touches a file it was not handed: the three
networks come in through `shapes.Model` (omnivoice_onnx.api builds it from the ONNX graphs).
"""
