"""Deterministic flow-matching samplers on shifted sigma grids."""

import pytest
import torch

from solrl_core.sampling import SAMPLERS, dpm2_sample, euler_sample, sample, sigma_grid

KINDS = sorted(SAMPLERS)


@pytest.mark.parametrize("shift", [1.0, 3.0, 0.5])
@pytest.mark.parametrize("steps", [1, 6, 10])
def test_sigma_grid_runs_from_one_to_zero_monotonically(steps, shift):
    sigmas = sigma_grid(steps, shift)
    assert sigmas.shape == (steps + 1,)
    assert sigmas[0].item() == 1.0 and sigmas[-1].item() == 0.0
    assert bool((sigmas[1:] < sigmas[:-1]).all())


def test_sigma_grid_unshifted_is_uniform():
    assert torch.allclose(sigma_grid(4, 1.0), torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))


def test_sigma_grid_applies_the_shift_formula():
    base = torch.linspace(1.0, 0.0, 11, dtype=torch.float64)
    shift = 3.0
    expected = shift * base / (1 + (shift - 1) * base)
    assert torch.allclose(sigma_grid(10, shift).double(), expected, atol=1e-6)
    # shift > 1 spends more of the grid at high noise.
    assert bool((sigma_grid(10, 3.0)[1:-1] > sigma_grid(10, 1.0)[1:-1]).all())


@pytest.mark.parametrize("steps", [0, -1])
def test_fewer_than_one_step_raises(steps):
    with pytest.raises(ValueError):
        sigma_grid(steps)
    with pytest.raises(ValueError):
        sample("euler", lambda x, s: x, torch.zeros(1, 2), steps, 1.0)


def _toy_velocity(x, sigma):
    s = sigma.view(-1, *([1] * (x.dim() - 1)))
    return torch.sin(3 * x) * (1 + s) - 0.5 * x


@pytest.mark.parametrize("kind", KINDS)
def test_samplers_are_deterministic(kind):
    noise = torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(0))
    first = sample(kind, _toy_velocity, noise.clone(), 6, 3.0)
    second = sample(kind, _toy_velocity, noise.clone(), 6, 3.0)
    assert torch.equal(first.latents, second.latents)
    assert torch.equal(first.sigmas, sigma_grid(6, 3.0))
    assert first.latents.shape == noise.shape


@pytest.mark.parametrize("kind", KINDS)
def test_samplers_pass_per_sample_sigma_of_batch_length(kind):
    seen = []

    def velocity(x, sigma):
        seen.append(sigma.clone())
        return torch.zeros_like(x)

    sample(kind, velocity, torch.zeros(5, 3), 4, 1.0)
    assert len(seen) == 4
    for sigma, expected in zip(seen, sigma_grid(4, 1.0)[:-1]):
        assert sigma.shape == (5,)
        assert torch.allclose(sigma, expected.expand(5))


@pytest.mark.parametrize("shift", [1.0, 3.0])
@pytest.mark.parametrize("steps", [1, 2, 6, 10])
@pytest.mark.parametrize("kind", KINDS)
def test_exact_velocity_of_a_point_mass_lands_on_it(kind, steps, shift):
    generator = torch.Generator().manual_seed(1)
    x0 = torch.randn(2, 3, 4, generator=generator)
    noise = torch.randn(2, 3, 4, generator=generator)

    def velocity(x, sigma):
        # x = (1 - s) x0 + s eps  =>  v = eps - x0 = (x - x0) / s
        return (x - x0) / sigma.view(-1, 1, 1)

    result = sample(kind, velocity, noise, steps, shift)
    assert torch.allclose(result.latents, x0, atol=1e-5)


# --- Gaussian data: the exact flow-matching velocity is known in closed form ----------------
MU, TAU = 2.0, 1.0


def _gaussian_velocity(x, sigma):
    """E[eps - x0 | x_s] for x0 ~ N(MU, TAU^2), eps ~ N(0, 1), x_s = (1 - s) x0 + s eps."""
    s = sigma.view(-1, *([1] * (x.dim() - 1))).double()
    x = x.double()
    variance = (1 - s) ** 2 * TAU**2 + s**2
    centred = x - (1 - s) * MU
    expected_x0 = MU + (1 - s) * TAU**2 / variance * centred
    expected_noise = s / variance * centred
    return (expected_noise - expected_x0).float()


def _gaussian_noise():
    return torch.linspace(-2.5, 2.5, 11).view(11, 1)


def test_gaussian_ode_solution_reference_is_the_quantile_map():
    # The probability-flow ODE maps noise z to MU + TAU * z; a fine Euler solve agrees with it.
    noise = _gaussian_noise()
    fine = euler_sample(_gaussian_velocity, noise, sigma_grid(200))
    assert torch.allclose(fine, MU + TAU * noise, atol=0.03)


def test_dpm2_at_six_steps_is_much_closer_to_the_fine_solution_than_euler():
    noise = _gaussian_noise()
    fine = euler_sample(_gaussian_velocity, noise, sigma_grid(200))
    coarse = sigma_grid(6)
    euler_error = (euler_sample(_gaussian_velocity, noise, coarse) - fine).abs().max().item()
    dpm2_error = (dpm2_sample(_gaussian_velocity, noise, coarse) - fine).abs().max().item()
    assert dpm2_error < 0.4 * euler_error


def test_dpm2_converges_at_second_order_and_euler_at_first():
    noise = _gaussian_noise()
    exact = MU + TAU * noise

    def error(sampler, steps):
        return (sampler(_gaussian_velocity, noise, sigma_grid(steps)) - exact).abs().max().item()

    euler_ratio = error(euler_sample, 32) / error(euler_sample, 64)
    dpm2_ratio = error(dpm2_sample, 32) / error(dpm2_sample, 64)
    assert 1.7 < euler_ratio < 2.5
    assert dpm2_ratio > 3.0
    assert error(dpm2_sample, 64) < 0.1 * error(euler_sample, 64)
