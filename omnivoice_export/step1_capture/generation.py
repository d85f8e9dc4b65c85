"""The generate() requests the pipeline runs, and WAV I/O.

Capture, the ONNX drop-in run and the reference maker must issue exactly the same request
(mode, texts, seed, generation config), or their tokens cannot be compared. The request is
written into the capture manifest and read back from it.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from omnivoice_onnx.contract import SAMPLE_RATE
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.files import atomic_path
from omnivoice_onnx.program import note
from omnivoice_onnx.reading import existing_file

if TYPE_CHECKING:
    from omnivoice.models.omnivoice import OmniVoice

SFC_SET_ADD_PEAK_CHUNK = 0x1050  # libsndfile sndfile.h command id (see write_wav)
# Upstream (create_voice_clone_prompt) warns above this: slower, more memory, weaker cloning.
REFERENCE_MAX_SECONDS = 20.0
# -80 dBFS peak: below it upstream's RMS normalisation would amplify the noise floor into the
# "voice" (or its silence removal leaves nothing and generate() raises deep inside).
SILENT_PEAK = 1e-4
REFERENCE_FIX = "pass a WAV/FLAC of 3-10 s of clear speech (mono 24 kHz is used as is)"
DEFAULT_SEED = 1234
# A matched reference: the model itself speaks this transcript (voice design), so clone mode
# conditions on (audio, text) that correspond, as it expects.
REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank."
REFERENCE_INSTRUCT = "female, moderate pitch, british accent"
DEFAULT_TEXTS: dict[str, str | list[str]] = {
    "clone": "Please call Stella and ask her to bring these things with her from the store.",
    "design": "Some have accepted it as a miracle without physical explanation.",
    "auto": "The rainbow is a division of white light into many beautiful colors.",
    # One generate() on two texts of different lengths, as upstream batches a list: the items get
    # different c_len and t_len, so the shorter one's rows are padded (voice design, one instruct).
    "batch": ["Good morning.", "These days a chicken leg is a rare dish."],
}
DEFAULT_INSTRUCT = "male, low pitch, american accent"
# Both temperatures 0: class argmax and position top-k without Gumbel noise, no random draw at all.
# The agreement ports report (facts sheet): under sampling one early drift takes another path.
GREEDY_CONFIG = {"class_temperature": 0.0, "position_temperature": 0.0}
LANGUAGE = "English"


@dataclass
class GenerationRequest:
    """One generate() call, fully determined: same request + same model + same device = same tokens."""

    mode: str  # clone | design | auto | batch
    text: str | list[str]  # a list: one batched generate() (B items)
    seed: int = DEFAULT_SEED  # torch.manual_seed before generate(): gumbel position noise and sampling
    language: str | None = LANGUAGE
    instruct: str | None = None  # design mode only
    ref_audio: str | None = None  # clone mode: path of the 24 kHz reference WAV
    ref_text: str | None = None  # clone mode: its transcript
    num_step: int = 32  # upstream default

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationRequest:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def mode_request(
    mode: str,
    seed: int,
    num_step: int,
    ref_audio: Path | None = None,
    ref_text: str | None = None,
    text: str | None = None,
) -> GenerationRequest:
    """The default request of a capture mode."""
    return GenerationRequest(
        mode=mode,
        text=text or DEFAULT_TEXTS[mode],
        seed=seed,
        num_step=num_step,
        instruct=DEFAULT_INSTRUCT if mode in ("design", "batch") else None,
        ref_audio=str(ref_audio) if mode == "clone" else None,
        ref_text=ref_text if mode == "clone" else None,
    )


def run_generate(model: OmniVoice, request: GenerationRequest) -> np.ndarray:
    """Seed, then the upstream OmniVoice.generate() with this one-text request; the 1-D float32
    waveform (see generate_waveforms)."""
    if not isinstance(request.text, str):
        raise TypeError("run_generate takes one text; generate_waveforms takes a batch")
    return generate_waveforms(model, request)[0]


def generate_waveforms(
    model: OmniVoice, request: GenerationRequest, config: dict[str, Any] | None = None
) -> list[np.ndarray]:
    """Seed, then the upstream OmniVoice.generate() with this request; one 1-D float32 waveform
    per text (a list of texts is one batched call, as upstream runs it). `config`: fields of
    OmniVoiceGenerationConfig passed on (step 6's greedy runs: GREEDY_CONFIG).

    Upstream's ValueErrors for bad input (unsupported instruct items, say) are surfaced as one-line
    UserErrors.
    """
    import torch

    check_language(request.language)
    texts = [request.text] if isinstance(request.text, str) else request.text
    if not texts or any(not text or not text.strip() for text in texts):
        raise UserError("the text to speak is empty", "pass a non-empty --text")
    torch.manual_seed(request.seed)
    kwargs: dict[str, Any] = {"text": request.text, "language": request.language, "num_step": request.num_step}
    if request.instruct:
        kwargs["instruct"] = request.instruct
    if request.ref_audio:
        kwargs["ref_audio"] = request.ref_audio
        kwargs["ref_text"] = request.ref_text
    kwargs.update(config or {})
    try:
        audios = model.generate(**kwargs)
    except ValueError as exc:
        translated = _upstream_error(str(exc), request)
        if translated is None:
            raise
        raise translated from exc
    return [np.asarray(audio, dtype=np.float32) for audio in audios]


# The ValueErrors upstream's generate() raises for bad input, by the start of their message.
_INSTRUCT_ERRORS = (
    "Unsupported instruct items",
    "Cannot mix Chinese dialect and English accent",
    "Conflicting instruct items",
)
_EMPTY_AFTER_SILENCE_REMOVAL = "Reference audio is empty after silence removal"


def _upstream_error(message: str, request: GenerationRequest) -> UserError | None:
    """Upstream's ValueError for bad input as a one-line UserError in this CLI's terms; None for
    any other ValueError, a bug, raised as it is (a catch-all would turn numpy's "zero-size array"
    into advice).

    An instruct error's first paragraph names the problem (the item and a suggestion); the
    paragraph listing the valid English items is the fix. The silence-removal error's advice,
    "Try setting preprocess_prompt=False", names a generate() argument the scripts do not have.
    """
    if message.startswith(_INSTRUCT_ERRORS):
        problem = " ".join(message.strip().split("\n\n")[0].split())
        fix = next(
            (
                line.strip()
                for part in message.split("\n\n")
                for line in part.splitlines()
                if line.strip().startswith("Valid English items")
            ),
            None,
        )
        return UserError(f"--instruct: {problem}", fix)
    if message.startswith(_EMPTY_AFTER_SILENCE_REMOVAL):
        return UserError(
            f"reference audio {request.ref_audio} has no sound left after upstream's silence removal "
            "(everything in it is below -50 dBFS)",
            REFERENCE_FIX,
        )
    return None


def check_language(language: str | None) -> None:
    """UserError for a language upstream does not know.

    Upstream only logs a warning and falls back to language-agnostic mode; a user who asked for a
    language (a typo, say) would get that silently, so it is an error here, and 'None' is the
    explicit way to ask for language-agnostic mode.
    """
    from omnivoice.utils.lang_map import LANG_IDS, LANG_NAME_TO_ID

    if language is None or language.lower() == "none" or language in LANG_IDS or language.lower() in LANG_NAME_TO_ID:
        return
    raise UserError(
        f"unknown language {language!r}",
        "pass a language name (English, Chinese, ...) or id (en, zh, ...), or None for language-agnostic mode",
    )


def check_reference_audio(path: Path) -> None:
    """Validate a voice-clone reference before any model is loaded; one line per finding.

    Missing, empty, unreadable or silent: UserError. Another sample rate or several channels:
    accepted (upstream's load_audio resamples and averages the channels), with a note. Longer
    than 20 s: a warning, as upstream gives.
    """
    path = Path(path)
    if path.is_file() and path.stat().st_size == 0:
        raise UserError(f"reference audio {path} is an empty file", REFERENCE_FIX)
    audio, rate = read_wav(path, fix=REFERENCE_FIX)
    audio = audio[:, None] if audio.ndim == 1 else audio  # [T, C]
    if audio.shape[0] == 0:
        raise UserError(f"reference audio {path} has no samples", REFERENCE_FIX)
    finite = np.isfinite(audio)
    if not finite.all():
        # A float WAV can hold NaN and inf: upstream would normalise by their RMS and clone noise (or
        # nothing) without a word; soundfile reads integer formats as finite values always.
        raise UserError(
            f"reference audio {path} has {audio.size - int(finite.sum())} NaN or infinite samples "
            f"(first at {int(np.argmin(finite.all(axis=1))) / rate:.3f} s)",
            REFERENCE_FIX,
        )
    peak = float(np.max(np.abs(audio)))
    if peak < SILENT_PEAK:
        raise UserError(
            f"reference audio {path} is silent (peak {20 * np.log10(max(peak, 1e-12)):.0f} dBFS)", REFERENCE_FIX
        )
    if audio.shape[1] > 1:
        note(f"reference audio {path} has {audio.shape[1]} channels; they are averaged to mono, as upstream does")
    if rate != SAMPLE_RATE:
        note(f"reference audio {path} is {rate} Hz; it is resampled to {SAMPLE_RATE} Hz, as upstream does")
    seconds = audio.shape[0] / rate
    if seconds > REFERENCE_MAX_SECONDS:
        note(
            f"reference audio {path} is {seconds:.1f} s long (> {REFERENCE_MAX_SECONDS:.0f} s): slower generation, "
            "more memory and weaker cloning; trim it to 3-10 s",
            level="warning",
        )


def write_wav(path: Path, audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """Write a float32 WAV atomically (float keeps the exact samples for comparison).

    libsndfile adds a PEAK chunk to float WAVs holding the wall-clock time of the write, so equal
    samples would give different bytes (and capture sha256s) a second apart. The chunk is switched
    off before any sample is written: equal samples give equal files.
    """
    import soundfile

    samples = np.asarray(audio, dtype=np.float32)
    # Encoded in memory, written by Python: libsndfile reports a full disk or a denied folder as
    # "System error." with no errno, where Python's write raises ENOSPC / EACCES naming the file.
    encoded = io.BytesIO()
    with soundfile.SoundFile(
        encoded, "w", sample_rate, 1 if samples.ndim == 1 else samples.shape[1], subtype="FLOAT", format="WAV"
    ) as handle:
        # soundfile has no public switch for it: sf_command(SFC_SET_ADD_PEAK_CHUNK, SF_FALSE).
        soundfile._snd.sf_command(handle._file, SFC_SET_ADD_PEAK_CHUNK, soundfile._ffi.NULL, soundfile._snd.SF_FALSE)
        handle.write(samples)
    with atomic_path(Path(path)) as tmp:
        tmp.write_bytes(encoded.getvalue())


def read_wav(path: Path, fix: str | None = None) -> tuple[np.ndarray, int]:
    """(samples as float32 [T] or [T, C], sample_rate), or a UserError naming the file."""
    import soundfile

    path = existing_file(path, "audio file", fix)
    try:
        audio, rate = soundfile.read(str(path), dtype="float32", always_2d=False)
    except (RuntimeError, soundfile.LibsndfileError) as exc:
        raise UserError(f"{path} is not a readable audio file ({' '.join(str(exc).split())})", fix) from exc
    return audio, rate
