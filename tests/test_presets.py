"""The OpenAI-named presets (omnivoice_onnx.presets) are voices the runtime accepts: each
instruct resolves as generate() resolves it (upstream's vocabulary, no conflicting items), and each
preset is a distinct (instruct, seed) pair. Fast: the runtime config alone, no model run."""

from __future__ import annotations

from omnivoice_onnx.presets import OPENAI_MODEL_IDS, PRESETS
from omnivoice_onnx.prompt import resolve_instruct

OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse")


def test_every_openai_voice_has_a_valid_preset(config) -> None:
    assert tuple(PRESETS) == OPENAI_VOICES
    assert OPENAI_MODEL_IDS == ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
    for name, preset in PRESETS.items():
        assert preset.name == name
        assert resolve_instruct(preset.instruct, False, config["instruct"]) == preset.instruct, name
    assert len({preset.instruct for preset in PRESETS.values()}) == len(PRESETS)
    assert len({preset.seed for preset in PRESETS.values()}) == len(PRESETS)


def test_the_docs_table_is_the_presets() -> None:
    """docs/drop-in.md's preset table lists every preset as presets.py defines it."""
    from conftest import REPO

    page = (REPO / "docs" / "drop-in.md").read_text()
    for preset in PRESETS.values():
        assert f"| `{preset.name}` | {preset.instruct} | {preset.seed} |" in page, preset.name
