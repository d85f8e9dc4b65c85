"""Synthesise a corpus from upstream's JSONL test list: exact per line, order-free, resumable.

    omnivoice-onnx batch --test-list lines.jsonl --res-dir out/ [--model-dir onnx] [--workers N]
    omnivoice-onnx batch ... --ray [ADDRESS]          # the same job on Ray Data (omnivoice_onnx.batch_ray)

The list is upstream's `omnivoice-infer-batch --test_list` format, unchanged (omnivoice 0.2.1,
omnivoice/utils/data_utils.py:read_test_list): one JSON object per line, `id` and `text`
required; `ref_audio` + `ref_text` (voice cloning), `instruct` (voice design), `language_id`,
`duration` (seconds), `speed`; `language_name` is accepted and unused, as upstream's model does.
Two fields are this runtime's own: `seed` (an int) and `voice` (a saved voice, omnivoice_onnx.voices).
A relative `ref_audio` is resolved against the list's folder (upstream: against the working directory).

Every line is checked before any synthesis (its JSON, id, field types, reference file, language,
limits: OmniVoiceOnnx.validate); bad lines are reported together with their line numbers and the
run does not start, or, with skip_bad, they are skipped and their reason recorded.

Outputs in res_dir: `<id>.wav` (16-bit PCM, audio_out.encode_audio), each written under a
temporary name and renamed into place; `results.jsonl`, one record per id (RESULT_FIELDS).

Why each line is synthesised alone: upstream batches lines and draws all of a batch's random
numbers from one generator, so a line's audio depends on its batch-mates. Here a line is one
generate() call with its own seed (given, or seed_for_id(id)), so its WAV bytes are those of
`encode_audio(OmniVoiceOnnx.generate(text, ..., seed=seed)[0], ...)` whatever the worker count,
the order, the engine (in-process, a process pool, Ray) or a resume. A resume skips an id whose
record matches the line's request hash, the model fingerprint and the variant and whose WAV has
the recorded sha256; anything else is redone.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import soundfile as sf

from omnivoice_onnx import duration as dur
from omnivoice_onnx.api import OmniVoiceOnnx
from omnivoice_onnx.audio_out import encode_audio
from omnivoice_onnx.cliutil import check_output
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import (MAX_JSON_DEPTH, FolderLock, atomic_path, decode_text, open_append, parse_json,
                                  read_bounded, remove_stale_temporaries, resolved_folder, sha256_file)
from omnivoice_onnx.rng import check_seed
from omnivoice_onnx.voices import is_voice_path, load_voice, voices_dir

RESULTS_FILE = "results.jsonl"
# upstream read_test_list's fields; language_name is read there but only its eval scripts use it.
UPSTREAM_FIELDS = ("id", "text", "ref_audio", "ref_text", "instruct", "language_id", "language_name",
                   "duration", "speed")
OWN_FIELDS = ("seed", "voice")
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
    "seed_from": "'line' (given) or 'id' (seed_for_id)",
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
    seed: int  # the line's seed, else seed_for_id(id)
    seed_from: str  # "line" or "id"
    voice: str | None  # a saved voice's name, or its file (absolute, as ref_audio)

    def as_task(self, generation_config: dict[str, Any], voices: str) -> str:
        """What a worker needs, as JSON text: travels through a process pipe or a Ray block
        unchanged (an Arrow column would not hold a seed above 2**63)."""
        return json.dumps({**dataclasses.asdict(self), "generation_config": generation_config, "voices": voices})


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


def _optional(obj: dict[str, Any], key: str, kinds: tuple[type, ...], what: str) -> Any:
    value = obj.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
        raise ValueError(f"{key} must be {what}, got {value!r}")
    return value


def _positive(obj: dict[str, Any], key: str) -> float | None:
    value = _optional(obj, key, (int, float), "a number")
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{key} must be a finite number > 0, got {value!r}")
    return None if value is None else float(value)


def parse_line(obj: Any, number: int, base: Path, default_language: str | None) -> Line:
    """One JSON value of the list as a Line; ValueError naming the problem (types and pairings;
    what needs the model, OmniVoiceOnnx.validate checks)."""
    if not isinstance(obj, dict):
        raise ValueError(f"a line must be a JSON object, got {type(obj).__name__}")
    line_id = check_id(obj.get("id"))
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("text must be a non-empty string")
    ref_audio = _optional(obj, "ref_audio", (str,), "a path string")
    ref_text = _optional(obj, "ref_text", (str,), "a string")
    instruct = _optional(obj, "instruct", (str,), "a string")
    language = _optional(obj, "language_id", (str,), "a language id string") or default_language
    voice = _optional(obj, "voice", (str,), "a voice name or file")
    if voice is not None and is_voice_path(voice):
        voice = str((base / voice).absolute())  # a voice file, like ref_audio, is relative to the list
    seed = obj.get("seed")
    if seed is not None:
        try:
            seed = check_seed(seed)  # generate()'s own check: a bad line is refused before any work
        except UserError as exc:
            raise ValueError(str(exc)) from None
    if ref_audio is not None and ref_text is None:
        raise ValueError("ref_audio needs ref_text (this runtime has no speech recogniser)")
    if ref_text is not None and ref_audio is None:
        raise ValueError("ref_text was given without ref_audio")
    if voice is not None and (ref_audio is not None or instruct is not None):
        raise ValueError("voice cannot be combined with ref_audio or instruct (a voice is one of them)")
    return Line(number=number, id=line_id, text=text,
                ref_audio=None if ref_audio is None else str((base / ref_audio).absolute()),
                ref_text=ref_text, instruct=instruct, language=language,
                duration=_positive(obj, "duration"), speed=_positive(obj, "speed"),
                seed=seed_for_id(line_id) if seed is None else seed, seed_from="id" if seed is None else "line",
                voice=voice)


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
        bad.append(BadLine(line.number, line.id,
                           f"duplicate id (lines {', '.join(map(str, repeated[line.id]))}): ids name the output files"))
    lines = [line for line in lines if line.id not in repeated]
    bad.sort(key=lambda b: b.number)
    return TestList(path, lines, bad, sorted(unknown))


class FileDigests:
    """sha256 of the files lines refer to (references, voices), each read once per run."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, int], str] = {}

    def __call__(self, path: str | os.PathLike) -> str:
        stat = os.stat(path)
        key = (os.fspath(path), stat.st_mtime_ns, stat.st_size)
        if key not in self._cache:
            self._cache[key] = "sha256:" + sha256_file(Path(path))
        return self._cache[key]


