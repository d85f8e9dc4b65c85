"""The batch job's list: upstream's JSONL test list read and checked line by line, the seed of a
line without one, the request hash a resume compares, the work estimate that orders the lines.

The list is upstream's `omnivoice-infer-batch --test_list` format, unchanged (omnivoice 0.2.1,
omnivoice/utils/data_utils.py:read_test_list): one JSON object per line, `id` and `text`
required; `ref_audio` + `ref_text` (voice cloning), `instruct` (voice design), `language_id`,
`duration` (seconds), `speed`; `language_name` is accepted and unused, as upstream's model does.
Four fields are this runtime's own: `seed` (an int), `voice` (a saved voice, omnivoice_onnx.voices),
`sentence_silence` (seconds between the text's chunks) and `volume` (a linear gain), piper's options.
A relative `ref_audio` is resolved against the list's folder (upstream: against the working directory).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import soundfile as sf

from omnivoice_onnx.core import duration as dur
from omnivoice_onnx.errors import UserError, check_path
from omnivoice_onnx.hashing import sha256_file
from omnivoice_onnx.limits import check_seed, check_sentence_silence, check_volume
from omnivoice_onnx.reading import MAX_JSON_DEPTH, Maybe, decode_text, parse_json, read_bounded, schema_problem
from omnivoice_onnx.voices import Voice, is_voice_path

RESULTS_FILE = "results.jsonl"
# upstream read_test_list's fields; language_name is read there but only its eval scripts use it.
UPSTREAM_FIELDS = (
    "id",
    "text",
    "ref_audio",
    "ref_text",
    "instruct",
    "language_id",
    "language_name",
    "duration",
    "speed",
)
OWN_FIELDS = ("seed", "voice", "sentence_silence", "volume")
# An id becomes the file name <id>.wav, written as .<id>.wav.tmp-<pid> first: 200 bytes leave room
# for both within the usual 255-byte name limit.
MAX_ID_BYTES = 200
# A test list or results.jsonl is read whole, up to this (~500k lines of ~500 bytes): /dev/zero as
# --test-list was read to 2.6 GB before "out of memory". Longer lists: split them.
MAX_LIST_BYTES = 256 << 20
RES_DIR_FIX = "pass a folder (or a path to create one at)"
# What the request hash covers besides the line: bump when the WAV encoding of the same samples
# changes, so a resume redoes files written the old way.
OUTPUT_FORMAT = "wav-pcm16-v1"
# The fields of a results.jsonl record, each with its meaning (tests hold records to exactly these; a
# failed line has error set and wav/wav_sha256 null; a skipped bad line has only id, line, error).
RESULT_FIELDS = {
    "id": "the line's id",
    "line": "its line number in the list",
    "wav": "the file name in res_dir",
    "wav_sha256": "sha256 of the WAV file's bytes",
    "audio_seconds": "seconds of audio",
    "synth_seconds": "wall seconds of its generate() call in its worker",
    "cpu_seconds": "CPU seconds of its worker process during that call (all its threads): unlike "
    "synth_seconds, not inflated by other work sharing the cores",
    "rtf": "synth_seconds / audio_seconds",
    "seed": "the seed used",
    "seed_from": "'line' (given), 'voice' (the saved voice's or preset's) or 'id' (seed_for_id)",
    "model_fingerprint": "the export's checkpoint fingerprint",
    "variant": "the transformer variant",
    "request_hash": "request_hash() of the line",
    "worker": "host:pid that synthesised it",
    "error": "null, or why the line has no WAV",
}


def seed_for_id(line_id: str) -> int:
    """The seed of a line without one: the first 8 bytes of sha256(id as UTF-8), big-endian,
    shifted right by one bit (a non-negative int63, so it is also a valid int64 everywhere).
    A stable function of the id alone: the same id gets the same seed on every machine and run."""
    return int.from_bytes(hashlib.sha256(line_id.encode("utf-8")).digest()[:8], "big") >> 1


@dataclass(frozen=True)
class Line:
    """One checked line of the test list."""

    number: int  # 1-based line number in the file (blank lines counted), for messages
    id: str  # a safe file name (check_id)
    text: str
    ref_audio: str | None  # absolute path (a relative one resolved against the list's folder)
    ref_text: str | None
    instruct: str | None
    language: str | None  # language_id, else the default language given to read_test_list
    duration: float | None  # seconds
    speed: float | None
    seed: int  # the line's seed, else its voice's (batch.run.check_lines), else seed_for_id(id)
    seed_from: str  # "line", "voice" or "id"
    voice: str | None  # a saved voice's name, or its file (absolute, as ref_audio)
    sentence_silence: float | None = None  # seconds of silence between the text's chunks (None: none)
    volume: float | None = None  # the output's linear gain (None: unchanged)

    def as_task(self) -> str:
        """What a worker reads of the line besides its validated request (its id, and the reference
        it caches encodings by), as JSON text: travels through a process pipe or a Ray block
        unchanged (an Arrow column would not hold a seed above 2**63)."""
        return json.dumps(dataclasses.asdict(self))


@dataclass(frozen=True)
class BadLine:
    """A line that cannot run, and why."""

    number: int
    id: str | None  # None when the line has no usable id
    problem: str

    def __str__(self) -> str:
        return f"line {self.number}{f' ({self.id})' if self.id else ''}: {self.problem}"


def check_id(value: Any) -> str:
    """The id as a file name, or ValueError: a string that names a file in res_dir and nothing
    else (no folder, no hidden file that could clash with the temporaries, no control characters)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"id must be a non-empty string, got {value!r}")
    if "/" in value or "\\" in value or value in (".", "..") or value.startswith("."):
        raise ValueError(f"id {value!r} is not a plain file name (no '/' or backslash, no leading '.')")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"id {value!r} contains a control character")
    if len(value.encode("utf-8")) > MAX_ID_BYTES:
        raise ValueError(f"id is longer than {MAX_ID_BYTES} bytes")
    return value


