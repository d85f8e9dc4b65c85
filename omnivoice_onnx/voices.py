"""Voices by name: saved ones (a cloning reference, or a voice-design instruct and its seed, kept as
a small file) and the built-in presets (OpenAI's voice names, each a designed voice with a fixed seed).

    voices = voices_dir(tts.bundle)                         # --voices > $OMNIVOICE_VOICES > onnx/voices
    prompt = tts.create_voice_clone_prompt("ref.wav", "The reference's words.")
    save_voice(voices, "alice", Voice("alice", prompt, None, tts.metadata["model_fingerprint"], Path()))
    voice = load_voice("alice", voices, tts.metadata["model_fingerprint"])   # a saved voice, else a preset
    audios = tts.generate("Hello.", **voice.generate_kwargs(), seed=voice.seed)

Every front end resolves a name here, the same way: a saved voice of that name first (whatever
its case), else the preset (PRESETS). A designed voice is an instruct AND a seed: the same
instruct with another seed is another speaker, so a saved designed voice keeps the seed it was
made with (drawn at save time when none is given: new_voice), and a request that gives no seed
of its own speaks with the voice's, the same bytes for the same text on every request.

A voice file `<voices>/<name>.json` (format documented in docs/runtime.md, "Voice files") holds
what generate() needs instead of the reference audio: the encoded reference tokens (int64 [C, T]),
its transcript and RMS, and/or a voice-design instruct, the seed that speaks it, with the
fingerprint of the model whose encoder made the tokens and a format version. JSON, not npz,
because a port (C#, Swift, JS) reads it with its standard JSON library, where npz needs a zip
reader and an .npy header parser; the tokens of a 5 s reference are 8 x 125 small ints (~5 KB of
text), and the file stays readable and diffable. Tokens are codes of one model's audio
tokenizer: a voice of another model (another fingerprint) is refused, not silently misread.

Upstream's `VoiceClonePrompt.save(path)` files (.pt) load too, WITHOUT torch and without executing
the pickle inside (omnivoice_onnx.upstream_voice). An upstream file carries no fingerprint: that
it was made by the same model cannot be checked (`omnivoice-onnx voice import` stamps the bundle's).

Writes are atomic (temp + rename): an interrupted `voice add` leaves the old voice or the new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from omnivoice_onnx.contract import AUDIO_VOCAB_SIZE, FRAME_RATE, NUM_CODEBOOKS
from omnivoice_onnx.core.rng import fresh_seed
from omnivoice_onnx.core.shapes import VoiceClonePrompt
from omnivoice_onnx.errors import UserError, check_path, check_unicode
from omnivoice_onnx.files import FolderLock, atomic_path, make_folder, resolved_folder
from omnivoice_onnx.limits import check_seed, limit, too_large
from omnivoice_onnx.reading import Maybe, checked, read_json
from omnivoice_onnx.upstream_voice import read_upstream_prompt
from omnivoice_onnx.verified import stat_identity

VOICES_ENV = "OMNIVOICE_VOICES"  # the voices folder when no --voices is given (voices_dir)
VOICE_SUFFIX = ".json"
UPSTREAM_SUFFIX = ".pt"
VOICE_FORMAT = "omnivoice-onnx voice"  # the file's "format" field: what it is, for a reader that finds it alone
# 2 added "seed" (the speaker of a designed voice); a version-1 file (no seed) still reads, as a
# voice without one. A runtime that reads only 1 refuses a 2: it would speak another speaker.
VOICE_FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MAX_CODE = AUDIO_VOCAB_SIZE - 2  # codes 0..1023; 1024 is the mask id, never an encoder output
# A voice file holds at most MAX_REF_SECONDS x 25 frames x 8 codes of <= 5 characters ("1023,"):
# ~60 KB at the default 60 s. Its reader stops well above that, before reading a huge file whole.
MAX_VOICE_BYTES = 16 << 20
NAME_PATTERN = re.compile(r"[^\W_][\w-]{0,63}")  # letters/digits first, then letters, digits, _ and -
# Names a request reads as something else, in any case: the modes and the prefix of an uploaded
# reference's id. A voice saved under one could never be asked for: none is written or listed.
MODES = {
    "auto": "upstream's auto mode: a voice the model picks; with `instructions`, voice design",
    "design": 'voice design from `instructions` (required), e.g. "female, low pitch, british accent"',
}
# The modes a voice list offers: "design" is left out, since it speaks only with a description
# (which Open WebUI and Wyoming cannot send); "auto" with instructions designs the same voice.
LISTED_MODES = ("auto",)
REFERENCE_PREFIX = "ref-"  # the voice id of an uploaded reference: "ref-" + the first hex of its sha256
REPLACE_FIX = "pass --force to replace it, or choose another name"
# The JSON type of each field a voice file's reader uses (reading.schema_problem's notation; the
# values are checked after: the version, a non-empty fingerprint, the tokens' shape and range).
VOICE_SCHEMA = {
    "format_version": int,
    "model_fingerprint": str,
    "instruct": Maybe(str),
    "ref_text": Maybe(str),
    "ref_rms": Maybe(float),
    "ref_audio_tokens": Maybe([[int]]),
    "seed": Maybe(int),
}
ADD_FIX = "re-create it with `omnivoice-onnx voice add NAME --ref-audio F --ref-text T` for this model"


class BundleFolder(Protocol):
    """What the voices store asks of a bundle folder (bundle.Folder is one, opened or not): where
    it is, and where its own voices folder lies. The store needs nothing of a bundle's opening or
    verification."""

    @property
    def dir(self) -> Path: ...

    @property
    def voices_path(self) -> Path: ...


def voices_dir(bundle: BundleFolder, override: Path | None = None) -> Path:
    """Where voices live: `override` (--voices) if given, else $OMNIVOICE_VOICES if set and not
    empty, else the bundle's own (Folder.voices_path: <model-dir>/voices, beside the graphs).

    Resolved once (files.resolved_folder): a path that is not a folder is one line, and the
    default must stay inside the bundle: a bundle's voices/ that is a symlink elsewhere (a bundle
    from someone else) would otherwise receive `voice add`."""
    fix = "pass --voices FOLDER (or set $OMNIVOICE_VOICES) to name the voices folder"
    if override is not None:
        return resolved_folder(Path(override), "--voices", "pass a folder (or a path to create one at)")
    env = os.environ.get(VOICES_ENV)
    if env:
        return resolved_folder(Path(env), f"${VOICES_ENV}", "set it to a folder (or a path to create one at)")
    return resolved_folder(bundle.voices_path, "the bundle's voices folder", fix, within=bundle.dir)


def check_name(name: str) -> str:
    """`name` if it is a plain voice name; a UserError otherwise. Names are names, not paths:
    '../x', '/abs', 'a.b', '' and '-x' are refused, so a name can never write outside the folder
    and `--voice` tells a name from a file path by its dot or slash."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise UserError(
            f"voice name {name!r} is not a plain name (a letter or digit, then letters, digits, "
            "'_' or '-', at most 64; no dots, slashes or spaces)",
            "pass a name like 'alice' or 'narrator_2'",
        )
    return name


