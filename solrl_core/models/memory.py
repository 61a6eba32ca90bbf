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
import warnings
from dataclasses import asdict, dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from solrl_core.models.registry import MODELS
from solrl_core.presets import PAPER_DEFAULTS
from solrl_core.quant.backends import BACKEND_SPECS, ExplorerStorage
from solrl_core.quant.explorer import _linear_layers, layer_features, quantizable_layers, select_quantized_layers
from solrl_core.rewards.registry import REWARDS, reward_spec

GIB = 2**30


def nvfp4_weight_bytes(in_features: int, out_features: int) -> int:
    """Packed NVFP4: two E2M1 codes per byte and one E4M3 scale per 16-element block (K padded to 16)."""
    blocks = math.ceil(in_features / 16)
    return out_features * (blocks * 8 + blocks)


# Storage key -> how the cache holds one layer, as each backend's record declares it.
EXPLORER_STORAGE: dict[str, ExplorerStorage] = {spec.storage.name: spec.storage for spec in BACKEND_SPECS.values()}


def storage_of(storage_or_backend: str) -> ExplorerStorage:
    """The storage record of a storage key or of an explorer backend's name."""
    if storage_or_backend in BACKEND_SPECS:
        return BACKEND_SPECS[storage_or_backend].storage
    if storage_or_backend not in EXPLORER_STORAGE:
        raise ValueError(f"unknown explorer storage or backend {storage_or_backend!r}; allowed: "
                         f"{', '.join([*BACKEND_SPECS, *EXPLORER_STORAGE])}")
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
    # deferred: diffusers at import time (start-up of the memory model; only this figure needs it)
    from diffusers import FluxTransformer2DModel

    settings = MODELS["flux"].preset.settings
    with torch.device("meta"):
        model = FluxTransformer2DModel(**FLUX_DEV_CONFIG)
    return weight_memory(model, targets=settings["train"]["lora"]["targets"], rank=PAPER_DEFAULTS["train"]["lora"]["rank"],
                         skip=settings["quant"]["skip"], min_dim=settings["quant"]["min_dim"], storage=storage)


# ---------------------------------------------------------------------------------------------
# A real run's peak on the GPU: FLUX.1-dev at 512 px (issue 12 item 7)

# The FP32 reward models (SPEC section 7): their parameters, as each reward's record declares them.
REWARD_PARAMETERS = {name: spec.parameters for name, spec in REWARDS.items() if spec.parameters}
# What the flux-* presets move onto the device only for a while (bf16): T5-XXL's encoder and CLIP-L's
# text tower while encoding new prompts, the VAE while decoding.
FLUX_ENCODER_PARAMETERS = 4_762_310_656 + 123_060_480
FLUX_VAE_PARAMETERS = 83_819_683
FLUX_TEXT_TOKENS = 512  # flux_dev.py's max_sequence_length
# Activation coefficients, in elements per token per hidden unit per block (x tokens x width x
# blocks x batch x bytes). TRAIN_SAVED: what autograd keeps for backward in a FLUX block with LoRA
# on q/k/v/out and flash attention (no token x token scores), measured on tiny instances with
# saved-tensor hooks: 12.62-12.75 over widths 128-384 and 96-192 tokens; benchmarks/weight_memory.py
# measures it again next to this figure. The update does not use gradient checkpointing, so every
# block's share is held at once. INFERENCE_LIVE (modeled, an upper bound): the tensors alive at once
# in one no-grad single-stream block, the largest: input, its norm, q/k/v (3), roped q/k (2),
# attention out, MLP hidden and its GELU (4 + 4), their concat (5), the output: 22. A no-grad
# forward frees a block's tensors before the next, so one block's worth is live; the update's
# backward works on one block at a time too.
TRAIN_SAVED = 12.8
INFERENCE_LIVE = 22.0


def activation_bytes(batch: int, tokens: int, width: int, blocks: int, coefficient: float, element: int = 2) -> int:
    return int(coefficient * batch * tokens * width * blocks * element)


