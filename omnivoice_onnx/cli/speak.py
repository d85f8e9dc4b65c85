"""Speak text with an OmniVoice ONNX export: to a WAV/FLAC/MP3/Opus file, to stdout, or as raw PCM to a player.

    omnivoice-onnx speak "Hello there." --out hello.wav               # 16-bit PCM WAV, 24 kHz mono
    echo "Hello." | omnivoice-onnx speak --out hello.flac             # text from stdin
    omnivoice-onnx speak "Hello." --seed 7 --out hello.mp3             # the server's mp3 bytes for this seed
    omnivoice-onnx speak --text-file story.txt --raw --stream | aplay -r 24000 -f S16_LE -c 1
    omnivoice-onnx speak "Hi." --out - > hi.wav                       # WAV to stdout
    omnivoice-onnx speak "Hi." --ref-audio me.wav --ref-text "What I say in me.wav." --out clone.wav
    omnivoice-onnx speak "Hi." --instruct "female, low pitch" --language en-US --out designed.wav

Text: the TEXT argument; `-`, or no TEXT with stdin a pipe, reads stdin; --text-file FILE reads a
UTF-8 file. Output: --out FILE (format from the extension: .wav 16-bit PCM, .flac, .pcm/.raw raw
s16le, .mp3, .opus/.ogg: every format the server answers, in the same bytes for the same samples),
--out - (WAV to stdout), --raw (raw s16le to stdout, as piper's --output-raw); without
--out, stdout when it is a pipe. Regular files are written atomically (a Ctrl-C leaves the old
file or none); devices, pipes and stdout are written in place; a symlink's target is written.

--stream writes each chunk as soon as it is decoded: the text is cut into sentence-sized chunks
(about 3 s of speech each) instead of upstream's 30 s threshold, so the first audio comes after
the first chunk. Its tokens are those of the non-streamed run with the same chunking and --seed;
its level is fixed from the first chunk when there is no reference. Without --stream, the output
is upstream generate()'s for the seed.

Pauses and volume, as piper's flags: --sentence-silence SECONDS adds that much silence between
the text's chunks (the text is then cut into chunks of about 3 s, as with --stream; one chunk
gets none); --volume GAIN multiplies every sample (0.5 half as loud), clipped to full scale in
the 16-bit output.

Modes: voice cloning (--ref-audio + --ref-text, or --voice NAME|FILE saved with `omnivoice-onnx
voice add`), voice design (--instruct, or a designed --voice: a preset such as alloy or marin, or
one saved with its seed), or neither (a voice the model chooses). An --instruct in
prose ("a deep, calm male voice") has its vocabulary words applied and the rest ignored, both
named in a note on stderr; --strict-instructions refuses it instead. A one-line summary
(audio length, RTF, seed, destination) goes to stderr, a terminal or a log alike; a progress line
(chunk, step, ETA) only when stderr is a terminal; --quiet silences both. stdout carries audio only.
No --seed draws one, and the summary prints it so the run can be repeated. --out into a folder
that does not exist is refused (create it first).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from omnivoice_onnx import audio_out
from omnivoice_onnx.bundle import check_folder
from omnivoice_onnx.cli.flags import Subparsers, add_bundle_flags, add_pause_volume_flags
from omnivoice_onnx.core import request
from omnivoice_onnx.core.instruct import instructions_note
from omnivoice_onnx.core.shapes import Progress, Request
from omnivoice_onnx.errors import UserError, printable
from omnivoice_onnx.limits import (
    LIMIT_ENV_PREFIX,
    MAX_SPEED,
    MIN_SPEED,
    limit,
)
from omnivoice_onnx.program import DURATION, NUM_STEP, SCORE_FACTOR, SEED, SPEED, THREADS, note
from omnivoice_onnx.reading import decode_text, read_bounded, read_limited
from omnivoice_onnx.sessions import PROVIDERS

if TYPE_CHECKING:
    from omnivoice_onnx.api import OmniVoiceOnnx

PROG = "omnivoice-onnx"


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "speak",
        help="speak text to a file, stdout or a pipe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "text", nargs="?", metavar="TEXT", help="the text to speak; '-' (or nothing, with stdin a pipe) reads stdin"
    )
    parser.add_argument(
        "--text-file",
        "--text_file",
        dest="text_file",
        type=Path,
        metavar="FILE",
        help="read the text from a UTF-8 file instead",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--out",
        "-o",
        "--output-file",
        "--output_file",
        dest="out",
        metavar="FILE",
        help="where the audio goes: a .wav (16-bit PCM), .flac, .pcm/.raw (s16le), .mp3 or .opus file, "
        "or '-' for WAV on stdout (default: stdout when it is a pipe)",
    )
    out.add_argument(
        "--raw",
        "--output-raw",
        "--output_raw",
        dest="raw",
        action="store_true",
        help="raw 16-bit little-endian mono PCM on stdout (no header; 24 kHz: aplay -r 24000 -f S16_LE)",
    )
    out.add_argument(
        "--stream",
        action="store_true",
        help="write each sentence-sized chunk as soon as it is ready (pair with --raw or a pipe)",
    )
    out.add_argument("--quiet", "-q", action="store_true", help="no progress line and no summary on stderr")
    gen = parser.add_argument_group("generation (upstream generate()'s arguments)")
    gen.add_argument(
        "--language",
        default=None,
        help="language name (English), id (en) or tag (en-US, pt_BR); default: none, as upstream (the model infers it)",
    )
    gen.add_argument(
        "--instruct",
        default=None,
        help="voice design, e.g. 'female, low pitch, british accent' (prose: its vocabulary words are "
        "applied, the rest ignored and named on stderr)",
    )
    gen.add_argument(
        "--strict-instructions",
        "--strict_instructions",
        dest="strict_instructions",
        action="store_true",
        help="refuse an --instruct with words outside the vocabulary",
    )
    gen.add_argument(
        "--ref-audio",
        "--ref_audio",
        dest="ref_audio",
        type=Path,
        metavar="WAV",
        help="voice cloning: a reference recording (3-10 s of clear speech; any rate, mono or stereo)",
    )
    gen.add_argument(
        "--ref-text",
        "--ref_text",
        dest="ref_text",
        metavar="TEXT",
        help="voice cloning: the words spoken in --ref-audio (required with it: no speech recogniser)",
    )
    gen.add_argument(
        "--voice",
        metavar="NAME|FILE",
        help="a voice by name, a saved one else a preset (alloy, marin, ...: `omnivoice-onnx voice list` shows "
        "both), or a voice file's path; its seed is used unless --seed is given",
    )
    gen.add_argument(
        "--speed", type=SPEED, default=None, help=f"speaking rate factor (1.0 normal, {MIN_SPEED:g}-{MAX_SPEED:g})"
    )
    gen.add_argument(
        "--duration", type=DURATION, default=None, help="length of the speech in seconds (overrides --speed)"
    )
    gen.add_argument(
        "--num-step",
        "--num_step",
        dest="num_step",
        type=NUM_STEP,
        default=None,
        help="unmasking steps (default: the export's, upstream's 32); fewer is faster and rougher",
    )
    gen.add_argument(
        "--guidance-scale",
        "--guidance_scale",
        dest="guidance_scale",
        type=SCORE_FACTOR,
        default=None,
        help="classifier-free guidance scale (default: the export's, upstream's 2.0)",
    )
    add_pause_volume_flags(gen)
    gen.add_argument(
        "--seed",
        type=SEED,
        default=None,
        help="random seed, as torch.manual_seed before upstream's generate() (default: a fresh one, "
        "printed in the summary)",
    )
    run = parser.add_argument_group("model and runtime")
    add_bundle_flags(run)
    run.add_argument(
        "--threads",
        type=THREADS,
        default=None,
        help="onnxruntime intra-op threads (default: $OMNIVOICE_ORT_THREADS, else one per core)",
    )
    run.add_argument("--provider", default="cpu", choices=PROVIDERS, help="onnxruntime provider")
    return parser


def read_text(args: argparse.Namespace, stdin: TextIO | None = None) -> str:
    """The text to speak, from TEXT, '-', piped stdin or --text-file; UserError if none or empty.
    A file or stdin is read up to the bytes MAX_TEXT_CHARS can take in UTF-8 (4 a character) and
    decoded strictly: `/dev/zero` or a non-UTF-8 byte is one line, not gigabytes or a traceback."""
    stdin = sys.stdin if stdin is None else stdin
    if args.text is not None and args.text_file is not None:
        raise UserError("both TEXT and --text-file were given", "pass one of them")
    most = int(limit("MAX_TEXT_CHARS")) * 4
    too_long = f"split the text, or raise the limit with the environment variable {LIMIT_ENV_PREFIX}MAX_TEXT_CHARS"
    if args.text_file is not None:
        data = read_bounded(args.text_file, most, "--text-file", too_long)
        text = decode_text(data, f"--text-file {args.text_file}", "save it as UTF-8")
    elif args.text == "-" or (args.text is None and stdin is not None and not stdin.isatty()):
        source = getattr(stdin, "buffer", None)
        data = read_limited(source, most, "stdin", too_long) if source else stdin.read(most + 1).encode()
        text = decode_text(data, "stdin", "pipe UTF-8 text, or pass it as TEXT")
    elif args.text is None:
        raise UserError("no text to speak", "pass TEXT, --text-file FILE, or pipe the text on stdin")
    else:
        text = args.text
    if not text.strip():
        raise UserError("the text to speak is empty", "pass some words")
    return text.strip()


def output_spec(args: argparse.Namespace) -> tuple[str, str | None]:
    """(destination, format) from --out/--raw; checked at once (audio_out.check_destination)."""
    if args.raw:
        if args.out not in (None, audio_out.STDOUT):
            raise UserError(
                "--raw writes to stdout, and --out names a file",
                "drop --out, or name a .pcm file with --out instead of --raw",
            )
        dest, fmt = audio_out.STDOUT, "pcm"
    elif args.out is None:
        if sys.stdout.isatty():
            raise UserError(
                "no output given", "pass --out FILE (.wav, .flac, .pcm, .mp3, .opus), or pipe stdout (--out - or --raw)"
            )
        dest, fmt = audio_out.STDOUT, None
    else:
        dest, fmt = args.out, None
    return dest, audio_out.check_destination(dest, fmt, "--out")


def generation_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """validate()'s keywords the flags give, the seed included (None flags are left to the API's
    defaults)."""
    if (args.ref_audio is None) != (args.ref_text is None):
        raise UserError(
            "voice cloning needs both --ref-audio and --ref-text",
            "pass the reference and its transcript, or a saved --voice",
        )
    if args.voice is not None and args.ref_audio is not None:
        raise UserError("--voice and --ref-audio both give a voice", "pass one of them")
    return request.keywords(vars(args))  # the one builder, as the server's body and batch's lines use


def voice_kwargs(args: argparse.Namespace, tts: OmniVoiceOnnx, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with --voice's merged in, as the server resolves a voice's name: a mode (auto:
    nothing; design: --instruct required), a saved voice (its clone prompt or instruct), else a
    preset; or a voice file. A flag that gives the same thing twice is refused; the voice's seed
    is the run's when --seed gives none (a designed voice is its instruct AND its seed)."""
    if args.voice is None:
        return kwargs
    from omnivoice_onnx import voices

    if args.voice.casefold() in voices.MODES:
        if args.voice.casefold() == "design" and kwargs.get("instruct") is None:
            raise UserError(voices.design_needs("--instruct"), "pass --instruct, or choose another --voice")
        return kwargs
    folder = voices.voices_dir(tts.bundle, args.voices)
    voice = voices.load_voice(args.voice, folder, tts.metadata["model_fingerprint"])
    given = voice.generate_kwargs()
    clash = [key for key in given if kwargs.get(key) is not None]
    if clash:
        raise UserError(f"--voice {args.voice} already sets {', '.join(clash)}", f"drop --{clash[0]}")
    seed = voice.seed if kwargs.get("seed") is None else kwargs["seed"]
    return {**kwargs, **given, "seed": seed}


