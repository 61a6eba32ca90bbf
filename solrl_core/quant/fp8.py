"""FP8 E4M3 with per-tensor current scaling: the cheap explorer precision on Hopper (SPEC §3).

"Current" scaling means the scale comes from this tensor's own amax right now (no amax history
as in delayed scaling): scale = amax / 448, so the largest magnitude maps to E4M3's max.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0
# _scaled_mm needs both the reduction dim and the output dim to be multiples of 16.
SCALED_MM_ALIGNMENT = 16
# FP8 tensor cores arrived with Ada / Hopper (sm_89, sm_90).
SCALED_MM_MIN_CAPABILITY = (8, 9)


def fp8_scale(x: torch.Tensor) -> torch.Tensor:
    """FP32 scalar amax(|x|) / 448; 1.0 for an all-zero tensor so nothing divides by zero."""
    amax = x.detach().abs().amax().float()
    return torch.where(amax > 0, amax / E4M3_MAX, 1.0)


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / scale as float8_e4m3fn, scale).

    x / scale can round a hair above 448. E4M3 has no infinity, and whether a raw cast of an
    overflow saturates or gives NaN differs between conversion routines, so clamp first."""
    scale = fp8_scale(x)
    scaled = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX)
    return scaled.to(torch.float8_e4m3fn), scale


def dequantize_fp8(x_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x_fp8.float() * scale


def fake_quantize_fp8(x: torch.Tensor) -> torch.Tensor:
    """Quantize to FP8 E4M3 and back, in x's dtype."""
    return dequantize_fp8(*quantize_fp8(x)).to(x.dtype)


def _can_use_scaled_mm(x: torch.Tensor, w_fp8: torch.Tensor) -> bool:
    if not x.is_cuda or torch.cuda.get_device_capability(x.device) < SCALED_MM_MIN_CAPABILITY:
        return False
    out_features, in_features = w_fp8.shape
    # Odd-sized layers are rare and small; emulating them is simpler than padding both operands.
    return in_features % SCALED_MM_ALIGNMENT == 0 and out_features % SCALED_MM_ALIGNMENT == 0


def _scaled_mm_linear(x_fp8, x_scale, w_fp8, w_scale, out_dtype) -> torch.Tensor:
    """Real FP8 GEMM. _scaled_mm wants a row-major left operand and a column-major right one:
    w_fp8 is a contiguous [out, in] tensor, so w_fp8.t() is exactly the column-major [in, out]."""
    x_2d = x_fp8.reshape(-1, x_fp8.shape[-1]).contiguous()
    out = torch._scaled_mm(
        x_2d, w_fp8.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=out_dtype
    )
    return out.reshape(*x_fp8.shape[:-1], w_fp8.shape[0])


def _emulated_linear(x_fp8, x_scale, w_fp8, w_scale) -> torch.Tensor:
    """Same numerics as the FP8 GEMM up to accumulation order: fp8 operands, fp32 accumulation."""
    return F.linear(dequantize_fp8(x_fp8, x_scale), dequantize_fp8(w_fp8, w_scale))


def fp8_linear(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """y = x @ w.T + bias with x quantized to FP8 now and w already FP8 ([out, in], contiguous).

    The bias is added in fp32 outside the GEMM: _scaled_mm only accepts a bias of some out
    dtypes, and adding it afterwards keeps both paths identical.
    """
    x_fp8, x_scale = quantize_fp8(x)
    if _can_use_scaled_mm(x, w_fp8):
        out = _scaled_mm_linear(x_fp8, x_scale, w_fp8, w_scale, torch.float32)
    else:
        out = _emulated_linear(x_fp8, x_scale, w_fp8, w_scale)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)
