"""Named presets (model x reward x settings) and the four method families, as data.

A preset is a nested mapping applied onto the defaults; a family is a mapping applied after it.
Per-model differences live here, never in copied training loops.
"""

from __future__ import annotations

from typing import Any

from solrl_core.config import Config, ConfigError, apply_mapping, validate

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
            "iterations": 12,
            "prompts_per_iteration": 8,
            "pool": 96,
            "keep": 24,
            "train": {
                "lr": 1e-3,
                "timestep_fraction": 0.6,
                "steps_per_iteration": 2,
                "micro_batch": 96,
                "lora": {"rank": 8, "alpha": 16, "targets": ["to_q", "to_k", "to_v", "to_out.0"]},
            },
            "eval": {"every": 4, "steps": 20, "prompts": 32, "seeds_per_prompt": 2, "chunk": 128,
                     "rewards": ["shapes-compliance", "shapes-aesthetic"]},
        },
    },
}

# SPEC section 5. Families without regeneration train on their rollout, which runs at
# regenerate.steps (T_train); families with it draft at explore.steps and regenerate the kept.
FAMILIES: dict[str, dict[str, Any]] = {
    "diffusionnft": {"pool": 24, "keep": 24, "explore": {"backend": "none"}, "regenerate": {"enabled": False}},
    "naive_scaling": {"pool": 96, "keep": 24, "explore": {"backend": "none"}, "regenerate": {"enabled": False}},
    "naive_quant": {"pool": 96, "keep": 24, "regenerate": {"enabled": False}},
    "sol_rl": {"pool": 96, "keep": 24, "regenerate": {"enabled": True}},
}


def resolve_config(preset: str, family: str | None = None, overrides: list[tuple[str, Any]] | None = None,
                   base: dict[str, Any] | None = None) -> Config:
    """defaults -> params mapping (``base``) -> preset -> family -> user overrides, then validate."""
    config = Config()
    if base:
        apply_mapping(config, base)
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset '{preset}'; allowed: {', '.join(PRESETS)}")
    config.preset = preset
    apply_mapping(config, PRESETS[preset]["settings"])
    family = family or config.family
    if family not in FAMILIES:
        raise ConfigError(f"unknown family '{family}'; allowed: {', '.join(FAMILIES)}")
    config.family = family
    apply_mapping(config, FAMILIES[family])
    for key, value in overrides or []:
        if key in ("preset", "family"):
            raise ConfigError(f"set {key} with --{key}, not -S")
        apply_mapping(config, {key: value})
    return validate(config)


def rollout_steps(config: Config) -> int:
    """Sampler steps of the exploration rollout (drafts, or the trained-on rollout)."""
    return config.explore.steps if config.regenerate.enabled else config.regenerate.steps
