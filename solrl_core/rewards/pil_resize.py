"""PIL's bicubic resize of 8-bit images, computed on tensors (on the GPU when the batch is there).

The official CLIPScore and PickScore scorers preprocess with the PIL image processor: images are
8-bit, resized by Pillow's ``Image.resize(..., BICUBIC)``, center-cropped, rescaled, normalised.
transformers 5 defaults to a torchvision processor instead, whose resize differs from Pillow's by
up to 2 levels, and a plain ``interpolate(mode="bicubic", antialias=True)`` (the same filter) by
tens of levels on detailed images, because Pillow rounds and clips to 8 bits between its two
passes. This module follows Pillow's 8-bit resampler (libImaging/Resample.c) step by step:

- per output pixel, the bicubic kernel (a = -0.5) stretched by the downscale factor, over the
  input pixels whose centres it covers, normalised to sum 1;
- those weights rounded to fixed point with 22 fractional bits (half away from zero);
- a horizontal pass, then a vertical one (each skipped when its size does not change), each
  summing pixel x weight exactly, adding one half, flooring the 22 bits away and clipping to
  0..255.

Integers below 2**53 are exact in float64 whatever the summation order, so a float64 matmul with
the integer weights reproduces Pillow's integer arithmetic exactly; the tests compare against
the PIL processor.
"""

from __future__ import annotations

import functools
import math

import torch

PRECISION_BITS = 22  # Pillow: 32 - 8 bits of a pixel - 2 bits of headroom
BICUBIC_A = -0.5
BICUBIC_SUPPORT = 2.0


def _bicubic(x: float) -> float:
    """Pillow's bicubic kernel, with its own order of operations (the weights must match bit for bit)."""
    x = abs(x)
    if x < 1.0:
        return ((BICUBIC_A + 2.0) * x - (BICUBIC_A + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * BICUBIC_A
    return 0.0


@functools.lru_cache(maxsize=64)
def resize_weights(in_size: int, out_size: int) -> torch.Tensor:
    """[out_size, in_size] float64 holding Pillow's fixed-point weights (integers) of one pass."""
    scale = in_size / out_size
    filter_scale = max(scale, 1.0)  # upscaling keeps the kernel's own width
    support = BICUBIC_SUPPORT * filter_scale
    inverse = 1.0 / filter_scale  # Pillow multiplies by the reciprocal; dividing would round differently
    weights = torch.zeros(out_size, in_size, dtype=torch.float64)
    for out_index in range(out_size):
        center = (out_index + 0.5) * scale
        first = max(int(center - support + 0.5), 0)
        last = min(int(center + support + 0.5), in_size)
        taps = [_bicubic((x - center + 0.5) * inverse) for x in range(first, last)]
        total = 0.0
        for tap in taps:  # summed in order, as Pillow does
            total += tap
        for offset, tap in enumerate(taps):
            value = (tap / total if total != 0.0 else tap) * (1 << PRECISION_BITS)
            weights[out_index, first + offset] = math.trunc(value - 0.5 if value < 0 else value + 0.5)
    return weights


def _pass(pixels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """One 8-bit pass along the last dimension: exact integer sums, Pillow's rounding and clipping."""
    sums = pixels @ weights.to(pixels.device).T
    return torch.floor((sums + (1 << (PRECISION_BITS - 1))) / (1 << PRECISION_BITS)).clamp_(0, 255)


def resize_8bit(pixels: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[..., H, W] integer-valued pixels (0..255, any float dtype) -> [..., height, width] float64,
    as Pillow's ``Image.resize((width, height), BICUBIC)`` of the 8-bit image."""
    out = pixels.to(torch.float64)
    if out.shape[-1] != width:
        out = _pass(out, resize_weights(out.shape[-1], width))
    if out.shape[-2] != height:
        out = _pass(out.transpose(-1, -2), resize_weights(out.shape[-2], height)).transpose(-1, -2)
    return out
