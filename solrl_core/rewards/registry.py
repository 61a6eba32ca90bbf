"""The rewards, each declared once as a record, and the weighted combination used to rank seeds
and form advantages.

A reward is a callable ``(images [B,3,H,W] in [0,1], prompts) -> Tensor[B]`` (float32, CPU). Its
record (:class:`RewardSpec`) says everything the rest of the code needs: how to build it, the
files it reads (checked before a run starts), what scoring one image costs (the cost model,
solrl_core.accounting) and how many FP32 parameters it brings to the device (the memory model,
solrl_core.models.memory). Lists of names and validation read :data:`REWARDS`; an unknown name is
an error, never a default. Adding a reward is its module plus one record here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import torch

from solrl_core.rewards._local import LocalFiles
from solrl_core.rewards.clipscore import CLIPSCORE, load_clipscore
from solrl_core.rewards.hpsv2 import HPSV2, load_hpsv2
from solrl_core.rewards.imagereward import IMAGEREWARD, load_imagereward, tokenizer_folder
from solrl_core.rewards.pickscore import PICKSCORE, load_pickscore, processor_folder
from solrl_core.world.rewards import shapes_aesthetic, shapes_compliance


class Reward(Protocol):
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor: ...


@dataclass(frozen=True)
class RewardSpec:
    name: str
    # With files: load(path, offload) reads them from ``path`` (config reward_paths), else the
    # files' env var, else the local Hugging Face cache; with ``offload`` the model waits on the
    # CPU between uses (solrl_core.rewards.residency). Without files (analytic): load().
    load: Callable[..., Reward]
    files: LocalFiles | None
    # FLOPs of scoring one image, for the cost model (0: analytic, no matmuls).
    scoring_flops: float
    # FP32 parameters on the device while it scores, for the memory model (0: analytic).
    parameters: int
    # Files found beside the checkpoint folder or through their own variable (ImageReward's
    # tokenizer, PickScore's processor): (what, folder they are read from given the checkpoint
    # folder or None), so the preflight asks for them before the loader would.
    companion: tuple[str, Callable[[Path | None], Path]] | None = None

    def __call__(self, path: str = "", offload: bool = False) -> Reward:
        """The reward itself, loaded (``path`` and ``offload`` only mean something with files)."""
        return self.load(path, offload) if self.files is not None else self.load()


def _analytic(function: Reward) -> Callable[[], Reward]:
    return lambda: function


# The paper's reward models (SPEC section 7) and the embedded world's analytic ones. Scoring FLOPs:
# 2 x parameters x tokens of the towers at their input size: ImageReward's BLIP ViT-L/16 at 224 px
# (197 tokens, 304M) + its BERT-base text tower (110M, ~35 tokens); CLIPScore's ViT-L/14 at 224
# (257 tokens, 304M) + text (123M, 77); PickScore's and HPSv2.1's ViT-H/14 at 224 (257 tokens,
# 632M) + text (354M, 77). Parameters counted from their architectures: CLIPModel ViT-L/14 and
# ViT-H/14 on the meta device, open_clip's ViT-H-14 (HPS v2.1) likewise, ImageReward as BLIP's
# ViT-L/16 + its cross-attention BERT + projections + MLP head.
REWARDS: dict[str, RewardSpec] = {spec.name: spec for spec in (
    RewardSpec("shapes-compliance", _analytic(shapes_compliance), None, 0.0, 0),
    RewardSpec("shapes-aesthetic", _analytic(shapes_aesthetic), None, 0.0, 0),
    RewardSpec("imagereward", load_imagereward, IMAGEREWARD, 2 * (304e6 * 197 + 110e6 * 35), 446_665_953,
               companion=("tokenizer", tokenizer_folder)),
    RewardSpec("hpsv2", load_hpsv2, HPSV2, 2 * (632e6 * 257 + 354e6 * 77), 986_109_441),
    RewardSpec("pickscore", load_pickscore, PICKSCORE, 2 * (632e6 * 257 + 354e6 * 77), 986_109_441,
               companion=("processor", processor_folder)),
    RewardSpec("clipscore", load_clipscore, CLIPSCORE, 2 * (304e6 * 257 + 123e6 * 77), 427_616_513),
)}


def reward_spec(name: str) -> RewardSpec:
    if name not in REWARDS:
        raise ValueError(f"unknown reward '{name}'; allowed: {', '.join(REWARDS)}")
    return REWARDS[name]


def check_reward_files(names: list[str], paths: dict[str, str] | None = None) -> None:
    """Raise ModelFilesMissing now if a real reward's checkpoint folder is missing (nothing loaded)."""
    for name in dict.fromkeys(names):
        files = reward_spec(name).files
        if files is not None:
            files.resolve((paths or {}).get(name, ""))


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
        self.models = {name: reward_spec(name)(paths.get(name, ""), offload) for name in names}

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
