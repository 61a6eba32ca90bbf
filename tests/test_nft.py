"""The DiffusionNFT objective (SPEC section 4): advantages, optimality weights, loss, schedules."""

import math

import pytest
import torch

from solrl_core.config import TrainConfig
from solrl_core.nft import ema_decay, group_advantages, nft_loss, old_policy_rate, optimality_weight

# --- advantages and weights ----------------------------------------------------------------


def test_advantages_have_zero_mean_in_every_group():
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(4, 6, generator=generator) * 3 + torch.arange(4.0).view(4, 1) * 10
    advantages = group_advantages(rewards)
    assert advantages.shape == rewards.shape
    assert torch.allclose(advantages.mean(dim=1), torch.zeros(4), atol=1e-6)


def test_advantages_divide_by_the_global_std_not_the_group_std():
    rewards = torch.tensor([[0.0, 2.0], [10.0, 10.0]])
    # group means 1 and 10; population std of {0, 2, 10, 10} = sqrt(20.75)
    denominator = math.sqrt(20.75) + 1e-4
    expected = torch.tensor([[-1.0, 1.0], [0.0, 0.0]]) / denominator
    assert torch.allclose(group_advantages(rewards), expected, atol=1e-6)


def test_identical_rewards_give_zero_advantages_not_nan():
    advantages = group_advantages(torch.full((3, 4), 0.7))
    assert torch.equal(advantages, torch.zeros(3, 4))


def test_advantage_ordering_follows_reward_ordering_within_a_group():
    rewards = torch.tensor([[0.1, 0.9, 0.5, 0.3]])
    advantages = group_advantages(rewards)[0]
    assert torch.argsort(advantages).tolist() == torch.argsort(rewards[0]).tolist()


def test_optimality_weight_maps_advantages_linearly_and_clips():
    advantages = torch.tensor([5.0, -5.0, 0.0, 2.5, -2.5, 12.0, -40.0])
    weights = optimality_weight(advantages, adv_clip=5.0)
    assert torch.allclose(weights, torch.tensor([1.0, 0.0, 0.5, 0.75, 0.25, 1.0, 0.0]))
    weights = optimality_weight(torch.tensor([1.0, -1.0, 3.0]), adv_clip=1.0)
    assert torch.allclose(weights, torch.tensor([1.0, 0.0, 1.0]))


def test_one_sided_advantage_modes_give_the_other_side_the_neutral_weight():
    advantages = torch.tensor([5.0, -5.0, 0.0, 2.5, -2.5, 12.0, -40.0])
    positive = optimality_weight(advantages, adv_clip=5.0, mode="positive_only")
    assert torch.allclose(positive, torch.tensor([1.0, 0.5, 0.5, 0.75, 0.5, 1.0, 0.5]))
    negative = optimality_weight(advantages, adv_clip=5.0, mode="negative_only")
    assert torch.allclose(negative, torch.tensor([0.5, 0.0, 0.5, 0.5, 0.25, 0.5, 0.0]))


# --- the loss ------------------------------------------------------------------------------


def _batch_with_x0_errors(errors, sigma, seed=0):
    """A batch whose reconstruction x_t - sigma * v misses clean = 0 by exactly ``errors``."""
    generator = torch.Generator().manual_seed(seed)
    errors = torch.as_tensor(errors, dtype=torch.float32)
    velocity = torch.randn(errors.shape, generator=generator)
    noisy = errors + sigma.view(-1, 1) * velocity
    return velocity, noisy, torch.zeros_like(errors)


def test_policy_loss_when_all_velocities_agree_matches_hand_computation():
    sigma = torch.tensor([0.5, 0.25])
    # sample 0: mean square 2.5 / mean abs 1.5 = 5/3;  sample 1: 0.25 / 0.5 = 0.5
    velocity, noisy, clean = _batch_with_x0_errors([[1.0, -1.0, 2.0, -2.0], [0.5, 0.5, 0.5, 0.5]], sigma)
    weight = torch.tensor([0.3, 0.9])
    adv_clip, beta = 5.0, 0.5
    result = nft_loss(velocity, velocity.clone(), velocity.clone(), noisy, clean, sigma, weight,
                      beta=beta, adv_clip=adv_clip, kl_weight=1e-4)
    expected = adv_clip / beta * (5 / 3 + 0.5) / 2
    assert result.policy_loss == pytest.approx(expected, rel=1e-5)
    assert result.kl_loss == 0.0
    assert result.loss.item() == pytest.approx(expected, rel=1e-5)


