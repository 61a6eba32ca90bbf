"""Deterministic flow-matching samplers (Euler, DPM-Solver-2 multistep) on shifted sigma grids.

Convention (FLUX, SD3, SANA): x_sigma = (1 - sigma) * x0 + sigma * noise; the model predicts the
velocity v = noise - x0, so x0_hat = x_sigma - sigma * v. Sampling integrates sigma from 1 to 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

Velocity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, sigma[B]) -> v


def sigma_grid(steps: int, shift: float = 1.0) -> torch.Tensor:
    """steps + 1 sigmas from 1 to 0, shifted: sigma' = shift*s / (1 + (shift - 1)*s)."""
    if steps < 1:
        raise ValueError(f"steps ({steps}) must be >= 1")
    base = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    shifted = shift * base / (1.0 + (shift - 1.0) * base)
    return shifted.to(torch.float32)


@dataclass
class SampleResult:
    latents: torch.Tensor  # the clean sample x0 (final state)
    sigmas: torch.Tensor  # the grid it was sampled on, [steps + 1]


def euler_sample(velocity: Velocity, noise: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    x = noise
    for sigma, sigma_next in zip(sigmas[:-1].tolist(), sigmas[1:].tolist()):
        v = velocity(x, _batch_sigma(x, sigma))
        x = x + (sigma_next - sigma) * v
    return x


def dpm2_sample(velocity: Velocity, noise: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """DPM-Solver++(2M) in data prediction, first order at the ends (sigma = 1 and the last step).

    With alpha = 1 - sigma and lambda = log(alpha / sigma), one step from s to t is
    x_t = (sigma_t / sigma_s) x_s - alpha_t (exp(-h) - 1) D, h = lambda_t - lambda_s, where D is
    the current x0 estimate (first order) or its linear extrapolation with the previous one.
    """
    x = noise
    previous_x0: torch.Tensor | None = None
    previous_h: float | None = None
    sigma_list = sigmas.tolist()
    last = len(sigma_list) - 2
    for i, (sigma, sigma_next) in enumerate(zip(sigma_list[:-1], sigma_list[1:])):
        x0 = x - sigma * velocity(x, _batch_sigma(x, sigma))
        h = _log_snr(sigma_next) - _log_snr(sigma)
        use_second_order = previous_x0 is not None and i != last and math.isfinite(previous_h) and math.isfinite(h)
        if use_second_order:
            r = previous_h / h
            estimate = (1 + 1 / (2 * r)) * x0 - (1 / (2 * r)) * previous_x0
        else:
            estimate = x0
        x = _dpm_step(x, estimate, sigma, sigma_next, h)
        previous_x0, previous_h = x0, h
    return x


def _dpm_step(x: torch.Tensor, estimate: torch.Tensor, sigma: float, sigma_next: float, h: float) -> torch.Tensor:
    if sigma_next == 0.0:
        return estimate  # lambda -> inf: the step lands on the data estimate
    if sigma == 1.0:
        # lambda_s = -inf: exp(-h) = 0, so x_t = sigma_t * x_s + alpha_t * D (an Euler step from pure noise).
        return sigma_next * x + (1 - sigma_next) * estimate
    return (sigma_next / sigma) * x - (1 - sigma_next) * math.expm1(-h) * estimate


def _log_snr(sigma: float) -> float:
    if sigma <= 0.0:
        return math.inf
    if sigma >= 1.0:
        return -math.inf
    return math.log((1 - sigma) / sigma)


def _batch_sigma(x: torch.Tensor, sigma: float) -> torch.Tensor:
    return torch.full((x.shape[0],), sigma, dtype=torch.float32, device=x.device)


SAMPLERS = {"euler": euler_sample, "dpm2": dpm2_sample}


def sample(kind: str, velocity: Velocity, noise: torch.Tensor, steps: int, shift: float) -> SampleResult:
    sigmas = sigma_grid(steps, shift)
    return SampleResult(latents=SAMPLERS[kind](velocity, noise, sigmas), sigmas=sigmas)
