"""The data shapes of a request, below the code that makes and runs them: what the host side
needs from an export (Model, and the Tokenizer it reads text with), a generation's settings
(GenerationConfig), a reference before and after encoding (Reference, VoiceClonePrompt), what an
instruct became (InstructReading), the validated request (Request) and the keywords that ask for
one (RequestKeywords), and the pieces a generation hands back (AudioChunk, Progress).

Plain data only: request.py builds and checks them (request.validate, request.generation_config),
generate.py runs them, and the front ends (the server's pool, batch, the CLI) hold them without
importing the code that makes them. Nothing here imports the package.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

import numpy as np


class Tokenizer(Protocol):
    """The text tokenizer as the host loop uses it (prompt.TextTokenizer, from the export's tokenizer.json)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`, as transformers' tokenizer(text, add_special_tokens=...).input_ids."""
        ...

    def encode_with_nonverbal_tags(self, text: str, nonverbal_pattern: str) -> list[int]:
        """upstream's _tokenize_with_nonverbal_tags: each tag and each stretch between tags alone."""
        ...


@dataclass
class Model:
    """What the host side needs from an export: the three networks and their constants."""

    transformer: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]  # ids, audio_mask, attention -> logits
    encode: Callable[[np.ndarray], np.ndarray]  # input_values [1,1,960*Tc] f32 -> audio_codes [1,C,Tc] int64
    decode: Callable[[np.ndarray], np.ndarray]  # audio_codes [1,C,T] int64 -> audio_values [1,1,960*T] f32
    tokenizer: Tokenizer
    runtime_config: dict[str, Any]  # runtime-config.json: languages, instruct data, defaults
    sample_rate: int
    hop_length: int
    frame_rate: int
    num_codebooks: int
    mask_id: int


@dataclass(frozen=True)
class GenerationConfig:
    """OmniVoiceGenerationConfig's fields (defaults come from the export's runtime-config.json,
    which records upstream's dataclass defaults; request.generation_config builds one, checked)."""

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


@dataclass(frozen=True)
class Reference:
    """A reference loaded and prepared for the encoder, not yet encoded."""

    wav: np.ndarray  # float32 [1, T'], T' a positive multiple of hop_length
    ref_text: str  # its transcript, punctuated when preprocess_prompt
    ref_rms: float  # RMS before the level boost
    frames: int  # T' / hop_length: the codes the encoder will give


@dataclass
class VoiceClonePrompt:
    """A reusable cloning reference (upstream VoiceClonePrompt): what a cloning prompt is built from."""

    ref_audio_tokens: np.ndarray  # [C, T] int64 codes of the prepared reference
    ref_text: str  # its transcript (punctuated when preprocess_prompt)
    ref_rms: float  # RMS of the reference before the level boost


@dataclass(frozen=True)
class InstructReading:
    """What a request's instruct became: the instruct the model is given and, for a prose
    direction, which of its words were applied and which ignored (reported to the caller: a
    response header, a log line, a note on stderr). instruct.read_instruct makes it."""

    instruct: str | None  # normalised (resolve_instruct), None when nothing applied
    applied: tuple[str, ...]  # vocabulary items taken from the text, in its order
    ignored: tuple[str, ...]  # the rest of the text, piece by piece (with a suggestion where one is close)


@dataclass(frozen=True)
class Request:
    """A validated request (request.validate): what generate() runs, per text."""

    texts: list[str]
    langs: list[str | None]  # resolved language ids
    instructs: list[str | None]  # normalised instructs
    instruct_readings: list[InstructReading]  # per text: what of its instruct was applied, what ignored
    references: list[Reference | VoiceClonePrompt | None]  # the same object where texts share one
    target_lens: list[int]  # frames per text (before chunking)
    speed: list[float] | None  # per text, as upstream's speed_list
    config: GenerationConfig
    seed: int  # as given (checked), or drawn for seed=None: torch.manual_seed(seed) before upstream's generate()
    calls: list[tuple[int, int]]  # (rows, sequence length) of each transformer batch, in order
    sentence_silence: float  # seconds of silence added at each boundary between a text's chunks (0: upstream's join)
    volume: float  # linear gain on the output samples (1: unchanged)


class RequestKeywords(TypedDict, total=False):
    """The request's keywords of OmniVoiceOnnx.validate(), generate() and stream(), written once
    (each takes them as **keywords) in upstream generate()'s order; speak's flags, the server's
    JSON body and batch's lines use these names too. A list gives one value per text."""

    language: str | list[str | None] | None  # a name, an id or a tag (prompt.resolve_language)
    ref_text: str | list[str | None] | None  # the reference's transcript
    ref_audio: str | os.PathLike[str] | tuple[np.ndarray, int] | list[Any] | None  # a file, or (waveform, rate)
    voice_clone_prompt: VoiceClonePrompt | list[VoiceClonePrompt | None] | None
    instruct: str | list[str | None] | None  # voice design, e.g. "female, low pitch"
    duration: float | list[float | None] | None  # seconds of speech
    speed: float | list[float | None] | None  # rate factor
    generation_config: dict[str, Any] | None  # OmniVoiceGenerationConfig fields
    seed: int | None  # as torch.manual_seed(seed); None draws one
    strict_instructions: bool | None  # refuse an instruct with words outside the vocabulary
    sentence_silence: float | None  # seconds of silence between a text's chunks, as piper's --sentence-silence
    volume: float | None  # linear gain on the output samples, as piper's --volume (0.5: half as loud)


REQUEST_KEYWORDS = tuple(RequestKeywords.__annotations__)
# The request's own fields: every keyword but the generation config, which request.keywords() gathers.
REQUEST_FIELDS = tuple(name for name in REQUEST_KEYWORDS if name != "generation_config")


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
