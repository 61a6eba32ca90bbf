"""Name and cross-field validation of a config: the rules, read from the registries' records.

Part of the resolve step (solrl_core.presets.resolve_config and presets.validate, which pass the
preset names in): every name is checked against the record that declares it (families, samplers,
models, rewards, explorer backends, device profiles), so an unknown name is an error with the
allowed ones listed, never a default. Each rule raises :class:`ConfigError` with one line.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import torch

from solrl_core.accounting import profile_problem
from solrl_core.adaptive import schedule_problem
from solrl_core.config import (COMPILE_MODES, DEVICE_TYPES, DTYPES, MAX_COUNT, Config, ConfigError, config_keys, get_key,
                               shown)
from solrl_core.families import FAMILIES
from solrl_core.models.registry import MODELS
from solrl_core.nft import ADVANTAGE_MODES
from solrl_core.quant.backends import BACKENDS
from solrl_core.rewards.registry import REWARDS
from solrl_core.sampling import SAMPLERS
from solrl_core.selection import KEEP_RULES


def check_config(config: Config, presets: Collection[str]) -> Config:
    """Every name and cross-field rule; returns the config unchanged when it is runnable. Names
    are checked against the registries' records (``presets``: the preset names, passed in by the
    resolve step that owns them)."""
    _require(config.preset in presets, f"unknown preset '{config.preset}'; allowed: {', '.join(presets)}")
    _require(config.family in FAMILIES, f"unknown family '{config.family}'; allowed: {', '.join(FAMILIES)}")
    _require(config.explore.backend in BACKENDS,
             f"unknown explore.backend '{config.explore.backend}'; allowed: {', '.join(BACKENDS)}")
    _require(config.selection in KEEP_RULES,
             f"unknown selection '{config.selection}'; allowed: {', '.join(KEEP_RULES)}")
    _require(config.sampler.kind in SAMPLERS, f"unknown sampler.kind '{config.sampler.kind}'; allowed: {', '.join(SAMPLERS)}")
    _require(config.model.dtype in DTYPES, f"unknown model.dtype '{config.model.dtype}'; allowed: {', '.join(DTYPES)}")
    _require(config.model.compile in COMPILE_MODES,
             f"unknown model.compile '{config.model.compile}'; allowed: {', '.join(COMPILE_MODES)}")
    _require(config.model.loader in MODELS,
             f"unknown model.loader '{config.model.loader}'; allowed: {', '.join(MODELS)}")
    _require(_is_device(config.model.device),
             f"model.device '{config.model.device}' is not a torch device; use auto, cpu, cuda or cuda:N")
    _require(bool(config.rewards), "rewards is empty; give at least one reward with a weight, e.g. -S 'rewards={shapes-compliance: 1.0}'")
    for name in list(config.rewards) + list(config.eval.rewards):
        _require(name in REWARDS, f"unknown reward '{name}'; allowed: {', '.join(REWARDS)}")
    for name in config.reward_paths:
        _require(name in REWARDS, f"reward_paths: unknown reward '{name}'; allowed: {', '.join(REWARDS)}")
    _require(bool(config.train.lora.targets) and all(t.strip() for t in config.train.lora.targets),
             "train.lora.targets is empty; name the modules to adapt, e.g. -S 'train.lora.targets=[to_q, to_v]'")
    check_ranges(config)
    _require(config.keep <= config.pool, f"keep ({config.keep}) must be <= pool ({config.pool})")
    _require(config.keep % 2 == 0, f"keep ({config.keep}) must be even: half best and half worst seeds are kept")
    _require(config.keep >= 2, f"keep ({config.keep}) must be at least 2 (one best, one worst seed)")
    _require(config.train.lr > 0, f"train.lr ({config.train.lr}) must be > 0")
    _require(0 < config.train.timestep_fraction <= 1,
             f"train.timestep_fraction ({config.train.timestep_fraction}) must be in (0, 1]")
    _require(config.train.nft_beta > 0, f"train.nft_beta ({config.train.nft_beta}) must be > 0")
    _require(config.train.adv_clip > 0, f"train.adv_clip ({config.train.adv_clip}) must be > 0")
    _require(config.train.adv_mode in ADVANTAGE_MODES,
             f"unknown train.adv_mode '{config.train.adv_mode}'; allowed: {', '.join(ADVANTAGE_MODES)}")
    _require(config.train.kl_weight >= 0, f"train.kl_weight ({config.train.kl_weight}) must be >= 0")
    _require(config.train.grad_clip > 0, f"train.grad_clip ({config.train.grad_clip}) must be > 0")
    _require(0 <= config.train.weight_decay, f"train.weight_decay ({config.train.weight_decay}) must be >= 0")
    _require(0 <= config.train.beta1 < 1 and 0 <= config.train.beta2 < 1, "train.beta1 and train.beta2 must be in [0, 1)")
    _require(0 <= config.train.ema_max_decay < 1, "train.ema_max_decay must be in [0, 1)")
    _require(0 <= config.train.eta_max < 1 and config.train.eta_rate >= 0, "train.eta_max must be in [0, 1) and train.eta_rate >= 0")
    _require(config.sampler.shift > 0, f"sampler.shift ({config.sampler.shift}) must be > 0")
    _require(config.quant.min_dim >= 0, f"quant.min_dim ({config.quant.min_dim}) must be >= 0")
    _require(0 < config.accounting.utilization <= 1,
             f"accounting.utilization ({config.accounting.utilization}) must be in (0, 1]")
    accounting_problem = profile_problem(config.accounting.device, config.explore.backend)
    _require(accounting_problem is None, accounting_problem or "")
    _check_alarms(config)
    if config.explore.adaptive.enabled:
        problem = schedule_problem(config.explore.adaptive.score_at, config.explore.adaptive.survivors,
                                   config.pool, config.keep, config.explore.steps)
        _require(problem is None, f"explore.adaptive: {problem}")
        _require(config.regenerate.enabled, "explore.adaptive needs regenerate.enabled=true: the pruned drafts "
                                            "are unfinished and cannot be trained on")
    for name, weight in config.rewards.items():
        _require(math.isfinite(weight), f"rewards.{name}: weight ({weight}) must be a finite number")
    return config


def _check_alarms(config: Config) -> None:
    drift = config.alarms.drift
    _require(-1 <= drift.threshold <= 1, f"alarms.drift.threshold ({drift.threshold}) must be a Spearman in [-1, 1]")
    _require(drift.switch_steps >= 0, f"alarms.drift.switch_steps ({drift.switch_steps}) must be >= 0 (0: unchanged)")
    if drift.switch_backend:
        _require(drift.switch_backend in BACKENDS and drift.switch_backend != "auto",
                 f"unknown alarms.drift.switch_backend '{drift.switch_backend}'; allowed: "
                 f"{', '.join(b for b in BACKENDS if b != 'auto')}, or empty")
        problem = profile_problem(config.accounting.device, drift.switch_backend)
        _require(problem is None, f"alarms.drift.switch_backend: {problem}")
    _require(config.alarms.hacking.margin >= 0, f"alarms.hacking.margin ({config.alarms.hacking.margin}) must be >= 0")


def _is_device(name: str) -> bool:
    if name == "auto":
        return True
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        return False
    return device.type in DEVICE_TYPES


# Integer keys that count something: at least 1. Every other integer key has its own range here.
POSITIVE_INTS = ("iterations", "pool", "keep", "prompts_per_iteration", "explore.steps", "explore.chunk",
                 "regenerate.steps", "regenerate.chunk", "train.steps_per_iteration", "train.micro_batch",
                 "train.lora.rank", "train.lora.alpha", "eval.every", "eval.steps", "eval.prompts",
                 "eval.seeds_per_prompt", "eval.chunk", "model.resolution", "prompts.train_pool",
                 "checkpoint.every", "alarms.drift.window")
# The largest image side: a FLUX latent at 8192 px is a 262k-token sequence, beyond any model here; a
# resolution-derived setting (FLUX's timestep shift grows as exp of the token count) stays finite.
MAX_RESOLUTION = 8192
INT_RANGES = {"seed": (0, 2**63 - 1), "quant.min_dim": (0, MAX_COUNT), **{key: (1, MAX_COUNT) for key in POSITIVE_INTS},
              "model.resolution": (1, MAX_RESOLUTION)}


def check_ranges(config: Config) -> None:
    """Every number in range, before any rule that compares or prints one (a vast integer cannot
    even be printed): integers within their bounds, every float finite. Also run before a preset's
    derived settings, which compute from these numbers."""
    for key in config_keys(config):
        value = get_key(config, key)
        if isinstance(value, float):
            _require(math.isfinite(value), f"{key} ({value}) must be a finite number")
        elif isinstance(value, int) and not isinstance(value, bool):
            low, high = INT_RANGES.get(key, (-MAX_COUNT, MAX_COUNT))
            if key == "seed":
                _require(low <= value <= high, f"seed ({shown(value, 30)}) must be in [0, 2**63)")
            _require(value >= low, f"{key} ({shown(value, 30)}) must be >= {low}")
            _require(value <= high, f"{key} ({shown(value, 30)}) must be <= {high}")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)
