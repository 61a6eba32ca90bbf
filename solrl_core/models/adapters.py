"""LoRA adapters over one base: "default" (trained), "old" (samples), "ema" (evaluates).

The reference policy of the KL term is the base itself (adapters disabled), so the pipeline
holds one copy of the base weights however many policies it uses.

Adapters are fp32 over a base of any dtype, as in the reference codes: diffusers' add_adapter
moves them to the base layer's dtype, and in bf16 an update of ~3e-4 on a weight of ~0.03 loses
a fifth to a half of itself to rounding, and weight decay x lr vanishes entirely. peft casts a
layer's input to its adapter's dtype and the sum back to the base's, so only the small LoRA
matmuls run in fp32; the weights, their gradients and AdamW's state are fp32.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from peft import LoraConfig

TRAINED, OLD, EMA = "default", "old", "ema"
ADAPTERS = (TRAINED, OLD, EMA)


def attach_adapters(transformer: torch.nn.Module, rank: int, alpha: int, targets: list[str], seed: int) -> None:
    """Add the three adapters with identical initial weights and freeze everything but "default"."""
    torch.manual_seed(seed)  # LoRA A matrices are random: make them a function of the run seed
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights="gaussian")
    with warnings.catch_warnings():
        # peft warns on every adapter after the first; several adapters on one base is the design.
        warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
        for name in ADAPTERS:
            transformer.add_adapter(config, adapter_name=name)
    _adapters_to_fp32(transformer)
    copy_adapter(transformer, source=TRAINED, target=OLD)
    copy_adapter(transformer, source=TRAINED, target=EMA)
    transformer.requires_grad_(False)
    for parameter in adapter_parameters(transformer, TRAINED).values():
        parameter.requires_grad_(True)
    transformer.set_adapter(TRAINED)


def _adapters_to_fp32(transformer: torch.nn.Module) -> None:
    for name, parameter in transformer.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            parameter.data = parameter.data.float()


def adapter_parameters(transformer: torch.nn.Module, adapter: str) -> dict[str, torch.nn.Parameter]:
    """The adapter's LoRA parameters, keyed by their name with the adapter part removed."""
    marker = f".{adapter}."
    found = {}
    for name, parameter in transformer.named_parameters():
        if (".lora_A." in name or ".lora_B." in name) and marker in name:
            found[name.replace(marker, ".")] = parameter
    return found


@torch.no_grad()
def copy_adapter(transformer: torch.nn.Module, source: str, target: str) -> None:
    blend_adapters(transformer, source=source, target=target, keep=0.0)


@torch.no_grad()
def blend_adapters(transformer: torch.nn.Module, source: str, target: str, keep: float) -> None:
    """target <- keep * target + (1 - keep) * source (old-policy soft update, EMA)."""
    source_params = adapter_parameters(transformer, source)
    for key, target_param in adapter_parameters(transformer, target).items():
        target_param.mul_(keep).add_(source_params[key].detach(), alpha=1.0 - keep)


@contextmanager
def active_adapter(transformer: torch.nn.Module, adapter: str | None) -> Iterator[None]:
    """Run with one adapter active (None: the base model alone), then back to "default"."""
    if adapter is None:
        transformer.disable_adapters()
    else:
        transformer.set_adapter(adapter)
    try:
        yield
    finally:
        if adapter is None:
            transformer.enable_adapters()
        transformer.set_adapter(TRAINED)
        # peft's set_adapter toggles requires_grad by activity; only "default" is ever trained.
        for name in (OLD, EMA):
            for parameter in adapter_parameters(transformer, name).values():
                parameter.requires_grad_(False)


def adapter_state(transformer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """All adapters' weights as a flat CPU state dict (for checkpoints)."""
    state = {}
    for adapter in ADAPTERS:
        for key, parameter in adapter_parameters(transformer, adapter).items():
            state[f"{adapter}/{key}"] = parameter.detach().cpu().contiguous()
    return state


@torch.no_grad()
def load_adapter_state(transformer: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    for adapter in ADAPTERS:
        for key, parameter in adapter_parameters(transformer, adapter).items():
            parameter.copy_(state[f"{adapter}/{key}"].to(parameter.device, parameter.dtype))
