"""The DiffusionNFT objective (SPEC section 4): advantages, optimality weights, the loss, and the
schedules of the old-policy soft update and the evaluation EMA."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

NORMALISER_FLOOR = 1e-5
ADVANTAGE_EPS = 1e-4
# train.adv_mode: which side of the advantages trains. "positive_only" gives every below-mean
# sample the neutral weight 1/2 (it then only holds the policy near the old one), so the update
# imitates the good samples and pushes away from none; "negative_only" is the mirror image.
ADVANTAGE_MODES = ("all", "positive_only", "negative_only")


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """rewards [P, K] -> (r - group mean) / (std over the whole iteration + 1e-4).

    The denominator is global, not per group: a group whose samples all score alike keeps small
    advantages instead of having its noise blown up to unit scale.
    Non-finite rewards (a reward model that failed on an image) get a NaN advantage and are left
    out of the group means and the global std, so they cannot shift anyone else's advantage.
    """
    rewards = rewards.double()
    finite = torch.isfinite(rewards)
    values = torch.where(finite, rewards, torch.zeros_like(rewards))
    counts = finite.sum(dim=1, keepdim=True)
    group_mean = values.sum(dim=1, keepdim=True) / counts.clamp(min=1)
    centred = torch.where(finite, rewards - group_mean, torch.full_like(rewards, math.nan))
    scored = rewards[finite]
    spread = float(((scored - scored.mean()) ** 2).mean().sqrt()) if scored.numel() else 0.0
    return (centred / (spread + ADVANTAGE_EPS)).float()


def optimality_weight(advantages: torch.Tensor, adv_clip: float, mode: str = "all") -> torch.Tensor:
    """w = clip(clip(A, -A_max, A_max) / (2 A_max) + 0.5, 0, 1): 1 for the best, 0 for the worst.
    ``mode`` (ADVANTAGE_MODES) first zeroes the negative or the positive advantages."""
    low, high = {"all": (-adv_clip, adv_clip), "positive_only": (0.0, adv_clip),
                 "negative_only": (-adv_clip, 0.0)}[mode]
    clipped = advantages.clamp(low, high)
    return (clipped / (2 * adv_clip) + 0.5).clamp(0.0, 1.0)


@dataclass
class NFTLoss:
    loss: torch.Tensor  # scalar, differentiable
    policy_loss: float
    kl_loss: float


def nft_loss(velocity: torch.Tensor, old_velocity: torch.Tensor, ref_velocity: torch.Tensor,
             noisy: torch.Tensor, clean: torch.Tensor, sigma: torch.Tensor, weight: torch.Tensor,
             beta: float, adv_clip: float, kl_weight: float) -> NFTLoss:
    """DiffusionNFT loss for a batch at per-sample noise levels ``sigma`` [B].

    The positive implicit policy v+ interpolates toward the trained velocity, the negative one
    reflects it through the old policy; weighting their x0 reconstructions by w pulls the policy
    toward high-reward samples and pushes it away from low-reward ones.
    """
    sigma = sigma.view(-1, *([1] * (noisy.dim() - 1)))
    reduce_dims = tuple(range(1, noisy.dim()))
    positive_velocity = beta * velocity + (1 - beta) * old_velocity
    negative_velocity = (1 + beta) * old_velocity - beta * velocity
    positive_error = _normalised_x0_error(noisy - sigma * positive_velocity, clean, reduce_dims)
    negative_error = _normalised_x0_error(noisy - sigma * negative_velocity, clean, reduce_dims)
    policy = (adv_clip / beta) * (weight * positive_error + (1 - weight) * negative_error).mean()
    kl = ((velocity - ref_velocity) ** 2).mean(dim=reduce_dims).mean()
    return NFTLoss(loss=policy + kl_weight * kl, policy_loss=float(policy.detach()), kl_loss=float(kl.detach()))


def _normalised_x0_error(predicted: torch.Tensor, clean: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    # The adaptive normaliser is a stop-gradient scale, so the loss is invariant to how far off
    # the reconstruction is overall and only its direction of improvement matters.
    normaliser = (predicted - clean).abs().mean(dim=dims, keepdim=True).detach().clamp_min(NORMALISER_FLOOR)
    return ((predicted - clean) ** 2 / normaliser).mean(dim=dims)


def old_policy_rate(optimizer_steps: int, rate: float, maximum: float) -> float:
    """eta in theta_old <- eta * theta_old + (1 - eta) * theta, applied once an iteration after its
    optimizer steps; ``optimizer_steps`` counts every step so far (the reference's
    return_decay(global_step)). 0 before any step, so old == trained."""
    return min(rate * optimizer_steps, maximum)


def ema_decay(step: int, maximum: float) -> float:
    return min((1 + step) / (10 + step), maximum)
