"""Synthesise a corpus from upstream's JSONL test list: exact per line, order-free, resumable.

    omnivoice-onnx batch --test-list lines.jsonl --res-dir out/ [--model-dir onnx] [--workers N]
    omnivoice-onnx batch ... --ray [ADDRESS]          # the same job on Ray Data (batch.ray_engine)

The list is upstream's `omnivoice-infer-batch --test_list` format, unchanged (its fields and
their reading: batch.lines). This module is the driver: it checks and plans, hands tasks to an
engine (this module's Synthesizer in process, batch.pool's processes, batch.ray_engine's Ray
actors: the engines know nothing of the model, the driver hands them Synthesizer) and writes every file.

Every line is checked before any synthesis (its JSON, id, field types, reference file, language,
limits: OmniVoiceOnnx.validate); bad lines are reported together with their line numbers and the
run does not start, or, with skip_bad, they are skipped and their reason recorded.

Outputs in res_dir: `<id>.wav` (16-bit PCM, audio_formats.encode_audio), each written under a
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

import dataclasses
import hashlib
import json
import os
import pickle
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from omnivoice_onnx.api import OmniVoiceOnnx
from omnivoice_onnx.audio_formats import encode_audio
from omnivoice_onnx.batch.lines import (
    MAX_LIST_BYTES,
    OWN_FIELDS,
    RES_DIR_FIX,
    RESULTS_FILE,
    UPSTREAM_FIELDS,
    BadLine,
    FileDigests,
    Line,
    TestList,
    estimated_seconds,
    read_test_list,
    request_hash,
)
from omnivoice_onnx.batch.pool import run_pool
from omnivoice_onnx.core.generate import encode_reference
from omnivoice_onnx.core.request import keywords
from omnivoice_onnx.core.shapes import Reference, Request, VoiceClonePrompt
from omnivoice_onnx.errors import UserError, say
from omnivoice_onnx.files import (
    FolderLock,
    atomic_path,
    check_output,
    make_folder,
    open_append,
    remove_stale_temporaries,
    resolved_folder,
)
from omnivoice_onnx.hashing import sha256_file
from omnivoice_onnx.reading import decode_text, parse_json, read_bounded, schema_problem
from omnivoice_onnx.sessions import worker_threads
from omnivoice_onnx.voices import Voice, load_voice, voices_dir

if TYPE_CHECKING:  # the batch extra's bar; without it a run has none
    from tqdm import tqdm

# --- the worker side: one loaded model, used by the in-process loop, a pool process or a Ray actor ---


class Synthesizer:
    """A loaded OmniVoiceOnnx that runs the driver's validated Requests. A reference used by many
    lines is encoded once: its prompt is cached by (path, mtime, size, ref_text, preprocess_prompt)."""

    def __init__(self, tts: OmniVoiceOnnx) -> None:
        self.tts = tts
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        # (file, mtime, size, transcript, preprocess) -> its prompt
        self._prompts: dict[tuple[str, int, int, str | None, bool], VoiceClonePrompt] = {}

    @classmethod
    def load(cls, model_dir: str, variant: str | None, threads: int | None) -> Synthesizer:
        """A worker's own model (CPU provider, `threads` onnxruntime threads)."""
        return cls(OmniVoiceOnnx.from_dir(model_dir, threads=threads, variant=variant))

    def cached_reference(self, task: dict[str, Any], req: Request) -> Request:
        """`req` with its prepared reference replaced by the cached prompt of the same file and
        transcript (encoded here the first time): what generate() would encode, encoded once."""
        reference = req.references[0]
        if task["ref_audio"] is None or not isinstance(reference, Reference):
            return req
        stat = os.stat(task["ref_audio"])
        key = (task["ref_audio"], stat.st_mtime_ns, stat.st_size, task["ref_text"], req.config.preprocess_prompt)
        if key not in self._prompts:
            self._prompts[key] = encode_reference(self.tts.model, reference)
        return dataclasses.replace(req, references=[self._prompts[key]] * len(req.references))

    def run(self, row: dict[str, Any]) -> dict[str, Any]:
        """Synthesise one task (`row`: its JSON and the driver's validated Request): its WAV bytes
        and timings, or the error that stopped it. The Request is not validated again.

        A UserError (a limit the up-front check could not see) or an onnxruntime failure
        (RuntimeError) is this line's failure, recorded by the caller; the run goes on. Anything
        else is a bug and propagates."""
        task, req = json.loads(row["task"]), row["request"]
        outcome = {
            "id": task["id"],
            "worker": self.worker,
            "model_fingerprint": self.tts.metadata["model_fingerprint"],
            "variant": self.tts.variant,
            "wav": None,
            "audio_seconds": None,
            "synth_seconds": None,
            "cpu_seconds": None,
            "error": None,
        }
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            samples = self.tts.generate(self.cached_reference(task, req))[0]
        except (UserError, RuntimeError) as exc:
            outcome["error"] = f"{type(exc).__name__}: {exc}"
            return outcome
        outcome["synth_seconds"] = time.perf_counter() - start
        outcome["cpu_seconds"] = time.process_time() - cpu_start
        outcome["audio_seconds"] = len(samples) / self.tts.sample_rate
        outcome["wav"] = encode_audio(samples, self.tts.sample_rate, "wav")
        return outcome


