"""Find, check, fingerprint and load OmniVoice checkpoints; `--model` of every script.

A checkpoint is a directory in exactly the layout `OmniVoice.from_pretrained` reads:

    config.json  model.safetensors  tokenizer.json  tokenizer_config.json
    audio_tokenizer/{config.json, model.safetensors, preprocessor_config.json}

`--model` takes `tiny`, `full-random`, `tiny-large-act`, `tiny-outliers`, `tiny-outliers2`,
`full-random-outliers` or `full-random-outliers2`
(built by omnivoice_export.step0_checkpoints.builder on first use into the git-ignored checkpoints/, rebuilt when the
builder changes; tiny-large-act is tiny with a trained model's large residual activations, the fp16
check; the -outliers ones carry a trained model's activation outliers, the int8 check), the path of
a real k2-fsa/OmniVoice checkout, or a Hugging Face repo id such as `k2-fsa/OmniVoice` (what upstream's from_pretrained
takes): its snapshot in the local Hugging Face cache is used without any network access when it
is there; otherwise it is downloaded with `snapshot_download`, unless HF_HUB_OFFLINE is set. Every
artefact records the model's fingerprint, a hash of the files' contents, so tensors of different
models are never compared silently and one model reached by two spellings is one model.

CLI (build one by hand): python -m omnivoice_export.step0_checkpoints.checkpoints NAME [--out DIR] [--seed N]
(NAME: one of the above)
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from omnivoice_export.common.edge import REPO_ROOT
from omnivoice_export.step0_checkpoints.builder import BUILD_STAMP, BUILDER_VERSION, DIMS, build_checkpoint
from omnivoice_onnx.errors import UserError, environment_error
from omnivoice_onnx.files import check_output
from omnivoice_onnx.hashing import sha256_file
from omnivoice_onnx.limits import HF_REPO_ID
from omnivoice_onnx.program import int_range, parse, run_main
from omnivoice_onnx.verified import stat_identity

if TYPE_CHECKING:
    from omnivoice.models.omnivoice import OmniVoice
    from transformers import SentencePieceBackend, TokenizersBackend

# Files and their stat identities (verified.stat_identity): a cache key that changes with any file's content.
FilesState = tuple[tuple[str | int, ...], ...]

MODEL_ENV = "OMNIVOICE_MODEL"
DEFAULT_MODEL_PATH = "/mnt/data/models/omnivoice/k2-fsa-OmniVoice"
CHECKPOINT_CACHE = REPO_ROOT / "checkpoints"
BUILT_NAMES = tuple(DIMS)

# Files `OmniVoice.from_pretrained` reads; the fingerprint hashes exactly these.
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "audio_tokenizer/config.json",
    "audio_tokenizer/model.safetensors",
    "audio_tokenizer/preprocessor_config.json",
)
WEIGHT_FILES = ("model.safetensors", "audio_tokenizer/model.safetensors")


def _cached_build_is_current(directory: Path, seed: int) -> bool:
    stamp = directory / BUILD_STAMP
    if not stamp.is_file() or any(not (directory / f).is_file() for f in REQUIRED_FILES):
        return False
    try:
        recorded: dict[str, object] = json.loads(stamp.read_text())
        for name in WEIGHT_FILES:
            check_safetensors(directory / name)  # an interrupted copy or a damaged cache: rebuild
    except (UserError, json.JSONDecodeError):
        return False
    return recorded.get("builder_version") == BUILDER_VERSION and recorded.get("seed") == seed


def ensure_built(name: str, seed: int = 0, cache: Path = CHECKPOINT_CACHE) -> Path:
    """Path of built checkpoint `name` in the git-ignored cache, building it when missing/stale."""
    from filelock import FileLock  # torch's dependency; the toolchain venv always has it

    directory = Path(cache) / name
    directory.parent.mkdir(parents=True, exist_ok=True)
    # Two processes asking at once (two shells, parallel test workers) build it once: the second
    # waits for the first, then finds the build current.
    with FileLock(str(directory) + ".lock"):
        if not _cached_build_is_current(directory, seed):
            print(f"building the {name} checkpoint into {directory} ...", flush=True)
            build_checkpoint(name, directory, seed)
    return directory


def validate_checkpoint_dir(path: Path) -> Path:
    """Check that `path` is in the layout `OmniVoice.from_pretrained` reads; UserError otherwise."""
    path = Path(path)
    hint = "pass --model tiny (or full-random), or the path of a k2-fsa/OmniVoice checkout"
    if not path.is_dir():
        raise UserError(f"model path {path} does not exist", hint)
    if not (path / "audio_tokenizer").is_dir():
        raise UserError(f"model path {path} has no audio_tokenizer/ directory", hint)
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise UserError(f"model path {path} lacks {', '.join(missing)}", hint)
    try:
        config = json.loads((path / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path / 'config.json'} is not valid JSON ({exc})", hint) from exc
    if config.get("model_type") != "omnivoice":
        raise UserError(
            f"{path / 'config.json'} is not an OmniVoice config (model_type {config.get('model_type')!r})", hint
        )
    for name in WEIGHT_FILES:
        check_safetensors(path / name)
    return path


# A safetensors header is JSON of a few KB to a few MB; a larger length field means a damaged file.
_MAX_SAFETENSORS_HEADER = 100 << 20


def check_safetensors(path: Path) -> None:
    """Read only the header of a .safetensors file and check the file is as long as it says.

    Catches unreadable, truncated and non-safetensors files in milliseconds, before minutes of
    loading; a flipped byte inside the weights is caught later by the fingerprint instead.
    """
    fix = "copy the checkpoint again (or delete it to rebuild tiny/full-random)"
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if size < 8 or length > min(size - 8, _MAX_SAFETENSORS_HEADER):
                raise ValueError("its header length field is impossible")
            header = json.loads(handle.read(length))
        end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror or exc})", "check the file's permissions") from exc
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, IndexError) as exc:
        raise UserError(f"{path} is not a valid safetensors file ({exc})", fix) from exc
    if 8 + length + end != size:
        raise UserError(
            f"{path} is truncated or corrupt (its header describes {8 + length + end} bytes, the file has {size})", fix
        )


def resolve_model(spec: str | None) -> Path:
    """`tiny` / `full-random` (built and cached on demand), a checkpoint path, or a Hugging Face
    repo id (hub_snapshot) when no such path exists.

    None means $OMNIVOICE_MODEL, else the conventional location of the real checkpoint.
    """
    spec = spec or os.environ.get(MODEL_ENV) or DEFAULT_MODEL_PATH
    if spec in BUILT_NAMES:
        return ensure_built(spec)
    path = Path(spec).expanduser()
    # A path that does not exist is a Hugging Face repo id when it is one as huggingface_hub reads it.
    if not path.exists() and HF_REPO_ID.fullmatch(spec):
        return validate_checkpoint_dir(hub_snapshot(spec))
    return validate_checkpoint_dir(path)


def hub_snapshot(repo_id: str) -> Path:
    """The directory of `repo_id`'s snapshot in the local Hugging Face cache.

    The cache is tried first with local_files_only, so a cached model costs no network access,
    online or not. Not cached: downloaded with snapshot_download, or, when HF_HUB_OFFLINE (or
    TRANSFORMERS_OFFLINE) is set, a UserError naming the command that downloads it.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if constants.is_offline_mode():
        raise UserError(
            f"--model {repo_id}: no such directory, and no snapshot of the Hugging Face repo {repo_id} "
            f"in the cache {constants.HF_HUB_CACHE} (HF_HUB_OFFLINE is set, so it is not downloaded)",
            f"download it where the hub is reachable with `hf download {repo_id}` (into this cache, "
            "HF_HUB_CACHE), or pass --model PATH of a checkout",
        )
    try:
        return Path(snapshot_download(repo_id))
    except (HfHubHTTPError, OSError) as exc:  # unknown repo, gated repo, no network
        raise UserError(
            f"--model {repo_id}: no such directory, and the Hugging Face repo {repo_id} cannot be "
            f"downloaded ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]})",
            "check the repo id and the network, or pass --model PATH of a checkout",
        ) from exc