# The JSON type of each field parse_line reads (reading.schema_problem's notation; the id and the
# seed have their own checks, check_id and generate()'s check_seed).
LINE_SCHEMA = {
    "text": str,
    "ref_audio": Maybe(str),
    "ref_text": Maybe(str),
    "instruct": Maybe(str),
    "language_id": Maybe(str),
    "voice": Maybe(str),
    "duration": Maybe(float),
    "speed": Maybe(float),
    "sentence_silence": Maybe(float),
    "volume": Maybe(float),
}


def _positive(obj: dict[str, Any], key: str) -> float | None:
    value = obj.get(key)
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{key} must be a finite number > 0, got {value!r}")
    return None if value is None else float(value)


def _path_field(obj: dict[str, Any], key: str) -> str | None:
    """A path-valued field, through the one check every front end's paths pass (errors.check_path)."""
    value = obj.get(key)
    try:
        return None if value is None else check_path(value, key)
    except UserError as exc:
        raise ValueError(exc.problem) from None


def parse_line(obj: Any, number: int, base: Path, default_language: str | None) -> Line:
    """One JSON value of the list as a Line; ValueError naming the problem (types and pairings;
    what needs the model, OmniVoiceOnnx.validate checks)."""
    if not isinstance(obj, dict):
        raise ValueError(f"a line must be a JSON object, got {type(obj).__name__}")
    line_id = check_id(obj.get("id"))
    problem = schema_problem(obj, LINE_SCHEMA)
    if problem:
        raise ValueError(problem)
    text = obj["text"]
    if not text.strip():
        raise ValueError("text must be a non-empty string")
    ref_audio, voice = _path_field(obj, "ref_audio"), _path_field(obj, "voice")
    ref_text, instruct = obj.get("ref_text"), obj.get("instruct")
    language = obj.get("language_id") or default_language
    if voice is not None and is_voice_path(voice):
        voice = str((base / voice).absolute())  # a voice file, like ref_audio, is relative to the list
    seed = obj.get("seed")
    pause, volume = obj.get("sentence_silence"), obj.get("volume")
    try:  # generate()'s own checks: a bad line is refused before any work
        seed = None if seed is None else check_seed(seed)
        pause = None if pause is None else check_sentence_silence(pause)
        volume = None if volume is None else check_volume(volume)
    except UserError as exc:
        raise ValueError(str(exc)) from None
    if ref_audio is not None and ref_text is None:
        raise ValueError("ref_audio needs ref_text (this runtime has no speech recogniser)")
    if ref_text is not None and ref_audio is None:
        raise ValueError("ref_text was given without ref_audio")
    if voice is not None and (ref_audio is not None or instruct is not None):
        raise ValueError("voice cannot be combined with ref_audio or instruct (a voice is one of them)")
    return Line(
        number=number,
        id=line_id,
        text=text,
        ref_audio=None if ref_audio is None else str((base / ref_audio).absolute()),
        ref_text=ref_text,
        instruct=instruct,
        language=language,
        duration=_positive(obj, "duration"),
        speed=_positive(obj, "speed"),
        seed=seed_for_id(line_id) if seed is None else seed,
        seed_from="id" if seed is None else "line",
        voice=voice,
        sentence_silence=pause,
        volume=volume,
    )


@dataclass
class TestList:
    """A parsed test list: its good lines, its bad ones, and fields no reader here uses."""

    path: Path
    lines: list[Line]
    bad: list[BadLine]
    unknown_fields: list[str]