def request_hash(line: Line, generation_config: dict[str, Any], digests: FileDigests,
                 voice_file: str | os.PathLike | None) -> str:
    """sha256 over everything that decides a line's WAV bytes, besides the model (recorded apart):
    the text and options, the seed, the whole generation config, the reference's and the voice's
    file contents (not their paths: moving a list with its files redoes nothing), OUTPUT_FORMAT."""
    request = {"id": line.id, "text": line.text, "language": line.language, "instruct": line.instruct,
               "duration": line.duration, "speed": line.speed, "seed": line.seed, "ref_text": line.ref_text,
               "ref_audio": None if line.ref_audio is None else digests(line.ref_audio),
               "voice": None if voice_file is None else digests(voice_file),
               "generation_config": generation_config, "format": OUTPUT_FORMAT}
    text = json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def estimated_seconds(line: Line, frame_rate: int, duration_rules: dict[str, Any],
                      voice_frames: int | None = None) -> float:
    """Work estimate for ordering (upstream sorts by reference + generated seconds): the line's
    duration, or the runtime's rule-based estimate (omnivoice_onnx.duration), plus its reference."""
    ref_frames = voice_frames
    if line.ref_audio is not None:
        info = sf.info(line.ref_audio)
        ref_frames = int(info.frames / info.samplerate * frame_rate)
    ref_text = line.ref_text if line.ref_audio is not None else None
    if line.duration is not None:
        target = line.duration * frame_rate
    else:
        target = dur.estimate_target_tokens(line.text, ref_text, ref_frames if ref_text else None, duration_rules,
                                            line.speed or 1.0)
    return (target + (ref_frames or 0)) / frame_rate


