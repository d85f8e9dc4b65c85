"""The OpenAI-named presets (omnivoice_onnx.voices.PRESETS) are voices the runtime accepts: each
instruct resolves as generate() resolves it (upstream's vocabulary, no conflicting items), and each
preset is a distinct (instruct, seed) pair. Fast: the runtime config alone, no model run."""

from __future__ import annotations

from omnivoice_onnx.core.instruct import resolve_instruct
from omnivoice_onnx.serve.service import OPENAI_MODEL_IDS
from omnivoice_onnx.voices import PRESETS, find_preset

# The voices of the `openai` package's speech API (its type hints), in PRESETS' order.
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)


def test_every_openai_voice_has_a_valid_preset(config) -> None:
    assert tuple(PRESETS) == OPENAI_VOICES
    assert OPENAI_MODEL_IDS == ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
    for name, preset in PRESETS.items():
        assert preset.name == name
        assert resolve_instruct(preset.instruct, False, config["instruct"]) == preset.instruct, name
    assert len({preset.instruct for preset in PRESETS.values()}) == len(PRESETS)
    assert len({preset.seed for preset in PRESETS.values()}) == len(PRESETS)


def test_the_installed_openai_sdk_names_no_voice_without_a_preset() -> None:
    """Every voice the installed `openai` package's speech API lists is a preset, in any case."""
    import typing

    from openai.resources.audio.speech import Speech

    hint = typing.get_type_hints(Speech.create)["voice"]
    names = {arg for part in typing.get_args(hint) for arg in typing.get_args(part) if isinstance(arg, str)}
    assert names and names <= set(PRESETS), names - set(PRESETS)
    assert find_preset("Alloy") is find_preset("ALLOY") is PRESETS["alloy"]
    assert find_preset("nobody") is None


def test_the_docs_table_is_the_presets() -> None:
    """docs/drop-in.md's preset table lists every preset as voices.PRESETS defines it."""
    from conftest import REPO

    page = (REPO / "docs" / "drop-in.md").read_text()
    for preset in PRESETS.values():
        assert f"| `{preset.name}` | {preset.instruct} | {preset.seed} |" in page, preset.name


def test_voice_catalogue_hides_presets_under_saved_names() -> None:
    """Service.voice_catalogue, read by GET /v1/audio/voices and Wyoming's Info: "auto" (never
    "design", which speaks only with instructions), saved voices with their seeds, then the presets
    no saved voice hides (a voice file named like a built-in mode, which resolves first, is never
    listed: voices.voice_files, test_voices). Wyoming's list: saved, presets, then "auto" once."""
    from pathlib import Path
    from types import SimpleNamespace

    from omnivoice_onnx.serve.service import Service
    from omnivoice_onnx.serve.wyoming import AUTO_DESCRIPTION, entry_label, voice_entries
    from omnivoice_onnx.voices import Voice

    saved = [Voice("alloy", None, "male, elderly", "f", Path(), 7), Voice("mine", object(), None, "f", Path())]  # type: ignore[arg-type]
    service = SimpleNamespace(saved_voices=lambda: saved)
    service.voice_catalogue = lambda: Service.voice_catalogue(service)
    catalogue = service.voice_catalogue()
    presets = [name for name in PRESETS if name != "alloy"]
    assert [entry.name for entry in catalogue] == ["auto", "alloy", "mine", *presets]
    assert [(entry.kind, entry.seed) for entry in catalogue[:3]] == [("builtin", None), ("design", 7), ("clone", None)]
    assert all(entry.kind == "preset" and entry.seed == PRESETS[entry.name].seed for entry in catalogue[3:])
    entries = voice_entries(service, set())
    assert [entry.name for entry in entries] == ["alloy", "mine", *presets, "auto"]
    assert [entry_label(entry) for entry in entries[:2]] == ["alloy: male, elderly", "mine: cloned voice"]
    assert entry_label(entries[-1]) == f"auto: {AUTO_DESCRIPTION}"
