"""omnivoice_onnx.core.rng against torch's CPU generator: torch.manual_seed + torch.rand / rand_like.

Exact equality (every float32 bit) for many seeds, sizes and interleaved draw sequences.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnivoice_onnx.core.rng import TorchCpuRng, fresh_seed, init_genrand
from omnivoice_onnx.errors import UserError
from omnivoice_onnx.limits import check_seed

EDGE_SEEDS = [
    0,
    1,
    2,
    42,
    1234,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**32 + 1,
    2**32 + 1234,
    2**40 + 7,
    2**63 - 1,
    2**63,
    2**64 - 1,
    -1,
    -2,
    -1234,
    -(2**31),
    -(2**32),
    -(2**63),
]
SEEDS = EDGE_SEEDS + [int(s) for s in np.random.default_rng(2026).integers(0, 2**63, 32)] + list(range(3, 13))
SIZES = [1, 7, 15, 16, 17, 31, 32, 33, 1000, 8 * 300, 8 * 300 * 1025]


def torch_draws(seed: int, shapes: list[tuple[int, ...]], like: bool = False) -> list[np.ndarray]:
    """What upstream's generator gives: manual_seed, then rand (or rand_like) per shape in order."""
    torch.manual_seed(seed)
    if like:
        return [torch.rand_like(torch.zeros(shape, dtype=torch.float32)).numpy() for shape in shapes]
    return [torch.rand(shape).numpy() for shape in shapes]


def assert_bit_equal(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    assert ours.dtype == np.float32 and theirs.dtype == np.float32, what
    assert ours.shape == theirs.shape, what
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)), (
        f"{what}: {np.mean(ours != theirs):.2%} of elements differ"
    )


def test_seeds_cover_what_the_brief_names():
    assert len(set(SEEDS)) >= 50
    assert {0, 1, 42, 1234, 2**31 - 1, 2**32 - 1, 2**32, 2**63 - 1} <= set(SEEDS)


@pytest.mark.parametrize("seed", SEEDS)
def test_sizes_match_torch(seed):
    sizes = SIZES if seed in EDGE_SEEDS else SIZES[:-1]  # the 2.46M-element draw for the edge seeds only
    for size in sizes:
        (theirs,) = torch_draws(seed, [(size,)])
        assert_bit_equal(TorchCpuRng(seed).rand(size), theirs, f"seed {seed} size {size}")


@pytest.mark.parametrize("seed", SEEDS[::3])
def test_multi_dim_shapes_fill_in_c_order(seed):
    shapes = [(1, 8, 37), (1, 8, 5, 1025), (3, 1), (2, 3, 4, 5)]
    rng = TorchCpuRng(seed)
    for shape, theirs in zip(shapes, torch_draws(seed, shapes)):
        assert_bit_equal(rng.rand(shape), theirs, f"seed {seed} shape {shape}")


@pytest.mark.parametrize("seed", SEEDS[:25])
def test_interleaved_generate_order_matches_rand_like(seed):
    """generate()'s order: per step, per item, a class draw [1,C,T,V] (class_temperature > 0) then a
    position draw [1,C,T]; items of different lengths; rand_like on float32 tensors."""
    rng_np = np.random.default_rng(seed % 2**32)
    lengths = [int(t) for t in rng_np.integers(1, 60, 3)]
    shapes = []
    for _step in range(4):
        for t_len in lengths:
            shapes += [(1, 8, t_len, 1025), (1, 8, t_len)]
    rng = TorchCpuRng(seed)
    for shape, theirs in zip(shapes, torch_draws(seed, shapes, like=True)):
        assert_bit_equal(rng.rand(shape), theirs, f"seed {seed} shape {shape}")
    assert rng.words_drawn == sum(int(np.prod(shape)) for shape in shapes)


def test_raw_words_are_numpy_legacy_seeding_and_low_32_bits():
    """RandomState(s) (numpy's reference init_genrand) gives the same words; only the low 32 bits
    of the (two's-complement) seed matter, in torch as here."""
    for seed in [0, 5, 2**32 - 1, 123456789]:
        legacy = np.random.RandomState(seed)._bit_generator.random_raw(2000).astype(np.uint32)
        assert np.array_equal(TorchCpuRng(seed).words(2000), legacy)
    for a, b in [(7, 7 + 2**32), (-1, 2**32 - 1), (-(2**63), 0), (2**64 - 1, 2**32 - 1)]:
        assert np.array_equal(init_genrand(a), init_genrand(b))
        (ta,), (tb,) = torch_draws(a, [(64,)]), torch_draws(b, [(64,)])
        assert_bit_equal(ta, tb, f"torch seeds {a} and {b}")


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_seeds_outside_torchs_range_are_user_errors(seed):
    with pytest.raises(ValueError):
        torch.manual_seed(seed)
    with pytest.raises(UserError) as info:
        check_seed(seed)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("seed", [1.5, "3", True, None])
def test_non_integer_seeds_are_user_errors(seed):
    """torch.manual_seed would int() these (1.5 -> 1, "3" -> 3); the runtime asks for an int."""
    with pytest.raises(UserError):
        check_seed(seed)


def test_fresh_seed_is_a_valid_32_bit_seed():
    seeds = {fresh_seed() for _ in range(8)}
    assert all(0 <= s < 2**32 for s in seeds) and len(seeds) > 1
