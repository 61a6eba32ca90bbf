"""One typed configuration: defaults, then a preset, then a family, then the user's overrides.

Every key a user can set with ``-S key=value`` is a dotted path into :class:`Config`. This module
is the bottom layer: the schema, parsing and type coercion, and :class:`ConfigError` (one line
that says what is wrong and what is allowed; the CLI turns it into exit code 2). It imports no
other solrl_core module. Names and cross-field rules are checked once, in the resolve step above
the registries (solrl_core.presets.resolve_config / validate, rules in solrl_core.validation).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import reprlib
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import yaml

# The names of families, samplers, models, rewards and explorer backends are their registries'
# (solrl_core.families, sampling, models.registry, rewards.registry, quant.backends): this module
# is the bottom layer and imports none of them; solrl_core.validation checks names against them.
DTYPES = ("auto", "float32", "bfloat16", "float16")
# model.device: "auto" or a torch device of one of these types ("cpu", "cuda", "cuda:1", ...);
# "meta", "lazy" and the like parse but hold no data to sample with.
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")
# model.compile: the transformer's sampling forwards eager, compiled by repeated block, or whole
# (solrl_core.models.compilation).
COMPILE_MODES = ("none", "blocks", "whole")


# Every integer size, count and step number must fit a 32-bit int: larger ones are not runnable
# (torch sizes, seed tensors, sampler grids) and would fail far into a run, not here.
MAX_COUNT = 2**31 - 1


def one_line(text: str) -> str:
    """``text`` with line breaks and other unprintable characters escaped (``\\n``, ``\\x85``), so
    that a message quoting user input (a key, a value, a path) stays one line on a terminal."""
    return text if text.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


class ConfigError(ValueError):
    """A configuration the run cannot start with; the message is one actionable line."""

    def __init__(self, message: str = ""):
        super().__init__(one_line(str(message)))


@dataclass
class ModelConfig:
    # Name of the loader in solrl_core.models.registry ("shapes-tiny", "flux", "sana", "sd3").
    loader: str = "shapes-tiny"
    # Local directory (or Hugging Face repo id resolved in the local cache only).
    path: str = ""
    # "auto" means bfloat16 on a GPU and float32 on a CPU (this CPU has no bf16 units).
    dtype: str = "auto"
    device: str = "auto"
    resolution: int = 32
    guidance: float = 1.0
    # Keep text encoders and the VAE on the CPU except while encoding new prompts or decoding.
    offload_encoders: bool = False
    # Keep the (FP32) reward models on the CPU except while a stage scores with them.
    offload_rewards: bool = False
    # torch.compile the transformer's forwards without gradients (explore, regenerate, evaluate, the
    # update's old-policy and reference forwards): "none", "blocks" (each repeated block in place,
    # regional compilation) or "whole". Not yet measured on a GPU, so "none" everywhere by default.
    compile: str = "none"


@dataclass
class SamplerConfig:
    kind: str = "dpm2"
    # Flow-matching timestep shift: sigma' = shift*sigma / (1 + (shift-1)*sigma).
    shift: float = 1.0


@dataclass
class QuantConfig:
    # fnmatch patterns on qualified module names that stay in full precision.
    skip: list[str] = field(default_factory=list)
    # Layers (Linear, 1x1 Conv2d) with max(in, out) <= min_dim stay in full precision.
    min_dim: int = 0
    # Sibling layers one reference model holds fused, e.g. "attn2.to_k+attn2.to_v" (SANA's
    # kv_linear): for min_dim their out is the fused width.
    fused: list[str] = field(default_factory=list)


@dataclass
class AdaptiveConfig:
    """Adaptive exploration (solrl_core.adaptive): the whole pool runs ``score_at[0]`` explorer
    steps, each draft's free x0-prediction is scored, the ``survivors[0]`` most extreme per group
    (half best, half worst) continue, and so on; the rest of the pool stops there. When the last
    survivor count is ``keep`` the kept seeds are decided and exploration ends; otherwise the
    survivors run to ``explore.steps`` and are ranked there."""

    enabled: bool = False
    score_at: list[int] = field(default_factory=lambda: [1, 2])  # explorer steps taken at each scoring
    survivors: list[int] = field(default_factory=lambda: [48, 24])  # seeds per group kept at each


@dataclass
class ExploreConfig:
    backend: str = "emulated-nvfp4"
    steps: int = 6
    chunk: int = 24
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)


@dataclass
class DriftAlarmConfig:
    """Proxy drift: the online fidelity (mean Spearman of the kept seeds' explorer vs full-precision
    rewards) below ``threshold`` for ``window`` iterations in a row warns, and once switches the
    explorer to ``switch_steps`` steps and/or ``switch_backend`` when those are set."""

    threshold: float = 0.3
    window: int = 3
    switch_steps: int = 0  # 0: keep explore.steps
    switch_backend: str = ""  # "": keep explore.backend; e.g. fp8 (more faithful than NVFP4)


@dataclass
class HackingAlarmConfig:
    """Reward hacking: at an evaluation, a held-out reward (in eval.rewards, not in rewards) more
    than ``margin`` below its base value warns (0.03: the fall of the untrained aesthetic this
    project accepts for a compliance gain; solrl_core.alarms)."""

    enabled: bool = True
    margin: float = 0.03


@dataclass
class AlarmsConfig:
    drift: DriftAlarmConfig = field(default_factory=DriftAlarmConfig)
    hacking: HackingAlarmConfig = field(default_factory=HackingAlarmConfig)


@dataclass
class RegenerateConfig:
    # False: train on the exploration samples themselves (diffusionnft, naive_* families).
    enabled: bool = True
    # T_train, the sampler steps of every trained-on sample, whether or not it is regenerated:
    # the regenerated kept seeds, or (regenerate.enabled=false) the rollout itself. The key keeps
    # its name (params.yaml and users set it); code reads it through train_steps(config).
    steps: int = 10
    chunk: int = 24


@dataclass
class LoraConfigSpec:
    rank: int = 32
    alpha: int = 64
    targets: list[str] = field(default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0"])


@dataclass
class TrainConfig:
    lr: float = 3e-4
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 1e-4
    grad_clip: float = 1.0
    # DiffusionNFT: implicit-policy mixing strength and advantage clip.
    nft_beta: float = 1.0
    adv_clip: float = 5.0
    # Which advantages train: all, positive_only or negative_only (solrl_core.nft.ADVANTAGE_MODES;
    # the reference code's adv_mode). The others get the neutral weight 1/2.
    adv_mode: str = "all"
    kl_weight: float = 1e-4
    timestep_fraction: float = 0.6
    # Optimizer steps per iteration (the paper and the reference code: one, accumulating over every
    # kept sample). With more, each step trains on a seeded random share of the kept samples, never
    # one chosen by reward (solrl_core.dealing); the embedded world's preset takes 8 (presets.py).
    steps_per_iteration: int = 1
    micro_batch: int = 32
    # Old-policy soft update once an iteration: eta = min(eta_rate * optimizer steps so far, eta_max),
    # counted in steps as the reference's return_decay(global_step).
    eta_rate: float = 0.001
    eta_max: float = 0.5
    ema_max_decay: float = 0.9
    lora: LoraConfigSpec = field(default_factory=LoraConfigSpec)


@dataclass
class EvalConfig:
    every: int = 20
    steps: int = 28
    prompts: int = 16
    seeds_per_prompt: int = 2
    chunk: int = 64
    rewards: list[str] = field(default_factory=list)


@dataclass
class AccountingConfig:
    # Device profile whose dense peaks turn counted FLOPs into modeled GPU-hours (SPEC §9): B200,
    # B200-measured, H100 or H200 (solrl_core.accounting.DEVICE_PROFILES); gpu-check:PATH, a GPU's
    # profile with the explorer step costs its GPU check measured (benchmarks/gpu_check.py's JSON);
    # or auto, resolved with the config: the run's GPU by name and capability, B200 on a CPU (and,
    # with a warning, on a GPU without a profile or without tensor cores for the explorer's precision).
    device: str = "auto"
    # Share of the dense peak a real run sustains; one factor for every stage and family.
    utilization: float = 0.4


@dataclass
class CheckpointConfig:
    # Write the resumable checkpoint after every N-th iteration (and after the last one).
    every: int = 1


@dataclass
class PromptConfig:
    # Text files with one prompt per line; empty means the embedded world's caption generator.
    train_file: str = ""
    eval_file: str = ""
    # Size of the generated training pool (embedded world only).
    train_pool: int = 1024


@dataclass
class Config:
    preset: str = "shapes-tiny"
    family: str = "sol_rl"
    seed: int = 0
    iterations: int = 10
    pool: int = 96
    keep: int = 24
    # How the rank stage keeps K of each group's N seeds: "extremes" (the K/2 best and K/2 worst)
    # or "random" (K at random, the random_pool control; solrl_core.selection.KEEP_RULES).
    selection: str = "extremes"
    prompts_per_iteration: int = 48
    # Reward name -> weight; the weighted sum ranks seeds and forms advantages.
    rewards: dict[str, float] = field(default_factory=lambda: {"shapes-compliance": 1.0})
    # Reward name -> local checkpoint folder or file (else the reward's env var, else the HF cache).
    reward_paths: dict[str, str] = field(default_factory=dict)
    prompts: PromptConfig = field(default_factory=PromptConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    explore: ExploreConfig = field(default_factory=ExploreConfig)
    regenerate: RegenerateConfig = field(default_factory=RegenerateConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    accounting: AccountingConfig = field(default_factory=AccountingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    alarms: AlarmsConfig = field(default_factory=AlarmsConfig)
    progress: bool = True


def train_steps(config: Config) -> int:
    """T_train: sampler steps of the samples the update trains on (``regenerate.steps``)."""
    return config.regenerate.steps


def rollout_steps(config: Config) -> int:
    """Sampler steps of the exploration rollout: the explorer's drafts (``explore.steps``), or,
    for a family that trains on its rollout, T_train."""
    return config.explore.steps if config.regenerate.enabled else train_steps(config)


# ---------------------------------------------------------------------------------------------
# Dotted-key access


def config_keys(obj: Any = None, prefix: str = "") -> list[str]:
    """Every settable dotted key (leaves only), in declaration order."""
    obj = Config() if obj is None else obj
    keys = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            keys.extend(config_keys(value, f"{prefix}{f.name}."))
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def _field_type(owner: Any, name: str) -> Any:
    return _type_hints(type(owner))[name]


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    # Resolving the string annotations is most of the cost of setting a key: once per class.
    return typing.get_type_hints(cls)


def _coerce(key: str, raw: Any, expected: Any) -> Any:
    """Convert a parsed YAML value to the field's declared type, or raise a one-line error."""
    origin = typing.get_origin(expected)
    bad = ConfigError(f"{key}: expected {_type_name(expected)}, got {shown(raw)}")
    if expected is bool:
        if isinstance(raw, bool):
            return raw
        raise bad
    if expected is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise bad
        return raw
    if expected is float:
        if isinstance(raw, str):
            # YAML 1.1 reads "1e-3" (no dot) as a string; users write learning rates that way.
            try:
                return float(raw)
            except ValueError:
                raise bad from None
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise bad
        try:
            return float(raw)
        except OverflowError:  # an integer beyond any float (1e309 written out in digits)
            raise ConfigError(f"{key}: {shown(raw)} is too large; give a finite number") from None
    if expected is str:
        if isinstance(raw, (str, int, float)) and not isinstance(raw, bool):
            return str(raw)
        if not isinstance(raw, (list, dict, set, bytes)):  # true, null, a date: YAML read another type
            raise ConfigError(f"{key}: expected a string, got {shown(raw)}; quote it in YAML to keep it text")
        raise bad
    if origin is list:
        (item_type,) = typing.get_args(expected)
        if isinstance(raw, str):
            raw = [part.strip() for part in raw.split(",") if part.strip()]
        if not isinstance(raw, list):
            raise bad
        return [_coerce(key, item, item_type) for item in raw]
    if origin is dict:
        key_type, value_type = typing.get_args(expected)
        if not isinstance(raw, dict):
            raise bad
        return {_coerce(key, k, key_type): _coerce(key, v, value_type) for k, v in raw.items()}
    raise bad  # pragma: no cover - every declared type is handled above


