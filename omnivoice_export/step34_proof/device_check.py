"""Is a CUDA reference the same fp32 reference as the CPU one? The torch side of `make gpu-check`.

Parity verdicts compare ONNX with a PyTorch capture made on the same device, so a CUDA verdict is
only as good as the CUDA capture: computed in TF32 instead of fp32, it is a reference of lower
precision (facts sheet: argmax 0.996, max |d| 5e-2 per step). Two checks, each one line per
mode (and per graph), numbers only:

    env      torch, its CUDA device, and whether onnxruntime has its CUDA provider (exit 2 when
             torch sees no CUDA device; the ORT part of gpu-check is skipped without the provider)
    compare  two captures of the same requests (CPU and CUDA): the manifests' precision
             settings; per mode the transformer logits at every step whose inputs are equal,
             and the first step whose inputs differ (the CUDA generator draws other Gumbel
             noise than the CPU one, so the token states part after step 0 by design); the
             encoder's codes on the same reference audio
    replay   one capture's recorded inputs through the PyTorch modules on --device (TF32 off,
             as capture_reference.py runs; --tf32 to measure what TF32 costs): logits of every
             step against the capture's, encoder codes, decoder log-spectral L1. Inputs are the
             capture's, so no sampling is involved and every step is compared.

    python -m omnivoice_export.step34_proof.device_check env
    python -m omnivoice_export.step34_proof.device_check compare gpu-check/cpu gpu-check/cuda
    python -m omnivoice_export.step34_proof.device_check replay gpu-check/cpu --device cuda [--tf32]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from omnivoice_export.common import metrics
from omnivoice_export.step1_capture import capture
from omnivoice_onnx.contract import CONTRACTS
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.program import parse, run_main

TRANSFORMER_INPUTS = CONTRACTS["transformer"].input_names


def environment() -> dict[str, Any]:
    """torch's CUDA device and onnxruntime's providers; UserError when torch sees no CUDA device."""
    import onnxruntime as ort
    import torch

    if not torch.cuda.is_available():
        raise UserError(
            f"torch {torch.__version__} sees no CUDA device",
            "run gpu-check on an NVIDIA machine with a CUDA build of torch (make venv-gpu)",
        )
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "onnxruntime": ort.__version__,
        "ort_providers": ort.get_available_providers(),
        "ort_cuda": "CUDAExecutionProvider" in ort.get_available_providers(),
    }


def _inputs_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return all(a[k].shape == b[k].shape and np.array_equal(a[k], b[k]) for k in TRANSFORMER_INPUTS)


def _stats(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> metrics.LogitStats:
    """Transformer logits rows of two step files (or a step file and fresh rows) compared."""
    return metrics.logit_stats(
        np.concatenate([reference["logits_cond"], reference["logits_uncond"]]),
        np.concatenate([candidate["logits_cond"], candidate["logits_uncond"]]),
    )


def compare_captures(first: Path, second: Path) -> dict[str, Any]:
    """Two captures of the same model and requests, mode by mode (see the module docstring)."""
    a, b = capture.load_manifest(first), capture.load_manifest(second)
    if a["model"]["fingerprint"] != b["model"]["fingerprint"]:
        raise UserError(f"{first} and {second} are captures of different models", "capture both with one --model")
    result: dict[str, Any] = {
        "precision": {str(first): a.get("precision"), str(second): b.get("precision")},
        "devices": [a["device"], b["device"]],
        "modes": {},
    }
    for mode in [m for m in a["modes"] if m in b["modes"]]:
        if a["modes"][mode]["request"]["text"] != b["modes"][mode]["request"]["text"]:
            raise UserError(f"mode {mode}: the two captures speak different texts", "capture both with the same flags")
        steps = [s for s in capture.mode_steps(a, mode) if s in capture.mode_steps(b, mode)]
        compared, diverged = [], None
        for step in steps:
            x, y = capture.load_step(first, mode, step), capture.load_step(second, mode, step)
            if not _inputs_equal(x, y):
                diverged = step
                break
            compared.append({"step": step, **vars(_stats(x, y))})
        entry: dict[str, Any] = {"steps_compared": compared, "first_step_with_other_inputs": diverged}
        if capture.ENCODER_FILE in a["modes"][mode]["files"] and capture.ENCODER_FILE in b["modes"][mode]["files"]:
            x, y = (capture.load_mode_file(d, mode, capture.ENCODER_FILE) for d in (first, second))
            if np.array_equal(x["input_values"], y["input_values"]):
                entry["encoder_code_match"] = metrics.code_match(x["audio_codes"], y["audio_codes"])[0]
        result["modes"][mode] = entry
    return result


def replay(capture_dir: Path, device: str, tf32: bool = False, steps: list[int] | None = None) -> dict[str, Any]:
    """The capture's recorded inputs through the PyTorch modules of its model on `device`,
    against the capture's outputs (see the module docstring). `steps`: a subset (default all)."""
    import torch

    from omnivoice_export.step0_checkpoints.checkpoints import load_omnivoice, validate_checkpoint_dir
    from omnivoice_export.step2_export import wrappers

    manifest = capture.load_manifest(capture_dir)
    model = load_omnivoice(validate_checkpoint_dir(Path(manifest["model"]["path"]))).to(device)
    model.audio_tokenizer.to(device)
    modules = wrappers.make_wrappers(model)
    result: dict[str, Any] = {"device": device, "capture_device": manifest["device"], "modes": {}}
    with capture.full_fp32() as precision, torch.no_grad():
        if tf32:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
            precision = capture.precision_settings()
        result["precision"] = precision
        for mode in manifest["modes"]:
            rows = []
            for step in [s for s in capture.mode_steps(manifest, mode) if steps is None or s in steps]:
                data = capture.load_step(capture_dir, mode, step)
                logits = (
                    modules["transformer"](*(torch.from_numpy(data[k]).to(device) for k in TRANSFORMER_INPUTS))
                    .float()
                    .cpu()
                    .numpy()
                )
                cond, uncond = capture.logits_rows(logits, data["attention_mask"])
                rows.append({"step": step, **vars(_stats(data, {"logits_cond": cond, "logits_uncond": uncond}))})
            entry: dict[str, Any] = {"transformer": rows}
            if capture.ENCODER_FILE in manifest["modes"][mode]["files"]:
                data = capture.load_mode_file(capture_dir, mode, capture.ENCODER_FILE)
                codes = modules["encoder"](torch.from_numpy(data["input_values"]).to(device)).cpu().numpy()
                entry["encoder_code_match"] = metrics.code_match(data["audio_codes"], codes)[0]
            entry["decoder_log_spectral_l1"] = []
            for name in capture.item_files(manifest, mode, capture.DECODER_FILE):
                data = capture.load_mode_file(capture_dir, mode, name)
                audio = modules["decoder"](torch.from_numpy(data["audio_codes"]).to(device)).cpu().numpy()
                entry["decoder_log_spectral_l1"].append(metrics.log_spectral_l1(data["audio_values"], audio))
            result["modes"][mode] = entry
    return result


