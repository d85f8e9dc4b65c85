"""A designed voice is its instruct AND its seed: a saved one keeps the seed it was made with, and
every request that names it without a seed of its own speaks with that seed (the same bytes for the
same text), on the command line, in batch, and (tests/test_clients.py) over HTTP. The presets are
voices of the same kind, known to `speak --voice` as to the servers. Voice files of format 1 (no
seed) still read.

The fast tests use made-up voices; the slow ones speak with the session's tiny export (few steps:
they compare bytes, not quality).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, Pipeline, single_stderr_line

from omnivoice_onnx import OmniVoiceOnnx, UserError
from omnivoice_onnx.batch.run import Options, run_batch
from omnivoice_onnx.limits import SEED_MAX
from omnivoice_onnx.voices import (
    PRESETS,
    VOICE_FORMAT_VERSION,
    Voice,
    load_voice,
    new_voice,
    read_voice,
    save_voice,
)

FINGERPRINT = "sha256:0123456789abcdef"
STEPS = "4"
TEXT = "The same words, twice."


def _cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omnivoice_onnx", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMNIVOICE_ORT_THREADS": "1"},
    )


def test_a_designed_voice_always_has_a_seed_and_the_file_keeps_it(tmp_path: Path) -> None:
    """new_voice draws a seed for a designed voice given none (a clone keeps what it is given);
    the file holds it and reads it back; a format-1 file (no seed field) still reads, seedless."""
    drawn = new_voice("calm", None, "female, low pitch", FINGERPRINT, None)
    assert isinstance(drawn.seed, int) and 0 <= drawn.seed <= SEED_MAX
    assert new_voice("clone", None, "male", FINGERPRINT, 7).seed == 7
    path = save_voice(tmp_path, "calm", drawn)
    data = json.loads(path.read_text())
    assert data["format_version"] == VOICE_FORMAT_VERSION == 2 and data["seed"] == drawn.seed
    assert load_voice("calm", tmp_path, FINGERPRINT).seed == drawn.seed
    old = {key: value for key, value in data.items() if key != "seed"} | {"format_version": 1}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert read_voice("old", tmp_path).seed is None and read_voice("old", tmp_path).instruct == "female, low pitch"
    (tmp_path / "bad.json").write_text(json.dumps(data | {"seed": SEED_MAX + 1}))
    with pytest.raises(UserError, match="outside torch.manual_seed's range"):
        read_voice("bad", tmp_path)
    (tmp_path / "new.json").write_text(json.dumps(data | {"format_version": 3}))
    with pytest.raises(UserError, match="format_version 3; this runtime reads 1 and 2"):
        read_voice("new", tmp_path)


def test_a_name_is_a_saved_voice_else_a_preset(tmp_path: Path) -> None:
    """load_voice, every front end's: a preset by name (any case) for any model; a saved voice of
    the same name hides it; an unknown name lists what may be named, "design" not among them."""
    assert load_voice("Marin", tmp_path, FINGERPRINT) is PRESETS["marin"]
    assert PRESETS["marin"].generate_kwargs() == {"instruct": PRESETS["marin"].instruct}
    save_voice(tmp_path, "marin", Voice("marin", None, "male, elderly", FINGERPRINT, Path(), 5))
    mine = load_voice("marin", tmp_path, FINGERPRINT)
    assert (mine.instruct, mine.seed, mine.is_preset) == ("male, elderly", 5, False)
    with pytest.raises(UserError) as refused:
        load_voice("nobody", tmp_path, FINGERPRINT)
    assert "marin, alloy" in refused.value.fix and "design" not in refused.value.fix


@pytest.fixture(scope="module")
def tts(pipeline: Pipeline) -> OmniVoiceOnnx:
    return OmniVoiceOnnx.from_dir(pipeline.onnx, threads=1)


@pytest.mark.slow
def test_speak_with_a_saved_designed_voice_gives_the_same_bytes(pipeline: Pipeline, tts, tmp_path: Path) -> None:
    """`voice add --instruct --seed` saves the seed; `speak --voice NAME` without --seed speaks with
    it (the same bytes each time, the summary naming it); --seed still wins; without --seed, voice
    add draws one and prints it; `speak --voice marin` is the preset; `--voice design` without
    --instruct is one line."""
    flags = ["--model-dir", pipeline.onnx, "--voices", tmp_path / "voices"]
    added = _cli("voice", "add", "calm", "--instruct", "female, low pitch", "--seed", "7", *flags)
    assert added.returncode == 0 and "seed 7" in added.stdout, added.stderr
    speak = ["speak", TEXT, "--voice", "calm", "--num-step", STEPS, *flags]
    outs = [tmp_path / f"{n}.wav" for n in range(3)]
    for out, extra in zip(outs, ([], [], ["--seed", "3"])):
        done = _cli(*speak, *extra, "--out", out)
        assert done.returncode == 0, done.stderr
        assert f"seed {extra[1] if extra else 7} ->" in done.stderr
    assert outs[0].read_bytes() == outs[1].read_bytes() != outs[2].read_bytes()

    drawn = _cli("voice", "add", "drawn", "--instruct", "male", *flags)
    seed = json.loads((tmp_path / "voices" / "drawn.json").read_text())["seed"]
    assert drawn.returncode == 0 and f"seed {seed}" in drawn.stdout
    shown = _cli("voice", "show", "drawn", *flags)
    assert f"seed               {seed}" in shown.stdout

    preset = _cli("speak", TEXT, "--voice", "Marin", "--num-step", STEPS, *flags, "--out", tmp_path / "marin.wav")
    assert preset.returncode == 0 and f"seed {PRESETS['marin'].seed} ->" in preset.stderr, preset.stderr
    direct = ["speak", TEXT, "--instruct", PRESETS["marin"].instruct, "--seed", str(PRESETS["marin"].seed)]
    assert _cli(*direct, "--num-step", STEPS, *flags, "--out", tmp_path / "direct.wav").returncode == 0
    assert (tmp_path / "marin.wav").read_bytes() == (tmp_path / "direct.wav").read_bytes()

    design = _cli("speak", TEXT, "--voice", "design", *flags, "--out", tmp_path / "design.wav")
    assert design.returncode == 2 and "--instruct" in single_stderr_line(design)
    listed = _cli("voice", "list", *flags)
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["calm", "drawn", *PRESETS]


@pytest.mark.slow
def test_batch_lines_with_a_saved_voice_speak_with_its_seed(pipeline: Pipeline, tts, tmp_path: Path) -> None:
    """Two lines of one text and a saved designed voice, neither with a seed: the voice's seed for
    both (seed_from "voice"), so the same bytes; a line's own seed still wins."""
    voices = tmp_path / "voices"
    save_voice(voices, "calm", new_voice("calm", None, "female, low pitch", tts.metadata["model_fingerprint"], 7))
    lines = [
        {"id": "a", "text": TEXT, "voice": "calm"},
        {"id": "b", "text": TEXT, "voice": "calm"},
        {"id": "c", "text": TEXT, "voice": "calm", "seed": 3},
        {"id": "d", "text": TEXT, "voice": "alloy"},
    ]
    (tmp_path / "lines.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    res = tmp_path / "out"
    options = Options(
        test_list=tmp_path / "lines.jsonl",
        res_dir=res,
        model_dir=pipeline.onnx,
        voices=voices,
        generation_config={"num_step": int(STEPS)},
        progress=False,
        threads=1,
    )
    run_batch(options, log=lambda message: None)
    records = {r["id"]: r for r in map(json.loads, (res / "results.jsonl").read_text().splitlines())}
    assert [(records[i]["seed"], records[i]["seed_from"]) for i in "abcd"] == [
        (7, "voice"),
        (7, "voice"),
        (3, "line"),
        (PRESETS["alloy"].seed, "voice"),
    ]
    assert (res / "a.wav").read_bytes() == (res / "b.wav").read_bytes() != (res / "c.wav").read_bytes()
