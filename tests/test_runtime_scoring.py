"""omnivoice_onnx.core.schedule and omnivoice_onnx.core.scoring against the real upstream functions.

Exact where upstream's arithmetic is IEEE float32 ops (schedule, guidance, temperature, top-k
filter, penalty, selection); measured where it is a transcendental (log_softmax, Gumbel noise),
and then the decisions (tokens, cells) compared over many seeds on real logits of the tiny model.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omnivoice.models.omnivoice import OmniVoiceGenerationConfig, _filter_top_k, _get_time_steps, _gumbel_sample

from omnivoice_onnx.core import schedule, scoring
from omnivoice_onnx.core.rng import TorchCpuRng

MASK_ID, CODEBOOKS, VOCAB = 1024, 8, 1025
T_SHIFTS = [0.1, 0.05, 0.3, 0.5, 1.0, 1.7, 0.123456]


def upstream_schedule(target_len: int, num_step: int, t_shift: float) -> list[int]:
    """The schedule loop of OmniVoice._generate_iterative (omnivoice 0.2.1), transcribed verbatim
    around the real `_get_time_steps`; generate()'s tests also capture it from a real run."""
    timesteps = _get_time_steps(t_start=0.0, t_end=1.0, num_step=num_step, t_shift=t_shift).tolist()
    total_mask = target_len * CODEBOOKS
    rem = total_mask
    sched = []
    for step in range(num_step):
        num = rem if step == num_step - 1 else min(math.ceil(total_mask * (timesteps[step + 1] - timesteps[step])), rem)
        sched.append(int(num))
        rem -= int(num)
    return sched


def ulps(ours: np.ndarray, theirs: np.ndarray, scale: np.ndarray | float = 1.0) -> np.ndarray:
    """|ours - theirs| in float32 ULPs of max(|theirs|, scale), over finite entries. `scale` is the
    magnitude the rounding errors are made at: a result near 0 that came from subtracting
    numbers near 5 carries their ULP, not its own."""
    finite = np.isfinite(theirs)
    magnitude = np.maximum(np.abs(theirs), np.float32(1) * scale)[finite].astype(np.float32)
    return np.abs(ours[finite].astype(np.float64) - theirs[finite]) / np.spacing(magnitude)


# ---- schedule -------------------------------------------------------------------------------


def test_linspace_is_torchs_fused_kernel():
    for steps in range(1, 258):
        theirs = torch.linspace(0.0, 1.0, steps).numpy()
        assert np.array_equal(schedule.linspace_f32(0.0, 1.0, steps), theirs), steps


@pytest.mark.parametrize("t_shift", T_SHIFTS)
def test_time_steps_equal_get_time_steps(t_shift):
    top = 256 if t_shift == 0.1 else 96
    for num_step in range(1, top + 1):
        theirs = _get_time_steps(t_start=0.0, t_end=1.0, num_step=num_step, t_shift=t_shift).tolist()
        assert schedule.time_steps(num_step, t_shift) == theirs, (num_step, t_shift)


def test_unmask_schedules_equal_upstream():
    rng = np.random.default_rng(7)
    cases = [
        (t_len, n, s)
        for t_len in (1, 2, 3, 25, 67, 250, 259, 750, 1400)
        for n in (1, 2, 4, 16, 32, 64)
        for s in (0.1, 0.5, 1.0)
    ]
    cases += [(int(rng.integers(1, 2000)), int(rng.integers(1, 80)), float(rng.uniform(0.01, 2.0))) for _ in range(150)]
    for t_len, num_step, t_shift in cases:
        ours = schedule.unmask_schedule(t_len, CODEBOOKS, num_step, t_shift)
        assert ours == upstream_schedule(t_len, num_step, t_shift), (t_len, num_step, t_shift)
        assert sum(ours) == t_len * CODEBOOKS


# ---- real logits of the tiny model ----------------------------------------------------------


@pytest.fixture(scope="module")
def real_logits(torch_model):
    """(c_logits, u_logits) torch tensors of every _predict_tokens_with_scoring call of two real
    upstream generate() runs on tiny (auto and design), 32 steps each."""
    calls = []
    original = torch_model._predict_tokens_with_scoring

    def record(c_logits, u_logits, gen_config):
        calls.append((c_logits.clone(), u_logits.clone()))
        return original(c_logits, u_logits, gen_config)

    torch_model._predict_tokens_with_scoring = record
    try:
        torch.manual_seed(0)
        torch_model.generate(text="Hello there, this is a test of the tiny model.", language="en")
        torch.manual_seed(1)
        torch_model.generate(text="A second, shorter one.", instruct="female, low pitch")
    finally:
        del torch_model._predict_tokens_with_scoring
    assert len(calls) == 64
    return calls


def random_logits(seed: int, t_len: int, scale: float = 10.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(1, CODEBOOKS, t_len, VOCAB, generator=g) * scale,
        torch.randn(1, CODEBOOKS, t_len, VOCAB, generator=g) * scale,
    )


