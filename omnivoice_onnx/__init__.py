"""omnivoice_onnx: run an OmniVoice ONNX export with numpy + onnxruntime alone (no torch).

The host side of upstream `OmniVoice.generate()` (omnivoice 0.2.1) reproduced step by step, so a
given seed gives upstream's tokens; the reference a C# or mobile port reads line by line. It
never imports torch, transformers, omnivoice, pydub or the toolchain (omnivoice_export).

Modules:
    errors     UserError, the one-line expected error
    contract   the graph files of an export
    sessions   onnxruntime sessions, providers, cond/uncond split execution
    rng        torch's CPU generator (manual_seed + rand) in numpy, bit for bit
    schedule   the unmasking schedule (time steps, cells per step)
    scoring    one unmasking step: guided log-probs, Gumbel draws, penalty, top-k cells
"""
