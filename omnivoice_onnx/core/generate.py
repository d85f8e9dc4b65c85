"""The host side of upstream `OmniVoice.generate()`, torch-free: preprocessing, the iterative
unmasking loop, long-text chunking, decoding and post-processing.

Reproduces, from `omnivoice/models/omnivoice.py` (omnivoice 0.2.1), one function each:
    OmniVoice.generate                  generate
    OmniVoice._preprocess_all           request.validate (once per request), then task_of
    OmniVoice.create_voice_clone_prompt request.load_reference, then encode_reference (ref_text
                                        required: no ASR here; OmniVoiceOnnx.create_voice_clone_prompt)
    GenerationTask.get_indices          plan.split_short_long
    OmniVoice._generate_iterative       generate_iterative
    OmniVoice._generate_chunked         generate_chunked
    OmniVoice._decode_and_post_process  decode_and_post_process
    OmniVoiceGenerationConfig.from_dict request.generation_config (an unknown field is an error)

The three networks come in through `Model` (shapes.py; omnivoice_onnx.api builds it from the ONNX graphs).
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

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnivoice_onnx.core import audio, plan, prompt
from omnivoice_onnx.core.rng import TorchCpuRng
from omnivoice_onnx.core.schedule import unmask_schedule
from omnivoice_onnx.core.scoring import unmask_step
from omnivoice_onnx.core.shapes import (
    AudioChunk,
    GenerationConfig,
    Model,
    Progress,
    Reference,
    Request,
    VoiceClonePrompt,
)
from omnivoice_onnx.errors import Cancelled, UserError


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

    def slice(self, indices: Sequence[int]) -> Task:
        """The items at `indices`, in that order (upstream slice_task)."""
        return Task(
            texts=[self.texts[i] for i in indices],
            target_lens=[self.target_lens[i] for i in indices],
            langs=[self.langs[i] for i in indices],
            instructs=[self.instructs[i] for i in indices],
            ref_texts=[self.ref_texts[i] for i in indices],
            ref_audio_tokens=[self.ref_audio_tokens[i] for i in indices],
            ref_rms=[self.ref_rms[i] for i in indices],
            speed=[self.speed[i] for i in indices] if self.speed else None,
        )


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


def encode_reference(model: Model, reference: Reference) -> VoiceClonePrompt:
    """The prompt of a prepared reference: its codes from the encoder graph."""
    tokens = model.encode(reference.wav[np.newaxis])[0]
    return VoiceClonePrompt(
        ref_audio_tokens=tokens.astype(np.int64), ref_text=reference.ref_text, ref_rms=reference.ref_rms
    )


def task_of(model: Model, req: Request) -> Task:
    """The Task of a validated request: its prepared references encoded, each distinct one once."""
    encoded: dict[int, VoiceClonePrompt] = {}
    prompts = []
    for reference in req.references:
        if isinstance(reference, Reference):
            if id(reference) not in encoded:
                encoded[id(reference)] = encode_reference(model, reference)
            reference = encoded[id(reference)]
        prompts.append(reference)
    return Task(
        texts=req.texts,
        target_lens=req.target_lens,
        langs=req.langs,
        instructs=req.instructs,
        ref_texts=[p.ref_text if p is not None else None for p in prompts],
        ref_audio_tokens=[p.ref_audio_tokens if p is not None else None for p in prompts],
        ref_rms=[p.ref_rms if p is not None else None for p in prompts],
        speed=req.speed,
    )


def generate_iterative(
    model: Model,
    task: Task,
    config: GenerationConfig,
    rng: TorchCpuRng,
    trace: Trace | None = None,
    monitor: Monitor | None = None,
) -> list[np.ndarray]:
    """num_step model calls, each unmasking a scheduled number of cells per item -> tokens [C, T_i]."""
    monitor = monitor or Monitor()
    monitor.begin_chunk()
    batch, codebooks, mask_id = len(task.texts), model.num_codebooks, model.mask_id
    items = [
        prompt.build_item_inputs(
            model.tokenizer,
            task.texts[i],
            task.target_lens[i],
            task.ref_texts[i],
            task.ref_audio_tokens[i],
            task.langs[i],
            task.instructs[i],
            config.denoise,
            codebooks,
            mask_id,
            model.runtime_config,
        )
        for i in range(batch)
    ]
    input_ids, audio_mask, attention_mask, c_lens = prompt.batch_inputs(items, task.target_lens, codebooks, mask_id)
    tokens = [np.full((1, codebooks, t_len), mask_id, dtype=np.int64) for t_len in task.target_lens]
    schedules = [unmask_schedule(t_len, codebooks, config.num_step, config.t_shift) for t_len in task.target_lens]
    record = None
    if trace is not None:
        ref_frames = [t.shape[-1] if t is not None else 0 for t in task.ref_audio_tokens]
        record = IterativeTrace(
            texts=list(task.texts),
            ref_texts=list(task.ref_texts),
            target_lens=list(task.target_lens),
            c_lens=c_lens,
            schedules=schedules,
            ref_frames=ref_frames,
            prompt_ids=[
                ids[0, 0, : c_len - t_len - r].tolist()
                for (ids, _), c_len, t_len, r in zip(items, c_lens, task.target_lens, ref_frames)
            ],
        )
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
                logits[i : i + 1, :, c_len - t_len : c_len],
                logits[batch + i : batch + i + 1, :, :t_len],
                tokens[i],
                k,
                guidance_scale=config.guidance_scale,
                class_temperature=config.class_temperature,
                layer_penalty_factor=config.layer_penalty_factor,
                position_temperature=config.position_temperature,
                mask_id=mask_id,
                rng=rng,
            )
            input_ids[i, :, c_len - t_len : c_len] = tokens[i][0]
            input_ids[batch + i, :, :t_len] = tokens[i][0]
            step_cells.append(cells)
        if record is not None:
            record.cells.append(step_cells)
        monitor.after_step(step + 1, config.num_step)
    results = [t[0] for t in tokens]
    if record is not None:
        record.tokens = [t.copy() for t in results]
    return results


def chunk_plan(model: Model, task: Task, config: GenerationConfig) -> tuple[list[list[str]], list[plan.ChunkBatch]]:
    """(per long item, its text split at punctuation into ~audio_chunk_duration pieces; the
    batches that generate them): plan.plan_chunks, which request.validate() measured."""
    return plan.plan_chunks(
        task.texts,
        task.target_lens,
        task.ref_texts,
        [t.shape[-1] if t is not None else None for t in task.ref_audio_tokens],
        task.speed,
        config.audio_chunk_duration,
        model.frame_rate,
        model.runtime_config,
    )


def iter_chunked(
    model: Model,
    task: Task,
    config: GenerationConfig,
    rng: TorchCpuRng,
    batches: list[plan.ChunkBatch],
    trace: Trace | None = None,
    monitor: Monitor | None = None,
) -> Iterator[tuple[int, dict[int, np.ndarray]]]:
    """Long items' chunks (`batches`, from chunk_plan), generated chunk index by chunk index, in
    upstream _generate_chunked's order: yields (chunk index, {item: its tokens [C, T]}) as each
    index is done, so a stream can decode chunk 0 while later ones are still to come."""
    first: dict[int, np.ndarray] = {}
    for call in batches:
        # without a reference, chunk 0's tokens (and raw text, in the plan) are the later chunks' reference
        refs = [
            task.ref_audio_tokens[i] if call.own_reference else first[i] if call.chunk > 0 else None
            for i in call.indices
        ]
        sub_task = Task(
            texts=call.texts,
            target_lens=call.target_lens,
            langs=[task.langs[i] for i in call.indices],
            instructs=[task.instructs[i] for i in call.indices],
            ref_texts=call.ref_texts,
            ref_audio_tokens=refs,
            ref_rms=[task.ref_rms[i] for i in call.indices],
            speed=[task.speed[i] for i in call.indices] if task.speed else None,
        )
        done = dict(zip(call.indices, generate_iterative(model, sub_task, config, rng, trace, monitor)))
        if call.chunk == 0:
            first = done
        yield call.chunk, done


def generate_chunked(
    model: Model,
    task: Task,
    config: GenerationConfig,
    rng: TorchCpuRng,
    trace: Trace | None = None,
    item_ids: Sequence[int] | None = None,
    monitor: Monitor | None = None,
) -> list[list[np.ndarray]]:
    """Long items, text split at punctuation into ~audio_chunk_duration pieces, generated chunk
    index by chunk index as batches -> per item, its chunks' tokens. `item_ids` (the items'
    indices in the whole call) only label the trace."""
    all_chunks, batches = chunk_plan(model, task, config)
    if trace is not None:
        for i, chunks in enumerate(all_chunks):
            trace.chunks[item_ids[i] if item_ids is not None else i] = chunks
    results: list[list[np.ndarray]] = [[] for _ in task.texts]
    for _, done in iter_chunked(model, task, config, rng, batches, trace, monitor):
        for i, tokens in done.items():
            results[i].append(tokens)
    return results


def decode(model: Model, tokens: np.ndarray | list[np.ndarray]) -> np.ndarray:
    """Tokens [C, T] -> the decoder's audio [1, 960*T] float32; a list of chunks' tokens is decoded
    chunk by chunk and cross-faded (audio.cross_fade_chunks)."""
    if isinstance(tokens, list):
        return audio.cross_fade_chunks(
            [model.decode(t[np.newaxis])[0] for t in tokens], model.sample_rate, model.runtime_config["audio"]
        )
    decoded: np.ndarray = model.decode(tokens[np.newaxis])[0]
    return decoded


def decode_and_post_process(
    model: Model, tokens: np.ndarray | list[np.ndarray], ref_rms: float | None, req: Request
) -> np.ndarray:
    """Tokens [C, T] (or a list of chunks' tokens) -> the text's output [T'] float32: decoded chunk
    by chunk, joined with the request's pause, post-processed, its volume applied (audio.join_chunks)."""
    config = req.config
    return audio.join_chunks(
        [model.decode(t[np.newaxis])[0] for t in (tokens if isinstance(tokens, list) else [tokens])],
        ref_rms,
        model.sample_rate,
        model.runtime_config["audio"],
        postprocess_output=config.postprocess_output,
        pad_duration=config.pad_duration,
        fade_duration=config.fade_duration,
        pause_s=req.sentence_silence,
        volume=req.volume,
    )


def generate(
    model: Model, req: Request, trace: Trace | None = None, monitor: Monitor | None = None
) -> list[np.ndarray]:
    """upstream generate() after its config handling, for a validated request (request.validate:
    upstream's _preprocess_all checks, done once): its references encoded, then the unmasking
    loop with one TorchCpuRng(req.seed) shared in upstream's order -> one audio [T] float32 per text."""
    config, rng = req.config, TorchCpuRng(req.seed)
    task = task_of(model, req)
    short_idx, long_idx = plan.split_short_long(task.target_lens, config.audio_chunk_threshold, model.frame_rate)
    monitor = monitor or Monitor()
    long_task = task.slice(long_idx)
    monitor.chunks = (1 if short_idx else 0) + (
        max(map(len, chunk_plan(model, long_task, config)[0])) if long_idx else 0
    )
    results: list[Any] = [None] * len(task.texts)
    if short_idx:
        for i, tokens in zip(short_idx, generate_iterative(model, task.slice(short_idx), config, rng, trace, monitor)):
            results[i] = tokens
    if long_idx:
        for i, chunks in zip(long_idx, generate_chunked(model, long_task, config, rng, trace, long_idx, monitor)):
            results[i] = chunks
    if trace is not None:
        trace.task, trace.short_idx, trace.long_idx, trace.results = task, short_idx, long_idx, results
        trace.seed, trace.words_drawn = req.seed, rng.words_drawn
    return [decode_and_post_process(model, results[i], task.ref_rms[i], req) for i in range(len(task.texts))]


def stream(
    model: Model, req: Request, trace: Trace | None = None, monitor: Monitor | None = None
) -> Iterator[AudioChunk]:
    """generate() for a validated request of one text, yielding each chunk's audio as soon as it
    is decoded.

    The same preprocessing, chunking (chunk_plan) and generation order (iter_chunked: chunk 0,
    1, ...) as generate(), with the same rng, so the tokens are generate()'s for the same config
    and seed; a text under audio_chunk_threshold is one chunk. The audio is assembled by
    audio.StreamAssembler: equal to generate()'s sample for sample with a reference and either
    postprocess_output=False or a sentence_silence; otherwise the difference its docstring states
    (a gain fixed from chunk 0 without a reference; pauses shortened per chunk with
    postprocess_output). The request's pause and volume are generate()'s. A trace records the
    task, chunks and results as generate()'s does.
    """
    if len(req.texts) != 1:
        raise UserError(
            f"stream() speaks one text, the request holds {len(req.texts)}", "call generate() for a batch of texts"
        )
    monitor = monitor or Monitor()
    config, rng = req.config, TorchCpuRng(req.seed)
    task = task_of(model, req)
    _, long_idx = plan.split_short_long(task.target_lens, config.audio_chunk_threshold, model.frame_rate)
    assembler = audio.StreamAssembler(
        model.sample_rate,
        model.runtime_config["audio"],
        task.ref_rms[0],
        config.postprocess_output,
        config.pad_duration,
        config.fade_duration,
        pause_s=req.sentence_silence,
        volume=req.volume,
    )
    if trace is not None:
        trace.task, trace.seed = task, req.seed
        trace.short_idx, trace.long_idx = ([], [0]) if long_idx else ([0], [])
    if not long_idx:
        monitor.chunks = 1
        tokens = generate_iterative(model, task, config, rng, trace, monitor)[0]
        if trace is not None:
            trace.results = [tokens]
        samples = assembler.add(model.decode(tokens[np.newaxis])[0], 0, 1)
        yield AudioChunk(samples=samples, sample_rate=model.sample_rate, index=0, count=1)
        return
    chunks, batches = chunk_plan(model, task, config)
    count = monitor.chunks = len(chunks[0])
    streamed: list[np.ndarray] = []  # the chunks' tokens, for the trace
    if trace is not None:
        trace.chunks[0], trace.results = chunks[0], [streamed]
    for index, done in iter_chunked(model, task, config, rng, batches, trace, monitor):
        if trace is not None:
            streamed.append(done[0])
        samples = assembler.add(model.decode(done[0][np.newaxis])[0], index, count)
        yield AudioChunk(samples=samples, sample_rate=model.sample_rate, index=index, count=count)