def test_log_softmax_is_the_documented_recipe(real_logits):
    """scoring.log_softmax widens inside the exp (no float64 copy) and subtracts in place; its
    bits are the recipe of docs/runtime.md written out step by step, on real and wide logits."""
    for x in [real_logits[0][0].numpy(), real_logits[-1][1].numpy(), random_logits(5, 64, 40.0)[0].numpy()]:
        shifted = x - x.max(axis=-1, keepdims=True)
        recipe = shifted - np.log(np.exp(shifted.astype(np.float64)).sum(axis=-1, keepdims=True)).astype(np.float32)
        assert np.array_equal(scoring.log_softmax(x), recipe)


def test_guided_log_probs_is_the_combination_in_upstream_order(real_logits):
    """guided_log_probs combines in place in u's buffer: its bits are c + g * (c - u) written out,
    then log_softmax and the mask column, and the caller's logits are left as they were."""
    for c_tensor, u_tensor in real_logits[::8]:
        c, u = c_tensor.numpy(), u_tensor.numpy()
        c_before, u_before = c.copy(), u.copy()
        c_lp, u_lp = scoring.log_softmax(c), scoring.log_softmax(u)
        expected = scoring.log_softmax(c_lp + np.float32(2.0) * (c_lp - u_lp))
        expected[..., MASK_ID] = -np.inf
        assert np.array_equal(scoring.guided_log_probs(c, u, 2.0, MASK_ID), expected)
        assert np.array_equal(c, c_before) and np.array_equal(u, u_before)


def test_log_softmax_within_ulps_of_torch(real_logits):
    """torch's float32 log_softmax is not correctly rounded; ours (float64 log-sum-exp rounded
    once) differs from it by a few ULPs (of the row's log-sum-exp) on a few percent of elements,
    never in the argmax."""
    tensors = [t for pair in real_logits[::4] for t in pair] + list(random_logits(3, 300))
    equal = total = 0
    worst = 0.0
    for x in tensors:
        theirs = F.log_softmax(x, dim=-1).numpy()
        ours = scoring.log_softmax(x.numpy())
        assert np.array_equal(ours.argmax(-1), theirs.argmax(-1))
        # The row's max entry is 0 - lse; a float32 sum cannot hold 1 + 2**-24, so below 1 the
        # log-sum-exp's error is absolute (~2**-24): ULPs of max(|value|, lse, 1).
        log_sum_exp = np.maximum(-theirs.max(axis=-1, keepdims=True), np.float32(1))
        worst = max(worst, float(ulps(ours, theirs, np.broadcast_to(log_sum_exp, theirs.shape)).max()))
        equal += int((ours == theirs).sum())
        total += ours.size
    print(f"\nlog_softmax vs torch: {equal / total:.4%} equal, max {worst:.1f} ULP over {total} elements")
    assert worst <= 8 and equal / total > 0.9


@pytest.mark.parametrize("seed", range(10))
def test_gumbel_sample_within_an_ulp_and_draws_the_same_words(seed):
    """Same uniforms (exact), noise within an ULP of torch's; the stream advances identically."""
    shape = (1, CODEBOOKS, 17 + 13 * seed)
    logits = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3
    for temperature in (5.0, 1.0, 0.7):
        torch.manual_seed(seed)
        theirs = _gumbel_sample(logits, temperature).numpy()
        after_theirs = torch.rand(5).numpy()
        rng = TorchCpuRng(seed)
        ours = scoring.gumbel_sample(logits.numpy(), temperature, rng)
        assert np.array_equal(rng.rand(5), after_theirs)
        assert ulps(ours, theirs).max() <= 2, temperature
        assert np.mean(ours == theirs) > 0.7


def test_temperature_division_and_guidance_are_exact_float32(real_logits):
    c, u = real_logits[5]
    c_lp, u_lp = F.log_softmax(c, dim=-1), F.log_softmax(u, dim=-1)
    for scale in (2.0, 1.3, 0.7, 3.0):
        theirs = (c_lp + scale * (c_lp - u_lp)).numpy()
        ours = c_lp.numpy() + np.float32(scale) * (c_lp.numpy() - u_lp.numpy())
        assert np.array_equal(ours, theirs), scale
    for temperature in (5.0, 1.3, 0.7, 3.0):
        assert np.array_equal(c.numpy() / np.float32(temperature), (c / temperature).numpy())


@pytest.mark.parametrize("seed", range(6))
def test_filter_top_k_equals_upstream(seed):
    log_probs = F.log_softmax(random_logits(seed, 40)[0], dim=-1)
    log_probs[..., MASK_ID] = -float("inf")
    assert np.array_equal(scoring.filter_top_k(log_probs.numpy()), _filter_top_k(log_probs, ratio=0.1).numpy())


def test_layer_penalty_equals_upstream_expression():
    confidence = torch.randn(1, CODEBOOKS, 33) * 4
    layer_ids = torch.arange(CODEBOOKS).view(1, -1, 1)
    for factor in (5.0, 0.3, 2.5):
        assert np.array_equal(
            scoring.layer_penalty(confidence.numpy(), factor), (confidence - layer_ids * factor).numpy()
        )


