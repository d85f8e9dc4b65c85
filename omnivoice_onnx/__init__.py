"""omnivoice_onnx: run an OmniVoice ONNX export with numpy + onnxruntime alone (no torch).

The host side of upstream `OmniVoice.generate()` (omnivoice 0.2.1) reproduced step by step, so a
given seed gives upstream's tokens; the reference a C# or mobile port reads line by line. It
never imports torch, transformers, omnivoice, pydub or the toolchain (omnivoice_export).

    from omnivoice_onnx import OmniVoiceOnnx
    tts = OmniVoiceOnnx.from_dir("onnx")
    audios = tts.generate("Hello.", language="English", seed=1)
    for chunk in tts.stream("First sentence. Second one.", seed=1):   # audio as each chunk is ready
        print(chunk.index, chunk.count, chunk.samples.shape)   # float32 samples at chunk.sample_rate

The command line: `omnivoice-onnx speak "Hello." --out hello.wav` (omnivoice_onnx.__main__; one
module per command in cli/).

Modules, by floor (a module imports only from floors below its own; tests/test_structure.py
holds the package to no import circle, at most 8 floors, no module over 600 lines):
    ground       errors (UserError, the machine's errors, the text and path checks), limits
                 (every request limit and range), files (atomic writes, folders, locks, output
                 checks), hashing (sha256, file entries), reading (bounded reads, JSON and its
                 schemas), contract (the graphs' I/O contract), graphmeta (metadata_props without
                 onnx), version
    core/        the host loop a porter reads: shapes (a request's data), rng, schedule, scoring,
                 text, duration, prompt, plan, audio, request (the one validation), generate
                 (see core/__init__.py)
    model        sessions (onnxruntime, providers, split execution), bundle (the export folder:
                 paths, variants, the report, hashes against it, metadata; runtime_config: its
                 runtime-config.json's schema and loader; verified: the record of files already
                 hashed), api (OmniVoiceOnnx), voices (saved voices), fetch (pack and download,
                 with resumable: a bounded, resumable HTTP GET), audio_formats (samples to
                 each format's bytes), audio_out (the one audio writer: files, devices, pipes,
                 stdout)
    vectors/     the conformance vectors a port replays: format, cases, record (write and
                 replay), compare, rules (see vectors/__init__.py)
    front ends   __main__ (the `omnivoice-onnx` program and its command registry), cli/ (one
                 module per command; flags and exits: argument types, exit codes, one-line errors,
                 shared with the toolchain; vectors: the vectors' command), serve/ (the network
                 servers: door, the front door's limits and error table; app, OpenAI-style HTTP,
                 with connection, browser, middleware and page; wyoming, with wyoming_events, its
                 reader; service: their requests and state; pool: the workers), batch/ (run, the
                 driver; lines, the JSONL list; pool and ray_engine, its engines)
"""

from omnivoice_onnx.api import OmniVoiceOnnx
from omnivoice_onnx.core.generate import Trace
from omnivoice_onnx.core.shapes import AudioChunk, GenerationConfig, Progress, Request, VoiceClonePrompt
from omnivoice_onnx.errors import Cancelled, UserError
from omnivoice_onnx.version import __version__

__all__ = [
    "OmniVoiceOnnx",
    "UserError",
    "GenerationConfig",
    "Request",
    "Trace",
    "VoiceClonePrompt",
    "AudioChunk",
    "Progress",
    "Cancelled",
    "__version__",
]