# --- the worker side: one loaded model, used by the in-process loop, a pool process or a Ray actor ---

class Synthesizer:
    """A loaded OmniVoiceOnnx and its caches. A reference used by many lines is encoded once:
    prompts are cached by (path, mtime, size, ref_text, preprocess_prompt), voices by spec."""

    def __init__(self, tts: OmniVoiceOnnx) -> None:
        self.tts = tts
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self._prompts: dict[tuple, Any] = {}
        self._voices: dict[tuple[str, str], Any] = {}

    @classmethod
    def load(cls, model_dir: str, variant: str | None, threads: int | None) -> "Synthesizer":
        """A worker's own model (CPU provider, `threads` onnxruntime threads)."""
        return cls(OmniVoiceOnnx.from_dir(model_dir, threads=threads, variant=variant))

    def voice(self, spec: str, voices: str):
        """The saved voice `spec` (omnivoice_onnx.voices), loaded once."""
        key = (spec, voices)
        if key not in self._voices:
            self._voices[key] = load_voice(spec, Path(voices), self.tts.metadata["model_fingerprint"])
        return self._voices[key]

    def generate_kwargs(self, task: dict[str, Any]) -> dict[str, Any]:
        """generate()'s keywords for a task, its reference replaced by the cached prompt: the same
        call generate(ref_audio=..., ref_text=...) makes inside (generate.preprocess)."""
        kwargs = {"language": task["language"], "instruct": task["instruct"], "duration": task["duration"],
                  "speed": task["speed"], "generation_config": task["generation_config"], "seed": task["seed"]}
        if task["voice"] is not None:
            kwargs.update(self.voice(task["voice"], task["voices"]).generate_kwargs())
        elif task["ref_audio"] is not None:
            preprocess = self.tts.generation_config(task["generation_config"]).preprocess_prompt
            stat = os.stat(task["ref_audio"])
            key = (task["ref_audio"], stat.st_mtime_ns, stat.st_size, task["ref_text"], preprocess)
            if key not in self._prompts:
                self._prompts[key] = self.tts.create_voice_clone_prompt(task["ref_audio"], task["ref_text"], preprocess)
            kwargs["voice_clone_prompt"] = self._prompts[key]
        return kwargs

    def run(self, task_json: str) -> dict[str, Any]:
        """Synthesise one task: its WAV bytes and timings, or the error that stopped it.

        A UserError (a limit the up-front check could not see) or an onnxruntime failure
        (RuntimeError) is this line's failure, recorded by the caller; the run goes on. Anything
        else is a bug and propagates."""
        task = json.loads(task_json)
        outcome = {"id": task["id"], "worker": self.worker, "model_fingerprint": self.tts.metadata["model_fingerprint"],
                   "variant": self.tts.variant, "wav": None, "audio_seconds": None, "synth_seconds": None,
                   "cpu_seconds": None, "error": None}
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            samples = self.tts.generate(task["text"], **self.generate_kwargs(task))[0]
        except (UserError, RuntimeError) as exc:
            outcome["error"] = f"{type(exc).__name__}: {exc}"
            return outcome
        outcome["synth_seconds"] = time.perf_counter() - start
        outcome["cpu_seconds"] = time.process_time() - cpu_start
        outcome["audio_seconds"] = len(samples) / self.tts.sample_rate
        outcome["wav"] = encode_audio(samples, self.tts.sample_rate, "wav")
        return outcome


