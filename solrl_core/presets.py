"""Named presets (model x reward x settings), and the resolve step that turns a preset, a family
and the user's overrides into one validated config.

A preset is a nested mapping applied onto the defaults; a family (solrl_core.families) is a
mapping applied after it. Per-model differences live here, never in copied training loops.
:func:`resolve_config` and :func:`validate` are the one place names and cross-field rules are
checked (solrl_core.validation holds the rules); config.py below them only parses and coerces.

Real models (SPEC section 8) are described once each in MODEL_PRESETS; a run preset is a model
preset + a reward + the paper's defaults (PAPER_DEFAULTS). Their weights load from local files
only: ``-S model.path=DIR``, the model's env var (SOLRL_FLUX_PATH, SOLRL_SANA_PATH,
SOLRL_SD35_PATH), or the local Hugging Face cache.

The explorer backend of the real presets is ``auto``: ``te-nvfp4`` on Blackwell (B200, sm_100+,
with the ``gpu`` extra installed), ``fp8`` on Hopper or Ada (H100/H200, sm_89+: real FP8 GEMMs),
``emulated-nvfp4`` anywhere else; the run logs its choice and records it in the summary and in
MLflow. An explicit ``-S explore.backend=...`` that the machine cannot run stops before loading.
Real presets keep text encoders and the VAE off the GPU between uses (``model.offload_encoders``),
and the reward models too (``model.offload_rewards``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from solrl_core.config import Config, ConfigError, apply_mapping
from solrl_core.families import FAMILIES
from solrl_core.mappings import merge_nested
from solrl_core.prompts import check_prompt_files
from solrl_core.validation import check_config

# Modules of a FLUX transformer that stay in full precision whatever their size: the input
# embedders, the conditioning MLPs, the AdaLN modulation linears and the output head.
FLUX_QUANT_SKIP = [
    "x_embedder", "context_embedder", "time_text_embed.*", "*norm1.linear", "*norm1_context.linear",
    "*norm.linear", "norm_out.*", "proj_out",
]

PRESETS: dict[str, dict[str, Any]] = {
    "shapes-tiny": {
        "description": "embedded world: a 0.6M-parameter FluxTransformer2DModel drawing 32x32 coloured shapes",
        "settings": {
            "model": {"loader": "shapes-tiny", "resolution": 32, "dtype": "auto"},
            "sampler": {"kind": "dpm2", "shift": 1.0},
            "quant": {"skip": FLUX_QUANT_SKIP, "min_dim": 0},
            "explore": {"backend": "emulated-nvfp4", "steps": 6, "chunk": 96},
            "regenerate": {"steps": 10, "chunk": 96},
            "rewards": {"shapes-compliance": 1.0},
            "iterations": 20,
            "prompts_per_iteration": 4,
            "pool": 96,
            "keep": 24,
            "train": {
                "lr": 3e-3,
                "timestep_fraction": 0.6,
                "steps_per_iteration": 2,
                "micro_batch": 96,
                "lora": {"rank": 8, "alpha": 16, "targets": ["to_q", "to_k", "to_v", "to_out.0"]},
            },
            "eval": {"every": 5, "steps": 12, "prompts": 32, "seeds_per_prompt": 2, "chunk": 128,
                     "rewards": ["shapes-compliance", "shapes-aesthetic"]},
        },
    },
}

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts_data"

# The reference's rules (NVlabs/Sana train_scripts/sol_rl configs: skip modules and
# nvfp4_min_dim; a layer is kept when max(in, out) > min_dim), restated for diffusers' names.
# SANA: patch embedder, timestep / caption conditioning, the output head, and the self-attention
# q/k/v (the reference skips its fused attn.qkv by name). Its cross-attention k and v are one
# 2240 -> 4480 kv_linear there, quantized, so they are a fused pair here; the feed-forward's 1x1
# convolutions (2240 -> 11200, 5600 -> 2240) are quantized like the reference's linear FFN; the
# depthwise 3x3 convolution is no GEMM and stays as it is.
SANA_QUANT_SKIP = ["patch_embed.*", "time_embed.*", "caption_projection.*", "norm_out.*", "proj_out",
                   "*.attn1.to_q", "*.attn1.to_k", "*.attn1.to_v"]
SANA_QUANT_FUSED = ["attn2.to_k+attn2.to_v"]
# SD3: patch embedder, timestep / pooled-text conditioning, context embedder, AdaLN linears, head,
# and the context stream's feed-forward (the reference skips ff_context). At min_dim 2432, SD3.5-L's
# hidden size, its attention projections (2432 x 2432) stay BF16 in the reference as well.
SD3_QUANT_SKIP = ["pos_embed.*", "time_text_embed.*", "context_embedder", "*norm1.linear", "*norm1_context.linear",
                  "norm_out.*", "proj_out", "*.ff_context.*"]
ATTENTION = ["to_q", "to_k", "to_v", "to_out.0"]
JOINT_ATTENTION = ATTENTION + ["add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
PAPER_REWARDS = ["imagereward", "clipscore", "pickscore", "hpsv2"]


def flux_shift(resolution: int, base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """FLUX's resolution-dependent timestep shift exp(mu): mu is linear in the packed token count,
    0.5 at 256 tokens and 1.15 at 4096 (the FLUX.1 scheduler config); 512 px -> 1024 tokens."""
    tokens = (resolution // 16) ** 2
    mu = base_shift + (max_shift - base_shift) * (tokens - 256) / (4096 - 256)
    return round(math.exp(mu), 4)


# SPEC section 8, one entry per model: the data that differs between models.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "flux.1-dev": {
        "description": "FLUX.1-dev (FluxPipeline), 512 px, DPM-Solver-2, guidance embedding 1.0",
        "settings": {
            "model": {"loader": "flux", "resolution": 512, "guidance": 1.0},
            "sampler": {"kind": "dpm2", "shift": flux_shift(512)},
            "quant": {"skip": FLUX_QUANT_SKIP, "min_dim": 1000},
            "train": {"timestep_fraction": 0.4, "lora": {"targets": ATTENTION}},
            "eval": {"steps": 28},
        },
        # Settings that follow others unless set themselves: FLUX's shift from its resolution.
        "derived": {"sampler.shift": lambda config: flux_shift(config.model.resolution)},
    },
    "sana-1.6b": {
        "description": "SANA 1.6B (SanaPipeline), 1024 px, Euler",
        "settings": {
            "model": {"loader": "sana", "resolution": 1024},
            "sampler": {"kind": "euler", "shift": 3.0},
            "quant": {"skip": SANA_QUANT_SKIP, "min_dim": 2240, "fused": SANA_QUANT_FUSED},
            # Self-attention (attn1) and cross-attention (attn2) projections share these names.
            "train": {"timestep_fraction": 0.6, "lora": {"targets": ATTENTION}},
            "eval": {"steps": 40},
        },
    },
    "sd3.5-large": {
        "description": "Stable Diffusion 3.5 Large (StableDiffusion3Pipeline), 1024 px, DPM-Solver-2",
        "settings": {
            "model": {"loader": "sd3", "resolution": 1024},
            "sampler": {"kind": "dpm2", "shift": 3.0},
            "quant": {"skip": SD3_QUANT_SKIP, "min_dim": 2432},
            "train": {"timestep_fraction": 0.6, "lora": {"targets": JOINT_ATTENTION}},
            "eval": {"steps": 40},
        },
    },
}

# SPEC sections 2 and 4: what every real run shares unless its model preset says otherwise.
PAPER_DEFAULTS: dict[str, Any] = {
    "iterations": 100,
    "pool": 96,
    "keep": 24,
    "prompts_per_iteration": 48,
    "model": {"dtype": "auto", "offload_encoders": True, "offload_rewards": True},
    "explore": {"backend": "auto", "steps": 6, "chunk": 24},
    "regenerate": {"steps": 10, "chunk": 24},
    "prompts": {"train_file": str(PROMPTS_DIR / "train.txt"), "eval_file": str(PROMPTS_DIR / "eval.txt")},
    "train": {"lr": 3e-4, "steps_per_iteration": 1, "micro_batch": 2, "lora": {"rank": 32, "alpha": 64}},
    "eval": {"every": 20, "prompts": 16, "seeds_per_prompt": 2, "chunk": 8, "rewards": PAPER_REWARDS},
}


def real_preset(model: str, rewards: dict[str, float]) -> dict[str, Any]:
    """A run preset: a model preset trained against ``rewards`` with the paper's defaults."""
    names = " + ".join(rewards)
    return {
        "description": f"{MODEL_PRESETS[model]['description']}; Sol-RL against {names}",
        "model_preset": model,
        "settings": merge_nested(PAPER_DEFAULTS, MODEL_PRESETS[model]["settings"], {"rewards": rewards}),
        "derived": MODEL_PRESETS[model].get("derived", {}),
    }


