"""The NVFP4 format, rule by rule (SPEC §3); and the emulated-NVFP4 explorer's GPU path (compiled
quantizers, a bf16 GEMM on code x block scale) run on the CPU against the fp32 emulation. NVIDIA's
recipe, bit for bit: tests/test_nvfp4_recipe.py; torchao's NVFP4: tests/test_outside_oracles.py."""

import pytest
import torch
import torch.nn.functional as F
from _gpu_path import gpu_path, gpu_path_devices, ops_run, ran_compiled_code

from solrl_core.quant import nvfp4_linear
from solrl_core.quant.nvfp4_linear import NVFP4Weight, decode_scaled_codes, pack_weight, quantize_activation

from solrl_core.quant.nvfp4 import (
    BLOCK_SIZE,
    E2M1_MAGNITUDES,
    NVFP4Packed,
    decode_e2m1,
    dequantize_nvfp4,
    encode_e2m1,
    fake_quantize_nvfp4,
    nvfp4_tensor_scale,
    pack_codes,
    quantize_nvfp4,
    round_to_e2m1,
    unpack_codes,
)

E4M3_SMALLEST_NORMAL = 2.0**-6


def gaussian(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- E2M1 elements ---------------------------------------------------------------------------


def test_every_e2m1_value_is_exactly_representable_and_round_trips():
    grid = torch.tensor(E2M1_MAGNITUDES)
    values = torch.cat([grid, -grid])
    assert torch.equal(round_to_e2m1(values), values)
    assert torch.equal(decode_e2m1(encode_e2m1(values)), values)


def test_e2m1_codes_are_the_standard_bit_patterns():
    # magnitude code = index into 0, .5, 1, 1.5, 2, 3, 4, 6; sign is bit 3
    grid = torch.tensor(E2M1_MAGNITUDES)
    assert encode_e2m1(grid).tolist() == list(range(8))
    assert encode_e2m1(-grid[1:]).tolist() == [0b1000 | code for code in range(1, 8)]


@pytest.mark.parametrize(
    "tie, expected",
    [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0)],
)
def test_ties_round_to_the_even_code(tie, expected):
    assert round_to_e2m1(torch.tensor([tie])).item() == expected
    assert round_to_e2m1(torch.tensor([-tie])).item() == -expected


def test_values_next_to_a_tie_round_to_the_nearest_value():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    just_above = torch.nextafter(ties, torch.full_like(ties, 10.0))
    just_below = torch.nextafter(ties, torch.zeros_like(ties))
    assert round_to_e2m1(just_above).tolist() == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert round_to_e2m1(just_below).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]


def test_saturates_at_plus_minus_six():
    beyond = torch.tensor([6.0, 6.5, 7.0, 100.0, 3.0e38])
    assert round_to_e2m1(beyond).tolist() == [6.0] * 5
    assert round_to_e2m1(-beyond).tolist() == [-6.0] * 5


def test_sign_is_kept_including_on_values_that_round_to_zero():
    values = torch.tensor([-0.1, -0.0, 0.0, 0.1, -1.5, 1.5])
    codes = encode_e2m1(values)
    assert codes.tolist() == [0b1000, 0b1000, 0, 0, 0b1011, 0b0011]
    decoded = decode_e2m1(codes)
    assert decoded.tolist() == [0.0, 0.0, 0.0, 0.0, -1.5, 1.5]  # -0.0 == 0.0
    assert torch.signbit(decoded).tolist() == [True, True, False, False, True, False]


def test_fake_quantize_keeps_signs():
    x = gaussian(8, 64)
    quantized = fake_quantize_nvfp4(x)
    nonzero = quantized != 0
    assert torch.equal(torch.sign(quantized[nonzero]), torch.sign(x[nonzero]))
    assert torch.equal(fake_quantize_nvfp4(-x), -quantized)


# --- packing ---------------------------------------------------------------------------------


def test_pack_unpack_round_trip_with_even_index_in_low_nibble():
    codes = torch.arange(16, dtype=torch.uint8).repeat(3, 2)
    packed = pack_codes(codes)
    assert packed.shape == (3, 16) and packed.dtype == torch.uint8
    assert packed[0, 0].item() == 0x10  # codes 0 (low) and 1 (high)
    assert torch.equal(unpack_codes(packed), codes)


def test_quantize_dequantize_round_trip_equals_fake_quantize():
    x = gaussian(4, 3, 64)
    packed = quantize_nvfp4(x)
    assert packed.codes.shape == (4, 3, 32)
    assert torch.equal(dequantize_nvfp4(packed), fake_quantize_nvfp4(x))


