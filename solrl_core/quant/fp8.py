"""FP8 E4M3 with current scaling: the cheap explorer precision on Hopper and Ada (SPEC §3).

"Current" scaling means the scale comes from this tensor's own amax right now (no amax history
as in delayed scaling): scale = amax / 448, so the largest magnitude maps to E4M3's max. SPEC §3
says per tensor: the weight has one scale, and the activation one per sample
(quant/activation_scale.py), so that a draft does not depend on its batch-mates. One scale per
row (per token of the activation, per output channel of the weight) is the option
``fp8-rowwise``. A scale of a group of rows (a sample's tokens, or one row) is held as [groups, 1]
and reaches ``_scaled_mm`` as its row-wise [rows, 1] operand, the weight's one scale broadcast
to [1, out].

Why our own kernel sequence and not torchao's ``Float8DynamicActivationFloat8WeightConfig``:
that config is applied with ``quantize_``, which swaps each module's weight for a Float8Tensor in
place, while the explorer must never write the policy's weights (they are the base of the trained
and sampling policies; the explorer caches the *merged* "old" weights per requantize). Its
activation quantization is also per layer, so q, k and v would each quantize the same input, and
its compiled kernels are built against one torch minor version, which the GPU machines here do not
share with the development machines. Its numerics are the same as ours (amax / 448 per tensor,
``_scaled_mm`` with fast accumulation and a bf16 output), so this module keeps the same GEMM and
adds what the explorer needs: on CUDA the activation quantization is one ``torch.compile``d
function (abs-amax and scale-and-cast fused into two kernels), the GEMM is ``torch._scaled_mm``
with the bias fused, a bf16 output and fast accumulation, and the explorer shares one quantized
activation between the layers that read the same input (q, k, v; FLUX's proj_mlp too). The tests
run this GPU path on the CPU as well (quant/gpu_path.py), where _scaled_mm supports both scale
modes, ignores the fast-accumulation flag, and gave the emulation's fp32 numbers bit for bit in
every shape tried from 4 rows up (1 to 3 rows sum in another order: a few fp32 ulps), with
row-wise scales from per-sample ones too.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from solrl_core.quant.activation_scale import samples_of
from solrl_core.quant.gpu_path import compile_quantizer, takes_gpu_path

E4M3_MAX = 448.0
# _scaled_mm needs both the reduction dim and the output dim to be multiples of 16.
SCALED_MM_ALIGNMENT = 16
# FP8 tensor cores arrived with Ada / Hopper (sm_89, sm_90); row-wise scales need sm_90.
SCALED_MM_MIN_CAPABILITY = (8, 9)
ROWWISE_MIN_CAPABILITY = (9, 0)
# The fp32 value of every E4M3 bit pattern, indexed by the pattern (0x7F and 0xFF are NaN).
_E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


class FP8Tensor(NamedTuple):
    """E4M3 data and its fp32 scale: a scalar (per tensor) or [groups, 1], one scale per run of
    rows.shape[0] / groups consecutive rows (groups = rows: per row; = samples: per sample)."""

    data: torch.Tensor
    scale: torch.Tensor


def fp8_scale(x: torch.Tensor, rowwise: bool = False, samples: int | None = None) -> torch.Tensor:
    """FP32 amax(|x|) / 448: per last-dim row when ``rowwise``, per sample ([samples, 1], x's rows
    split into ``samples`` equal runs) when ``samples``, else one; 1.0 where that is not a positive
    finite number, so nothing divides by zero.

    The guard is on the scale, not the amax: an amax below ~5e-36 is positive, but amax / 448 is
    then an fp32 subnormal, which flush-to-zero makes 0, and the group's zeros would become
    0 / 0 = NaN. With scale 1.0 such a group quantizes to zeros, as it should."""
    magnitude = x.detach().abs()
    if rowwise:
        amax = magnitude.amax(dim=-1, keepdim=True)
    elif samples is not None:
        amax = magnitude.reshape(samples, -1).amax(dim=1, keepdim=True)
    else:
        amax = magnitude.amax()
    scale = amax.float() / E4M3_MAX
    return torch.where((scale > 0) & torch.isfinite(scale), scale, 1.0)


def _by_group(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x as [groups, elements of a group] against scale as [groups, 1] (x itself per tensor)."""
    return x if scale.dim() == 0 else x.reshape(scale.numel(), -1)