def is_reserved(name: str) -> bool:
    """Whether `name` (any case) means a mode or an uploaded reference rather than a saved voice."""
    return name.casefold() in MODES or name.casefold().startswith(REFERENCE_PREFIX)


def check_new_name(name: str) -> str:
    """`name` if a voice may be saved under it (check_name, not is_reserved), else a UserError before
    anything is written: the one rule for every writer (voice add/import, HTTP, a rename, save_as)."""
    if is_reserved(check_name(name)):
        modes = " and ".join(map(repr, MODES))
        raise UserError(
            f"voice name {name!r} is reserved: {modes} are modes, {REFERENCE_PREFIX}... uploaded references",
            "choose another name (no request could ask for a voice saved under it)",
        )
    return name


def is_askable(name: str) -> bool:
    """Whether a request can name the saved voice `name` (plain, not reserved): else not listed."""
    return NAME_PATTERN.fullmatch(name) is not None and not is_reserved(name)


def voice_files(voices: Path) -> dict[str, Path]:
    """The voice files in `voices` a request can ask for (is_askable), by name: every reader's listing."""
    found = sorted(Path(voices).glob(f"*{VOICE_SUFFIX}")) if Path(voices).is_dir() else []
    return {path.stem: path for path in found if is_askable(path.stem)}


