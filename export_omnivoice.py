#!/usr/bin/env python3
"""Step 2: export OmniVoice into three faithful fp32 ONNX graphs, driven by the captured inputs.

    onnx/omnivoice_transformer.onnx  input_ids[2B,8,S] int64, audio_mask[2B,S] bool,
                                     attention_mask[2B,1,S,S] bool -> logits[2B,8,S,1025] float32
    onnx/higgs_encoder.onnx          input_values[B,1,960*Tc] float32 -> audio_codes[B,8,Tc] int64
    onnx/higgs_decoder.onnx          audio_codes[B,8,Tc] int64 -> audio_values[B,1,960*Tc] float32

Each graph keeps all its weights in one `<graph>.onnx.data` sidecar and carries the constants a
runtime needs in its metadata_props (fingerprint, sample rate, hop, codebooks, mask id,
generation defaults, exporter, versions). torch.onnx.export(dynamo=True) runs first; if it fails
for a graph, the legacy exporter does, and the report says why (--no-dynamo forces legacy).

Example inputs are real tensors from capture/ (batch >= 2: a batch-1 example fixes the batch).
Right after export each graph is loaded in onnxruntime and run at shapes the export never saw,
and the transformer must pass the bidirectionality and mask probes. Files are written to a
staging directory and renamed into onnx/ only when complete and only when onnx.checker and every
self-check passed: an export that fails them exits 1 and leaves onnx/ as it was. Everything goes
into onnx/export-report.json; a summary table is printed at the end.

    python export_omnivoice.py --model tiny
    python export_omnivoice.py --model full-random --graphs transformer
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnivoice_export.common.edge import add_capture_dir, add_onnx_dir, parse_subset
from omnivoice_export.step0_checkpoints.checkpoints import (
    add_model_arg,
    load_omnivoice,
    model_fingerprint,
    resolve_model,
)
from omnivoice_export.step1_capture import capture
from omnivoice_export.step2_export import exporting, model_card, report, wrappers
from omnivoice_export.step2_export.runtime_assets import write_runtime_assets
from omnivoice_onnx.bundle import MODEL_CARD_FILE
from omnivoice_onnx.contract import CONTRACTS, GRAPH_FILES, GRAPH_NAMES, HOP_LENGTH
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import check_input_dir, check_output, temporary_dir
from omnivoice_onnx.hashing import sha256_file
from omnivoice_onnx.program import CheckFailed, int_range, parse, run_main
from omnivoice_onnx.sessions import make_session

TRANSFORMER_INPUTS = CONTRACTS["transformer"].input_names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_arg(parser)
    parser.add_argument(
        "--graphs", default=",".join(GRAPH_NAMES), help="comma-separated subset of transformer,encoder,decoder"
    )
    parser.add_argument(
        "--opset",
        type=int_range(exporting.OPSET_MIN, exporting.OPSET_MAX),
        default=exporting.DEFAULT_OPSET,
        help="ONNX opset: dynamo 18-22, legacy 14-20 (18, 20 and 22 verified; dynamo's 23 emits "
        "RotaryEmbedding nodes that ORT refuses to run at other shapes)",
    )
    parser.add_argument("--no-dynamo", action="store_true", help="use the legacy TorchScript exporter only")
    add_capture_dir(parser, "step 1's capture")
    add_onnx_dir(parser, "where the graphs go")
    return parse(parser, argv)


def _crop_stack(arrays: list[np.ndarray], multiple: int = 1) -> np.ndarray:
    """Stack [1,C,L] arrays along batch after cropping to the shortest length (a multiple of `multiple`)."""
    length = min(a.shape[-1] for a in arrays) // multiple * multiple
    return np.concatenate([a[..., :length] for a in arrays])


def transformer_examples(
    capture_dir: Path, manifest: dict[str, Any]
) -> tuple[tuple[torch.Tensor, ...], list[dict[str, np.ndarray]]]:
    """Export example (the first mode's first step, 2B >= 2) and self-check inputs at other (B, S):
    the last step of every other mode (a batch mode's padded rows included), and B=2 made of the
    last one-item step as [cond, cond, uncond, uncond] when no mode is batched."""
    modes = list(manifest["modes"])
    first = capture.load_step(capture_dir, modes[0], capture.mode_steps(manifest, modes[0])[0])
    example = tuple(torch.from_numpy(first[k]) for k in TRANSFORMER_INPUTS)
    checks = []
    for mode in modes[1:] or modes:
        step = capture.mode_steps(manifest, mode)[-1]
        checks.append({k: v for k, v in capture.load_step(capture_dir, mode, step).items() if k in TRANSFORMER_INPUTS})
    if all(len(c["input_ids"]) == 2 for c in checks):
        checks.append({k: v[np.array([0, 0, 1, 1])] for k, v in checks[-1].items()})
    return example, checks


def codec_examples(capture_dir: Path, manifest: dict[str, Any]) -> dict[str, tuple[np.ndarray, list[np.ndarray]]]:
    """(export example with batch 2, self-check inputs at other batch/lengths) per codec graph."""
    if "clone" not in manifest["modes"]:
        raise UserError(
            "exporting the encoder needs the clone mode's captured encoder input",
            "re-run capture_reference.py with clone among --modes",
        )
    encoder_in = capture.load_mode_file(capture_dir, "clone", capture.ENCODER_FILE)["input_values"]
    decoded = [
        capture.load_mode_file(capture_dir, mode, name)
        for mode in manifest["modes"]
        for name in capture.item_files(manifest, mode, capture.DECODER_FILE)
    ]
    audio = _crop_stack([encoder_in, decoded[0]["audio_values"]], HOP_LENGTH)
    half = encoder_in[..., : encoder_in.shape[-1] // 2 // HOP_LENGTH * HOP_LENGTH]
    codes = _crop_stack([d["audio_codes"] for d in decoded] * (2 if len(decoded) == 1 else 1))
    short = codes[:1, :, : max(2, codes.shape[-1] // 2)]
    return {
        "encoder": (audio, [encoder_in, np.concatenate([half] * 3)]),
        "decoder": (codes, [decoded[0]["audio_codes"], np.concatenate([short] * 3)]),
    }


def summary_table(entries: dict[str, dict[str, Any]]) -> str:
    head = (
        f"{'graph':<12}{'exporter':<10}{'opset':>6}{'onnx MiB':>9}{'data MiB':>10}{'time s':>8}{'peak RSS MiB':>13}"
        f"{'checker':>9}{'self-check':>12}"
    )
    lines = [head, "-" * len(head)]
    for graph, entry in entries.items():
        sizes = [f["bytes"] / 2**20 for f in entry["files"].values()]
        lines.append(
            f"{graph:<12}{entry['exporter']:<10}{entry['opset']:>6}{sizes[0]:>9.2f}{sizes[1]:>10.1f}"
            f"{entry['export_seconds']:>8.1f}{entry['peak_rss_mb']:>13.0f}{entry['checker']:>9}"
            f"{'PASS' if entry['self_checks']['passed'] else 'FAIL':>12}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    graphs = parse_subset(args.graphs, "--graphs", GRAPH_NAMES)
    exporting.check_opset(args.opset, not args.no_dynamo)
    check_input_dir(args.capture_dir, "--capture-dir")
    check_output(args.onnx_dir, "--model-dir", "dir")
    model_path = resolve_model(args.model)
    fingerprint = model_fingerprint(model_path)
    manifest = capture.load_manifest(args.capture_dir)
    manifest_sha256 = sha256_file(args.capture_dir / capture.MANIFEST_NAME)  # parity/infer check it is unchanged
    if manifest["model"]["fingerprint"] != fingerprint:
        raise UserError(
            f"the capture was made with model {manifest['model']['fingerprint']}, not {fingerprint} ({model_path})",
            "export with the capture's --model, or re-run steps 0-1 for this model",
        )
    previous = None
    if report.report_path(args.onnx_dir).is_file() and set(graphs) != set(GRAPH_NAMES):
        try:
            previous = report.load_report(args.onnx_dir)
        except UserError as exc:  # adding graphs to a report that cannot be read would drop the others
            raise UserError(
                f"cannot add {','.join(graphs)} to the existing export: {exc.problem}",
                "export all graphs (omit --graphs) to rebuild the report",
            ) from exc
        if previous["model"]["fingerprint"] != fingerprint:
            raise UserError(
                f"onnx/ holds an export of model {previous['model']['fingerprint']}; exporting only "
                f"{','.join(graphs)} of {fingerprint} would mix models",
                "export all graphs",
            )

    print(
        f"[step 2] model {model_path} ({fingerprint}); exporter {'legacy' if args.no_dynamo else 'dynamo'}, "
        f"opset {args.opset}",
        flush=True,
    )
    model = load_omnivoice(model_path)
    modules = wrappers.make_wrappers(model)
    config = json.loads((model_path / "config.json").read_text())
    versions = report.package_versions()
    provenance = model_card.provenance(model_path)
    t_example, t_checks = transformer_examples(args.capture_dir, manifest)
    codec = codec_examples(args.capture_dir, manifest) if {"encoder", "decoder"} & set(graphs) else {}

    results, signatures = {}, {}
    with temporary_dir(args.onnx_dir / "staging") as staging:
        for graph in graphs:
            print(f"[step 2] exporting {graph} ...", flush=True)
            inputs = t_example if graph == "transformer" else (torch.from_numpy(codec[graph][0]),)
            result = exporting.export_graph(modules[graph], graph, inputs, staging, not args.no_dynamo, args.opset)
            path = staging / GRAPH_FILES[graph]
            exporting.set_metadata(
                path,
                graph,
                exporting.graph_metadata(graph, config, fingerprint, result.exporter, args.opset, versions, provenance),
            )
            result.checker = exporting.check_graph(path)
            session = make_session(path, "cpu")
            if graph == "transformer":
                result.self_checks = exporting.self_check_transformer(session, modules[graph], t_checks)
            else:
                result.self_checks = exporting.self_check_codec(session, modules[graph], graph, codec[graph][1])
            del session
            results[graph], signatures[graph] = result, exporting.signature(path)
            print(
                f"[step 2] {graph}: {result.exporter} in {result.seconds:.1f} s, peak RSS {result.peak_rss_mb:.0f} MB, "
                f"checker {result.checker}, self-checks {'PASS' if result.self_checks['passed'] else 'FAIL'}",
                flush=True,
            )
        # Hashed in staging: install and report write follow with no slow step between.
        entries = {
            graph: report.graph_entry(result, signatures[graph], report.graph_files(staging, graph))
            for graph, result in results.items()
        }
        print()
        print(summary_table(entries))
        # Checked before anything is installed: graphs that failed never replace those in onnx/.
        failed = {graph: problems for graph, entry in entries.items() if (problems := report.entry_problems(entry))}
        if failed:
            for graph, problems in failed.items():
                print("\n".join(f"  {graph} failed: {problem}" for problem in problems))
            graph, problems = next(iter(failed.items()))
            raise CheckFailed(
                f"the export of {', '.join(failed)} failed its checks ({graph}: {problems[0]}); "
                f"nothing was installed, {args.onnx_dir} is unchanged"
            )
        exporting.install_graphs(staging, args.onnx_dir, graphs)

    # What the torch-free runtime needs besides the graphs, so that onnx/ can be used alone.
    assets = write_runtime_assets(model_path, args.onnx_dir)
    model_card.copy_licence_files(model_path, args.onnx_dir, provenance["license_files"])
    report.write_export_report(
        args.onnx_dir,
        model_path,
        fingerprint,
        args.capture_dir,
        manifest["model"]["fingerprint"],
        manifest_sha256,
        versions,
        {**(previous["graphs"] if previous else {}), **entries},
        assets,
        provenance,
    )
    print(
        f"\n[step 2] export complete: {args.onnx_dir}  report {report.report_path(args.onnx_dir)}  model card "
        f"{args.onnx_dir / MODEL_CARD_FILE}"
    )


if __name__ == "__main__":
    run_main(main)
