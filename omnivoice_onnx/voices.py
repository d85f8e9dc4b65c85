"""Saved voices: a cloning reference (or a voice-design instruct) kept as a small file, by name.

    voices = voices_dir(tts.bundle)                         # --voices > $OMNIVOICE_VOICES > onnx/voices
    prompt = tts.create_voice_clone_prompt("ref.wav", "The reference's words.")
    save_voice(voices, "alice", Voice("alice", prompt, None, tts.metadata["model_fingerprint"], Path()))
    voice = load_voice("alice", voices, tts.metadata["model_fingerprint"])
    audios = tts.generate("Hello.", **voice.generate_kwargs(), seed=1)

A voice file `<voices>/<name>.json` (format documented in docs/runtime.md, "Voice files") holds
what generate() needs instead of the reference audio: the encoded reference tokens (int64 [C, T]),
its transcript and RMS, and/or a voice-design instruct, with the fingerprint of the model whose
encoder made the tokens and a format version. JSON, not npz, because a port (C#, Swift, JS) reads
it with its standard JSON library, where npz needs a zip reader and an .npy header parser; the
tokens of a 5 s reference are 8 x 125 small ints (~5 KB of text), and the file stays readable
and diffable. Tokens are codes of one model's audio tokenizer: a voice of another model (another
fingerprint) is refused, not silently misread.

Upstream's `VoiceClonePrompt.save(path)` files (.pt: torch.save of a dict) load too, WITHOUT torch
and without executing the pickle inside: an allow-list unpickler (UpstreamUnpickler) builds only
the dict of a version, a string, a float and one int64 tensor (read from the zip's data/ entry);
a pickle that asks for any other global (os.system, builtins.eval, ...) is refused with one line
before anything it names is called. An upstream file carries no fingerprint: that it was made by
the same model cannot be checked (`omnivoice-onnx voice import` stamps the bundle's).

Writes are atomic (temp + rename): an interrupted `voice add` leaves the old voice or the new one.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import pickle
import re
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from omnivoice_onnx.contract import AUDIO_VOCAB_SIZE, FRAME_RATE, NUM_CODEBOOKS
from omnivoice_onnx.core.shapes import VoiceClonePrompt
from omnivoice_onnx.errors import UserError, check_path, check_unicode
from omnivoice_onnx.files import FolderLock, atomic_path, make_folder, resolved_folder
from omnivoice_onnx.limits import limit, too_large
from omnivoice_onnx.reading import Maybe, checked, read_json
from omnivoice_onnx.verified import stat_identity

VOICES_ENV = "OMNIVOICE_VOICES"  # the voices folder when no --voices is given (voices_dir)
VOICE_SUFFIX = ".json"
UPSTREAM_SUFFIX = ".pt"
VOICE_FORMAT = "omnivoice-onnx voice"  # the file's "format" field: what it is, for a reader that finds it alone
VOICE_FORMAT_VERSION = 1
UPSTREAM_FORMAT_VERSION = 1  # omnivoice 0.2.1 _VOICE_CLONE_PROMPT_FORMAT_VERSION
MAX_CODE = AUDIO_VOCAB_SIZE - 2  # codes 0..1023; 1024 is the mask id, never an encoder output
# An upstream voice file is ~10 KB (8 x T int64 codes + a few strings); anything near this size
# is not one, and the cap bounds what a crafted zip can make the reader inflate.
MAX_UPSTREAM_BYTES = 64 << 20
# A voice file holds at most MAX_REF_SECONDS x 25 frames x 8 codes of <= 5 characters ("1023,"):
# ~60 KB at the default 60 s. Its reader stops well above that, before reading a huge file whole.
MAX_VOICE_BYTES = 16 << 20
NAME_PATTERN = re.compile(r"[^\W_][\w-]{0,63}")  # letters/digits first, then letters, digits, _ and -
# Names a request reads as something else, in any case: the server's modes and the prefix of an uploaded
# reference's id. A voice saved under one could never be asked for: none is written or listed.
MODES = {
    "auto": "upstream's auto mode: a voice the model picks; with `instructions`, voice design",
    "design": 'voice design from `instructions` (required), e.g. "female, low pitch, british accent"',
}
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
    model_fingerprint: str  # the model whose encoder made the tokens; "" = unknown (an upstream .pt)
    path: Path  # the file it was read from (Path() for one not yet saved)

    def generate_kwargs(self) -> dict[str, Any]:
        """The generate()/stream() keywords that speak in this voice."""
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
        }


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
    if data["format_version"] != VOICE_FORMAT_VERSION:
        raise UserError(
            f"voice file {path} has format_version {data.get('format_version')!r}; this runtime reads "
            f"{VOICE_FORMAT_VERSION}",
            ADD_FIX,
        )
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
    )


def read_voice(spec: str, voices: Path) -> Voice:
    """The voice `spec` names, its fingerprint not compared: a saved voice's name
    (<voices>/<name>.json), or a file's path (an omnivoice-onnx .json voice, or an upstream
    VoiceClonePrompt.save .pt). For `voice show`, which must open another model's voice too."""
    if not is_voice_path(spec):
        path = find_saved(voices, spec)
        if path is None:
            raise UserError(
                f"no voice named {spec!r} in {voices}",
                "see `omnivoice-onnx voice list`, or make it with `omnivoice-onnx voice add`",
            )
        return _read_json_voice(path)
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
    """The voice `spec` names (read_voice: a saved voice's name, or a voice file's path), checked
    for the model `model_fingerprint` (for_model); its generate_kwargs() are what a request takes."""
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


