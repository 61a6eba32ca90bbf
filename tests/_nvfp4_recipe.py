"""NVIDIA's NVFP4 recipe written out step by step in numpy float32, for the tests to hold the
quantizer to (tests/test_nvfp4_recipe.py) and to read torchao's differences against
(tests/test_outside_oracles.py); and the inputs where the order of operations decides.

The recipe (Transformer Engine's reference quantizer), in fp32, fl = one rounding:
    S_enc = min(fl(2688 / amax), FLT_MAX)            amax: of the tensor, or of each sample
    s_b   = e4m3_rn(min(fl(amax_b * fl(S_enc * fl(1/6))), 448))
    e_b   = min(fl(1 / fl(s_b * fl(1 / S_enc))), FLT_MAX)
    code  = e2m1_rn(clamp(fl(x * e_b), -6, 6)), ties to the even code, the sign kept (-0 included)
    value = fl(fl(code * s_b) * fl(amax / 2688))
``recipe`` computes exactly that, one numpy float32 operation per step, with its own E4M3 and E2M1
rounding (nearest grid value, ties to the even code) instead of torch's casts.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
# Every finite non-negative E4M3 value, indexed by its bit pattern: subnormals m * 2^-9, then
# (1 + m/8) * 2^(e-7); e = 15, m = 7 is NaN.
E4M3_GRID = np.array([m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
                      for e in range(16) for m in range(8) if (e, m) != (15, 7)])
TIES = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
# Tensor amaxes: S_enc exactly 1, then values whose reciprocals round (one found in the old tests).
AMAXES = [2688.0, 56.960845947265625, 3.3, 0.1234]


def nearest(values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Index of the grid value nearest each non-negative value (at most the grid's largest), ties
    to the even index: the even code, as both formats number their values in order."""
    above = np.clip(np.searchsorted(grid, values), 0, len(grid) - 1)
    below = np.clip(above - 1, 0, None)
    to_above, to_below = grid[above] - values, values - grid[below]
    return np.where((to_above < to_below) | ((to_above == to_below) & (above % 2 == 0)), above, below)


def recipe(x: np.ndarray, per_sample: bool = False):
    """(4-bit codes, E4M3 block-scale bit patterns, tensor scales, values) of float32 x [..., 16 k]."""
    blocks = x.astype(F32).reshape(*x.shape[:-1], -1, 16)
    block_amax = np.abs(blocks).max(axis=-1)
    amax = (block_amax.reshape(x.shape[0], -1).max(axis=1).reshape(-1, *[1] * (block_amax.ndim - 1))
            if per_sample else block_amax.max())
    with np.errstate(divide="ignore", over="ignore"):
        encode = np.minimum(F32(2688) / amax, FLT_MAX)
        global_decode = F32(1) / encode
        multiplier = encode * (F32(1) / F32(6))
        block_scale_codes = nearest(np.minimum(block_amax * multiplier, F32(448)).astype(np.float64), E4M3_GRID)
        block_scales = E4M3_GRID[block_scale_codes].astype(F32)
        encode_block = np.minimum(F32(1) / (block_scales * global_decode), FLT_MAX)
        scaled = blocks * encode_block[..., None]
    assert scaled.dtype == F32 and encode_block.dtype == F32  # fp32 arithmetic throughout
    magnitude_codes = nearest(np.minimum(np.abs(scaled), F32(6)).astype(np.float64), E2M1_GRID)
    negative = np.signbit(scaled)
    codes = magnitude_codes | (negative << 3)
    tensor_scale = amax / F32(2688)
    element_values = np.where(negative, -E2M1_GRID[magnitude_codes], E2M1_GRID[magnitude_codes]).astype(F32)
    values = element_values * block_scales[..., None] * (tensor_scale[..., None] if per_sample else tensor_scale)
    return codes.reshape(x.shape), block_scale_codes, tensor_scale, values.astype(F32).reshape(x.shape)


def steps(values: np.ndarray, k: int) -> np.ndarray:
    """``values`` moved k float32 ulps (up for k > 0)."""
    values = values.astype(F32)
    for _ in range(abs(k)):
        values = np.nextafter(values, F32(np.inf) if k > 0 else F32(-np.inf)).astype(F32)
    return values


