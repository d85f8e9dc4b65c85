"""Upstream's saved voices (`VoiceClonePrompt.save(path)`: torch.save of a dict, a .pt file) read
WITHOUT torch and without executing the pickle inside.

    data = read_upstream_prompt(Path("my_voice.pt"))   # {"ref_audio_tokens", "ref_text", "ref_rms", ...}

An allow-list unpickler (UpstreamUnpickler) builds only the dict of a version, a string, a float
and one int64 tensor (read from the zip's data/ entry); a pickle that asks for any other global
(os.system, builtins.eval, ...) is refused with one line before anything it names is called.
What the dict's values mean (codes, transcript, level) the voices store checks (voices.py): this
module's one job is to get them out of the file safely.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from omnivoice_onnx.errors import UserError

UPSTREAM_FORMAT_VERSION = 1  # omnivoice 0.2.1 _VOICE_CLONE_PROMPT_FORMAT_VERSION
# An upstream voice file is ~10 KB (8 x T int64 codes + a few strings); anything near this size
# is not one, and the cap bounds what a crafted zip can make the reader inflate.
MAX_UPSTREAM_BYTES = 64 << 20
UPSTREAM_KEYS = {"format_version", "ref_audio_tokens", "ref_text", "ref_rms"}  # the dict save() writes
UPSTREAM_FIX = (
    "pass a file written by upstream's VoiceClonePrompt.save, or add the voice with `omnivoice-onnx voice add`"
)


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


def read_upstream_prompt(path: Path) -> dict[str, Any]:
    """The dict of an upstream VoiceClonePrompt.save file (UPSTREAM_KEYS; its tokens an int64
    ndarray), read without torch; anything but that dict is a UserError and its pickle is never
    executed. Its values' meaning is checked by the caller (voices.load_upstream_voice)."""
    path = Path(path)
    fix = UPSTREAM_FIX
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
    if not isinstance(data, dict) or set(data) != UPSTREAM_KEYS:
        keys = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise UserError(f"{path} holds {keys}, not upstream's voice dict {sorted(UPSTREAM_KEYS)}", fix)
    if type(data["format_version"]) is not int or data["format_version"] != UPSTREAM_FORMAT_VERSION:
        raise UserError(
            f"{path} has upstream format_version {data['format_version']!r}; this runtime reads "
            f"{UPSTREAM_FORMAT_VERSION}",
            fix,
        )
    if not isinstance(data["ref_audio_tokens"], np.ndarray):
        raise UserError(f"{path}: ref_audio_tokens is not a tensor", fix)
    return data