class SynthActor:
    """A Ray Data actor: one loaded model, a block of tasks in (each Request pickled: ray_rows),
    their outcomes out (WAV bytes in a binary column, the rest as JSON text so that no field is
    squeezed into an Arrow type)."""

    def __init__(self, model_dir: str, variant: str, threads: int) -> None:
        self.synth = Synthesizer.load(model_dir, variant, threads)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outcomes = [
            self.synth.run({"task": task, "request": pickle.loads(req)})
            for task, req in zip(batch["task"], batch["request"])
        ]
        return {
            "wav": np.array([o.pop("wav") or b"" for o in outcomes], dtype=object),
            "outcome": np.array([json.dumps(o) for o in outcomes], dtype=object),
        }


# --- the in-process engine ---------------------------------------------------------------------------


def run_in_process(synth: Synthesizer, tasks: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The tasks one after another in this process."""
    for task in tasks:
        yield synth.run(task)


# --- the driver side -------------------------------------------------------------------------------


@dataclass
class Options:
    """One batch run's settings (the CLI's flags)."""

    test_list: Path
    res_dir: Path
    model_dir: Path
    variant: str | None = None  # transformer variant; None: the runtime's default (bundle.default_variant)
    voices: Path | None = None  # voices folder override (omnivoice_onnx.voices.voices_dir)
    generation_config: dict[str, Any] = field(default_factory=dict)  # overrides of the export's defaults
    default_language: str | None = None  # for lines without language_id (upstream --lang_id)
    workers: int = 1  # processes (local) or actors (Ray)
    threads: int | None = None  # onnxruntime threads per worker; None: cores // workers
    skip_bad: bool = False  # run the good lines, record the bad ones (else refuse to start)
    ray: str | None = None  # None: local; "local": a local Ray; else a Ray cluster address
    progress: bool = True  # a tqdm bar when stderr is a terminal


@dataclass
class Plan:
    """What a run will do, decided before any synthesis."""

    todo: list[tuple[Line, str, float]]  # (line, request hash, estimated seconds), longest first
    done: list[Line]  # already in res_dir with a matching record
    bad: list[BadLine]  # skipped (skip_bad), recorded
    hashes: dict[str, str]  # id -> request hash of every good line
    tasks: dict[str, dict[str, Any]]  # id -> {"task": its JSON, "request": its validated Request}


def check_lines(
    tts: OmniVoiceOnnx, test_list: TestList, options: Options, voices: Path
) -> tuple[list[BadLine], dict[str, Voice], dict[str, Request]]:
    """OmniVoiceOnnx.validate on every parsed line, once (no model work: references read, not
    encoded); returns the lines that fail it as BadLines, the loaded Voice of each voice line by
    id, and each good line's Request by id (what its worker runs). A voice line without a seed of
    its own takes its voice's (seed_from "voice": a designed voice is its instruct and its seed),
    written back into test_list.lines. Lines naming the same reference file and transcript share
    one prepared Reference (its waveform held once, however many lines use it)."""
    bad: list[BadLine] = []
    voice_of: dict[str, Voice] = {}
    requests: dict[str, Request] = {}
    shared: dict[tuple[str, str | None], list[Reference | VoiceClonePrompt | None]] = {}
    for at, line in enumerate(test_list.lines):
        try:
            if line.voice is not None:
                voice = voice_of[line.id] = load_voice(line.voice, voices, tts.metadata["model_fingerprint"])
                if line.seed_from == "id" and voice.seed is not None:
                    line = test_list.lines[at] = dataclasses.replace(line, seed=voice.seed, seed_from="voice")
            kwargs = keywords(dataclasses.asdict(line), options.generation_config)  # the one builder
            if line.voice is not None:
                kwargs.update(voice_of[line.id].generate_kwargs())
            req = tts.validate(line.text, **kwargs)
            if line.ref_audio is not None:
                references = shared.setdefault((line.ref_audio, line.ref_text), req.references)
                req = dataclasses.replace(req, references=references)
            requests[line.id] = req
        except UserError as exc:
            bad.append(BadLine(line.number, line.id, str(exc)))
    return bad, voice_of, requests


def ray_rows(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tasks as Ray Data rows: str/bytes columns, each Request pickled (SynthActor unpickles
    it). The local engines pass the Request objects as they are."""
    return [{"task": task["task"], "request": pickle.dumps(task["request"])} for task in tasks]