def one_row(sentinel: float, blocks: list[np.ndarray]) -> np.ndarray:
    """A [1, 16 n] tensor: a block holding the tensor amax, then ``blocks`` (each at most 16 values)."""
    rows = [np.array([sentinel] + [0.0] * 15, dtype=F32)]
    rows += [np.concatenate([b, np.zeros(16 - len(b), dtype=F32)]).astype(F32) for b in blocks]
    return np.concatenate(rows).reshape(1, -1)


def recipe_numbers(amax: float):
    encode = F32(F32(2688) / F32(amax))
    return F32(F32(1) / encode), F32(encode * (F32(1) / F32(6))), F32(F32(amax) / F32(2688))


def tie_tensor(amax: float) -> np.ndarray:
    """For every nonzero E4M3 block scale: a block whose amax gets that scale, then values that sit
    exactly on an E2M1 tie (of both signs) after the recipe's multiply or after a division by the
    combined scale, and the values 1 and 2 ulps beside them."""
    global_decode, multiplier, tensor_scale = recipe_numbers(amax)
    blocks = []
    for scale in E4M3_GRID[1:].astype(F32):
        block_amax = F32(scale / multiplier)
        unrounded = np.array([min(block_amax * multiplier, F32(448))], dtype=np.float64)
        if E4M3_GRID[nearest(unrounded, E4M3_GRID)][0] != scale:
            continue
        encode = min(F32(F32(1) / F32(scale * global_decode)), FLT_MAX)
        ties = np.concatenate([TIES, -TIES]).astype(F32)
        by_multiply, by_division = (ties / encode).astype(F32), (ties * F32(scale * tensor_scale)).astype(F32)
        candidates = np.concatenate([steps(ties_of, k) for ties_of in (by_multiply, by_division) for k in range(-2, 3)])
        candidates = np.unique(candidates[np.abs(candidates) <= block_amax])
        chunks = np.array_split(candidates, -(-len(candidates) // 15))  # 15 values beside each block's amax
        blocks += [np.concatenate([[block_amax], chunk]) for chunk in chunks]
    return one_row(amax, blocks)


def midpoint_tensor(amax: float) -> np.ndarray:
    """Blocks whose amax puts the unrounded block scale exactly on, or 1 to 2 ulps beside, the
    midpoint of two neighbouring E4M3 values (0 and 2^-9 included), under the recipe's order and
    under the old one; the other values of each block at random below its amax."""
    _, multiplier, tensor_scale = recipe_numbers(amax)
    grid = E4M3_GRID.astype(F32)
    midpoints = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(F32)  # exact in fp32
    by_recipe = (midpoints / multiplier).astype(F32)
    by_old_order = ((midpoints * tensor_scale).astype(F32) * F32(6)).astype(F32)
    candidates = np.concatenate([steps(amaxes, k) for amaxes in (by_recipe, by_old_order) for k in range(-2, 3)])
    candidates = np.unique(candidates[(candidates > 0) & (candidates <= F32(amax))])
    rest = np.random.default_rng(0).uniform(-1, 1, (len(candidates), 15)).astype(F32) * candidates[:, None]
    return one_row(amax, list(np.concatenate([candidates[:, None], rest], axis=1)))


def old_order(x: np.ndarray):
    """(codes, block-scale codes) as this module computed them before it followed the recipe."""
    blocks = x.astype(F32).reshape(*x.shape[:-1], -1, 16)
    block_amax = np.abs(blocks).max(axis=-1)
    tensor_scale = F32(block_amax.max() / F32(2688))
    scale_codes = nearest(np.minimum((block_amax / F32(6)) / tensor_scale, F32(448)).astype(np.float64), E4M3_GRID)
    combined = E4M3_GRID[scale_codes].astype(F32) * tensor_scale
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(combined[..., None] > 0, blocks / combined[..., None], F32(0)).astype(F32)
    codes = nearest(np.minimum(np.abs(scaled), F32(6)).astype(np.float64), E2M1_GRID) | (np.signbit(scaled) << 3)
    return codes.reshape(x.shape), scale_codes