def test_implicit_policies_follow_the_spec_formulas():
    generator = torch.Generator().manual_seed(1)
    shape = (3, 5)
    velocity, old, ref = (torch.randn(shape, generator=generator) for _ in range(3))
    noisy, clean = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    sigma = torch.tensor([0.2, 0.5, 0.9])
    weight = torch.tensor([1.0, 0.0, 0.25])
    beta, adv_clip, kl_weight = 0.7, 5.0, 0.01

    def normalised_error(predicted_velocity):
        difference = noisy - sigma.view(-1, 1) * predicted_velocity - clean
        return (difference**2).mean(dim=1) / difference.abs().mean(dim=1)

    positive = normalised_error(beta * velocity + (1 - beta) * old)
    negative = normalised_error((1 + beta) * old - beta * velocity)
    policy = adv_clip / beta * (weight * positive + (1 - weight) * negative).mean()
    kl = ((velocity - ref) ** 2).mean()
    result = nft_loss(velocity, old, ref, noisy, clean, sigma, weight, beta=beta, adv_clip=adv_clip,
                      kl_weight=kl_weight)
    assert result.policy_loss == pytest.approx(policy.item(), rel=1e-5)
    assert result.kl_loss == pytest.approx(kl.item(), rel=1e-5)
    assert result.loss.item() == pytest.approx(policy.item() + kl_weight * kl.item(), rel=1e-5)


def test_perfect_reconstruction_gives_zero_loss_and_finite_gradient():
    sigma = torch.tensor([0.4])
    velocity, noisy, clean = _batch_with_x0_errors([[0.0, 0.0, 0.0]], sigma)
    theta = velocity.clone().requires_grad_(True)
    result = nft_loss(theta, velocity, velocity, noisy, clean, sigma, torch.tensor([0.6]),
                      beta=1.0, adv_clip=5.0, kl_weight=1e-4)
    result.loss.backward()
    assert result.loss.item() == pytest.approx(0.0, abs=1e-6)
    assert torch.isfinite(theta.grad).all()


def test_kl_term_is_zero_at_the_reference_and_positive_away_from_it():
    sigma = torch.tensor([0.5, 0.5])
    velocity, noisy, clean = _batch_with_x0_errors([[1.0, 2.0], [-1.0, 0.5]], sigma)
    weight = torch.tensor([0.5, 0.5])
    at_ref = nft_loss(velocity, velocity, velocity, noisy, clean, sigma, weight, 1.0, 5.0, kl_weight=0.1)
    away = nft_loss(velocity, velocity, velocity - 2.0, noisy, clean, sigma, weight, 1.0, 5.0, kl_weight=0.1)
    assert at_ref.kl_loss == 0.0
    assert away.kl_loss == pytest.approx(4.0)
    assert away.loss.item() - at_ref.loss.item() == pytest.approx(0.1 * 4.0, rel=1e-5)


def test_gradient_moves_the_policy_toward_high_reward_and_away_from_low_reward_samples():
    generator = torch.Generator().manual_seed(2)
    dim = 16
    noisy_one = torch.randn(1, dim, generator=generator)
    x0_good = torch.randn(1, dim, generator=generator)
    x0_bad = torch.randn(1, dim, generator=generator)
    start_x0 = torch.randn(1, dim, generator=generator)
    sigma_value = 0.6
    old_velocity = (noisy_one - start_x0) / sigma_value  # the old policy reconstructs start_x0
    theta = old_velocity.clone().requires_grad_(True)

    noisy = torch.cat([noisy_one, noisy_one])
    clean = torch.cat([x0_good, x0_bad])
    sigma = torch.full((2,), sigma_value)
    weight = torch.tensor([1.0, 0.0])
    old = old_velocity.expand(2, dim)

    def implied_x0():
        return noisy_one - sigma_value * theta.detach()

    good_before = (implied_x0() - x0_good).norm().item()
    bad_before = (implied_x0() - x0_bad).norm().item()
    optimizer = torch.optim.SGD([theta], lr=0.02)
    for _ in range(5):
        optimizer.zero_grad()
        result = nft_loss(theta.expand(2, dim), old, old, noisy, clean, sigma, weight,
                          beta=1.0, adv_clip=5.0, kl_weight=1e-4)
        result.loss.backward()
        optimizer.step()
    assert (implied_x0() - x0_good).norm().item() < good_before
    assert (implied_x0() - x0_bad).norm().item() > bad_before


def test_swapping_the_weights_reverses_the_gradient_direction_preference():
    generator = torch.Generator().manual_seed(5)
    dim = 8
    noisy = torch.randn(1, dim, generator=generator).expand(2, dim)
    clean = torch.randn(2, dim, generator=generator)
    old = torch.randn(1, dim, generator=generator).expand(2, dim)
    sigma = torch.full((2,), 0.5)

    def gradient(weight):
        theta = old[:1].clone().requires_grad_(True)
        nft_loss(theta.expand(2, dim), old, old, noisy, clean, sigma, weight, 1.0, 5.0, 0.0).loss.backward()
        return theta.grad

    toward_first = -gradient(torch.tensor([1.0, 0.0]))
    toward_second = -gradient(torch.tensor([0.0, 1.0]))
    # Reducing theta's implied x0 error toward sample 0 means v moving along (x_t - x0_0)/sigma - v.
    direction_first = (noisy[:1] - clean[:1]) / 0.5 - old[:1]
    direction_second = (noisy[:1] - clean[1:]) / 0.5 - old[:1]
    assert (toward_first * direction_first).sum() > 0
    assert (toward_second * direction_second).sum() > 0


