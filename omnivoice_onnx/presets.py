"""OpenAI's voice and model names, mapped onto this runtime, so OpenAI clients work unchanged.

Open WebUI, Home Assistant's OpenAI TTS integration and most SDK examples send `model="tts-1"`
and a voice such as `alloy`. OmniVoice has no named speakers: without a reference it designs a
voice from a description (an instruct) and the seed. A preset is therefore a voice-design
instruct AND a fixed seed: the same instruct with another seed is another speaker, so the seed is
what makes `alloy` the same voice on every request (and a request's own `seed` still wins).

Resolution, in the servers (omnivoice_onnx.serve.app, omnivoice_onnx.serve.wyoming): a saved voice
of the same name first (save one called `alloy` to replace the preset), else the preset below.
Names are matched without regard to case (`Alloy` is `alloy`): clients capitalise them in menus.
The voices are the current `openai` SDK's thirteen (marin and cedar the newest); each has a
design no other preset uses.
The instructs use only upstream's English instruct vocabulary (runtime-config.json's
instruct.valid_en; tests/test_presets.py resolves each one as generate() does).
With random weights (the tiny and full-random checkpoints) every preset speaks noise: the
descriptions say what the real checkpoint is asked for, not what a test bundle sounds like.
"""

from __future__ import annotations

from dataclasses import dataclass

# The model ids OpenAI clients send (speech models); each names the server's default variant.
OPENAI_MODEL_IDS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


@dataclass(frozen=True)
class Preset:
    """A built-in voice: what generate() is asked for when a request names it."""

    name: str  # OpenAI's voice name
    instruct: str  # voice design, in upstream's instruct vocabulary
    seed: int  # the seed used when the request gives none (the speaker, for a designed voice)

    def generate_kwargs(self) -> dict[str, str]:
        """The generate()/stream() keywords of this voice (the seed is chosen by the caller)."""
        return {"instruct": self.instruct}


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset("alloy", "female, young adult, moderate pitch, american accent", 1001),
        Preset("ash", "male, young adult, moderate pitch, american accent", 1002),
        Preset("ballad", "male, middle-aged, low pitch, british accent", 1003),
        Preset("coral", "female, middle-aged, moderate pitch, american accent", 1004),
        Preset("echo", "male, middle-aged, moderate pitch, canadian accent", 1005),
        Preset("fable", "male, young adult, moderate pitch, british accent", 1006),
        Preset("nova", "female, young adult, high pitch, american accent", 1007),
        Preset("onyx", "male, middle-aged, very low pitch, american accent", 1008),
        Preset("sage", "female, middle-aged, low pitch, british accent", 1009),
        Preset("shimmer", "female, young adult, moderate pitch, australian accent", 1010),
        Preset("verse", "male, young adult, high pitch, american accent", 1011),
        Preset("marin", "female, middle-aged, low pitch, american accent", 1012),
        Preset("cedar", "male, middle-aged, low pitch, american accent", 1013),
    )
}


def find_preset(name: str) -> Preset | None:
    """The preset called `name`, whatever its case (None: no preset of that name)."""
    return PRESETS.get(name.casefold()) if isinstance(name, str) else None
