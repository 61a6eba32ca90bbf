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
from solrl_core.world import SHAPES_TINY_CHECKPOINT

__all__ = ["LOADERS", "ModelFilesMissing", "SHAPES_TINY_CHECKPOINT", "check_model_files", "load_policy",
           "resolve_device", "resolve_dtype"]



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
    """Raise ModelFilesMissing now if the model's files are missing or of the wrong kind, for
    callers that want to fail before starting heavier machinery. Real models: headers and file
    layout only (no import of diffusers, nothing loaded). The embedded world: its 2.4 MB checkpoint
    is loaded into the architecture it declares, which is what catches another model's weights."""
    from solrl_core.models.flux_dev import FLUX_DEV
    from solrl_core.models.loading import resolve_model_dir
    from solrl_core.models.sana import SANA_1600M
    from solrl_core.models.sd3 import SD35_LARGE

    if model.loader == "shapes-tiny":
        check_tiny_checkpoint(model.path)
        return
    spec = {"flux": FLUX_DEV, "sana": SANA_1600M, "sd3": SD35_LARGE}.get(model.loader)
    if spec is not None:
        resolve_model_dir(spec, model.path)


def check_tiny_checkpoint(path: str) -> None:
    """The embedded world's checkpoint (``model.path``, else the committed one) must be one
    safetensors file with its architecture in the metadata; only the header is read."""
    from safetensors import SafetensorError, safe_open

    from solrl_core.local_files import local_path, path_kind

    file = local_path(path) if path else SHAPES_TINY_CHECKPOINT
    kind = path_kind(file)
    how = "give the safetensors file `solrl pretrain` writes with -S model.path=FILE (empty: the committed one)"
    if kind != "file":
        where = file if file is not None else repr(path)
        what = "is a folder, not a file" if kind == "folder" else "cannot be read" if kind == "unreadable" \
            else "does not exist"
        raise ModelFilesMissing(f"shapes-tiny checkpoint {where} {what}; {how}")
    try:
        with safe_open(str(file), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise ModelFilesMissing(f"shapes-tiny checkpoint {file} is not a safetensors file ({error}); {how}") from None
    if "architecture" not in metadata:
        raise ModelFilesMissing(f"shapes-tiny checkpoint {file} has no architecture in its metadata; {how}")
    # The weights must fit the architecture they declare (a checkpoint of another model otherwise
    # loads only inside the run). Deferred import: diffusers costs seconds and is not needed above.
    from solrl_core.models.shapes_tiny import read_checkpoint

    read_checkpoint(file)


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
