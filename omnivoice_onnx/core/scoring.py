"""One unmasking step's arithmetic for one item, in float32 as upstream computes it.

Reproduces, from `omnivoice/models/omnivoice.py` (omnivoice 0.2.1):
    OmniVoice._predict_tokens_with_scoring   -> predict_tokens
    _filter_top_k                            -> filter_top_k
    _gumbel_sample                           -> gumbel_sample
    and, inline in OmniVoice._generate_iterative, the layer penalty (layer_penalty), the
    `masked_fill_` + `torch.topk(scores.flatten(), k)` choice of cells (select_cells) and the
    token update (unmask).

Exact, element for element (IEEE float32 ops in upstream's order): the guidance combination
`c + g * (c - u)` (g rounded to float32, as torch does with a Python scalar), the division by a
temperature (a true float32 division), `u + 1e-10` (1e-10 rounded to float32), the layer penalty,
every argmax / max / masked fill, and the random draws (omnivoice_onnx.core.rng).

NOT exact, by design: the transcendentals. torch computes float32 `log` with MKL's vector log and
`log_softmax` with its vectorised exp and a SIMD-width-dependent summation order; neither is
correctly rounded, and log_softmax's result even depends on the CPU (torch's AVX2, AVX512 and
no-SIMD kernels disagree with each other). There is no single torch
value to match. Here they are computed in float64 and rounded once to float32 (correctly rounded
in practice), a recipe any language reproduces with its double-precision exp/log:
    log32(x)        = float32(log(float64(x)))
    log_softmax(x)  = s - float32(log(sum(exp(float64(s))))),  s = x - max(x)  (s and the final
                      subtraction in float32, the operation order of torch's kernel)
Against torch, these values agree within a few ULPs (tests/test_runtime_scoring.py bounds them;
the figures: docs/runtime.md, "What must match exactly"). Such
differences change a decision only where two candidates are within ULPs of each other (an argmax
near-tie, the k-th/(k+1)-th cell of the top-k): every token and every chosen cell of the tests'
recorded steps is equal.

Ties: torch.topk on CPU picks among exactly equal scores in an order set by libstdc++'s
nth_element/partial_sort (not stable, not lowest-index-first). Exact float32 ties at the top-k
boundary need two scores to round to the same float32 after Gumbel noise; when they happen this
runtime takes the LOWER flat index first (a stable sort), a rule a port can state in one line.
"""

from __future__ import annotations

import math

import numpy as np

from omnivoice_onnx.core.rng import TorchCpuRng

F32 = np.float32
GUMBEL_EPS = F32(1e-10)  # upstream's `+ 1e-10`, twice, rounded to float32 by torch
TOP_K_RATIO = 0.1  # _filter_top_k's ratio as _predict_tokens_with_scoring calls it


def log32(x: np.ndarray) -> np.ndarray:
    """Natural log of float32 `x`, evaluated in float64 and rounded once to float32."""
    return np.log(x.astype(np.float64)).astype(F32)


def log_softmax(x: np.ndarray) -> np.ndarray:
    """float32 log_softmax over the last axis: s = x - max, then s - log(sum(exp(s))), the
    log-sum-exp evaluated in float64 and rounded to float32 (see the module docstring)."""
    shifted: np.ndarray = x - x.max(axis=-1, keepdims=True)
    # dtype=float64 widens each element exactly before the float64 exp, as astype would, without
    # a float64 copy of the whole array. The sum runs in numpy's pairwise order, which is part of
    # the recipe (docs/runtime.md: a sequential double sum changes some rows' last bit).
    log_sum_exp = np.log(np.exp(shifted, dtype=np.float64).sum(axis=-1, keepdims=True)).astype(F32)
    shifted -= log_sum_exp
    return shifted


def gumbel_sample(logits: np.ndarray, temperature: float, rng: TorchCpuRng) -> np.ndarray:
    """`_gumbel_sample`: logits / T plus Gumbel noise from one uniform draw of logits' shape.

    -log(-log(u + 1e-10) + 1e-10), each op in float32 as upstream; -inf logits stay -inf (the
    draw still covers them: a [1, C, T, V] class draw consumes C*T*V words).
    """
    scaled = logits / F32(temperature)
    u = rng.rand(scaled.shape)
    noise = -log32(-log32(u + GUMBEL_EPS) + GUMBEL_EPS)
    noisy: np.ndarray = scaled + noise
    return noisy


