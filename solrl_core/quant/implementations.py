"""How each explorer backend quantizes: the implementations that solrl_core.quant.backends'
records name.

An implementation turns a layer's (weight, bias) into a cached entry once per requantize,
quantizes an activation, and multiplies the two; entries are tuples of tensors (or modules), so
their bytes can be counted against the record's storage. Every constructor takes ``packages``:
stand-ins for the packages the backend's record requires (None: import the real ones), which is
how tests exercise Transformer Engine's path without it.

This module imports torch only (the kernel modules it uses are torch-only as well; Transformer
Engine itself is imported by quant/te_nvfp4.py when that backend is built), so the records that
config validation reads can point here.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from solrl_core.quant import nvfp4_linear
from solrl_core.quant.fp8 import FP8Tensor, fp8_matmul, quantize_activation, quantize_fp8
from solrl_core.quant.te_nvfp4 import TransformerEngineNVFP4


class EmulatedNVFP4:
    """Exact W4A4 NVFP4: packed weights, bf16 tensor-core GEMMs on the GPU path
    (quant/nvfp4_linear.py)."""

    def __init__(self, packages=None):
        self.kernels = nvfp4_linear

    def quantize_weight(self, weight, bias, dtype, previous=None):
        return self.kernels.pack_weight(weight, bias, dtype)

    def quantize_activation(self, x: torch.Tensor):
        return self.kernels.quantize_activation(x)

    def matmul(self, activation, cached, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.nvfp4_matmul(activation, cached, x)


class FP8Weight(NamedTuple):
    data: torch.Tensor  # float8_e4m3fn [out, in], contiguous
    scale: torch.Tensor  # fp32 scalar, or [out, 1] row-wise
    bias: torch.Tensor | None  # the model's dtype: the GEMM adds a bf16 bias itself


class FP8:
    """FP8 E4M3 with current scaling, one scale per tensor (quant/fp8.py says why this path and
    not torchao's)."""

    rowwise = False

    def __init__(self, packages=None):
        pass

    def quantize_weight(self, weight, bias, dtype, previous=None):
        data, scale = quantize_fp8(weight, rowwise=self.rowwise)
        return FP8Weight(data.contiguous(), scale, None if bias is None else bias.to(dtype))

    def quantize_activation(self, x: torch.Tensor) -> FP8Tensor:
        return quantize_activation(x, rowwise=self.rowwise)

    def matmul(self, activation: FP8Tensor, cached: FP8Weight, x: torch.Tensor) -> torch.Tensor:
        out = fp8_matmul(activation, FP8Tensor(cached.data, cached.scale), cached.bias, x.dtype)
        return out.reshape(*x.shape[:-1], cached.data.shape[0])


class FP8RowWise(FP8):
    """FP8 E4M3 with one scale per activation row and per weight row."""

    rowwise = True


class TransformerEngine:
    """te-nvfp4 (quant/te_nvfp4.py); TE quantizes the activation inside its GEMM. ``packages``:
    (transformer_engine.pytorch, transformer_engine.common.recipe) or stand-ins for them."""

    def __init__(self, packages=None):
        self.impl = TransformerEngineNVFP4(packages)
        self.session = self.impl.session

    def quantize_weight(self, weight, bias, dtype, previous=None):
        return self.impl.quantize_weight(weight, bias, dtype, previous)

    def quantize_activation(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def matmul(self, activation, cached, x: torch.Tensor) -> torch.Tensor:
        return self.impl.forward(cached, x)