def _logit_line(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no step compared"
    return (
        f"{len(rows)} steps: argmax min {min(r['argmax_agreement'] for r in rows):.6f}, "
        f"max |d| {max(r['max_abs'] for r in rows):.1e}"
    )


def print_compare(result: dict[str, Any]) -> None:
    for name, settings in result["precision"].items():
        print(f"[compare] {name}: precision {settings}")
    for mode, entry in result["modes"].items():
        diverged = entry["first_step_with_other_inputs"]
        codes = f", encoder codes {entry['encoder_code_match']:.4f}" if "encoder_code_match" in entry else ""
        print(
            f"[compare] {mode:<7} equal inputs: {_logit_line(entry['steps_compared'])}; inputs differ from step "
            f"{diverged if diverged is not None else '- (never)'}{codes}"
        )


def print_replay(result: dict[str, Any]) -> None:
    print(
        f"[replay] {result['capture_device']} capture through torch on {result['device']}, "
        f"precision {result['precision']}"
    )
    for mode, entry in result["modes"].items():
        codes = f", encoder codes {entry['encoder_code_match']:.4f}" if "encoder_code_match" in entry else ""
        lsd = max(entry["decoder_log_spectral_l1"])
        print(
            f"[replay] {mode:<7} transformer {_logit_line(entry['transformer'])}{codes}, decoder log-spectral L1 "
            f"{lsd:.1e}"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("env", help="torch's CUDA device and onnxruntime's providers")
    compare = commands.add_parser("compare", help="two captures of the same requests (CPU vs CUDA)")
    compare.add_argument("first", type=Path)
    compare.add_argument("second", type=Path)
    replayed = commands.add_parser("replay", help="a capture's inputs through torch on --device")
    replayed.add_argument("capture_dir", type=Path)
    replayed.add_argument("--device", default="cuda", help="torch device")
    replayed.add_argument("--tf32", action="store_true", help="TF32 on for matmuls and cuDNN (to measure its cost)")
    return parse(parser, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command == "env":
        env = environment()
        print(
            f"[env] torch {env['torch']} (CUDA {env['torch_cuda']}) on {env['device']}; onnxruntime "
            f"{env['onnxruntime']} with {', '.join(env['ort_providers'])}"
        )
        print(f"[env] ort_cuda={'yes' if env['ort_cuda'] else 'no'}")
    elif args.command == "compare":
        print_compare(compare_captures(args.first, args.second))
    else:
        print_replay(replay(args.capture_dir, args.device, args.tf32))


if __name__ == "__main__":
    run_main(main)
