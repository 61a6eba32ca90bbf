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

The tests run the GPU path on the CPU too (quant/gpu_path.py): its compiled quantizers give the
fp32 emulation's operands bit for bit, and its output differs from the emulation's only by where
the fp32 roundings fall (the tensor scales applied after the sum, not to each operand; the order
of the sum), a few fp32 ulps of sum |x| |w|.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from solrl_core.quant.activation_scale import samples_of
from solrl_core.quant.gpu_path import compile_quantizer, takes_gpu_path
from solrl_core.quant.nvfp4 import (
    BLOCK_SIZE,
    E2M1_MAGNITUDES,
    E2M1_SIGN_BIT,
    NVFP4Packed,
    _scale_blocks,
    dequantize_nvfp4,
    fake_quantize_nvfp4,
    quantize_nvfp4,
    round_to_e2m1,
)


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
    """[rows, padded_in] code_value x block_scale, exact in bf16 (no tensor scale).

    The sign is applied by a negation, not read from a signed table: inductor's CPU kernels (torch
    2.14.1) write a -0.0 table entry as 0.0, so the compiled decode would lose code 0b1000's sign."""
    magnitudes = torch.tensor(E2M1_MAGNITUDES, device=codes.device, dtype=torch.float32)
    nibbles = torch.stack((codes & 0x0F, codes >> 4), dim=-1).flatten(-2)
    magnitude = magnitudes[(nibbles & 0b0111).long()]
    values = torch.where((nibbles & E2M1_SIGN_BIT) != 0, -magnitude, magnitude)
    blocks = values.reshape(*values.shape[:-1], -1, BLOCK_SIZE) * block_scales.float().unsqueeze(-1)
    return blocks.flatten(-2).to(dtype)


def quantize_activation_scaled(x2d: torch.Tensor, samples: int | None = None,
                               dtype=torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """(code_value x block_scale as [tokens, padded_in] in ``dtype``, fp32 tensor scale) of a
    row-major activation: the same rounding as fake_quantize_nvfp4, the tensor scale left out.
    With ``samples`` the rows are that many samples' tokens, each sample with its own tensor
    scale, returned per row ([tokens, 1]: each row its sample's)."""
    rows = x2d.shape[0]
    by_sample = x2d if samples is None else x2d.reshape(samples, -1, x2d.shape[-1])
    scaled, block_scales, tensor_scale = _scale_blocks(by_sample, per_sample=samples is not None)
    values = (round_to_e2m1(scaled) * block_scales.float().unsqueeze(-1)).flatten(-2).reshape(rows, -1)
    if samples is not None:
        tensor_scale = tensor_scale.expand(samples, rows // samples, 1).reshape(rows, 1)
    return values.to(dtype), tensor_scale


_COMPILED: dict[str, object] = {}


def _compiled(function):
    """``function`` compiled once for the GPU path (fuses its elementwise passes; eager's division)."""
    if function.__name__ not in _COMPILED:
        _COMPILED[function.__name__] = compile_quantizer(function)
    return _COMPILED[function.__name__]


# --- the GEMM ----------------------------------------------------------------------------------

# Per device type: whether torch.mm(out_dtype=float32) runs there (a CPU answer must not decide
# for a GPU in the same process).
_FP32_OUTPUT_MM: dict[str, bool] = {}


def _mm_fp32_out(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bf16 x bf16 accumulated and written in fp32 (torch.mm's out_dtype, CUDA). Where that
    overload is missing: on a GPU the bf16 output upcast (one extra rounding of each output
    element); on the CPU, which has no such overload, the fp32 GEMM of the exactly upcast
    operands: a tensor core's numbers (the same exact products, summed in fp32)."""
    device = a.device.type
    if _FP32_OUTPUT_MM.get(device, True):
        try:
            out = torch.mm(a, b, out_dtype=torch.float32)
            _FP32_OUTPUT_MM[device] = True
            return out
        except (TypeError, RuntimeError):  # CPU: NotImplementedError, a RuntimeError
            _FP32_OUTPUT_MM[device] = False
    if device == "cpu":
        return torch.mm(a.float(), b.float())
    return torch.mm(a, b).float()


def factored_linear(x_values: torch.Tensor, x_scale: torch.Tensor, w_values: torch.Tensor, w_scale: torch.Tensor,
                    bias: torch.Tensor | None, gemm=_mm_fp32_out) -> torch.Tensor:
    """fp32 [tokens, out] = (x_values @ w_values.T) * x_scale * w_scale + bias (x_scale: one, or
    [tokens, 1])."""
    out = gemm(x_values, w_values.t()) * (x_scale * w_scale)
    return out if bias is None else out + bias.float()


def _pad_to_blocks(x2d: torch.Tensor) -> torch.Tensor:
    padding = (-x2d.shape[-1]) % BLOCK_SIZE
    return F.pad(x2d, (0, padding)) if padding else x2d


def quantize_activation(x: torch.Tensor):
    """The activation as the GEMM below reads it, one tensor scale per sample: on the GPU path
    (code_value x block_scale in bf16, fp32 tensor scale per row) of the padded [tokens, in] rows,
    compiled; on the CPU path x fake-quantized in fp32 (so a bf16 input is not rounded a second
    time)."""
    samples = samples_of(x)
    if takes_gpu_path(x):
        rows = _pad_to_blocks(x.reshape(-1, x.shape[-1]))
        return _compiled(quantize_activation_scaled)(rows, samples)
    return fake_quantize_nvfp4(x.float(), per_sample=samples is not None)


def nvfp4_matmul(activation, weight: NVFP4Weight, x: torch.Tensor) -> torch.Tensor:
    """[..., out] = activation @ w.T + bias in x's dtype, for an activation from quantize_activation(x)."""
    bias = None if weight.bias is None else weight.bias.float()
    if takes_gpu_path(x):
        x_values, x_scale = activation
        w_values = _compiled(decode_scaled_codes)(weight.codes, weight.block_scales)
        out = factored_linear(x_values, x_scale, w_values, weight.tensor_scale, bias)
    else:
        out = F.linear(activation, dequantize_nvfp4(_as_packed(weight)), bias)
    return out.to(x.dtype).reshape(*x.shape[:-1], weight.codes.shape[0])


def nvfp4_linear(x: torch.Tensor, weight: NVFP4Weight) -> torch.Tensor:
    """W4A4 NVFP4 y = x @ w.T + bias, in x's dtype; the activation quantized now."""
    return nvfp4_matmul(quantize_activation(x), weight, x)
