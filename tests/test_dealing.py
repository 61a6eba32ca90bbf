"""How an iteration's kept samples are dealt to its optimizer steps (solrl_core.dealing), and the
random keep rule of the random_pool control (solrl_core.selection.select_random).

The kept samples arrive in reward order (each group's best half, then its worst half); the
reference code shuffles them before cutting batches. These are the properties a user relies on:
every scored sample trains in exactly one step, the shares are a seeded random partition that
knows nothing of the order the samples arrive in, and the same run seed and iteration deal alike.
"""

from __future__ import annotations

import pytest
import torch

from solrl_core.dealing import UNSCORED, deal_to_steps
from solrl_core.nft import group_advantages
from solrl_core.selection import select_extremes, select_random


@pytest.mark.parametrize("samples, steps", [(192, 32), (96, 8), (7, 3), (8, 8), (5, 1)])
def test_the_dealing_is_a_balanced_partition_of_the_scored_samples(samples, steps):
    dealt = deal_to_steps(torch.ones(samples, dtype=torch.bool), steps, run_seed=3, iteration=4)
    assert dealt.shape == (samples,) and dealt.dtype == torch.long
    counts = torch.bincount(dealt, minlength=steps)
    assert counts.numel() == steps and int(counts.sum()) == samples  # each sample in exactly one step
    assert int(counts.max() - counts.min()) <= 1


def test_unscored_samples_train_in_no_step_and_the_rest_are_still_dealt():
    scored = torch.tensor([True, False, True, True, False, True, True, True])
    dealt = deal_to_steps(scored, 3, run_seed=0, iteration=0)
    assert (dealt[~scored] == UNSCORED).all()
    assert sorted(torch.bincount(dealt[scored], minlength=3).tolist()) == [2, 2, 2]


def test_the_dealing_is_a_pure_function_of_run_seed_and_iteration():
    scored = torch.ones(96, dtype=torch.bool)
    first = deal_to_steps(scored, 8, run_seed=1, iteration=5)
    assert torch.equal(first, deal_to_steps(scored.clone(), 8, run_seed=1, iteration=5))
    assert not torch.equal(first, deal_to_steps(scored, 8, run_seed=1, iteration=6))
    assert not torch.equal(first, deal_to_steps(scored, 8, run_seed=2, iteration=5))


def _positive_share_per_step(groups: int, pool: int, keep: int, steps: int, iteration: int) -> torch.Tensor:
    """Through the real rank and advantage code: each step's share of kept samples whose
    advantage is positive, the kept samples in the order the rank stage returns them."""
    rewards = torch.rand(groups, pool, generator=torch.Generator().manual_seed(iteration))
    kept = torch.gather(rewards, 1, select_extremes(rewards, keep))
    positive = (group_advantages(kept) > 0).flatten().double()
    dealt = deal_to_steps(torch.ones(positive.numel(), dtype=torch.bool), steps, run_seed=0, iteration=iteration)
    return torch.stack([positive[dealt == step].mean() for step in range(steps)])


def test_in_make_runs_shape_no_step_is_all_best_or_all_worst_by_construction():
    """make run: 48 groups, 16 explored, 4 kept (2 best, 2 worst), 32 steps of 6 samples. Dealt
    in the order the kept samples arrive, every step would be all-best or all-worst (a share of
    exactly 0 or 1); dealt at random, a step of six is one-sided by chance (p = 2/64), and the
    shares centre on one half."""
    shares = torch.cat([_positive_share_per_step(48, 16, 4, 32, iteration) for iteration in range(10)])
    one_sided = float(((shares == 0) | (shares == 1)).double().mean())
    assert one_sided < 0.1, one_sided  # 320 steps: about 0.03 expected; in reward order it is 1.0
    assert abs(float(shares.mean()) - 0.5) < 0.02
    assert float(shares.std()) > 0.1  # a share that varies from step to step, not a fixed pattern


