"""The ``te-nvfp4`` explorer backend: NVFP4 GEMMs through Transformer Engine on Blackwell.

SPEC §3's format, as Transformer Engine spells it: ``NVFP4BlockScaling`` with
``disable_2d_quantization=True``, so weights get 1x16 blocks along the reduction dimension like
activations (the recipe's default gives weights 16x16 blocks); no random Hadamard transform and
no stochastic rounding (both only ever touch backward-pass tensors in the recipe, and the
explorer runs no backward; turning them off keeps the recipe exactly the format we test).

- The layers are built once, inside ``quantized_model_init``, so each holds only its NVFP4
  weight: no full-precision copy beside the policy's own base weight.
- requantize copies the merged weight into that quantized parameter: the weight is quantized
  once per requantize and reused by every forward until the next.
- The explorer enters the recipe's autocast once around all its forwards (``session``), not once
  per layer.
- A layer whose sizes Transformer Engine's NVFP4 GEMM cannot take (not multiples of 32) runs the
  exact emulation instead, which rounds in the order of operations of TE's reference quantizer
  (quant/nvfp4.py); its activation scale is per sample, TE's spans the GEMM's input (below).
- TE's NVFP4 GEMM also needs the number of rows (batch x tokens) divisible by 16, which SANA's
  300-token caption stream misses at most batch sizes: the rows are zero-padded to a multiple of
  16 and the padding cut from the output. Zero rows add nothing to the per-tensor amax TE scales
  the activation by, so the real rows' codes are the ones they would be unpadded.
- That amax is the recipe's level-2 scale, "a global per tensor FP32 scaling factor" over the
  GEMM's whole input: every sample of the explore chunk at once. Unlike the other explorers, whose
  activation scales are per sample (quant/activation_scale.py), this backend's drafts depend on
  their chunk-mates, so on ``explore.chunk`` and the number of ranks (the record says so, and the
  run log). The recipe's ``row_scaled_activation`` (one amax per row, newer TE) would remove that,
  but is untried here.

Transformer Engine is imported here only, when the backend is built; tests without it pass a
stand-in module and check what this code asks of it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from solrl_core.quant.nvfp4_linear import NVFP4Weight, nvfp4_linear, pack_weight

# Keyword arguments of NVFP4BlockScaling that make it SPEC §3's format.
RECIPE_SETTINGS = {"disable_2d_quantization": True, "disable_rht": True, "disable_stochastic_rounding": True}
TE_ALIGNMENT = 32
TE_TOKEN_MULTIPLE = 16  # rows (batch x tokens) of an NVFP4 GEMM's input


def _import_transformer_engine():
    # deferred: optional package transformer_engine (installed only where NVFP4 runs on Blackwell)
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe  # deferred: optional package transformer_engine

    return te, recipe


class TransformerEngineNVFP4:
    def __init__(self, modules=None):
        self.te, recipe = modules if modules is not None else _import_transformer_engine()
        self.recipe = recipe.NVFP4BlockScaling(**RECIPE_SETTINGS)

    @staticmethod
    def supports(in_features: int, out_features: int) -> bool:
        return in_features % TE_ALIGNMENT == 0 and out_features % TE_ALIGNMENT == 0

    def _quantized_init(self):
        # Newer TE renamed fp8_model_init to quantized_model_init; accept either.
        init = getattr(self.te, "quantized_model_init", None) or self.te.fp8_model_init
        return init(enabled=True, recipe=self.recipe)

    def _new_layer(self, out_features: int, in_features: int, has_bias: bool, device: torch.device):
        with self._quantized_init():
            layer = self.te.Linear(in_features, out_features, bias=has_bias, params_dtype=torch.bfloat16,
                                   device=device)
        return layer.requires_grad_(False)

    def quantize_weight(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, previous=None):
        out_features, in_features = weight.shape
        if not self.supports(in_features, out_features):
            return pack_weight(weight, bias, dtype)
        layer = previous if previous is not None and not isinstance(previous, NVFP4Weight) else \
            self._new_layer(out_features, in_features, bias is not None, weight.device)
        with torch.no_grad():
            layer.weight.copy_(weight.to(torch.bfloat16))  # quantizes into the NVFP4 parameter
            if bias is not None:
                layer.bias.copy_(bias.to(torch.bfloat16))
        return layer

    @contextmanager
    def session(self) -> Iterator[None]:
        # Newer TE renamed fp8_autocast(fp8_recipe=) to autocast(recipe=); accept either.
        if hasattr(self.te, "autocast"):
            context = self.te.autocast(enabled=True, recipe=self.recipe)
        else:
            context = self.te.fp8_autocast(enabled=True, fp8_recipe=self.recipe)
        with context:
            yield

    def forward(self, cached, x: torch.Tensor) -> torch.Tensor:
        if isinstance(cached, NVFP4Weight):
            return nvfp4_linear(x, cached)
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        padding = -rows.shape[0] % TE_TOKEN_MULTIPLE
        out = cached(torch.nn.functional.pad(rows, (0, 0, 0, padding)) if padding else rows)
        return out[:rows.shape[0]].reshape(*x.shape[:-1], out.shape[-1]).to(x.dtype)
