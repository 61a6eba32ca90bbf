"""Which samples share an activation's tensor-level scale: none; each sample has its own.

The explorer's activation quantizers (``emulated-nvfp4``'s FP32 tensor scale, ``fp8``'s E4M3
scale) take the amax per sample: over all dims of the activation but the first, which is the batch
dim in every model's transformer (tokens [B, T, C], pooled [B, C], a 1x1 convolution's
[B, H, W, C]). A draft is then a function of its own seed, prompt and weights, never of the
samples that share its explore chunk or its rank. The finer scales (NVFP4's 1x16 block scales,
``fp8-rowwise``'s per-token scales) lie inside one sample already; the weights keep their own
per-tensor (or per-row) scales.

One scale over the whole tensor stays reachable for ``benchmarks/per_sample_scale.py`` only, which
compares the two (:func:`_per_tensor_scales`); no config key selects it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

_PER_TENSOR = False


def samples_of(x: torch.Tensor) -> int | None:
    """How many samples ``x`` holds along its first dim, each with its own scale; None where the
    whole tensor has one scale (a 0-D or 1-D tensor: one sample, the same numbers)."""
    if _PER_TENSOR or x.dim() < 2:
        return None
    return x.shape[0]


@contextmanager
def _per_tensor_scales() -> Iterator[None]:
    """Inside, activations get one scale over the whole tensor again (the batch's amax), through
    the same kernels as before per-sample scales: for the benchmark that compares the two. Not
    thread-local."""
    global _PER_TENSOR
    previous, _PER_TENSOR = _PER_TENSOR, True
    try:
        yield
    finally:
        _PER_TENSOR = previous
