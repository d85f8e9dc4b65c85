"""The Wyoming server's voices (omnivoice_onnx.serve.wyoming): what its Info advertises, and the
reference-voice folder `omnivoice-onnx wyoming --ref-dir DIR` reads at start.

A reference folder is laid out as wyoming-piper's `--omnivoice-ref-dir` (a folder made for it works
unchanged), one folder per voice under one per language:

    DIR/en_US/alice/ref.wav + ref.txt     # a cloned voice: a recording and its transcript
    DIR/de/narrator/instruct.txt          # a designed voice: a description ("male, low pitch")

Each becomes a voice named after its folder (any case, as every voice name), advertised in Info
with its language (the folder's name, "_" read as "-"), which its requests speak in. A folder
holding both a recording pair and an instruct.txt is the clone (as wyoming-piper). A designed
voice keeps one seed, derived from its description (ref_seed), so it is the same speaker on every
request and every restart; --seed still fixes every request's. Every voice is read, checked and
(a clone) encoded once at start: a folder that is not a voice (neither pair, nor instruct.txt) is
passed over, and a voice that cannot be used (a bad name, a duplicate, an unknown language, an
unreadable recording) stops the start with one line naming its folder. A reference voice hides a
saved voice or preset of the same name.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from omnivoice_onnx.core.prompt import resolve_language
from omnivoice_onnx.core.shapes import Request, VoiceClonePrompt
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.serve import door
from omnivoice_onnx.version import __version__
from omnivoice_onnx.voices import check_new_name

REF_AUDIO, REF_TEXT, REF_INSTRUCT = "ref.wav", "ref.txt", "instruct.txt"  # wyoming-piper's file names
MAX_REF_TEXT_BYTES = door.MAX_BODY_BYTES  # a transcript or description: a request's worth of text
SEED_BYTES = 4  # a designed reference voice's seed: the first bytes of its description's sha256
# Home Assistant labels a voice by its description: the name, then a few words ("alloy: female,
# young adult, moderate pitch, american accent" fits; a long saved instruct is cut at a comma).
MAX_DESCRIPTION_CHARS = 64
AUTO_DESCRIPTION = "a voice the model picks"
ATTRIBUTION = ("k2-fsa OmniVoice", "https://github.com/k2-fsa/OmniVoice")
REF_FIX = (
    f"lay out each voice as DIR/LANGUAGE/NAME/{REF_AUDIO} + {REF_TEXT} (a clone) or "
    f"DIR/LANGUAGE/NAME/{REF_INSTRUCT} (a design), or leave the folder out"
)


class RefModel(Protocol):
    """What reading a reference folder asks of the loaded model (service.ServedModel is one)."""

    @property
    def runtime_config(self) -> dict[str, Any]: ...

    def validate(self, text: str, *, instruct: str) -> Request: ...

    def create_voice_clone_prompt(self, ref_audio: Any, ref_text: str) -> VoiceClonePrompt: ...


@dataclass(frozen=True)
class RefVoice:
    """One voice of the reference folder, ready to speak."""

    name: str
    language: str  # as Info advertises it (the folder's name, "_" read as "-"); its requests' language
    prompt: VoiceClonePrompt | None  # a clone's encoded recording
    instruct: str | None  # a design's description
    seed: int | None  # a design's fixed seed (ref_seed); None for a clone (its speaker is the recording's)
    description: str  # what Info says after the name


def ref_seed(instruct: str) -> int:
    """A designed reference voice's seed: from its description alone, so that the same folder is the
    same speaker on every request, restart and machine."""
    return int.from_bytes(hashlib.sha256(instruct.encode()).digest()[:SEED_BYTES], "big")


def read_text(path: Path) -> str:
    """A transcript's or description's text: UTF-8, bounded, not blank; one line naming the file."""
    try:
        if path.stat().st_size > MAX_REF_TEXT_BYTES:
            raise UserError(f"--ref-dir: {path} is larger than {MAX_REF_TEXT_BYTES} bytes", "shorten it")
        text = path.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        raise UserError(f"--ref-dir: {path} is not UTF-8 text", "save it as UTF-8") from None
    except OSError as exc:
        raise UserError(f"--ref-dir: cannot read {path} ({exc.strerror})", REF_FIX) from None
    if not text:
        raise UserError(f"--ref-dir: {path} is empty", "write the transcript (ref.txt) or description (instruct.txt)")
    return text


def check_ref_dir(folder: Path) -> Path:
    """`folder` if it is a folder (named before the model loads); one line otherwise."""
    if not folder.is_dir():
        raise UserError(f"--ref-dir {folder} is not a folder", REF_FIX)
    return folder


def scan_ref_dir(folder: Path, tts: RefModel) -> dict[str, RefVoice]:
    """The voices of the reference folder `folder`, read, checked and encoded with `tts`, by their
    names' casefold (the order Info lists them: by language folder, then name)."""
    check_ref_dir(folder)
    languages = tts.runtime_config["languages"]
    found: dict[str, RefVoice] = {}
    for language_dir in sorted(path for path in folder.iterdir() if path.is_dir()):
        language = language_dir.name.replace("_", "-")
        for voice_dir in sorted(path for path in language_dir.iterdir() if path.is_dir()):
            clone = (voice_dir / REF_AUDIO).is_file() and (voice_dir / REF_TEXT).is_file()
            if not clone and not (voice_dir / REF_INSTRUCT).is_file():
                continue  # not a voice folder (wyoming-piper passes over it too)
            try:
                name = check_new_name(voice_dir.name)
                resolve_language(language, languages)
            except UserError as exc:
                raise UserError(f"--ref-dir: {voice_dir}: {exc.problem}", exc.fix or REF_FIX) from None
            if name.casefold() in found:
                raise UserError(
                    f"--ref-dir: two voices named {name!r} ({found[name.casefold()].language} and {language})",
                    "rename one of the folders (voice names are unique, whatever their case)",
                )
            found[name.casefold()] = ref_voice(voice_dir, name, language, clone, tts)
    return found


