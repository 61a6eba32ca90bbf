"""FP8 E4M3 with current scaling (SPEC §3, the Hopper explorer): one scale per weight, one per
sample of the activation; and its GPU path (torch._scaled_mm, the compiled quantizer) run on the
CPU against the CPU emulation."""

from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from _gpu_path import gpu_path, gpu_path_devices, ops_run, ran_compiled_code

from solrl_core.quant import fp8
from solrl_core.quant.fp8 import (
    E4M3_MAX,
    ROWWISE_MIN_CAPABILITY,
    SCALED_MM_MIN_CAPABILITY,
    FP8Tensor,
    dequantize_fp8,
    fake_quantize_fp8,
    fp8_linear,
    fp8_matmul,
    fp8_scale,
    quantize_activation,
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


@contextmanager
def flush_to_zero(on: bool):
    """torch's flush-denormal flag set for the block, restored after (it has no getter: a product
    in fp32's subnormal range shows it)."""
    was_on = (torch.tensor([2e-38]) * 0.5).item() == 0.0
    torch.set_flush_denormal(on)
    try:
        yield
    finally:
        torch.set_flush_denormal(was_on)


TINY = [1e-36, 0.0, -2e-36, 5e-37]  # amax / 448 is an fp32 subnormal: 0 under flush-to-zero


@pytest.mark.parametrize("flush", [True, False], ids=["flush-to-zero", "subnormals-kept"])
def test_a_tiny_input_never_becomes_nan(flush):
    """Reproduced once: with flush-to-zero on, amax 2e-36 > 0 but amax / 448 == 0, and the exact
    zero became 0 / 0 = NaN ([0, nan, -0, 0]). The guard is on the scale now: a scale that is not
    positive and finite is 1, and the group quantizes to (signed) zeros."""
    x = torch.tensor([TINY])
    with flush_to_zero(flush):
        per_sample = dequantize_fp8(*quantize_activation(x.reshape(1, 1, 4)))  # the explorer's activation path
        for values in (fake_quantize_fp8(x), fake_quantize_fp8(x, rowwise=True), per_sample):
            assert not values.isnan().any(), values
            assert values[0, 1].item() == 0.0
            if flush:
                assert values.tolist() == [[0.0, 0.0, -0.0, 0.0]] and torch.signbit(values[0, 2])
        assert (fp8_scale(x) == 1.0).item() is flush  # the subnormal scale, where subnormals are kept


@pytest.mark.parametrize("flush", [True, False], ids=["flush-to-zero", "subnormals-kept"])
def test_a_tiny_sample_beside_ordinary_ones_keeps_its_zeros_on_the_per_sample_path(flush):
    x = torch.stack([gaussian(4, 16), torch.tensor(TINY * 16).reshape(4, 16), gaussian(4, 16, seed=1)])
    with flush_to_zero(flush):
        data, scale = quantize_activation(x)
        values = dequantize_fp8(data, scale).reshape(x.shape)
    assert not values.isnan().any() and scale.shape == (3, 1)
    assert (values[1][x[1] == 0] == 0).all()
    assert torch.equal(values[[0, 2]], torch.stack([fake_quantize_fp8(x[0]), fake_quantize_fp8(x[2])]))


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
    x_fp8, x_scale = quantize_fp8(x, samples=8)  # a 2-D activation is [samples, features]
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


# --- the GPU path (torch._scaled_mm and the compiled quantizer), on the CPU and on a GPU -------

FP8_DEVICES = gpu_path_devices(SCALED_MM_MIN_CAPABILITY)


def quantized_weight(weight, rowwise):
    data, scale = quantize_fp8(weight, rowwise)
    return data.contiguous(), scale  # contiguous [out, in], as the explorer caches it


@pytest.mark.parametrize("device", FP8_DEVICES)
@pytest.mark.parametrize("rowwise", [False, True], ids=["per-sample", "row-wise"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32-out", "bf16-out"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_the_gpu_path_runs_scaled_mm_and_gives_the_emulations_numbers(device, rowwise, out_dtype, with_bias):
    """fp8_linear as the explorer calls it on a GPU (bf16 input, fast accumulation, the bias fused
    into a bf16 output) runs torch._scaled_mm and a compiled quantizer, and gives the numbers of
    the CPU emulation of the same FP8 operands: on the CPU exactly (from 4 rows up its _scaled_mm
    sums the dequantized products in F.linear's order, adds the bias in fp32 and rounds once),
    on a GPU up to the order of the fp32 sum (and fast accumulation's coarser partial sums)."""
    if device == "cuda" and rowwise and torch.cuda.get_device_capability() < ROWWISE_MIN_CAPABILITY:
        pytest.skip("row-wise scales need sm_90+")
    x = gaussian(3, 32, 256).to(torch.bfloat16)
    w_fp8, w_scale = quantized_weight(gaussian(128, 256, seed=1) / 16, rowwise)
    bias = (gaussian(128, seed=2) / 4).to(torch.bfloat16) if with_bias else None
    emulated = fp8_linear(x, w_fp8, w_scale, bias, out_dtype)  # CPU tensors, outside the GPU path
    on_device = [t if t is None else t.to(device) for t in (x, w_fp8, w_scale, bias)]
    with gpu_path(device):
        ops, real = ops_run(lambda: fp8_linear(*on_device, out_dtype))
    assert "aten::_scaled_mm" in ops and ran_compiled_code(ops)
    assert real.dtype == out_dtype and real.shape == (3, 32, 128)
    if device == "cpu":
        assert torch.equal(real, emulated)
    else:  # not yet run on a GPU: the first GPU run checks these bounds
        bound = 1e-3 if out_dtype == torch.float32 else 5e-3  # bf16: its rounding, ~2^-9 per element
        assert relative_error(real.cpu().float(), emulated.float()) < bound


@pytest.mark.parametrize("device", FP8_DEVICES)
def test_scaled_mm_without_fast_accumulation_matches_the_emulation(device):
    # The flag the explorer leaves on trades accumulator bits for speed on a GPU; off, only the
    # order of the fp32 sum differs. The CPU accepts the flag and computes the same bits either way.
    x_fp8 = FP8Tensor(*quantize_fp8(gaussian(96, 256).to(device)))
    w_fp8 = FP8Tensor(*quantized_weight(gaussian(128, 256, seed=1).to(device) / 16, rowwise=False))
    with gpu_path(device):
        exact = fp8_matmul(x_fp8, w_fp8, None, torch.float32, fast_accum=False)
        fast = fp8_matmul(x_fp8, w_fp8, None, torch.float32, fast_accum=True)
    emulated = fp8_matmul(FP8Tensor(*(t.cpu() for t in x_fp8)), FP8Tensor(*(t.cpu() for t in w_fp8)), None, torch.float32)
    assert relative_error(exact.cpu(), emulated) < 1e-5
    if device == "cpu":
        assert torch.equal(exact, emulated) and torch.equal(fast, exact)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32-out", "bf16-out"])
def test_per_sample_scales_without_rowwise_scaled_mm_scale_the_rows_after_the_gemm(out_dtype):
    """An sm_89 GPU's _scaled_mm takes no row-wise scales: the per-sample activation scales are
    applied to its fp32 output instead (fp8._rows_scaled_after), which adds a rounding but no
    error of its own. Run here on the CPU's _scaled_mm; not yet on an sm_89 GPU."""
    x = quantize_activation(gaussian(3, 32, 256).to(torch.bfloat16) * torch.tensor([1.0, 50.0, 0.02]).view(3, 1, 1))
    w = FP8Tensor(*quantized_weight(gaussian(128, 256, seed=1) / 16, rowwise=False))
    bias = (gaussian(128, seed=2) / 4).to(torch.bfloat16)
    with gpu_path():
        ops, after = ops_run(lambda: fp8._rows_scaled_after(x, w, bias, out_dtype, fast_accum=True))
    assert "aten::_scaled_mm" in ops and after.dtype == out_dtype
    emulated = fp8._emulated(x, w, bias, torch.float32)
    for sample in range(3):  # each sample against its own magnitude
        rows = slice(32 * sample, 32 * (sample + 1))
        assert relative_error(after[rows].float(), emulated[rows]) < (1e-6 if out_dtype == torch.float32 else 5e-3)


@pytest.mark.parametrize("rowwise", [False, True], ids=["per-sample", "row-wise"])
def test_the_compiled_activation_quantizer_gives_eager_bits(rowwise):
    """The GPU path's quantizer is quantize_fp8 compiled (with eager's division: quant/gpu_path.py);
    it must give the same E4M3 codes and scales, also for an amax whose division lands above 448,
    an all-zero row and values that flush to zero."""
    x = torch.cat([gaussian(15, 64) * 300, torch.zeros(1, 64)]).to(torch.bfloat16)
    x[3, :4] = torch.tensor([448.0, 2.0**-11, -(2.0**-11), 2.0**-9])
    with gpu_path():
        ops, (data, scale) = ops_run(lambda: quantize_activation(x.reshape(2, 8, 64), rowwise))
    assert ran_compiled_code(ops)
    eager_data, eager_scale = quantize_fp8(x, rowwise, samples=None if rowwise else 2)
    assert torch.equal(data.view(torch.uint8), eager_data.view(torch.uint8))
    assert torch.equal(scale, eager_scale)


def test_a_layer_off_the_16_alignment_takes_the_emulation_on_the_gpu_path():
    # _scaled_mm needs in and out features in multiples of 16; such a layer is emulated instead.
    x, weight = gaussian(5, 24), gaussian(40, 24, seed=1)
    w_fp8, w_scale = quantized_weight(weight, rowwise=False)
    with gpu_path():
        ops, out = ops_run(lambda: fp8_linear(x, w_fp8, w_scale, None, torch.float32))
    assert "aten::_scaled_mm" not in ops
    assert torch.equal(out, fp8_linear(x, w_fp8, w_scale, None, torch.float32))
