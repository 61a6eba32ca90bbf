"""Reward registry and the weighted combination used to rank seeds and form advantages.

A reward is a callable ``(images [B,3,H,W] in [0,1], prompts) -> Tensor[B]`` (float32, CPU).
Factories are imported lazily so that a real reward model's heavy imports happen only when used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import torch


class Reward(Protocol):
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor: ...


def _shapes_compliance() -> Reward:
    from solrl_core.world.rewards import shapes_compliance

    return shapes_compliance


def _shapes_aesthetic() -> Reward:
    from solrl_core.world.rewards import shapes_aesthetic

    return shapes_aesthetic


REWARDS: dict[str, Callable[[], Reward]] = {
    "shapes-compliance": _shapes_compliance,
    "shapes-aesthetic": _shapes_aesthetic,
}


class RewardFailure(RuntimeError):
    pass


@dataclass
class RewardScores:
    """Per-reward scores and their weighted sum, aligned with the scored batch."""

    per_reward: dict[str, torch.Tensor]
    combined: torch.Tensor


class RewardSet:
    """The rewards a run computes: the weighted training rewards plus any evaluation-only ones."""

    def __init__(self, weights: dict[str, float], extra: list[str] | tuple[str, ...] = ()):
        self.weights = dict(weights)
        names = list(weights) + [name for name in extra if name not in weights]
        self.models = {name: REWARDS[name]() for name in names}

    @property
    def names(self) -> list[str]:
        return list(self.models)

    def score(self, images: torch.Tensor, prompts: list[str], names: list[str] | None = None) -> RewardScores:
        names = names or list(self.weights)
        per_reward = {}
        for name in names:
            scores = self.models[name](images.float().cpu(), prompts).float().cpu()
            if scores.shape != (len(prompts),):
                raise RewardFailure(f"reward '{name}' returned shape {tuple(scores.shape)} for {len(prompts)} images")
            per_reward[name] = scores
        combined = torch.zeros(len(prompts))
        for name, weight in self.weights.items():
            if name in per_reward:
                combined = combined + weight * per_reward[name]
        return RewardScores(per_reward=per_reward, combined=combined)


def finite_mean(values: torch.Tensor) -> float:
    finite = values[torch.isfinite(values)]
    return float(finite.mean()) if finite.numel() else math.nan
