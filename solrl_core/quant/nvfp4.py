"""The NVFP4 number format (SPEC §3), as plain torch code that runs on any device.

An NVFP4 tensor is three things:
- 4-bit E2M1 element codes (1 sign bit + a 3-bit magnitude code into 0, .5, 1, 1.5, 2, 3, 4, 6),
- one FP8 E4M3 scale per 16 consecutive values along the last (reduction) dimension,
- one FP32 scale for the whole tensor, `amax / (448 * 6)`, which brings the block scales into
  E4M3 range. With ``per_sample`` the "tensor" is each index of the first dim: the scale is
  [samples, 1, ...], so the explorer's activations are quantized per sample
  (quant/activation_scale.py); weights keep one scale.

Decoded value = code_value * block_scale * tensor_scale.

Quantization follows NVIDIA's published NVFP4 recipe (Transformer Engine's reference quantizer)
operation for operation in fp32, because the emulated explorer is meant to compute what an NVFP4
explorer computes, and the order of the roundings decides codes at E2M1 ties and block scales at
E4M3 midpoints (tests/test_nvfp4_recipe.py holds it to a step-by-step reference):
    S_enc = 2688 / amax                       (at most FLT_MAX)
    s_b   = e4m3_rn(min(amax_b * fl(S_enc * fl(1/6)), 448))
    code  = e2m1_rn(x * min(1 / fl(s_b * fl(1 / S_enc)), FLT_MAX)), saturating at ±6
where fl is one fp32 rounding. The tensor scale a decoder multiplies by stays amax / 2688 (the
recipe's GEMM scales its output by amax_x amax_w / 2688², and torchao stores this scale).

Choices this module makes where the spec leaves room:
- A last dimension that is not a multiple of 16 is zero-padded to one. Zeros never raise a
  block's amax, so this is the same as letting the last block of each row be shorter; the
  padding is dropped again on dequantization. (Hardware kernels require the multiple; the
  emulated explorer should not fail on an odd-sized layer.)
- A negative input that rounds to zero keeps its sign (code 0b1000, i.e. -0.0), as an IEEE
  cast would; it decodes to -0.0 == 0.
- Inputs must be finite: NaN/inf have no E2M1 encoding and are not handled. A finite input gives
  no NaN: the FLT_MAX caps keep every scale finite, so 0 * inf cannot occur (x * e_b may overflow
  to ±inf, which saturates to ±6 like any value above 6).

What the recipe does at its edges, kept as it is:
- A block that is tiny next to the tensor amax gets a subnormal E4M3 scale (2^-9 .. 7 * 2^-9) or
  0 (torchao instead floors block scales at 2^-6). A block of scale 0 decodes to zeros of its
  values' signs; its codes are what x * FLT_MAX saturates to (mostly ±6).
- A tensor with amax below 2688 / FLT_MAX (about 7.9e-36) has S_enc capped at FLT_MAX, so its
  codes are coarse (and, through the subnormal fl(1 / S_enc), depend on flush-to-zero); an
  activation that small is nothing a model produces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

BLOCK_SIZE = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
# Index = 3-bit magnitude code. This is the E2M1 bit pattern read as an unsigned integer
# (2 exponent bits, 1 mantissa bit, code 1 is the only subnormal), so codes sort like values.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_SIGN_BIT = 0b1000
_FP32_EXPONENT_MASK = 0x7F800000
_FP32_BITS_OF_2_POW_22 = (127 + 22) << 23


@dataclass(frozen=True)
class NVFP4Packed:
    """A tensor stored in NVFP4.

    codes: uint8 [..., padded_K // 2], two E2M1 codes per byte; the element with the even
        index sits in the low nibble (torchao's layout, checked byte for byte in the tests).
    block_scales: float8_e4m3fn [..., padded_K // 16].
    tensor_scale: float32 scalar tensor ([samples, 1, ..., 1] per sample).
    shape, dtype: of the original tensor (shape without padding).
    """

    codes: torch.Tensor
    block_scales: torch.Tensor
    tensor_scale: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype


# --- E2M1 elements -------------------------------------------------------------------------


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values to the nearest E2M1 value, ties to the even code, saturating at ±6."""
    magnitude = x.float().abs().clamp_(max=E2M1_MAX)
    return torch.copysign(_round_e2m1_magnitude_(magnitude), x)


def _round_e2m1_magnitude_(magnitude: torch.Tensor) -> torch.Tensor:
    """Round float32 magnitudes in [0, 6] to E2M1 in place (ties to the even code); returns them.

    E2M1 keeps one mantissa bit, so in the binade [2^e, 2^(e+1)) its grid step is 2^(e-1), and
    0.5 below 1 (the subnormal code). The even codes are exactly the even multiples of the step.
    Adding and subtracting M = step * 2^23 makes the fp32 adder do the rounding: next to M the
    fp32 spacing is exactly `step`, and IEEE addition rounds half to even. M is built from the
    exponent bits of |x| (+22 in the exponent field = 2^(e-1) * 2^23), floored at 2^22 for the
    subnormal step. Clamping to 6 first equals saturating after, and keeps M small.
    This is ~3x faster on CPU than selecting the step with torch.where and calling torch.round.
    """
    exponent_bits = magnitude.view(torch.int32) & _FP32_EXPONENT_MASK
    adder = exponent_bits.add_(22 << 23).clamp_(min=_FP32_BITS_OF_2_POW_22).view(torch.float32)
    return magnitude.add_(adder).sub_(adder)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """4-bit codes (uint8 in 0..15) of float32 values, with E2M1 rounding and saturation."""
    rounded = round_to_e2m1(x)
    grid = torch.tensor(E2M1_MAGNITUDES, device=x.device)
    magnitude_code = torch.searchsorted(grid, rounded.abs().contiguous())
    sign = torch.signbit(rounded).to(torch.uint8) * E2M1_SIGN_BIT
    return magnitude_code.to(torch.uint8) | sign


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of 4-bit codes."""
    grid = torch.tensor(E2M1_MAGNITUDES, device=codes.device)
    magnitude = grid[(codes & 0b0111).long()]
    negative = (codes & E2M1_SIGN_BIT) != 0
    return torch.where(negative, -magnitude, magnitude)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dim (even index in the low nibble)."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    low, high = packed & 0x0F, packed >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)


# --- scales ----------------------------------------------------------------------------------

_ENCODE_RANGE = E4M3_MAX * E2M1_MAX  # 2688, exact in fp32
_FP32_MAX = torch.finfo(torch.float32).max
# fl(1/6) as the recipe rounds it in fp32 (a Python float holding that fp32 value exactly, so no
# kernel rounds it again).
_ONE_SIXTH = float(torch.tensor(1.0) / E2M1_MAX)


class TensorScales(NamedTuple):
    """The recipe's per-tensor numbers (per sample: each [samples, 1, ..., 1]), from one amax."""

    block_multiplier: torch.Tensor  # fl(S_enc * fl(1/6)): block amax -> its E4M3 scale before rounding
    global_decode: torch.Tensor  # fl(1 / S_enc): the tensor's share of each block's encode scale
    tensor_scale: torch.Tensor  # amax / 2688: what a decoder multiplies by


def nvfp4_tensor_scale(x: torch.Tensor, per_sample: bool = False) -> torch.Tensor:
    """FP32 per-tensor scale amax(|x|) / (448 * 6): the largest block then gets block scale 448;
    ``per_sample``: one per index of x's first dim, shaped [samples, 1, ..., 1]."""
    return _amax(x.detach().abs(), per_sample).float() / _ENCODE_RANGE


def tensor_scales(amax: torch.Tensor) -> TensorScales:
    """The recipe's per-tensor numbers from the amax (any shape). S_enc = 2688 / amax is capped at
    FLT_MAX (amax 0 or below ~7.9e-36), as the recipe caps it, so fl(1 / S_enc) is finite."""
    amax = amax.float()
    # A true division: torch computes `number / tensor` as reciprocal(tensor) * number, two roundings.
    encode = torch.full_like(amax, _ENCODE_RANGE).div_(amax).clamp_(max=_FP32_MAX)
    return TensorScales(encode * _ONE_SIXTH, torch.reciprocal(encode), amax / _ENCODE_RANGE)


def _amax(magnitude: torch.Tensor, per_sample: bool) -> torch.Tensor:
    """The largest magnitude: of all, or of each sample (over all dims but the first, keeping them)."""
    if not per_sample:
        return magnitude.amax()
    samples = magnitude.shape[0]
    return magnitude.reshape(samples, -1).amax(dim=1).reshape(samples, *(1,) * (magnitude.dim() - 1))


def _per_element(tensor_scale: torch.Tensor) -> torch.Tensor:
    """A tensor scale against [..., blocks, 16] elements: a per-sample one gains their last dim."""
    return tensor_scale.unsqueeze(-1) if tensor_scale.dim() else tensor_scale


def _split_into_blocks(x: torch.Tensor) -> torch.Tensor:
    """float32 view [..., n_blocks, 16] of x, zero-padding the last dim to a multiple of 16."""
    if x.dim() == 0:
        x = x.reshape(1)
    padding = (-x.shape[-1]) % BLOCK_SIZE
    x = F.pad(x.float(), (0, padding)) if padding else x.float()
    return x.reshape(*x.shape[:-1], -1, BLOCK_SIZE)


def _block_scales_e4m3(blocks: torch.Tensor, scales: TensorScales) -> torch.Tensor:
    """Per-block E4M3 scales of [..., n_blocks, block] values (any block length)."""
    return _block_scales_from_amax(blocks.abs().amax(dim=-1), scales)


def _block_scales_from_amax(block_amax: torch.Tensor, scales: TensorScales) -> torch.Tensor:
    """e4m3_rn(min(amax_b * fl(S_enc * fl(1/6)), 448)). The clamp matters: the product can land a
    rounding error above 448, and E4M3 has no infinity. torch's cast rounds to nearest even and
    keeps subnormals, so a block that is tiny next to the tensor amax may get scale 0."""
    return (block_amax * scales.block_multiplier).clamp_(max=E4M3_MAX).to(torch.float8_e4m3fn)


def _encode_scales(block_scales: torch.Tensor, scales: TensorScales) -> torch.Tensor:
    """Per block, what its values are multiplied by: min(1 / fl(s_b * fl(1 / S_enc)), FLT_MAX).
    A block of scale 0 gets FLT_MAX, so its zeros stay zeros (0 * inf would be NaN)."""
    return torch.reciprocal(block_scales.float() * scales.global_decode).clamp_(max=_FP32_MAX)


def _scale_into_e2m1_range(blocks: torch.Tensor, block_scales: torch.Tensor, scales: TensorScales) -> torch.Tensor:
    """blocks times their encode scale: the values E2M1 rounding takes (it saturates them at ±6)."""
    return blocks * _encode_scales(block_scales, scales).unsqueeze(-1)


def _scales_of_magnitudes(magnitude: torch.Tensor, per_sample: bool = False):
    """(E4M3 block scales, TensorScales) from |blocks|; the tensor amax is the largest block amax
    (padding zeros raise neither), so |x| is read once for both."""
    block_amax = magnitude.amax(dim=-1)
    scales = tensor_scales(_amax(block_amax, per_sample))
    return _block_scales_from_amax(block_amax, scales), scales


def _scale_blocks(x: torch.Tensor, per_sample: bool = False):
    """The shared first half of quantization: (values in E2M1 range, block scales, tensor scale)."""
    blocks = _split_into_blocks(x)
    block_scales, scales = _scales_of_magnitudes(blocks.detach().abs(), per_sample and x.dim() > 1)
    return _scale_into_e2m1_range(blocks, block_scales, scales), block_scales, scales.tensor_scale


def _apply_scales(
    element_values: torch.Tensor, block_scales: torch.Tensor, tensor_scale: torch.Tensor
) -> torch.Tensor:
    # (q * s_block) is exact (2 and 4 significant bits), so the result is rounded only once.
    return element_values * block_scales.float().unsqueeze(-1) * _per_element(tensor_scale)


def _unblock(blocks: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """Undo _split_into_blocks: flatten blocks, drop the padding, restore shape and dtype."""
    flat = blocks.flatten(-2)
    last_dim = shape[-1] if len(shape) else 1
    return flat[..., :last_dim].reshape(shape).to(dtype)


# --- public API ------------------------------------------------------------------------------


def quantize_nvfp4(x: torch.Tensor, per_sample: bool = False) -> NVFP4Packed:
    """Quantize x to NVFP4 with 16-element blocks along its last dimension (``per_sample``: one
    tensor scale per index of the first dim)."""
    scaled, block_scales, tensor_scale = _scale_blocks(x, per_sample)
    codes = encode_e2m1(scaled).flatten(-2)
    return NVFP4Packed(
        codes=pack_codes(codes),
        block_scales=block_scales,
        tensor_scale=tensor_scale,
        shape=x.shape,
        dtype=x.dtype,
    )


def dequantize_nvfp4(packed: NVFP4Packed) -> torch.Tensor:
    """The values an NVFP4Packed stands for, in its original shape and dtype."""
    codes = unpack_codes(packed.codes)
    element_values = decode_e2m1(codes).reshape(*codes.shape[:-1], -1, BLOCK_SIZE)
    values = _apply_scales(element_values, packed.block_scales, packed.tensor_scale)
    return _unblock(values, packed.shape, packed.dtype)


def fake_quantize_nvfp4(x: torch.Tensor, per_sample: bool = False) -> torch.Tensor:
    """dequantize_nvfp4(quantize_nvfp4(x, per_sample)) without building codes; the activation hot path.

    The same bits as the codes path (signed zeros included), in about half the passes over the
    tensor, because on a CPU these passes are most of the emulated explorer's cost: |x| is taken
    once and scaled and rounded in place, and the tensor amax is the largest block amax.
    |x| * e = |x * e| exactly, and the sign comes from x, which has the sign of x * e (e > 0).
    """
    blocks = _split_into_blocks(x)
    magnitude = blocks.abs()
    block_scales, scales = _scales_of_magnitudes(magnitude, per_sample and x.dim() > 1)
    magnitude.mul_(_encode_scales(block_scales, scales).unsqueeze(-1)).clamp_(max=E2M1_MAX)
    values = _round_e2m1_magnitude_(magnitude).copysign_(blocks)
    values.mul_(block_scales.float().unsqueeze(-1)).mul_(_per_element(scales.tensor_scale))
    return _unblock(values, x.shape, x.dtype)
