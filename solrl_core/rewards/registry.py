"""Reward registry and the weighted combination used to rank seeds and form advantages.

A reward is a callable ``(images [B,3,H,W] in [0,1], prompts) -> Tensor[B]`` (float32, CPU).
Factories are imported lazily so that a real reward model's heavy imports happen only when used.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from solrl_core.rewards._local import LocalFiles
from solrl_core.rewards.clipscore import CLIPSCORE
from solrl_core.rewards.hpsv2 import HPSV2
from solrl_core.rewards.imagereward import IMAGEREWARD
from solrl_core.rewards.pickscore import PICKSCORE


class Reward(Protocol):
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor: ...


def _shapes_compliance() -> Reward:
    from solrl_core.world.rewards import shapes_compliance

    return shapes_compliance


def _shapes_aesthetic() -> Reward:
    from solrl_core.world.rewards import shapes_aesthetic

    return shapes_aesthetic


def _imagereward(path: str = "", offload: bool = False) -> Reward:
    from solrl_core.rewards.imagereward import load_imagereward

    return load_imagereward(path, offload)


def _hpsv2(path: str = "", offload: bool = False) -> Reward:
    from solrl_core.rewards.hpsv2 import load_hpsv2

    return load_hpsv2(path, offload)


def _pickscore(path: str = "", offload: bool = False) -> Reward:
    from solrl_core.rewards.pickscore import load_pickscore

    return load_pickscore(path, offload)


def _clipscore(path: str = "", offload: bool = False) -> Reward:
    from solrl_core.rewards.clipscore import load_clipscore

    return load_clipscore(path, offload)


# name -> factory(path, offload); the real reward models (SPEC section 7) read their files from
# ``path`` (config ``reward_paths``), else their env var, else the local Hugging Face cache; with
# ``offload`` they wait on the CPU between uses (solrl_core.rewards.residency).
REWARDS: dict[str, Callable[..., Reward]] = {
    "shapes-compliance": _shapes_compliance,
    "shapes-aesthetic": _shapes_aesthetic,
    "imagereward": _imagereward,
    "hpsv2": _hpsv2,
    "pickscore": _pickscore,
    "clipscore": _clipscore,
}
# The embedded world's rewards are analytic: they have no files.
FILE_FREE = ("shapes-compliance", "shapes-aesthetic")
# Each real reward's main files (their modules import only torch at the top: cheap to name here).
REWARD_FILES: dict[str, LocalFiles] = {"imagereward": IMAGEREWARD, "hpsv2": HPSV2, "pickscore": PICKSCORE,
                                       "clipscore": CLIPSCORE}


def check_reward_files(names: list[str], paths: dict[str, str] | None = None) -> None:
    """Raise ModelFilesMissing now if a real reward's checkpoint folder is missing (nothing loaded)."""
    for name in dict.fromkeys(names):
        if name in REWARD_FILES:
            REWARD_FILES[name].resolve((paths or {}).get(name, ""))


class RewardFailure(RuntimeError):
    pass


@dataclass
class RewardScores:
    """Per-reward scores and their weighted sum, aligned with the scored batch."""

    per_reward: dict[str, torch.Tensor]
    combined: torch.Tensor


class RewardSet:
    """The rewards a run computes: the weighted training rewards plus any evaluation-only ones."""

    def __init__(self, weights: dict[str, float], extra: list[str] | tuple[str, ...] = (),
                 paths: dict[str, str] | None = None, offload: bool = False):
        self.weights = dict(weights)
        names = list(weights) + [name for name in extra if name not in weights]
        paths = paths or {}
        self.models = {name: REWARDS[name]() if name in FILE_FREE else REWARDS[name](paths.get(name, ""), offload)
                       for name in names}

    @contextmanager
    def on_device(self, names: list[str]) -> Iterator[None]:
        """Keep the named reward models on their device for a block of several score() calls (an
        offloaded model otherwise makes the trip for each); the analytic rewards have no weights."""
        with ExitStack() as stack:
            for name in names:
                residency = getattr(self.models[name], "residency", None)
                if residency is not None:
                    stack.enter_context(residency.on_device())
            yield

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
