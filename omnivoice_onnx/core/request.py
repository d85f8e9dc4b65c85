"""One validation of a generation request, before any model work. The shapes it builds (Request,
GenerationConfig, Reference) are core/shapes.py's, below this module, so whoever holds them
need not import their checks.

Every entry point builds its request here, once: OmniVoiceOnnx.validate() returns the `Request`
that generate() and stream() run (given keywords instead, they call it themselves); the CLI, the
server and batch validate first, map a UserError to their own surface (one line and exit 2, an
HTTP 4xx in OpenAI's shape, a failed-line record) and hand the Request on. `validate()` raises ONE
UserError naming the argument and the fix. The seed is checked (or drawn, for None) here and
nowhere else: TorchCpuRng trusts the Request's.

What is checked, in the order the request is used:
- types: text, language, instruct and ref_text are str (one value, or a list with one per
  text); numbers are numbers (numpy scalars included, bool not); ref_audio a path or
  (waveform, sample_rate); voice_clone_prompt a VoiceClonePrompt or a list of them;
  generation_config a dict of OmniVoiceGenerationConfig's fields.
- values, in the arithmetic that will use them: finite and in range, and the float32 unmasking
  arithmetic they feed checked to stay finite (the time-step schedule of t_shift and num_step;
  temperatures whose division would overflow); text with nothing speakable (only spaces or
  zero-width characters) refused; an empty ref_text with ref_audio refused; a silent or too
  short reference refused; prompt tokens checked to be codebook entries.
- size: the limits below, on the lengths the request WILL have: frames from the duration
  estimate, and every transformer call's rows and sequence length from the chunk plan
  (plan.py), before any array of the request's size exists. The reference is loaded and
  prepared (length checked before reading and before resampling) but not encoded.

The limits and ranges (and the number checks) are omnivoice_onnx.limits': one set for every
front end.
"""

from __future__ import annotations

import dataclasses
import math
import os
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from omnivoice_onnx.core import audio, duration, plan, prompt, schedule, text
from omnivoice_onnx.core.instruct import instruct_use_zh, read_instruct
from omnivoice_onnx.core.rng import fresh_seed
from omnivoice_onnx.core.shapes import (
    REQUEST_FIELDS,
    REQUEST_KEYWORDS,
    GenerationConfig,
    Model,
    Reference,
    Request,
    VoiceClonePrompt,
)
from omnivoice_onnx.errors import UserError, check_path, check_unicode
from omnivoice_onnx.limits import (
    MAX_SCORE_FACTOR,
    MIN_REF_SECONDS,
    MIN_TEMPERATURE,
    check_seed,
    check_sentence_silence,
    check_speed,
    check_volume,
    checked_number,
    is_number,
    limit,
    too_large,
)

# --- the generation config, checked -------------------------------------------------------------


def generation_config(
    values: Mapping[str, Any] | GenerationConfig | None, defaults: dict[str, Any]
) -> GenerationConfig:
    """A GenerationConfig: `defaults` overlaid with `values`; UserError for an unknown field or a
    bad value (upstream's OmniVoiceGenerationConfig.from_dict, checked).

    Upstream's from_dict silently drops unknown keys; here a misspelt field is an error, so it
    never quietly runs with the default.
    """
    names = [f.name for f in dataclasses.fields(GenerationConfig)]
    if isinstance(values, GenerationConfig):
        values = dataclasses.asdict(values)
    if values is not None and not isinstance(values, Mapping):
        raise UserError(
            f"generation_config must be a dict of field -> value, got {type(values).__name__} {values!r:.60}",
            "pass e.g. generation_config={'num_step': 16}",
        )
    values = dict(values or {})
    unknown = sorted(map(str, set(values) - set(names)))
    if unknown:
        raise UserError(
            f"unknown generation_config field(s) {', '.join(unknown)}",
            f"use OmniVoiceGenerationConfig's fields: {', '.join(names)}",
        )
    missing = [name for name in names if name not in defaults]
    if missing:
        raise UserError(
            f"the export's runtime-config.json lacks generation default(s) {', '.join(missing)}",
            "re-run export_omnivoice.py",
        )
    merged = {name: values.get(name, defaults[name]) for name in names}
    for f in dataclasses.fields(GenerationConfig):
        # a string under `from __future__ import annotations`, the class itself without it
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        merged[f.name] = _checked_field(f.name, kind, merged[f.name])
    config = GenerationConfig(**merged)
    _check_schedule(config.num_step, config.t_shift)
    return config


