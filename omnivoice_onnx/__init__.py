"""omnivoice_onnx: run an OmniVoice ONNX export with numpy + onnxruntime alone (no torch).

The host side of upstream `OmniVoice.generate()` (omnivoice 0.2.1) reproduced step by step, so a
given seed gives upstream's tokens; the reference a C# or mobile port reads line by line. It
never imports torch, transformers, omnivoice, pydub or the toolchain (omnivoice_export).

Modules, one host stage each:
    errors     UserError, the one-line expected error
    contract   the graphs' I/O contract table, thresholds and constants (shared with the toolchain)
    sessions   onnxruntime sessions, providers, cond/uncond split execution
    prompt     text tokenizer, language/instruct resolution, prompt ids, the 2B batch layout
    duration   the rule-based duration estimate, speed and fixed durations
    text       long-text chunking, reference-text punctuation
    audio      reference loading and preparation, post-processing, chunk cross-fade
"""
