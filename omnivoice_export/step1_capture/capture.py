"""Record the real I/O of the three modules during `generate()`, and read it back.

Parity is only meaningful on in-distribution inputs that a real `generate()` produced, at every
one of the `num_step` calls (later steps, where the token state differs most, included). The
recorder wraps the transformer forward, `audio_tokenizer.encode` and `audio_tokenizer.decode` of
a loaded model for the duration of one `generate()` and restores them afterwards; it copies
what it sees and never changes a value, so the tokens equal those of an uninstrumented run.

Layout (all `.npz`, loadable with numpy alone):

    capture/ref_voice.{wav,txt}             step 0's clone reference (copied into each capture)
    capture/manifest.json                   provenance, configs, texts, per-file sha256/shapes
    capture/<mode>/transformer_step_NN.npz  input_ids, audio_mask, attention_mask,
                                            logits_cond, logits_uncond (rows generate() reads)
    capture/<mode>/tokens.npz               after_step[N,B,8,T] token state after each step, final
    capture/<mode>/encoder.npz              input_values, audio_codes (clone mode)
    capture/<mode>/decoder.npz              audio_codes, audio_values
    capture/<mode>/output.wav               the final 24 kHz waveform

The `batch` mode is one generate() call on a list of texts of different lengths, as upstream
batches them: B items in 2B transformer rows, each item at its own c_len (shorter cond rows padded
with rows that may attend to nothing) and t_len. Upstream decodes each item on its own, so that
mode has decoder_<i>.npz and output_<i>.wav per item i instead (`item_files`). Token states are
[B,8,T] with T the longest item's, the shorter items padded with the mask id, exactly as
generate() holds them.

Only the logits rows generate() reads are stored: for item i, the cond target rows
[c_len-t_len, c_len) and the uncond rows [0, t_len), as [N, 1025] (items, then codebooks, then
positions: items of different t_len do not stack). The other rows (style, text, reference and
padding) are never read, and storing them would triple a full-random capture. `read_rows`
selects the same rows from any logits, for every comparison against a capture.

The manifest is written (`write_manifest`) and read (`load_manifest`) here, and nowhere else.
"""

from __future__ import annotations

import contextlib
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from omnivoice_export.common.files import first_mismatch
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import atomic_path, write_json_atomic
from omnivoice_onnx.hashing import FILE_ENTRY_SCHEMA, file_entry, sha256_file
from omnivoice_onnx.reading import Each, existing_file, read_artefact

if TYPE_CHECKING:
    import torch
    from omnivoice.models.omnivoice import OmniVoice
    from tqdm import tqdm

