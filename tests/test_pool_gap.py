"""The premise of rollout scaling, as the pool-gap study measures it (benchmarks/pool_gap.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.pool_gap import gap_table, kept_gap  # noqa: E402


def test_kept_gap_is_best_half_minus_worst_half():
    rewards = torch.tensor([[0.0, 1.0, 2.0, 3.0, 10.0, -10.0]])
    assert kept_gap(rewards, keep=2).tolist() == [20.0]
    assert kept_gap(rewards, keep=4).tolist() == [(10 + 3) / 2 - (-10 + 0) / 2]


def test_a_larger_pool_keeps_a_wider_gap_on_independent_rewards():
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(400, 96, generator=generator, dtype=torch.float64)
    rows = gap_table(rewards, keep=24)
    gaps = [row["gap_mean"] for row in rows]
    assert [row["pool"] for row in rows] == [24, 48, 72, 96]
    assert all(later > earlier + 4 * row["gap_se"] for earlier, later, row in zip(gaps, gaps[1:], rows))
    assert math.isclose(rows[-1]["extreme_value_estimate"], 2 * math.sqrt(2 * math.log(96)), rel_tol=0.02)
