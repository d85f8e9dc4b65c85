"""The transformer's variants as data: each recipe, and why it is what it is (step 5 makes them).

A variant is `onnx/<name>/omnivoice_transformer.onnx` + its one `.onnx.data` sidecar, made from
the fp32 export's transformer by one recipe of onnxruntime.quantization (or omnivoice_export.step56_variants.fp16).
Codec graphs stay fp32 and loaders take them from onnx/, except where a recipe converts them too
(`codecs`: fp16 does): then the variant directory holds its own higgs_encoder/higgs_decoder graphs
and loaders take those (omnivoice_onnx.contract.variant_path).

Why the recipes are what they are (the quality table measures each):
- the audio heads (the last MatMul, hidden -> 8 x 1025) produce the logits that unmasking ranks
  by confidence and takes the argmax of: their quantization error lands on every logit directly,
  with no later layer to dilute it. Every recipe but `int8-plain` keeps them fp32; `int8-plain`
  exists to show why (on tiny: 2.4x int8-unfused's relative logit error, fewer tokens kept in
  every mode).
- the embeddings (text 151676 x H and audio 8200 x H) are Gathers: storing them in fewer bits
  saves disk, not time (a Gather reads a few rows), but the text table is most of an int8 file
  (621 MB of ~1.1 GB at the real dims, 46 % of fp32's size with it, against the issue's 40 %).
  `int8` and `int8-unfused` store them fp16 (Gather, Cast: rounding error 2^-11 relative per
  element, ~50x below int8 per row's), which brings the file to about a third of fp32's;
  `int8-emb32` is int8-unfused's recipe with fp32 tables, kept to measure what fp16 tables cost
  (the quality table). `int8-emb8` stores them int8 per row (in standard ops any runtime has);
  `int8-plain` quantizes every op `quantize_dynamic` supports (its Gathers then read uint8
  tables). The MatMulNBits recipes keep fp32 tables.
- `quantize_dynamic` quantizes each MatMul's activations per tensor at run time (uint8, scale
  from that call's min/max): the rows of one call share a scale, so the result of a row depends
  on the other rows in the call (cond and uncond rows of one length group, padding included).
  Weights are int8 per output channel (`per_channel`), symmetric; `reduce_range` is off, which is
  right on VNNI CPUs (AVX512-VNNI / AVX-VNNI) and can saturate u8 x s8 products on older AVX2 ones.
- `fp32-unmasked` is not quantized: the faithful fp32 graph without each layer's mask work, valid
  (and bit-identical) for the calls run_split makes, whose masks are all True (drop_mask_work).
- `fp32-fused` is fp32-unmasked with each layer's attention core fused into one ONNX Attention
  (opset 23; omnivoice_export.step56_variants.fusion): same calls, same output guard; its logits were the same
  bits as fp32-unmasked's on every call measured (tiny: all captured; real dims: the bench's
  shapes), not a guarantee: the fused kernel owns its float order.
- `fp16` (omnivoice_export.step56_variants.fp16): float16 weights and compute, float32 inputs and outputs, and
  float32 islands where float16 overflows or loses the decision (`keep_fp32`: RMSNorm's square,
  mean and rsqrt; RoPE's angles; softmax; the audio heads to the logits), computed in float32
  from the island's first input to its last output. Its codec graphs are float16 too, with the
  ops CODEC_KEEP_OPS names float32. The GPU / mobile format: an x86 CPU without native float16
  arithmetic runs it no faster than fp32 (0.97x at the real dims; slower on tiny).
- `int8-pertensor` (the `int8` until the outlier proxy showed it breaking) is quantize_dynamic on
  fp32-fused's graph (same calls, same output guard as fp32-unmasked), with two more rewrites
  before quantizing (omnivoice_export.step56_variants.fusion;
  investigation log): each RoPE as com.microsoft.RotaryEmbedding, so that Attention reads q, k
  and v without a layout change, and each RMSNorm as onnxruntime's SimplifiedLayerNormalization
  (each its own float order: not for the fp32 recipes). onnxruntime quantizes the activation that
  q/k/v (gate/up) share once and runs one MatMulIntegerToFloat per projection. The attention cores
  stay Attention in fp32: at the real dims they are 38 % of int8's kernel time on two threads, the
  bound on what int8 projections can gain. `int8-unfused` is the same quantization of the
  faithful graph (valid for any mask), kept to measure what the rewrites gain.
- `int8` is int8-pertensor's graph quantized by omnivoice_export.step56_variants.rowwise instead, calibrated on
  the capture's calls: every MatMul input's channel ranges measured and its outlier channels
  folded into the weights that read it (omnivoice_export.step56_variants.smoothing: SmoothQuant with alpha chosen
  per input, powers of two, the fp32 graph's bits unchanged; into the norms, up_proj's and
  v_proj's output columns), then every quantized input rotated by a block Hadamard matrix
  (omnivoice_export.step56_variants.rotation: what is left of an outlier channel spread over its
  block; the weights store the transpose; o_proj's input per head, folded into v_proj, the others
  online by one 64 x 64 GEMM), and one scale per row of every activation (a massive
  row no longer sets the scale of the others). Per-tensor scales are what a trained model's
  outliers break (docs/variants.md: the outlier proxies). `int8-mixed` adds fp32 for the fewest
  MatMuls whose measured share of the logit error reaches the target
  (omnivoice_export.step56_variants.sensitivity): a forward per MatMul per calibration call, which
  the real dims' 196 MatMuls make the costliest step of the pipeline, for a gain the rotation left
  small (docs/variants.md). `int8-normfold` is phase 5's rule (scales read from the norm weights,
  spiking rows fp32), `int8-rows` the per-row scales alone, kept to measure what each part adds.
- `MatMulNBits` keeps weights block-wise (block along K, one scale and zero point per block);
  `accuracy_level` 0 dequantizes to fp32 and runs an fp32 GEMM, 4 quantizes activations to int8
  per block and runs an int8 GEMM (faster; the kind of error that flipped argmaxes on Qwen3-0.6B,
  onnxruntime#29849).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from omnivoice_export.step56_variants import fp16


@dataclass(frozen=True)
class Recipe:
    """How one variant is made from the fp32 transformer."""

    name: str
    # "dynamic" (quantize_dynamic, MatMulInteger) | "rowwise" (step56_variants.rowwise: per-row activation scales)
    # | "nbits" (MatMulNBits) | "unmasked" (fp32) | "fp16"
    method: str
    bits: int
    keep_heads_fp32: bool
    # "fp32" | "fp16" (store_embeddings_fp16; the fp16 method's own Gathers) | "int8-row"
    # (quantize_embeddings_rowwise) | "dynamic" (quantize_dynamic's)
    embeddings: str
    block_size: int | None = None  # nbits: weights per (scale, zero point) block along K
    accuracy_level: int | None = None  # nbits: 0 fp32 compute, 4 int8 activations
    fusions: tuple[str, ...] = ()  # unmasked, dynamic: step56_variants.fusion passes applied after drop_mask_work
    keep_fp32: tuple[str, ...] = ()  # fp16: the float32 islands of the transformer (fp16.TRANSFORMER_KEEP groups)
    codecs: tuple[str, ...] = ()  # codec graphs the variant converts and carries itself (else the export's fp32 ones)
    fold_norms: bool = False  # rowwise: smoothing.fold_norm_scales before quantizing (phase 5: scales from the norms)
    spikes_fp32: bool = False  # rowwise: the MatMuls whose input spikes on the capture's calls stay fp32 (phase 5)
    # rowwise: scales of every MatMul input measured on the capture's calls and folded (smoothing.smooth)
    calibrate: bool = False
    # rowwise, after calibrate's folds: every quantized MatMul input rotated (step56_variants.rotation)
    rotate: bool = False
    # rowwise, last: the fewest MatMuls kept fp32 that reach sensitivity's target (sensitivity.select_fp32;
    # one forward per MatMul per calibration call, the graph's MatMuls being 196 at the real dims)
    select_fp32: bool = False
    summary: str = ""

    def as_dict(self) -> dict[str, Any]:
        """As JSON reads it back (the report entry and the graph's `recipe` metadata)."""
        return {
            **asdict(self),
            "fusions": list(self.fusions),
            "keep_fp32": list(self.keep_fp32),
            "codecs": list(self.codecs),
        }


# The shipped int8 (int8-mixed is it plus the measured fp32 choice).
INT8 = Recipe(
    "int8",
    "rowwise",
    8,
    True,
    "fp16",
    fusions=("attention", "rotary", "rms_norm"),
    calibrate=True,
    rotate=True,
    summary="int8-pertensor's graph with every MatMul input's outlier channels measured on the capture's "
    "calls and folded into the weights (SmoothQuant, alpha measured per input, exact in fp32: into the "
    "norms, up_proj, v_proj), then each input rotated by a block Hadamard matrix (its weights by the "
    "transpose; o_proj's per head, offline, the others online), and a scale per row of each activation "
    "(MatMulIntegerToFloat)",
)

RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe(
            "fp32-unmasked",
            "unmasked",
            32,
            True,
            "fp32",
            summary="fp32, without the per-layer mask work (mask Add, NaN guard): for calls whose mask is all "
            "True, as run_split makes every call; NaN logits for any row whose mask is not",
        ),
        Recipe(
            "fp32-fused",
            "unmasked",
            32,
            True,
            "fp32",
            fusions=("attention",),
            summary="fp32-unmasked with each layer's attention core one ONNX Attention (opset 23, grouped-query): "
            "same calls, same guard; the same logits as fp32-unmasked where measured",
        ),
        Recipe(
            "fp16",
            "fp16",
            16,
            True,
            "fp16",
            keep_fp32=fp16.TRANSFORMER_KEEP,
            codecs=("encoder", "decoder"),
            summary="float16 weights and compute, float32 I/O; float32 islands for RMSNorm (square, mean, rsqrt), "
            "RoPE angles, softmax and the audio heads; its own float16 codec graphs (GPU / mobile format: "
            "no faster than fp32 on x86 CPUs without native float16)",
        ),
        INT8,
        replace(
            INT8,
            name="int8-mixed",
            select_fp32=True,
            summary="int8 with fp32 for the fewest MatMuls whose measured share of the logit error reaches the "
            "target (one forward per MatMul per calibration call: 14 MatMuls on tiny, 196 at the real dims)",
        ),
        Recipe(
            "int8-normfold",
            "rowwise",
            8,
            True,
            "fp16",
            fusions=("attention", "rotary", "rms_norm"),
            fold_norms=True,
            spikes_fp32=True,
            summary="phase 5's int8, kept to compare: scales read from the norms' weights (not measured), a scale "
            "per row, fp32 for the MatMuls whose input rows spike; breaks where outlier channels are not "
            "in the norm weights (down_proj and o_proj inputs, residual channels)",
        ),
        Recipe(
            "int8-rows",
            "rowwise",
            8,
            True,
            "fp16",
            fusions=("attention", "rotary", "rms_norm"),
            summary="per-row activation scales alone, nothing folded, nothing kept fp32 (what the others add)",
        ),
        Recipe(
            "int8-pertensor",
            "dynamic",
            8,
            True,
            "fp16",
            fusions=("attention", "rotary", "rms_norm"),
            summary="quantize_dynamic on fp32-fused's graph: int8 per-channel weights, uint8 per-tensor activations; "
            "attention one ONNX Attention (fp32) on RotaryEmbedding's q and k, RMSNorm onnxruntime's kernel; "
            "audio heads fp32, embedding tables fp16; for run_split's calls (NaN logits for a row whose "
            "mask is not all True)",
        ),
        Recipe(
            "int8-unfused",
            "dynamic",
            8,
            True,
            "fp16",
            summary="int8 on the faithful graph (any mask), nothing fused: what the fusions of int8 gain",
        ),
        Recipe(
            "int8-emb32",
            "dynamic",
            8,
            True,
            "fp32",
            summary="int8-unfused with the embedding tables fp32: what storing them fp16 costs "
            "(46 % of fp32's size, not ~33 %)",
        ),
        Recipe(
            "int8-emb8",
            "dynamic",
            8,
            True,
            "int8-row",
            summary="int8-unfused, and the embedding tables int8 with one fp32 scale per row (Gather, Cast, Mul): "
            "the text table is most of the file",
        ),
        Recipe(
            "int8-plain",
            "dynamic",
            8,
            False,
            "dynamic",
            summary="int8-unfused over every op quantize_dynamic supports (audio heads and embeddings too): "
            "the recipe NOT to use, kept to show why the heads stay fp32",
        ),
        Recipe(
            "int8-nbits-a0",
            "nbits",
            8,
            True,
            "fp32",
            block_size=32,
            accuracy_level=0,
            summary="MatMulNBits 8-bit, block 32, accuracy_level 0 (fp32 compute); audio heads and embeddings fp32",
        ),
        Recipe(
            "int8-nbits-a4",
            "nbits",
            8,
            True,
            "fp32",
            block_size=32,
            accuracy_level=4,
            summary="MatMulNBits 8-bit, block 32, accuracy_level 4 (int8 activations); audio heads and embeddings fp32",
        ),
        Recipe(
            "int4-b32",
            "nbits",
            4,
            True,
            "fp32",
            block_size=32,
            accuracy_level=4,
            summary="MatMulNBits 4-bit, block 32, accuracy_level 4; audio heads and embeddings fp32",
        ),
        Recipe(
            "int4-b128",
            "nbits",
            4,
            True,
            "fp32",
            block_size=128,
            accuracy_level=4,
            summary="MatMulNBits 4-bit, block 128, accuracy_level 4; audio heads and embeddings fp32",
        ),
    )
}
DEFAULT_VARIANTS = tuple(RECIPES)
