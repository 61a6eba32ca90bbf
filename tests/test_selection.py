"""Best/worst-of-N selection per prompt group and the rank-fidelity metrics."""

import math

import pytest
import torch

from solrl_core.selection import average_ranks, kendall_tau, select_extremes, spearman


def test_keeps_half_best_in_descending_order_then_half_worst_per_group():
    rewards = torch.tensor([
        [0.5, 0.9, 0.1, 0.7, 0.3, 0.2, 0.8, 0.0],
        [3.0, 1.0, 2.0, 8.0, 5.0, 7.0, 6.0, 4.0],
    ])
    kept = select_extremes(rewards, 4)
    assert kept.shape == (2, 4)
    assert kept[0, :2].tolist() == [1, 6]  # 0.9, 0.8
    assert set(kept[0, 2:].tolist()) == {2, 7}  # 0.1, 0.0
    assert kept[1, :2].tolist() == [3, 5]  # 8, 7
    assert set(kept[1, 2:].tolist()) == {1, 2}  # 1, 2


def test_groups_are_selected_independently():
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(5, 12, generator=generator)
    together = select_extremes(rewards, 6)
    for g in range(5):
        assert torch.equal(together[g], select_extremes(rewards[g:g + 1], 6)[0])


def test_every_best_beats_every_worst_and_no_seed_is_kept_twice():
    generator = torch.Generator().manual_seed(3)
    rewards = torch.randn(4, 96, generator=generator)
    kept = select_extremes(rewards, 24)
    for g in range(4):
        best = rewards[g, kept[g, :12]]
        worst = rewards[g, kept[g, 12:]]
        assert len(set(kept[g].tolist())) == 24
        assert best.min() > worst.max()
        assert best.min() >= torch.topk(rewards[g], 12).values.min()
        assert worst.max() <= torch.topk(rewards[g], 12, largest=False).values.max()


def test_keep_equal_to_pool_returns_every_seed_in_order():
    rewards = torch.tensor([[0.3, 0.1, 0.2, float("nan")], [4.0, 3.0, 2.0, 1.0]])
    kept = select_extremes(rewards, 4)
    assert kept.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_unscored_drafts_are_never_kept_while_enough_scored_ones_exist():
    """A NaN or infinite reward says nothing about the seed: it neither wins a best slot (+inf)
    nor poses as a worst seed (NaN, -inf) while the group has enough finite rewards."""
    rewards = torch.tensor([[0.2, float("nan"), 0.9, float("inf"), 0.5, 0.1, float("-inf"), 0.7]])
    kept = select_extremes(rewards, 4)
    assert kept.tolist() == [[2, 7, 0, 5]]


def test_unscored_drafts_fill_in_only_when_too_few_are_scored():
    rewards = torch.tensor([[float("nan"), 0.4, float("nan"), 0.8]])
    kept = select_extremes(rewards, 2).tolist()
    assert kept == [[3, 1]]
    kept = select_extremes(torch.tensor([[float("nan"), 0.4, float("nan"), 0.8, 0.1, float("nan")]]), 4)[0].tolist()
    assert kept[:2] == [3, 1] and kept[-1] == 4  # best two and the worst scored one
    assert kept[2] in (0, 2, 5)  # one unscored draft fills the fourth slot


def test_all_nan_group_still_selects_distinct_seeds():
    kept = select_extremes(torch.full((1, 6), float("nan")), 4)
    assert len(set(kept[0].tolist())) == 4


def test_ties_are_broken_deterministically_by_seed_order():
    rewards = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0, 0.0]])
    first = select_extremes(rewards, 2)
    for _ in range(3):
        assert torch.equal(select_extremes(rewards.clone(), 2), first)
    assert first[0, 0].item() == 1  # the earliest of the tied best seeds
    assert first[0, 1].item() in (4, 5)
    flat = select_extremes(torch.zeros(2, 8), 4)
    assert torch.equal(flat, select_extremes(torch.zeros(2, 8), 4))
    assert flat[0, :2].tolist() == [0, 1]
    assert all(len(set(row)) == 4 for row in flat.tolist())


@pytest.mark.parametrize("keep", [5, 10, 12])
def test_invalid_keep_raises(keep):
    with pytest.raises(ValueError):
        select_extremes(torch.zeros(2, 8), keep)


# --- rank fidelity -------------------------------------------------------------------------


def test_perfect_and_reversed_rankings():
    a = torch.tensor([0.1, 0.5, 0.2, 0.9, 0.3])
    b = a * 10 + 3  # monotone transform: same ranking
    assert spearman(a, b) == pytest.approx(1.0)
    assert kendall_tau(a, b) == pytest.approx(1.0)
    assert spearman(a, -b) == pytest.approx(-1.0)
    assert kendall_tau(a, -b) == pytest.approx(-1.0)


def test_spearman_is_rank_based_not_linear():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    b = torch.tensor([1.0, 10.0, 100.0, 1000.0])
    assert spearman(a, b) == pytest.approx(1.0)


def test_average_ranks_share_ties():
    assert average_ranks(torch.tensor([10.0, 20.0, 20.0, 5.0])).tolist() == [2.0, 3.5, 3.5, 1.0]


def test_spearman_with_ties_matches_hand_computation():
    # ranks a = [1, 2.5, 2.5, 4], b = [1, 2, 3, 4]; centred dot 4.5, |a|^2 4.5, |b|^2 5
    a = torch.tensor([1.0, 2.0, 2.0, 3.0])
    b = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert spearman(a, b) == pytest.approx(4.5 / math.sqrt(4.5 * 5))


def test_kendall_tau_b_with_ties_matches_hand_computation():
    # 6 pairs: 5 concordant, 1 tied in a only -> tau_b = 5 / sqrt((6 - 1) * 6)
    a = torch.tensor([1.0, 2.0, 2.0, 3.0])
    b = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert kendall_tau(a, b) == pytest.approx(5 / math.sqrt(5 * 6))
    # ties on both sides: a=[1,1,2,3], b=[1,2,2,3]; pairs (0,1) tie a, (1,2) tie b,
    # the other 4 concordant -> 4 / sqrt(5 * 5)
    a = torch.tensor([1.0, 1.0, 2.0, 3.0])
    b = torch.tensor([1.0, 2.0, 2.0, 3.0])
    assert kendall_tau(a, b) == pytest.approx(4 / 5)


def test_metrics_agree_with_scipy_on_tied_data():
    stats = pytest.importorskip("scipy.stats")
    generator = torch.Generator().manual_seed(4)
    a = torch.randint(0, 5, (40,), generator=generator).double()
    b = a + torch.randint(0, 4, (40,), generator=generator).double()
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a.numpy(), b.numpy()).statistic, abs=1e-9)
    assert kendall_tau(a, b) == pytest.approx(stats.kendalltau(a.numpy(), b.numpy()).statistic, abs=1e-9)


def test_constant_or_too_short_input_gives_nan():
    constant = torch.full((5,), 2.0)
    varying = torch.arange(5.0)
    for metric in (spearman, kendall_tau):
        assert math.isnan(metric(constant, varying))
        assert math.isnan(metric(varying, constant))
        assert math.isnan(metric(torch.tensor([1.0]), torch.tensor([2.0])))
