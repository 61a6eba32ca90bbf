"""Policy loaders by name; a preset names its loader in ``model.loader``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from solrl_core.config import Config
from solrl_core.models.policy import FlowPolicy


def _shapes_tiny(path: str, device: torch.device, dtype: torch.dtype) -> FlowPolicy:
    from solrl_core.models.shapes_tiny import load_shapes_tiny

    return load_shapes_tiny(path, device, dtype)


LOADERS: dict[str, Callable[[str, torch.device, torch.dtype], FlowPolicy]] = {
    "shapes-tiny": _shapes_tiny,
}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """Full precision: bfloat16 on a GPU, float32 on a CPU (no bf16 units here)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def load_policy(config: Config) -> FlowPolicy:
    device = resolve_device(config.model.device)
    dtype = resolve_dtype(config.model.dtype, device)
    return LOADERS[config.model.loader](config.model.path, device, dtype)
