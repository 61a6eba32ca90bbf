"""Which optimizer step of an iteration each kept sample trains in.

The reference code (DiffusionNFT's ``train_nft_sd3.py``, Sana's Sol-RL scripts) shuffles the
iteration's samples with ``torch.randperm`` before cutting them into batches, so no optimizer step
sees a share chosen by reward. The kept samples arrive here in reward order (each group's best
half, then its worst half: ``select_extremes``), so dealing them out in that order would make
every step all-best or all-worst. The dealing is a seeded, uniformly random partition instead,
a pure function of (run seed, iteration, which samples are scored): the same under any world
size, chunking or resume.
"""

from __future__ import annotations

import torch

from solrl_core.seeds import derive_seed

UNSCORED = -1  # a sample with no finite reward trains in no step


def deal_to_steps(scored: torch.Tensor, steps: int, run_seed: int, iteration: int) -> torch.Tensor:
    """[S] int64: the optimizer step (0 .. steps-1) of each of the iteration's S global samples,
    UNSCORED where ``scored`` is False.

    The scored samples are put in a seeded random order and dealt out in turn, so each step gets
    a uniformly random share of them and the shares differ in size by at most one."""
    scored = scored.flatten().bool()
    count = int(scored.sum())
    generator = torch.Generator().manual_seed(derive_seed(run_seed, "dealing", iteration))
    shuffled = torch.randperm(count, generator=generator)  # shuffled[j]: the scored sample dealt j-th
    step_of_scored = torch.empty(count, dtype=torch.long)
    step_of_scored[shuffled] = torch.arange(count) % steps
    result = torch.full(scored.shape, UNSCORED, dtype=torch.long)
    result[scored] = step_of_scored
    return result