def voice_path(voices: Path, name: str) -> Path:
    """The file of the saved voice `name` (checked to be a plain name)."""
    return Path(voices) / f"{check_name(name)}{VOICE_SUFFIX}"


def find_saved(voices: Path, name: str) -> Path | None:
    """The file of the saved voice called `name`, whatever its case (`Alice` finds alice.json; the
    exact spelling first, so of two files differing only in case each stays reachable); None when
    there is none. Voice names travel through menus and speech assistants that capitalise them."""
    exact = voice_path(voices, name)
    if exact.is_file():
        return exact
    wanted = name.casefold() + VOICE_SUFFIX
    folder = Path(voices)
    found = (
        sorted(path for path in folder.glob(f"*{VOICE_SUFFIX}") if path.name.casefold() == wanted and path.is_file())
        if folder.is_dir()
        else []
    )
    return found[0] if found else None


def is_voice_path(spec: str) -> bool:
    """Whether a --voice value names a file (it holds a slash or a dot) rather than a saved voice."""
    return "/" in spec or os.sep in spec or "." in spec


@dataclass(frozen=True)
class Voice:
    """A saved voice: what generate() takes instead of a reference, for one model."""

    name: str
    prompt: VoiceClonePrompt | None  # the encoded reference (clone), or None for a designed voice
    instruct: str | None  # a voice-design instruct ("female, low pitch"), as the user wrote it
    model_fingerprint: str  # the model whose encoder made the tokens; "": any (a preset) or unknown (a .pt)
    path: Path  # the file it was read from (Path() for a preset, or one not yet saved)
    # The seed a request without one speaks it with (None: the request's own, else a fresh one).
    # For a designed voice it IS the speaker: new_voice always gives one a seed.
    seed: int | None = None

    @property
    def is_preset(self) -> bool:
        """Whether it is a built-in preset (PRESETS), not a saved voice."""
        return PRESETS.get(self.name.casefold()) is self

    def generate_kwargs(self) -> dict[str, Any]:
        """The generate()/stream() keywords that speak in this voice (its seed apart: the caller's
        request seed wins over `seed`)."""
        kwargs: dict[str, Any] = {}
        if self.prompt is not None:
            kwargs["voice_clone_prompt"] = self.prompt
        if self.instruct is not None:
            kwargs["instruct"] = self.instruct
        return kwargs

    def to_json(self) -> dict[str, Any]:
        """The file's content (docs/runtime.md "Voice files")."""
        prompt = self.prompt
        return {
            "format": VOICE_FORMAT,
            "format_version": VOICE_FORMAT_VERSION,
            "model_fingerprint": self.model_fingerprint,
            "instruct": self.instruct,
            "ref_text": prompt.ref_text if prompt else None,
            "ref_rms": float(prompt.ref_rms) if prompt else None,
            "ref_audio_tokens": np.asarray(prompt.ref_audio_tokens).tolist() if prompt else None,
            "seed": self.seed,
        }


# --- the presets: OpenAI's voice names as designed voices -----------------------------------------
#
# Open WebUI, Home Assistant's OpenAI TTS integration and most SDK examples send a voice such as
# `alloy`. OmniVoice has no named speakers: without a reference it designs a voice from a
# description (an instruct) and the seed. A preset is therefore a designed voice with a fixed
# seed, as a saved designed voice is: the seed is what makes `alloy` the same voice on every
# request (a request's own `seed` still wins). A saved voice of the same name hides the preset
# (save one called `alloy` to replace it). These are the current `openai` SDK's thirteen (marin
# and cedar the newest); each has a design no other preset uses, in upstream's English instruct
# vocabulary only (runtime-config.json's instruct.valid_en; tests/test_presets.py resolves each
# one as generate() does). With random weights (the test bundles) every preset speaks noise: the
# descriptions say what the real checkpoint is asked for. A preset holds no model's codes, so it
# speaks with any model (model_fingerprint "").


