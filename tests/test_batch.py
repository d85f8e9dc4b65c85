"""omnivoice-onnx batch (omnivoice_onnx.batch: its driver, the pool and the Ray engine) on the session's tiny export.

One reference run (in-process) is made once per file; every other engine and every resume is
compared with it byte for byte, and it is compared with OmniVoiceOnnx.generate itself. Ray is
started once for the file (module fixture `ray_local`). All tests need steps 0-2: marked slow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from omnivoice_onnx import OmniVoiceOnnx
from omnivoice_onnx.audio_formats import encode_audio
from omnivoice_onnx.batch.lines import RESULT_FIELDS, RESULTS_FILE, read_test_list, seed_for_id
from omnivoice_onnx.batch.run import Options, make_plan, ray_rows, read_results, run_batch
from omnivoice_onnx.voices import Voice, save_voice

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
NUM_STEP = 4  # few steps: the tests check files and bytes, not speech
GENERATION = {"num_step": NUM_STEP}


def write_list(path: Path, rows: list[dict | str]) -> Path:
    """A JSONL test list, one object per line (a str row is written as is: a broken line)."""
    path.write_text(
        "".join((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False)) + "\n" for row in rows),
        encoding="utf-8",
    )
    return path


@pytest.fixture(scope="module")
def corpus(pipeline, tmp_path_factory) -> Path:
    """A folder with ref.wav, a saved voice and lines.jsonl written as upstream's docs show the
    format (id, text; ref_audio + ref_text; instruct; language_id; duration; speed), plus this
    runtime's seed and voice fields, and upstream's language_name, which nothing reads."""
    root = tmp_path_factory.mktemp("corpus")
    shutil.copyfile(pipeline.capture / "ref_voice.wav", root / "ref.wav")
    ref_text = (pipeline.capture / "ref_voice.txt").read_text().strip()
    tts = OmniVoiceOnnx.from_dir(pipeline.onnx, threads=1)
    prompt = tts.create_voice_clone_prompt(root / "ref.wav", ref_text)
    save_voice(root / "voices", "alice", Voice("alice", prompt, None, tts.metadata["model_fingerprint"], Path()))
    write_list(
        root / "lines.jsonl",
        [
            {
                "id": "auto_en",
                "text": "Hello there, this is a test of the batch runner.",
                "language_id": "en",
                "language_name": "English",
            },
            {"id": "design_1", "text": "Good morning, everyone.", "instruct": "female, low pitch"},
            {
                "id": "clone_1",
                "text": "This line is spoken in the reference voice.",
                "ref_audio": "ref.wav",
                "ref_text": ref_text,
            },
            {
                "id": "clone_2",
                "text": "So is this one, a little faster.",
                "ref_audio": "ref.wav",
                "ref_text": ref_text,
                "speed": 1.2,
                "seed": 42,
            },
            {"id": "fixed_len", "text": "Exactly one and a half seconds.", "duration": 1.5},
            {"id": "voice_1", "text": "A saved voice speaks this.", "voice": "alice"},
        ],
    )
    return root


def options(corpus: Path, pipeline, res_dir: Path, **extra) -> Options:
    return Options(
        test_list=corpus / "lines.jsonl",
        res_dir=res_dir,
        model_dir=pipeline.onnx,
        voices=corpus / "voices",
        generation_config=dict(GENERATION),
        progress=False,
        **{"threads": 1, **extra},
    )


def wav_bytes(res_dir: Path) -> dict[str, bytes]:
    return {path.stem: path.read_bytes() for path in sorted(res_dir.glob("*.wav"))}


def leftovers(res_dir: Path) -> list[str]:
    """Temporary files a write left behind (there must be none)."""
    return sorted(p.name for p in res_dir.iterdir() if ".tmp-" in p.name)


@pytest.fixture(scope="module")
def reference_run(corpus, pipeline, tmp_path_factory) -> Path:
    """The whole corpus, in this process: the outputs every other run must equal."""
    res_dir = tmp_path_factory.mktemp("reference") / "out"
    summary = run_batch(options(corpus, pipeline, res_dir), log=lambda message: None)
    assert (summary.made, summary.failed, summary.already) == (6, 0, 0)
    return res_dir


def test_upstream_format_parsed(corpus):
    parsed = read_test_list(corpus / "lines.jsonl")
    assert not parsed.bad and parsed.unknown_fields == []
    lines = {line.id: line for line in parsed.lines}
    assert list(lines) == ["auto_en", "design_1", "clone_1", "clone_2", "fixed_len", "voice_1"]
    assert lines["clone_1"].ref_audio == str(corpus / "ref.wav")  # relative to the list's folder
    assert (lines["clone_2"].seed, lines["clone_2"].seed_from, lines["clone_2"].speed) == (42, "line", 1.2)
    expected = int.from_bytes(hashlib.sha256(b"auto_en").digest()[:8], "big") >> 1
    assert (lines["auto_en"].seed, lines["auto_en"].seed_from) == (expected, "id") == (seed_for_id("auto_en"), "id")
    assert (lines["auto_en"].language, lines["fixed_len"].duration, lines["design_1"].instruct) == (
        "en",
        1.5,
        "female, low pitch",
    )
    # upstream's --lang_id is the default of lines without language_id; a line's own wins
    defaulted = {line.id: line.language for line in read_test_list(corpus / "lines.jsonl", "zh").lines}
    assert defaulted["auto_en"] == "en" and defaulted["design_1"] == "zh"


def test_line_seed_checked_as_generate_checks_it(tmp_path):
    """A line's seed goes through limits.check_seed, generate()'s own check: the same range, the same
    words, refused at parse time (before any work) instead of in the middle of the run."""
    from omnivoice_onnx.errors import UserError
    from omnivoice_onnx.limits import SEED_MAX, SEED_MIN, check_seed

    seeds = {
        "lowest": SEED_MIN,
        "highest": SEED_MAX,
        "over": SEED_MAX + 1,
        "under": SEED_MIN - 1,
        "bool": True,
        "float": 1.0,
        "text": "7",
    }
    parsed = read_test_list(
        write_list(tmp_path / "seeds.jsonl", [{"id": name, "text": "x", "seed": seed} for name, seed in seeds.items()])
    )
    assert [(line.id, line.seed, line.seed_from) for line in parsed.lines] == [
        ("lowest", SEED_MIN, "line"),
        ("highest", SEED_MAX, "line"),
    ]
    for bad in parsed.bad:
        with pytest.raises(UserError) as refused:
            check_seed(seeds[bad.id])
        assert bad.problem == str(refused.value)
    assert sorted(bad.id for bad in parsed.bad) == ["bool", "float", "over", "text", "under"]


def test_outputs_equal_generate(reference_run, corpus, pipeline):
    """Each WAV is encode_audio(generate(line, seed)) bytes: the reference given as a path here
    (the batch encodes it once per worker and reuses the prompt), the seed as recorded."""
    tts = OmniVoiceOnnx.from_dir(pipeline.onnx, threads=1)
    records = read_results(reference_run / RESULTS_FILE)
    wavs = wav_bytes(reference_run)
    assert set(wavs) == set(records) == {line.id for line in read_test_list(corpus / "lines.jsonl").lines}
    voice_prompt = tts.create_voice_clone_prompt(
        corpus / "ref.wav", (pipeline.capture / "ref_voice.txt").read_text().strip()
    )
    for line in read_test_list(corpus / "lines.jsonl").lines:
        kwargs = (
            {"voice_clone_prompt": voice_prompt}
            if line.voice
            else {"ref_audio": line.ref_audio, "ref_text": line.ref_text}
        )
        audio = tts.generate(
            line.text,
            language=line.language,
            instruct=line.instruct,
            duration=line.duration,
            speed=line.speed,
            generation_config=GENERATION,
            seed=line.seed,
            **kwargs,
        )[0]
        assert wavs[line.id] == encode_audio(audio, tts.sample_rate, "wav"), line.id
        record = records[line.id]
        assert set(record) == set(RESULT_FIELDS)
        assert record["seed"] == line.seed and record["error"] is None and record["line"] == line.number
        assert record["wav_sha256"] == "sha256:" + hashlib.sha256(wavs[line.id]).hexdigest()
        assert record["audio_seconds"] == pytest.approx((len(wavs[line.id]) - 44) / 2 / tts.sample_rate)
        assert (record["model_fingerprint"], record["variant"]) == (tts.metadata["model_fingerprint"], tts.variant)
    assert leftovers(reference_run) == []


def test_plan_holds_one_reference_per_file_and_pickles_only_for_ray(corpus, pipeline, tmp_path):
    """clone_1 and clone_2 name the same file and transcript: their validated Requests share one
    prepared Reference, so the driver holds that waveform once whatever the list's length; the
    local engines get the Request objects, Ray rows carry them pickled."""
    tts = OmniVoiceOnnx.from_dir(pipeline.onnx, threads=1)
    plan = make_plan(
        tts,
        read_test_list(corpus / "lines.jsonl"),
        options(corpus, pipeline, tmp_path / "out"),
        {},
        log=lambda message: None,
    )
    first, second = (plan.tasks[key]["request"] for key in ("clone_1", "clone_2"))
    assert first.references[0] is second.references[0] and first.texts != second.texts
    rows = ray_rows([plan.tasks["clone_2"]])
    assert isinstance(rows[0]["request"], bytes) and pickle.loads(rows[0]["request"]).texts == second.texts


def test_pool_equals_in_process(reference_run, corpus, pipeline, tmp_path):
    summary = run_batch(options(corpus, pipeline, tmp_path / "out", workers=2), log=lambda message: None)
    assert (summary.made, summary.failed) == (6, 0)
    assert wav_bytes(tmp_path / "out") == wav_bytes(reference_run)
    pool = read_results(tmp_path / "out" / RESULTS_FILE)
    assert {k: r["request_hash"] for k, r in pool.items()} == {
        k: r["request_hash"] for k, r in read_results(reference_run / RESULTS_FILE).items()
    }


def test_resume_does_only_what_changed(reference_run, corpus, pipeline, tmp_path):
    """A second run skips every intact line; a changed line, a deleted WAV and a damaged WAV are
    redone, and the results equal a fresh run's."""
    res_dir = tmp_path / "out"
    shutil.copytree(reference_run, res_dir)
    again = run_batch(options(corpus, pipeline, res_dir), log=lambda message: None)
    assert (again.made, again.already) == (0, 6)
    assert "nan" not in again.text() and "no RTF: no audio made by this run" in again.text()  # nothing to do
    (res_dir / "design_1.wav").unlink()
    damaged = bytearray((res_dir / "clone_1.wav").read_bytes())
    damaged[100] ^= 1
    (res_dir / "clone_1.wav").write_bytes(bytes(damaged))
    edited = tmp_path / "corpus"
    shutil.copytree(corpus, edited)
    rows = [json.loads(row) for row in (edited / "lines.jsonl").read_text().splitlines()]
    rows[0]["text"] = "Hello there, this text changed."
    write_list(edited / "lines.jsonl", rows)
    third = run_batch(dataclasses.replace(options(edited, pipeline, res_dir)), log=lambda message: None)
    assert (third.made, third.already) == (3, 3)
    fresh = run_batch(options(edited, pipeline, tmp_path / "fresh"), log=lambda message: None)
    assert fresh.made == 6 and wav_bytes(res_dir) == wav_bytes(tmp_path / "fresh")
    assert wav_bytes(res_dir)["auto_en"] != wav_bytes(reference_run)["auto_en"]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "omnivoice_onnx", "batch", *args]


