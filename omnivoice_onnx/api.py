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
decoder too; omnivoice_onnx.bundle.Folder). Its metadata must name the variant and the
codecs' model. Without a name the runtime takes bundle.default_variant(): fp32-fused when step 5 made
it for this export (the faithful graph's logits, bit for bit on every CPU call measured, and
faster), else the faithful fp32 graph, which stays the reference every verdict is made on.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from omnivoice_onnx.bundle import RERUN_EXPORT, TOKENIZER_FILE, Bundle, variant_fix
from omnivoice_onnx.core import generate as gen
from omnivoice_onnx.core import request
from omnivoice_onnx.core.prompt import TextTokenizer
from omnivoice_onnx.core.shapes import (
    REQUEST_FIELDS,
    AudioChunk,
    GenerationConfig,
    Model,
    Progress,
    Request,
    RequestKeywords,
    VoiceClonePrompt,
)
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.limits import check_sentence_silence, check_threads, memory_errors_as_user_errors
from omnivoice_onnx.sessions import PROVIDERS, TRANSFORMER_ARENA, CodecSessions, finite_output, make_session, run_split

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11


class OmniVoiceOnnx:
    """An OmniVoice export loaded for generation. Build it with `from_dir`."""

    # The chunking stream() uses unless generation_config says otherwise. Upstream chunks only
    # texts estimated over 30 s, into 15 s pieces (made for batch quality, not latency); a stream
    # wants its first audio after about one sentence, so texts over STREAM_CHUNK_SECONDS are cut
    # into pieces of about that length (sentences, merged up to it; see docs in gen.stream).
    STREAM_CHUNK_DEFAULTS: dict[str, Any] = {"audio_chunk_duration": 3.0, "audio_chunk_threshold": 3.0}

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        provider: str = "cpu",
        threads: int | None = None,
        resident_codecs: bool = False,
        variant: str | None = None,
        verify: bool = True,
    ) -> None:
        if not isinstance(provider, str):
            raise UserError(
                f"provider must be a string, got {type(provider).__name__}", f"pass one of {', '.join(PROVIDERS)}"
            )
        threads = check_threads(threads)
        if not isinstance(resident_codecs, bool):
            raise UserError(f"resident_codecs must be True or False, got {resident_codecs!r:.40}", "pass a bool")
        self.bundle = Bundle.open(model_dir, variant, verify, provider)  # every file it loads verified first
        self.model_dir = self.bundle.dir
        self.variant = self.bundle.variant
        path = self.bundle.transformer_path()
        self.runtime_config = self.bundle.runtime_config
        self.tokenizer = TextTokenizer.from_file(self.bundle.tokenizer_path, self.bundle.asset(TOKENIZER_FILE))
        self.transformer = make_session(path, provider, threads, arena=TRANSFORMER_ARENA, fix=variant_fix(self.variant))
        self.bundle.check_loaded(path)  # the session holds the bytes that were hashed
        self.metadata = self.bundle.transformer_metadata(self.transformer)
        self.codecs = CodecSessions(
            self.bundle.codec_paths(self.variant), provider, threads, resident_codecs, self.bundle.check_loaded
        )
        # Each codec opened once here (then released unless resident), so a foreign graph fails
        # now, not after the whole transformer loop; the bundle checks the graphs agree.
        self.bundle.check_graphs(self.metadata, lambda name: self.codecs.held.get(name) or self.codecs.open(name))
        try:  # the export's own generation defaults, checked as a request's are
            request.generation_config(None, self.runtime_config["generation"])
        except UserError as exc:
            raise UserError(
                f"{self.bundle.runtime_config_path}: its generation defaults are wrong ({exc.problem})", RERUN_EXPORT
            ) from exc
        decoder_path = self.codecs.paths["decoder"]
        self.model = Model(
            transformer=lambda ids, audio_mask, attention: finite_output(
                self._verified_result(run_split(self.transformer, ids, audio_mask, attention), path),
                "transformer",
                path,
            ),
            encode=lambda wav: self.codecs.run("encoder", {"input_values": wav})["audio_codes"],
            decode=lambda codes: finite_output(
                self.codecs.run("decoder", {"audio_codes": codes})["audio_values"], "decoder", decoder_path
            ),
            tokenizer=self.tokenizer,
            runtime_config=self.runtime_config,
            sample_rate=self.metadata["sample_rate"],
            hop_length=self.metadata["hop_length"],
            frame_rate=self.metadata["frame_rate"],
            num_codebooks=self.metadata["num_codebooks"],
            mask_id=self.metadata["audio_mask_id"],
        )

    def _verified_result(self, result: np.ndarray, graph: Path) -> np.ndarray:
        """`result` of a call of `graph`'s session, once its files are seen unchanged since their hash:
        onnxruntime maps a graph's external data file, so a write into it while a session holds it
        would reach the weights; such a call is refused, never returned (Bundle.check_loaded)."""
        self.bundle.check_loaded(graph)
        return result

    @classmethod
    def from_dir(
        cls,
        model_dir: str | os.PathLike[str] | None = None,
        provider: str = "cpu",
        threads: int | None = None,
        resident_codecs: bool = False,
        variant: str | None = None,
        verify: bool = True,
        *,
        onnx_dir: str | os.PathLike[str] | None = None,
    ) -> OmniVoiceOnnx:
        """Load an export folder (`model_dir`, the name the CLI's --model-dir uses; `onnx_dir` is
        its older spelling, kept as an alias). provider: one of sessions.PROVIDERS ("cpu"; "cuda-fp32",
        "cuda-tf32"; "openvino-bf16", "openvino-f32": the transformer on OpenVINO, bits not fp32 MLAS's);
        threads: onnxruntime intra-op threads (None: its default; at most limits.MAX_THREADS);
        resident_codecs: keep the encoder and decoder loaded between calls (a server) instead of
        opening them per call; variant: a transformer variant of quantize_omnivoice.py ("int8",
        "fp32-unmasked", ...; "fp32" the export's own; None: bundle.default_variant(), fp32-fused when
        step 5 made it, else fp32); verify: check every file loaded against export-report.json's
        sha256 first (omnivoice_onnx.bundle; False, or OMNIVOICE_VERIFY=0, for a bundle
        without a report; files hashed before and unchanged since are not hashed again unless
        OMNIVOICE_VERIFY=full)."""
        folder = model_dir if onnx_dir is None else onnx_dir
        if folder is None or (model_dir is not None and onnx_dir is not None):
            raise UserError(
                "from_dir needs the export folder once: model_dir (or its alias onnx_dir)", 'pass from_dir("onnx")'
            )
        return cls(folder, provider, threads, resident_codecs, variant, verify)

    @property
    def onnx_dir(self) -> Path:
        """The export folder: model_dir's older name, kept as an alias."""
        return self.model_dir

    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    def generation_config(
        self, values: dict[str, Any] | None = None, base: dict[str, Any] | None = None
    ) -> GenerationConfig:
        """upstream's defaults (from the export's runtime-config.json) overlaid with `base`, then
        `values` (checked: request.generation_config)."""
        defaults = {**self.runtime_config["generation"], **(base or {})}
        return request.generation_config(values, defaults)

    def validate(self, text: str | list[str], *, stream: bool = False, **keywords: Unpack[RequestKeywords]) -> Request:
        """The request generate() (or, with `stream`, stream()) runs, checked whole (types, values,
        the limits of omnivoice_onnx.limits) without model work: the reference is loaded and
        prepared, not encoded; a seed of None is drawn now (Request.seed). Pass the Request to
        generate()/stream(): it is not checked again. A UserError names the first problem; a
        server answers 400 with it, a batch refuses the line before any generation.
        stream: stream()'s chunking defaults (STREAM_CHUNK_DEFAULTS) under generation_config, and
        one text. An instruct in prose has the vocabulary's words applied and the rest ignored
        (Request.instruct_readings says which); strict_instructions refuses it instead. A
        sentence_silence above 0 asks for pauses between sentence-sized chunks, so generate() then
        chunks as stream() does (STREAM_CHUNK_DEFAULTS under generation_config) and the whole clip
        is the stream's tokens. The keywords (shapes.RequestKeywords) are generate()'s."""
        request.check_keywords(keywords, "validate")
        if stream and not isinstance(text, str):
            raise UserError("stream() speaks one text (a str)", "call generate() for a batch of texts")
        pauses = check_sentence_silence(keywords.get("sentence_silence")) > 0
        config = self.generation_config(
            keywords.get("generation_config"), base=self.STREAM_CHUNK_DEFAULTS if stream or pauses else None
        )
        fields = {name: keywords.get(name) for name in REQUEST_FIELDS}
        fields["duration_s"] = fields.pop("duration")
        with memory_errors_as_user_errors():
            return request.validate(self.model, text, config, **fields)

    def create_voice_clone_prompt(
        self, ref_audio: Any, ref_text: str, preprocess_prompt: bool = True
    ) -> VoiceClonePrompt:
        """A reusable reference: ref_audio a file path or (waveform [T] or [C, T], sample_rate);
        ref_text its transcript (required: upstream transcribes a reference without one with
        Whisper; there is no speech recogniser here). Loaded and prepared as a request's reference
        is (request.load_reference), then encoded (generate.encode_reference)."""
        if not isinstance(preprocess_prompt, bool):
            raise UserError(f"preprocess_prompt must be True or False, got {preprocess_prompt!r:.40}", "pass a bool")
        with memory_errors_as_user_errors():
            reference = request.load_reference(self.model, ref_audio, ref_text, preprocess_prompt)
            return gen.encode_reference(self.model, reference)

    def generate(
        self,
        text: str | list[str] | Request,
        *,
        trace: gen.Trace | None = None,
        progress: Callable[[Progress], None] | None = None,
        cancel: threading.Event | None = None,
        **keywords: Unpack[RequestKeywords],
    ) -> list[np.ndarray]:
        """Speech for `text` (a string or a list: a batch): one float32 [T] array per text.

        `text` may be a Request from validate() instead, which runs as it is (no keyword then);
        the keywords are a convenience that builds it (validate(text, ...)).
        Modes: voice cloning (ref_audio + ref_text, or a voice_clone_prompt), voice design
        (instruct, e.g. "female, low pitch"), or auto (neither). language, ref_text, ref_audio,
        instruct, duration (seconds) and speed take one value for all texts or a list, one per
        text. generation_config: a dict of OmniVoiceGenerationConfig fields. seed: as
        torch.manual_seed(seed) before upstream's generate(); None draws a fresh one (recorded
        in `trace.seed` when a Trace is passed). sentence_silence: seconds of silence added
        between a text's sentence-sized chunks (piper's --sentence-silence; a text of one chunk
        gets none); volume: a linear gain on the samples (piper's --volume; not clipped in these
        floats, clipped to [-1, 1] in every 16-bit output). progress: called with a Progress after every
        unmasking step; cancel: when set, the call raises Cancelled before its next step.
        """
        req = self._request(text, keywords, stream=False, where="generate")
        check_trace(trace)
        with memory_errors_as_user_errors():
            return gen.generate(self.model, req, trace, gen.Monitor(progress=progress, cancel=cancel))

    def stream(
        self,
        text: str | Request,
        *,
        trace: gen.Trace | None = None,
        progress: Callable[[Progress], None] | None = None,
        cancel: threading.Event | None = None,
        **keywords: Unpack[RequestKeywords],
    ) -> Iterator[AudioChunk]:
        """Speech for one `text`, yielded as AudioChunks as each chunk of upstream's chunking is decoded.

        The chunking is STREAM_CHUNK_DEFAULTS overlaid with `generation_config`: sentence-sized
        chunks, so the first audio comes after the first chunk rather than after the whole text.
        The tokens are generate()'s with that same generation_config and seed (upstream generates
        chunks one after another, 0, 1, ...). Audio: see gen.stream for what equals generate()
        sample for sample and what differs. Arguments as generate() (one text, not a batch); a
        Request from validate(..., stream=True) runs as it is.
        """
        req = self._request(text, keywords, stream=True, where="stream")
        check_trace(trace)
        with memory_errors_as_user_errors():
            yield from gen.stream(self.model, req, trace, gen.Monitor(progress=progress, cancel=cancel))

    def _request(self, text: Any, keywords: RequestKeywords, stream: bool, where: str) -> Request:
        """`text` when it is a validated Request (then no keyword may be given: they would be
        ignored), else validate(text, **keywords): one validation per call either way."""
        request.check_keywords(keywords, where)
        if not isinstance(text, Request):
            return self.validate(text, **keywords, stream=stream)
        given = sorted(name for name, value in keywords.items() if value is not None)
        if given:
            raise UserError(
                f"{', '.join(given)} given with a validated Request (they would be ignored)",
                "pass them to validate() when building the Request, or pass the text instead",
            )
        return text


def check_trace(trace: Any) -> None:
    if trace is not None and not isinstance(trace, gen.Trace):
        raise UserError(
            f"trace must be a Trace or None, got {type(trace).__name__} {trace!r:.40}",
            "pass trace=Trace() (omnivoice_onnx.Trace) to record the call",
        )
