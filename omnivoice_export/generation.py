"""The generate() requests the pipeline runs, and WAV I/O.

Capture, the ONNX drop-in run and the reference maker must issue exactly the same request
(mode, texts, seed, generation config), or their tokens cannot be compared. The request is
written into the capture manifest and read back from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omnivoice_export.cli import UserError, atomic_path

SAMPLE_RATE = 24000
DEFAULT_SEED = 1234
# A matched reference: the model itself speaks this transcript (voice design), so clone mode
# conditions on (audio, text) that correspond, as it expects.
REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank."
REFERENCE_INSTRUCT = "female, moderate pitch, british accent"
DEFAULT_TEXTS = {
    "clone": "Please call Stella and ask her to bring these things with her from the store.",
    "design": "Some have accepted it as a miracle without physical explanation.",
    "auto": "The rainbow is a division of white light into many beautiful colors.",
}
DEFAULT_INSTRUCT = "male, low pitch, american accent"
LANGUAGE = "English"


@dataclass
class GenerationRequest:
    """One generate() call, fully determined: same request + same model + same device = same tokens."""

    mode: str  # clone | design | auto
    text: str
    seed: int = DEFAULT_SEED  # torch.manual_seed before generate(): gumbel position noise and sampling
    language: str | None = LANGUAGE
    instruct: str | None = None  # design mode only
    ref_audio: str | None = None  # clone mode: path of the 24 kHz reference WAV
    ref_text: str | None = None  # clone mode: its transcript
    num_step: int = 32  # upstream default

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GenerationRequest":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def mode_request(mode: str, seed: int, num_step: int, ref_audio: Path | None = None,
                 ref_text: str | None = None, text: str | None = None) -> GenerationRequest:
    """The default request of a capture mode."""
    return GenerationRequest(
        mode=mode, text=text or DEFAULT_TEXTS[mode], seed=seed, num_step=num_step,
        instruct=DEFAULT_INSTRUCT if mode == "design" else None,
        ref_audio=str(ref_audio) if mode == "clone" else None, ref_text=ref_text if mode == "clone" else None)


def run_generate(model, request: GenerationRequest) -> np.ndarray:
    """Seed, then the upstream OmniVoice.generate() with this request; the 1-D float32 waveform.

    Upstream's ValueErrors for bad input (unsupported instruct items, say) are surfaced as one-line
    UserErrors.
    """
    import torch

    torch.manual_seed(request.seed)
    kwargs: dict[str, Any] = {"text": request.text, "language": request.language, "num_step": request.num_step}
    if request.instruct:
        kwargs["instruct"] = request.instruct
    if request.ref_audio:
        kwargs["ref_audio"] = request.ref_audio
        kwargs["ref_text"] = request.ref_text
    if not request.text or not request.text.strip():
        raise UserError("the text to speak is empty", "pass a non-empty --text")
    try:
        audio = model.generate(**kwargs)[0]
    except ValueError as exc:
        raise UserError(str(exc).splitlines()[0], "see the model's supported instruct items and inputs") from exc
    return np.asarray(audio, dtype=np.float32)


def write_wav(path: Path, audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """Write a float32 WAV atomically (float keeps the exact samples for comparison)."""
    import soundfile

    with atomic_path(Path(path)) as tmp:
        soundfile.write(str(tmp), np.asarray(audio, dtype=np.float32), sample_rate, subtype="FLOAT", format="WAV")


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """(samples as float32 [T] or [T, C], sample_rate), or a UserError naming the file."""
    import soundfile

    path = Path(path)
    if not path.is_file():
        raise UserError(f"audio file not found: {path}")
    try:
        audio, rate = soundfile.read(str(path), dtype="float32", always_2d=False)
    except (RuntimeError, soundfile.LibsndfileError) as exc:
        raise UserError(f"{path} is not a readable audio file ({exc})") from exc
    return audio, rate
