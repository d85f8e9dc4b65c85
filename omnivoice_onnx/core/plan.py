"""Which transformer calls a request makes: the short items' one batch, and long items' chunks.

Reproduces the decisions of (omnivoice 0.2.1, omnivoice/models/omnivoice.py):
    GenerationTask.get_indices          split_short_long
    OmniVoice._generate_chunked         plan_chunks (its chunk texts, batches and lengths)

Pure text and length arithmetic, no model: generate() runs the plan, and request.validate()
measures it (every call's rows and sequence length) before anything of the request's size is
allocated. A long item's later chunks without a reference take chunk 0's tokens as theirs, so
their reference length is chunk 0's target length, known before chunk 0 is generated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omnivoice_onnx.core import duration, text
from omnivoice_onnx.errors import UserError


def split_short_long(
    target_lens: Sequence[int], audio_chunk_threshold: float, frame_rate: int
) -> tuple[list[int], list[int]]:
    """(short, long) item indices: long ones exceed int(audio_chunk_threshold * frame_rate) frames."""
    threshold = int(audio_chunk_threshold * frame_rate)
    return (
        [i for i, n in enumerate(target_lens) if n <= threshold],
        [i for i, n in enumerate(target_lens) if n > threshold],
    )


@dataclass(frozen=True)
class ChunkBatch:
    """One generate_iterative call of generate_chunked: chunk `chunk` of the long items `indices`
    (positions in the long items' list)."""

    chunk: int
    indices: list[int]
    texts: list[str]  # each item's chunk text
    ref_texts: list[str | None]  # the item's reference transcript, or chunk 0's text (no reference)
    ref_frames: list[int | None]  # the reference's frames, or chunk 0's target length (no reference)
    target_lens: list[int]
    own_reference: bool  # the items' own references (else chunk 0's tokens, or none for chunk 0)


def plan_chunks(
    texts: Sequence[str],
    target_lens: Sequence[int],
    ref_texts: Sequence[str | None],
    ref_frames: Sequence[int | None],
    speeds: Sequence[float] | None,
    audio_chunk_duration: float,
    frame_rate: int,
    config: dict[str, Any],
) -> tuple[list[list[str]], list[ChunkBatch]]:
    """(each long item's chunk texts, the batches in generation order), as _generate_chunked makes them.

    Texts are split at punctuation into ~audio_chunk_duration pieces; chunk index ci of every item
    that has one runs as one batch. Items with a reference keep it for every chunk; without one,
    chunk 0 of all items runs first, then chunk 0 (its tokens and raw text) is the reference of
    the later chunks. Each chunk's target length is its own estimate at the item's speed.
    `config` is runtime-config.json (its text and duration rules; text.min_chunk_len is the
    min_chunk_len _generate_chunked passes).
    """
    text_rules = config["text"]
    batch = len(texts)
    all_chunks = []
    for i in range(batch):
        chunk_len = text.text_chunk_len(texts[i], target_lens[i], audio_chunk_duration, frame_rate)
        chunks = text.chunk_text_punctuation(texts[i], chunk_len, text_rules, text_rules["min_chunk_len"])
        if not chunks:
            raise UserError(f"text {texts[i][:40]!r} gives no chunk to speak", "pass text with words in it")
        all_chunks.append(chunks)
    has_ref = [frames is not None for frames in ref_frames]
    if any(has_ref) and not all(has_ref):
        raise UserError(
            "long texts (chunked) in one call must all have a reference or all have none",
            "generate them in separate calls",
        )

    def batch_of(
        ci: int, chunk_texts: list[str], refs: list[str | None], frames: list[int | None], indices: list[int], own: bool
    ) -> ChunkBatch:
        lens = [
            duration.estimate_target_tokens(
                chunk_texts[j], refs[j], frames[j], config["duration"], speed=speeds[i] if speeds else 1.0
            )
            for j, i in enumerate(indices)
        ]
        return ChunkBatch(ci, indices, chunk_texts, refs, frames, lens, own)

    batches = []
    max_chunks = max(len(c) for c in all_chunks)
    if all(has_ref):
        for ci in range(max_chunks):
            indices = [i for i in range(batch) if ci < len(all_chunks[i])]
            batches.append(
                batch_of(
                    ci,
                    [all_chunks[i][ci] for i in indices],
                    [ref_texts[i] for i in indices],
                    [ref_frames[i] for i in indices],
                    indices,
                    True,
                )
            )
    else:
        first = batch_of(0, [c[0] for c in all_chunks], [None] * batch, [None] * batch, list(range(batch)), False)
        batches.append(first)
        for ci in range(1, max_chunks):
            indices = [i for i in range(batch) if ci < len(all_chunks[i])]
            batches.append(
                batch_of(
                    ci,
                    [all_chunks[i][ci] for i in indices],
                    [all_chunks[i][0] for i in indices],
                    [first.target_lens[i] for i in indices],
                    indices,
                    False,
                )
            )
    return all_chunks, batches