def test_sigterm_then_resume(corpus, pipeline, reference_run, tmp_path):
    """SIGTERM mid-run: exit 143, nothing half-written, every WAV there has its record; the next
    run does only the rest, and the files equal an uninterrupted run's."""
    rows = [json.loads(row) for row in (corpus / "lines.jsonl").read_text().splitlines()]
    longer = [dict(rows[i % 5], id=f"line_{i:02d}") for i in range(12)]  # no voice field: no --voices
    lines = write_list(tmp_path / "lines.jsonl", longer)
    shutil.copyfile(corpus / "ref.wav", tmp_path / "ref.wav")
    res_dir = tmp_path / "out"
    args = cli(
        "--test-list",
        str(lines),
        "--res-dir",
        str(res_dir),
        "--model-dir",
        str(pipeline.onnx),
        "--num-step",
        "16",
        "--threads",
        "1",
    )
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while len(read_results(res_dir / RESULTS_FILE)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # polls for the second record; no timing is asserted
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "terminated (SIGTERM)" in stderr.strip().splitlines()[-1]
    assert leftovers(res_dir) == []
    records = read_results(res_dir / RESULTS_FILE)
    done = wav_bytes(res_dir)
    assert 2 <= len(records) < 12 and set(done) == set(records)
    for key, data in done.items():
        assert records[key]["wav_sha256"] == "sha256:" + hashlib.sha256(data).hexdigest()
    resumed = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{12 - len(records)} made, {len(records)} already done" in resumed.stdout
    fresh = Options(
        test_list=lines,
        res_dir=tmp_path / "fresh",
        model_dir=pipeline.onnx,
        generation_config={"num_step": 16},
        threads=1,
        progress=False,
    )
    assert run_batch(fresh, log=lambda message: None).made == 12
    assert wav_bytes(res_dir) == wav_bytes(tmp_path / "fresh")


BAD_ROWS = [
    "{not json",
    {"text": "no id"},
    {"id": "no_text"},
    {"id": "../escape", "text": "a path-like id"},
    {"id": "twice", "text": "one"},
    {"id": "twice", "text": "two"},
    {"id": "missing_ref", "text": "x", "ref_audio": "nowhere.wav", "ref_text": "y"},
    {"id": "not_audio", "text": "x", "ref_audio": "lines.jsonl", "ref_text": "y"},
    {"id": "bad_lang", "text": "x", "language_id": "xx-nope"},
    {"id": "bad_speed", "text": "x", "speed": -1},
    {"id": "bad_seed", "text": "x", "seed": "abc"},
    {"id": "no_ref_text", "text": "x", "ref_audio": "ref.wav"},
    {"id": "fine", "text": "This line is fine."},
]
BAD_NUMBERS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]


