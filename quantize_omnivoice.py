#!/usr/bin/env python3
"""Step 5: quantized variants of the fp32 transformer, written beside the export.

Reads the fp32 export in --onnx-dir (checked against its report: sha256, metadata) and writes,
per variant, `onnx/<variant>/omnivoice_transformer.onnx` + its one `.onnx.data` sidecar. The
graph's metadata_props are the fp32 graph's plus `variant` and `recipe`; the export report gets
an entry per variant under `variants` (recipe, files with sizes and sha256, time, peak RSS).
Codec graphs stay fp32 (a variant directory holds only the transformer, and loaders take the
encoder and decoder from onnx/), except for fp16, which converts them too and carries its own
float16 encoder and decoder in onnx/fp16/ (loaders take those). Files are written to a hidden
staging directory and renamed into place only when complete.

Recipes (omnivoice_export/step56_variants/quantize.py says why each is what it is):
{recipes}

Measure them with quality_omnivoice.py (per-step argmax agreement and relative logit error,
end-to-end token agreement, LSD): variants are measurements, never parity verdicts.

    python quantize_omnivoice.py
    python quantize_omnivoice.py --variants int8,int4-b32
    python quantize_omnivoice.py --variants fp16          # the GPU / mobile format (slower on x86 CPUs)
"""

from __future__ import annotations

import argparse

from omnivoice_export.common.edge import add_capture_dir, add_onnx_dir, parse_subset
from omnivoice_export.step56_variants import quantize, recipes
from omnivoice_onnx.program import parse, run_main

__doc__ = __doc__.format(recipes="\n".join(f"    {r.name:<15}{r.summary}" for r in recipes.RECIPES.values()))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_onnx_dir(parser, "step 2's export; variants are written into subdirectories of it (default: onnx/)")
    add_capture_dir(
        parser,
        "the capture whose calls calibrate int8 (which MatMuls stay fp32); default: the one "
        "the export was made from, as its report records",
        default=None,
    )
    parser.add_argument(
        "--variants",
        default=",".join(recipes.DEFAULT_VARIANTS),
        help="comma-separated recipes to build (default: all of them)",
    )
    return parse(parser, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    names = parse_subset(args.variants, "--variants", tuple(recipes.RECIPES))
    entries = quantize.quantize_variants(args.onnx_dir, names, capture_dir=args.capture_dir)
    print()
    print(f"{'variant':<15}{'MB':>9}{'of fp32':>9}{'seconds':>9}{'peak MB':>9}  quantized nodes")
    for name, entry in entries.items():
        print(
            f"{name:<15}{entry['bytes'] / 2**20:>9.1f}{entry['size_ratio']:>9.1%}{entry['seconds']:>9.1f}"
            f"{entry['peak_rss_mb']:>9.0f}  {entry['node_counts']}"
        )
    print(f"\n[step 5] {len(entries)} variant(s) in {args.onnx_dir}; measure them with quality_omnivoice.py")


if __name__ == "__main__":
    run_main(main)