def _preset(name: str, instruct: str, seed: int) -> Voice:
    return Voice(name, None, instruct, "", Path(), seed)


PRESETS: dict[str, Voice] = {
    preset.name: preset
    for preset in (
        _preset("alloy", "female, young adult, moderate pitch, american accent", 1001),
        _preset("ash", "male, young adult, moderate pitch, american accent", 1002),
        _preset("ballad", "male, middle-aged, low pitch, british accent", 1003),
        _preset("coral", "female, middle-aged, moderate pitch, american accent", 1004),
        _preset("echo", "male, middle-aged, moderate pitch, canadian accent", 1005),
        _preset("fable", "male, young adult, moderate pitch, british accent", 1006),
        _preset("nova", "female, young adult, high pitch, american accent", 1007),
        _preset("onyx", "male, middle-aged, very low pitch, american accent", 1008),
        _preset("sage", "female, middle-aged, low pitch, british accent", 1009),
        _preset("shimmer", "female, young adult, moderate pitch, australian accent", 1010),
        _preset("verse", "male, young adult, high pitch, american accent", 1011),
        _preset("marin", "female, middle-aged, low pitch, american accent", 1012),
        _preset("cedar", "male, middle-aged, low pitch, american accent", 1013),
    )
}


def find_preset(name: str) -> Voice | None:
    """The preset called `name`, whatever its case (None: no preset of that name)."""
    return PRESETS.get(name.casefold()) if isinstance(name, str) else None


def check_tokens(tokens: Any, where: str) -> np.ndarray:
    """Reference tokens as int64 [NUM_CODEBOOKS, T >= 1] with codes 0..MAX_CODE; UserError otherwise."""
    try:
        array = np.asarray(tokens)
    except ValueError as exc:  # ragged nested lists
        raise UserError(f"{where}: ref_audio_tokens is not a rectangular array ({exc})", ADD_FIX) from exc
    if array.ndim != 2 or array.shape[0] != NUM_CODEBOOKS or array.shape[1] < 1 or array.dtype.kind not in "iu":
        raise UserError(
            f"{where}: ref_audio_tokens must be integers [{NUM_CODEBOOKS}, T], got {array.dtype} {list(array.shape)}",
            ADD_FIX,
        )
    if array.shape[1] > limit("MAX_REF_SECONDS") * FRAME_RATE:  # refused on import as on use (check_prompt)
        raise too_large(
            f"{where}: ref_audio_tokens holds {array.shape[1] / FRAME_RATE:.1f} s of reference",
            "MAX_REF_SECONDS",
            "make the voice from a shorter reference (3-10 s is best)",
        )
    if array.min() < 0 or array.max() > MAX_CODE:
        raise UserError(f"{where}: ref_audio_tokens holds codes outside 0..{MAX_CODE}", ADD_FIX)
    return array.astype(np.int64)


def _prompt(tokens: Any, ref_text: Any, ref_rms: Any, where: str) -> VoiceClonePrompt:
    if not isinstance(ref_text, str) or not ref_text.strip():
        raise UserError(f"{where}: ref_text must be the reference's transcript (a non-empty string)", ADD_FIX)
    check_unicode(ref_text, f"{where}: ref_text", ADD_FIX)
    if isinstance(ref_rms, bool) or not isinstance(ref_rms, (int, float)) or not np.isfinite(ref_rms) or ref_rms < 0:
        raise UserError(f"{where}: ref_rms must be a finite number >= 0, got {ref_rms!r}", ADD_FIX)
    return VoiceClonePrompt(ref_audio_tokens=check_tokens(tokens, where), ref_text=ref_text, ref_rms=float(ref_rms))


