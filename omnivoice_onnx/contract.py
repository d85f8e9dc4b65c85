"""The I/O contract of the three graphs: one table, read by the export, its self-checks, the parity
check and the runtime.

Per graph: its file, and per input and output the name, numpy dtype and axes (rank = number of
axes). An axis is a fixed size (8 codebooks, 1025 logits) or a symbolic name that the graph must
carry as its dim_param; names shared between tensors bind to one size in a call (`seq` of
input_ids is `seq` of logits). `960*frames` is a derived axis: exactly HOP_LENGTH times `frames`.
ORT sessions are fed by these names, never by position.

Also here, because the runtime needs them without the toolchain: the one threshold table (parity,
end to end and the export's self-checks) and the design constants of the audio tokenizer. A
runtime reads the sample rate and hop of an export from its graphs' metadata_props; these
constants are what the export writes there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Higgs Audio V2 tokenizer of the real checkpoint: 24 kHz, DAC ratios 8*5*4*2*3 = 960 samples
# per frame, so 25 frames/s.
SAMPLE_RATE = 24000
HOP_LENGTH = 960
FRAME_RATE = SAMPLE_RATE // HOP_LENGTH
NUM_CODEBOOKS = 8
AUDIO_VOCAB_SIZE = 1025  # 1024 codes + the mask id

# The one threshold table: every script and test reads it; parity_check.py flags may override the
# parity entries for one run.
THRESHOLDS = {
    "transformer_argmax_min": 0.999,  # fraction of read rows whose argmax equals PyTorch's
    "transformer_max_abs": 1e-3,  # max |logit difference| on read rows (fp32; peers see ~2e-4 at real dims)
    "encoder_code_match_min": 1.0,  # exact codes on the same device
    "decoder_log_spectral_l1_max": 5e-3,  # mean |log10 magnitude difference|
    "end_to_end_token_match_min": 1.0,  # generate() with ONNX modules: identical final tokens
    "end_to_end_log_spectral_l1_max": 1e-3,
    # Right after export, ORT against the torch module at shapes the export never saw: the
    # transformer and encoder use their parity entries above; the decoder's waveform max |d|.
    "self_check_decoder_max_abs": 1e-3,
    # Bidirectionality probe: the least change of earlier positions' logits when only the last
    # position's ids change. A causal graph changes them by exactly 0.
    "self_check_probe_min_change": 1e-6,
    # Mask probe: the most change of a row's logits when only keys its queries may not attend to
    # change. Masked keys get weight exactly 0, so a graph that honours the mask changes nothing.
    "self_check_mask_probe_max_change": 1e-6,
    # The fp16 variant against the fp32 graph, per call (tests/test_fp16.py on tiny-large-act, every
    # onnxruntime optimisation level). The measured error and argmax, and the headroom these
    # thresholds leave: the investigation log.
    "fp16_argmax_min": 0.99,
    "fp16_relative_error_max": 2e-3,
}

# The length axis of audio: the encoder's graph holds only encode()'s no-padding branch, valid for
# hop multiples. The legacy (TorchScript) exporter cannot state a derived axis; it names it freely.
SAMPLES_AXIS = f"{HOP_LENGTH}*frames"
LEGACY_AXIS_NAMES: dict[str | int, str] = {SAMPLES_AXIS: "samples"}


@dataclass(frozen=True)
class Tensor:
    """One input or output of a graph."""

    name: str
    dtype: str  # numpy dtype name
    axes: tuple[str | int, ...]  # symbolic axis names and fixed sizes, in order


@dataclass(frozen=True)
class GraphContract:
    """What one graph takes and gives."""

    name: str
    file: str  # the .onnx file in an export directory; its weights are in file + ".data"
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    summary: str  # one line in the notation of the docs (2B = cond + uncond rows), kept in metadata_props
    tolerances: tuple[str, ...]  # the THRESHOLDS entries its parity is judged by

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)


CONTRACTS = {
    "transformer": GraphContract(
        name="transformer",
        file="omnivoice_transformer.onnx",
        inputs=(
            Tensor("input_ids", "int64", ("batch", NUM_CODEBOOKS, "seq")),
            Tensor("audio_mask", "bool", ("batch", "seq")),
            Tensor("attention_mask", "bool", ("batch", 1, "seq", "seq")),
        ),
        outputs=(Tensor("logits", "float32", ("batch", NUM_CODEBOOKS, "seq", AUDIO_VOCAB_SIZE)),),
        summary="input_ids[2B,8,S] int64, audio_mask[2B,S] bool, attention_mask[2B,1,S,S] bool "
        "-> logits[2B,8,S,1025] float32",
        tolerances=("transformer_argmax_min", "transformer_max_abs"),
    ),
    "encoder": GraphContract(
        name="encoder",
        file="higgs_encoder.onnx",
        inputs=(Tensor("input_values", "float32", ("batch", 1, SAMPLES_AXIS)),),
        outputs=(Tensor("audio_codes", "int64", ("batch", NUM_CODEBOOKS, "frames")),),
        summary="input_values[B,1,960*Tc] float32 @24kHz -> audio_codes[B,8,Tc] int64",
        tolerances=("encoder_code_match_min",),
    ),
    "decoder": GraphContract(
        name="decoder",
        file="higgs_decoder.onnx",
        inputs=(Tensor("audio_codes", "int64", ("batch", NUM_CODEBOOKS, "frames")),),
        outputs=(Tensor("audio_values", "float32", ("batch", 1, SAMPLES_AXIS)),),
        summary="audio_codes[B,8,Tc] int64 -> audio_values[B,1,960*Tc] float32 @24kHz",
        tolerances=("decoder_log_spectral_l1_max",),
    ),
}
GRAPH_FILES = {name: contract.file for name, contract in CONTRACTS.items()}


def contract_table() -> dict[str, Any]:
    """CONTRACTS as JSON data: the `graphs` section of runtime-config.json, for ports whose
    onnxruntime binding cannot read metadata_props (onnxruntime-node). Per graph: file, summary,
    and per input/output {name, dtype, axes} in feed order; an axis is a size (int) or a symbolic
    name, "960*frames" meaning HOP_LENGTH times the `frames` of the same call."""

    def tensors(items: tuple[Tensor, ...]) -> list[dict[str, Any]]:
        return [{"name": t.name, "dtype": t.dtype, "axes": list(t.axes)} for t in items]

    return {
        name: {"file": c.file, "summary": c.summary, "inputs": tensors(c.inputs), "outputs": tensors(c.outputs)}
        for name, c in CONTRACTS.items()
    }


GRAPH_NAMES = tuple(CONTRACTS)

# The export report (omnivoice_export.step2_export.report writes it; the runtime reads only its `variants` keys).
REPORT_FILE = "export-report.json"

# Transformer variants (quantize_omnivoice.py, step 5): onnx/<name>/omnivoice_transformer.onnx and
# its sidecar, used with the export's own fp32 codec graphs unless the variant's folder holds its
# own (the fp16 variant's float16 encoder and decoder). "fp32" names the export's graphs.
FP32_VARIANT = "fp32"


def variant_dir(onnx_dir: Path, name: str) -> Path:
    """The folder of transformer variant `name` inside an export folder."""
    return Path(onnx_dir) / name


def variant_path(onnx_dir: Path, name: str, graph: str = "transformer") -> Path:
    """`graph` of variant `name`: FP32_VARIANT's are the export's own; a variant's transformer is
    in its folder, and so is a codec graph where the variant carries its own (a recipe that
    converts the codecs, as fp16 does), else that codec graph is the export's."""
    file = GRAPH_FILES[graph]
    if name == FP32_VARIANT:
        return Path(onnx_dir) / file
    own = variant_dir(onnx_dir, name) / file
    return own if graph == "transformer" or own.is_file() else Path(onnx_dir) / file


