"""The emulated NVFP4 quantizer against NVIDIA's published NVFP4 recipe, bit for bit: against the
step-by-step reference of tests/_nvfp4_recipe.py, on inputs built where the order of operations
decides (exact E2M1 ties, exact E4M3 midpoints of the block scale, a few ulps around both), zero and
subnormal block scales, signed zeros, saturation, per-sample scales and ordinary random data. Each
constructed set also shows it would catch the order this module had before (x divided by the
combined scale, block scales fl(fl(amax_b / 6) / fl(amax / 2688))).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _nvfp4_recipe import (AMAXES, E4M3_GRID, F32, midpoint_tensor, old_order, one_row, recipe, recipe_numbers,
                           steps, tie_tensor)

from solrl_core.quant.nvfp4 import dequantize_nvfp4, fake_quantize_nvfp4, quantize_nvfp4, unpack_codes


def ours(x: np.ndarray, per_sample: bool = False):
    """The same four things from solrl_core's quantizer, plus its fast path's values."""
    tensor = torch.from_numpy(x)
    packed = quantize_nvfp4(tensor, per_sample=per_sample)
    return (unpack_codes(packed.codes).numpy(), packed.block_scales.view(torch.uint8).numpy(),
            packed.tensor_scale.numpy(), dequantize_nvfp4(packed).numpy(),
            fake_quantize_nvfp4(tensor, per_sample=per_sample).numpy())


def assert_recipe_bits(x: np.ndarray, per_sample: bool = False) -> None:
    codes, block_scales, tensor_scale, values, fast = ours(x, per_sample)
    expected_codes, expected_scales, expected_tensor_scale, expected_values = recipe(x, per_sample)
    assert np.array_equal(block_scales, expected_scales), f"{(block_scales != expected_scales).sum()} block scales"
    assert np.array_equal(codes, expected_codes), f"{(codes != expected_codes).sum()} codes"
    assert np.array_equal(tensor_scale.reshape(expected_tensor_scale.shape), expected_tensor_scale)
    # bit patterns, so that -0.0 and 0.0 differ
    assert np.array_equal(values.view(np.int32), expected_values.view(np.int32))
    assert np.array_equal(fast.view(np.int32), expected_values.view(np.int32))


@pytest.mark.parametrize("amax", AMAXES)
def test_exact_e2m1_ties_and_their_neighbours_round_as_the_recipe_rounds(amax):
    x = tie_tensor(amax)
    assert x.size > 16 * 100
    assert_recipe_bits(x)
    expected_codes = recipe(x)[0]
    assert (old_order(x)[0] != expected_codes).any()  # where dividing rounded a tie the other way


@pytest.mark.parametrize("amax", AMAXES)
def test_block_scales_at_e4m3_midpoints_round_as_the_recipe_rounds(amax):
    x = midpoint_tensor(amax)
    assert_recipe_bits(x)
    expected_scales = recipe(x)[1]
    assert (old_order(x)[1] != expected_scales).any()  # fl(fl(amax_b / 6) / s_t) lands elsewhere


def test_every_subnormal_block_scale_and_zero_scales_are_the_recipe_s():
    """Blocks 2^-9 .. 7 * 2^-9 of the E4M3 scale unit, and blocks whose scale rounds to 0: those
    decode to zeros of their values' signs, their codes being what x * FLT_MAX saturates to."""
    _, multiplier, _ = recipe_numbers(2688.0)
    subnormal_blocks = [np.linspace(-1, 1, 16, dtype=F32) * F32(m * 2.0**-9 / multiplier) for m in range(1, 8)]
    zero_scale_blocks = [np.array([1e-4, -1e-4, -0.0, 0.0, 3e-5, -7e-6], dtype=F32),
                         np.array([-2.0**-11 * 5.9, 2.0**-11 * 5.9], dtype=F32)]  # just under the 2^-10 midpoint
    x = one_row(2688.0, subnormal_blocks + zero_scale_blocks)
    assert_recipe_bits(x)
    codes, scales, _, values = recipe(x)
    assert scales[0, 1:8].tolist() == list(range(1, 8))  # each subnormal E4M3 pattern once
    assert (scales[0, 8:] == 0).all()
    zeroed = values[0, 8 * 16:]
    assert (zeroed == 0).all() and np.signbit(zeroed[[1, 2, 5]]).all() and not np.signbit(zeroed[[0, 3, 4]]).any()
    assert codes[0, 8 * 16] == 7 and codes[0, 8 * 16 + 1] == 15  # ±6: x * FLT_MAX saturated