def top_k_order(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries along the last axis, ties to the lower index (stable)."""
    return np.argsort(-values, axis=-1, kind="stable")[..., :k]


def filter_top_k(log_probs: np.ndarray, ratio: float = TOP_K_RATIO) -> np.ndarray:
    """`_filter_top_k`: keep the ceil(ratio * V) largest values of each row, -inf elsewhere."""
    k = math.ceil(ratio * log_probs.shape[-1])
    keep = top_k_order(log_probs, k)
    filtered = np.full_like(log_probs, -np.inf)
    np.put_along_axis(filtered, keep, np.take_along_axis(log_probs, keep, axis=-1), axis=-1)
    return filtered


def guided_log_probs(c_logits: np.ndarray, u_logits: np.ndarray, guidance_scale: float, mask_id: int) -> np.ndarray:
    """The classifier-free-guided log-probabilities of `_predict_tokens_with_scoring`, with the
    mask id's column set to -inf. c_logits/u_logits [1, C, T, V] float32 -> [1, C, T, V] float32."""
    if guidance_scale != 0:
        c_log_probs, guided = log_softmax(c_logits), log_softmax(u_logits)
        # c + g * (c - u), in that order, in place in u's buffer (IEEE addition commutes exactly)
        np.subtract(c_log_probs, guided, out=guided)
        guided *= F32(guidance_scale)
        guided += c_log_probs
        log_probs = log_softmax(guided)
    else:
        log_probs = log_softmax(c_logits)
    log_probs[..., mask_id] = -np.inf
    return log_probs


def predict_tokens(
    c_logits: np.ndarray,
    u_logits: np.ndarray,
    guidance_scale: float,
    class_temperature: float,
    mask_id: int,
    rng: TorchCpuRng,
) -> tuple[np.ndarray, np.ndarray]:
    """`_predict_tokens_with_scoring`: (tokens [1, C, T] int64, confidence [1, C, T] float32).

    Greedy (class_temperature 0) takes the argmax of the guided log-probs; otherwise the argmax of
    Gumbel-perturbed top-10 % log-probs, which draws C*T*V uniforms. The confidence is always the
    max of the unperturbed guided log-probs.
    """
    log_probs = guided_log_probs(c_logits, u_logits, guidance_scale, mask_id)
    if class_temperature > 0.0:
        tokens = gumbel_sample(filter_top_k(log_probs), class_temperature, rng).argmax(axis=-1)
    else:
        tokens = log_probs.argmax(axis=-1)
    return tokens.astype(np.int64), log_probs.max(axis=-1)


def layer_penalty(confidence: np.ndarray, factor: float) -> np.ndarray:
    """`scores - layer_ids * layer_penalty_factor`: codebook c loses c * factor (float32), so
    earlier codebooks unmask first. confidence [1, C, T]."""
    layer_ids = np.arange(confidence.shape[1], dtype=F32).reshape(1, -1, 1)
    penalised: np.ndarray = confidence - layer_ids * F32(factor)
    return penalised


def select_cells(scores: np.ndarray, item_tokens: np.ndarray, mask_id: int, k: int) -> np.ndarray:
    """The k flat cells (over C*T) to unmask: the highest scores among still-masked cells
    (`masked_fill_(tokens != mask_id, -inf)` then `topk(scores.flatten(), k)`), as a sorted
    int64 array; which of them torch lists first does not matter to the update."""
    masked_scores = np.where(item_tokens != mask_id, F32(-np.inf), scores)
    return np.sort(top_k_order(masked_scores.ravel(), k))


def unmask(item_tokens: np.ndarray, predicted: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """The item's tokens [1, C, T] with the chosen flat `cells` set to the predicted tokens."""
    flat = item_tokens.ravel().copy()
    flat[cells] = predicted.ravel()[cells]
    tokens: np.ndarray = flat.reshape(item_tokens.shape)
    return tokens


def unmask_step(
    c_logits: np.ndarray,
    u_logits: np.ndarray,
    item_tokens: np.ndarray,
    k: int,
    *,
    guidance_scale: float,
    class_temperature: float,
    layer_penalty_factor: float,
    position_temperature: float,
    mask_id: int,
    rng: TorchCpuRng,
) -> tuple[np.ndarray, np.ndarray]:
    """One item's share of one step of `_generate_iterative`: (new tokens [1, C, T], cells unmasked).

    Random draws, in upstream's order: the class draw [1, C, T, V] (class_temperature > 0), then
    the position draw [1, C, T] (position_temperature > 0).
    """
    predicted, confidence = predict_tokens(c_logits, u_logits, guidance_scale, class_temperature, mask_id, rng)
    scores = layer_penalty(confidence, layer_penalty_factor)
    if position_temperature > 0.0:
        scores = gumbel_sample(scores, position_temperature, rng)
    cells = select_cells(scores, item_tokens, mask_id, k)
    return unmask(item_tokens, predicted, cells), cells