def add_model_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help=f"{' | '.join(BUILT_NAMES)} | PATH of a checkpoint | Hugging Face repo id, e.g. k2-fsa/OmniVoice "
        f"(default: ${MODEL_ENV}, else {DEFAULT_MODEL_PATH}); the named ones are built on first use into "
        "checkpoints/; a repo id is read from the local Hugging Face cache, downloaded only when absent",
    )


_FINGERPRINTS: dict[FilesState, str] = {}


def model_fingerprint(path: Path) -> str:
    """Stable hash of config + weights + tokenizers: 'sha256:<first 16 hex>'.

    Every artefact (capture, export, report) records it, so tensors from different models are
    never compared silently. It hashes the files' bytes (safetensors are written
    deterministically), memoised per process on each file's path and stat identity (a rewrite that keeps
    size and mtime still changes ctime).
    """
    path = Path(path).resolve()
    files = [path / f for f in REQUIRED_FILES]
    key: FilesState = tuple((str(f), *stat_identity(f.stat())) for f in files)
    if key not in _FINGERPRINTS:
        digest = hashlib.sha256()
        for rel, file in zip(REQUIRED_FILES, files):
            digest.update(rel.encode() + b"\0")
            if file.name == "config.json":
                # Canonical JSON: key order or the transformers version string must not matter.
                config = json.loads(file.read_text())
                config.pop("transformers_version", None)
                digest.update(json.dumps(config, sort_keys=True).encode())
            else:
                digest.update(sha256_file(file).encode())
        _FINGERPRINTS[key] = "sha256:" + digest.hexdigest()[:16]
    return _FINGERPRINTS[key]