BASE = OmniVoiceGenerationConfig()
CONFIGS = {
    "default": BASE,
    "no-guidance": replace(BASE, guidance_scale=0.0),
    "guidance-1.3": replace(BASE, guidance_scale=1.3),
    "class-temp-1": replace(BASE, class_temperature=1.0),
    "class-temp-0.5-guidance-3": replace(BASE, class_temperature=0.5, guidance_scale=3.0),
    "no-position-noise": replace(BASE, position_temperature=0.0),
    "no-layer-penalty": replace(BASE, layer_penalty_factor=0.0),
}


@pytest.mark.parametrize("name", list(CONFIGS)[:5])
def test_predict_tokens_equal_upstream(torch_model, real_logits, name):
    """Tokens 100 % equal on every other recorded call (greedy and sampled); confidences within
    ULPs (of max(|confidence|, 1))."""
    config = CONFIGS[name]
    worst = 0.0
    for index, (c, u) in enumerate(real_logits[::2]):
        torch.manual_seed(index)
        tokens, confidence = torch_model._predict_tokens_with_scoring(c, u, config)
        ours_tokens, ours_conf = scoring.predict_tokens(
            c.numpy(), u.numpy(), config.guidance_scale, config.class_temperature, MASK_ID, TorchCpuRng(index)
        )
        assert np.array_equal(ours_tokens, tokens.numpy()), index
        worst = max(worst, float(ulps(ours_conf, confidence.numpy()).max()))
    print(f"\nconfidence vs torch ({name}): max {worst:.1f} ULP")
    assert worst <= 16


def upstream_item_step(model, c_logits, u_logits, item_tokens, k, config):
    """One item's share of a step of OmniVoice._generate_iterative (omnivoice 0.2.1), transcribed
    verbatim around the real _predict_tokens_with_scoring and _gumbel_sample. -> (tokens, cells)."""
    layer_ids = torch.arange(CODEBOOKS).view(1, -1, 1)
    pred_tokens, scores = model._predict_tokens_with_scoring(c_logits, u_logits, config)
    scores = scores - (layer_ids * config.layer_penalty_factor)
    if config.position_temperature > 0.0:
        scores = _gumbel_sample(scores, config.position_temperature)
    sample_tokens = item_tokens.clone()
    scores.masked_fill_(sample_tokens != MASK_ID, -float("inf"))
    _, topk_idx = torch.topk(scores.flatten(), k)
    flat_tokens = sample_tokens.flatten()
    flat_tokens[topk_idx] = pred_tokens.flatten()[topk_idx]
    return flat_tokens.view_as(sample_tokens), np.sort(topk_idx.numpy())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_item_steps_equal_upstream(torch_model, real_logits, name):
    """The whole per-item step on real logits, with partly unmasked token states and upstream's
    own schedule counts: cells and tokens equal for every recorded call of every 4th step."""
    config = CONFIGS[name]
    for index, (c, u) in enumerate(real_logits[::4]):
        t_len = c.shape[2]
        step = (3 * index) % 16
        counts = upstream_schedule(t_len, 16, config.t_shift)
        seed = 1000 + index
        torch.manual_seed(seed)
        state = torch.full((1, CODEBOOKS, t_len), MASK_ID, dtype=torch.long)
        done = torch.randperm(CODEBOOKS * t_len)[: sum(counts[:step])]
        state.view(-1)[done] = torch.randint(0, MASK_ID, (len(done),))
        torch.manual_seed(seed)
        theirs_tokens, theirs_cells = upstream_item_step(torch_model, c, u, state, counts[step], config)
        ours_tokens, ours_cells = scoring.unmask_step(
            c.numpy(),
            u.numpy(),
            state.numpy(),
            counts[step],
            guidance_scale=config.guidance_scale,
            class_temperature=config.class_temperature,
            layer_penalty_factor=config.layer_penalty_factor,
            position_temperature=config.position_temperature,
            mask_id=MASK_ID,
            rng=TorchCpuRng(seed),
        )
        assert np.array_equal(ours_cells, theirs_cells), index
        assert np.array_equal(ours_tokens, theirs_tokens.numpy()), index


def test_exact_ties_take_the_lower_index_where_torch_topk_does_not():
    """torch.topk's choice among equal values follows libstdc++'s selection, not index order;
    select_cells documents and applies the lower-index-first rule."""
    scores = np.zeros((1, CODEBOOKS, 300), dtype=np.float32)
    tokens = np.full(scores.shape, MASK_ID, dtype=np.int64)
    assert list(scoring.select_cells(scores, tokens, MASK_ID, 100)) == list(range(100))
    theirs = np.sort(torch.topk(torch.from_numpy(scores).flatten(), 100).indices.numpy())
    assert list(theirs) != list(range(100))
    tokens.reshape(-1)[:50] = 3  # unmasked cells never come back
    assert list(scoring.select_cells(scores, tokens, MASK_ID, 100)) == list(range(50, 150))