def flux_dev_run_peak(backend: str = "fp8", resolution: int = 512, explore_chunk: int = 24, micro_batch: int = 2,
                      eval_chunk: int = 8, rewards: tuple[str, ...] = ("imagereward",),
                      eval_rewards: tuple[str, ...] = ("imagereward", "hpsv2", "pickscore", "clipscore"),
                      offload_rewards: bool = True, offload_encoders: bool = True) -> dict:
    """Modeled bytes on the GPU of each stage of a flux-* run, and the peak. Always resident: the
    bf16 transformer, the three fp32 adapters, the trained adapter's fp32 gradient and two AdamW
    moments, the explorer's cache. Per stage: what visits (encoders, VAE, reward models) and the
    activations of its largest forward. Not modeled: the CUDA context and allocator slack."""
    weights = flux_dev_weight_memory(backend)
    trained_lora = weights.lora // 3
    resident = {"transformer_bf16": weights.base, "lora_fp32_x3": weights.lora,
                "lora_grad_and_adamw_fp32": 3 * trained_lora, "explorer_cache": weights.explorer}
    config = FLUX_DEV_CONFIG
    width = config["num_attention_heads"] * config["attention_head_dim"]
    blocks = config["num_layers"] + config["num_single_layers"]
    tokens = (resolution // 16) ** 2 + FLUX_TEXT_TOKENS  # 2x2 patches of the 8x-downsampled latent, + text

    def rewards_bytes(names) -> int:
        return sum(reward_spec(name).parameters * 4 for name in dict.fromkeys(names))

    always_rewards = 0 if offload_rewards else rewards_bytes((*rewards, *eval_rewards))
    encoders = FLUX_ENCODER_PARAMETERS * 2
    vae = FLUX_VAE_PARAMETERS * 2
    visiting = {
        "encode": {"encoders_bf16": encoders if offload_encoders else 0},
        # No-grad forwards free each block's tensors before the next block: one block's worth is live.
        "explore": {"activations": activation_bytes(explore_chunk, tokens, width, 1, INFERENCE_LIVE)},
        "score": {"vae_bf16": vae if offload_encoders else 0,
                  "rewards_fp32": rewards_bytes(rewards) if offload_rewards else 0},
        "regenerate": {"activations": activation_bytes(explore_chunk, tokens, width, 1, INFERENCE_LIVE)},
        "update": {"activations_saved": activation_bytes(micro_batch, tokens, width, blocks, TRAIN_SAVED),
                   "activations_no_grad_forwards": activation_bytes(micro_batch, tokens, width, 1, INFERENCE_LIVE)},
        "evaluate": {"activations": activation_bytes(eval_chunk, tokens, width, 1, INFERENCE_LIVE),
                     "rewards_fp32": rewards_bytes(eval_rewards) if offload_rewards else 0},
    }
    base = sum(resident.values()) + always_rewards + (0 if offload_encoders else encoders + vae)
    stages = {name: {"bytes": base + sum(parts.values()), "parts": parts} for name, parts in visiting.items()}
    peak_stage = max(stages, key=lambda name: stages[name]["bytes"])
    return {"backend": backend, "resolution": resolution, "tokens": tokens, "resident": resident,
            "resident_rewards_and_encoders": base - sum(resident.values()), "stages": stages,
            "peak_stage": peak_stage, "peak_bytes": stages[peak_stage]["bytes"]}


def saved_activation_bytes(model: torch.nn.Module, forward) -> int:
    """Bytes autograd saves for backward while ``forward()`` runs (with flash attention, as on a
    GPU), weights and buffers excluded: the measured side of TRAIN_SAVED."""
    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()  # views of one storage count once
        return tensor

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(saved.values())


def tiny_flux_train_coefficient(heads: int = 4, head_dim: int = 32, image_tokens: int = 64, text_tokens: int = 32,
                                batch: int = 2, rank: int = 8) -> float:
    """Measured TRAIN_SAVED: saved bytes of a tiny FLUX (2 double + 4 single blocks, fp32, LoRA on
    the attention) per token, hidden unit, block and sample, in elements."""
    # deferred: diffusers and peft at import time (start-up of the memory model; only this measurement needs them)
    from diffusers import FluxTransformer2DModel

    from solrl_core.models.adapters import attach_adapters  # deferred: peft at import time (as above)

    torch.manual_seed(0)
    double, single = 2, 4
    model = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=double, num_single_layers=single,
                                   attention_head_dim=head_dim, num_attention_heads=heads, joint_attention_dim=64,
                                   pooled_projection_dim=32, guidance_embeds=True,
                                   axes_dims_rope=(head_dim // 4, 3 * head_dim // 8, 3 * head_dim // 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attach_adapters(model, rank, 2 * rank, ["to_q", "to_k", "to_v", "to_out.0"], seed=0)

    def forward():
        model(hidden_states=torch.randn(batch, image_tokens, 64), encoder_hidden_states=torch.randn(batch, text_tokens, 64),
              pooled_projections=torch.randn(batch, 32), timestep=torch.full((batch,), 0.5),
              img_ids=torch.zeros(image_tokens, 3), txt_ids=torch.zeros(text_tokens, 3),
              guidance=torch.full((batch,), 3.5))

    tokens, width = image_tokens + text_tokens, heads * head_dim
    return saved_activation_bytes(model, forward) / (batch * tokens * width * (double + single) * 4)
