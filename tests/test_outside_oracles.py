"""The quantizers against code this project did not write: torchao 0.18's NVFP4 (``NVFP4Tensor``,
two-level scaling with its ``per_tensor_amax_to_scale``) and float8 primitives (the
``_choose_scale_float8`` / ``_quantize_affine_float8`` / ``_dequantize_affine_float8`` that its
``Float8Tensor`` quantizes with), on ordinary random data, bit for bit. Where torchao's definitions
are not ours, each test says which, and checks that the difference is exactly that:
- NVFP4 block scales: torchao floors them at 2^-6 (E4M3's smallest normal); ours keep the
  subnormal and zero scales of NVIDIA's recipe.
- NVFP4 order of operations: torchao computes the block scale as fl(fl(amax_b / 6) / s_t) and
  encodes with fl(fl(1 / s_t) / s_b), not the recipe's order (tests/_nvfp4_recipe.py); the two
  agree on ordinary fp32 data and part at exact ties and midpoints, which bf16 data hits often.
- NVFP4 dequantization: torchao rounds s_t * s_b first, we round once.
- All-zero tensors: torchao's scale is 0 and its values 0 / 0 = NaN; ours are zeros.
- FP8 of bf16 input: torchao divides the bf16 amax by 448 in bf16; ours in fp32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _nvfp4_recipe import E2M1_GRID, E4M3_GRID, F32, nearest, tie_tensor

from solrl_core.quant.fp8 import dequantize_fp8, quantize_fp8
from solrl_core.quant.nvfp4 import BLOCK_SIZE, decode_e2m1, dequantize_nvfp4, quantize_nvfp4, unpack_codes

torchao_nvfp4 = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
torchao_kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels")
torchao_primitives = pytest.importorskip("torchao.quantization.quant_primitives")

E4M3_SMALLEST_NORMAL = 2.0**-6


def random_data(kind: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = np.random.default_rng(seed)
    draw = {"normal": generator.standard_normal, "cauchy": generator.standard_cauchy,
            "student-t": lambda size: generator.standard_t(3, size)}[kind]
    return torch.from_numpy(draw(shape).astype(np.float32))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8 if t.element_size() == 1 else torch.int32)


# --- NVFP4 -------------------------------------------------------------------------------------


def torchao_quantize(x: torch.Tensor, per_sample: bool = False):
    """torchao's two-level NVFP4 with its own per-tensor scale formula (per sample: one for each
    index of the first dim, which its 3-D path takes as a per-expert scale)."""
    amax = x.abs().amax(dim=tuple(range(1, x.dim())), keepdim=True) if per_sample else x.abs().max()
    return torchao_nvfp4.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=torchao_nvfp4.per_tensor_amax_to_scale(amax))


def their_codes(theirs, shape) -> torch.Tensor:
    return torchao_kernels.unpack_uint4(theirs.qdata).reshape(shape)


@pytest.mark.parametrize("per_sample", [False, True])
@pytest.mark.parametrize("kind", ["normal", "cauchy", "student-t"])
def test_nvfp4_equals_torchao_on_ordinary_random_data_but_for_its_block_scale_floor(kind, per_sample):
    """The same tensor scales, block scales and codes; where our block scale is below 2^-6 (a
    Cauchy tensor's outliers can leave such blocks) torchao's is 2^-6, which changes those blocks'
    codes and nothing else (test_difference_torchao_floors_block_scales_...)."""
    x = random_data(kind, (4, 64, 256), seed=1)
    if not per_sample:
        x = x.reshape(256, 256)
    ours, theirs = quantize_nvfp4(x, per_sample=per_sample), torchao_quantize(x, per_sample)
    assert torch.equal(ours.tensor_scale.reshape(-1), theirs.per_tensor_scale.reshape(-1))
    our_scales, their_scales = bits(ours.block_scales), bits(theirs.scale).reshape(ours.block_scales.shape)
    floored = ours.block_scales.float() < E4M3_SMALLEST_NORMAL
    assert torch.equal(our_scales[~floored], their_scales[~floored])
    assert (theirs.scale.float().reshape(floored.shape)[floored] == E4M3_SMALLEST_NORMAL).all()
    our_codes = unpack_codes(ours.codes)
    same = ~floored.repeat_interleave(BLOCK_SIZE, -1)
    assert torch.equal(our_codes[same], their_codes(theirs, our_codes.shape)[same])
    if not floored.any():
        assert torch.equal(ours.codes, theirs.qdata.reshape(ours.codes.shape))  # byte for byte


def test_difference_torchao_floors_block_scales_at_the_smallest_normal_e4m3():
    """A block with amax below ~amax_tensor / 28672 gets a subnormal E4M3 scale (2^-9 .. 7 * 2^-9)
    or 0 in the recipe; torchao gives it 2^-6, too large: its values use only the lower part of the
    E2M1 grid. Measured on 256 blocks whose exact scale lies in [2^-9, 2^-6.2]: relative RMS error
    0.104 (recipe) against 0.140 (torchao)."""
    generator = torch.Generator().manual_seed(0)
    exact_scales = torch.exp2(torch.empty(256, 1).uniform_(-9, -6.2, generator=generator))
    tiny_blocks = torch.randn(256, BLOCK_SIZE, generator=generator)
    tiny_blocks = tiny_blocks / tiny_blocks.abs().amax(1, keepdim=True) * 6 * exact_scales
    x = torch.cat([torch.full((1, BLOCK_SIZE), 2688.0), tiny_blocks]).reshape(1, -1)  # tensor scale 1

    ours, theirs = quantize_nvfp4(x), torchao_quantize(x)
    assert (ours.block_scales.float()[0, 1:] < E4M3_SMALLEST_NORMAL).all()
    assert (theirs.scale.float()[0, 1:] == E4M3_SMALLEST_NORMAL).all()

    def relative_rms_error(values):
        return ((values[0, BLOCK_SIZE:] - x[0, BLOCK_SIZE:]).norm() / x[0, BLOCK_SIZE:].norm()).item()

    our_error = relative_rms_error(dequantize_nvfp4(ours))
    assert our_error < 0.11 < 0.125 < relative_rms_error(theirs.dequantize(torch.float32))


def test_difference_torchao_gives_nan_for_an_all_zero_tensor():
    zeros = torch.zeros(4, 64)
    ours, theirs = quantize_nvfp4(zeros), torchao_quantize(zeros)
    assert torch.equal(dequantize_nvfp4(ours), zeros) and (ours.block_scales.float() == 0).all()
    assert theirs.scale.float().isnan().all() and theirs.dequantize(torch.float32).isnan().all()


def torchao_order(x: np.ndarray):
    """(codes, block-scale codes) of torchao's arithmetic, step by step in float32: block scale
    e4m3_rn(clamp(fl(fl(amax_b / 6) / s_t), 2^-6, 448)), encode scale fl(fl(1 / s_t) / s_b)."""
    blocks = x.reshape(*x.shape[:-1], -1, 16)
    block_amax = np.abs(blocks).max(axis=-1)
    tensor_scale = block_amax.max() / F32(2688)
    unrounded = np.clip((block_amax / F32(6)) / tensor_scale, F32(E4M3_SMALLEST_NORMAL), F32(448))
    scale_codes = nearest(unrounded.astype(np.float64), E4M3_GRID)
    encode = (F32(1) / tensor_scale) / E4M3_GRID[scale_codes].astype(F32)
    scaled = blocks * encode[..., None]
    assert scaled.dtype == F32
    codes = nearest(np.minimum(np.abs(scaled), F32(6)).astype(np.float64), E2M1_GRID) | (np.signbit(scaled) << 3)
    return codes.reshape(x.shape), scale_codes


@pytest.mark.parametrize("data", ["ties", "bf16"])
def test_difference_torchao_s_order_of_operations_is_not_the_recipe_s(data):
    """At exact E2M1 ties (constructed, or bf16 data's many) torchao's reciprocal fl(fl(1 / s_t) / s_b)
    can land on the other side of the tie than the recipe's, and its block scale on the other side
    of an E4M3 midpoint. Every such difference is torchao's order: its codes and scales are exactly
    those of its arithmetic written out (torchao_order), while ours are the recipe's
    (tests/test_nvfp4_recipe.py)."""
    if data == "ties":
        x = tie_tensor(56.960845947265625)
    else:
        x = random_data("normal", (64, 1024), seed=3).bfloat16().float().numpy()  # 131 codes part
    ours, theirs = quantize_nvfp4(torch.from_numpy(x)), torchao_quantize(torch.from_numpy(x))
    codes, scale_codes = torchao_order(x)
    assert np.array_equal(their_codes(theirs, x.shape).numpy(), codes)
    assert np.array_equal(bits(theirs.scale).reshape(scale_codes.shape).numpy(), scale_codes)
    normal = ours.block_scales.float().numpy() >= E4M3_SMALLEST_NORMAL
    our_codes = unpack_codes(ours.codes).numpy()
    assert (our_codes != codes)[np.repeat(normal, 16, axis=-1)].any()  # the orders part here


def test_difference_dequantization_rounds_once_where_torchao_rounds_twice():
    """We compute (q * s_block) * s_tensor: q * s_block is exact (few significant bits), so the
    value is the correctly rounded product. torchao computes q * (s_tensor * s_block), rounding
    s_tensor * s_block first. The two agree for q in {0.5, 1, 2, 4} (exact power-of-two products)
    and can differ by one ulp for q in {1.5, 3, 6}."""
    x = random_data("normal", (64, 256), seed=7)
    ours, theirs = quantize_nvfp4(x), torchao_quantize(x)
    our_values, their_values = dequantize_nvfp4(ours), theirs.dequantize(torch.float32)
    codes = unpack_codes(ours.codes)
    exact = (decode_e2m1(codes).double().reshape(64, -1, BLOCK_SIZE) * ours.block_scales.double().unsqueeze(-1)
             * ours.tensor_scale.double()).reshape(64, 256).float()
    assert torch.equal(our_values, exact)  # correctly rounded
    differs = our_values != their_values
    assert differs.any() and set(decode_e2m1(codes)[differs].abs().tolist()) <= {1.5, 3.0, 6.0}
    one_ulp = torch.finfo(torch.float32).eps * our_values.abs()
    assert ((our_values - their_values).abs()[differs] <= one_ulp[differs]).all()


# --- FP8 ---------------------------------------------------------------------------------------


def torchao_fp8(x: torch.Tensor, block_size: list[int]):
    scale = torchao_primitives._choose_scale_float8(x, block_size)
    data = torchao_primitives._quantize_affine_float8(x, scale)
    return data, scale, torchao_primitives._dequantize_affine_float8(data, scale)


@pytest.mark.parametrize("granularity", ["tensor", "row", "sample"])
@pytest.mark.parametrize("kind", ["normal", "cauchy", "student-t"])
def test_fp8_equals_torchao_float8_primitives_on_ordinary_random_data(kind, granularity):
    """Scale amax / 448 (per tensor, per row, per sample), data x / scale clamped and cast, values
    data * scale: the same bits."""
    x = random_data(kind, (4, 32, 128), seed=2)
    rows = x.reshape(-1, 128)
    if granularity == "tensor":
        ours, (data, scale, values) = quantize_fp8(rows), torchao_fp8(rows, list(rows.shape))
    elif granularity == "row":
        ours, (data, scale, values) = quantize_fp8(rows, rowwise=True), torchao_fp8(rows, [1, 128])
    else:
        ours, (data, scale, values) = quantize_fp8(rows, samples=4), torchao_fp8(x, [1, 32, 128])
    assert torch.equal(ours.scale.reshape(-1), scale.reshape(-1))
    assert torch.equal(bits(ours.data), bits(data.reshape(rows.shape)))
    assert torch.equal(bits(dequantize_fp8(*ours)), bits(values.reshape(rows.shape)))


def test_difference_torchao_float8_gives_nan_for_an_all_zero_tensor():
    zeros = torch.zeros(8, 32)
    ours, (_, scale, values) = quantize_fp8(zeros), torchao_fp8(zeros, [8, 32])
    assert ours.scale.item() == 1.0 and torch.equal(dequantize_fp8(*ours), zeros)
    assert scale.item() == 0.0 and values.isnan().all()


def test_difference_torchao_float8_scales_bf16_input_in_bf16():
    """torchao divides a bf16 tensor's amax by 448 in bf16, so its scale is that quotient rounded to
    bf16; ours is amax / 448 in fp32. Given the scale, the data are the same cast."""
    x = random_data("normal", (16, 128), seed=4).bfloat16()
    ours, (data, scale, _) = quantize_fp8(x), torchao_fp8(x, list(x.shape))
    assert scale.item() == (x.abs().max() / 448).item() and scale.item() != ours.scale.item()
    assert scale.item() == (x.abs().max().float() / 448).bfloat16().item()
    same_cast = (x.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(bits(data), bits(same_cast))
