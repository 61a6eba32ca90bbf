"""Policy loaders by name; a preset names its loader in ``model.loader``.

Every loader takes ``(model config, device, dtype)`` and returns a FlowPolicy, or raises
:class:`~solrl_core.models.loading.ModelFilesMissing` with one line naming the missing files.
Loaders import their heavy dependencies only when called.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from solrl_core.config import Config, ModelConfig
from solrl_core.models.loading import ModelFilesMissing
from solrl_core.models.policy import FlowPolicy

__all__ = ["LOADERS", "ModelFilesMissing", "check_model_files", "load_policy", "resolve_device", "resolve_dtype"]


def _shapes_tiny(model: ModelConfig, device: torch.device, dtype: torch.dtype) -> FlowPolicy:
    from solrl_core.models.shapes_tiny import load_shapes_tiny

    return load_shapes_tiny(model.path, device, dtype)


def _flux(model: ModelConfig, device: torch.device, dtype: torch.dtype) -> FlowPolicy:
    from solrl_core.models.flux_dev import load_flux

    return load_flux(model, device, dtype)


def _sana(model: ModelConfig, device: torch.device, dtype: torch.dtype) -> FlowPolicy:
    from solrl_core.models.sana import load_sana

    return load_sana(model, device, dtype)


def _sd3(model: ModelConfig, device: torch.device, dtype: torch.dtype) -> FlowPolicy:
    from solrl_core.models.sd3 import load_sd3

    return load_sd3(model, device, dtype)


LOADERS: dict[str, Callable[[ModelConfig, torch.device, torch.dtype], FlowPolicy]] = {
    "shapes-tiny": _shapes_tiny,
    "flux": _flux,
    "sana": _sana,
    "sd3": _sd3,
}


def check_model_files(model: ModelConfig) -> None:
    """Raise ModelFilesMissing now if a real model's folder is missing: a cheap check (no import of
    diffusers, nothing loaded) for callers that want to fail before starting heavier machinery."""
    from solrl_core.models.flux_dev import FLUX_DEV
    from solrl_core.models.loading import resolve_model_dir
    from solrl_core.models.sana import SANA_1600M
    from solrl_core.models.sd3 import SD35_LARGE

    spec = {"flux": FLUX_DEV, "sana": SANA_1600M, "sd3": SD35_LARGE}.get(model.loader)
    if spec is not None:
        resolve_model_dir(spec, model.path)


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
    return LOADERS[config.model.loader](config.model, device, dtype)