# --- upstream .pt files, without torch ---------------------------------------------------------


class Refused(pickle.UnpicklingError):
    """The pickle asked for something an upstream voice file never holds."""


class _LongStorage:
    """Stands for torch.LongStorage, the one storage type an int64 tensor is saved with."""


def _rebuild_tensor(
    storage: Any,
    offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any = False,
    backward_hooks: Any = None,
    metadata: Any = None,
) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2 for a CPU int64 tensor: a bounds-checked strided view of
    the storage, copied. Anything but plain ints and an in-range view is refused."""
    if not isinstance(storage, np.ndarray) or not all(isinstance(v, int) and v >= 0 for v in (offset, *size, *stride)):
        raise Refused("a tensor with a storage or shape an upstream voice file never has")
    if len(size) != len(stride) or (
        size and all(size) and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= storage.size
    ):
        raise Refused("a tensor view outside its storage")
    tensor: np.ndarray = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=tuple(size), strides=tuple(s * storage.itemsize for s in stride)
    ).copy()
    return tensor


class UpstreamUnpickler(pickle.Unpickler):
    """Reads the pickle of torch.save({"format_version", "ref_audio_tokens", "ref_text", "ref_rms"})
    and nothing else: find_class answers exactly the three globals that dict's pickle names (the
    tensor rebuild, its storage type, the empty hooks OrderedDict) with local stand-ins; any other
    global is Refused before it is looked up, so no callable of the file's choosing ever runs
    (Python's "Restricting Globals" pattern). persistent_load reads a storage from the zip's
    data/<key> entry as int64 of the file's byte order."""

    ALLOWED = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
        ("torch", "LongStorage"): _LongStorage,
        ("collections", "OrderedDict"): collections.OrderedDict,
    }

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, byteorder: str) -> None:
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix, self.dtype = archive, prefix, np.dtype("<i8" if byteorder == "little" else ">i8")

    def find_class(self, module: str, name: str) -> Any:
        allowed = self.ALLOWED.get((module, name))
        if allowed is None:
            raise Refused(f"it asks for {module}.{name}")
        return allowed

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and pid[1] is _LongStorage
            and isinstance(pid[2], str)
            and isinstance(pid[4], int)
        ):
            raise Refused(f"it asks for a storage that is not an int64 one ({str(pid)[:80]})")
        entry = _entry(self.archive, f"{self.prefix}data/{pid[2]}")
        raw = self.archive.read(entry)
        if len(raw) < pid[4] * self.dtype.itemsize:
            raise Refused(f"storage {pid[2]} is shorter than the {pid[4]} values it declares")
        return np.frombuffer(raw, self.dtype, count=pid[4]).astype(np.int64)


def _entry(archive: zipfile.ZipFile, name: str) -> zipfile.ZipInfo:
    try:
        info = archive.getinfo(name)
    except KeyError as exc:
        raise Refused(f"its zip has no {name}") from exc
    if info.file_size > MAX_UPSTREAM_BYTES:
        raise Refused(f"{name} inflates to {info.file_size} bytes")
    return info


def load_upstream_voice(path: Path) -> Voice:
    """An upstream VoiceClonePrompt.save file as a Voice (model_fingerprint "": a .pt carries none),
    read without torch; anything but that dict is a UserError and its pickle is never executed."""
    path = Path(path)
    fix = "pass a file written by upstream's VoiceClonePrompt.save, or add the voice with `omnivoice-onnx voice add`"
    try:
        if path.stat().st_size > MAX_UPSTREAM_BYTES:
            raise UserError(f"{path} is {path.stat().st_size} bytes: not an upstream voice file (~10 KB)", fix)
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith("/data.pkl")]
            if len(pickles) != 1:
                raise UserError(f"{path} is not a torch.save file (no single <name>/data.pkl in its zip)", fix)
            prefix = pickles[0][: -len("data.pkl")]
            names = set(archive.namelist())
            byteorder = archive.read(prefix + "byteorder").decode() if prefix + "byteorder" in names else "little"
            data = UpstreamUnpickler(archive.read(_entry(archive, pickles[0])), archive, prefix, byteorder).load()
    except UserError:
        raise
    except Refused as exc:
        raise UserError(
            f"refused {path}: {exc}, which an upstream voice file never holds (nothing in it was run)", fix
        ) from exc
    except zipfile.BadZipFile as exc:
        raise UserError(f"{path} is not an upstream voice file (not a zip: {exc})", fix) from exc
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror or exc})", "check the path") from exc
    except Exception as exc:  # a damaged or crafted pickle can fail in any opcode; none of it ran user code
        raise UserError(f"{path} is not a readable upstream voice file ({type(exc).__name__}: {exc})", fix) from exc
    expected = {"format_version", "ref_audio_tokens", "ref_text", "ref_rms"}
    if not isinstance(data, dict) or set(data) != expected:
        keys = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise UserError(f"{path} holds {keys}, not upstream's voice dict {sorted(expected)}", fix)
    if type(data["format_version"]) is not int or data["format_version"] != UPSTREAM_FORMAT_VERSION:
        raise UserError(
            f"{path} has upstream format_version {data['format_version']!r}; this runtime reads "
            f"{UPSTREAM_FORMAT_VERSION}",
            fix,
        )
    if not isinstance(data["ref_audio_tokens"], np.ndarray):
        raise UserError(f"{path}: ref_audio_tokens is not a tensor", fix)
    prompt = _prompt(data["ref_audio_tokens"], data["ref_text"], data["ref_rms"], str(path))
    return Voice(path.stem, prompt, None, "", path)