class Reporter:
    """What goes to stderr: the one-line summary (with the seed) unless --quiet, wherever stderr
    goes (a log keeps the seed of a run worth repeating); the progress line only on a terminal
    (its carriage returns would fill a log). The ETA and the real-time factor count from begin()
    (generation), the load time before it."""

    def __init__(self, summaries: bool, progress_line: bool, err: TextIO | None = None) -> None:
        self.summaries, self.progress_line, self.err = summaries, progress_line, err or sys.stderr
        self.start = self.generation_start = time.monotonic()
        self.drawn = False

    @classmethod
    def for_stderr(cls, quiet: bool) -> Reporter:
        """The command line's: the summary unless quiet, the progress line on a terminal unless quiet."""
        return cls(not quiet, not quiet and sys.stderr.isatty())

    def begin(self) -> None:
        """Generation starts now (the model is loaded)."""
        self.generation_start = time.monotonic()

    def progress(self, p: Progress) -> None:
        if not self.progress_line:
            return
        done = ((p.chunk - 1) + p.step / p.steps) / p.chunks
        elapsed = time.monotonic() - self.generation_start
        eta = elapsed * (1 - done) / done if done > 0 else 0.0
        self.err.write(f"\r{PROG}: chunk {p.chunk}/{p.chunks} step {p.step}/{p.steps}  ETA {eta:4.0f} s \x1b[K")
        self.err.flush()
        self.drawn = True

    def summary(self, seconds: float, seed: int, dest: str) -> None:
        if not self.summaries:
            return
        now = time.monotonic()
        generation, load = now - self.generation_start, self.generation_start - self.start
        rtf = f"RTF {generation / seconds:.2f}" if seconds > 0 else "no RTF: no audio"
        self.err.write(
            ("\r\x1b[K" if self.drawn else "")
            + printable(  # the line's own text: one safe line
                f"{PROG}: {seconds:.2f} s of audio in {generation:.2f} s ({rtf}; model loaded in {load:.2f} s), seed "
                f"{seed} -> {dest}"
            )
            + "\n"
        )
        self.err.flush()