# --- schedules -------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [0, 1, 10, 250, 499, 500, 501, 10_000])
def test_old_policy_rate_schedule_counts_optimizer_steps(steps):
    assert old_policy_rate(steps, 0.001, 0.5) == pytest.approx(min(0.001 * steps, 0.5))


def test_old_policy_rate_starts_at_zero_so_old_equals_trained():
    assert old_policy_rate(0, 0.001, 0.5) == 0.0


@pytest.mark.parametrize("step", [0, 1, 10, 79, 80, 81, 5000])
def test_ema_decay_schedule(step):
    assert ema_decay(step, 0.9) == pytest.approx(min((1 + step) / (10 + step), 0.9))


def test_ema_decay_is_non_decreasing_and_capped():
    values = [ema_decay(step, 0.9) for step in range(200)]
    assert values[0] == pytest.approx(0.1)
    assert all(b >= a for a, b in zip(values, values[1:]))
    assert max(values) == pytest.approx(0.9)


@pytest.mark.slow
def test_the_reference_old_policy_and_ema_recursions_over_multi_step_iterations():
    """The reference code's two recursions, replayed over two iterations of three optimizer steps:
    after each AdamW step s (counted over the run), ema <- d(s) ema + (1 - d(s)) trained with
    d(s) = min((1 + s) / (10 + s), 0.9); after each iteration's last step, old <- eta old +
    (1 - eta) trained with eta = min(rate * s, max) (return_decay(global_step)). Blending the EMA
    once per iteration would average ~10 iterations; counting eta in iterations would leave the
    old policy nearly equal to the trained one for hundreds of iterations at several steps each."""
    from solrl_core import stages
    from solrl_core.models.adapters import EMA, OLD, TRAINED, adapter_parameters
    from solrl_core.presets import resolve_config

    # A rate large enough that the old policy visibly lags, capped within the second iteration.
    config = resolve_config("shapes-tiny", "sol_rl", [
        ("prompts_per_iteration", 2), ("pool", 8), ("keep", 4), ("explore.steps", 3), ("regenerate.steps", 4),
        ("train.steps_per_iteration", 3), ("train.eta_rate", 0.1), ("train.eta_max", 0.5), ("progress", False)])
    state = stages.initial_state(config)
    stages.quantize(state)
    transformer = state.policy.transformer

    def snapshot(adapter):
        return {key: value.detach().clone().double() for key, value in adapter_parameters(transformer, adapter).items()}

    expected_ema, expected_old, initial = snapshot(EMA), snapshot(OLD), snapshot(TRAINED)
    steps = []

    def after_step(optimizer, args, kwargs):
        steps.append(len(steps) + 1)
        decay = ema_decay(steps[-1], config.train.ema_max_decay)
        for key, trained in adapter_parameters(transformer, TRAINED).items():
            expected_ema[key] = decay * expected_ema[key] + (1 - decay) * trained.detach().double()

    state.optimizer.register_step_post_hook(after_step)
    rates = []
    for iteration in range(2):
        drafts = stages.explore(state, iteration)
        rollout = stages.regenerate(state, drafts, stages.rank(drafts, config))
        report = stages.update(state, rollout, iteration)
        rates.append(report.old_policy_rate)
        eta = min(0.1 * len(steps), 0.5)
        for key, trained in snapshot(TRAINED).items():
            expected_old[key] = eta * expected_old[key] + (1 - eta) * trained
    assert steps == [1, 2, 3, 4, 5, 6] and rates == pytest.approx([0.3, 0.5])
    moved = max(float((value - initial[key]).abs().max()) for key, value in snapshot(TRAINED).items())
    assert moved > 1e-5, "the trained weights must move for this test to say anything"
    for adapter, expected in ((EMA, expected_ema), (OLD, expected_old)):
        for key, value in snapshot(adapter).items():
            torch.testing.assert_close(value, expected[key], rtol=1e-5, atol=1e-9, msg=f"{adapter} {key}")


def test_train_defaults_match_spec():
    train = TrainConfig()
    assert (train.eta_rate, train.eta_max, train.ema_max_decay) == (0.001, 0.5, 0.9)
    assert (train.nft_beta, train.adv_clip, train.kl_weight) == (1.0, 5.0, 1e-4)
    assert (train.lr, train.beta1, train.beta2, train.weight_decay, train.grad_clip) == (3e-4, 0.9, 0.999, 1e-4, 1.0)
    assert train.timestep_fraction == 0.6
    assert (train.lora.rank, train.lora.alpha) == (32, 64)