CAPTURE_FORMAT = 2  # 2: logits rows as [N, 1025]; the batch mode
MANIFEST_NAME = "manifest.json"
REF_WAV = "ref_voice.wav"
REF_TXT = "ref_voice.txt"
MODES = ("clone", "design", "auto", "batch")
STEP_FILE = "transformer_step_{:02d}.npz"
TOKENS_FILE = "tokens.npz"
ENCODER_FILE = "encoder.npz"
DECODER_FILE = "decoder.npz"
OUTPUT_WAV = "output.wav"
LOGITS_ROWS_NOTE = (
    "logits_cond holds rows [c_len-t_len, c_len) of each cond item i, logits_uncond rows [0, t_len) "
    "of each uncond item B+i, as [N, 1025] ordered by item, codebook, position: exactly the rows "
    "generate() reads; other rows are not stored"
)
RECAPTURE_FIX = "re-run capture_reference.py (step 1)"


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Write arrays as an .npz (integer/bool members deflated), atomically; return its manifest entry.

    np.savez stamps each zip member with the current time, so two identical captures would differ
    in bytes; members here carry a fixed timestamp, so equal tensors give equal files.
    """
    with atomic_path(path) as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
            for name, array in arrays.items():
                info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
                # Masks and ids compress ~100x; float logits/audio barely compress, so store them.
                info.compress_type = zipfile.ZIP_STORED if array.dtype.kind == "f" else zipfile.ZIP_DEFLATED
                with archive.open(info, "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)
    return {
        **file_entry(path),
        "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in arrays.items()},
    }


class CaptureArrays(dict[str, np.ndarray]):
    """The arrays of one capture file by name. A name the file lacks is a UserError naming the
    file (a hand-edited .npz whose sha256 was re-recorded), not a KeyError deep in a stage."""

    def __init__(self, path: Path, arrays: dict[str, np.ndarray]) -> None:
        super().__init__(arrays)
        self.path = path

    def __missing__(self, name: str) -> np.ndarray:
        raise UserError(
            f"capture file {self.path} has no array {name!r} (it has {', '.join(self) or 'none'})", RECAPTURE_FIX
        )


def load_npz(path: Path) -> CaptureArrays:
    """Every array of a capture .npz, or a UserError: missing, unreadable, not a zip, a damaged
    member (truncated, a bad deflate stream, a bad .npy header)."""
    path = existing_file(path, "capture file", RECAPTURE_FIX)
    try:
        with np.load(path, allow_pickle=False) as data:
            return CaptureArrays(path, {k: data[k] for k in data.files})
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise UserError(
            f"capture file {path} is damaged ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})", RECAPTURE_FIX
        ) from exc


def _rows_read(attention_mask: np.ndarray) -> list[tuple[int, int]]:
    """(c_len, t_len) per item: cond row 0 allows exactly the first c_len keys, uncond row 0 the
    first t_len (see OmniVoice._generate_iterative)."""
    batch = attention_mask.shape[0] // 2
    first_rows = attention_mask[:, 0, 0, :]
    return [(int(first_rows[i].sum()), int(first_rows[batch + i].sum())) for i in range(batch)]


def logits_rows(logits: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cond, uncond) logits rows that generate() reads, each [N, V] ordered by item, codebook,
    position (the items of a batch have different t_len)."""
    rows = _rows_read(attention_mask)
    batch, vocab = len(rows), logits.shape[-1]
    cond = np.concatenate([logits[i, :, c - t : c].reshape(-1, vocab) for i, (c, t) in enumerate(rows)])
    uncond = np.concatenate([logits[batch + i, :, :t].reshape(-1, vocab) for i, (_, t) in enumerate(rows)])
    return cond, uncond