@functools.lru_cache(maxsize=4)
def _text_tokenizer(model_path: str, files_state: FilesState) -> TokenizersBackend | SentencePieceBackend:
    """The checkpoint's text tokenizer, parsed once per process and state of its files (its
    AutoTokenizer load parses the Qwen tokenizer.json three times, more than the rest of loading
    tiny). `files_state` (each file's stat identity) keys the cache, so a changed file is read
    again. Shared by every model loaded from the checkpoint, which only call it: read-only."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def _files_state(directory: Path) -> FilesState:
    """(name, stat identity) of each file directly in `directory`: the key of _text_tokenizer's
    cache (verified.stat_identity: a rewrite that keeps size and mtime still changes ctime)."""
    stats = ((path.name, path.stat()) for path in sorted(Path(directory).iterdir()) if path.is_file())
    return tuple((name, *stat_identity(stat)) for name, stat in stats)


def text_tokenizer(model_path: Path) -> TokenizersBackend | SentencePieceBackend:
    """AutoTokenizer.from_pretrained(model_path), from this process's cache while the files are unchanged."""
    return _text_tokenizer(str(Path(model_path).resolve()), _files_state(model_path))


def load_omnivoice(path: Path) -> OmniVoice:
    """OmniVoice.from_pretrained on CPU in fp32 with sdpa attention, in eval mode.

    sdpa is the contract: with `eager`, transformers adds OmniVoice's bool 4-D mask to the float
    scores, so the mask is effectively ignored (facts sheet: max diff 15 vs sdpa).

    from_pretrained(train=True) loads the weights only; the parts it adds for inference are then
    set as it sets them (omnivoice 0.2.1: the text tokenizer, the Higgs audio tokenizer and its
    feature extractor from `audio_tokenizer/`, the sampling rate, the duration estimator), the
    text tokenizer from this process's cache (text_tokenizer). tests/test_checkpoints.py holds the
    result equal to upstream's own load.
    """
    from omnivoice.models.omnivoice import OmniVoice
    from omnivoice.utils.duration import RuleDurationEstimator
    from safetensors import SafetensorError
    from transformers import AutoFeatureExtractor, HiggsAudioV2TokenizerModel
    from transformers.utils import logging as hf_logging

    # per-tensor "Loading weights" bars drown the pipeline's own progress (transformers leaves it unannotated)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        model = OmniVoice.from_pretrained(str(path), train=True, attn_implementation="sdpa", dtype="float32")
        audio_tokenizer = str(Path(path) / "audio_tokenizer")
        model.text_tokenizer = text_tokenizer(Path(path))
        model.audio_tokenizer = HiggsAudioV2TokenizerModel.from_pretrained(audio_tokenizer, device_map=model.device)
        # transformers leaves AutoFeatureExtractor.from_pretrained unannotated
        model.feature_extractor = AutoFeatureExtractor.from_pretrained(audio_tokenizer)  # type: ignore[no-untyped-call]
        model.sampling_rate = model.feature_extractor.sampling_rate
        model.duration_estimator = RuleDurationEstimator()
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:  # damaged or mismatched weights
        if environment_error(exc) is not None:  # a full disk or a denied file: run_main names it
            raise
        raise UserError(
            f"cannot load the checkpoint {path} ({str(exc).strip().splitlines()[0][:300]})",
            "check it is a complete k2-fsa/OmniVoice checkout",
        ) from exc
    return model.eval()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("name", choices=BUILT_NAMES, help="which checkpoint to build")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: checkpoints/NAME)")
    # torch.manual_seed(seed) and a generator seeded with seed + 1: both within torch's range.
    parser.add_argument("--seed", type=int_range(0, 2**63 - 1), default=0, help="seed of every random weight")
    return parse(parser, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = args.out or CHECKPOINT_CACHE / args.name
    check_output(out, "--out", "tree")
    started = time.perf_counter()
    build_checkpoint(args.name, out, args.seed)
    print(f"built {args.name} in {time.perf_counter() - started:.1f} s -> {out}  fingerprint {model_fingerprint(out)}")


if __name__ == "__main__":
    run_main(main)