def _checked_field(name: str, kind: str, value: Any) -> Any:
    """A config value of the field's type and range, or UserError."""
    label = f"generation_config.{name}"
    if kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise UserError(f"{label} must be true or false, got {value!r:.60}", "pass True or False")
        return bool(value)
    if name == "num_step":
        if is_number(value) and math.isfinite(value) and value > limit("MAX_NUM_STEP"):
            raise too_large(f"{label}={value!r}", "MAX_NUM_STEP")
        return checked_number(value, label, 1, None, integer=True)
    if name in ("position_temperature", "class_temperature"):
        value = checked_number(value, label, 0, None)
        if 0 < value < MIN_TEMPERATURE:
            raise UserError(
                f"{label} {value!r} is too small for float32 scores (below {MIN_TEMPERATURE:g})",
                "use 0 for greedy choice, or a temperature >= 1e-6",
            )
        return value
    if name in ("guidance_scale", "layer_penalty_factor"):
        return checked_number(value, label, -MAX_SCORE_FACTOR, MAX_SCORE_FACTOR)
    if name == "t_shift":
        return checked_number(value, label, 0, None, low_open=True)
    if name == "audio_chunk_duration":
        return checked_number(value, label, 0, limit("MAX_DURATION_S"), low_open=True)
    if name in ("pad_duration", "fade_duration"):
        value = checked_number(value, label, 0, None)
        if value > limit("MAX_PAD_SECONDS"):
            raise too_large(f"{label}={value:g} s", "MAX_PAD_SECONDS")
        return value
    return checked_number(value, label, 0, None)  # audio_chunk_threshold


def _check_schedule(num_step: int, t_shift: float) -> None:
    """The shifted time steps of (num_step, t_shift) are finite and rise from 0 to 1 (within float32
    rounding), as the unmasking schedule needs (t_shift=1e39 is inf in float32: inf * 0 = NaN)."""
    with np.errstate(all="ignore"):
        steps = np.array(schedule.time_steps(num_step, t_shift))
    if not (np.isfinite(steps).all() and steps[0] == 0 and abs(steps[-1] - 1) < 1e-3 and (np.diff(steps) >= 0).all()):
        raise UserError(
            f"generation_config.t_shift={t_shift!r} with num_step={num_step} gives a time-step schedule "
            "that is not finite in float32",
            "use a t_shift between 0.01 and 100 (upstream's default 0.1)",
        )


# --- the one builder: a front end's fields -> validate()'s keywords ---------------------------------


def check_keywords(given: Mapping[str, Any], where: str) -> None:
    """A TypeError for a keyword that is not a request's, as a signature that wrote them out gave."""
    unknown = [name for name in given if name not in REQUEST_KEYWORDS]
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")


