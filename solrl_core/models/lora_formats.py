"""One LoRA adapter of a run in the ecosystem's formats, written by the libraries' own savers.

- **diffusers**: ``pytorch_lora_weights.safetensors`` through the model's pipeline class's
  ``save_lora_weights`` (keys ``transformer.<module>.lora_A.weight``), with the adapter's peft
  ``LoraConfig`` as diffusers' ``lora_adapter_metadata``: rank, alpha and target modules travel
  with the weights, so ``load_lora_weights`` / ``load_lora_adapter`` restore the scale alpha / rank
  (a loader that assumed alpha = rank would apply half the update at the presets' 32 / 64).
- **PEFT**: ``adapter_config.json`` and ``adapter_model.safetensors`` through
  ``PeftModel.save_pretrained``, for ``PeftModel.from_pretrained(pipe.transformer, DIR)``.

Neither needs the base model's weights: the adapter's tensors say every shape. PEFT saves from a
model, so the PEFT folder is saved from a skeleton of the adapted modules, whose base weights
live on the meta device (no memory) and whose LoRA weights are the run's.
"""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer

from solrl_core.config import LoraConfigSpec
from solrl_core.models.registry import LoraFormat

DIFFUSERS_FILE = "pytorch_lora_weights.safetensors"  # the name diffusers' savers and loaders use
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")
_PEFT_PREFIX = "base_model.model."  # where PeftModel's state dict puts the wrapped model's modules


def lora_config(lora: LoraConfigSpec, lora_format: LoraFormat) -> LoraConfig:
    """The peft config the run attached the adapter with (solrl_core.models.adapters)."""
    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.targets),
                      base_model_name_or_path=lora_format.base_model)


def write_diffusers(tensors: dict[str, torch.Tensor], lora: LoraConfigSpec, lora_format: LoraFormat,
                    out: Path) -> list[str]:
    """``tensors``: one adapter, ``<module>.lora_A.weight`` / ``.lora_B.weight`` (as the run saves it)."""
    # deferred: diffusers at import time (start-up of every solrl command)
    import diffusers

    pipeline = getattr(diffusers, lora_format.pipeline)
    pipeline.save_lora_weights(str(out), transformer_lora_layers=dict(tensors),
                               transformer_lora_adapter_metadata=lora_config(lora, lora_format).to_dict())
    return [DIFFUSERS_FILE]


def write_peft(tensors: dict[str, torch.Tensor], lora: LoraConfigSpec, lora_format: LoraFormat, out: Path) -> list[str]:
    model = get_peft_model(skeleton(tensors, lora_format), lora_config(lora, lora_format))
    for module in model.modules():  # only the LoRA weights get memory; the base stays on meta
        if isinstance(module, LoraLayer):
            module.lora_A.to_empty(device="cpu")
            module.lora_B.to_empty(device="cpu")
    result = set_peft_model_state_dict(model, {_PEFT_PREFIX + key: value for key, value in tensors.items()})
    if result.unexpected_keys:  # a tensor no adapted module took: the skeleton and the file disagree
        raise ValueError(f"adapter tensors without a module: {', '.join(result.unexpected_keys[:3])}")
    _require_loaded(model, tensors)
    model.save_pretrained(str(out))
    return list(PEFT_FILES)


def skeleton(tensors: dict[str, torch.Tensor], lora_format: LoraFormat) -> torch.nn.Module:
    """The adapted linear layers at their module paths, base weights on the meta device.

    The root is of a class named as the model's transformer class: PeftModel.save_pretrained
    records the base model's class in ``adapter_config.json`` (``auto_mapping``), and that is the
    class the adapter belongs on."""
    # deferred: diffusers at import time (start-up of every solrl command)
    import diffusers

    transformer = getattr(diffusers, lora_format.transformer)
    root = type(transformer.__name__, (torch.nn.Module,), {"__module__": transformer.__module__})()
    for key, down in tensors.items():
        if ".lora_A." not in key:
            continue
        path = key.split(".lora_A.")[0]
        up = tensors[f"{path}.lora_B.weight"]
        *parents, name = path.split(".")
        parent = root
        for part in parents:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        with torch.device("meta"):
            parent.add_module(name, torch.nn.Linear(down.shape[1], up.shape[0], bias=False))
    return root


def _require_loaded(model: PeftModel, tensors: dict[str, torch.Tensor]) -> None:
    """Every LoRA weight of the skeleton holds the run's value (none left as to_empty's garbage)."""
    found = {name.replace(".default.", ".").removeprefix(_PEFT_PREFIX) for name, _ in model.named_parameters()
             if ".lora_A." in name or ".lora_B." in name}
    if found != set(tensors):
        raise ValueError(f"the PEFT skeleton has {len(found)} LoRA weights, the adapter {len(tensors)}")