RECORD_KEYS = {"id": str, "line": int}  # what a results.jsonl record must hold to be kept (the rewrite sorts by line)


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
        if schema_problem(record, RECORD_KEYS) is None:
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


def make_plan(
    tts: OmniVoiceOnnx,
    test_list: TestList,
    options: Options,
    records: dict[str, dict[str, Any]],
    log: Callable[[str], None],
) -> Plan:
    """Check every line, hash it, and split the good ones into done and to do (longest first).
    Bad lines are logged one per line; unless options.skip_bad, they stop the run here (UserError)."""
    voices = voices_dir(tts.bundle, options.voices)
    bad_model, voice_of, requests = check_lines(tts, test_list, options, voices)
    bad = sorted(test_list.bad + bad_model, key=lambda b: b.number)
    for item in bad:
        log(f"bad line: {test_list.path}:{item}")
    if bad and not options.skip_bad:
        raise UserError(
            f"{len(bad)} bad line(s) in {test_list.path} (listed above); nothing was synthesised",
            "fix them, or pass --skip-bad to run the rest and record these in results.jsonl",
        )
    failed = {b.number for b in bad_model}
    config = dataclasses.asdict(tts.generation_config(options.generation_config))
    model = {"model_fingerprint": tts.metadata["model_fingerprint"], "variant": tts.variant}
    digests = FileDigests()
    plan = Plan([], [], bad, {}, {})
    for line in (line for line in test_list.lines if line.number not in failed):
        voice = voice_of.get(line.id)
        request = request_hash(line, config, digests, voice)
        plan.hashes[line.id] = request
        if is_done(line, request, records.get(line.id), options.res_dir, model):
            plan.done.append(line)
            continue
        voice_frames = None if voice is None or voice.prompt is None else voice.prompt.ref_audio_tokens.shape[-1]
        plan.todo.append(
            (line, request, estimated_seconds(line, tts.model.frame_rate, tts.runtime_config["duration"], voice_frames))
        )
        plan.tasks[line.id] = {"task": line.as_task(), "request": requests[line.id]}
    plan.todo.sort(key=lambda item: -item[2])  # longest first: the last lines to start are short
    return plan


class ResultsLog:
    """results.jsonl: records appended as lines finish (a killed run keeps every complete line;
    a torn last one is dropped on reading), rewritten whole and atomically at the start and end
    of a run in the list's order (records of ids not in this list kept after them)."""

    def __init__(self, path: Path, records: dict[str, dict[str, Any]]) -> None:
        self.path = path
        self.records = dict(records)
        self._handle: TextIO | None = None

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


def write_outcome(
    outcome: dict[str, Any], line: Line, request: str, res_dir: Path, model: dict[str, str]
) -> dict[str, Any]:
    """Write a worker's WAV (atomically) and return its record; a worker that loaded another
    model (a cluster node with another bundle) stops the run."""
    if (outcome["model_fingerprint"], outcome["variant"]) != (model["model_fingerprint"], model["variant"]):
        raise UserError(
            f"worker {outcome['worker']} loaded model {outcome['model_fingerprint'][:23]} variant "
            f"{outcome['variant']}, not {model['model_fingerprint'][:23]} {model['variant']}",
            "give every node the same export folder (--model-dir) and --variant",
        )
    record = {
        "id": line.id,
        "line": line.number,
        "wav": None,
        "wav_sha256": None,
        "audio_seconds": outcome["audio_seconds"],
        "synth_seconds": outcome["synth_seconds"],
        "cpu_seconds": outcome["cpu_seconds"],
        "rtf": None,
        "seed": line.seed,
        "seed_from": line.seed_from,
        **model,
        "request_hash": request,
        "worker": outcome["worker"],
        "error": outcome["error"],
    }
    if outcome["error"] is None:
        path = res_dir / f"{line.id}.wav"
        with atomic_path(path) as tmp:
            tmp.write_bytes(outcome["wav"])
        record.update(
            wav=path.name,
            wav_sha256="sha256:" + hashlib.sha256(outcome["wav"]).hexdigest(),
            rtf=outcome["synth_seconds"] / outcome["audio_seconds"] if outcome["audio_seconds"] else None,
        )
    return record


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
        speed = (
            f"RTF {self.wall_seconds / self.audio_seconds:.3f} (wall / audio), "
            f"{self.audio_seconds / self.wall_seconds if self.wall_seconds else 0:.2f} audio s per wall s"
            if self.audio_seconds
            else "no RTF: no audio made by this run"
        )
        return (
            f"batch: {self.lines} lines: {self.made} made, {self.already} already done, {self.failed} failed, "
            f"{self.bad} bad skipped; {self.audio_seconds / 3600:.4f} h of audio ({self.audio_seconds:.1f} s) "
            f"in {self.wall_seconds:.1f} s wall: {speed}"
        )


