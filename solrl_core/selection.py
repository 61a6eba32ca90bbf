"""Which seeds of each prompt group are kept (the K most extreme, or K at random for the
random_pool control), and rank-fidelity metrics between two scorings."""

from __future__ import annotations

import math

import torch

from solrl_core.seeds import derive_seed

# config.selection: how the rank stage keeps K of each group's N seeds. "extremes" keeps the K/2
# best and K/2 worst (every family of the paper); "random" keeps K drawn at random, whatever their
# rewards (the random_pool control: naive_scaling's cost without its selection).
KEEP_RULES = ("extremes", "random")


def select_random(groups: int, pool: int, keep: int, run_seed: int, iteration: int, first_group: int = 0) -> torch.Tensor:
    """Indices [P, keep] of ``keep`` seeds drawn uniformly without replacement from each group's
    pool, in seed order. Each group's draw is keyed by its global index (``first_group`` + g), so
    it never depends on which rank holds the group."""
    if keep > pool:
        raise ValueError(f"keep ({keep}) must be <= pool ({pool})")
    rows = []
    for group in range(groups):
        generator = torch.Generator().manual_seed(derive_seed(run_seed, "random-keep", iteration, first_group + group))
        rows.append(torch.randperm(pool, generator=generator)[:keep].sort().values)
    return torch.stack(rows) if rows else torch.empty(0, keep, dtype=torch.long)


def select_extremes(rewards: torch.Tensor, keep: int) -> torch.Tensor:
    """Indices [P, keep] of the keep/2 best then keep/2 worst seeds of each group (rewards [P, N]).

    A stable sort keeps ties in seed order, so the selection is deterministic. When keep == N the
    whole group is kept in seed order (the plain DiffusionNFT baseline draws no extra seeds).
    A non-finite reward (NaN or +-inf: a reward model that failed on the image) says nothing about
    the seed, so it ranks in the middle of its group: it is kept only when the group has fewer than
    ``keep`` finite rewards, and then its sample is left out of the update.
    """
    groups, pool = rewards.shape
    if keep > pool or keep % 2:
        raise ValueError(f"keep ({keep}) must be even and <= pool ({pool})")
    if keep == pool:
        return torch.arange(pool).expand(groups, pool).clone()
    half = keep // 2
    order = rank_order(rewards)
    return torch.cat([order[:, :half], order[:, pool - half:]], dim=1)


def rank_order(rewards: torch.Tensor) -> torch.Tensor:
    """[P, N] each group's seeds from best to worst, the order select_extremes keeps the head and
    tail of: a stable sort (ties stay in seed order), non-finite rewards in the middle."""
    return torch.stack([_order_of_group(group) for group in rewards.double()])


def _order_of_group(rewards: torch.Tensor) -> torch.Tensor:
    finite = torch.isfinite(rewards)
    scored = torch.nonzero(finite).flatten()
    order = scored[torch.sort(rewards[scored], descending=True, stable=True).indices]
    middle = (order.numel() + 1) // 2
    return torch.cat([order[:middle], torch.nonzero(~finite).flatten(), order[middle:]])


def average_ranks(values: torch.Tensor) -> torch.Tensor:
    """1-based ranks of a 1-D tensor (ascending), ties sharing their average rank."""
    values = values.double()
    order = torch.argsort(values, stable=True)
    sorted_values = values[order]
    ranks = torch.empty_like(values)
    position = 0
    n = values.numel()
    while position < n:
        end = position
        while end + 1 < n and sorted_values[end + 1] == sorted_values[position]:
            end += 1
        ranks[order[position:end + 1]] = (position + end) / 2 + 1
        position = end + 1
    return ranks


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rho (Pearson on average ranks); NaN when either side is constant or too short."""
    if a.numel() < 2:
        return math.nan
    return _pearson(average_ranks(a), average_ranks(b))


def kendall_tau(a: torch.Tensor, b: torch.Tensor) -> float:
    """Kendall's tau-b, which corrects for ties on either side."""
    a, b = a.double().flatten(), b.double().flatten()
    if a.numel() < 2:
        return math.nan
    da = torch.sign(a[:, None] - a[None, :])
    db = torch.sign(b[:, None] - b[None, :])
    upper = torch.triu(torch.ones_like(da, dtype=torch.bool), diagonal=1)
    concordance = (da * db)[upper].sum()
    pairs_a = (da != 0)[upper].sum()
    pairs_b = (db != 0)[upper].sum()
    if pairs_a == 0 or pairs_b == 0:
        return math.nan
    return float(concordance / torch.sqrt(pairs_a.double() * pairs_b.double()))


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    x = x - x.mean()
    y = y - y.mean()
    denominator = torch.sqrt((x * x).sum() * (y * y).sum())
    if denominator == 0:
        return math.nan
    return float((x * y).sum() / denominator)