def keywords(fields: Mapping[str, Any], generation_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """OmniVoiceOnnx.validate()'s keywords from a front end's fields (CLI flags, a JSON body, a
    JSONL line, as a mapping; None or absent: not given): the request's own fields as they are
    (a path-like ref_audio as str), and the GenerationConfig fields among them (num_step,
    guidance_scale, ...) gathered over `generation_config` (a front end's whole-run overrides).
    Other keys (the front end's own: --out, response_format) are not the request's, and ignored."""
    config_names = {f.name for f in dataclasses.fields(GenerationConfig)}
    config = {
        **(generation_config or {}),
        **{name: value for name, value in fields.items() if name in config_names and value is not None},
    }
    built = {name: fields.get(name) for name in REQUEST_FIELDS}
    if isinstance(built["ref_audio"], os.PathLike):
        built["ref_audio"] = os.fspath(built["ref_audio"])
    return {**built, "generation_config": config or None}


# --- validation -------------------------------------------------------------------------------


def _texts(value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise UserError(
            f"text must be a string or a non-empty list of strings, got {type(value).__name__}",
            "pass the text to speak",
        )
    if len(items) > limit("MAX_TEXTS"):
        raise too_large(f"{len(items)} texts in one call", "MAX_TEXTS")
    for i, item in enumerate(items):
        label = "text" if len(items) == 1 else f"text {i}"
        if not isinstance(item, str):
            raise UserError(f"{label} is {type(item).__name__}, not str", "pass the text to speak as a string")
        check_unicode(item, label, "pass the text to speak as UTF-8")
        if not item.strip():
            raise UserError(f"{label} is empty", "pass the text to speak")
        if not any(unicodedata.category(c)[0] in "LNPS" for c in item):
            raise UserError(
                f"{label} holds nothing to speak (only spaces or invisible characters such as U+200B)",
                "pass text with words in it",
            )
        if len(item) > limit("MAX_TEXT_CHARS"):
            raise too_large(f"{label} has {len(item)} characters", "MAX_TEXT_CHARS")
    return list(items)


ItemT = TypeVar("ItemT")


def _per_item(
    value: Any, batch: int, name: str, check: Callable[[Any, str], ItemT], repeat: bool = True
) -> list[ItemT]:
    """One value or a list of 1 or `batch` values, each passed through `check(value, label)`;
    repeated to the batch unless `repeat` is False."""
    values = value if isinstance(value, list) else [value]
    if len(values) not in (1, batch):
        raise UserError(f"{name} has {len(values)} values for {batch} texts", f"pass one {name} or one per text")
    values = [check(v, name if len(values) == 1 else f"{name}[{i}]") for i, v in enumerate(values)]
    return values * batch if repeat and len(values) == 1 else values


def _optional_str(value: Any, label: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise UserError(
            f"{label} must be a string or None, got {type(value).__name__} {value!r:.60}",
            f"pass {label.split('[')[0]} as a string",
        )
    return value if value is None else check_unicode(value, label, f"pass {label.split('[')[0]} as UTF-8 text")


def _optional_number(low: float, high_limit: str) -> Callable[[Any, str], float | None]:
    def check(value: Any, label: str) -> float | None:
        if value is None:
            return None
        if is_number(value) and math.isfinite(value) and value > limit(high_limit):
            raise too_large(f"{label}={value!r} s", high_limit)
        return checked_number(value, label, low, limit(high_limit), low_open=True)

    return check


def _optional_speed(value: Any, label: str) -> float | None:
    return None if value is None else check_speed(value, label)


def _ref_audio(value: Any, label: str) -> Any:
    if isinstance(value, (str, os.PathLike)):
        return check_path(value, label)
    if isinstance(value, tuple) and len(value) == 2:
        return value
    raise UserError(
        f"{label} must be a file path or a (waveform, sample_rate) tuple, got {type(value).__name__}",
        "pass the reference's WAV/FLAC path, or (samples, rate)",
    )


def check_prompt(value: Any, label: str, model: Model) -> VoiceClonePrompt:
    """A VoiceClonePrompt whose tokens the transformer can read: [num_codebooks, T] integers,
    each an entry of the codebook (0 <= code < mask id), T frames within MAX_REF_SECONDS."""
    fix = "pass a prompt made by create_voice_clone_prompt() (or a saved voice) for this export"
    if not isinstance(value, VoiceClonePrompt):
        raise UserError(f"{label} must be a VoiceClonePrompt, got {type(value).__name__} {value!r:.60}", fix)
    tokens = value.ref_audio_tokens
    if not isinstance(tokens, np.ndarray) or tokens.dtype.kind not in "iu" or tokens.ndim != 2:
        raise UserError(
            f"{label}.ref_audio_tokens must be an integer array [codebooks, frames], got "
            f"{getattr(tokens, 'dtype', type(tokens).__name__)} {getattr(tokens, 'shape', '')}",
            fix,
        )
    if tokens.shape[0] != model.num_codebooks or tokens.shape[1] < 1:
        raise UserError(
            f"{label}.ref_audio_tokens is shaped {list(tokens.shape)}, expected [{model.num_codebooks}, frames >= 1]",
            fix,
        )
    if tokens.shape[1] > limit("MAX_REF_SECONDS") * model.frame_rate:
        raise too_large(f"{label} holds {tokens.shape[1] / model.frame_rate:.1f} s of reference", "MAX_REF_SECONDS")
    if tokens.min() < 0 or tokens.max() >= model.mask_id:
        raise UserError(
            f"{label}.ref_audio_tokens holds codes outside the codebook [0, {model.mask_id}) "
            f"(min {tokens.min()}, max {tokens.max()})",
            fix + " (it may be of another model)",
        )
    if not isinstance(value.ref_text, str) or not value.ref_text.strip():
        raise UserError(f"{label}.ref_text must be the reference's transcript (a non-empty string)", fix)
    checked_number(value.ref_rms, f"{label}.ref_rms", 0, None, fix=fix)
    return value


def load_reference(
    model: Model, ref_audio: Any, ref_text: Any, preprocess_prompt: bool, label: str = "ref_audio"
) -> Reference:
    """Load and prepare a reference for the encoder (create_voice_clone_prompt's steps before
    encode), its length checked against MAX_REF_SECONDS before it is read or resampled."""
    if ref_text is None:
        raise UserError(
            "ref_text is required with ref_audio (this runtime has no speech recogniser)",
            "pass the reference's transcript as ref_text",
        )
    if not isinstance(ref_text, str):
        raise UserError(f"ref_text must be a string, got {type(ref_text).__name__}", "pass the transcript as str")
    check_unicode(ref_text, "ref_text", "pass the transcript as UTF-8 text")
    if not ref_text.strip():
        raise UserError("ref_text is empty", "pass the transcript of the reference audio")
    _ref_audio(ref_audio, label)
    wav = audio.load_reference(
        ref_audio, model.sample_rate, model.runtime_config["audio"], max_seconds=limit("MAX_REF_SECONDS")
    )
    wav, ref_rms = audio.prepare_reference(
        wav,
        model.sample_rate,
        model.hop_length,
        model.runtime_config["audio"],
        preprocess=preprocess_prompt,
        min_seconds=MIN_REF_SECONDS,
    )
    return Reference(
        wav=wav,
        ref_text=text.add_punctuation(ref_text, model.runtime_config["text"]) if preprocess_prompt else ref_text,
        ref_rms=ref_rms,
        frames=wav.shape[-1] // model.hop_length,
    )


def reference_frames(reference: Reference | VoiceClonePrompt | None) -> int | None:
    if reference is None:
        return None
    return reference.frames if isinstance(reference, Reference) else reference.ref_audio_tokens.shape[-1]


def validate(
    model: Model,
    texts: Any,
    config: GenerationConfig,
    language: Any = None,
    ref_text: Any = None,
    ref_audio: Any = None,
    voice_clone_prompt: Any = None,
    instruct: Any = None,
    duration_s: Any = None,
    speed: Any = None,
    seed: Any = None,
    strict_instructions: Any = False,
    sentence_silence: Any = None,
    volume: Any = None,
) -> Request:
    """The request checked whole (types, values, sizes) and resolved, without model work.
    strict_instructions: refuse an instruct with words outside the vocabulary instead of applying
    the words it knows (instruct.read_instruct). sentence_silence (seconds between a text's
    chunks) and volume (the output's gain) are one value for the whole request; None is their
    default (limits.DEFAULT_SENTENCE_SILENCE_S, DEFAULT_VOLUME: the output as without them)."""
    text_list = _texts(texts)
    pause, gain = check_sentence_silence(sentence_silence), check_volume(volume)
    batch = len(text_list)
    seed = fresh_seed() if seed is None else check_seed(seed)  # drawn or checked here, once
    data = model.runtime_config
    langs = [
        prompt.resolve_language(lang, data["languages"])
        for lang in _per_item(language, batch, "language", _optional_str)
    ]
    if not isinstance(strict_instructions, (bool, np.bool_)) and strict_instructions is not None:
        raise UserError(
            f"strict_instructions must be true or false, got {strict_instructions!r:.60}", "pass True or False"
        )
    readings = [
        read_instruct(
            item, instruct_use_zh(text_list[i], data["instruct"]), data["instruct"], strict=bool(strict_instructions)
        )
        for i, item in enumerate(_per_item(instruct, batch, "instruct", _optional_str))
    ]
    instructs = [reading.instruct for reading in readings]
    durations = _per_item(duration_s, batch, "duration", _optional_number(0, "MAX_DURATION_S"))
    speeds = _per_item(speed, batch, "speed", _optional_speed)

    if voice_clone_prompt is not None and (ref_text is not None or ref_audio is not None):
        # Upstream logs a warning and ignores ref_text/ref_audio.
        raise UserError(
            "voice_clone_prompt was given together with ref_text/ref_audio",
            "pass either a voice_clone_prompt or ref_audio + ref_text",
        )
    references: list[Reference | VoiceClonePrompt | None]
    if voice_clone_prompt is not None:
        references = _per_item(
            voice_clone_prompt, batch, "voice_clone_prompt", lambda p, label: check_prompt(p, label, model)
        )
    elif ref_audio is not None:
        ref_texts = _per_item(ref_text, batch, "ref_text", lambda v, label: v, repeat=False)
        ref_audios = _per_item(ref_audio, batch, "ref_audio", _ref_audio, repeat=False)
        if len(ref_texts) != len(ref_audios):
            # Upstream makes len(ref_text) prompts from the first ref_audios: a silent mix-up.
            raise UserError(
                f"{len(ref_audios)} ref_audio for {len(ref_texts)} ref_text", "pass one ref_text per ref_audio"
            )
        loaded: list[Reference | VoiceClonePrompt | None] = [
            load_reference(
                model, a, t, config.preprocess_prompt, "ref_audio" if len(ref_audios) == 1 else f"ref_audio[{i}]"
            )
            for i, (a, t) in enumerate(zip(ref_audios, ref_texts))
        ]
        references = loaded * batch if len(loaded) == 1 else loaded
    elif ref_text is not None:  # upstream ignores a ref_text without ref_audio
        raise UserError("ref_text was given without ref_audio", "pass ref_audio too, or drop ref_text")
    else:
        references = [None] * batch

    ref_texts = [r.ref_text if r is not None else None for r in references]
    ref_frames = [reference_frames(r) for r in references]
    target_lens, speed_list = duration.target_lengths(
        text_list,
        ref_texts,
        ref_frames,
        None if speed is None else speeds,
        None if duration_s is None else durations,
        model.frame_rate,
        data["duration"],
    )
    for i, frames in enumerate(target_lens):
        if frames > limit("MAX_DURATION_S") * model.frame_rate:
            raise too_large(
                f"text {i} would be {frames / model.frame_rate:.0f} s of audio (speed "
                f"{speeds[i] if speed is not None else 1.0:g})",
                "MAX_DURATION_S",
            )
    calls = _check_calls(model, config, text_list, langs, instructs, ref_texts, ref_frames, target_lens, speed_list)
    return Request(
        texts=text_list,
        langs=langs,
        instructs=instructs,
        instruct_readings=readings,
        references=references,
        target_lens=target_lens,
        speed=speed_list,
        config=config,
        seed=seed,
        calls=calls,
        sentence_silence=pause,
        volume=gain,
    )


def _check_calls(
    model: Model,
    config: GenerationConfig,
    texts: list[str],
    langs: list[str | None],
    instructs: list[str | None],
    ref_texts: list[str | None],
    ref_frames: list[int | None],
    target_lens: list[int],
    speeds: list[float] | None,
) -> list[tuple[int, int]]:
    """Each transformer batch the request will run, as (rows, sequence), checked against
    MAX_SEQUENCE and MAX_ATTENTION_CELLS from the plan alone (no array of that size is made)."""
    short, long = plan.split_short_long(target_lens, config.audio_chunk_threshold, model.frame_rate)

    def length(i: int, item_text: str, ref: str | None, frames: int | None, target: int) -> int:
        style, ids = prompt.prompt_text_ids(
            model.tokenizer,
            item_text,
            ref,
            frames is not None,
            langs[i],
            instructs[i],
            config.denoise,
            model.runtime_config,
        )
        return style.size + ids.size + (frames or 0) + target

    calls: list[tuple[int, int]] = []

    def check(indices: list[int], lengths: list[int], where: str) -> None:
        rows, sequence = 2 * len(indices), max(lengths)
        worst = indices[lengths.index(sequence)]
        if sequence > limit("MAX_SEQUENCE"):
            raise too_large(
                f"{where.format(i=worst)} would be one transformer call of {sequence} positions: words "
                "without punctuation (. , ; : ! ?) cannot be split into chunks, and a long duration or "
                "low speed stretches a chunk",
                "MAX_SEQUENCE",
                "add punctuation, shorten the text or lower its duration",
            )
        if rows * sequence**2 > limit("MAX_ATTENTION_CELLS"):
            raise too_large(
                f"{len(indices)} texts of up to {sequence} positions in one batch make {rows} x "
                f"{sequence}^2 attention cells",
                "MAX_ATTENTION_CELLS",
                "pass fewer texts per call",
            )
        calls.append((rows, sequence))

    if short:
        check(short, [length(i, texts[i], ref_texts[i], ref_frames[i], target_lens[i]) for i in short], "text {i}")
    if long:
        _, batches = plan.plan_chunks(
            [texts[i] for i in long],
            [target_lens[i] for i in long],
            [ref_texts[i] for i in long],
            [ref_frames[i] for i in long],
            [speeds[i] for i in long] if speeds else None,
            config.audio_chunk_duration,
            model.frame_rate,
            model.runtime_config,
        )
        for call in batches:
            items = [long[j] for j in call.indices]
            check(
                items,
                [
                    length(i, t, r, f, n)
                    for i, t, r, f, n in zip(items, call.texts, call.ref_texts, call.ref_frames, call.target_lens)
                ],
                f"a chunk of text {{i}} (chunk {call.chunk})",
            )
    return calls