def run_batch(options: Options, log: Callable[[str], None] = lambda message: say(message, file=sys.stderr)) -> Summary:
    """Check the list, then synthesise every line not already done into options.res_dir.

    Raises UserError before any synthesis for bad lines (unless skip_bad), an unreadable list,
    model folder or an unwritable res_dir, or a res_dir another run is writing (its lock,
    files.FolderLock: two runs would each rewrite results.jsonl without the other's records).
    Ctrl-C and SIGTERM (as KeyboardInterrupt) stop it with every finished line's WAV and record
    in place and nothing half-written."""
    lock = FolderLock(resolved_folder(options.res_dir, "--res-dir", RES_DIR_FIX), RESULTS_FILE, "--res-dir", wait_s=0)
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
        log(
            f"note: {options.test_list} has field(s) {', '.join(test_list.unknown_fields)} that nothing reads "
            f"(known: {', '.join(UPSTREAM_FIELDS + OWN_FIELDS)})"
        )
    # Resolved once: every WAV and record goes where --res-dir led now, whatever its links become.
    options = dataclasses.replace(options, res_dir=lock.path.parent)
    check_output(options.res_dir, "--res-dir", "dir")  # a read-only or unwritable folder: now, not after the model
    if options.res_dir.is_dir():
        lock.acquire()  # before results.jsonl is read
    engine = load_ray_engine() if options.ray is not None else None  # Ray missing: now, too
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
        good = [
            results.records[line.id]
            for line in test_list.lines
            if line.id in results.records and line.id in plan.hashes
        ]
        return sorted(good + [bad_record(b) for b in plan.bad], key=lambda r: r["line"])

    make_folder(options.res_dir, "--res-dir", RES_DIR_FIX)  # only now: a refused list leaves no folder behind
    if not lock.held:
        lock.acquire()
        if os.path.lexists(results.path):  # another run made the folder and finished in between
            raise UserError(f"another batch run wrote {results.path} while this one started", "re-run the command")
    results.rewrite(listed_records())  # a full res_dir fails here, before any synthesis
    for line, _, _ in plan.todo:
        remove_stale_temporaries(options.res_dir / f"{line.id}.wav")
    tasks = [plan.tasks[line.id] for line, _, _ in plan.todo]
    if engine is not None:  # --ray
        del tts
        outcomes = engine.run_ray(
            options.ray,
            SynthActor,
            {"model_dir": os.fspath(options.model_dir.absolute()), "variant": model["variant"], "threads": threads},
            options.workers,
            ray_rows(tasks),
            [e for _, _, e in plan.todo],
            threads,
        )
    elif options.workers > 1:
        del tts
        outcomes = run_pool(
            Synthesizer.load, (os.fspath(options.model_dir), model["variant"], threads), options.workers, tasks
        )
    else:
        outcomes = run_in_process(Synthesizer(tts), tasks)  # the driver's model: no second load
    log(
        f"batch: {len(plan.todo)} to synthesise ({len(plan.done)} already done, {len(plan.bad)} bad skipped) on "
        f"{'Ray ' + ('local' if options.ray == 'local' else options.ray) + ', ' if options.ray else ''}"
        f"{options.workers} worker(s) x {threads} thread(s); model {model['model_fingerprint'][:23]} {model['variant']}"
    )
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


def _progress_bar(total: int, wanted: bool, log: Callable[[str], None]) -> tqdm[Any] | None:
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


def load_ray_engine() -> ModuleType:
    """omnivoice_onnx.batch.ray_engine, or a UserError naming the extra when Ray is not installed."""
    try:
        import ray.data  # noqa: F401  (ray_engine imports it where it runs; checked here, before any work)

        from omnivoice_onnx.batch import ray_engine
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "ray":
            raise
        raise UserError("--ray needs Ray Data, which is not installed", "pip install 'omnivoice-onnx[ray]'") from None
    return ray_engine
