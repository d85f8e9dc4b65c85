"""What an export inherits is read from the checkpoint, and the report names no build
machine's paths. Fast: made-up checkpoint folders, no weights (the export's own card is checked
on the session pipeline in test_export.py)."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO

from omnivoice_export.step2_export import model_card, report


def test_declared_licence_and_tokenizer_licence_file(tmp_path: Path) -> None:
    """A checkpoint whose README.md declares its licence (as k2-fsa/OmniVoice's does) gives that
    licence; the audio tokenizer's licence file is copied into the bundle and named in the card."""
    model = tmp_path / "ckpt"
    (model / "audio_tokenizer").mkdir(parents=True)
    (model / "README.md").write_text("---\nlicense: cc-by-nc-4.0\nlanguage:\n- en\n---\n# OmniVoice\n")
    (model / "config.json").write_text("{}")
    (model / "audio_tokenizer" / "LICENSE").write_text("the tokenizer's terms")
    prov = model_card.provenance(model)
    assert (prov["license"], prov["random_weights"], prov["source"]) == (
        "cc-by-nc-4.0",
        False,
        "local checkpoint 'ckpt'",
    )
    assert prov["license_files"] == ["audio_tokenizer/LICENSE"]
    onnx = tmp_path / "onnx"
    onnx.mkdir()
    assert model_card.copy_licence_files(model, onnx, prov["license_files"]) == ["audio_tokenizer-LICENSE"]
    assert (onnx / "audio_tokenizer-LICENSE").read_text() == "the tokenizer's terms"
    card = model_card.write(onnx, {"model": {"fingerprint": "sha256:0123456789abcdef"}, "provenance": prov}).read_text()
    assert card.startswith("---\nlicense: cc-by-nc-4.0\nbase_model: k2-fsa/OmniVoice\n")
    assert "`audio_tokenizer-LICENSE`" in card and "Random weights" not in card and str(tmp_path) not in card


def test_undeclared_licence_is_other_and_a_hub_snapshot_is_named_by_repo(tmp_path: Path) -> None:
    snapshot = tmp_path / "hub" / "models--k2-fsa--OmniVoice" / "snapshots" / "0123456789abcdef0123"
    snapshot.mkdir(parents=True)
    prov = model_card.provenance(snapshot)
    assert prov["source"] == "huggingface.co/k2-fsa/OmniVoice @ 0123456789ab"
    assert prov["license"] == "other" and prov["license_from"].startswith("unknown")


def test_report_paths_are_the_projects_or_local_only(tmp_path: Path) -> None:
    assert report.project_path(REPO / "checkpoints" / "tiny") == ("checkpoints/tiny", False)
    assert report.project_path(tmp_path / "capture") == (str((tmp_path / "capture").resolve()), True)
    assert report.recorded_path("checkpoints/tiny") == REPO / "checkpoints" / "tiny"
    assert report.recorded_path(str(tmp_path)) == tmp_path