def test_bad_lines_refused_then_skipped(pipeline, corpus, tmp_path, capsys):
    """Every bad line is named with its number before anything runs (exit 2, no res-dir made);
    --skip-bad runs the rest and records why each bad line was skipped."""
    from omnivoice_onnx.__main__ import main

    shutil.copyfile(corpus / "ref.wav", tmp_path / "ref.wav")
    lines = write_list(tmp_path / "lines.jsonl", BAD_ROWS)
    args = [
        "batch",
        "--test_list",
        str(lines),
        "--res_dir",
        str(tmp_path / "out"),
        "--model-dir",
        str(pipeline.onnx),
        "--num_step",
        str(NUM_STEP),
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    reported = [line for line in err if line.startswith("bad line: ")]
    assert [int(line.split(":")[2].split()[1]) for line in reported] == BAD_NUMBERS, err
    assert err[-1].startswith("omnivoice-onnx: error: 12 bad line(s)") and "--skip-bad" in err[-1]
    assert "duplicate id (lines 5, 6)" in "\n".join(reported) and "../escape" in "\n".join(reported)
    assert not (tmp_path / "out").exists()

    assert main(args + ["--skip-bad"]) == 0
    records = [json.loads(row) for row in (tmp_path / "out" / RESULTS_FILE).read_text().splitlines()]
    assert [r["line"] for r in records] == BAD_NUMBERS + [13]
    assert all(r["error"].startswith("bad line, skipped: ") for r in records[:-1])
    assert records[-1]["id"] == "fine" and records[-1]["error"] is None
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["fine.wav", RESULTS_FILE]


def test_read_only_res_dir(corpus, pipeline, small_mount, tmp_path):
    """Refused before the model loads, one line. Root (whom mode bits do not stop) gets a read-only
    tmpfs; another user a folder without write permission."""
    if os.geteuid() == 0:
        parent, reason = small_mount("1M", read_only=True), "Read-only file system"
    else:
        parent, reason = tmp_path / "locked", "Permission denied"
        parent.mkdir(mode=0o555)
    res_dir = parent / "out"
    done = subprocess.run(
        cli("--test-list", str(corpus / "lines.jsonl"), "--res-dir", str(res_dir), "--model-dir", str(pipeline.onnx)),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"omnivoice-onnx: error: --res-dir {res_dir}: cannot create files in "
        f"{parent} ({reason}); choose a writable location, or fix its permissions"
    )


def test_full_res_dir_stops_cleanly_and_resumes(corpus, pipeline, reference_run, small_mount, tmp_path):
    """A disk that fills mid-run: one line naming the file (exit 2), no partial WAV, every record's
    WAV intact; copied to a roomy disk, the run completes with the reference's bytes."""
    res_dir = small_mount("240k") / "out"  # room for results.jsonl and about two WAVs of ~100 KB
    args = cli(
        "--test-list",
        str(corpus / "lines.jsonl"),
        "--res-dir",
        str(res_dir),
        "--model-dir",
        str(pipeline.onnx),
        "--voices",
        str(corpus / "voices"),
        "--num-step",
        str(NUM_STEP),
        "--threads",
        "1",
    )
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"omnivoice-onnx: error: disk full while writing {res_dir}/") and last.endswith(
        "free space and re-run (the previous complete artefacts are intact)"
    ), last
    assert leftovers(res_dir) == []
    records = read_results(res_dir / RESULTS_FILE)
    assert 1 <= len(records) < 6 and set(wav_bytes(res_dir)) == set(records)
    roomy = tmp_path / "roomy"
    shutil.copytree(res_dir, roomy)
    resumed = subprocess.run([*args[:7], str(roomy), *args[8:]], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert wav_bytes(roomy) == wav_bytes(reference_run)


# --- Ray: one local instance for the file -------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray with 2 CPUs, shut down after this file's Ray tests; batch.ray_engine reuses it."""
    ray = pytest.importorskip("ray")
    import omnivoice_onnx

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", runtime_env={"py_modules": [omnivoice_onnx]})
    yield ray
    ray.shutdown()


def test_ray_worker_killed_mid_run(ray_local, corpus, pipeline, tmp_path):
    """The Ray engine, once (a local Ray run costs ~30 s): SIGKILL one actor after the first results
    arrive; Ray restarts it and retries its block, the job completes, and every WAV and request
    hash equals the in-process engine's; a resume of the Ray run's folder on the local engine has
    nothing left to do (the engines share the files)."""
    rows = [json.loads(row) for row in (corpus / "lines.jsonl").read_text().splitlines()]
    lines = write_list(tmp_path / "lines.jsonl", [dict(rows[i % 6], id=f"line_{i:02d}") for i in range(16)])
    shutil.copyfile(corpus / "ref.wav", tmp_path / "ref.wav")
    base = dataclasses.replace(options(corpus, pipeline, tmp_path / "ray", workers=2, ray="local"), test_list=lines)
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.update(summary=run_batch(base, log=lambda m: None)))
    runner.start()
    killed = None
    while runner.is_alive() and killed is None:
        records = read_results(tmp_path / "ray" / RESULTS_FILE)
        if records:
            killed = int(next(iter(records.values()))["worker"].rsplit(":", 1)[1])
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.05)  # polls for the first record; no timing is asserted
    runner.join(timeout=600)
    assert killed is not None and not runner.is_alive()
    summary = outcome["summary"]
    assert (summary.made, summary.failed) == (16, 0)
    local = run_batch(dataclasses.replace(base, res_dir=tmp_path / "local", ray=None, workers=1), log=lambda m: None)
    assert local.made == 16 and wav_bytes(tmp_path / "ray") == wav_bytes(tmp_path / "local")
    ray_hashes = {r["request_hash"] for r in read_results(tmp_path / "ray" / RESULTS_FILE).values()}
    assert ray_hashes == {r["request_hash"] for r in read_results(tmp_path / "local" / RESULTS_FILE).values()}
    assert run_batch(dataclasses.replace(base, ray=None, workers=1), log=lambda m: None).already == 16
    assert leftovers(tmp_path / "ray") == []


def test_ray_missing_is_one_line(corpus, pipeline, tmp_path, monkeypatch, capsys):
    """--ray without Ray installed: one line naming the extra, before any model work or file."""
    from omnivoice_onnx.__main__ import main

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    monkeypatch.setitem(sys.modules, "ray.data", None)
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "batch",
                "--test-list",
                str(corpus / "lines.jsonl"),
                "--res-dir",
                str(tmp_path / "out"),
                "--model-dir",
                str(pipeline.onnx),
                "--ray",
            ]
        )
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "omnivoice-onnx: error: --ray needs Ray Data, which is not installed; pip install 'omnivoice-onnx[ray]'"
    )
    assert not (tmp_path / "out").exists()