def _group_scales(scale: torch.Tensor) -> torch.Tensor:
    return scale if scale.dim() == 0 else scale.reshape(-1, 1)


def quantize_fp8(x: torch.Tensor, rowwise: bool = False, samples: int | None = None) -> FP8Tensor:
    """(x / scale as float8_e4m3fn, scale), with fp8_scale's scale.

    x / scale can round a hair above 448. E4M3 has no infinity, and whether a raw cast of an
    overflow saturates or gives NaN differs between conversion routines, so clamp first."""
    scale = fp8_scale(x, rowwise, samples)
    scaled = (_by_group(x.float(), scale) / _group_scales(scale)).clamp(-E4M3_MAX, E4M3_MAX)
    return FP8Tensor(scaled.reshape(x.shape).to(torch.float8_e4m3fn), scale)


def dequantize_fp8(x_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x_fp8 * scale in fp32. On a CPU, where the groups are few (one per tensor or per sample),
    through a 256-entry table per group of each E4M3 code's value times its scale: the same fp32
    products, in about a quarter of the time of the CPU's elementwise float8 -> float32 cast (the
    emulated explorer's largest cost there)."""
    groups = scale.numel()
    if x_fp8.is_cuda or groups * len(_E4M3_VALUES) > x_fp8.numel():
        return (_by_group(x_fp8, scale).float() * _group_scales(scale)).reshape(x_fp8.shape)
    scaled_tables = _E4M3_VALUES.to(scale.device) * scale.float().reshape(groups, 1)
    codes = _by_group(x_fp8, scale).view(torch.uint8).int()
    if groups > 1:  # group g's codes index its own table: code + 256 g
        codes.add_(torch.arange(groups, device=codes.device, dtype=torch.int32).mul_(len(_E4M3_VALUES)).unsqueeze(1))
    return scaled_tables.reshape(-1).index_select(0, codes.reshape(-1)).reshape(x_fp8.shape)


def fake_quantize_fp8(x: torch.Tensor, rowwise: bool = False) -> torch.Tensor:
    """Quantize to FP8 E4M3 and back, in x's dtype."""
    return dequantize_fp8(*quantize_fp8(x, rowwise)).to(x.dtype)


# --- the activation quantizer ------------------------------------------------------------------

_COMPILED_QUANTIZE = None


def _compiled_quantize():
    """quantize_fp8 compiled once for the GPU path (quant/gpu_path.py: eager's division)."""
    global _COMPILED_QUANTIZE
    if _COMPILED_QUANTIZE is None:
        _COMPILED_QUANTIZE = compile_quantizer(quantize_fp8, fullgraph=True)
    return _COMPILED_QUANTIZE


def quantize_activation(x: torch.Tensor, rowwise: bool = False) -> FP8Tensor:
    """The activation as a row-major [tokens, features] FP8Tensor, one scale per sample (or per
    row when ``rowwise``); compiled on the GPU path."""
    rows = x.reshape(-1, x.shape[-1])
    samples = None if rowwise else samples_of(x)
    if takes_gpu_path(rows):
        return _compiled_quantize()(rows, rowwise, samples)
    return quantize_fp8(rows, rowwise, samples)


# --- the GEMM ----------------------------------------------------------------------------------


def scales_by_row(x: FP8Tensor, w: FP8Tensor) -> bool:
    """Whether this GEMM needs _scaled_mm's row-wise scales (either operand scaled per group)."""
    return x.scale.dim() > 0 or w.scale.dim() > 0


def can_use_scaled_mm(x: torch.Tensor, w_fp8: torch.Tensor) -> bool:
    """Whether this GEMM runs torch._scaled_mm: on the GPU path, on a GPU with FP8 tensor cores,
    for a layer of aligned sizes. The CPU runs both scale modes; a GPU below sm_90 runs row-wise
    scales only as _rows_scaled_after (see fp8_matmul)."""
    if not takes_gpu_path(x):
        return False
    if x.is_cuda and torch.cuda.get_device_capability(x.device) < SCALED_MM_MIN_CAPABILITY:
        return False
    out_features, in_features = w_fp8.shape
    # Odd-sized layers are rare and small; emulating them is simpler than padding both operands.
    return in_features % SCALED_MM_ALIGNMENT == 0 and out_features % SCALED_MM_ALIGNMENT == 0


def has_rowwise_scaled_mm(x: torch.Tensor) -> bool:
    """Whether _scaled_mm takes row-wise scales on x's device (the CPU does; GPUs from sm_90)."""
    return not x.is_cuda or torch.cuda.get_device_capability(x.device) >= ROWWISE_MIN_CAPABILITY


def row_scales(x: FP8Tensor) -> torch.Tensor:
    """x's scale as one fp32 scale per row, [rows, 1] and contiguous: _scaled_mm's row-wise scale_a."""
    rows, groups = x.data.shape[0], x.scale.numel()
    return x.scale.reshape(groups, 1, 1).expand(groups, rows // groups, 1).reshape(rows, 1).contiguous()


def _column_scales(w: FP8Tensor) -> torch.Tensor:
    """The weight's scale as [1, out] (row-wise scale_b): its rows' scales, or its one broadcast."""
    out_features = w.data.shape[0]
    return w.scale.reshape(1, -1) if w.scale.dim() else w.scale.reshape(1, 1).expand(1, out_features).contiguous()


def _scaled_mm(x: FP8Tensor, w: FP8Tensor, bias, out_dtype: torch.dtype, fast_accum: bool) -> torch.Tensor:
    """Real FP8 GEMM. _scaled_mm wants a row-major left operand and a column-major right one:
    w.data is a contiguous [out, in] tensor, so its .t() is exactly the column-major [in, out].
    Scales are both scalars, or [rows, 1] and [1, out] (row-wise)."""
    # The GEMM adds the bias itself only for a 16-bit output of the bias's dtype.
    fused_bias = bias is not None and out_dtype in (torch.bfloat16, torch.float16) and bias.dtype == out_dtype
    by_row = scales_by_row(x, w)
    scale_a, scale_b = (row_scales(x), _column_scales(w)) if by_row else (x.scale, w.scale)
    out = torch._scaled_mm(x.data, w.data.t(), scale_a=scale_a, scale_b=scale_b,
                           bias=bias if fused_bias else None, out_dtype=out_dtype, use_fast_accum=fast_accum)
    if bias is not None and not fused_bias:
        out = (out.float() + bias.float()).to(out_dtype)
    return out


def _rows_scaled_after(x: FP8Tensor, w: FP8Tensor, bias, out_dtype: torch.dtype, fast_accum: bool) -> torch.Tensor:
    """Per-sample activation scales on an FP8 GPU without row-wise _scaled_mm (sm_89): the GEMM
    with a unit activation scale and the weight's one scale, written in fp32, then each row times
    its scale, plus the bias. One GEMM for the batch; one rounding more than the row-wise
    epilogue, and an fp32 output pass."""
    unit = torch.ones((), dtype=torch.float32, device=x.data.device)
    out = torch._scaled_mm(x.data, w.data.t(), scale_a=unit, scale_b=w.scale, out_dtype=torch.float32,
                           use_fast_accum=fast_accum) * row_scales(x)
    return (out if bias is None else out + bias.float()).to(out_dtype)


def _emulated(x: FP8Tensor, w: FP8Tensor, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """Same numerics as the FP8 GEMM up to accumulation order: fp8 operands, fp32 accumulation,
    the bias added in fp32."""
    out = F.linear(dequantize_fp8(*x), dequantize_fp8(*w))
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def fp8_matmul(x: FP8Tensor, w: FP8Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype,
               fast_accum: bool = True) -> torch.Tensor:
    """[tokens, out] = x @ w.T + bias from two quantized operands (x row-major [tokens, in])."""
    if not can_use_scaled_mm(x.data, w.data):
        return _emulated(x, w, bias, out_dtype)
    if not scales_by_row(x, w) or has_rowwise_scaled_mm(x.data):
        return _scaled_mm(x, w, bias, out_dtype, fast_accum)
    if w.scale.dim() == 0:
        return _rows_scaled_after(x, w, bias, out_dtype, fast_accum)
    return _emulated(x, w, bias, out_dtype)  # fp8-rowwise below sm_90


def fp8_linear(
    x: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    fast_accum: bool = True,
) -> torch.Tensor:
    """y = x @ w.T + bias with x quantized to FP8 now (one scale per sample) and w already FP8
    ([out, in], contiguous). Per-row when ``w_scale`` is [out, 1] (the activation then gets one
    scale per token)."""
    activation = quantize_activation(x, rowwise=w_scale.dim() > 0)
    out = fp8_matmul(activation, FP8Tensor(w_fp8, w_scale), bias, out_dtype, fast_accum)
    return out.reshape(*x.shape[:-1], w_fp8.shape[0])