# Names the Prefect deployments point at (solrl/<name>).
PRESETS.update({
    "flux-imagereward": real_preset("flux.1-dev", {"imagereward": 1.0}),
    "flux-clipscore": real_preset("flux.1-dev", {"clipscore": 1.0}),
    "sana-hpsv2": real_preset("sana-1.6b", {"hpsv2": 1.0}),
    "sd35l-pickscore": real_preset("sd3.5-large", {"pickscore": 1.0}),
})

def validate(config: Config) -> Config:
    """Every name and cross-field rule (solrl_core.validation) against the registries' records and
    this module's presets; returns the config unchanged when it is runnable."""
    return check_config(config, PRESETS)


def resolve_config(preset: str, family: str | None = None, overrides: list[tuple[str, Any]] | None = None,
                   base: dict[str, Any] | None = None) -> Config:
    """defaults -> params mapping (``base``) -> preset -> family -> user overrides, then validate;
    then the prompt files it names are read, so that a missing one stops here, before any run."""
    config = Config()
    if base:
        apply_mapping(config, base)
    if not isinstance(preset, str) or preset not in PRESETS:  # argparse reads --preset=-- as []
        raise ConfigError(f"unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    config.preset = preset
    apply_mapping(config, PRESETS[preset]["settings"])
    family = config.family if family is None else family
    if not isinstance(family, str) or family not in FAMILIES:
        raise ConfigError(f"unknown family {family!r}; allowed: {', '.join(FAMILIES)}")
    config.family = family
    apply_mapping(config, FAMILIES[family].settings)
    for key, value in overrides or []:
        if key in ("preset", "family"):
            raise ConfigError(f"set {key} with --{key}, not -S")
        apply_mapping(config, {key: value})
    _apply_derived(config, PRESETS[preset].get("derived", {}), {key for key, _ in overrides or []})
    validate(config)
    check_prompt_files(config)
    return config


def _apply_derived(config: Config, derived: dict[str, Any], overridden: set[str]) -> None:
    """A preset's derived settings (key -> rule of the config), except where the user set the key."""
    for key, rule in derived.items():
        if key not in overridden:
            apply_mapping(config, {key: rule(config)})
