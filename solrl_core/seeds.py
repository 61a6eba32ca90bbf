"""Seeds and noise: every initial noise is a pure function of (seed, shape, dtype).

Seeds are derived from (run seed, purpose, iteration, indices) by a stable hash, so the noise of a
sample never depends on batch size, chunking, order, device or rank.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import torch

SEED_BITS = 62  # stays a positive int64 in Parquet and in torch.Generator.manual_seed


def derive_seed(run_seed: int, purpose: str, *indices: int) -> int:
    """A stable 62-bit seed for one sample; ``purpose`` separates streams (explore, eval, noise, ...)."""
    payload = purpose.encode() + b"\0" + struct.pack(f"<{len(indices) + 1}q", run_seed, *indices)
    digest = hashlib.blake2b(payload, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


def draw_seeds(run_seed: int, iteration: int, prompt_slot: int, pool: int) -> list[int]:
    """The N exploration seeds of one prompt group, keyed by (prompt slot, index within the pool):
    a smaller pool is a prefix of a larger one, so families of one run seed with pools of 12 and 48
    explore the same first 12 noises of every prompt, and their runs pair by seed."""
    return [derive_seed(run_seed, "explore", iteration, prompt_slot, i) for i in range(pool)]


def noise_from_seed(seed: int, shape: Sequence[int], dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """Standard normal noise from a generator of its own; drawn on the CPU so devices agree."""
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    noise = torch.randn(tuple(shape), generator=generator, dtype=torch.float32)
    return noise.to(device=device, dtype=dtype)


def batch_noise(seeds: Sequence[int], shape: Sequence[int], dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu") -> torch.Tensor:
    """Stack per-seed noises: row i depends on seeds[i] alone."""
    if not seeds:
        return torch.empty((0, *shape), dtype=dtype, device=device)
    return torch.stack([noise_from_seed(seed, shape, dtype, device) for seed in seeds])
