"""Weight memory of a Sol-RL run: one base weight set, against three full copies.

The trained policy, the sampling ("old") policy and the EMA are LoRA adapters over one frozen
base; the reference policy of the KL term is the base itself; the explorer adds a quantized copy
of the selected Linear layers only (the rest of its forward runs on the base weights). The
reference code instead holds three full BF16 transformers: trained, sampling, quantized.

The same counting serves a real model built on the meta device (no memory, no weights) and a
tiny instance whose actual tensors can be measured against it (tests/test_real_models.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from solrl_core.quant.backends import BACKEND_SPECS
from solrl_core.quant.explorer import _linear_layers, layer_features, quantizable_layers, select_quantized_layers

GIB = 2**30


@dataclass(frozen=True)
class ExplorerStorage:
    """Bytes the explorer caches per quantized layer: per weight element (0: packed NVFP4, counted
    by nvfp4_weight_bytes, times ``nvfp4_copies``), per bias element (None: the model's dtype),
    per tensor and per output row."""

    weight: float
    bias: float | None
    per_tensor: float
    per_row: float = 0
    nvfp4_copies: int = 1


def nvfp4_weight_bytes(in_features: int, out_features: int) -> int:
    """Packed NVFP4: two E2M1 codes per byte and one E4M3 scale per 16-element block (K padded to 16)."""
    blocks = math.ceil(in_features / 16)
    return out_features * (blocks * 8 + blocks)


EXPLORER_STORAGE = {
    # As the backends of quant/explorer.py cache them (solrl_core.quant.backends names each one's).
    "none": ExplorerStorage(weight=0, bias=0, per_tensor=0, nvfp4_copies=0),
    # emulated-nvfp4: packed codes + E4M3 block scales, fp32 tensor scale, bias in the model's dtype.
    "nvfp4-packed": ExplorerStorage(weight=0, bias=None, per_tensor=4),
    "fp8-tensor": ExplorerStorage(weight=1, bias=None, per_tensor=4, nvfp4_copies=0),  # E4M3 + fp32 scale
    "fp8-row": ExplorerStorage(weight=1, bias=None, per_tensor=0, per_row=4, nvfp4_copies=0),
    # te-nvfp4: quantized parameters only (quantized_model_init); an upper bound that counts the
    # row-wise and the column-wise NVFP4 copy a TE weight may keep for a backward pass, not verified
    # on a GPU. bf16 bias, fp32 amax.
    "te-nvfp4": ExplorerStorage(weight=0, bias=2, per_tensor=4, nvfp4_copies=2),
}


def storage_of(storage_or_backend: str) -> ExplorerStorage:
    """The storage record of a storage key or of an explorer backend's name."""
    if storage_or_backend in BACKEND_SPECS:
        storage_or_backend = BACKEND_SPECS[storage_or_backend].storage
    return EXPLORER_STORAGE[storage_or_backend]


@dataclass(frozen=True)
class WeightMemory:
    base: int  # the frozen transformer, in its full-precision dtype
    lora: int  # every adapter
    explorer: int  # the quantized copy of the selected layers
    three_copies: int  # the reference layout: three full transformers in the same dtype

    @property
    def total(self) -> int:
        return self.base + self.lora + self.explorer

    def gib(self) -> dict[str, float]:
        return {k: round(v / GIB, 2) for k, v in {**asdict(self), "total": self.total}.items()}


def lora_targets_match(name: str, targets: list[str]) -> bool:
    """peft's rule for a list of target names: the module name equals one or ends with '.' + one."""
    return any(name == target or name.endswith("." + target) for target in targets)


def lora_parameter_count(model: torch.nn.Module, targets: list[str], rank: int) -> int:
    """Parameters of one LoRA adapter: rank * (in + out) for every targeted Linear."""
    return sum(rank * (linear.in_features + linear.out_features)
               for name, linear in _linear_layers(model) if lora_targets_match(name, targets))


def base_parameter_count(model: torch.nn.Module) -> int:
    """Parameters of the model without any LoRA adapter it may carry."""
    return sum(p.numel() for name, p in model.named_parameters() if ".lora_" not in name)


def explorer_bytes(model: torch.nn.Module, layer_names: list[str], storage: str, base_bytes: int = 2) -> int:
    spec = storage_of(storage)
    layers = dict(quantizable_layers(model))
    total = 0.0
    for name in layer_names:
        layer = layers[name]
        in_features, out_features = layer_features(layer)
        weight = spec.nvfp4_copies * nvfp4_weight_bytes(in_features, out_features) + spec.weight * in_features * out_features
        bias = (base_bytes if spec.bias is None else spec.bias) * out_features if layer.bias is not None else 0
        total += weight + bias + spec.per_tensor + spec.per_row * out_features
    return int(total)


def weight_memory(model: torch.nn.Module, *, targets: list[str], rank: int, skip: list[str], min_dim: int,
                  storage: str = "nvfp4-packed", base_bytes: int = 2, lora_bytes: int = 4,
                  adapters: int = 3, fused: list[str] = ()) -> WeightMemory:
    """Modeled weight bytes. LoRA weights are fp32 over any base: attach_adapters casts them
    (diffusers' add_adapter alone would leave them in the base's dtype); ``adapters`` = trained +
    sampling + EMA. AdamW's two fp32 moments of the trained adapter are not weights and not here."""
    base = base_parameter_count(model) * base_bytes
    layers = select_quantized_layers(model, skip, min_dim, fused)
    return WeightMemory(base=base, lora=adapters * lora_parameter_count(model, targets, rank) * lora_bytes,
                        explorer=explorer_bytes(model, layers, storage, base_bytes), three_copies=3 * base)


# FLUX.1-dev's transformer config (black-forest-labs/FLUX.1-dev, transformer/config.json).
FLUX_DEV_CONFIG = {
    "patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38, "attention_head_dim": 128,
    "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": True,
    "axes_dims_rope": (16, 56, 56),
}


def flux_dev_weight_memory(storage: str = "nvfp4-packed") -> WeightMemory:
    """The modeled figure for FLUX.1-dev with the flux-* presets' LoRA and quantization settings."""
    from diffusers import FluxTransformer2DModel

    from solrl_core.presets import MODEL_PRESETS, PAPER_DEFAULTS

    settings = MODEL_PRESETS["flux.1-dev"]["settings"]
    with torch.device("meta"):
        model = FluxTransformer2DModel(**FLUX_DEV_CONFIG)
    return weight_memory(model, targets=settings["train"]["lora"]["targets"], rank=PAPER_DEFAULTS["train"]["lora"]["rank"],
                         skip=settings["quant"]["skip"], min_dim=settings["quant"]["min_dim"], storage=storage)
