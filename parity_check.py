#!/usr/bin/env python3
"""Step 3: per-graph parity of the ONNX graphs against the PyTorch capture, on captured real inputs.

    transformer  every captured step of every mode: argmax agreement and logit max-abs over the
                 rows generate() reads (plus mean-abs, and the reference's top-1/top-2 margin
                 where argmax disagrees, so a near-tie flip is told from a real error)
    encoder      exact code-match rate per codebook on the captured reference audio, plus a
                 length sweep: the reference cut to ~30 hop-multiple lengths, ONNX vs PyTorch
    decoder      log-spectral L1 per item (n_fft 1024, hop 256, log10, floor 1e-5), max-abs for
                 information

Each graph's declared inputs and outputs (names, dtypes, rank, axis names) and the shapes of every
call (one size per axis name, 960*frames samples per `frames` codes) are checked against the
contract table (omnivoice_onnx.contract). Before comparing anything, the capture manifest and the
export report must name the same model fingerprint, the capture must be the one the export was made
from (its manifest sha256, recorded in the report), each graph's metadata must name the report's
exporter and opset, and every capture and ONNX file must match its recorded sha256 (hashed, or
unchanged since this user's runs hashed it: docs/export.md); otherwise it stops with one line
(exit 2).

Providers: cpu (default), cuda-fp32 (CUDA EP, TF32 off, read back from the session) and cuda-tf32
(CUDA EP defaults). cpu and cuda-fp32 are parity verdicts on the export; cuda-tf32 is reported as a
speed/precision trade-off. Under CUDA, a profiled first run of each graph reports how many nodes
onnxruntime ran on the GPU and which on the CPU (recorded as `placement`). Results are merged
into onnx/export-report.json under parity.<provider>; the exit code is 1 when any graph fails.
A graph with nothing to compare on (the encoder of a capture without clone mode) is refused
(exit 2), never reported as a PASS.

--variant NAME checks a transformer variant of step 5 (quantize_omnivoice.py) on the same captured
calls instead, run as generate() runs them (cond and uncond rows at their own lengths): a
quantized variant gets measurements (argmax agreement, relative logit error; exit 0), an fp32
variant (fp32-unmasked) the transformer's verdict; results under variants.<name>.parity.<provider>.

    python parity_check.py
    python parity_check.py --provider cuda-fp32 --graphs transformer
    python parity_check.py --variant int8
"""

from __future__ import annotations

import argparse

from omnivoice_export.common.edge import add_capture_dir, add_onnx_dir, parse_subset
from omnivoice_export.step34_proof import parity
from omnivoice_onnx.contract import CONTRACTS, GRAPH_NAMES, THRESHOLDS
from omnivoice_onnx.files import check_input_dir, check_output
from omnivoice_onnx.program import THREADS, float_range, parse, run_main
from omnivoice_onnx.sessions import PROVIDERS, check_provider

# The flag overriding each graph's parity tolerance (contract.tolerances) for one run, and its help.
THRESHOLD_FLAGS = {  # key: (flag, help, its range: a rate in [0, 1] or a non-negative bound)
    "transformer_argmax_min": (
        "--argmax-min",
        "transformer: minimum argmax agreement on the rows generate() reads",
        float_range(0, 1),
    ),
    "transformer_max_abs": ("--max-abs", "transformer: maximum |logit difference| on those rows", float_range(0)),
    "encoder_code_match_min": ("--code-match-min", "encoder: minimum exact code-match rate", float_range(0, 1)),
    "decoder_log_spectral_l1_max": ("--lsd-max", "decoder: maximum log-spectral L1", float_range(0)),
}
TOLERANCES = tuple(key for contract in CONTRACTS.values() for key in contract.tolerances)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--provider", default="cpu", help=f"one of {', '.join(PROVIDERS)}")
    parser.add_argument("--graphs", default=",".join(GRAPH_NAMES), help="comma-separated subset to check")
    add_capture_dir(parser, "step 1's capture")
    add_onnx_dir(parser, "step 2's export")
    parser.add_argument(
        "--threads", type=THREADS, default=None, help="onnxruntime intra-op threads (default: all cores)"
    )
    for key in TOLERANCES:
        flag, text, kind = THRESHOLD_FLAGS[key]
        parser.add_argument(
            flag, type=kind, default=THRESHOLDS[key], dest=key, metavar=flag[2:].upper().replace("-", "_"), help=text
        )
    parser.add_argument("--no-sweep", action="store_true", help="skip the encoder length sweep (needs PyTorch weights)")
    parser.add_argument(
        "--variant",
        default=None,
        help="check a transformer variant made by quantize_omnivoice.py instead of the export's graphs: "
        "every captured call run as generate() runs it (cond and uncond rows at their own "
        "lengths); a quantized variant is measured (argmax agreement, relative logit error), "
        "an fp32 one (fp32-unmasked) judged by the transformer thresholds",
    )
    return parse(parser, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_provider(args.provider)
    graphs = parse_subset(args.graphs, "--graphs", GRAPH_NAMES)
    thresholds = {key: getattr(args, key) for key in TOLERANCES}
    check_input_dir(args.capture_dir, "--capture-dir")
    check_output(args.onnx_dir, "--model-dir", "dir")  # the results are merged into its report
    if args.variant is not None:
        parity.check_variant(args.capture_dir, args.onnx_dir, args.variant, args.provider, args.threads, thresholds)
    else:
        parity.check_graphs(
            args.capture_dir, args.onnx_dir, graphs, args.provider, args.threads, thresholds, sweep=not args.no_sweep
        )


if __name__ == "__main__":
    run_main(main)
