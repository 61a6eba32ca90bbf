"""Named presets (model x reward x settings), and the resolve step that turns a preset, a family
and the user's overrides into one validated config.

A preset is a nested mapping applied onto the defaults; a family (solrl_core.families) is a
mapping applied after it. Per-model differences are data in the models' records
(solrl_core.models.registry), never copied training loops.
:func:`resolve_config` and :func:`validate` are the one place names and cross-field rules are
checked (solrl_core.validation holds the rules); config.py below them only parses and coerces.

Real models (SPEC section 8) are described once each, in their records in
solrl_core.models.registry (MODEL_PRESETS is read from them); a run preset is a model preset + a
reward + the paper's defaults (PAPER_DEFAULTS), named by the model's record. Their weights load from local files
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

from pathlib import Path
from typing import Any

from solrl_core.accounting import AUTO_PROFILE, auto_profile
from solrl_core.config import Config, ConfigError, apply_mapping
from solrl_core.families import FAMILIES
from solrl_core.mappings import merge_nested
# flux_shift is re-exported: it belongs to FLUX's record, and callers know it from here.
from solrl_core.models.registry import FLUX_QUANT_SKIP, MODELS, flux_shift  # noqa: F401
from solrl_core.prompts import check_prompt_files
from solrl_core.quant.backends import BACKENDS, run_device
from solrl_core.validation import check_config, check_ranges

PRESETS: dict[str, dict[str, Any]] = {
    "shapes-tiny": {
        "description": "embedded world: a 0.6M-parameter FluxTransformer2DModel drawing 32x32 coloured shapes",
        "settings": {
            "model": {"loader": "shapes-tiny", "resolution": 32, "dtype": "auto"},
            "sampler": {"kind": "dpm2", "shift": 1.0},
            # The paper's size rule: layers of at most 64 x 64 (every attention projection here)
            # stay full precision; it ranks far better than quantizing them (reports/fidelity*.json:
            # rho 0.902 vs 0.548, top-12 0.681 vs 0.365) at a 1.90x vs 1.95x modeled speed-up.
            "quant": {"skip": FLUX_QUANT_SKIP, "min_dim": 64},
            "explore": {"backend": "emulated-nvfp4", "steps": 6, "chunk": 96},
            "regenerate": {"steps": 10, "chunk": 96},
            "rewards": {"shapes-compliance": 1.0},
            "iterations": 20,
            "prompts_per_iteration": 4,
            "pool": 96,
            "keep": 24,
            # Tuned on held-out compliance (issue 10's note): more, smaller steps at 1e-3 learn
            # the most; 3e-3 or LoRA on every linear lowers compliance and the aesthetic.
            "train": {
                "lr": 1e-3,
                "timestep_fraction": 0.6,
                "steps_per_iteration": 8,
                "micro_batch": 96,
                "lora": {"rank": 8, "alpha": 16, "targets": ["to_q", "to_k", "to_v", "to_out.0"]},
            },
            "eval": {"every": 5, "steps": 12, "prompts": 32, "seeds_per_prompt": 2, "chunk": 128,
                     "rewards": ["shapes-compliance", "shapes-aesthetic"]},
        },
    },
}

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts_data"

PAPER_REWARDS = ["imagereward", "clipscore", "pickscore", "hpsv2"]

# Each real model's preset (SPEC section 8), as its record in solrl_core.models.registry declares it.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    spec.preset.name: {"description": spec.preset.description, "settings": spec.preset.settings,
                       "derived": spec.preset.derived}
    for spec in MODELS.values() if spec.preset is not None
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
        "derived": MODEL_PRESETS[model]["derived"],
    }


# The run presets each model's record names; the Prefect deployments point at them (solrl/<name>).
PRESETS.update({run: real_preset(spec.preset.name, rewards)
                for spec in MODELS.values() if spec.preset is not None for run, rewards in spec.preset.runs.items()})


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
    check_ranges(config)  # a derived setting is computed from numbers in range (FLUX's shift overflows past 8192 px)
    _apply_derived(config, PRESETS[preset].get("derived", {}), {key for key, _ in overrides or []})
    _resolve_accounting_device(config)
    validate(config)
    check_prompt_files(config)
    return config


def _resolve_accounting_device(config: Config) -> None:
    """accounting.device=auto becomes the profile of the device this run computes on, once, here:
    everything downstream (the hours, the saved config, MLflow's params, a resume) then reads one
    named profile, and a CPU run's outputs read B200 as before. Left as it is where model.device or
    explore.backend is not a valid name, which validation then reports."""
    if config.accounting.device != AUTO_PROFILE or config.explore.backend not in BACKENDS:
        return
    try:
        device = run_device(config.model.device)
    except (RuntimeError, ValueError, TypeError):
        return
    config.accounting.device = auto_profile(device, config.explore.backend)


def _apply_derived(config: Config, derived: dict[str, Any], overridden: set[str]) -> None:
    """A preset's derived settings (key -> rule of the config), except where the user set the key."""
    for key, rule in derived.items():
        if key not in overridden:
            apply_mapping(config, {key: rule(config)})