@dataclass
class Spoken:
    """What speak() wrote."""

    samples: int
    sample_rate: int
    seed: int

    @property
    def seconds(self) -> float:
        return self.samples / self.sample_rate


def speak(
    tts: OmniVoiceOnnx, req: Request, sink: audio_out.AudioSink, stream: bool, reporter: Reporter | None = None
) -> Spoken:
    """Run a validated request (tts.validate, with `stream` as given there) and write it to `sink`
    (closed on success, aborted on any error): whole with generate(), or chunk by chunk with
    stream(). The one synthesis path of the command line (omnivoice-onnx speak, infer_onnx.py --text)."""
    progress = reporter.progress if reporter is not None else None
    if reporter is not None:
        reporter.begin()
    with sink:
        if stream:
            for chunk in tts.stream(req, progress=progress):
                sink.write(chunk.samples)
        else:
            (audio,) = tts.generate(req, progress=progress)
            sink.write(audio)
    return Spoken(sink.frames, tts.sample_rate, req.seed)


def run(args: argparse.Namespace) -> int:
    """omnivoice-onnx speak: every input checked before the model is loaded, then speak()."""
    from omnivoice_onnx.api import OmniVoiceOnnx
    from omnivoice_onnx.sessions import check_provider

    text = read_text(args)
    dest, fmt = output_spec(args)
    kwargs = generation_kwargs(args)
    check_provider(args.provider)
    check_folder(args.model_dir)
    reporter = Reporter.for_stderr(args.quiet)
    tts = OmniVoiceOnnx.from_dir(args.model_dir, provider=args.provider, threads=args.threads, variant=args.variant)
    kwargs = voice_kwargs(args, tts, kwargs)
    req = tts.validate(text, **kwargs, stream=args.stream)  # the one check; the seed drawn there if None
    if not args.quiet:
        for reading in req.instruct_readings[:1]:
            if reading.ignored:
                note(instructions_note(reading))
    sink = audio_out.open_output(dest, fmt, tts.sample_rate, stream=args.stream, what="--out")
    spoken = speak(tts, req, sink, args.stream, reporter)
    reporter.summary(spoken.seconds, spoken.seed, "stdout" if dest == audio_out.STDOUT else str(dest))
    return 0