# --- the driver side -------------------------------------------------------------------------------

@dataclass
class Options:
    """One batch run's settings (the CLI's flags)."""

    test_list: Path
    res_dir: Path
    model_dir: Path
    variant: str | None = None  # transformer variant; None: the runtime's default_variant()
    voices: Path | None = None  # voices folder override (omnivoice_onnx.voices.voices_dir)
    generation_config: dict[str, Any] = field(default_factory=dict)  # overrides of the export's defaults
    default_language: str | None = None  # for lines without language_id (upstream --lang_id)
    workers: int = 1  # processes (local) or actors (Ray)
    threads: int | None = None  # onnxruntime threads per worker; None: cores // workers
    skip_bad: bool = False  # run the good lines, record the bad ones (else refuse to start)
    ray: str | None = None  # None: local; "local": a local Ray; else a Ray cluster address
    progress: bool = True  # a tqdm bar when stderr is a terminal


def worker_threads(workers: int, threads: int | None) -> int:
    """onnxruntime threads per worker: the given count, else the cores this process may use split
    evenly over the workers (at least one each)."""
    if threads is not None:
        return threads
    return max(1, len(os.sched_getaffinity(0)) // workers)


@dataclass
class Plan:
    """What a run will do, decided before any synthesis."""

    todo: list[tuple[Line, str, float]]  # (line, request hash, estimated seconds), longest first
    done: list[Line]  # already in res_dir with a matching record
    bad: list[BadLine]  # skipped (skip_bad), recorded
    hashes: dict[str, str]  # id -> request hash of every good line
    tasks: dict[str, str]  # id -> task JSON of every line to do


def check_lines(tts: OmniVoiceOnnx, test_list: TestList, options: Options, voices: Path) -> tuple[list, dict]:
    """OmniVoiceOnnx.validate on every parsed line (no model work: references read, not encoded);
    returns the lines that fail it as BadLines, and the loaded Voice of each voice line by id."""
    bad, voice_of = [], {}
    for line in test_list.lines:
        kwargs = {"language": line.language, "instruct": line.instruct, "duration": line.duration,
                  "speed": line.speed, "generation_config": options.generation_config, "seed": line.seed}
        try:
            if line.voice is not None:
                voice_of[line.id] = load_voice(line.voice, voices, tts.metadata["model_fingerprint"])
                kwargs.update(voice_of[line.id].generate_kwargs())
            elif line.ref_audio is not None:
                kwargs.update(ref_audio=line.ref_audio, ref_text=line.ref_text)
            tts.validate(line.text, **kwargs)
        except UserError as exc:
            bad.append(BadLine(line.number, line.id, str(exc)))
    return bad, voice_of


def read_results(path: Path) -> dict[str, dict[str, Any]]:
    """The last record per id in a results.jsonl; a torn last line (a run killed while appending)
    and records without an id are dropped. Missing file: empty."""
    records: dict[str, dict[str, Any]] = {}
    if not os.path.lexists(path):
        return records
    fix = f"move {path} aside (the next run rewrites it and redoes the lines it cannot prove done)"
    text = decode_text(read_bounded(path, MAX_LIST_BYTES, "results file", fix), f"results file {path}", fix)
    for row in text.splitlines():
        try:
            record = parse_json(row, "", "")
        except UserError:
            continue
        if (isinstance(record, dict) and isinstance(record.get("id"), str)
                and type(record.get("line")) is int):  # what the rewrite sorts by
            records[record["id"]] = record
    return records


def is_done(line: Line, request: str, record: dict[str, Any] | None, res_dir: Path, model: dict[str, str]) -> bool:
    """True when `record` is a success for this very request and model and its WAV is intact."""
    if record is None or record.get("error") is not None or record.get("request_hash") != request:
        return False
    if record.get("model_fingerprint") != model["model_fingerprint"] or record.get("variant") != model["variant"]:
        return False
    wav = res_dir / f"{line.id}.wav"
    return wav.is_file() and "sha256:" + sha256_file(wav) == record.get("wav_sha256")


def make_plan(tts: OmniVoiceOnnx, test_list: TestList, options: Options, records: dict[str, dict[str, Any]],
              log: Callable[[str], None]) -> Plan:
    """Check every line, hash it, and split the good ones into done and to do (longest first).
    Bad lines are logged one per line; unless options.skip_bad, they stop the run here (UserError)."""
    voices = voices_dir(options.model_dir, options.voices)
    bad_model, voice_of = check_lines(tts, test_list, options, voices)
    bad = sorted(test_list.bad + bad_model, key=lambda b: b.number)
    for item in bad:
        log(f"bad line: {test_list.path}:{item}")
    if bad and not options.skip_bad:
        raise UserError(f"{len(bad)} bad line(s) in {test_list.path} (listed above); nothing was synthesised",
                        "fix them, or pass --skip-bad to run the rest and record these in results.jsonl")
    failed = {b.number for b in bad_model}
    config = dataclasses.asdict(tts.generation_config(options.generation_config))
    model = {"model_fingerprint": tts.metadata["model_fingerprint"], "variant": tts.variant}
    digests = FileDigests()
    plan = Plan([], [], bad, {}, {})
    for line in (line for line in test_list.lines if line.number not in failed):
        voice = voice_of.get(line.id)
        request = request_hash(line, config, digests, None if voice is None else voice.path)
        plan.hashes[line.id] = request
        if is_done(line, request, records.get(line.id), options.res_dir, model):
            plan.done.append(line)
            continue
        voice_frames = None if voice is None or voice.prompt is None else voice.prompt.ref_audio_tokens.shape[-1]
        plan.todo.append((line, request, estimated_seconds(line, tts.model.frame_rate, tts.runtime_config["duration"],
                                                           voice_frames)))
        plan.tasks[line.id] = line.as_task(options.generation_config, os.fspath(voices))
    plan.todo.sort(key=lambda item: -item[2])  # longest first: the last lines to start are short
    return plan


class ResultsLog:
    """results.jsonl: records appended as lines finish (a killed run keeps every complete line;
    a torn last one is dropped on reading), rewritten whole and atomically at the start and end
    of a run in the list's order (records of ids not in this list kept after them)."""

    def __init__(self, path: Path, records: dict[str, dict[str, Any]]) -> None:
        self.path = path
        self.records = dict(records)
        self._handle = None

    def rewrite(self, order: Iterable[dict[str, Any]]) -> None:
        """Replace the file by `order`'s records followed by the other known ones, atomically."""
        self.close()
        first = list(order)
        listed = {record["id"] for record in first if record.get("id") is not None}
        rest = [record for key, record in self.records.items() if key not in listed]
        with atomic_path(self.path) as tmp:
            with open(tmp, "w", encoding="utf-8") as handle:
                for record in first + rest:
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")

    def append(self, record: dict[str, Any]) -> None:
        """Add one record: one write of one whole line, flushed."""
        if self._handle is None:
            self._handle = open_append(self.path)
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._handle.flush()
        self.records[record["id"]] = record

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def bad_record(bad: BadLine) -> dict[str, Any]:
    """The record of a skipped bad line (no WAV)."""
    return {"id": bad.id, "line": bad.number, "error": f"bad line, skipped: {bad.problem}"}


def write_outcome(outcome: dict[str, Any], line: Line, request: str, res_dir: Path, model: dict[str, str]) -> dict:
    """Write a worker's WAV (atomically) and return its record; a worker that loaded another
    model (a cluster node with another bundle) stops the run."""
    if (outcome["model_fingerprint"], outcome["variant"]) != (model["model_fingerprint"], model["variant"]):
        raise UserError(f"worker {outcome['worker']} loaded model {outcome['model_fingerprint'][:23]} variant "
                        f"{outcome['variant']}, not {model['model_fingerprint'][:23]} {model['variant']}",
                        "give every node the same export folder (--model-dir) and --variant")
    record = {"id": line.id, "line": line.number, "wav": None, "wav_sha256": None,
              "audio_seconds": outcome["audio_seconds"], "synth_seconds": outcome["synth_seconds"],
              "cpu_seconds": outcome["cpu_seconds"], "rtf": None,
              "seed": line.seed, "seed_from": line.seed_from, **model, "request_hash": request,
              "worker": outcome["worker"], "error": outcome["error"]}
    if outcome["error"] is None:
        path = res_dir / f"{line.id}.wav"
        with atomic_path(path) as tmp:
            tmp.write_bytes(outcome["wav"])
        record.update(wav=path.name, wav_sha256="sha256:" + hashlib.sha256(outcome["wav"]).hexdigest(),
                      rtf=outcome["synth_seconds"] / outcome["audio_seconds"] if outcome["audio_seconds"] else None)
    return record


# --- local engines ---------------------------------------------------------------------------------

_WORKER: Synthesizer | None = None
_WORKER_ARGS: tuple[str, str, int] | None = None


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_S = 1.0  # elsewhere: how often a worker looks whether its driver is still there


def die_with_parent(parent: int) -> None:
    """End this process when `parent` (the driver) dies, however it dies: a driver killed with
    SIGKILL left its workers and the resource tracker running (~260 MB each, 79 s later). On
    Linux the kernel sends SIGKILL (prctl PR_SET_PDEATHSIG); elsewhere a daemon thread polls.
    A driver already gone before this ran is seen at once (this process was re-parented)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(PARENT_POLL_S)
            os._exit(1)
        threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    if os.getppid() != parent:
        os._exit(1)


def _pool_init(model_dir: str, variant: str, threads: int, driver: int) -> None:
    """A pool process: it dies with its driver `driver` (die_with_parent); Ctrl-C goes to the driver
    alone (it stops the pool). The model is loaded by the first task, so that a load failure
    reaches the driver as itself (an initializer's error would only break the pool)."""
    global _WORKER_ARGS
    die_with_parent(driver)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_ARGS = (model_dir, variant, threads)


def _pool_run(task_json: str) -> dict[str, Any]:
    global _WORKER
    if _WORKER is None:
        _WORKER = Synthesizer.load(*_WORKER_ARGS)
    return _WORKER.run(task_json)


def run_in_process(synth: Synthesizer, tasks: list[str]) -> Iterator[dict[str, Any]]:
    """The tasks one after another in this process."""
    for task in tasks:
        yield synth.run(task)


def run_pool(options: Options, variant: str, tasks: list[str], threads: int) -> Iterator[dict[str, Any]]:
    """The tasks on `options.workers` spawned processes, each holding one model; outcomes as they
    finish. Stopping early (Ctrl-C, SIGTERM, an error here) terminates the processes: they write
    nothing, so a line in progress is simply redone by the next run."""
    context = multiprocessing.get_context("spawn")  # no fork of a process holding onnxruntime threads
    pool = concurrent.futures.ProcessPoolExecutor(options.workers, mp_context=context, initializer=_pool_init,
                                                  initargs=(os.fspath(options.model_dir), variant, threads,
                                                            os.getpid()))
    try:
        futures = [pool.submit(_pool_run, task) for task in tasks]
        for future in concurrent.futures.as_completed(futures):
            try:
                yield future.result()
            except concurrent.futures.process.BrokenProcessPool:
                raise UserError("a worker process died (killed, or out of memory); the lines finished so far are "
                                "saved", "re-run the same command to continue, with fewer --workers if memory "
                                "is short") from None
    finally:
        # Python < 3.14 has no public terminate_workers(): without this, interpreter exit would
        # wait for every worker to finish its current line (minutes at full size).
        processes = list((pool._processes or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()


# --- the run -----------------------------------------------------------------------------------------

@dataclass
class Summary:
    """A run's figures (printed at the end, returned to callers)."""

    lines: int = 0  # lines in the list (good and bad)
    made: int = 0  # synthesised by this run
    already: int = 0  # skipped: done by an earlier run
    failed: int = 0  # synthesis failed (recorded)
    bad: int = 0  # bad lines skipped (skip_bad)
    audio_seconds: float = 0.0  # audio made by this run
    synth_seconds: float = 0.0  # the workers' generate() time, summed
    cpu_seconds: float = 0.0  # the workers' CPU time in generate(), summed
    wall_seconds: float = 0.0  # this run, from model load to the last file

    def text(self) -> str:
        speed = (f"RTF {self.wall_seconds / self.audio_seconds:.3f} (wall / audio), "
                 f"{self.audio_seconds / self.wall_seconds if self.wall_seconds else 0:.2f} audio s per wall s"
                 if self.audio_seconds else "no RTF: no audio made by this run")
        return (f"batch: {self.lines} lines: {self.made} made, {self.already} already done, {self.failed} failed, "
                f"{self.bad} bad skipped; {self.audio_seconds / 3600:.4f} h of audio ({self.audio_seconds:.1f} s) "
                f"in {self.wall_seconds:.1f} s wall: {speed}")


def run_batch(options: Options, log: Callable[[str], None] = lambda message: print(message, file=sys.stderr)) -> Summary:
    """Check the list, then synthesise every line not already done into options.res_dir.

    Raises UserError before any synthesis for bad lines (unless skip_bad), an unreadable list,
    model folder or an unwritable res_dir, or a res_dir another run is writing (its lock,
    files.FolderLock: two runs would each rewrite results.jsonl without the other's records).
    Ctrl-C and SIGTERM (as KeyboardInterrupt) stop it with every finished line's WAV and record
    in place and nothing half-written."""
    lock = FolderLock(resolved_folder(options.res_dir, "--res-dir", RES_DIR_FIX), RESULTS_FILE, "--res-dir",
                      wait_s=0)
    try:
        return _run_batch(options, log, lock)
    finally:
        lock.release()


def _run_batch(options: Options, log: Callable[[str], None], lock: FolderLock) -> Summary:
    """run_batch, holding `lock` from before results.jsonl is read (or, for a new res_dir, from
    its creation) to the end."""
    start = time.perf_counter()
    test_list = read_test_list(options.test_list, options.default_language)
    if test_list.unknown_fields:
        log(f"note: {options.test_list} has field(s) {', '.join(test_list.unknown_fields)} that nothing reads "
            f"(known: {', '.join(UPSTREAM_FIELDS + OWN_FIELDS)})")
    # Resolved once: every WAV and record goes where --res-dir led now, whatever its links become.
    options = dataclasses.replace(options, res_dir=lock.path.parent)
    check_output(options.res_dir, "--res-dir", "dir")  # a read-only or unwritable folder: now, not after the model
    if options.res_dir.is_dir():
        lock.acquire()  # before results.jsonl is read
    engine = ray_engine() if options.ray is not None else None  # Ray missing: now, too
    if engine is not None:
        engine.check_address(options.ray)  # a bad or dead address: now, before any output
    threads = worker_threads(options.workers, options.threads)
    local_single = options.ray is None and options.workers == 1
    # The driver's model checks every line (validate) and names the model; on one local worker it
    # is also the worker. Elsewhere it is released before the workers load theirs.
    tts = OmniVoiceOnnx.from_dir(options.model_dir, threads=threads if local_single else 1, variant=options.variant)
    model = {"model_fingerprint": tts.metadata["model_fingerprint"], "variant": tts.variant}
    results = ResultsLog(options.res_dir / RESULTS_FILE, read_results(options.res_dir / RESULTS_FILE))
    plan = make_plan(tts, test_list, options, results.records, log)
    summary = Summary(lines=len(test_list.lines) + len(test_list.bad), already=len(plan.done), bad=len(plan.bad))
    order = {line.id: line for line, _, _ in plan.todo}

    def listed_records() -> list[dict[str, Any]]:
        """This list's records in its order: good lines' latest, then each skipped bad line's."""
        good = [results.records[line.id] for line in test_list.lines if line.id in results.records
                and line.id in plan.hashes]
        return sorted(good + [bad_record(b) for b in plan.bad], key=lambda r: r["line"])

    options.res_dir.mkdir(parents=True, exist_ok=True)  # only now: a refused list leaves no folder behind
    if not lock.held:
        lock.acquire()
        if os.path.lexists(results.path):  # another run made the folder and finished in between
            raise UserError(f"another batch run wrote {results.path} while this one started", "re-run the command")
    results.rewrite(listed_records())  # a full res_dir fails here, before any synthesis
    for line, _, _ in plan.todo:
        remove_stale_temporaries(options.res_dir / f"{line.id}.wav")
    tasks = [plan.tasks[line.id] for line, _, _ in plan.todo]
    if options.ray is not None:
        del tts
        outcomes = engine.run_ray(options, model["variant"], tasks, [e for _, _, e in plan.todo], threads)
    elif options.workers > 1:
        del tts
        outcomes = run_pool(options, model["variant"], tasks, threads)
    else:
        outcomes = run_in_process(Synthesizer(tts), tasks)  # the driver's model: no second load
    log(f"batch: {len(plan.todo)} to synthesise ({len(plan.done)} already done, {len(plan.bad)} bad skipped) on "
        f"{'Ray ' + ('local' if options.ray == 'local' else options.ray) + ', ' if options.ray else ''}"
        f"{options.workers} worker(s) x {threads} thread(s); model {model['model_fingerprint'][:23]} {model['variant']}")
    bar = _progress_bar(len(plan.todo), options.progress, log)
    try:
        for outcome in outcomes:
            line = order[outcome["id"]]
            record = write_outcome(outcome, line, plan.hashes[line.id], options.res_dir, model)
            results.append(record)
            if record["error"] is None:
                summary.made += 1
                summary.audio_seconds += record["audio_seconds"]
                summary.synth_seconds += record["synth_seconds"]
                summary.cpu_seconds += record["cpu_seconds"]
            else:
                summary.failed += 1
                log(f"failed: line {line.number} ({line.id}): {record['error']}")
            if bar is not None:
                bar.update(1)
                bar.set_postfix(audio_s=f"{summary.audio_seconds:.0f}", failed=summary.failed, refresh=False)
    finally:
        if bar is not None:
            bar.close()
        outcomes.close()
        results.close()
    results.rewrite(listed_records())
    summary.wall_seconds = time.perf_counter() - start
    return summary


def _progress_bar(total: int, wanted: bool, log: Callable[[str], None]):
    """A tqdm bar with ETA on stderr when it is a terminal; None otherwise (logs stay clean).
    tqdm is not a core dependency of the runtime: without it the run says so once and goes on."""
    if not wanted or not sys.stderr.isatty() or total == 0:
        return None
    try:
        from tqdm import tqdm
    except ModuleNotFoundError:
        log("note: no progress bar: tqdm is not installed (pip install 'omnivoice-onnx[batch]')")
        return None
    return tqdm(total=total, unit="line", desc="batch", dynamic_ncols=True)


def ray_engine():
    """omnivoice_onnx.batch_ray, or a UserError naming the extra when Ray is not installed."""
    try:
        import ray.data  # noqa: F401  (batch_ray imports it where it runs; checked here, before any work)

        from omnivoice_onnx import batch_ray
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "ray":
            raise
        raise UserError("--ray needs Ray Data, which is not installed", "pip install 'omnivoice-onnx[ray]'") from None
    return batch_ray
