"""Saved voices (omnivoice_onnx.voices, `omnivoice-onnx voice`) and `omnivoice-onnx info`.

A saved voice speaks as its reference does (same seed, same audio); a voice of another model is
refused; upstream's VoiceClonePrompt.save files load without torch, and a crafted pickle is
refused with one line and never executed. The fast tests build voices from made-up tokens; the
slow ones encode the session capture's reference with the tiny export.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, Pipeline, import_blocker, single_stderr_line

from omnivoice_onnx import UserError, VoiceClonePrompt
from omnivoice_onnx.bundle import Folder
from omnivoice_onnx.hardware import isa_line
from omnivoice_onnx.voices import (
    VOICE_FORMAT_VERSION,
    VOICES_ENV,
    Voice,
    check_name,
    find_saved,
    list_voices,
    load_upstream_voice,
    load_voice,
    remove_voice,
    rename_voice,
    save_voice,
    voices_dir,
)

FINGERPRINT = "sha256:0123456789abcdef"
FEW_STEPS = {"num_step": 4}


def _prompt(frames: int = 20, seed: int = 0) -> VoiceClonePrompt:
    tokens = np.random.default_rng(seed).integers(0, 1024, (8, frames), dtype=np.int64)
    return VoiceClonePrompt(ref_audio_tokens=tokens, ref_text="A reference sentence.", ref_rms=0.05)


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omnivoice_onnx", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize("name", ["../x", "/abs", "", ".", "..", "a.b", "a/b", "-x", "two words", "x" * 65])
def test_names_are_names(name: str) -> None:
    with pytest.raises(UserError, match="not a plain name"):
        check_name(name)


def test_voices_dir_precedence(tmp_path: Path, monkeypatch) -> None:
    """--voices > $OMNIVOICE_VOICES > <bundle>/voices."""
    monkeypatch.delenv(VOICES_ENV, raising=False)
    assert voices_dir(Folder(tmp_path / "onnx")) == tmp_path / "onnx" / "voices"
    monkeypatch.setenv(VOICES_ENV, str(tmp_path / "env"))
    assert voices_dir(Folder(tmp_path / "onnx")) == tmp_path / "env"
    assert voices_dir(Folder(tmp_path / "onnx"), tmp_path / "flag") == tmp_path / "flag"


def test_voice_round_trip_and_another_models_voice_refused(tmp_path: Path) -> None:
    """A saved voice reads back as saved (JSON, by name or by path); another model's is refused,
    naming both fingerprints and `voice add`."""
    prompt = _prompt()
    path = save_voice(tmp_path, "alice", Voice("alice", prompt, None, FINGERPRINT, Path()))
    save_voice(tmp_path, "calm", Voice("calm", None, "female, low pitch", FINGERPRINT, Path()))
    assert path == tmp_path / "alice.json" and json.loads(path.read_text())["format_version"] == VOICE_FORMAT_VERSION
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alice.json", "calm.json"]  # no temporary left
    for spec in ("alice", str(path)):
        voice = load_voice(spec, tmp_path, FINGERPRINT)
        assert np.array_equal(voice.prompt.ref_audio_tokens, prompt.ref_audio_tokens)
        assert (voice.prompt.ref_text, voice.prompt.ref_rms, voice.instruct) == (prompt.ref_text, 0.05, None)
    assert load_voice("calm", tmp_path, FINGERPRINT).generate_kwargs() == {"instruct": "female, low pitch"}
    assert [v.name for v in list_voices(tmp_path)] == ["alice", "calm"]
    other = "sha256:fedcba9876543210"
    with pytest.raises(UserError) as caught:
        load_voice("alice", tmp_path, other)
    assert FINGERPRINT in str(caught.value) and other in str(caught.value) and "voice add" in str(caught.value)
    with pytest.raises(UserError, match="no voice named 'bob'"):
        load_voice("bob", tmp_path, FINGERPRINT)


def test_names_are_found_whatever_their_case_and_renamed_or_removed(tmp_path: Path) -> None:
    """A saved voice is one name in any case: found as Alice, replaced (not doubled) by a save as
    ALICE, refused by a save without replace; renamed (a taken name refused) and removed by any case."""
    save_voice(tmp_path, "alice", Voice("alice", None, "female", FINGERPRINT, Path()))
    assert load_voice("Alice", tmp_path, FINGERPRINT).instruct == "female"
    assert find_saved(tmp_path, "ALICE") == tmp_path / "alice.json" and find_saved(tmp_path, "bob") is None
    with pytest.raises(UserError, match="already exists"):
        save_voice(tmp_path, "Alice", Voice("Alice", None, "male", FINGERPRINT, Path()), replace=False)
    save_voice(tmp_path, "Alice", Voice("Alice", None, "male", FINGERPRINT, Path()))
    assert [(v.name, v.instruct) for v in list_voices(tmp_path)] == [("Alice", "male")]
    save_voice(tmp_path, "bob", Voice("bob", None, "female", FINGERPRINT, Path()))
    with pytest.raises(UserError, match="'Bob' already exists"):
        rename_voice(tmp_path, "alice", "Bob")
    assert rename_voice(tmp_path, "alice", "carol") == tmp_path / "carol.json"
    assert rename_voice(tmp_path, "CAROL", "Carol") == tmp_path / "Carol.json"  # a change of case alone
    assert remove_voice(tmp_path, "BOB") == tmp_path / "bob.json"
    assert [v.name for v in list_voices(tmp_path)] == ["Carol"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Carol.json"]  # no lock or temporary left
    with pytest.raises(UserError, match="no voice named 'bob'"):
        remove_voice(tmp_path, "bob")


def test_damaged_voice_file_is_one_error(tmp_path: Path) -> None:
    data = Voice("a", _prompt(), None, FINGERPRINT, Path()).to_json()
    data["ref_audio_tokens"][0][0] = 1024  # the mask id: never an encoder output
    (tmp_path / "a.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="codes outside 0..1023"):
        load_voice("a", tmp_path, FINGERPRINT)


def test_upstream_voice_file_loads_without_torch(tmp_path: Path) -> None:
    """A file written by upstream's own VoiceClonePrompt.save (a non-contiguous tensor included)
    reads back to the same tokens, text and RMS in a process where torch cannot be imported."""
    from omnivoice.models.omnivoice import VoiceClonePrompt as UpstreamPrompt

    tokens = torch.randint(0, 1024, (30, 8)).t()  # [8, 30] with strides (1, 8)
    UpstreamPrompt(ref_audio_tokens=tokens, ref_text="Upstream words.", ref_rms=0.07).save(str(tmp_path / "up.pt"))
    script = import_blocker(["torch", "omnivoice", "onnx", "omnivoice_export"]) + (
        "from omnivoice_onnx.voices import load_upstream_voice\n"
        f"v = load_upstream_voice({str(tmp_path / 'up.pt')!r})\n"
        "import json; print(json.dumps([v.prompt.ref_audio_tokens.tolist(), v.prompt.ref_text, v.prompt.ref_rms]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [tokens.tolist(), "Upstream words.", pytest.approx(0.07)]


class RunsCode:
    """What an attacker pickles: unpickling it calls os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _torch_zip(path: Path, pickled: bytes) -> Path:
    """A zip in torch.save's layout around `pickled`."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("evil/data.pkl", pickled)
        archive.writestr("evil/byteorder", "little")
        archive.writestr("evil/version", "3\n")
    return path


def test_malicious_pickle_is_refused_and_never_run(tmp_path: Path) -> None:
    """A .pt whose pickle would run `touch MARKER` (wrapped in torch's zip layout, inside the voice
    dict beside a real tensor, or bare) is refused with one line naming what it asked for, both
    by the library and by `omnivoice-onnx voice import` (exit 2); the marker never appears."""
    marker = tmp_path / "marker"
    inside = {"format_version": 1, "ref_audio_tokens": RunsCode(marker), "ref_text": "x", "ref_rms": 0.1}
    files = [
        _torch_zip(tmp_path / "zip.pt", pickle.dumps(RunsCode(marker), protocol=2)),
        _torch_zip(tmp_path / "dict.pt", pickle.dumps(inside, protocol=2)),
    ]
    (tmp_path / "bare.pt").write_bytes(pickle.dumps(RunsCode(marker)))
    files.append(tmp_path / "bare.pt")
    for path in files:
        with pytest.raises(UserError, match="refused|not a zip"):
            load_upstream_voice(path)
    done = _cli(
        "voice",
        "import",
        str(files[1]),
        "bob",
        "--voices",
        str(tmp_path / "voices"),
        "--model-dir",
        str(tmp_path / "no-bundle"),
    )
    assert done.returncode == 2
    line = single_stderr_line(done)
    assert "refused" in line and ("posix.system" in line or "os.system" in line), line
    assert not marker.exists() and not (tmp_path / "voices").exists()


@pytest.fixture(scope="module")
def tts(pipeline: Pipeline):
    from omnivoice_onnx import OmniVoiceOnnx

    return OmniVoiceOnnx.from_dir(pipeline.onnx)


@pytest.mark.slow
def test_saved_voice_speaks_as_its_reference(pipeline: Pipeline, tts, tmp_path: Path) -> None:
    """`voice add` then generate(**voice.generate_kwargs()) gives the audio that passing the reference
    itself gives with the same seed; list and show describe it; remove deletes it."""
    ref_audio = str(pipeline.capture / "ref_voice.wav")
    ref_text = (pipeline.capture / "ref_voice.txt").read_text().strip()
    voices = tmp_path / "voices"
    flags = ["--model-dir", str(pipeline.onnx), "--voices", str(voices)]
    done = _cli("voice", "add", "alice", "--ref_audio", ref_audio, "--ref_text", ref_text, *flags)
    assert done.returncode == 0, done.stderr
    voice = load_voice("alice", voices, tts.metadata["model_fingerprint"])
    text = "Speak in the saved voice."
    saved = tts.generate(text, **voice.generate_kwargs(), generation_config=FEW_STEPS, seed=3)[0]
    direct = tts.generate(text, ref_audio=ref_audio, ref_text=ref_text, generation_config=FEW_STEPS, seed=3)[0]
    assert np.array_equal(saved, direct)
    # The same through `speak`: --voice NAME writes the file --ref-audio/--ref-text writes.
    outs = {name: tmp_path / f"{name}.wav" for name in ("voice", "reference")}
    common = ["speak", text, "--model-dir", str(pipeline.onnx), "--seed", "3", "--num-step", "4"]
    for name, given in (
        ("voice", ["--voice", "alice", "--voices", str(voices)]),
        ("reference", ["--ref-audio", ref_audio, "--ref-text", ref_text]),
    ):
        spoken = _cli(*common, *given, "--out", str(outs[name]))
        assert spoken.returncode == 0, spoken.stderr
    assert outs["voice"].read_bytes() == outs["reference"].read_bytes()

    again = _cli("voice", "add", "alice", "--instruct", "female", *flags)
    assert again.returncode == 2 and "--force" in single_stderr_line(again)
    listed = _cli("voice", "list", *flags)
    assert listed.returncode == 0 and listed.stdout.split()[:2] == ["alice", "clone"] and ref_text in listed.stdout
    shown = _cli("voice", "show", "alice", *flags)
    assert f"model fingerprint  {tts.metadata['model_fingerprint']}" in shown.stdout
    assert _cli("voice", "remove", "alice", *flags).returncode == 0 and not (voices / "alice.json").exists()


@pytest.mark.slow
def test_upstream_voice_file_gives_the_prompts_tokens(pipeline: Pipeline, tts, tmp_path: Path) -> None:
    """A prompt saved by upstream's VoiceClonePrompt.save and imported (`voice import`) holds the
    same tokens, text and RMS as the prompt itself, and speaks the same audio."""
    from omnivoice.models.omnivoice import VoiceClonePrompt as UpstreamPrompt

    prompt = tts.create_voice_clone_prompt(
        str(pipeline.capture / "ref_voice.wav"), (pipeline.capture / "ref_voice.txt").read_text().strip()
    )
    UpstreamPrompt(
        ref_audio_tokens=torch.from_numpy(prompt.ref_audio_tokens), ref_text=prompt.ref_text, ref_rms=prompt.ref_rms
    ).save(str(tmp_path / "voice.pt"))
    done = _cli(
        "voice",
        "import",
        str(tmp_path / "voice.pt"),
        "bob",
        "--model-dir",
        str(pipeline.onnx),
        "--voices",
        str(tmp_path / "voices"),
    )
    assert done.returncode == 0, done.stderr
    for spec in (str(tmp_path / "voice.pt"), "bob"):
        voice = load_voice(spec, tmp_path / "voices", tts.metadata["model_fingerprint"])
        assert np.array_equal(voice.prompt.ref_audio_tokens, prompt.ref_audio_tokens)
        assert (voice.prompt.ref_text, voice.prompt.ref_rms) == (prompt.ref_text, prompt.ref_rms)
    audio = tts.generate("Imported.", **voice.generate_kwargs(), generation_config=FEW_STEPS, seed=5)[0]
    assert np.array_equal(
        audio, tts.generate("Imported.", voice_clone_prompt=prompt, generation_config=FEW_STEPS, seed=5)[0]
    )


@pytest.mark.slow
def test_info_describes_the_bundle(pipeline: Pipeline, tts, tmp_path: Path) -> None:
    """`omnivoice-onnx info DIR`: fingerprint, licence, every graph file, variants, languages, instruct
    items, voices, the CPU with its ISA flags; `--languages` lists the ids."""
    save_voice(tmp_path, "calm", Voice("calm", None, "female", tts.metadata["model_fingerprint"], Path()))
    done = _cli("info", str(pipeline.onnx), "--voices", str(tmp_path))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for expected in (
        f"fingerprint {tts.metadata['model_fingerprint']}",
        "licence     other",
        "higgs_decoder.onnx.data",
        "variants    fp32 (default)",
        "languages   646",
        "low pitch",
        "voices      1 in",
        "calm",
        f"cpu         {isa_line()}",
    ):
        assert expected in out, (expected, out)
    languages = _cli("info", str(pipeline.onnx), "--languages")
    assert languages.returncode == 0 and len(languages.stdout.splitlines()) == 646


@pytest.mark.slow
def test_info_verifies_as_loading_does(pipeline: Pipeline, tmp_path: Path) -> None:
    """A truncated sidecar: `info` lists it as DAMAGED, voids the recorded verdicts, and ends with one
    line naming the file and exit 2 (it used to hash the files, compare nothing, and show PASS with
    exit 0). Without the report, info refuses as loading does, unless --no-verify."""
    onnx = tmp_path / "onnx"
    shutil.copytree(pipeline.onnx, onnx)
    report = json.loads((onnx / "export-report.json").read_text())
    report["parity"] = {"cpu": {"verdict": "PASS"}}  # what parity_check.py records on the intact files
    (onnx / "export-report.json").write_text(json.dumps(report))
    assert _cli("info", str(onnx)).returncode == 0
    sidecar = onnx / "higgs_decoder.onnx.data"
    sidecar.write_bytes(sidecar.read_bytes()[: sidecar.stat().st_size // 2])
    done = _cli("info", str(onnx))
    assert done.returncode == 2, done
    line = single_stderr_line(done)
    assert "higgs_decoder.onnx.data does not match the sha256" in line and "export_omnivoice.py" in line, line
    assert "higgs_decoder.onnx.data" in done.stdout and "DAMAGED" in done.stdout
    assert "parity cpu PASS - NOT for these files" in done.stdout, done.stdout
    (onnx / "export-report.json").write_text("{not json")  # the reason is named, not "not found"
    done = _cli("info", str(onnx))
    assert done.returncode == 2 and "export-report.json is not valid JSON" in single_stderr_line(done), done
    (onnx / "export-report.json").unlink()
    sidecar.unlink()
    done = _cli("info", str(onnx))
    assert done.returncode == 2 and "export report not found" in single_stderr_line(done), done
    done = _cli("info", str(onnx), "--no-verify")
    assert done.returncode == 0 and "not checked" in done.stdout and "MISSING" in done.stdout, done


def test_voice_help_shows_only_real_defaults() -> None:
    """`voice add --help` names the defaults there are, never "(default: None)" or "(default: False)"."""
    done = _cli("voice", "add", "--help")
    assert done.returncode == 0 and "(default: onnx)" in done.stdout
    assert "(default: None)" not in done.stdout and "(default: False)" not in done.stdout


def test_a_server_request_lists_the_voices_folder_once_and_parses_only_its_voice(tmp_path: Path, monkeypatch) -> None:
    """Service.voice_kwargs through VoiceShelf: one listing per request, the named voice parsed once
    per version of its file (a replaced voice is read again), a damaged voice of another name is
    no obstacle, and another model's voice is refused as load_voice refuses it."""
    from types import SimpleNamespace

    from omnivoice_onnx import voices as store
    from omnivoice_onnx.serve.door import ApiError
    from omnivoice_onnx.serve.service import Service

    save_voice(tmp_path, "alice", Voice("alice", None, "female", FINGERPRINT, Path()))
    save_voice(tmp_path, "bob", Voice("bob", _prompt(), None, FINGERPRINT, Path()))
    (tmp_path / "broken.json").write_text("{", encoding="utf-8")
    parsed, listings = [], []
    read = store._read_json_voice
    monkeypatch.setattr(store, "_read_json_voice", lambda path: parsed.append(path.name) or read(path))
    shelf = store.VoiceShelf(tmp_path)
    listing = shelf.listing
    service = SimpleNamespace(
        shelf=SimpleNamespace(listing=lambda: listings.append(1) or listing()),
        references={},
        fingerprint=FINGERPRINT,
        scrub=str,
    )
    service.voice_names = lambda saved=None: list(saved.files) if saved else []

    def ask(name: str) -> dict:
        return Service.voice_kwargs(service, name, None)[0]

    assert ask("ALICE") == {"instruct": "female"} and ask("alice") == {"instruct": "female"}
    assert parsed == ["alice.json"] and len(listings) == 2
    save_voice(tmp_path, "alice", Voice("alice", None, "female, low pitch", FINGERPRINT, Path()))
    assert ask("Alice") == {"instruct": "female, low pitch"} and parsed == ["alice.json"] * 2
    assert set(ask("bob")) == {"voice_clone_prompt"} and parsed[-1] == "bob.json"
    with pytest.raises(ApiError):
        ask("broken")  # named: its refusal, remembered (not parsed again while unchanged)
    with pytest.raises(ApiError):
        ask("broken")
    assert parsed.count("broken.json") == 1
    with pytest.raises(UserError, match="broken.json"):
        shelf.listing().voices()  # the voice list names a damaged file
    remove_voice(tmp_path, "bob")
    with pytest.raises(ApiError, match="unknown voice 'bob'"):
        ask("bob")
    assert tmp_path / "bob.json" not in shelf._parsed  # a removed voice's parse is forgotten
    save_voice(tmp_path, "carol", Voice("carol", None, "male", "sha256:another", Path()))
    with pytest.raises(ApiError) as refused:
        ask("carol")
    assert "was made for model sha256:another" in refused.value.message