def shown(value: Any, limit: int = 80) -> str:
    """A value as a message quotes it: a repr bounded in depth and length (a YAML value built from
    aliases can nest a billion references, whose full repr would never finish)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        # Python refuses to print an integer of more than 4300 digits; none of this size is useful.
        return f"{'-' if value < 0 else ''}an integer of {value.bit_length()} bits"
    shortener = reprlib.Repr()
    shortener.maxlevel = 2
    shortener.maxlist = shortener.maxtuple = shortener.maxset = shortener.maxdict = 4
    shortener.maxstring = shortener.maxother = limit
    shortener.maxlong = limit // 2
    text = shortener.repr(value)
    return text if len(text) <= 2 * limit else f"{text[:2 * limit - 3]}..."


def _type_name(expected: Any) -> str:
    if isinstance(expected, type):
        return {"int": "an integer", "float": "a number", "str": "a string", "bool": "true/false"}.get(
            expected.__name__, expected.__name__
        )
    if isinstance(expected, types.GenericAlias):
        return str(expected)
    return str(expected)


def _field_names(owner: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(owner)}


def set_key(config: Config, key: str, raw: Any) -> None:
    """Set a dotted key, checking that it exists and that the value has the declared type."""
    parts = key.split(".")
    owner: Any = config
    for depth, part in enumerate(parts[:-1]):
        # Declared fields only: getattr would also walk into attributes such as __class__.
        if part not in _field_names(owner):
            raise _unknown_key(key)
        child = getattr(owner, part)
        if isinstance(child, dict):
            mapping = ".".join(parts[: depth + 1])
            rest = ".".join(parts[depth + 1:])
            raise ConfigError(f"{key}: {mapping} is a mapping and is set whole, "
                              f"e.g. -S '{mapping}={{{rest}: VALUE}}'")
        if not dataclasses.is_dataclass(child):
            raise _unknown_key(key)
        owner = child
    leaf = parts[-1]
    if leaf not in _field_names(owner):
        raise _unknown_key(key)
    if dataclasses.is_dataclass(getattr(owner, leaf)):
        if not isinstance(raw, dict):
            raise ConfigError(f"{key}: is a section; set one of its keys, e.g. {key}.{config_keys(getattr(owner, leaf))[0]}")
        for sub_key, sub_value in raw.items():
            set_key(config, f"{key}.{sub_key}", sub_value)
        return
    setattr(owner, leaf, _coerce(key, raw, _field_type(owner, leaf)))


def declared_type(key: str) -> Any:
    """The declared type of a settable dotted key (``int``, ``list[str]``, ...), or None."""
    owner: Any = Config()
    parts = key.split(".")
    for part in parts[:-1]:
        if not dataclasses.is_dataclass(owner) or part not in _field_names(owner):
            return None
        owner = getattr(owner, part)
    if not dataclasses.is_dataclass(owner) or parts[-1] not in _field_names(owner):
        return None
    return _field_type(owner, parts[-1])


def get_key(config: Config, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _unknown_key(key: str) -> ConfigError:
    close = difflib.get_close_matches(key, config_keys(), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else "; run `solrl config --keys` to list them"
    return ConfigError(f"unknown config key {shown(key)}{hint}")


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` with a YAML value (``pool=48``, ``rewards={a: 1.0}``, ``quant.skip=[a, b]``).

    A string key (``model.path``, ``explore.backend``, ...) takes its text as written, where YAML
    would read another type or another string from it (``model.path=2024-01-01``, ``0x1A``,
    ``a #b``): a DVC stage passes ``-S key=${value}`` unquoted, and the string must come back
    unchanged. Quoted (``'...'`` or ``"..."``), it is read as a YAML string.
    """
    if "=" not in text:
        raise ConfigError(f"override {shown(text)} is not key=value (e.g. -S pool=48)")
    key, _, value_text = text.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"override {shown(text)} has an empty key (e.g. -S pool=48)")
    if declared_type(key) is str and not value_text.strip().startswith(("'", '"')):
        return key, value_text.strip()
    try:
        value = yaml.safe_load(value_text) if value_text.strip() else ""
    except yaml.YAMLError:
        raise ConfigError(f"override {shown(text)}: the value is not valid YAML") from None
    except ValueError:  # an integer of more than 4300 digits
        raise ConfigError(f"override {shown(text)}: the value is too long a number") from None
    except RecursionError:  # [[[[... nested thousands deep
        raise ConfigError(f"override {shown(text)}: the value is nested too deep") from None
    return key, value


def apply_mapping(config: Config, mapping: dict[str, Any], prefix: str = "") -> None:
    """Apply a nested or dotted mapping (a preset, a family, params.yaml) onto ``config``."""
    for key, value in mapping.items():
        set_key(config, f"{prefix}{key}", value)


def to_dict(config: Config) -> dict[str, Any]:
    return dataclasses.asdict(config)


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def from_dict(mapping: dict[str, Any]) -> Config:
    """A config from its dict form (params.yaml, summary.json, a checkpoint), keys and types
    checked; names and cross-field rules are the resolve step's (solrl_core.presets.validate)."""
    config = Config()
    apply_mapping(config, mapping)
    return config
