"""The body of POST /v1/audio/script (omnivoice_onnx.serve.app runs it): a multi-speaker script,
lines of {voice, text} made into one audio file, as omnivoice-server's route of that name.

A module of its own because the request's shape is a table of fields and ranges that the route
only reads; app.py holds how the lines are made and joined.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omnivoice_onnx.limits import MAX_PAUSE_S, MAX_SPEED, MIN_PAUSE_S, MIN_SPEED, SEED_MAX, SEED_MIN
from omnivoice_onnx.serve.door import MAX_INPUT_CHARS, MAX_INSTRUCTIONS_CHARS

if TYPE_CHECKING:  # pydantic is the serve extra's, imported where the model is built
    from pydantic import BaseModel

MAX_SCRIPT_LINES = 100  # lines of one script (the body's 64 KiB bounds their text too)
DEFAULT_PAUSE_S = 0.5  # silence between two lines of a script (omnivoice-server's pause_between_speakers)


def script_request_model() -> type[BaseModel]:
    """The pydantic model of a POST /v1/audio/script body: `script`, a list of lines {voice, text,
    and optionally instructions, language, speed, seed}, and the fields every line shares
    (response_format, pause, stream, language, speed, seed, num_step, guidance_scale; a line's own
    value wins). Unknown fields are refused and numbers are strict, as in a speech request."""
    from pydantic import BaseModel, ConfigDict, Field

    class ScriptLine(BaseModel):
        model_config = ConfigDict(extra="forbid")
        voice: str
        text: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)
        instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
        language: str | None = None
        speed: float | None = Field(None, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False, strict=True)
        seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX, strict=True)

    class ScriptRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        model: str | None = None  # optional (omnivoice-server's script has none); checked when given
        script: list[ScriptLine] = Field(min_length=1, max_length=MAX_SCRIPT_LINES)
        response_format: str | None = None
        pause: float = Field(DEFAULT_PAUSE_S, ge=MIN_PAUSE_S, le=MAX_PAUSE_S, allow_inf_nan=False, strict=True)
        stream: bool | None = Field(None, strict=True)
        language: str | None = None
        speed: float | None = Field(None, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False, strict=True)
        seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX, strict=True)
        num_step: int | None = Field(None, ge=1, strict=True)
        guidance_scale: float | None = Field(None, allow_inf_nan=False, strict=True)

    return ScriptRequest
