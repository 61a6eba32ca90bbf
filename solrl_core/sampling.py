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


class Trajectory:
    """A batch of deterministic ODE trajectories on one sigma grid that can be advanced a few steps
    at a time and cut to a subset of its rows, with the arithmetic of a run in one go: a row's
    state after step i is the same whether it got there in one call or several, alongside whichever
    rows (adaptive exploration continues only the survivors of a pool, solrl_core.adaptive).

    ``x0`` is the data prediction x - sigma * v of the last velocity call: a free draft of each row.
    ``velocity_rows`` counts rows passed to the velocity (one call per row per step for both
    samplers: DPM-Solver-2M reuses the previous call's x0 instead of making a second one).
    """

    def __init__(self, kind: str, noise: torch.Tensor, sigmas: torch.Tensor):
        if kind not in SAMPLERS:
            raise ValueError(f"unknown sampler {kind!r}; allowed: {', '.join(SAMPLERS)}")
        self.kind, self.sigmas, self.x = kind, sigmas, noise
        self.step = 0  # steps taken
        self.x0: torch.Tensor | None = None
        self.previous_h: float | None = None  # DPM-2M: the last step's log-SNR increment
        self.velocity_rows = 0

    @property
    def steps(self) -> int:
        return len(self.sigmas) - 1

    def advance(self, velocity: Velocity, until: int) -> Trajectory:
        """Take the steps up to ``until`` (at most the grid's last); returns self."""
        sigma_list = self.sigmas.tolist()
        while self.step < min(until, self.steps):
            sigma, sigma_next = sigma_list[self.step], sigma_list[self.step + 1]
            v = velocity(self.x, _batch_sigma(self.x, sigma))
            self.velocity_rows += self.x.shape[0]
            x0 = self.x - sigma * v
            if self.kind == "euler":
                self.x = self.x + (sigma_next - sigma) * v
            else:
                self.x = self._dpm2_step(x0, sigma, sigma_next)
            self.x0 = x0
            self.step += 1
        return self

    def _dpm2_step(self, x0: torch.Tensor, sigma: float, sigma_next: float) -> torch.Tensor:
        h = _log_snr(sigma_next) - _log_snr(sigma)
        previous_h, previous_x0 = self.previous_h, self.x0
        use_second_order = (previous_x0 is not None and self.step != self.steps - 1
                            and math.isfinite(previous_h) and math.isfinite(h))
        if use_second_order:
            r = previous_h / h
            estimate = (1 + 1 / (2 * r)) * x0 - (1 / (2 * r)) * previous_x0
        else:
            estimate = x0
        self.previous_h = h
        return _dpm_step(self.x, estimate, sigma, sigma_next, h)

    def rows(self, index: torch.Tensor | list[int]) -> Trajectory:
        """A new trajectory of the given rows, at the same step with the same solver state."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.x.device)
        part = Trajectory(self.kind, self.x[index], self.sigmas)
        part.step, part.previous_h = self.step, self.previous_h
        part.x0 = None if self.x0 is None else self.x0[index]
        return part

    @staticmethod
    def joined(parts: list[Trajectory]) -> Trajectory:
        """The rows of ``parts`` (all at the same step of the same grid) as one trajectory."""
        first = parts[0]
        if any(p.step != first.step or p.kind != first.kind for p in parts):
            raise ValueError("only trajectories at the same step of the same sampler can be joined")
        whole = Trajectory(first.kind, torch.cat([p.x for p in parts]), first.sigmas)
        whole.step, whole.previous_h = first.step, first.previous_h
        whole.x0 = None if first.x0 is None else torch.cat([p.x0 for p in parts])
        return whole


def euler_sample(velocity: Velocity, noise: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    return Trajectory("euler", noise, sigmas).advance(velocity, len(sigmas) - 1).x


def dpm2_sample(velocity: Velocity, noise: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """DPM-Solver++(2M) in data prediction, first order at the ends (sigma = 1 and the last step).

    With alpha = 1 - sigma and lambda = log(alpha / sigma), one step from s to t is
    x_t = (sigma_t / sigma_s) x_s - alpha_t (exp(-h) - 1) D, h = lambda_t - lambda_s, where D is
    the current x0 estimate (first order) or its linear extrapolation with the previous one.
    """
    return Trajectory("dpm2", noise, sigmas).advance(velocity, len(sigmas) - 1).x


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
