"""An NVFP4 W4A4 linear layer that runs on bf16 tensor cores and is exact (SPEC §3).

Every NVFP4 value is code_value x block_scale x tensor_scale. The first product has at most 6
significant bits (E2M1: 2, E4M3: 4) and lies between 2^-10 and 2688, so it is exact in bf16 (8
significant bits, fp32's exponent range). A bf16 GEMM over those products, accumulated in fp32,
times the two fp32 tensor scales is therefore the fp32 emulation of W4A4 NVFP4 up to the order
of the fp32 additions: the numbers of ``F.linear(fake_quantize_nvfp4(x), fake_quantize_nvfp4(w))``
at bf16 tensor-core speed instead of fp32 CUDA-core speed.

The weight is kept packed (two codes per byte, one E4M3 scale per 16 values: 0.5625 bytes per
weight) and decoded to bf16 per forward; decoding reads 0.56 and writes 2 bytes per weight, small
next to a GEMM over thousands of tokens. On a CPU (no bf16 units, and torch's CPU GEMM cannot
write fp32 from bf16 operands) the same decoded values are multiplied in fp32, which equals the
fake-quantized reference bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from solrl_core.quant.nvfp4 import (
    BLOCK_SIZE,
    E2M1_MAGNITUDES,
    NVFP4Packed,
    _scale_blocks,
    dequantize_nvfp4,
    fake_quantize_nvfp4,
    quantize_nvfp4,
    round_to_e2m1,
)

# The 16 code values, signed: index = 4-bit code (bit 3 the sign).
_SIGNED_E2M1 = E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES)


class NVFP4Weight(NamedTuple):
    """One cached layer: packed codes, block scales, tensor scale, bias (the model's dtype)."""

    codes: torch.Tensor  # uint8 [out, padded_in // 2]
    block_scales: torch.Tensor  # float8_e4m3fn [out, padded_in // 16]
    tensor_scale: torch.Tensor  # float32 scalar
    bias: torch.Tensor | None
    in_features: int


def pack_weight(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> NVFP4Weight:
    packed = quantize_nvfp4(weight.float())
    return NVFP4Weight(packed.codes, packed.block_scales, packed.tensor_scale,
                       None if bias is None else bias.to(dtype), weight.shape[1])


def _as_packed(weight: NVFP4Weight) -> NVFP4Packed:
    out_features = weight.codes.shape[0]
    return NVFP4Packed(weight.codes, weight.block_scales, weight.tensor_scale,
                       torch.Size((out_features, weight.in_features)), torch.float32)


# --- the bf16 operands -------------------------------------------------------------------------


def decode_scaled_codes(codes: torch.Tensor, block_scales: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """[rows, padded_in] code_value x block_scale, exact in bf16 (no tensor scale)."""
    table = torch.tensor(_SIGNED_E2M1, device=codes.device, dtype=torch.float32)
    low, high = (codes & 0x0F).long(), (codes >> 4).long()
    values = torch.stack((table[low], table[high]), dim=-1).flatten(-2)
    blocks = values.reshape(*values.shape[:-1], -1, BLOCK_SIZE) * block_scales.float().unsqueeze(-1)
    return blocks.flatten(-2).to(dtype)


def quantize_activation_scaled(x2d: torch.Tensor, dtype=torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """(code_value x block_scale as [tokens, padded_in] in ``dtype``, fp32 tensor scale) of a
    row-major activation: the same rounding as fake_quantize_nvfp4, the tensor scale left out."""
    scaled, block_scales, tensor_scale = _scale_blocks(x2d)
    values = round_to_e2m1(scaled) * block_scales.float().unsqueeze(-1)
    return values.flatten(-2).to(dtype), tensor_scale


_COMPILED: dict[str, object] = {}


def _compiled(function):
    """``function`` compiled once for CUDA with dynamic shapes (fuses its elementwise passes)."""
    if function.__name__ not in _COMPILED:
        _COMPILED[function.__name__] = torch.compile(function, dynamic=True)
    return _COMPILED[function.__name__]


# --- the GEMM ----------------------------------------------------------------------------------

_FP32_OUTPUT_MM: bool | None = None


def _mm_fp32_out(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bf16 x bf16 accumulated and written in fp32 (torch.mm's out_dtype, CUDA); where that
    overload is missing, the bf16 output upcast (one extra rounding of each output element)."""
    global _FP32_OUTPUT_MM
    if _FP32_OUTPUT_MM is not False:
        try:
            out = torch.mm(a, b, out_dtype=torch.float32)
            _FP32_OUTPUT_MM = True
            return out
        except (TypeError, RuntimeError):
            _FP32_OUTPUT_MM = False
    return torch.mm(a, b).float()


def factored_linear(x_values: torch.Tensor, x_scale: torch.Tensor, w_values: torch.Tensor, w_scale: torch.Tensor,
                    bias: torch.Tensor | None, gemm=_mm_fp32_out) -> torch.Tensor:
    """fp32 [tokens, out] = (x_values @ w_values.T) * x_scale * w_scale + bias."""
    out = gemm(x_values, w_values.t()) * (x_scale * w_scale)
    return out if bias is None else out + bias.float()


def _pad_to_blocks(x2d: torch.Tensor) -> torch.Tensor:
    padding = (-x2d.shape[-1]) % BLOCK_SIZE
    return F.pad(x2d, (0, padding)) if padding else x2d


def nvfp4_linear(x: torch.Tensor, weight: NVFP4Weight) -> torch.Tensor:
    """W4A4 NVFP4 y = x @ w.T + bias, in x's dtype; the activation quantized now."""
    out_features = weight.codes.shape[0]
    if x.is_cuda:
        rows = _pad_to_blocks(x.reshape(-1, x.shape[-1]))
        x_values, x_scale = _compiled(quantize_activation_scaled)(rows)
        w_values = _compiled(decode_scaled_codes)(weight.codes, weight.block_scales)
        out = factored_linear(x_values, x_scale, w_values, weight.tensor_scale, weight.bias)
    else:
        # The activation is fake-quantized in fp32, so a bf16 input is not rounded a second time.
        out = F.linear(fake_quantize_nvfp4(x.float()), dequantize_nvfp4(_as_packed(weight)),
                       None if weight.bias is None else weight.bias.float())
    return out.to(x.dtype).reshape(*x.shape[:-1], out_features)
