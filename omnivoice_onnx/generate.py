"""The host side of upstream `OmniVoice.generate()`, torch-free: preprocessing, the iterative
unmasking loop, long-text chunking, decoding and post-processing.

Reproduces, from `omnivoice/models/omnivoice.py` (omnivoice 0.2.1), one function each:
    OmniVoice.generate                  generate
    OmniVoice._preprocess_all           preprocess
    OmniVoice.create_voice_clone_prompt create_voice_clone_prompt (ref_text required: no ASR here)
    GenerationTask.get_indices          split_short_long
    OmniVoice._generate_iterative       generate_iterative
    OmniVoice._generate_chunked         generate_chunked
    OmniVoice._decode_and_post_process  decode_and_post_process
    OmniVoiceGenerationConfig.from_dict GenerationConfig.from_dict (an unknown field is an error)

The three networks come in through `Model` (omnivoice_onnx.api builds it from the ONNX graphs).
Everything random is one `TorchCpuRng`, shared in upstream's order by the whole call: the short
items' batch first, then the long items' chunk batches, and within a batch, per step, per item
(see scoring.unmask_step). Nothing else draws: reference encoding, decoding and post-processing
are deterministic.

Subtle points, for a port:
- Items whose estimate exceeds int(audio_chunk_threshold * frame_rate) frames are chunked; all
  others run as ONE batch, whatever their lengths (the batch's rows are padded to the longest).
- The cond row of item i holds its whole prompt (length c_len); its target logits are the
  last t_len positions [c_len - t_len, c_len). The uncond row holds only the t_len target
  positions, at [0, t_len). Both rows are updated with the item's tokens after each step.
- A cell, once unmasked, never changes (the scores of unmasked cells are -inf), so the final
  tokens and the per-step cells say everything about a run (Trace).
- Chunked without a reference: chunk 0 of every item is generated first, then chunk 0's tokens
  and its raw text (no punctuation added) are the reference of the item's later chunks; their
  ref_rms stays None (the output is peak-normalised).
- A duration given for an item turns into a speed ratio (estimate / frames) that each chunk's
  own estimate is divided by.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnivoice_onnx import audio, duration, prompt, text
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.prompt import TextTokenizer
from omnivoice_onnx.rng import TorchCpuRng
from omnivoice_onnx.schedule import unmask_schedule
from omnivoice_onnx.scoring import unmask_step


@dataclass(frozen=True)
class GenerationConfig:
    """OmniVoiceGenerationConfig's fields (defaults come from the export's runtime-config.json,
    which records upstream's dataclass defaults)."""

    num_step: int  # unmasking steps (model calls)
    guidance_scale: float  # classifier-free guidance; 0 uses the cond logits alone
    t_shift: float  # time-step shift: small values unmask few cells early
    layer_penalty_factor: float  # codebook c's scores lose c * this: earlier codebooks first
    position_temperature: float  # Gumbel temperature of the cell choice (0: greedy)
    class_temperature: float  # Gumbel temperature of the token choice (0: argmax)
    denoise: bool  # put <|denoise|> in a cloning prompt
    preprocess_prompt: bool  # silence-trim the reference, end its text with punctuation
    postprocess_output: bool  # shorten long pauses of the output
    audio_chunk_duration: float  # seconds per chunk of a long text
    audio_chunk_threshold: float  # texts estimated longer than this (seconds) are chunked
    pad_duration: float  # silence added at each end of the output (seconds)
    fade_duration: float  # fade-in/out at the output's ends (seconds)

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None, defaults: dict[str, Any]) -> "GenerationConfig":
        """`defaults` overlaid with `values`; UserError for an unknown field or a bad value.

        Upstream's from_dict silently drops unknown keys; here a misspelt field is an error, so it
        never quietly runs with the default.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        values = dict(values or {})
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise UserError(f"unknown generation_config field(s) {', '.join(unknown)}",
                            f"use OmniVoiceGenerationConfig's fields: {', '.join(names)}")
        missing = [name for name in names if name not in defaults]
        if missing:
            raise UserError(f"the export's runtime-config.json lacks generation default(s) {', '.join(missing)}",
                            "re-run export_omnivoice.py")
        merged = {name: values.get(name, defaults[name]) for name in names}
        for f in dataclasses.fields(cls):
            merged[f.name] = _checked_field(f.name, f.type, merged[f.name])
        return cls(**merged)


def _checked_field(name: str, kind: str, value: Any) -> Any:
    """A config value of the field's type and range, or UserError."""
    fix = "see OmniVoiceGenerationConfig for the field's meaning"
    if kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise UserError(f"generation_config.{name} must be true or false, got {value!r}", fix)
        return bool(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
        raise UserError(f"generation_config.{name} must be a finite number, got {value!r}", fix)
    if kind == "int":
        if int(value) != value or value < 1:
            raise UserError(f"generation_config.{name} must be a positive integer, got {value!r}", fix)
        return int(value)
    if name == "t_shift" and value <= 0:
        raise UserError(f"generation_config.t_shift must be > 0, got {value!r}", fix)
    if name not in ("guidance_scale", "layer_penalty_factor") and value < 0:
        raise UserError(f"generation_config.{name} must be >= 0, got {value!r}", fix)
    return float(value)


@dataclass(frozen=True)
class AudioChunk:
    """One piece of a stream (OmniVoiceOnnx.stream): audio as soon as a chunk of the text is decoded."""

    samples: np.ndarray  # float32 [n] at sample_rate
    sample_rate: int
    index: int  # chunk index, 0-based
    count: int  # number of chunks of this text


@dataclass(frozen=True)
class Progress:
    """Where a generation is: step `step` of `steps` within chunk `chunk` of `chunks` (all 1-based).
    A text that is not chunked is one chunk."""

    chunk: int
    chunks: int
    step: int
    steps: int


class Cancelled(Exception):
    """Raised by generate()/stream() when the caller's cancel event is set; checked between
    unmasking steps (one transformer call is the longest wait)."""


@dataclass
class Monitor:
    """Progress reports and cancellation for one call: generate_iterative calls begin_chunk() once
    and before_step()/after_step() around each of its steps. `chunks` counts the call's
    generate_iterative runs (a batch of short texts is one, each chunk index of long texts one)."""

    progress: Callable[[Progress], None] | None = None  # called after each step
    cancel: Any = None  # a threading.Event (anything with is_set()); set -> Cancelled before the next step
    chunks: int = 1
    chunk: int = 0  # the current run, 1-based (0 before the first)

    def begin_chunk(self) -> None:
        self.chunk += 1

    def before_step(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled(f"cancelled before a step of chunk {self.chunk} of {self.chunks}")

    def after_step(self, step: int, steps: int) -> None:
        if self.progress is not None:
            self.progress(Progress(self.chunk, self.chunks, step, steps))


@dataclass
class VoiceClonePrompt:
    """A reusable cloning reference (upstream VoiceClonePrompt)."""

    ref_audio_tokens: np.ndarray  # [C, T] int64 codes of the prepared reference
    ref_text: str  # its transcript (punctuated when preprocess_prompt)
    ref_rms: float  # RMS of the reference before the level boost


@dataclass
class Model:
    """What the host side needs from an export: the three networks and their constants."""

    transformer: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]  # ids, audio_mask, attention -> logits
    encode: Callable[[np.ndarray], np.ndarray]  # input_values [1,1,960*Tc] f32 -> audio_codes [1,C,Tc] int64
    decode: Callable[[np.ndarray], np.ndarray]  # audio_codes [1,C,T] int64 -> audio_values [1,1,960*T] f32
    tokenizer: TextTokenizer
    runtime_config: dict[str, Any]  # runtime-config.json: languages, instruct data, defaults
    sample_rate: int
    hop_length: int
    frame_rate: int
    num_codebooks: int
    mask_id: int


@dataclass
class Task:
    """The preprocessed batch (upstream GenerationTask)."""

    texts: list[str]
    target_lens: list[int]
    langs: list[str | None]
    instructs: list[str | None]
    ref_texts: list[str | None]
    ref_audio_tokens: list[np.ndarray | None]
    ref_rms: list[float | None]
    speed: list[float] | None = None

    def slice(self, indices: Sequence[int]) -> "Task":
        """The items at `indices`, in that order (upstream slice_task)."""
        return Task(texts=[self.texts[i] for i in indices], target_lens=[self.target_lens[i] for i in indices],
                    langs=[self.langs[i] for i in indices], instructs=[self.instructs[i] for i in indices],
                    ref_texts=[self.ref_texts[i] for i in indices],
                    ref_audio_tokens=[self.ref_audio_tokens[i] for i in indices],
                    ref_rms=[self.ref_rms[i] for i in indices],
                    speed=[self.speed[i] for i in indices] if self.speed else None)


@dataclass
class IterativeTrace:
    """One generate_iterative call: its batch, schedule and, per step, the cells each item unmasked."""

    texts: list[str]
    ref_texts: list[str | None]
    target_lens: list[int]
    c_lens: list[int]
    prompt_ids: list[list[int]]  # per item: codebook-0 ids of its cond prompt before the audio part
    ref_frames: list[int]  # per item: reference frames in the prompt (0 without one)
    schedules: list[list[int]]
    cells: list[list[np.ndarray]] = field(default_factory=list)  # [step][item]: sorted flat cells (C*T index)
    tokens: list[np.ndarray] = field(default_factory=list)  # per item: final [C, T]


@dataclass
class Trace:
    """What a generate() call did, for tests and conformance vectors. Pass an empty Trace()."""

    seed: int | None = None
    words_drawn: int = 0  # MT19937 words the whole call consumed
    task: Task | None = None
    short_idx: list[int] = field(default_factory=list)
    long_idx: list[int] = field(default_factory=list)
    chunks: dict[int, list[str]] = field(default_factory=dict)  # long item -> its chunk texts
    iterations: list[IterativeTrace] = field(default_factory=list)
    results: list[np.ndarray | list[np.ndarray]] = field(default_factory=list)  # per item tokens (or chunks)


def _per_item(value: Any, batch_size: int, name: str, repeat: bool = True) -> list:
    """upstream _ensure_list: a list of 1 or batch_size values (or one value), repeated to the
    batch unless `repeat` is False; UserError for another length."""
    values = value if isinstance(value, list) else [value]
    if len(values) not in (1, batch_size):
        raise UserError(f"{name} has {len(values)} values for {batch_size} texts", f"pass one {name} or one per text")
    return values * batch_size if repeat and len(values) == 1 else values


def create_voice_clone_prompt(model: Model, ref_audio: Any, ref_text: str | None,
                              preprocess_prompt: bool = True) -> VoiceClonePrompt:
    """Load, prepare and encode a reference (create_voice_clone_prompt with ref_text given).

    Upstream transcribes a reference without ref_text with Whisper; this runtime has no ASR.
    """
    if ref_text is None:
        raise UserError("ref_text is required with ref_audio (this runtime has no speech recogniser)",
                        "pass the reference's transcript as ref_text")
    if not isinstance(ref_text, str):
        raise UserError(f"ref_text must be a string, got {type(ref_text).__name__}", "pass the transcript as str")
    wav = audio.load_reference(ref_audio, model.sample_rate, model.runtime_config["audio"])
    wav, ref_rms = audio.prepare_reference(wav, model.sample_rate, model.hop_length, model.runtime_config["audio"],
                                           preprocess=preprocess_prompt)
    tokens = model.encode(wav[np.newaxis])[0]
    if preprocess_prompt:
        ref_text = text.add_punctuation(ref_text, model.runtime_config["text"])
    return VoiceClonePrompt(ref_audio_tokens=tokens.astype(np.int64), ref_text=ref_text, ref_rms=ref_rms)


def preprocess(model: Model, texts: str | list[str], language: Any = None, ref_text: Any = None,
               ref_audio: Any = None, voice_clone_prompt: Any = None, instruct: Any = None,
               preprocess_prompt: bool = True, speed: Any = None, duration_s: Any = None) -> Task:
    """The batch upstream _preprocess_all builds: languages and instructs resolved, references
    encoded, target lengths estimated (duration overrides speed)."""
    text_list = [texts] if isinstance(texts, str) else texts
    if not isinstance(text_list, list) or not text_list or not all(isinstance(t, str) for t in text_list):
        raise UserError("text must be a non-empty string or a non-empty list of strings", "pass the text to speak")
    for i, item in enumerate(text_list):
        if not item.strip():
            raise UserError(f"text {i} is empty", "pass the text to speak")
    batch_size = len(text_list)
    config = model.runtime_config
    langs = [prompt.resolve_language(lang, config["languages"]) for lang in _per_item(language, batch_size, "language")]
    instructs = [prompt.resolve_instruct(item, prompt.instruct_use_zh(text_list[i], config["instruct"]),
                                         config["instruct"]) if item is not None else None
                 for i, item in enumerate(_per_item(instruct, batch_size, "instruct"))]

    if voice_clone_prompt is not None and (ref_text is not None or ref_audio is not None):
        # Upstream logs a warning and ignores ref_text/ref_audio.
        raise UserError("voice_clone_prompt was given together with ref_text/ref_audio",
                        "pass either a voice_clone_prompt or ref_audio + ref_text")
    if voice_clone_prompt is None and ref_audio is not None:
        ref_texts = _per_item(ref_text, batch_size, "ref_text", repeat=False)
        ref_audios = _per_item(ref_audio, batch_size, "ref_audio", repeat=False)
        if len(ref_texts) != len(ref_audios):
            # Upstream makes len(ref_text) prompts from the first ref_audios: a silent mix-up.
            raise UserError(f"{len(ref_audios)} ref_audio for {len(ref_texts)} ref_text",
                            "pass one ref_text per ref_audio")
        voice_clone_prompt = [create_voice_clone_prompt(model, a, t, preprocess_prompt)
                              for a, t in zip(ref_audios, ref_texts)]
    elif ref_text is not None:  # upstream ignores a ref_text without ref_audio
        raise UserError("ref_text was given without ref_audio", "pass ref_audio too, or drop ref_text")
    prompts = _per_item(voice_clone_prompt, batch_size, "voice_clone_prompt")
    if prompts[0] is not None:
        ref_texts = [p.ref_text for p in prompts]
        ref_tokens = [p.ref_audio_tokens for p in prompts]
        ref_rms = [p.ref_rms for p in prompts]
    else:
        ref_texts, ref_tokens, ref_rms = [None] * batch_size, [None] * batch_size, [None] * batch_size

    target_lens, speed_list = duration.target_lengths(
        text_list, ref_texts, [t.shape[-1] if t is not None else None for t in ref_tokens], speed, duration_s,
        model.frame_rate, config["duration"])
    return Task(texts=text_list, target_lens=target_lens, langs=langs, instructs=instructs, ref_texts=ref_texts,
                ref_audio_tokens=ref_tokens, ref_rms=ref_rms, speed=speed_list)


def split_short_long(target_lens: Sequence[int], config: GenerationConfig, frame_rate: int) -> tuple[list[int], list[int]]:
    """(short, long) item indices: long ones exceed int(audio_chunk_threshold * frame_rate) frames."""
    threshold = int(config.audio_chunk_threshold * frame_rate)
    return ([i for i, n in enumerate(target_lens) if n <= threshold],
            [i for i, n in enumerate(target_lens) if n > threshold])


def generate_iterative(model: Model, task: Task, config: GenerationConfig, rng: TorchCpuRng,
                       trace: Trace | None = None, monitor: Monitor | None = None) -> list[np.ndarray]:
    """num_step model calls, each unmasking a scheduled number of cells per item -> tokens [C, T_i]."""
    monitor = monitor or Monitor()
    monitor.begin_chunk()
    batch, codebooks, mask_id = len(task.texts), model.num_codebooks, model.mask_id
    items = [prompt.build_item_inputs(model.tokenizer, task.texts[i], task.target_lens[i], task.ref_texts[i],
                                      task.ref_audio_tokens[i], task.langs[i], task.instructs[i], config.denoise,
                                      codebooks, mask_id, model.runtime_config) for i in range(batch)]
    input_ids, audio_mask, attention_mask, c_lens = prompt.batch_inputs(items, task.target_lens, codebooks, mask_id)
    tokens = [np.full((1, codebooks, t_len), mask_id, dtype=np.int64) for t_len in task.target_lens]
    schedules = [unmask_schedule(t_len, codebooks, config.num_step, config.t_shift) for t_len in task.target_lens]
    record = None
    if trace is not None:
        ref_frames = [t.shape[-1] if t is not None else 0 for t in task.ref_audio_tokens]
        record = IterativeTrace(
            texts=list(task.texts), ref_texts=list(task.ref_texts), target_lens=list(task.target_lens),
            c_lens=c_lens, schedules=schedules, ref_frames=ref_frames,
            prompt_ids=[ids[0, 0, :c_len - t_len - r].tolist()
                        for (ids, _), c_len, t_len, r in zip(items, c_lens, task.target_lens, ref_frames)])
        trace.iterations.append(record)

    for step in range(config.num_step):
        monitor.before_step()
        logits = model.transformer(input_ids, audio_mask, attention_mask)
        step_cells = []
        for i in range(batch):
            k = schedules[i][step]
            if k <= 0:
                step_cells.append(np.zeros(0, dtype=np.int64))
                continue
            c_len, t_len = c_lens[i], task.target_lens[i]
            tokens[i], cells = unmask_step(
                logits[i:i + 1, :, c_len - t_len:c_len], logits[batch + i:batch + i + 1, :, :t_len], tokens[i], k,
                guidance_scale=config.guidance_scale, class_temperature=config.class_temperature,
                layer_penalty_factor=config.layer_penalty_factor,
                position_temperature=config.position_temperature, mask_id=mask_id, rng=rng)
            input_ids[i, :, c_len - t_len:c_len] = tokens[i][0]
            input_ids[batch + i, :, :t_len] = tokens[i][0]
            step_cells.append(cells)
        if record is not None:
            record.cells.append(step_cells)
        monitor.after_step(step + 1, config.num_step)
    results = [t[0] for t in tokens]
    if record is not None:
        record.tokens = [t.copy() for t in results]
    return results


def chunk_texts(model: Model, task: Task, config: GenerationConfig) -> list[list[str]]:
    """Per long item, its text split at punctuation into ~audio_chunk_duration pieces."""
    all_chunks = []
    for i in range(len(task.texts)):
        chunk_len = text.text_chunk_len(task.texts[i], task.target_lens[i], config.audio_chunk_duration,
                                        model.frame_rate)
        text_rules = model.runtime_config["text"]
        chunks = text.chunk_text_punctuation(task.texts[i], chunk_len, text_rules, text_rules["min_chunk_len"])
        if not chunks:
            raise UserError(f"text {task.texts[i][:40]!r} gives no chunk to speak", "pass text with words in it")
        all_chunks.append(chunks)
    return all_chunks


def iter_chunked(model: Model, task: Task, config: GenerationConfig, rng: TorchCpuRng, all_chunks: list[list[str]],
                 trace: Trace | None = None, monitor: Monitor | None = None
                 ) -> Iterator[tuple[int, dict[int, np.ndarray]]]:
    """Long items' chunks (`all_chunks`, from chunk_texts), generated chunk index by chunk index as
    batches, in upstream _generate_chunked's order: yields (chunk index, {item: its tokens [C, T]})
    as each index is done, so a stream can decode chunk 0 while later ones are still to come."""
    batch = len(task.texts)
    has_ref = [t is not None for t in task.ref_audio_tokens]
    if any(has_ref) and not all(has_ref):
        raise UserError("long texts (chunked) in one call must all have a reference or all have none",
                        "generate them in separate calls")
    first: dict[int, np.ndarray] = {}

    def run_batch(indices: list[int], texts: list[str], ref_audios: list, ref_texts: list) -> dict[int, np.ndarray]:
        target_lens = [duration.estimate_target_tokens(texts[j], ref_texts[j],
                                                       ref_audios[j].shape[-1] if ref_audios[j] is not None else None,
                                                       model.runtime_config["duration"],
                                                       speed=task.speed[i] if task.speed else 1.0)
                       for j, i in enumerate(indices)]
        sub_task = Task(texts=texts, target_lens=target_lens, langs=[task.langs[i] for i in indices],
                        instructs=[task.instructs[i] for i in indices], ref_texts=ref_texts,
                        ref_audio_tokens=ref_audios, ref_rms=[task.ref_rms[i] for i in indices],
                        speed=[task.speed[i] for i in indices] if task.speed else None)
        return dict(zip(indices, generate_iterative(model, sub_task, config, rng, trace, monitor)))

    for ci in range(max(len(c) for c in all_chunks)):
        indices = [i for i in range(batch) if ci < len(all_chunks[i])]
        texts = [all_chunks[i][ci] for i in indices]
        if all(has_ref):
            done = run_batch(indices, texts, [task.ref_audio_tokens[i] for i in indices],
                             [task.ref_texts[i] for i in indices])
        elif ci == 0:
            done = first = run_batch(indices, texts, [None] * len(indices), [None] * len(indices))
        else:  # without a reference, chunk 0's tokens and raw text are the later chunks' reference
            done = run_batch(indices, texts, [first[i] for i in indices], [all_chunks[i][0] for i in indices])
        yield ci, done


def generate_chunked(model: Model, task: Task, config: GenerationConfig, rng: TorchCpuRng,
                     trace: Trace | None = None, item_ids: Sequence[int] | None = None,
                     monitor: Monitor | None = None) -> list[list[np.ndarray]]:
    """Long items, text split at punctuation into ~audio_chunk_duration pieces, generated chunk
    index by chunk index as batches -> per item, its chunks' tokens. `item_ids` (the items'
    indices in the whole call) only label the trace."""
    all_chunks = chunk_texts(model, task, config)
    if trace is not None:
        for i, chunks in enumerate(all_chunks):
            trace.chunks[item_ids[i] if item_ids is not None else i] = chunks
    results: list[list[np.ndarray]] = [[] for _ in task.texts]
    for _, done in iter_chunked(model, task, config, rng, all_chunks, trace, monitor):
        for i, tokens in done.items():
            results[i].append(tokens)
    return results


def decode(model: Model, tokens: np.ndarray | list[np.ndarray]) -> np.ndarray:
    """Tokens [C, T] -> the decoder's audio [1, 960*T] float32; a list of chunks' tokens is decoded
    chunk by chunk and cross-faded (audio.cross_fade_chunks)."""
    if isinstance(tokens, list):
        return audio.cross_fade_chunks([model.decode(t[np.newaxis])[0] for t in tokens], model.sample_rate,
                                       model.runtime_config["audio"])
    return model.decode(tokens[np.newaxis])[0]


def decode_and_post_process(model: Model, tokens: np.ndarray | list[np.ndarray], ref_rms: float | None,
                            config: GenerationConfig) -> np.ndarray:
    """Tokens [C, T] (or a list of chunks' tokens, cross-faded) -> post-processed audio [T'] float32."""
    waveform = audio.post_process(decode(model, tokens), ref_rms, model.sample_rate, model.runtime_config["audio"],
                                  postprocess_output=config.postprocess_output,
                                  pad_duration=config.pad_duration, fade_duration=config.fade_duration)
    return waveform[0]


def generate(model: Model, texts: str | list[str], config: GenerationConfig, rng: TorchCpuRng, language: Any = None,
             ref_text: Any = None, ref_audio: Any = None, voice_clone_prompt: Any = None, instruct: Any = None,
             duration_s: Any = None, speed: Any = None, trace: Trace | None = None,
             monitor: Monitor | None = None) -> list[np.ndarray]:
    """upstream generate() after its config handling: one audio [T] float32 per text."""
    task = preprocess(model, texts, language=language, ref_text=ref_text, ref_audio=ref_audio,
                      voice_clone_prompt=voice_clone_prompt, instruct=instruct,
                      preprocess_prompt=config.preprocess_prompt, speed=speed, duration_s=duration_s)
    short_idx, long_idx = split_short_long(task.target_lens, config, model.frame_rate)
    monitor = monitor or Monitor()
    long_task = task.slice(long_idx)
    monitor.chunks = (1 if short_idx else 0) + (max(map(len, chunk_texts(model, long_task, config))) if long_idx
                                                  else 0)
    results: list[Any] = [None] * len(task.texts)
    if short_idx:
        for i, tokens in zip(short_idx, generate_iterative(model, task.slice(short_idx), config, rng, trace, monitor)):
            results[i] = tokens
    if long_idx:
        for i, chunks in zip(long_idx, generate_chunked(model, long_task, config, rng, trace, long_idx, monitor)):
            results[i] = chunks
    if trace is not None:
        trace.task, trace.short_idx, trace.long_idx, trace.results = task, short_idx, long_idx, results
    return [decode_and_post_process(model, results[i], task.ref_rms[i], config) for i in range(len(task.texts))]


def stream(model: Model, text_: str, config: GenerationConfig, rng: TorchCpuRng, language: Any = None,
           ref_text: Any = None, ref_audio: Any = None, voice_clone_prompt: Any = None, instruct: Any = None,
           duration_s: Any = None, speed: Any = None, trace: Trace | None = None,
           monitor: Monitor | None = None) -> Iterator[AudioChunk]:
    """One text's audio as AudioChunks (skeleton: the whole text as one chunk)."""
    if not isinstance(text_, str):
        raise UserError("stream() speaks one text (a str)", "call generate() for a batch")
    audio = generate(model, text_, config, rng, language=language, ref_text=ref_text, ref_audio=ref_audio,
                     voice_clone_prompt=voice_clone_prompt, instruct=instruct, duration_s=duration_s, speed=speed,
                     trace=trace, monitor=monitor)[0]
    yield AudioChunk(samples=audio, sample_rate=model.sample_rate, index=0, count=1)