def read_test_list(path: Path, default_language: str | None = None) -> TestList:
    """Parse `path` (UserError if it cannot be read). Blank lines are skipped as upstream skips them;
    a line upstream would skip with a warning (bad JSON) is a bad line here, as are a missing or
    unsafe id, a missing text, a wrong type and every line of a repeated id (upstream would write
    them all to one file, the last one winning)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"test list {path} does not exist", "pass a JSONL file: one JSON object per line")
    if path.is_dir():
        raise UserError(f"test list {path} is a directory", "pass a JSONL file")
    data = read_bounded(path, MAX_LIST_BYTES, "test list", "split it into several lists")
    raw = decode_text(data, f"test list {path}", "save it as UTF-8")
    lines, bad, unknown = [], [], set()
    for number, text in enumerate(raw.splitlines(), 1):
        if not text.strip():
            continue
        try:
            obj = parse_json(text, "", "")
        except UserError as exc:
            bad.append(BadLine(number, None, f"not JSON within {MAX_JSON_DEPTH} levels ({exc.problem.strip()})"))
            continue
        try:
            lines.append(parse_line(obj, number, path.parent, default_language))
        except ValueError as exc:
            line_id = obj.get("id") if isinstance(obj, dict) and isinstance(obj.get("id"), str) else None
            bad.append(BadLine(number, line_id, str(exc)))
            continue
        unknown.update(set(obj) - set(UPSTREAM_FIELDS) - set(OWN_FIELDS))
    numbers: dict[str, list[int]] = {}
    for line in lines:
        numbers.setdefault(line.id, []).append(line.number)
    repeated = {i: n for i, n in numbers.items() if len(n) > 1}
    for line in (line for line in lines if line.id in repeated):
        bad.append(
            BadLine(
                line.number,
                line.id,
                f"duplicate id (lines {', '.join(map(str, repeated[line.id]))}): ids name the output files",
            )
        )
    lines = [line for line in lines if line.id not in repeated]
    bad.sort(key=lambda b: b.number)
    return TestList(path, lines, bad, sorted(unknown))


class FileDigests:
    """sha256 of the files lines refer to (references, voices), each read once per run."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, int], str] = {}

    def __call__(self, path: str | os.PathLike[str]) -> str:
        stat = os.stat(path)
        key = (os.fspath(path), stat.st_mtime_ns, stat.st_size)
        if key not in self._cache:
            self._cache[key] = "sha256:" + sha256_file(Path(path))
        return self._cache[key]

    def voice(self, voice: Voice) -> str:
        """A voice's digest: its file's, or a preset's content (it has no file)."""
        if not voice.is_preset:
            return self(voice.path)
        text = json.dumps(voice.to_json(), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def request_hash(line: Line, generation_config: dict[str, Any], digests: FileDigests, voice: Voice | None) -> str:
    """sha256 over everything that decides a line's WAV bytes, besides the model (recorded apart):
    the text and options, the seed, the whole generation config, the reference's and the voice's
    file contents (not their paths: moving a list with its files redoes nothing; a preset, which
    has no file, by its content), OUTPUT_FORMAT."""
    request = {
        "id": line.id,
        "text": line.text,
        "language": line.language,
        "instruct": line.instruct,
        "duration": line.duration,
        "speed": line.speed,
        "seed": line.seed,
        "ref_text": line.ref_text,
        "ref_audio": None if line.ref_audio is None else digests(line.ref_audio),
        "voice": None if voice is None else digests.voice(voice),
        "generation_config": generation_config,
        "format": OUTPUT_FORMAT,
        # only when given: a line without them keeps the hash it had before they existed (no redo on resume)
        **{name: getattr(line, name) for name in ("sentence_silence", "volume") if getattr(line, name) is not None},
    }
    text = json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def estimated_seconds(
    line: Line, frame_rate: int, duration_rules: dict[str, Any], voice_frames: int | None = None
) -> float:
    """Work estimate for ordering (upstream sorts by reference + generated seconds): the line's
    duration, or the runtime's rule-based estimate (omnivoice_onnx.core.duration), plus its reference."""
    ref_frames = voice_frames
    if line.ref_audio is not None:
        info = sf.info(line.ref_audio)
        ref_frames = int(info.frames / info.samplerate * frame_rate)
    ref_text = line.ref_text if line.ref_audio is not None else None
    if line.duration is not None:
        target = line.duration * frame_rate
    else:
        target = dur.estimate_target_tokens(
            line.text, ref_text, ref_frames if ref_text else None, duration_rules, line.speed or 1.0
        )
    return (target + (ref_frames or 0)) / frame_rate