def _read_json_voice(path: Path) -> Voice:
    """A voice file, its fields checked (the fingerprint is the caller's to compare)."""
    data = read_json(path, "voice file", ADD_FIX, MAX_VOICE_BYTES)
    if not isinstance(data, dict) or data.get("format") != VOICE_FORMAT:
        raise UserError(f'{path} is not an omnivoice-onnx voice file (no "format": "{VOICE_FORMAT}")', ADD_FIX)
    checked(data, VOICE_SCHEMA, f"voice file {path}", ADD_FIX)
    if data["format_version"] not in READABLE_VERSIONS:
        raise UserError(
            f"voice file {path} has format_version {data.get('format_version')!r}; this runtime reads "
            f"{' and '.join(map(str, READABLE_VERSIONS))}",
            "upgrade omnivoice-onnx to read it, or " + ADD_FIX,
        )
    seed = data.get("seed") if data["format_version"] >= 2 else None
    if seed is not None:
        try:
            seed = check_seed(seed)
        except UserError as exc:
            raise UserError(f"voice file {path}: {exc.problem}", ADD_FIX) from None
    fingerprint, instruct = data["model_fingerprint"], data.get("instruct")
    if not fingerprint:
        raise UserError(f"voice file {path} has no model_fingerprint", ADD_FIX)
    if instruct is not None and not instruct.strip():
        raise UserError(f"voice file {path}: instruct must be a non-empty string or null", ADD_FIX)
    if instruct is not None:
        check_unicode(instruct, f"voice file {path}: instruct", ADD_FIX)
    prompt = None
    if data.get("ref_audio_tokens") is not None:
        prompt = _prompt(data["ref_audio_tokens"], data.get("ref_text"), data.get("ref_rms"), str(path))
    elif instruct is None:
        raise UserError(f"voice file {path} holds neither reference tokens nor an instruct", ADD_FIX)
    return Voice(
        path.name[: -len(VOICE_SUFFIX)] if path.name.endswith(VOICE_SUFFIX) else path.stem,
        prompt,
        instruct,
        fingerprint,
        path,
        seed,
    )


def read_voice(spec: str, voices: Path) -> Voice:
    """The voice `spec` names, its fingerprint not compared: a saved voice's name
    (<voices>/<name>.json), else a preset's (PRESETS), or a file's path (an omnivoice-onnx .json
    voice, or an upstream VoiceClonePrompt.save .pt). For `voice show`, which must open another
    model's voice too."""
    if not is_voice_path(spec):
        path = find_saved(voices, spec)
        if path is not None:
            return _read_json_voice(path)
        preset = find_preset(spec)
        if preset is None:
            raise UserError(
                f"no voice named {spec!r} (no saved voice in {voices}, and no preset of that name)",
                f"choose one of {', '.join(voice_names(voices))} (`omnivoice-onnx voice list`), or make it with "
                "`omnivoice-onnx voice add`",
            )
        return preset
    path = Path(check_path(spec, "voice"))
    if not path.is_file():
        raise UserError(
            f"voice file {path} not found",
            "pass an existing .json or .pt voice file, or a saved voice's name (`omnivoice-onnx voice list`)",
        )
    if path.suffix == UPSTREAM_SUFFIX:
        return load_upstream_voice(path)
    if path.suffix != VOICE_SUFFIX:
        raise UserError(
            f"voice file {path} is neither .json (omnivoice-onnx) nor .pt (upstream VoiceClonePrompt.save)",
            "pass a .json or .pt voice file",
        )
    return _read_json_voice(path)


def new_voice(
    name: str, prompt: VoiceClonePrompt | None, instruct: str | None, model_fingerprint: str, seed: int | None
) -> Voice:
    """A voice to save (voice add, POST /v1/audio/voices): `seed` checked; a designed voice (no
    reference) given none gets one drawn now, so it is one speaker on every request, as a preset
    is. A clone keeps `seed` as given (its speaker is the reference's; a seed fixes the bytes)."""
    if seed is None and prompt is None:
        seed = fresh_seed()
    return Voice(name, prompt, instruct, model_fingerprint, Path(), None if seed is None else check_seed(seed))


def design_needs(what: str) -> str:
    """The one line for voice 'design' asked for without a description (`what`: the front end's
    name for it: `instructions`, --instruct)."""
    return f"voice 'design' needs {what} describing the voice, e.g. \"female, low pitch, british accent\""


