"""OmniVoiceOnnx: speech from an OmniVoice ONNX export folder, with numpy + onnxruntime only.

    from omnivoice_onnx import OmniVoiceOnnx
    tts = OmniVoiceOnnx.from_dir("onnx")                      # the export folder alone
    audios = tts.generate("Hello.", language="English", seed=1)  # list of float32 [T] at tts.sample_rate
    prompt = tts.create_voice_clone_prompt("ref.wav", "The reference's words.")
    audios = tts.generate(["One.", "Two."], voice_clone_prompt=prompt, seed=1)

The same arguments and seed give what upstream gives after `torch.manual_seed(seed)` and
`OmniVoice.generate(...)` on CPU (omnivoice 0.2.1): the same tokens, and audio within float
tolerance (see docs/runtime.md for what is exact and why the rest is not).

The export folder holds the three graphs (omnivoice_onnx.contract), tokenizer.json and
runtime-config.json. Each graph carries its constants and the checkpoint's fingerprint in its
metadata; a graph of another export (another fingerprint), one whose inputs and outputs break
the contract table (omnivoice_onnx.contract) or a runtime config that disagrees with the graphs
is refused at load time, as is a missing file.

A transformer variant made by quantize_omnivoice.py (step 5) is loaded by name,
`from_dir("onnx", variant="int8")`: onnx/int8/omnivoice_transformer.onnx with the export's fp32
codec graphs, or the variant's own where it carries them (`variant="fp16"`: float16 encoder and
decoder too; omnivoice_onnx.contract.variant_path). Its metadata must name the variant and the
codecs' model. Without a name the runtime takes default_variant(): fp32-fused when step 5 made
it for this export (the faithful graph's logits, bit for bit on every CPU call measured, and
faster), else the faithful fp32 graph, which stays the reference every verdict is made on.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from omnivoice_onnx import generate as gen
from omnivoice_onnx import integrity, request
from omnivoice_onnx.contract import (AUDIO_VOCAB_SIZE, FP32_VARIANT, NUM_CODEBOOKS, REPORT_FILE, contract_table,
                                     ort_signature, signature_problems, variant_path, variants_present)
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import read_json
from omnivoice_onnx.prompt import RUNTIME_CONFIG_FILE, TextTokenizer, load_runtime_config
from omnivoice_onnx.rng import TorchCpuRng, check_seed, fresh_seed
from omnivoice_onnx.sessions import (PROVIDERS, TRANSFORMER_ARENA, CodecSessions, finite_output, make_session,
                                     run_split)

RERUN_EXPORT = integrity.RERUN_EXPORT
VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a folder name inside the export, never a path
# Graph metadata (omnivoice_export.exporting.graph_metadata) the runtime reads, as ints.
INT_METADATA = ("sample_rate", "hop_length", "frame_rate", "num_codebooks", "audio_vocab_size", "audio_mask_id")
# runtime-config.json's model section -> the graph metadata key that must agree with it.
CONFIG_VS_METADATA = {"audio_mask_id": "audio_mask_id", "num_audio_codebook": "num_codebooks",
                      "audio_vocab_size": "audio_vocab_size"}
# The transformer graph used when no variant is named: the first of these that the export holds.
# fp32-fused passes the fp32 verdicts (parity argmax 1.000000, tokens 100 %, its logits the same
# bits as the faithful graph's on every CPU call measured: log Runs 19, 22) and runs faster; it
# needs onnxruntime's contrib op com.microsoft.MultiHeadAttention (in every standard build; a
# reduced mobile build may lack it: name variant="fp32" there). The one place the runtime's choice
# is made; infer_onnx.py --text takes it, its compare mode always runs the faithful graph.
DEFAULT_VARIANT_ORDER = ("fp32-fused", FP32_VARIANT)


def default_variant(onnx_dir: Path, provider: str = "cpu") -> str:
    """The variant the runtime loads from `onnx_dir` when none is named: the first of
    DEFAULT_VARIANT_ORDER whose graph is in the folder AND that the export report lists (a re-export
    writes a new report without variants, so a folder left from the previous export is never
    taken), on the CPU provider only (the fused kernel was measured on CPU); else "fp32"."""
    if provider != "cpu":
        return FP32_VARIANT
    try:
        listed = set(read_json(Path(onnx_dir) / REPORT_FILE, "export report", "").get("variants", {}))
    except (UserError, AttributeError, TypeError):
        return FP32_VARIANT  # no readable report: the faithful graph, whose own checks then speak
    present = variants_present(onnx_dir)
    return next((name for name in DEFAULT_VARIANT_ORDER if name in present and (name == FP32_VARIANT or name in listed)),
                FP32_VARIANT)


def graph_metadata(session, path: Path, graph: str) -> dict[str, Any]:
    """A session's OmniVoice metadata (ints parsed), checked to describe `graph` and its inputs
    and outputs checked against the contract table."""
    meta = dict(session.get_modelmeta().custom_metadata_map)
    if meta.get("graph") != graph:
        raise UserError(f"{path} is not an OmniVoice {graph} graph (its metadata says graph="
                        f"{meta.get('graph')!r})", RERUN_EXPORT)
    problems = signature_problems(graph, *ort_signature(session))
    if problems:
        raise UserError(f"{path} does not meet the {graph} contract: {'; '.join(problems)}", RERUN_EXPORT)
    missing = [key for key in INT_METADATA + ("model_fingerprint",) if key not in meta]
    if missing:
        raise UserError(f"{path} lacks metadata {', '.join(missing)}", RERUN_EXPORT)
    try:
        values = {key: int(meta[key]) for key in INT_METADATA}
    except ValueError as exc:
        raise UserError(f"{path} has non-integer metadata ({exc})", RERUN_EXPORT) from exc
    problem = metadata_problem(values)
    if problem:
        raise UserError(f"{path} has impossible metadata: {problem}", RERUN_EXPORT)
    return {**meta, **values}


def metadata_problem(values: dict[str, int]) -> str | None:
    """What is wrong with a graph's int metadata, as the runtime's arithmetic uses it (None if
    nothing): rates and sizes positive, sample_rate = hop_length x frame_rate (frames <-> samples),
    the contract's codebooks and vocabulary, the mask id the vocabulary's last entry (the codes
    are [0, mask id): request.check_prompt)."""
    for key in ("sample_rate", "hop_length", "frame_rate"):
        if values[key] <= 0:
            return f"{key}={values[key]} (must be > 0)"
    if values["sample_rate"] != values["hop_length"] * values["frame_rate"]:
        return (f"sample_rate={values['sample_rate']} is not hop_length x frame_rate = "
                f"{values['hop_length']} x {values['frame_rate']}")
    if (values["num_codebooks"], values["audio_vocab_size"]) != (NUM_CODEBOOKS, AUDIO_VOCAB_SIZE):
        return (f"num_codebooks={values['num_codebooks']}, audio_vocab_size={values['audio_vocab_size']} (the graphs "
                f"take {NUM_CODEBOOKS} and {AUDIO_VOCAB_SIZE})")
    if values["audio_mask_id"] != values["audio_vocab_size"] - 1:
        return f"audio_mask_id={values['audio_mask_id']} is not the vocabulary's last id {values['audio_vocab_size'] - 1}"
    return None


def transformer_path(onnx_dir: Path, variant: str) -> Path:
    """The transformer graph of `variant`; a missing variant is a UserError naming those present."""
    path = variant_path(onnx_dir, variant)
    if variant != FP32_VARIANT and not path.is_file():
        present = ", ".join(variants_present(onnx_dir)) or "none"
        raise UserError(f"the export in {onnx_dir} has no transformer variant {variant!r} (present: {present})",
                        f"run quantize_omnivoice.py --variants {variant}")
    return path


class OmniVoiceOnnx:
    """An OmniVoice export loaded for generation. Build it with `from_dir`."""

    # The chunking stream() uses unless generation_config says otherwise. Upstream chunks only
    # texts estimated over 30 s, into 15 s pieces (made for batch quality, not latency); a stream
    # wants its first audio after about one sentence, so texts over STREAM_CHUNK_SECONDS are cut
    # into pieces of about that length (sentences, merged up to it; see docs in gen.stream).
    STREAM_CHUNK_DEFAULTS: dict[str, Any] = {"audio_chunk_duration": 3.0, "audio_chunk_threshold": 3.0}

    def __init__(self, onnx_dir: Path, provider: str = "cpu", threads: int | None = None,
                 resident_codecs: bool = False, variant: str | None = None, verify: bool = True) -> None:
        if not isinstance(onnx_dir, (str, os.PathLike)):
            raise UserError(f"onnx_dir must be a path, got {type(onnx_dir).__name__}",
                            "pass the folder export_omnivoice.py wrote")
        if not isinstance(provider, str):
            raise UserError(f"provider must be a string, got {type(provider).__name__}",
                            f"pass one of {', '.join(PROVIDERS)}")
        threads = request.check_threads(threads)
        if not isinstance(resident_codecs, bool):
            raise UserError(f"resident_codecs must be True or False, got {resident_codecs!r:.40}", "pass a bool")
        if variant is not None and not (isinstance(variant, str) and VARIANT_NAME.fullmatch(variant)):
            raise UserError(f"variant must be a variant's name (a folder of the export), got {variant!r:.60}",
                            f"pass one of {', '.join(variants_present(Path(onnx_dir))) or 'fp32'}, or None")
        verify = integrity.verify_requested(verify)
        onnx_dir = Path(onnx_dir)
        if not onnx_dir.is_dir():
            raise UserError(f"export folder not found: {onnx_dir}", "pass the folder export_omnivoice.py wrote")
        self.onnx_dir = onnx_dir
        self.variant = default_variant(onnx_dir, provider) if variant is None else variant
        path = transformer_path(onnx_dir, self.variant)
        if verify:  # before anything is loaded: a damaged sidecar loads, and runs
            integrity.verify_bundle(onnx_dir, self.variant)
        self.runtime_config = load_runtime_config(onnx_dir)
        self.tokenizer = TextTokenizer.from_dir(onnx_dir)
        variant_fix = RERUN_EXPORT if self.variant == FP32_VARIANT else f"run quantize_omnivoice.py --variants {self.variant}"
        self.transformer = make_session(path, provider, threads, arena=TRANSFORMER_ARENA, fix=variant_fix)
        self.metadata = graph_metadata(self.transformer, path, "transformer")
        if self.metadata.get("variant", FP32_VARIANT) != self.variant:
            raise UserError(f"{path} is variant {self.metadata.get('variant', FP32_VARIANT)!r}, not "
                            f"{self.variant!r}", f"run quantize_omnivoice.py --variants {self.variant}")
        self.codecs = CodecSessions(onnx_dir, provider, threads, resident_codecs, self.variant)
        for name in ("encoder", "decoder"):
            # Opened once here (then released unless resident) so a foreign graph fails now, not
            # after the whole transformer loop.
            session = self.codecs.held.get(name) or self.codecs.open(name)
            codec_meta = graph_metadata(session, self.codecs.paths[name], name)
            if codec_meta.get("variant", FP32_VARIANT) not in (FP32_VARIANT, self.variant):
                raise UserError(f"{self.codecs.paths[name]} is variant {codec_meta['variant']!r}'s {name}, not "
                                f"{self.variant!r}'s", f"run quantize_omnivoice.py --variants {self.variant}")
            if codec_meta["model_fingerprint"] != self.metadata["model_fingerprint"]:
                if self.variant != FP32_VARIANT:  # the codecs are the export's own: the variant is the stranger
                    raise UserError(f"{path} was made from another export (model "
                                    f"{self.metadata['model_fingerprint'][:16]}; this export's graphs are of "
                                    f"{codec_meta['model_fingerprint'][:16]})", variant_fix)
                raise UserError(f"{self.codecs.paths[name]} belongs to another export (model "
                                f"{codec_meta['model_fingerprint'][:16]}, the transformer's is "
                                f"{self.metadata['model_fingerprint'][:16]})", RERUN_EXPORT)
            differ = [key for key in INT_METADATA if codec_meta[key] != self.metadata[key]]
            if differ:
                raise UserError(f"{self.codecs.paths[name]} says {differ[0]}={codec_meta[differ[0]]} but {path} says "
                                f"{self.metadata[differ[0]]}", RERUN_EXPORT)
        model_config = self.runtime_config["model"]  # what a port reads instead of graph metadata
        differ = [key for key in ("sample_rate", "hop_length", "frame_rate", "model_fingerprint")
                  if str(model_config[key]) != str(self.metadata[key])]
        if differ:
            raise UserError(f"{onnx_dir / RUNTIME_CONFIG_FILE} says model.{differ[0]}={model_config[differ[0]]} but "
                            f"{path} says {self.metadata[differ[0]]}", RERUN_EXPORT)
        try:  # the export's own generation defaults, checked as a request's are
            gen.GenerationConfig.from_dict(None, self.runtime_config["generation"])
        except UserError as exc:
            raise UserError(f"{onnx_dir / RUNTIME_CONFIG_FILE}: its generation defaults are wrong ({exc.problem})",
                            RERUN_EXPORT) from exc
        if self.runtime_config["graphs"] != contract_table():
            raise UserError("runtime-config.json's graphs section is not this runtime's I/O contract "
                            "(omnivoice_onnx.contract)", RERUN_EXPORT)
        for key, meta_key in CONFIG_VS_METADATA.items():
            if self.runtime_config["model"][key] != self.metadata[meta_key]:
                raise UserError(f"runtime-config.json says {key}={self.runtime_config['model'][key]} but the graphs "
                                f"say {self.metadata[meta_key]}", RERUN_EXPORT)
        decoder_path = self.codecs.paths["decoder"]
        self.model = gen.Model(
            transformer=lambda ids, audio_mask, attention: finite_output(
                run_split(self.transformer, ids, audio_mask, attention), "transformer", path),
            encode=lambda wav: self.codecs.run("encoder", {"input_values": wav})["audio_codes"],
            decode=lambda codes: finite_output(self.codecs.run("decoder", {"audio_codes": codes})["audio_values"],
                                               "decoder", decoder_path),
            tokenizer=self.tokenizer, runtime_config=self.runtime_config,
            sample_rate=self.metadata["sample_rate"], hop_length=self.metadata["hop_length"],
            frame_rate=self.metadata["frame_rate"], num_codebooks=self.metadata["num_codebooks"],
            mask_id=self.metadata["audio_mask_id"])

    @classmethod
    def from_dir(cls, onnx_dir: str | os.PathLike, provider: str = "cpu", threads: int | None = None,
                 resident_codecs: bool = False, variant: str | None = None, verify: bool = True) -> "OmniVoiceOnnx":
        """Load an export folder. provider: one of sessions.PROVIDERS ("cpu"; "cuda-fp32", "cuda-tf32";
        "openvino-bf16", "openvino-f32": the transformer on OpenVINO, bits not fp32 MLAS's);
        threads: onnxruntime intra-op threads (None: its default; at most request.MAX_THREADS);
        resident_codecs: keep the encoder and decoder loaded between calls (a server) instead of
        opening them per call; variant: a transformer variant of quantize_omnivoice.py ("int8",
        "fp32-unmasked", ...; "fp32" the export's own; None: default_variant(), fp32-fused when
        step 5 made it, else fp32); verify: check every file loaded against export-report.json's
        sha256 first (omnivoice_onnx.integrity; False, or OMNIVOICE_VERIFY=0, for a bundle
        without a report)."""
        return cls(onnx_dir, provider, threads, resident_codecs, variant, verify)

    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    def generation_config(self, values: dict[str, Any] | None = None,
                          base: dict[str, Any] | None = None) -> gen.GenerationConfig:
        """upstream's defaults (from the export's runtime-config.json) overlaid with `base`, then
        `values` (checked: request.GenerationConfig.from_dict)."""
        defaults = {**self.runtime_config["generation"], **(base or {})}
        return gen.GenerationConfig.from_dict(values, defaults)

    def validate(self, text: str | list[str], language: Any = None, ref_text: Any = None, ref_audio: Any = None,
                 voice_clone_prompt: Any = None, instruct: Any = None, duration: Any = None, speed: Any = None,
                 generation_config: dict[str, Any] | None = None, seed: int | None = None) -> request.Request:
        """The request generate() would run, checked whole (types, values, the limits of
        omnivoice_onnx.request) without model work: the reference is loaded and prepared, not
        encoded. A UserError names the first problem; a server answers 400 with it, a batch
        refuses the line before any generation."""
        with request.memory_errors_as_user_errors():
            return request.validate(self.model, text, self.generation_config(generation_config), language=language,
                                    ref_text=ref_text, ref_audio=ref_audio, voice_clone_prompt=voice_clone_prompt,
                                    instruct=instruct, duration_s=duration, speed=speed, seed=seed)

    def create_voice_clone_prompt(self, ref_audio: Any, ref_text: str,
                                  preprocess_prompt: bool = True) -> gen.VoiceClonePrompt:
        """A reusable reference: ref_audio a file path or (waveform [T] or [C, T], sample_rate);
        ref_text its transcript (required: no speech recogniser here)."""
        if not isinstance(preprocess_prompt, bool):
            raise UserError(f"preprocess_prompt must be True or False, got {preprocess_prompt!r:.40}", "pass a bool")
        with request.memory_errors_as_user_errors():
            return gen.create_voice_clone_prompt(self.model, ref_audio, ref_text, preprocess_prompt)

    def generate(self, text: str | list[str], language: Any = None, ref_text: Any = None, ref_audio: Any = None,
                 voice_clone_prompt: Any = None, instruct: Any = None, duration: Any = None, speed: Any = None,
                 generation_config: dict[str, Any] | None = None, seed: int | None = None,
                 trace: gen.Trace | None = None, progress: Callable[[gen.Progress], None] | None = None,
                 cancel: threading.Event | None = None) -> list[np.ndarray]:
        """Speech for `text` (a string or a list: a batch): one float32 [T] array per text.

        Modes: voice cloning (ref_audio + ref_text, or a voice_clone_prompt), voice design
        (instruct, e.g. "female, low pitch"), or auto (neither). language, ref_text, ref_audio,
        instruct, duration (seconds) and speed take one value for all texts or a list, one per
        text. generation_config: a dict of OmniVoiceGenerationConfig fields. seed: as
        torch.manual_seed(seed) before upstream's generate(); None draws a fresh one (recorded
        in `trace.seed` when a Trace is passed). progress: called with a Progress after every
        unmasking step; cancel: when set, the call raises Cancelled before its next step.
        """
        config = self.generation_config(generation_config)
        seed = fresh_seed() if seed is None else check_seed(seed)
        check_trace(trace)
        rng = TorchCpuRng(seed)
        if trace is not None:
            trace.seed = seed
        with request.memory_errors_as_user_errors():
            audios = gen.generate(self.model, text, config, rng, language=language, ref_text=ref_text,
                                  ref_audio=ref_audio, voice_clone_prompt=voice_clone_prompt, instruct=instruct,
                                  duration_s=duration, speed=speed, trace=trace,
                                  monitor=gen.Monitor(progress=progress, cancel=cancel))
        if trace is not None:
            trace.words_drawn = rng.words_drawn
        return audios

    def stream(self, text: str, *, language: Any = None, ref_text: Any = None, ref_audio: Any = None,
               voice_clone_prompt: Any = None, instruct: Any = None, duration: Any = None, speed: Any = None,
               generation_config: dict[str, Any] | None = None, seed: int | None = None,
               progress: Callable[[gen.Progress], None] | None = None, cancel: threading.Event | None = None,
               trace: gen.Trace | None = None) -> Iterator[gen.AudioChunk]:
        """Speech for one `text`, yielded as AudioChunks as each chunk of upstream's chunking is decoded.

        The chunking is STREAM_CHUNK_DEFAULTS overlaid with `generation_config`: sentence-sized
        chunks, so the first audio comes after the first chunk rather than after the whole text.
        The tokens are generate()'s with that same generation_config and seed (upstream generates
        chunks one after another, 0, 1, ...). Audio: see gen.stream for what equals generate()
        sample for sample and what differs. Arguments as generate() (one text, not a batch).
        """
        config = self.generation_config(generation_config, base=self.STREAM_CHUNK_DEFAULTS)
        seed = fresh_seed() if seed is None else check_seed(seed)
        check_trace(trace)
        if trace is not None:
            trace.seed = seed
        with request.memory_errors_as_user_errors():
            yield from gen.stream(self.model, text, config, TorchCpuRng(seed), language=language, ref_text=ref_text,
                                  ref_audio=ref_audio, voice_clone_prompt=voice_clone_prompt, instruct=instruct,
                                  duration_s=duration, speed=speed, trace=trace,
                                  monitor=gen.Monitor(progress=progress, cancel=cancel))


def check_trace(trace: Any) -> None:
    if trace is not None and not isinstance(trace, gen.Trace):
        raise UserError(f"trace must be a Trace or None, got {type(trace).__name__} {trace!r:.40}",
                        "pass trace=Trace() (omnivoice_onnx.Trace) to record the call")
