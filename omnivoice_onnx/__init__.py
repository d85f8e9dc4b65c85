"""omnivoice_onnx: run an OmniVoice ONNX export with numpy + onnxruntime alone (no torch).

The host side of upstream `OmniVoice.generate()` (omnivoice 0.2.1) reproduced step by step, so a
given seed gives upstream's tokens; the reference a C# or mobile port reads line by line. It
never imports torch, transformers, omnivoice, pydub or the toolchain (omnivoice_export).

    from omnivoice_onnx import OmniVoiceOnnx
    tts = OmniVoiceOnnx.from_dir("onnx")
    audios = tts.generate("Hello.", language="English", seed=1)
    for chunk in tts.stream("First sentence. Second one.", seed=1):   # audio as each chunk is ready
        print(chunk.index, chunk.count, chunk.samples.shape)   # float32 samples at chunk.sample_rate

The command line: `omnivoice-onnx speak "Hello." --out hello.wav` (omnivoice_onnx.cli).

Modules, one host stage each:
    api          OmniVoiceOnnx: load an export folder, generate, create_voice_clone_prompt
    generate     generate() and its steps: preprocessing, the unmasking loop, chunking, decoding
    scoring      one unmasking step: guided log-probs, Gumbel draws, penalty, top-k cells
    schedule     the unmasking schedule (time steps, cells per step)
    rng          torch's CPU generator (manual_seed + rand) in numpy, bit for bit
    conformance  JSON traces of fixed cases, for ports to replay
    errors       UserError, the one-line expected error
    contract     the graphs' I/O contract table, thresholds and constants (shared with the toolchain)
    sessions     onnxruntime sessions, providers, cond/uncond split execution
    prompt       text tokenizer, language/instruct resolution, prompt ids, the 2B batch layout
    duration     the rule-based duration estimate, speed and fixed durations
    text         long-text chunking, reference-text punctuation
    audio        reference loading and preparation, post-processing, chunk cross-fade
    audio_out    the one audio writer: WAV (16-bit PCM), FLAC, raw s16le; files, pipes, stdout
    cli          the `omnivoice-onnx` command and its subcommands
    cliutil      argument types, exit codes, one-line errors (shared with the toolchain)
    files        atomic file writing, sha256, JSON artefacts (shared with the toolchain)
    graphmeta    a graph's metadata_props read from the .onnx protobuf (no onnx package, no session)
"""

# The one version: pyproject.toml reads it from here (setuptools dynamic version).
__version__ = "0.3.0"

from omnivoice_onnx.api import OmniVoiceOnnx  # noqa: E402
from omnivoice_onnx.errors import UserError  # noqa: E402
from omnivoice_onnx.generate import (AudioChunk, Cancelled, GenerationConfig, Progress, Trace,  # noqa: E402
                                     VoiceClonePrompt)

__all__ = ["OmniVoiceOnnx", "UserError", "GenerationConfig", "Trace", "VoiceClonePrompt", "AudioChunk", "Progress",
           "Cancelled", "__version__"]