def codec_paths(onnx_dir: Path, name: str = FP32_VARIANT) -> dict[str, Path]:
    """The encoder's and decoder's files variant `name` loads (variant_path: a variant's own where
    it carries them, as fp16 does, else the export's)."""
    return {graph: variant_path(onnx_dir, name, graph) for graph in ("encoder", "decoder")}


def variants_present(onnx_dir: Path) -> list[str]:
    """The variants whose transformer graph is in `onnx_dir`, sorted (FP32_VARIANT when the
    export's own is there)."""
    onnx_dir = Path(onnx_dir)
    found = [FP32_VARIANT] if variant_path(onnx_dir, FP32_VARIANT).is_file() else []
    if onnx_dir.is_dir():
        found += sorted(
            child.name
            for child in onnx_dir.iterdir()
            if child.is_dir() and variant_path(onnx_dir, child.name).is_file()
        )
    return found


# onnxruntime's type strings (NodeArg.type) as numpy dtype names.
ORT_DTYPES = {"tensor(int64)": "int64", "tensor(bool)": "bool", "tensor(float)": "float32"}


# (name, dtype, axes) of a graph's tensor; an axis is a symbol, a fixed size or (unnamed) None
TensorSignature = tuple[str, str, list[str | int | None]]


def ort_signature(session: Any) -> tuple[list[TensorSignature], list[TensorSignature]]:
    """(inputs, outputs) of an onnxruntime session (untyped: onnxruntime has no stubs) as
    (name, dtype, axes) triples."""

    def describe(args: Sequence[Any]) -> list[TensorSignature]:
        return [(a.name, ORT_DTYPES.get(a.type, a.type), list(a.shape)) for a in args]

    return describe(session.get_inputs()), describe(session.get_outputs())