def voice_names(voices: Path) -> list[str]:
    """Every name a --voice may give besides a file: the saved voices of `voices`, then the presets
    no saved voice hides, then the modes a list offers (LISTED_MODES): the CLI's "choose from"."""
    saved = list(voice_files(voices))
    hidden = {name.casefold() for name in saved}
    return saved + [name for name in PRESETS if name not in hidden] + list(LISTED_MODES)


def for_model(voice: Voice, model_fingerprint: str) -> Voice:
    """`voice` when it may speak with the model `model_fingerprint`: a .json voice of another
    model is refused, naming both. An upstream .pt carries no fingerprint and is taken as is. The
    one check between a voice and a request: speak and batch (load_voice) and the server
    (VoiceShelf) all pass through it, then take voice.generate_kwargs()."""
    if voice.model_fingerprint and voice.model_fingerprint != model_fingerprint:
        raise UserError(
            f"voice {voice.name!r} ({voice.path}) was made for model {voice.model_fingerprint}, but "
            f"this bundle is model {model_fingerprint}: its tokens are another model's codes",
            ADD_FIX.replace("NAME", voice.name),
        )
    return voice


def load_voice(spec: str, voices: Path, model_fingerprint: str) -> Voice:
    """The voice `spec` names (read_voice: a saved voice's name, a preset's, or a voice file's
    path), checked for the model `model_fingerprint` (for_model); its generate_kwargs() are what a
    request takes, and its seed the request's when the request gives none."""
    return for_model(read_voice(spec, voices), model_fingerprint)


class VoiceShelf:
    """The saved voices of one folder for a long-lived reader (the server): each request lists the
    folder once (listing()) and looks its voice up in that listing; a file is parsed once per stat
    identity (verified.stat_identity: inode, size, mtime, ctime), so an unchanged voice is not read
    again, and a voice added, replaced (save_voice renames a new file into place: a new inode) or
    removed is seen by the next request. A damaged file is remembered as its refusal, and named
    only by what reads it (the voice list; a request naming it), never by a request for another."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._parsed: dict[Path, tuple[list[int], Voice | UserError]] = {}
        self._lock = threading.Lock()  # requests are planned on the event loop and in worker threads

    def listing(self) -> SavedVoices:
        """The folder's voice files as they are now (one directory read: voice_files)."""
        files = voice_files(self.folder)
        with self._lock:  # a removed voice's parse is forgotten
            for gone in set(self._parsed) - set(files.values()):
                del self._parsed[gone]
        return SavedVoices(self, files)

    def read(self, path: Path) -> Voice | None:
        """The voice file at `path`, parsed once per identity; None when it is gone since the listing
        (a concurrent remove or rename: no voice, not a damaged one); replaced while read: read again."""
        identity = _identity(path)
        if identity is None:
            return None
        with self._lock:
            cached = self._parsed.get(path)
        if cached is not None and cached[0] == identity:
            result = cached[1]
        else:
            try:
                result = _read_json_voice(path)
            except UserError as exc:
                if _identity(path) != identity:  # removed or replaced while it was read
                    return self.read(path)
                result = exc
            with self._lock:
                self._parsed[path] = (identity, result)
        if isinstance(result, UserError):
            raise UserError(result.problem, result.fix)
        return result


def _identity(path: Path) -> list[int] | None:
    """The stat identity of the file at `path` (verified.stat_identity), None when there is none."""
    with contextlib.suppress(FileNotFoundError):
        return stat_identity(os.stat(path))
    return None


@dataclass(frozen=True)
class SavedVoices:
    """One listing of a VoiceShelf's folder: what one request sees."""

    shelf: VoiceShelf
    files: dict[str, Path]  # voice name (the file's, as spelled) -> its file

    def find(self, name: str) -> Voice | None:
        """The saved voice called `name`, whatever its case, as find_saved matches it (the exact
        spelling first, then the first case-folded match by file name); None when there is none."""
        check_name(name)
        wanted = name.casefold()
        path = self.files.get(name) or next((p for n, p in self.files.items() if n.casefold() == wanted), None)
        return None if path is None else self.shelf.read(path)

    def voices(self) -> list[Voice]:
        """Every saved voice, by name (list_voices: a damaged file is a UserError naming it; one
        removed since the listing is left out)."""
        return [voice for path in self.files.values() if (voice := self.shelf.read(path)) is not None]