# --- the random keep rule (random_pool) ------------------------------------------------------


def test_the_random_keep_rule_keeps_k_distinct_seeds_per_group_in_seed_order():
    kept = select_random(groups=6, pool=48, keep=12, run_seed=0, iteration=3)
    assert kept.shape == (6, 12)
    for row in kept:
        assert len(set(row.tolist())) == 12 and row.tolist() == sorted(row.tolist())
        assert 0 <= int(row.min()) and int(row.max()) < 48


def test_the_random_keep_rule_is_keyed_by_global_group_not_by_rank():
    whole = select_random(groups=4, pool=16, keep=4, run_seed=1, iteration=2)
    halves = torch.cat([select_random(2, 16, 4, 1, 2, first_group=0), select_random(2, 16, 4, 1, 2, first_group=2)])
    assert torch.equal(whole, halves)
    assert not torch.equal(whole, select_random(4, 16, 4, 1, 3))


def test_the_random_keep_rule_keeps_every_seed_equally_often():
    """Over many groups each of the pool's seeds is kept with probability K/N, whatever its rank."""
    kept = select_random(groups=2000, pool=8, keep=2, run_seed=0, iteration=0)
    frequency = torch.bincount(kept.flatten(), minlength=8).double() / 2000
    assert torch.allclose(frequency, torch.full((8,), 2 / 8, dtype=torch.double), atol=0.03)


# --- nothing else in the update carries order (docs/update.md) -------------------------------


def test_advantages_follow_their_samples_under_any_order_within_and_across_groups():
    """The group mean and the iteration-wide std are order-free: permuting samples within groups
    and permuting the groups permutes the advantages the same way, nothing else."""
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(6, 12, generator=generator)
    within = torch.stack([torch.randperm(12, generator=generator) for _ in range(6)])
    across = torch.randperm(6, generator=generator)
    shuffled = torch.gather(rewards, 1, within)[across]
    expected = torch.gather(group_advantages(rewards), 1, within)[across]
    torch.testing.assert_close(group_advantages(shuffled), expected, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_how_a_step_is_cut_into_micro_batches_does_not_change_the_update():
    """A step's loss is a sum of per-(sample, timestep) terms, each with its own normaliser, so
    micro-batches of 1 and one micro-batch of the whole step train the same weights (to float
    rounding): which samples share a micro-batch carries no signal."""
    from solrl_core import stages
    from solrl_core.models.adapters import TRAINED, adapter_parameters
    from solrl_core.presets import resolve_config

    def state_with(micro_batch: int):
        config = resolve_config("shapes-tiny", "sol_rl", [
            ("prompts_per_iteration", 2), ("pool", 8), ("keep", 4), ("explore.steps", 3), ("regenerate.steps", 4),
            ("train.steps_per_iteration", 2), ("train.micro_batch", micro_batch), ("progress", False)])
        state = stages.initial_state(config)
        stages.quantize(state)
        return state

    whole, single = state_with(64), state_with(1)
    drafts = stages.explore(whole, 0)
    rollout = stages.regenerate(whole, drafts, stages.rank(drafts, whole.config))
    before = {k: v.detach().clone() for k, v in adapter_parameters(whole.policy.transformer, TRAINED).items()}
    stages.update(whole, rollout, 0)
    stages.update(single, rollout, 0)
    trained = adapter_parameters(whole.policy.transformer, TRAINED)
    moved = max(float((trained[k].detach() - before[k]).abs().max()) for k in before)
    assert moved > 1e-4, "the weights must move for this test to say anything"
    # AdamW divides each gradient by its own running scale, so float rounding in a near-zero
    # gradient entry can reach ~1% of a step's movement; another sample in a step moves it fully.
    apart = max(float((value.detach() - trained[key].detach()).abs().max())
                for key, value in adapter_parameters(single.policy.transformer, TRAINED).items())
    assert apart < 0.05 * moved, (apart, moved)
