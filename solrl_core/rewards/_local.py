"""What the real reward models share: finding their files offline, and turning the pipeline's
image batches into the PIL images their own preprocessing expects.

A reward's files are looked up in order: the path given in the config (``reward_paths``), the
reward's environment variable, then its repo in the local Hugging Face cache, by the same rules as
a model's (:mod:`solrl_core.local_files`). Nothing downloads;
missing files raise :class:`ModelFilesMissing` with one line saying what was looked for and how to
provide it.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from solrl_core.local_files import ModelFilesMissing, check_tokenizer, find_folder, why_not_found

__all__ = ["LocalFiles", "ModelFilesMissing", "check_tokenizer", "register_package", "reward_device", "timm_quietly",
           "to_pil"]


@dataclass(frozen=True)
class LocalFiles:
    """Where one reward model's files come from, and which files must be there."""

    reward: str  # registry name, e.g. "pickscore"
    env_var: str
    hub_repo: str
    required: tuple[str, ...]  # file names (or sub-folders) inside the folder; "a|b": either will do
    how: str = ""  # how to provide the files, when not the usual reward_paths / env var / cache

    def _how(self) -> str:
        return self.how or (f"put {_names(self.required)} in a folder and give it with "
                            f"-S 'reward_paths={{{self.reward}: DIR}}' or {self.env_var}=DIR, "
                            f"or pre-fill the Hugging Face cache with {self.hub_repo}")

    def resolve(self, path: str = "") -> Path:
        """The folder holding ``required``; ``path`` may also name one of the required files."""
        source = path or os.environ.get(self.env_var, "") or self.hub_repo
        # A reward's path may name one of its files (the checkpoint): the folder holding it is meant.
        folder = find_folder(source, file_names_folder=True)
        missing = list(self.required) if folder is None else [r for r in self.required if not has_file(folder, r)]
        if missing:
            where = str(folder) if folder is not None \
                else f"{source} ({why_not_found(source, file_names_folder=True)})"
            raise ModelFilesMissing(f"reward '{self.reward}': {_names(missing)} not found in {where}; {self._how()}")
        return folder


def has_file(folder: Path, requirement: str) -> bool:
    return any((folder / option).exists() for option in requirement.split("|"))


def _names(requirements) -> str:
    return ", ".join(r.replace("|", " (or ") + (")" if "|" in r else "") for r in requirements)


def reward_device() -> torch.device:
    """Reward models run in FP32 (SPEC section 7), on the GPU when there is one."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def to_pil(images: torch.Tensor) -> list:
    """[B, 3, H, W] floats in [0, 1] -> RGB PIL images, rounded to 8 bits as a saved image would be."""
    pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return [Image.fromarray(p.permute(1, 2, 0).cpu().numpy()) for p in pixels]


def register_package(name: str, folder: str) -> None:
    """Make ``name`` importable as a package without running its ``__init__.py``: the reward
    packages' own __init__ files import training and download code that scoring never uses."""
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [folder]
        package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        package.__spec__.submodule_search_locations = [folder]
        sys.modules[name] = package


@contextmanager
def timm_quietly() -> Iterator[None]:
    """The reward packages import timm.models.layers, which timm 1.x serves but calls deprecated."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module="timm")
        yield
