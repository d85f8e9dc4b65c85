"""Write the files the torch-free runtime (omnivoice_onnx) reads beside the graphs.

    tokenizer.json        the text tokenizer, as AutoTokenizer.from_pretrained(model) runs it
    runtime-config.json   the upstream data the host side needs, read from the installed omnivoice:
        model       audio_mask_id, num_audio_codebook, audio_vocab_size (OmniVoiceConfig)
        generation  OmniVoiceGenerationConfig's fields and their defaults (read from the dataclass)
        languages   ids and name_to_id, what _resolve_language looks up (utils/lang_map.py)
        instruct    what _resolve_instruct and its use_zh test read (utils/voice_design.py): the
                    valid items (all / English / Chinese), the EN<->ZH mappings, the mutually
                    exclusive categories in upstream's order, and _ZH_RE's pattern
        source      the package versions the data came from

Why tokenizer.json is the loaded backend, not the checkpoint's file: transformers 5 rebuilds some
tokenizers on load. A checkpoint whose tokenizer_config names Qwen2Tokenizer (Qwen3's, and so
likely the real OmniVoice's) gets a new BPE from the file's vocab and merges, with Qwen2's
pre-tokenizer and `ignore_merges=False` whatever the file says. The runtime must run what
upstream runs, so it gets `backend_tokenizer` serialized.

Sets are written as sorted lists (the runtime never depends on their order: difflib's best match
breaks ties by the string itself); JSON keeps non-ASCII text as is (UTF-8).

CLI: python -m omnivoice_export.runtime_assets --model tiny --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
from pathlib import Path
from typing import Any

from omnivoice_export.cli import parse, run_main
from omnivoice_export.files import atomic_path, file_entry
from omnivoice_onnx.prompt import RUNTIME_CONFIG_FILE, TOKENIZER_FILE

RUNTIME_CONFIG_VERSION = 1


def _generation_defaults() -> dict[str, Any]:
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    defaults = {}
    for field in dataclasses.fields(OmniVoiceGenerationConfig):
        if field.default is dataclasses.MISSING:
            raise RuntimeError(f"OmniVoiceGenerationConfig.{field.name} has no plain default; "
                               "runtime_assets cannot record it")
        defaults[field.name] = field.default
    return defaults


def _instruct_data() -> dict[str, Any]:
    from omnivoice.utils import voice_design as vd

    return {
        "valid": sorted(vd._INSTRUCT_ALL_VALID),
        "valid_en": sorted(vd._INSTRUCT_VALID_EN),
        "valid_zh": sorted(vd._INSTRUCT_VALID_ZH),
        "en_to_zh": dict(vd._INSTRUCT_EN_TO_ZH),
        "zh_to_en": dict(vd._INSTRUCT_ZH_TO_EN),
        "mutually_exclusive": [sorted(category) for category in vd._INSTRUCT_MUTUALLY_EXCLUSIVE],
        "zh_pattern": vd._ZH_RE.pattern,
    }


def runtime_config(model_dir: Path) -> dict[str, Any]:
    """The runtime-config.json content for the checkpoint at `model_dir`."""
    from omnivoice.models.omnivoice import OmniVoiceConfig
    from omnivoice.utils.lang_map import LANG_IDS, LANG_NAME_TO_ID

    config = OmniVoiceConfig.from_pretrained(str(model_dir))
    return {
        "version": RUNTIME_CONFIG_VERSION,
        "source": {name: importlib.metadata.version(name) for name in ("omnivoice", "transformers", "tokenizers")},
        "model": {"audio_mask_id": config.audio_mask_id, "num_audio_codebook": config.num_audio_codebook,
                  "audio_vocab_size": config.audio_vocab_size},
        "generation": _generation_defaults(),
        "languages": {"ids": sorted(LANG_IDS), "name_to_id": dict(sorted(LANG_NAME_TO_ID.items()))},
        "instruct": _instruct_data(),
    }


def tokenizer_json(model_dir: Path) -> str:
    """The tokenizer OmniVoice.from_pretrained loads for `model_dir`, as tokenizer.json text."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir)).backend_tokenizer.to_str()


def _write(path: Path, data: bytes) -> dict[str, Any]:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return file_entry(path)


def write_runtime_assets(model_dir: Path, out_dir: Path) -> dict[str, dict]:
    """Write tokenizer.json and runtime-config.json into `out_dir` (each atomically);
    return {file name: {"sha256": ..., "bytes": ...}} for the export report."""
    out_dir = Path(out_dir)
    config_text = json.dumps(runtime_config(model_dir), indent=1, ensure_ascii=False) + "\n"
    return {
        TOKENIZER_FILE: _write(out_dir / TOKENIZER_FILE, tokenizer_json(model_dir).encode("utf-8")),
        RUNTIME_CONFIG_FILE: _write(out_dir / RUNTIME_CONFIG_FILE, config_text.encode("utf-8")),
    }


def main(argv: list[str] | None = None) -> None:
    from omnivoice_export.checkpoints import add_model_arg, resolve_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_arg(parser)
    parser.add_argument("--out", type=Path, required=True, help="directory to write the runtime files into")
    args = parse(parser, argv)
    for name, entry in write_runtime_assets(resolve_model(args.model), args.out).items():
        print(f"{args.out / name}  {entry['bytes']} bytes  sha256 {entry['sha256'][:16]}")


if __name__ == "__main__":
    run_main(main)
