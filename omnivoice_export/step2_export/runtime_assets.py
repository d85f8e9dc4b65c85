"""Write the files the torch-free runtime (omnivoice_onnx) reads beside the graphs.

    tokenizer.json        the text tokenizer, as AutoTokenizer.from_pretrained(model) runs it
    runtime-config.json   the upstream data the host side needs, read from the installed omnivoice:
        model       audio_mask_id, num_audio_codebook, audio_vocab_size (OmniVoiceConfig); sample_rate,
                    hop_length and frame_rate (the codec's: 24000 / 960 = 25 frames a second) and the
                    checkpoint's model_fingerprint (the graphs' metadata carry the same values)
        generation  OmniVoiceGenerationConfig's fields and their defaults (read from the dataclass)
        languages   ids and name_to_id, what _resolve_language looks up (utils/lang_map.py)
        instruct    what _resolve_instruct and its use_zh test read (utils/voice_design.py): the
                    valid items (all / English / Chinese), the EN<->ZH mappings, the mutually
                    exclusive categories in upstream's order, and _ZH_RE's pattern; the item
                    split pattern, what marks a dialect / an accent, the joiners, difflib's cutoff
        duration    RuleDurationEstimator's weights and Unicode ranges (utils/duration.py), its
                    special code points, the low-estimate lift, the fallback reference
        text        utils/text.py's punctuation, closing-mark and abbreviation sets, the
                    "Chinese" range, the full stops add_punctuation appends, min_chunk_len
        prompt      the non-verbal tag pattern, the text written for an absent language/instruct
        audio       the loudness and silence settings of create_voice_clone_prompt and
                    _post_process_audio, pydub's silence parameters, cross_fade_chunks' gap
        graphs      the three graphs' I/O contract (omnivoice_onnx.contract.contract_table):
                    names, dtypes, axes (a port on onnxruntime-node cannot read metadata_props)
        source      the package versions the data came from

One source for each value: a table upstream holds as module data is read from the
installed package (RuleDurationEstimator().weights, utils.text.ABBREVIATIONS, ...); a number
upstream writes inline in a function body (remove_silence(mid_sil=200, ...), `peak > 1e-6`) is a
named constant HERE, the toolchain side, with the line it comes from; the runtime has no copy and
reads every value from the bundle's runtime-config.json (tests/test_runtime_text.py and
tests/test_runtime_audio.py check each against upstream's behaviour). docs/runtime.md says what
each key means.

Why tokenizer.json is the loaded backend, not the checkpoint's file: transformers 5 rebuilds some
tokenizers on load. A checkpoint whose tokenizer_config names Qwen2Tokenizer (Qwen3's, and so
likely the real OmniVoice's) gets a new BPE from the file's vocab and merges, with Qwen2's
pre-tokenizer and `ignore_merges=False` whatever the file says. The runtime must run what
upstream runs, so it gets `backend_tokenizer` serialized.

Sets are written as sorted lists (the runtime never depends on their order: difflib's best match
breaks ties by the string itself); JSON keeps non-ASCII text as is (UTF-8).

CLI: python -m omnivoice_export.step2_export.runtime_assets --model tiny --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import inspect
import json
from pathlib import Path
from typing import Any

from omnivoice_onnx.bundle import RUNTIME_CONFIG_FILE, TOKENIZER_FILE
from omnivoice_onnx.contract import HOP_LENGTH, SAMPLE_RATE, contract_table
from omnivoice_onnx.files import atomic_path, check_output
from omnivoice_onnx.hashing import file_entry
from omnivoice_onnx.program import parse, run_main
from omnivoice_onnx.runtime_config import RUNTIME_CONFIG_VERSION

# Numbers and strings upstream (omnivoice 0.2.1) writes inline in function bodies, so they cannot be
# imported; each is written into runtime-config.json from here and nowhere else.
ARABIC_TATWEEL = 0x0640  # duration.py _get_char_weight: `if code == 0x0640: return weights["mark"]`
UPPER_PLANES_START = 0x20000  # _get_char_weight: `if code > 0x20000: return weights["cjk"]`
UPPER_PLANES_SCRIPT = "cjk"
FALLBACK_REF_TEXT = "Nice to meet you."  # omnivoice.py _estimate_target_tokens, without a reference
FALLBACK_REF_FRAMES = 25
MIN_CHUNK_LEN = 3  # _generate_chunked: chunk_text_punctuation(..., min_chunk_len=3)
CHINESE_RANGE = (0x4E00, 0x9FFF)  # text.py add_punctuation / omnivoice.py _combine_text: "\u4e00".."\u9fff"
CHINESE_FULL_STOP, FULL_STOP = "。", "."  # add_punctuation appends one of these
NO_VALUE = "None"  # _prepare_inference_inputs: f"<|lang_start|>{lang}<|lang_end|>" with lang None
INSTRUCT_SPLIT = r"\s*[,，]\s*"  # _resolve_instruct: re.split(r"\s*[,，]\s*", instruct_str)
DIALECT_SUFFIX, ACCENT_MARK = "话", " accent"  # _resolve_instruct: n.endswith("话"), " accent" in n
INSTRUCT_JOINERS = {"zh": "，", "en": ", "}  # _resolve_instruct's final join
SUGGESTION_CUTOFF = 0.6  # _resolve_instruct: difflib.get_close_matches(..., n=1, cutoff=0.6)
TARGET_RMS = 0.1  # create_voice_clone_prompt: `if 0 < ref_rms < 0.1`; _post_process_audio: `ref_rms < 0.1`
PEAK_LEVEL, MIN_PEAK = 0.5, 1e-6  # _post_process_audio: `if peak > 1e-6: audio / peak * 0.5`
REFERENCE_SILENCE_MS = (200, 100, 200)  # create_voice_clone_prompt: remove_silence(mid, lead, trail)
OUTPUT_SILENCE_MS = (500, 100, 100)  # _post_process_audio: remove_silence(mid, lead, trail)
SILENCE_THRESH_DBFS = -50.0  # utils/audio.py remove_silence: split_on_silence(silence_thresh=-50), edges -50
SEEK_STEP_MS = 10  # remove_silence: split_on_silence(seek_step=10)


def _generation_defaults() -> dict[str, Any]:
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    defaults = {}
    for field in dataclasses.fields(OmniVoiceGenerationConfig):
        if field.default is dataclasses.MISSING:
            raise RuntimeError(
                f"OmniVoiceGenerationConfig.{field.name} has no plain default; runtime_assets cannot record it"
            )
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


def _default(function: Any, name: str) -> Any:
    """The default value of parameter `name` of an upstream function (read, not copied)."""
    return inspect.signature(function).parameters[name].default


def _instruct_rules() -> dict[str, Any]:
    return {
        "split_pattern": INSTRUCT_SPLIT,
        "dialect_suffix": DIALECT_SUFFIX,
        "accent_mark": ACCENT_MARK,
        "joiners": dict(INSTRUCT_JOINERS),
        "suggestion_cutoff": SUGGESTION_CUTOFF,
    }


def host_sections() -> dict[str, Any]:
    """The runtime-config.json sections that hold upstream's host-side tables and constants (the
    checkpoint does not change them): duration, text, prompt, audio, graphs."""
    import torchaudio
    from omnivoice.models import omnivoice as upstream
    from omnivoice.utils import audio as upstream_audio
    from omnivoice.utils import text as upstream_text
    from omnivoice.utils.duration import RuleDurationEstimator

    estimator = RuleDurationEstimator()
    return {
        "duration": {
            "weights": dict(estimator.weights),
            "ranges": [[end, script] for end, script in estimator.ranges],
            "tatweel": ARABIC_TATWEEL,
            "upper_planes_start": UPPER_PLANES_START,
            "upper_planes_script": UPPER_PLANES_SCRIPT,
            "low_threshold": _default(RuleDurationEstimator.estimate_duration, "low_threshold"),
            "boost_strength": _default(RuleDurationEstimator.estimate_duration, "boost_strength"),
            "fallback_ref_text": FALLBACK_REF_TEXT,
            "fallback_ref_frames": FALLBACK_REF_FRAMES,
        },
        "text": {
            "split_punctuation": sorted(upstream_text.SPLIT_PUNCTUATION),
            "closing_marks": sorted(upstream_text.CLOSING_MARKS),
            "end_punctuation": sorted(upstream_text.END_PUNCTUATION),
            "abbreviations": sorted(upstream_text.ABBREVIATIONS),
            "chinese_range": list(CHINESE_RANGE),
            "chinese_full_stop": CHINESE_FULL_STOP,
            "full_stop": FULL_STOP,
            "min_chunk_len": MIN_CHUNK_LEN,
        },
        "prompt": {"nonverbal_pattern": upstream._NONVERBAL_PATTERN.pattern, "no_value": NO_VALUE},
        "audio": {
            "target_rms": TARGET_RMS,
            "peak_level": PEAK_LEVEL,
            "min_peak": MIN_PEAK,
            "reference_silence_ms": list(REFERENCE_SILENCE_MS),
            "output_silence_ms": list(OUTPUT_SILENCE_MS),
            "silence_thresh_dbfs": SILENCE_THRESH_DBFS,
            "seek_step_ms": SEEK_STEP_MS,
            "leading_chunk_ms": _default(upstream_audio.detect_leading_silence, "chunk_size"),
            "cross_fade_silence_s": _default(upstream_audio.cross_fade_chunks, "silence_duration"),
            "resample": {
                name: _default(torchaudio.functional.resample, name) for name in ("lowpass_filter_width", "rolloff")
            },
        },
        "graphs": contract_table(),
    }


def runtime_config(model_dir: Path) -> dict[str, Any]:
    """The runtime-config.json content for the checkpoint at `model_dir`."""
    from omnivoice.models.omnivoice import OmniVoiceConfig
    from omnivoice.utils.lang_map import LANG_IDS, LANG_NAME_TO_ID

    from omnivoice_export.step0_checkpoints.checkpoints import model_fingerprint

    config = OmniVoiceConfig.from_pretrained(str(model_dir))
    return {
        "version": RUNTIME_CONFIG_VERSION,
        "source": {name: importlib.metadata.version(name) for name in ("omnivoice", "transformers", "tokenizers")},
        "model": {
            "audio_mask_id": config.audio_mask_id,
            "num_audio_codebook": config.num_audio_codebook,
            "audio_vocab_size": config.audio_vocab_size,
            "sample_rate": SAMPLE_RATE,
            "hop_length": HOP_LENGTH,
            "frame_rate": SAMPLE_RATE // HOP_LENGTH,
            "model_fingerprint": model_fingerprint(model_dir),
        },
        "generation": _generation_defaults(),
        "languages": {"ids": sorted(LANG_IDS), "name_to_id": dict(sorted(LANG_NAME_TO_ID.items()))},
        "instruct": {**_instruct_data(), **_instruct_rules()},
        **host_sections(),
    }


def tokenizer_json(model_dir: Path) -> str:
    """The tokenizer OmniVoice.from_pretrained loads for `model_dir`, as tokenizer.json text (the
    process's parsed copy, checkpoints.text_tokenizer: an export has just loaded the model, which
    parsed it)."""
    from omnivoice_export.step0_checkpoints.checkpoints import text_tokenizer

    return text_tokenizer(model_dir).backend_tokenizer.to_str()


def _write(path: Path, data: bytes) -> dict[str, Any]:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return file_entry(path)


def write_runtime_assets(model_dir: Path, out_dir: Path) -> dict[str, dict[str, Any]]:
    """Write tokenizer.json and runtime-config.json into `out_dir` (each atomically);
    return {file name: {"sha256": ..., "bytes": ...}} for the export report."""
    out_dir = Path(out_dir)
    config_text = json.dumps(runtime_config(model_dir), indent=1, ensure_ascii=False) + "\n"
    return {
        TOKENIZER_FILE: _write(out_dir / TOKENIZER_FILE, tokenizer_json(model_dir).encode("utf-8")),
        RUNTIME_CONFIG_FILE: _write(out_dir / RUNTIME_CONFIG_FILE, config_text.encode("utf-8")),
    }


def main(argv: list[str] | None = None) -> None:
    from omnivoice_export.step0_checkpoints.checkpoints import add_model_arg, resolve_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_arg(parser)
    parser.add_argument("--out", type=Path, required=True, help="directory to write the runtime files into")
    args = parse(parser, argv)
    check_output(args.out, "--out", "dir")
    for name, entry in write_runtime_assets(resolve_model(args.model), args.out).items():
        print(f"{args.out / name}  {entry['bytes']} bytes  sha256 {entry['sha256'][:16]}")


if __name__ == "__main__":
    run_main(main)