def list_voices(voices: Path) -> list[Voice]:
    """The saved voices in `voices` a request can ask for (voice_files), by name (none when the
    folder does not exist). A damaged file is a UserError naming it (`omnivoice-onnx voice remove
    NAME` deletes it)."""
    return [_read_json_voice(path) for path in voice_files(voices).values()]


def save_voice(voices: Path, name: str, voice: Voice, replace: bool = True) -> Path:
    """Write `voice` as <voices>/<name>.json (atomically) -> its path. An existing voice of that
    name is replaced, or with `replace` False refused; the check and the write hold the name's
    lock (files.FolderLock), so of two writers without replace one saves and one is refused. A
    reserved name is refused first (check_new_name)."""
    path = voice_path(voices, check_new_name(name))
    if not voice.model_fingerprint or (voice.prompt is None and voice.instruct is None):
        # What _read_json_voice would refuse is never written.
        raise UserError(
            f"voice {name!r} has no model fingerprint, or neither a reference nor an instruct",
            "give it the bundle's model_fingerprint and a prompt or an instruct",
        )
    text = json.dumps(voice.to_json(), ensure_ascii=False, separators=(",", ":")) + "\n"
    make_folder(voices, "the voices folder", "pass --voices FOLDER (a real folder, or a path to create one at)")
    with FolderLock(voices, _lock_name(name), f"voice {name!r}"):
        existing = find_saved(voices, name)  # Alice replaces (or is refused by) alice: one voice, one name
        if not replace and (os.path.lexists(path) or existing is not None):
            raise UserError(f"voice {name!r} already exists ({existing or path})", REPLACE_FIX)
        with atomic_path(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
        if existing is not None and existing != path:
            existing.unlink(missing_ok=True)
    return path


def _lock_name(name: str) -> str:
    """The lock of a voice name, one for all its spellings (Alice and alice are one voice)."""
    return name.casefold() + VOICE_SUFFIX


def remove_voice(voices: Path, name: str) -> Path:
    """Delete the saved voice `name` (whatever its case) -> the file removed; UserError when there
    is none."""
    check_name(name)
    # No folder, no voice to lock (find_saved then finds none).
    with FolderLock(voices, _lock_name(name), f"voice {name!r}") if Path(voices).is_dir() else contextlib.nullcontext():
        path = find_saved(voices, name)
        if path is None:
            raise UserError(f"no voice named {name!r} in {voices}", "see `omnivoice-onnx voice list`")
        path.unlink()
    return path


def rename_voice(voices: Path, name: str, new_name: str) -> Path:
    """Give the saved voice `name` the name `new_name` -> its new file. Refused when there is no
    voice `name`, or another voice already has `new_name` (a change of case alone is allowed), or
    `new_name` is reserved (check_new_name)."""
    check_new_name(new_name)
    check_name(name)
    locks = sorted({_lock_name(name), _lock_name(new_name)})  # always taken in one order: no deadlock
    with contextlib.ExitStack() as held:
        if Path(voices).is_dir():
            for lock in locks:
                held.enter_context(FolderLock(voices, lock, f"voice {lock[: -len(VOICE_SUFFIX)]!r}"))
        source = find_saved(voices, name)
        if source is None:
            raise UserError(f"no voice named {name!r} in {voices}", "see `omnivoice-onnx voice list`")
        taken = find_saved(voices, new_name)
        if taken is not None and taken != source:
            raise UserError(f"voice {new_name!r} already exists ({taken})", "remove it first, or choose another name")
        target = voice_path(voices, new_name)
        os.replace(source, target)
    return target


def load_upstream_voice(path: Path) -> Voice:
    """An upstream VoiceClonePrompt.save file as a Voice (model_fingerprint "": a .pt carries none),
    read without torch (upstream_voice.read_upstream_prompt) and its values checked as a voice
    file's are."""
    data = read_upstream_prompt(path)
    prompt = _prompt(data["ref_audio_tokens"], data["ref_text"], data["ref_rms"], str(path))
    return Voice(Path(path).stem, prompt, None, "", Path(path))