def read_rows(logits: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """The rows generate() reads (cond target, then uncond target, of every item) as [N, V]."""
    return np.concatenate(logits_rows(logits, attention_mask))


def pad_items(items: list[np.ndarray], fill: int) -> np.ndarray:
    """Per-item tokens [8, t_i] as one [B, 8, max t_i] array padded with `fill`: the layout
    generate() keeps its token state in (padded with the mask id)."""
    out = np.full((len(items), *items[0].shape[:-1], max(t.shape[-1] for t in items)), fill, dtype=items[0].dtype)
    for i, tokens in enumerate(items):
        out[i, ..., : tokens.shape[-1]] = tokens
    return out


def precision_settings() -> dict[str, Any]:
    """torch's switches that decide whether CUDA computes in TF32, as the manifest records them.

    torch is imported here and in the recorder, not at the top: parity_check.py, infer_onnx.py and
    the bench's orchestrator read captures through this module, and none of them needs torch for it
    (its import is ~2 s, paid on every `--help` and every refused input)."""
    import torch

    return {
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
    }


@contextlib.contextmanager
def full_fp32() -> Iterator[dict[str, Any]]:
    """TF32 off for CUDA matmuls and cuDNN convolutions for the block, restored after; yields the
    settings in force.

    torch 2.13 leaves cuDNN's TF32 on by default (`torch.backends.cudnn.allow_tf32` is True), so a
    CUDA capture would otherwise hold a TF32 codec reference (every conv of the encoder and
    decoder), and a matmul setting changed by anything imported earlier would carry over. On CPU
    the flags change nothing; they are recorded all the same. Only these two (legacy) switches are
    used: torch 2.13 raises when a process mixes them with its newer fp32_precision settings, and
    set_float32_matmul_precision is one of those.
    """
    import torch

    saved = precision_settings()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield precision_settings()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved["cuda_matmul_allow_tf32"]
        torch.backends.cudnn.allow_tf32 = saved["cudnn_allow_tf32"]


@dataclass
class ModeRecord:
    """What one mode's generate() produced, as manifest entries."""

    steps_called: int = 0
    files: dict[str, Any] = field(default_factory=dict)
    rows: list[tuple[int, int]] = field(default_factory=list)  # (c_len, t_len) per item
    seq_len: int = 0  # S of the transformer calls


@contextlib.contextmanager
def patched(patches: list[tuple[object, str, Any]]) -> Iterator[None]:
    """Set (target, name, value) as instance attributes for the block, then restore each one.

    generate() is observed by replacing bound methods on the instance, never on the class, so
    other instances (and an ONNX-backed forward installed before) are left as they were.
    """
    saved = [(target, name, vars(target).get(name)) for target, name, _ in patches]
    for target, name, value in patches:
        setattr(target, name, value)
    try:
        yield
    finally:
        for target, name, previous in saved:
            if previous is None:
                delattr(target, name)  # the class attribute shows through again
            else:
                setattr(target, name, previous)


class Recorder:
    """Wraps a loaded OmniVoice's three modules for one generate() and writes what they see."""

    def __init__(
        self, model: OmniVoice, out_dir: Path, steps: set[int] | None, progress: tqdm[Any] | None = None
    ) -> None:
        self.model = model
        self.mask_id = model.config.audio_mask_id  # what generate() pads shorter items' tokens with
        self.out_dir = Path(out_dir)
        self.steps = steps  # None: all steps
        self.progress = progress
        self.record = ModeRecord()
        self.token_states: list[np.ndarray] = []
        self.encoder_calls: list[dict[str, np.ndarray]] = []
        self.decoder_calls: list[dict[str, np.ndarray]] = []

    def _save(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        self.record.files[name] = save_npz(self.out_dir / name, arrays)

    def _forward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        # attention_mask: upstream's forward makes it optional; generate() always passes it
        def recording_forward(
            input_ids: torch.Tensor, audio_mask: torch.Tensor, attention_mask: Any = None, **kwargs: Any
        ) -> Any:
            output = original(input_ids=input_ids, audio_mask=audio_mask, attention_mask=attention_mask, **kwargs)
            step = self.record.steps_called
            mask = attention_mask.cpu().numpy()
            ids = input_ids.cpu().numpy()
            rows = _rows_read(mask)
            if step:
                # The target region of this call's cond row holds the state after the previous step.
                self.token_states.append(
                    pad_items([ids[i, :, c - t : c] for i, (c, t) in enumerate(rows)], self.mask_id)
                )
            if self.steps is None or step in self.steps:
                cond, uncond = logits_rows(output.logits.float().cpu().numpy(), mask)
                self._save(
                    STEP_FILE.format(step),
                    {
                        "input_ids": ids,
                        "audio_mask": audio_mask.cpu().numpy(),
                        "attention_mask": mask,
                        "logits_cond": cond,
                        "logits_uncond": uncond,
                    },
                )
            self.record.rows, self.record.seq_len = rows, ids.shape[-1]
            self.record.steps_called += 1
            if self.progress is not None:
                self.progress.update(1)
            return output

        return recording_forward

    def _generate_iterative(self, original: Callable[..., Any]) -> Callable[..., Any]:
        # task, gen_config and the returned tokens are upstream's objects (untyped)
        def recording_generate_iterative(task: Any, gen_config: Any) -> Any:
            if self.record.steps_called:
                raise UserError(
                    "the text is long enough to trigger chunked generation, which a capture does not cover",
                    "use a shorter --text (under ~30 s of speech)",
                )
            tokens = original(task, gen_config)
            self.token_states.append(pad_items([t.cpu().numpy() for t in tokens], self.mask_id))
            return tokens

        return recording_generate_iterative

    def _tokenizer_call(
        self, original: Callable[..., Any], calls: list[dict[str, np.ndarray]], input_name: str, output_name: str
    ) -> Callable[..., Any]:
        import torch

        def recording_call(values: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            output = original(values, *args, **kwargs)
            result = output if isinstance(output, torch.Tensor) else getattr(output, output_name)
            calls.append({input_name: values.cpu().numpy(), output_name: result.cpu().numpy()})
            return output

        return recording_call

    @contextlib.contextmanager
    def active(self) -> Iterator[Recorder]:
        """Install the recording wrappers as instance attributes; remove them on exit."""
        tokenizer = self.model.audio_tokenizer
        patches = [
            (self.model, "forward", self._forward(self.model.forward)),
            (self.model, "_generate_iterative", self._generate_iterative(self.model._generate_iterative)),
            (
                tokenizer,
                "encode",
                self._tokenizer_call(tokenizer.encode, self.encoder_calls, "input_values", "audio_codes"),
            ),
            (
                tokenizer,
                "decode",
                self._tokenizer_call(tokenizer.decode, self.decoder_calls, "audio_codes", "audio_values"),
            ),
        ]
        with patched(patches):
            yield self

    def finish(self) -> ModeRecord:
        """Write tokens, encoder and decoder files once generate() has returned.

        generate() encodes the reference once and decodes each item once: one call per item.
        """
        self._save(TOKENS_FILE, {"after_step": np.stack(self.token_states), "final": self.token_states[-1]})
        items = len(self.record.rows)
        for name, calls, expected in ((ENCODER_FILE, self.encoder_calls, 1), (DECODER_FILE, self.decoder_calls, items)):
            if len(calls) > expected:
                raise UserError(
                    f"{name[:-4]} was called {len(calls)} times in one generate() of {items} text(s)",
                    "capture texts under ~30 s of speech (chunked generation is not captured)",
                )
            for index, call in enumerate(calls):
                self._save(item_file(name, index, len(calls)), call)
        return self.record


def write_manifest(
    capture_dir: Path,
    model: dict[str, str],
    device: str,
    precision: dict[str, Any],
    versions: dict[str, str],
    seed: int,
    num_step: int,
    steps: set[int] | None,
    modes: dict[str, Any],
) -> dict[str, Any]:
    """Write the capture's manifest (its one provenance record) into `capture_dir`; return it.

    `modes` holds mode_record_entry() per mode; `precision` the torch float32 settings the modules
    ran under (full_fp32). The reference's sha256 is taken from the copy in `capture_dir`, so a
    later step 0 cannot silently swap the voice the clone tokens came from.
    """
    import torch

    capture_dir = Path(capture_dir)
    reference = capture_dir / REF_WAV
    manifest = {
        "format": CAPTURE_FORMAT,
        "model": model,
        "device": device,
        "precision": precision,
        "torch_threads": torch.get_num_threads(),
        "versions": versions,
        "seed": seed,
        "num_step": num_step,
        "steps": "all" if steps is None else sorted(steps),
        "logits_rows": LOGITS_ROWS_NOTE,
        "reference": {
            "wav": REF_WAV,
            "txt": REF_TXT,
            "wav_sha256": sha256_file(reference) if reference.is_file() else None,
        },
        "modes": modes,
    }
    manifest["total_bytes"] = sum(f["bytes"] for m in modes.values() for f in m["files"].values())
    write_json_atomic(capture_dir / MANIFEST_NAME, manifest)
    return manifest


# What the stages read from a manifest (reading.schema_problem's notation).
REQUEST_SCHEMA = {
    "mode": str,
    "text": (str, list),
    "seed": int,
    "language": (str, None),
    "instruct": (str, None),
    "ref_audio": (str, None),
    "ref_text": (str, None),
    "num_step": int,
}
MANIFEST_SCHEMA = {
    "format": int,
    "model": {"fingerprint": str},
    "device": str,
    "seed": int,
    "num_step": int,
    "reference": {"wav": str, "txt": str, "wav_sha256": (str, None)},
    "modes": Each(
        {"request": REQUEST_SCHEMA, "rows": [{"c_len": int, "t_len": int}], "files": Each(FILE_ENTRY_SCHEMA)}
    ),
}


def _values_problem(manifest: dict[str, Any]) -> str | None:
    """Values the schema's types cannot judge: mode names, step counts, the clone reference's hash."""
    for mode, entry in manifest["modes"].items():
        if mode not in MODES:
            return f"modes.{mode} is not one of {', '.join(MODES)}"
        if entry["request"]["num_step"] < 1:
            return f"modes.{mode}.request.num_step is {entry['request']['num_step']}, not a step count"
    if manifest["num_step"] < 1:
        return f"num_step is {manifest['num_step']}, not a step count"
    if "clone" in manifest["modes"] and manifest["reference"]["wav_sha256"] is None:
        return "reference.wav_sha256 is null, but the clone mode was captured from a reference"
    return None


def load_manifest(capture_dir: Path, verify_hashes: bool = True) -> dict[str, Any]:
    """The capture manifest, after checking every listed file exists (and matches its entry:
    files.first_mismatch, which hashes only what changed since this user's processes hashed it)."""
    capture_dir = Path(capture_dir)
    manifest = read_artefact(
        capture_dir / MANIFEST_NAME, "capture manifest", RECAPTURE_FIX, CAPTURE_FORMAT, MANIFEST_SCHEMA, _values_problem
    )
    files = [
        (capture_dir / mode / name, info)
        for mode, entry in manifest["modes"].items()
        for name, info in entry["files"].items()
    ]
    for path, _ in files:
        if not path.is_file():
            raise UserError(f"capture is incomplete: {path} is missing", RECAPTURE_FIX)
    if verify_hashes and (changed := first_mismatch(files)) is not None:
        raise UserError(
            f"capture file {changed} does not match its recorded sha256 (modified or corrupt)", RECAPTURE_FIX
        )
    return manifest


def reference_wav(capture_dir: Path, manifest: dict[str, Any]) -> Path:
    """The clone reference the capture was made from, checked against the manifest's sha256:
    re-running step 0 after step 1 would otherwise clone another voice than the tokens came from."""
    path: Path = Path(capture_dir) / manifest["reference"]["wav"]
    if not path.is_file():
        raise UserError(f"capture is incomplete: {path} is missing", RECAPTURE_FIX)
    if sha256_file(path) != manifest["reference"]["wav_sha256"]:
        raise UserError(f"{path} is not the reference the capture was made from (re-made after step 1?)", RECAPTURE_FIX)
    return path


def item_file(name: str, index: int, items: int) -> str:
    """The file of item `index` of a request of `items` texts: `name` itself for one text,
    else decoder_<i>.npz, output_<i>.wav (upstream decodes each item of a batch on its own)."""
    if items == 1:
        return name
    stem, dot, suffix = name.rpartition(".")
    return f"{stem}_{index}{dot}{suffix}"


def real_tokens(tokens: np.ndarray, target_lens: list[int]) -> np.ndarray:
    """[1, 8, sum t_i]: each item's tokens of a padded [B, 8, T] state without the mask-id padding
    of a batch's shorter items, so that padding never counts as a match."""
    return np.concatenate([tokens[i, :, :t] for i, t in enumerate(target_lens)], axis=-1)[None]


def item_files(manifest: dict[str, Any], mode: str, name: str) -> list[str]:
    """`name`'s file of each item of `mode`'s request (see item_file), in item order."""
    items = len(manifest["modes"][mode]["rows"])
    return [item_file(name, index, items) for index in range(items)]


def mode_steps(manifest: dict[str, Any], mode: str) -> list[int]:
    """Steps whose transformer I/O was captured for `mode`, in order."""
    files = manifest["modes"][mode]["files"]
    return sorted(int(name[len("transformer_step_") : -4]) for name in files if name.startswith("transformer_step_"))


def load_step(capture_dir: Path, mode: str, step: int) -> dict[str, np.ndarray]:
    return load_npz(Path(capture_dir) / mode / STEP_FILE.format(step))


def load_mode_file(capture_dir: Path, mode: str, name: str) -> dict[str, np.ndarray]:
    return load_npz(Path(capture_dir) / mode / name)


def mode_record_entry(record: ModeRecord, request: dict[str, Any]) -> dict[str, Any]:
    """Manifest entry of one mode: the request (texts, seed), the shapes seen, and the files.

    A clone request records its reference as REF_WAV, relative to the capture directory.
    """
    if request["mode"] == "clone":
        request = {**request, "ref_audio": REF_WAV}
    return {
        "request": request,
        "steps_called": record.steps_called,
        "seq_len": record.seq_len,
        "rows": [{"c_len": c, "t_len": t} for c, t in record.rows],
        "files": record.files,
    }