def test_fake_quantize_has_the_codes_path_bits_signed_zeros_included():
    # The explorer's hot path takes shortcuts (one |x|, scaled and rounded in place); it
    # must still give every bit of dequantize(quantize(x)), or a run's ranking would change.
    generator = torch.Generator().manual_seed(3)
    rows = torch.randn(64, 1, generator=generator).exp() ** 12  # row scales over many decades
    x = torch.randn(64, 100, generator=generator) * rows  # 100: a padded last block
    x[0, :16] = 0.0  # an all-zero block
    x[1, 16:32] = -1.0e-30  # negatives in a block whose scale is 0 in E4M3
    x[2, 32:48] = torch.tensor([-0.0, 0.0] * 8)
    reference, fast = dequantize_nvfp4(quantize_nvfp4(x)), fake_quantize_nvfp4(x)
    assert (quantize_nvfp4(x).block_scales.float() == 0).sum() > 10
    assert torch.equal(fast.view(torch.int32), reference.view(torch.int32))


def test_already_quantized_values_survive_a_second_round_trip_unchanged():
    once = fake_quantize_nvfp4(gaussian(16, 128))
    assert torch.equal(fake_quantize_nvfp4(once), once)


# --- blocks and scales -----------------------------------------------------------------------


def test_blocks_are_16_values_along_the_last_dim():
    # Row 0: a block of small values next to a block of large ones. With 16-value blocks along
    # the last dim the small block gets its own fine scale; with blocks along dim 0 or of 32
    # values it would be quantized against the large amax and collapse to zero.
    x = torch.zeros(2, 32)
    x[0, :16] = torch.linspace(0.01, 0.16, 16)
    x[0, 16:] = 100.0
    x[1, :] = 100.0
    packed = quantize_nvfp4(x)
    assert packed.block_scales.shape == (2, 32 // BLOCK_SIZE)
    small_block = dequantize_nvfp4(packed)[0, :16]
    assert (small_block != 0).all()
    assert (small_block - x[0, :16]).abs().max() <= 0.16 * 17 / 96


def test_a_large_value_in_one_block_leaves_other_blocks_unchanged_at_fixed_tensor_amax():
    # Keep the tensor amax fixed (a 448*6 sentinel block) so only block-local effects remain.
    x = gaussian(1, 64)
    x[0, 48:] = 0.0
    x[0, 48] = 2688.0
    spiked = x.clone()
    spiked[0, 5] = 50.0  # block 0 only
    before, after = fake_quantize_nvfp4(x), fake_quantize_nvfp4(spiked)
    assert not torch.equal(before[0, :16], after[0, :16])
    assert torch.equal(before[0, 16:], after[0, 16:])


def test_block_scales_are_e4m3_at_most_448_and_equal_the_formula():
    x = gaussian(32, 256) * torch.logspace(-3, 3, 32).unsqueeze(1)
    packed = quantize_nvfp4(x)
    assert packed.block_scales.dtype == torch.float8_e4m3fn
    scales = packed.block_scales.float()
    assert scales.max().item() == 448.0  # the block holding the tensor amax
    assert (scales <= 448.0).all()
    block_amax = x.reshape(32, -1, BLOCK_SIZE).abs().amax(-1)
    # the recipe's order: amax_b * fl(S_enc * fl(1/6)), S_enc = 2688 / amax (a true division)
    multiplier = torch.div(torch.tensor(2688.0), x.abs().max()) * (torch.tensor(1.0) / 6)
    expected = (block_amax * multiplier).clamp(max=448.0).to(torch.float8_e4m3fn)
    assert torch.equal(packed.block_scales.view(torch.uint8), expected.view(torch.uint8))


def test_tensor_scale_is_amax_over_448_times_6_in_fp32():
    x = gaussian(8, 32).to(torch.bfloat16) * 3
    packed = quantize_nvfp4(x)
    assert packed.tensor_scale.dtype == torch.float32 and packed.tensor_scale.dim() == 0
    assert packed.tensor_scale.item() == (x.abs().max().float() / (448 * 6)).item()
    assert torch.equal(nvfp4_tensor_scale(x), packed.tensor_scale)


def test_all_zero_block_and_all_zero_tensor_give_zeros_without_nan():
    x = gaussian(2, 32)
    x[0, :16] = 0.0
    quantized = fake_quantize_nvfp4(x)
    assert torch.isfinite(quantized).all()
    assert torch.equal(quantized[0, :16], torch.zeros(16))

    zeros = torch.zeros(3, 48)
    packed = quantize_nvfp4(zeros)
    assert packed.tensor_scale.item() == 0.0
    assert (packed.block_scales.float() == 0).all()
    assert torch.equal(dequantize_nvfp4(packed), zeros)
    assert torch.equal(fake_quantize_nvfp4(zeros), zeros)


def test_block_whose_scale_rounds_to_zero_in_e4m3_dequantizes_to_zero():
    x = torch.zeros(1, 32)
    x[0, 0] = 1.0e6  # sets the tensor scale
    x[0, 16:] = 1.0e-6  # amax/6/s_tensor ~ 4.5e-10, far below E4M3's smallest subnormal 2^-9
    packed = quantize_nvfp4(x)
    assert packed.block_scales[0, 1].float().item() == 0.0
    quantized = dequantize_nvfp4(packed)
    assert torch.isfinite(quantized).all()
    assert torch.equal(quantized[0, 16:], torch.zeros(16))


def test_dequantization_error_is_bounded_by_block_amax():
    # With a normal E4M3 scale, s_block >= exact/(1 + 2^-4) so |x|/(s_block*s_tensor) <= 6.375,
    # where the E2M1 step is at most 2: the error is at most one scale unit,
    # s_block * s_tensor <= (amax_block / 6) * (1 + 2^-4) = amax_block * 17/96.
    x = gaussian(64, 512)
    packed = quantize_nvfp4(x)
    assert (packed.block_scales.float() >= E4M3_SMALLEST_NORMAL).all()
    blocks = x.reshape(64, -1, BLOCK_SIZE)
    errors = (dequantize_nvfp4(packed).reshape(blocks.shape) - blocks).abs().amax(-1)
    assert (errors <= blocks.abs().amax(-1) * 17 / 96 * 1.0001).all()


def test_last_dim_not_a_multiple_of_16_is_zero_padded():
    x = gaussian(3, 20)
    padded = torch.cat([x, torch.zeros(3, 12)], dim=1)
    packed = quantize_nvfp4(x)
    assert packed.shape == x.shape and packed.block_scales.shape == (3, 2)
    assert torch.equal(dequantize_nvfp4(packed), fake_quantize_nvfp4(padded)[:, :20])
    assert torch.equal(fake_quantize_nvfp4(x), fake_quantize_nvfp4(padded)[:, :20])


def test_dtype_and_shape_are_restored():
    x = gaussian(2, 3, 32).to(torch.bfloat16)
    packed = quantize_nvfp4(x)
    assert isinstance(packed, NVFP4Packed)
    assert dequantize_nvfp4(packed).dtype == torch.bfloat16
    assert fake_quantize_nvfp4(x).shape == x.shape and fake_quantize_nvfp4(x).dtype == x.dtype


# --- the GPU path: compiled quantizers and a bf16 GEMM, against the fp32 emulation ------------

FP32_UNIT = 2.0**-24  # the unit roundoff of fp32


def bits(t):
    """float32 bit patterns, so that -0.0 and 0.0 differ."""
    return t.float().view(torch.int32)


def activation_with_ties():
    """bf16 [2, 5, 72]: each sample's amax is 2688, so its tensor scale is exactly 1; in each row a
    Gaussian block, blocks of block scale 1 and 2 whose values sit exactly on E2M1 ties of both
    signs (-0.25 rounds to -0.0), an all-zero block, and 8 tiny values (a padded last block whose
    E4M3 scale rounds to 0)."""
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    ties = torch.cat([ties, -ties])
    rows = [torch.cat([gaussian(16, seed=row) * 2, ties, 2 * ties.roll(row), torch.zeros(16), torch.full((8,), 1e-6)])
            for row in range(10)]
    x = torch.stack(rows)
    x[0, 0] = x[5, 0] = 2688.0
    return x.reshape(2, 5, 72).to(torch.bfloat16)


@pytest.mark.parametrize("device", gpu_path_devices())
@pytest.mark.parametrize("activation", ["ties", "gaussian"])
def test_the_compiled_activation_quantizer_gives_the_emulations_bits(device, activation):
    """The GPU path quantizes the activation with a compiled function (code x block scale in bf16,
    each row's sample's tensor scale apart); times that scale those are fake_quantize_nvfp4's fp32
    values (per sample) bit for bit: same ties, same signed zeros, same zeroed blocks. Gaussian bf16 data has exact
    ties too (its 8 significant bits); an approximate division would move ~2e-4 of them."""
    x = activation_with_ties() if activation == "ties" else (gaussian(4, 16, 3072) * 2).to(torch.bfloat16)
    with gpu_path(device):
        ops, (values, tensor_scale) = ops_run(lambda: quantize_activation(x.to(device)))
    assert ran_compiled_code(ops) and values.dtype == torch.bfloat16
    features = x.shape[-1]
    assert values.shape == (x.numel() // features, features + (-features) % BLOCK_SIZE)
    emulated = fake_quantize_nvfp4(x.float(), per_sample=True).reshape(-1, features)
    assert torch.equal(bits(values.float()[:, :features].cpu() * tensor_scale.cpu()), bits(emulated))
    assert (values[:, features:] == 0).all()  # the padding
    if activation == "ties":
        assert tensor_scale.shape == (10, 1) and (tensor_scale == 1.0).all()
        assert (emulated[:, 64:] == 0).all()  # the block whose scale rounds to zero
        assert ((emulated == 0) & torch.signbit(emulated)).any()  # -0.0 is among what was compared


@pytest.mark.parametrize("device", gpu_path_devices())
def test_the_compiled_weight_decode_keeps_every_code_and_its_sign(device):
    """The cached weight is decoded per forward by a compiled function: every code times every
    kind of block scale (zero, subnormal, normal, 448) in bf16, -0.0 included, as the format's
    own decode gives it."""
    e4m3 = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn)
    scales = e4m3[torch.isfinite(e4m3.float())]  # the 127 non-negative ones: 0, subnormals ... 448
    order = torch.randperm(128, generator=torch.Generator().manual_seed(0)) % len(scales)
    block_scales = scales[order].reshape(8, 16)  # each once (448 twice), in 8 rows of 16 blocks
    codes = torch.arange(256, dtype=torch.uint8).repeat(4).reshape(8, 128)  # every code pair, 4 times
    with gpu_path(device):
        ops, decoded = ops_run(lambda: nvfp4_linear._compiled(decode_scaled_codes)(codes.to(device), block_scales.to(device)))
    assert ran_compiled_code(ops) and decoded.dtype == torch.bfloat16
    element_values = decode_e2m1(unpack_codes(codes)).reshape(8, 16, BLOCK_SIZE)
    expected = (element_values * block_scales.float().unsqueeze(-1)).reshape(8, 256)
    assert torch.equal(bits(decoded.cpu()), bits(expected))
    assert ((expected == 0) & torch.signbit(expected)).any()


@pytest.mark.parametrize("device", gpu_path_devices())
@pytest.mark.parametrize("in_features", [256, 200])
def test_the_gpu_path_linear_is_the_fp32_emulation_up_to_where_fp32_rounds(device, in_features):
    """nvfp4_linear on the GPU path against F.linear of the fake-quantized operands in fp32 (the
    activation per sample). The
    operands are the same bits (above); the results differ only where fp32 rounds: the GPU path
    sums exact products of code x block scale and applies both tensor scales after the sum, the
    emulation rounds each scaled operand and product before summing, and the sums run in
    different orders. Measured on the CPU: under 2 units of fp32 roundoff of sum |x||w| + |b|
    (so within 4); a GPU's summation order may add up to in_features more (the worst case)."""
    x = (gaussian(2, 17, in_features) * 2).to(torch.bfloat16).float()  # bf16 values, fp32 output
    weight, bias = gaussian(64, in_features, seed=1) / 8, gaussian(64, seed=2)
    packed = pack_weight(weight, bias, torch.float32)
    x_hat, w_hat = fake_quantize_nvfp4(x, per_sample=True), fake_quantize_nvfp4(weight)
    emulated = F.linear(x_hat, w_hat, bias)
    on_device = NVFP4Weight(*(t.to(device) if isinstance(t, torch.Tensor) else t for t in packed))
    with gpu_path(device):
        ops, out = ops_run(lambda: nvfp4_linear.nvfp4_linear(x.to(device), on_device))
    assert ran_compiled_code(ops) and out.dtype == torch.float32 and out.shape == (2, 17, 64)
    magnitude = x_hat.abs() @ w_hat.abs().t() + bias.abs()
    units = ((out.cpu() - emulated).abs() / (FP32_UNIT * magnitude)).max().item()
    assert units <= (4 if device == "cpu" else in_features + 4)
    # What a bf16 model sees: the same bf16 outputs but where the two fp32 results straddle a
    # bf16 rounding boundary (one element in thousands), by one bf16 step there.
    differ = out.cpu().bfloat16() != emulated.bfloat16()
    assert differ.float().mean().item() < 0.01
    bf16_step = 2.0**-7 * emulated.abs()
    assert ((out.cpu().bfloat16().float() - emulated.bfloat16().float()).abs()[differ] <= bf16_step[differ]).all()
