"""FP8 E4M3 with per-tensor current scaling (SPEC §3, the Hopper explorer)."""

import pytest
import torch
import torch.nn.functional as F

from solrl_core.quant.fp8 import (
    E4M3_MAX,
    dequantize_fp8,
    fake_quantize_fp8,
    fp8_linear,
    fp8_scale,
    quantize_fp8,
)


def gaussian(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def relative_error(approx, exact):
    return ((approx - exact).norm() / exact.norm()).item()


def test_scale_is_amax_over_448_in_fp32():
    x = gaussian(16, 32) * 5
    scale = fp8_scale(x)
    assert scale.dtype == torch.float32 and scale.dim() == 0
    assert scale.item() == (x.abs().max() / 448).item()


def test_the_amax_maps_to_448_and_everything_fits_in_e4m3():
    x = gaussian(16, 32) * 1e4
    x_fp8, scale = quantize_fp8(x)
    assert x_fp8.dtype == torch.float8_e4m3fn
    assert x_fp8.float().abs().max().item() == E4M3_MAX
    assert torch.isfinite(x_fp8.float()).all()


def test_amax_saturates_at_448_even_when_the_division_rounds_above_it():
    # amax / (amax / 448) lands above 448 in fp32 for ~8% of values; E4M3 has no inf and the
    # raw cast's overflow behaviour is not something to rely on, so the value must clamp to 448.
    amaxes = torch.rand(10000, generator=torch.Generator().manual_seed(0)) * 1e3 + 1e-3
    rounds_above = amaxes[(amaxes / (amaxes / E4M3_MAX)) > E4M3_MAX]
    assert len(rounds_above) > 100
    for amax in rounds_above[:100]:
        x_fp8, _ = quantize_fp8(torch.stack([amax, -amax, amax / 3]))
        assert x_fp8.float().tolist()[:2] == [E4M3_MAX, -E4M3_MAX]


def test_extreme_magnitudes_map_into_e4m3_range():
    for magnitude in (1e-30, 1.0, 3e38):
        x_fp8, scale = quantize_fp8(torch.tensor([magnitude, -magnitude, magnitude / 3]))
        assert torch.isfinite(x_fp8.float()).all() and torch.isfinite(scale)
        assert x_fp8.float().abs().max().item() == E4M3_MAX


def test_values_far_below_the_amax_flush_to_zero():
    # E4M3's smallest subnormal is 2^-9, so values below amax * 2^-10 / 448 round to 0.
    x = torch.tensor([448.0, 2.0**-11, -(2.0**-11), 2.0**-9])
    assert fake_quantize_fp8(x).tolist() == [448.0, 0.0, 0.0, 2.0**-9]


def test_zero_tensor_gives_zeros_without_nan():
    zeros = torch.zeros(4, 16)
    assert fp8_scale(zeros).item() == 1.0
    assert torch.equal(fake_quantize_fp8(zeros), zeros)


def test_dequantization_is_each_code_times_the_scale_for_every_e4m3_value():
    # The CPU's table lookup must give the cast-and-multiply's bits, for every finite code and
    # for both signs of zero, per-tensor and per-row.
    codes = torch.arange(256, dtype=torch.uint8)
    finite = codes[(codes & 0x7F) != 0x7F].repeat(3, 1)
    values = finite.view(torch.float8_e4m3fn)
    for scale in (torch.tensor(0.37), torch.tensor([[0.37], [1.0e-3], [3.0]])):
        expected = values.float() * scale
        assert torch.equal(dequantize_fp8(values, scale).view(torch.int32), expected.view(torch.int32))


def test_fake_quantize_relative_error_matches_three_mantissa_bits():
    # RNE with 3 mantissa bits: each value off by at most 2^-4 relative (normal range).
    x = gaussian(64, 64)
    quantized = fake_quantize_fp8(x)
    assert quantized.dtype == x.dtype
    normal = x.abs() >= fp8_scale(x) * 2.0**-6
    assert ((quantized - x).abs()[normal] <= x.abs()[normal] * 2.0**-4).all()
    assert 0.01 < relative_error(quantized, x) < 0.04  # ~0.026 for Gaussian data


def test_emulated_linear_is_the_fp32_matmul_of_the_fp8_operands_plus_bias():
    x, weight, bias = gaussian(8, 64), gaussian(32, 64, seed=1), gaussian(32, seed=2)
    w_fp8, w_scale = quantize_fp8(weight)
    x_fp8, x_scale = quantize_fp8(x)
    expected = F.linear(dequantize_fp8(x_fp8, x_scale), dequantize_fp8(w_fp8, w_scale), bias)
    assert torch.equal(fp8_linear(x, w_fp8, w_scale, bias, torch.float32), expected)


def test_emulated_linear_is_close_to_the_fp32_linear():
    # Per-operand relative RMS error ~0.026, so the product's is ~0.026 * sqrt(2) ~ 0.037.
    x, weight, bias = gaussian(4, 16, 256), gaussian(128, 256, seed=1) / 16, gaussian(128, seed=2)
    out = fp8_linear(x, *quantize_fp8(weight), None, torch.float32)
    assert out.shape == (4, 16, 128)
    assert relative_error(out, F.linear(x, weight)) < 0.05
    with_bias = fp8_linear(x, *quantize_fp8(weight), bias, torch.bfloat16)
    assert with_bias.dtype == torch.bfloat16
    assert relative_error(with_bias.float(), F.linear(x, weight, bias)) < 0.05


def _has_fp8_tensor_cores():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.skipif(not _has_fp8_tensor_cores(), reason="needs a CUDA GPU with sm_89+")
def test_scaled_mm_path_matches_the_emulation_on_gpu():
    x = gaussian(3, 32, 256).cuda().to(torch.bfloat16)
    weight = (gaussian(128, 256, seed=1) / 16).cuda()
    w_fp8, w_scale = quantize_fp8(weight)
    # fast_accum=False: the explorer's default fast accumulation trades accumulator bits for speed.
    real = fp8_linear(x, w_fp8, w_scale, None, torch.float32, fast_accum=False)
    emulated = fp8_linear(x.cpu(), w_fp8.cpu(), w_scale.cpu(), None, torch.float32)
    # Same fp8 operands; only the accumulation order differs.
    assert relative_error(real.cpu(), emulated) < 1e-5