def test_signed_zeros_keep_their_sign():
    x = one_row(6.0, [np.array([-0.0, 0.0, -1e-3, 1e-3, -0.124, 0.124, -6.0, 6.0], dtype=F32)])
    assert_recipe_bits(x)
    codes, _, _, values = recipe(x)
    assert codes[0, 16:24].tolist() == [8, 0, 8, 0, 8, 0, 15, 7]
    assert np.signbit(values[0, 16:22]).tolist() == [True, False] * 3


def test_saturation_where_the_block_scale_rounds_down_and_at_448():
    """A block scale rounded down (its amax just below an E4M3 midpoint) puts the block's largest
    values above 6 after encoding: they saturate to ±6. The tensor's own block clamps at 448."""
    _, multiplier, _ = recipe_numbers(2688.0)
    below_midpoint = steps(np.array([(1.0 + 1.0625) / 2 / multiplier], dtype=F32), -1)[0]  # rounds to 1.0
    block = np.array([below_midpoint, -below_midpoint, below_midpoint * F32(0.99)], dtype=F32)
    x = one_row(2688.0, [block])
    assert_recipe_bits(x)
    codes, scales, _, _ = recipe(x)
    assert E4M3_GRID[scales[0, 1]] == 1.0 and codes[0, 16:19].tolist() == [7, 15, 7]
    assert E4M3_GRID[scales[0, 0]] == 448.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_sample", [False, True])
def test_ordinary_random_data_normal_cauchy_and_student_t(dtype, per_sample):
    """bf16 data sits on E2M1 ties often (8 significant bits); per-sample amaxes vary the scales."""
    generator = np.random.default_rng(7)
    for x in (generator.standard_normal((8, 10, 256)), generator.standard_cauchy((8, 10, 256)),
              generator.standard_t(3, (8, 10, 256)) * np.exp(generator.normal(0, 2, (8, 1, 1)))):
        x = torch.from_numpy(x.astype(F32)).to(dtype).float().numpy()
        assert_recipe_bits(x, per_sample)


def test_per_sample_scales_are_each_sample_s_own_recipe():
    x = np.concatenate([midpoint_tensor(amax)[:, :4096] for amax in AMAXES]).reshape(4, 2, 2048)
    assert_recipe_bits(x, per_sample=True)
    for sample in range(4):
        assert np.array_equal(recipe(x, per_sample=True)[0][sample], recipe(x[sample:sample + 1])[0][0])


@pytest.mark.parametrize("flush", [True, False])
def test_tiny_tensors_give_finite_values_with_and_without_flush_to_zero(flush):
    """amax below 2688 / FLT_MAX: the recipe caps S_enc at FLT_MAX, and fl(1 / S_enc) is subnormal
    (0 when flushed). No NaN either way, and the recipe's bits where subnormals are kept."""
    x = one_row(2e-36, [np.array([1e-36, 0.0, -2e-36, 5e-37, -0.0], dtype=F32)])
    previous = (torch.tensor([2e-38]) * 0.5).item() == 0.0
    torch.set_flush_denormal(flush)
    try:
        codes, scales, _, values, fast = ours(x)
        assert np.isfinite(values).all() and np.isfinite(fast).all()
        assert np.array_equal(values.view(np.int32), fast.view(np.int32))
        batch = np.stack([np.random.default_rng(0).standard_normal(x.shape).astype(F32), x])  # a tiny sample
        per_sample = fake_quantize_nvfp4(torch.from_numpy(batch), per_sample=True).numpy()
        assert np.isfinite(per_sample).all() and (per_sample[1][x == 0] == 0).all()
        if not flush:
            assert_recipe_bits(x)
            assert_recipe_bits(batch, per_sample=True)
    finally:
        torch.set_flush_denormal(previous)