def signature_problems(
    graph: str, inputs: Sequence[tuple[str, str, Sequence[Any]]], outputs: Sequence[tuple[str, str, Sequence[Any]]]
) -> list[str]:
    """What a graph's declared signature gets wrong against the contract, one line per problem.

    As Optimum's validator does: names (in order), dtypes, rank, each fixed size, and each
    symbolic axis's name (a fixed size where the contract has a symbol is an exporter that
    specialised a dynamic axis). The legacy exporter's name for a derived axis is accepted.
    """
    contract = CONTRACTS[graph]
    problems = []
    for kind, expected, found in (("input", contract.inputs, inputs), ("output", contract.outputs, outputs)):
        if [t.name for t in expected] != [f[0] for f in found]:
            problems.append(f"{kind}s are {[f[0] for f in found]}, expected {[t.name for t in expected]}")
            continue
        for tensor, (name, dtype, axes) in zip(expected, found):
            if dtype != tensor.dtype:
                problems.append(f"{kind} {name} is {dtype}, expected {tensor.dtype}")
            if len(axes) != len(tensor.axes):
                problems.append(f"{kind} {name} has rank {len(axes)}, expected {len(tensor.axes)} {list(tensor.axes)}")
                continue
            for index, (want, got) in enumerate(zip(tensor.axes, axes)):
                if got != want and got != LEGACY_AXIS_NAMES.get(want):
                    problems.append(f"{kind} {name} axis {index} is {got!r}, expected {want!r}")
    return problems


def shape_problems(graph: str, shapes: dict[str, Sequence[int]]) -> list[str]:
    """What the shapes of one call's arrays (inputs and outputs, by name) get wrong against the
    contract: rank, fixed sizes, one size per axis name, and 960*frames = HOP_LENGTH * frames."""
    contract = CONTRACTS[graph]
    sizes: dict[str, int] = {}
    problems = []
    derived = []
    for tensor in contract.inputs + contract.outputs:
        shape = tuple(shapes[tensor.name])
        if len(shape) != len(tensor.axes):
            problems.append(
                f"{tensor.name} has shape {list(shape)}, expected {len(tensor.axes)} axes {list(tensor.axes)}"
            )
            continue
        for axis, size in zip(tensor.axes, shape):
            if isinstance(axis, int) and size != axis:
                problems.append(f"{tensor.name} has shape {list(shape)}, expected {axis} for that axis")
            elif axis == SAMPLES_AXIS:
                derived.append((tensor.name, shape, size))
            elif isinstance(axis, str) and sizes.setdefault(axis, size) != size:
                problems.append(f"{tensor.name} has shape {list(shape)}, but {axis} is {sizes[axis]} elsewhere")
    for name, shape, size in derived:
        if "frames" in sizes and size != HOP_LENGTH * sizes["frames"]:
            problems.append(f"{name} has shape {list(shape)}, expected {HOP_LENGTH} x {sizes['frames']} frames")
    return problems