def ref_voice(voice_dir: Path, name: str, language: str, clone: bool, tts: RefModel) -> RefVoice:
    """The voice of one folder: a clone's recording encoded, a design's description checked."""
    if clone:
        try:
            prompt = tts.create_voice_clone_prompt(str(voice_dir / REF_AUDIO), read_text(voice_dir / REF_TEXT))
        except UserError as exc:
            raise UserError(f"--ref-dir: {voice_dir / REF_AUDIO}: {exc.problem}", exc.fix) from None
        return RefVoice(name, language, prompt, None, None, "cloned voice")
    instruct = read_text(voice_dir / REF_INSTRUCT)
    try:
        tts.validate("Hello.", instruct=instruct)
    except UserError as exc:
        raise UserError(f"--ref-dir: {voice_dir / REF_INSTRUCT}: {exc.problem}", exc.fix) from None
    return RefVoice(name, language, None, instruct, ref_seed(instruct), instruct)


def label(name: str, what: str) -> str:
    """A voice's label in Home Assistant's picker, which shows the description (else the name):
    the name first, then what the voice is, cut at a comma to MAX_DESCRIPTION_CHARS."""
    line = f"{name}: {what}"
    while len(line) > MAX_DESCRIPTION_CHARS and ", " in line:
        line = line.rsplit(", ", 1)[0]
    return line if len(line) <= MAX_DESCRIPTION_CHARS else line[: MAX_DESCRIPTION_CHARS - 1] + "\u2026"


def info(voices: list[tuple[str, str, list[str]]]) -> Any:
    """The Info event's content: one TTS program with `voices`, each (name, label, languages)."""
    from wyoming.info import Attribution, Info, TtsProgram, TtsVoice

    attribution = Attribution(*ATTRIBUTION)
    program = TtsProgram(
        name="omnivoice-onnx",
        attribution=attribution,
        installed=True,
        version=__version__,
        description="OmniVoice text to speech (ONNX, no torch)",
        voices=[
            TtsVoice(
                name=name, attribution=attribution, installed=True, description=what, version=None, languages=spoken
            )
            for name, what, spoken in voices
        ],
        supports_synthesize_streaming=True,
    )
    return Info(tts=[program])
