"""Compute accounting (SPEC §9): FLOPs per stage counted on the real model, device profiles, and
GPU-hours, modeled everywhere and measured on CUDA.

Modeled GPU-hours of a stage = its FLOPs / (the device profile's dense peak for the stage's
precision x the utilisation factor). Each stage runs at its own precision, as on the paper's
hardware: the explorer's quantized Linear layers at FP4 (NVFP4 backends) or FP8, everything else
(attention, the layers the explorer skips, regeneration, the update, evaluation) at BF16. FLOPs
of one sample's forward (and of one trained sample's forward + backward) are counted once per
input shape with ``torch.utils.flop_counter`` and multiplied by the number of calls a stage makes.
Reward models are not counted for the drafts every family scores once (the same for all of them;
the embedded world's rewards are analytic and do no matmuls), but adaptive exploration's
intermediate drafts are: each is decoded (the VAE decode counted on the real model) and scored
(each reward record's scoring_flops, solrl_core.rewards.registry), at BF16, in the rank stage.

The profile (accounting.device) is a named one of DEVICE_PROFILES, where an explorer step costs
its FLOPs at the dense peak of its precision ("peak ratio") unless the profile measured that step
(B200-measured: the paper's stage times); gpu-check:PATH, a GPU's peaks with the step costs its GPU
check measured; or auto, which the config resolves to the run's own device (B200 on a CPU).
"""

from __future__ import annotations

import functools
import json
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from solrl_core.adaptive import schedule_counts
from solrl_core.config import rollout_steps, train_steps
from solrl_core.quant.backends import Capability, precision_on_profile
from solrl_core.quant.explorer import effective_linear_weights
from solrl_core.rewards.registry import REWARDS

# Dense peaks, TFLOP/s (SPEC §9). None: the precision has no tensor cores on that device.
DEVICE_PROFILES: dict[str, dict[str, float | None]] = {
    "B200": {"bf16": 2250.0, "fp8": 4500.0, "fp4": 9000.0},
    "H100": {"bf16": 989.0, "fp8": 1979.0, "fp4": None},
    "H200": {"bf16": 989.0, "fp8": 1979.0, "fp4": None},
}
# A profile calibrated to the paper's measured stage times instead of the dense peaks: B200's
# peaks for everything at BF16, and an explorer step charged at a measured share of a BF16 step.
DEVICE_PROFILES["B200-measured"] = dict(DEVICE_PROFILES["B200"])
MEASURED_STEP_COST: dict[str, dict[str, float]] = {
    # SPEC §6 and §10, SD3.5-Large on 8 x B200, per GPU 6 prompts x 96 seeds: the naive rollout
    # (96 x 10 BF16 steps) took 451 s, 0.470 s per sample-step; the NVFP4 exploration (96 x 6)
    # took 125 s, 0.217 s per sample-step; 0.217 / 0.470 = 0.46 of a BF16 step (the peaks alone
    # would say 0.25: attention, norms and the skipped layers stay BF16, and the quantize kernels
    # cost time). The whole explorer forward (its FLOPs at every precision) is charged at 0.46 of
    # the same FLOPs at BF16. The paper's regeneration (24 x 10 BF16, 62 s, 0.26 s per
    # sample-step) ran 0.55x the cost of its own 24-in-24 baseline rollout of the same shape (113 s,
    # 0.47 s) for no reason the paper gives; this profile charges it like any BF16 step (r = 1),
    # which is conservative for Sol-RL. Update and evaluation: BF16 FLOPs, as in the peak profile.
    "B200-measured": {"fp4": 0.46},
}


def scoring_flops(rewards) -> Flops:
    """FLOPs of scoring one decoded image with every reward in ``rewards`` (names), as each
    reward's record declares them (solrl_core.rewards.registry). An unknown reward is an error in
    the cost model, never a silent zero."""
    unknown = [name for name in rewards if name not in REWARDS]
    if unknown:
        raise ValueError(f"no scoring cost for unknown reward(s) {', '.join(unknown)}; allowed: {', '.join(REWARDS)}")
    return Flops(high=int(sum(REWARDS[name].scoring_flops for name in rewards)))


# The CUDA capability of each profile's device: what explore.backend=auto resolves to there.
PROFILE_CAPABILITY = {"B200": (10, 0), "B200-measured": (10, 0), "H100": (9, 0), "H200": (9, 0)}
# Where a built-in profile's measured step costs come from, in words.
MEASURED_SOURCE = {"B200-measured": "the paper's measured stage times"}

# accounting.device=auto: the profile of the device the run computes on (resolved with the config).
AUTO_PROFILE = "auto"
# The profile a CPU run, and a GPU without a profile of its own, is modeled on: the paper's hardware.
FALLBACK_PROFILE = "B200"
# accounting.device=gpu-check:PATH: a GPU's peak profile with the explorer step costs the GPU check
# (benchmarks/gpu_check.py) measured on it, read from its JSON at PATH.
GPU_CHECK_PROFILE = "gpu-check:"
PEAK_RATIO = "peak ratio"
# The GPU check's transformer variants that measure a real low-precision explorer step, and the
# precision each measures. emulated-nvfp4 is left out: it runs bf16 GEMMs and measures no FP4 step.
GPU_CHECK_PRECISIONS = {"fp8": "fp8", "te-nvfp4": "fp4"}


@dataclass(frozen=True)
class DeviceProfile:
    """A profile as the cost model reads it: dense peaks (TFLOP/s per precision, None: no tensor
    cores), the device's capability, and the explorer step costs measured for it (a share of the
    same FLOPs at BF16, per precision) with where they come from."""

    name: str
    peaks: dict[str, float | None]
    capability: Capability
    step_costs: dict[str, float] = field(default_factory=dict)
    source: str | None = None

    def basis(self, precision: str) -> str:
        """How an explorer step at ``precision`` is charged: "measured (SOURCE)" or "peak ratio"."""
        return f"measured ({self.source})" if precision in self.step_costs else PEAK_RATIO


def allowed_profiles() -> str:
    return f"{', '.join(DEVICE_PROFILES)}, {AUTO_PROFILE} (this device's), or {GPU_CHECK_PROFILE}PATH (a GPU check's JSON)"


def device_profile(name: str) -> DeviceProfile:
    """The profile ``name`` stands for; ValueError, in one line, for a name that stands for none."""
    if name.startswith(GPU_CHECK_PROFILE):
        return gpu_check_profile(name.removeprefix(GPU_CHECK_PROFILE))
    if name == AUTO_PROFILE:
        raise ValueError("accounting.device auto is resolved with the config (presets.resolve_config); "
                         "this config skipped that step")
    if name not in DEVICE_PROFILES:
        raise ValueError(f"unknown accounting.device '{name}'; allowed: {allowed_profiles()}")
    return DeviceProfile(name, DEVICE_PROFILES[name], PROFILE_CAPABILITY[name], MEASURED_STEP_COST.get(name, {}),
                         MEASURED_SOURCE.get(name))


def backend_precision(backend: str, device: str = "B200") -> str:
    """The precision the explorer's quantized layers run at on the modeled device (the backend's
    record in solrl_core.quant.backends; ``auto`` as it resolves on that device). An unknown
    backend is an error, never a silent BF16."""
    try:
        capability = device_profile(device).capability
    except ValueError:  # the profile's own check reports it; the backend is still checked here
        capability = PROFILE_CAPABILITY[FALLBACK_PROFILE]
    return precision_on_profile(backend, capability)


# --- accounting.device=auto --------------------------------------------------------------------


# The profiles of real GPUs, in the order their names are matched.
GPU_PROFILES = ("H200", "H100", "B200")


def gpu_profile(name: str, capability: Capability) -> str | None:
    """The profile of a GPU by its name and capability (both must agree: an H100 is sm_90), or None."""
    upper = name.upper()
    for profile in GPU_PROFILES:
        if profile in upper and tuple(capability) == PROFILE_CAPABILITY[profile]:
            return profile
    return None


def auto_profile(device: torch.device, backend: str) -> str:
    """accounting.device=auto for a run on ``device`` exploring with ``backend``: B200 on a CPU (the
    modeled hours of every CPU run stay what the B200 default gave); on a GPU its own profile, or
    B200 with a one-line warning where it has none, or none that can charge the explorer's
    precision (emulated NVFP4 stands in for Blackwell's FP4, which a Hopper lacks)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return FALLBACK_PROFILE
    name, capability = torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device))
    found = f"GPU '{name}' (sm_{capability[0]}{capability[1]})"
    profile = gpu_profile(name, capability)
    if profile is None:
        _warn_once(f"accounting.device auto: {found} has no device profile ({', '.join(GPU_PROFILES)}); "
                   f"modeling GPU-hours on {FALLBACK_PROFILE}")
        return FALLBACK_PROFILE
    if profile_problem(profile, backend) is not None:
        _warn_once(f"accounting.device auto: {found} has no {backend_precision(backend, profile).upper()} tensor cores "
                   f"for explore.backend {backend}; modeling GPU-hours on {FALLBACK_PROFILE}")
        return FALLBACK_PROFILE
    return profile


@functools.cache
def _warn_once(message: str) -> None:
    print(f"solrl: warning: {message}", file=sys.stderr)


# --- accounting.device=gpu-check:PATH ----------------------------------------------------------


def gpu_check_step_costs(report: dict) -> dict[str, float]:
    """{precision: explorer forward time / BF16 forward time} from a GPU check's report: its
    transformer section times FLUX.1-dev's forward at BF16 and with each explorer backend, compiled
    alike, and records BF16's time over each backend's as ``speedup_vs_bf16``. That whole-forward
    share is what a measured profile charges an explorer step (attention and skipped layers stay
    BF16 in both). ValueError, in one line, where the report holds no such measurement."""
    if report.get("mode") != "gpu":
        raise ValueError(f"its mode is {report.get('mode')!r}, not 'gpu': a rehearsal's CPU timings say nothing of a GPU")
    section = report.get("sections", {}).get("transformer", {})
    if section.get("status") != "ok":
        raise ValueError("its transformer section did not finish, so it measured no explorer forward")
    speedups = section["result"].get("speedup_vs_bf16", {})
    costs = {precision: 1.0 / speedups[backend] for backend, precision in GPU_CHECK_PRECISIONS.items()
             if isinstance(speedups.get(backend), (int, float)) and math.isfinite(speedups[backend]) and speedups[backend] > 0}
    if not costs:
        raise ValueError(f"its transformer section timed none of {', '.join(GPU_CHECK_PRECISIONS)} "
                         f"(only {', '.join(speedups) or 'no backend'})")
    return costs


@functools.cache
def gpu_check_profile(path: str) -> DeviceProfile:
    """The profile a GPU check's JSON at ``path`` measures: the peaks of the GPU it ran on, and
    the explorer step costs it timed; every other precision at its peak ratio."""
    where = f"{GPU_CHECK_PROFILE}{path}"
    try:
        report = json.loads(Path(path).read_text())
        gpu, capability = report["environment"]["gpu"], report["environment"]["capability"]
        major, minor = int(capability[3:-1]), int(capability[-1])  # "sm_90", "sm_100"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:  # JSONDecodeError is a ValueError
        raise ValueError(f"accounting.device {where}: not a GPU check's JSON of a GPU run "
                         f"({type(error).__name__}: {error})") from None
    try:
        step_costs = gpu_check_step_costs(report)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"accounting.device {where}: {error}") from None
    base = gpu_profile(gpu, (major, minor))
    if base is None:
        raise ValueError(f"accounting.device {where}: the check ran on '{gpu}' ({capability}), which has no "
                         f"device profile ({', '.join(GPU_PROFILES)})")
    return DeviceProfile(where, DEVICE_PROFILES[base], PROFILE_CAPABILITY[base], step_costs,
                         f"the GPU check's forwards in {Path(path).name}")


TRAINING_STAGES = ("explore", "rank", "regenerate", "update", "requantize")

# The CPU build of SDPA is not in flop_counter's registry; without these, attention counts zero.
_aten = torch.ops.aten


def _sdpa_forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


_EXTRA_FORMULAS = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_forward,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_backward,
}


def profile_problem(device: str, backend: str) -> str | None:
    """Why this device profile cannot model this explorer backend, or None when it can."""
    try:
        profile = device_profile(device)
        precision = backend_precision(backend, device)
    except ValueError as error:
        return str(error)
    if profile.peaks[precision] is None and precision not in profile.step_costs:
        return (f"accounting.device {device} has no {precision.upper()} tensor cores for explore.backend {backend}; "
                f"use explore.backend=fp8 (the Hopper explorer) or accounting.device=B200")
    return None


# ---------------------------------------------------------------------------------------------
# FLOP counting


@dataclass(frozen=True)
class Flops:
    """FLOPs split by the precision they run at on the modeled device."""

    low: int = 0  # in the explorer's quantized Linear layers (FP4 / FP8)
    high: int = 0  # everything else (BF16)

    @property
    def total(self) -> int:
        return self.low + self.high

    def __mul__(self, count: int) -> Flops:
        return Flops(self.low * count, self.high * count)

    __rmul__ = __mul__

    def __add__(self, other: Flops) -> Flops:
        return Flops(self.low + other.low, self.high + other.high)


def count_flops(function, quantized_layers: frozenset[str] = frozenset()) -> Flops:
    """FLOPs of ``function()``; those inside modules named in ``quantized_layers`` count as low precision.

    Module names in the counter are prefixed by the root module's class name, which is dropped.
    """
    with FlopCounterMode(display=False, custom_mapping=_EXTRA_FORMULAS) as counter:
        function()
    per_module = {name.partition(".")[2]: sum(per_op.values()) for name, per_op in counter.get_flop_counts().items()}
    low = sum(per_module.get(name, 0) for name in quantized_layers)
    return Flops(low=low, high=counter.get_total_flops() - low)


def _low_precision_share(plain_forward, layer_names: list[str]) -> Flops:
    """For kernels the counter cannot see (Transformer Engine's): the layers' base matmuls as
    counted in the full-precision forward (a LoRA wrapper's base_layer, else the layer)."""
    with FlopCounterMode(display=False, custom_mapping=_EXTRA_FORMULAS) as counter:
        plain_forward()
    per_module = {name.partition(".")[2]: sum(per_op.values()) for name, per_op in counter.get_flop_counts().items()}
    low = sum(per_module.get(f"{name}.base_layer", per_module.get(name, 0)) for name in layer_names)
    return Flops(low=low, high=counter.get_total_flops() - low)


@dataclass
class SampleFlops:
    """Per-sample FLOPs of the calls an iteration makes, for one input shape."""

    policy_forward: Flops  # the full-precision policy with a LoRA adapter active
    explorer_forward: Flops  # the explorer (quantized layers low precision)
    reference_forward: Flops  # the base alone (adapters off): the KL reference
    trained_forward_backward: Flops  # the trained adapter, forward + backward
    requantize: Flops  # one requantize (LoRA merges), whole model
    decode: Flops = Flops()  # one latent to an image (the VAE decoder)

    def to_record(self) -> dict[str, dict[str, int]]:
        """As summary.json's ``flops_per_sample`` holds them: call -> {"low": ..., "high": ...}.
        Every stage's FLOPs are these times the calls it makes (``stage_flops``), so a finished
        run's costs, under any profile, follow from its summary without loading the model."""
        return {call.name: {"low": getattr(self, call.name).low, "high": getattr(self, call.name).high}
                for call in fields(self)}

    @classmethod
    def from_record(cls, record: dict) -> SampleFlops:
        """The counts :meth:`to_record` wrote; ValueError, saying what is wrong, for anything else."""
        calls = [call.name for call in fields(cls)]
        if not isinstance(record, dict) or sorted(record) != sorted(calls):
            raise ValueError(f"expected the FLOPs of the calls {', '.join(calls)}")
        for call, value in record.items():
            if not (isinstance(value, dict) and sorted(value) == ["high", "low"]
                    and all(type(part) is int and part >= 0 for part in value.values())):
                raise ValueError(f"{call}: expected {{low: INT, high: INT}} (non-negative), got {value!r}")
        return cls(**{call: Flops(low=value["low"], high=value["high"]) for call, value in record.items()})


# Counted FLOPs per input shape and model layout, shared by every run in the process (counting
# runs the model under a Python dispatch mode: about a second per shape on the embedded world).
_SAMPLE_FLOPS: dict[tuple, SampleFlops] = {}


def sample_flops(state) -> SampleFlops:
    """The run's per-sample FLOPs, counted the first time this shape and model layout is seen."""
    config, explorer = state.config, state.explorer
    key = (config.model.loader, config.model.path, tuple(state.policy.latent_shape),
           tuple((name, tuple(value.shape)) for name, value in
                 sorted(state.policy.conditioning([state.train_prompts[0]]).items())),
           config.explore.backend, tuple(explorer.layer_names) if explorer is not None else (),
           config.train.lora.rank, tuple(config.train.lora.targets))
    if key not in _SAMPLE_FLOPS:
        _SAMPLE_FLOPS[key] = count_sample_flops(state)
    return _SAMPLE_FLOPS[key]


def count_sample_flops(state) -> SampleFlops:
    """Count one sample's calls on the run's real policy and explorer. No randomness is drawn and no
    weight changes, so counting never alters a run; gradients it makes are cleared."""
    # deferred: peft at import time (start-up of config resolution, which reads the device profiles here)
    from solrl_core.models.adapters import OLD, TRAINED, active_adapter

    policy, explorer = state.policy, state.explorer
    transformer = policy.transformer
    latents = torch.zeros((1, *policy.latent_shape), dtype=torch.float32, device=policy.device)
    sigma = torch.full((1,), 0.5, device=policy.device)
    conditioning = policy.conditioning([state.train_prompts[0]])

    def forward(adapter: str | None, use_explorer: bool = False):
        def run():
            with torch.no_grad(), active_adapter(transformer, adapter):
                if use_explorer and explorer is not None:
                    with explorer.active(transformer):
                        policy.velocity(latents, sigma, conditioning)
                else:
                    policy.velocity(latents, sigma, conditioning)
        return run

    def forward_backward():
        with active_adapter(transformer, TRAINED):
            policy.velocity(latents, sigma, conditioning).square().mean().backward()

    def merge_loras():
        # What requantize computes besides the element-wise quantization: each layer's LoRA merge.
        with torch.no_grad():
            for name in explorer.layer_names:
                effective_linear_weights(transformer.get_submodule(name), OLD)

    def decode():
        with torch.no_grad():
            policy.decode(latents)

    quantized = frozenset(explorer.layer_names) if explorer is not None else frozenset()
    try:
        explorer_forward = count_flops(forward(OLD, use_explorer=True), quantized)
        if quantized and explorer_forward.low == 0:
            explorer_forward = _low_precision_share(forward(OLD), explorer.layer_names)
        counts = SampleFlops(
            policy_forward=count_flops(forward(OLD)),
            explorer_forward=explorer_forward,
            reference_forward=count_flops(forward(None)),
            trained_forward_backward=count_flops(forward_backward),
            requantize=count_flops(merge_loras) if explorer is not None and explorer.layer_names else Flops(),
            decode=count_flops(decode),
        )
    finally:
        for parameter in transformer.parameters():
            parameter.grad = None
    return counts


# ---------------------------------------------------------------------------------------------
# From FLOPs to GPU-hours


@dataclass(frozen=True)
class DeviceModel:
    device: str = "B200"
    utilization: float = 0.4
    explore_precision: str = "fp4"

    def hours(self, flops: Flops, low_precision: str | None = None) -> float:
        """GPU-hours of ``flops``: the low part at ``low_precision`` (default BF16), the rest at BF16."""
        profile = device_profile(self.device)
        peaks, measured = profile.peaks, profile.step_costs
        if low_precision in measured:  # a calibrated explorer step: a share of the same FLOPs at BF16
            return flops.total * measured[low_precision] / (peaks["bf16"] * 1e12 * self.utilization) / 3600.0
        low_peak = peaks[low_precision or "bf16"]
        if low_peak is None:
            raise ValueError(f"device {self.device} has no {low_precision} peak")
        seconds = (flops.low / low_peak + flops.high / peaks["bf16"]) / (1e12 * self.utilization)
        return seconds / 3600.0


def stage_flops(config, counts: SampleFlops, explored: int, explore_steps: int, kept: int, train_steps: int,
                evaluated: bool, explore_rows: int | None = None, scored_drafts: int = 0) -> dict[str, Flops]:
    """FLOPs of each stage of one iteration from the number of calls it makes.

    Both samplers make one velocity call per step (DPM-Solver-2M reuses the last step's x0; the
    explore stage counts the rows it passed to the velocity, ``explore_rows``, which is
    ``explored x explore_steps`` for the fixed scheme and fewer for adaptive exploration, whose
    ``scored_drafts`` intermediate drafts are decoded and scored in the rank stage); the update makes, per trained (sample, timestep)
    item, one "old" forward and one reference forward without grad and one forward + backward of
    the trained policy (as ``stages.update`` does).
    """
    per_sample_timesteps = max(1, round(config.train.timestep_fraction * train_steps))
    update_items = kept * per_sample_timesteps
    regenerated = kept if config.regenerate.enabled else 0
    evaluation = config.eval.prompts * config.eval.seeds_per_prompt * config.eval.steps if evaluated else 0
    return {
        "explore": counts.explorer_forward * (explored * explore_steps if explore_rows is None else explore_rows),
        "rank": (counts.decode + scoring_flops(config.rewards)) * scored_drafts if scored_drafts else Flops(),
        "regenerate": counts.policy_forward * (regenerated * config.regenerate.steps),
        "update": (counts.policy_forward + counts.reference_forward + counts.trained_forward_backward) * update_items,
        "requantize": counts.requantize,
        "evaluate": counts.policy_forward * evaluation,
    }


def stage_hours(model: DeviceModel, flops: dict[str, Flops]) -> dict[str, float]:
    return {stage: model.hours(value, model.explore_precision if stage == "explore" else None)
            for stage, value in flops.items()}


def device_model(config) -> DeviceModel:
    return DeviceModel(config.accounting.device, config.accounting.utilization,
                       backend_precision(config.explore.backend, config.accounting.device))


# ---------------------------------------------------------------------------------------------
# Per-run bookkeeping


@dataclass
class Accountant:
    """Accumulates a run's GPU-hours over its iterations; the run state carries one
    (``RunState.accountant``), and the checkpoint saves and restores its totals."""

    model: DeviceModel
    modeled_cumulative: float = 0.0
    measured_cumulative: float | None = None

    @classmethod
    def for_config(cls, config) -> Accountant:
        return cls(device_model(config))

    def iteration(self, state, explored: int, explore_steps: int, kept: int, train_steps: int, evaluated: bool,
                  seconds: dict[str, float], explore_rows: int | None = None, scored_drafts: int = 0) -> dict:
        """The metrics.jsonl fields of one iteration (training stages; evaluation on its own)."""
        flops = stage_flops(state.config, sample_flops(state), explored, explore_steps, kept, train_steps,
                            evaluated, explore_rows, scored_drafts)
        hours = stage_hours(self.model, flops)
        iteration_hours = sum(hours[stage] for stage in TRAINING_STAGES)
        self.modeled_cumulative += iteration_hours
        record = {
            "modeled_gpu_hours": {**{stage: hours[stage] for stage in TRAINING_STAGES}, "total": iteration_hours},
            "modeled_gpu_hours_cumulative": self.modeled_cumulative,
            "modeled_gpu_hours_evaluate": hours["evaluate"],
            "flops": {**{stage: flops[stage].total for stage in (*TRAINING_STAGES, "evaluate")}},
        }
        measured = measured_gpu_hours(state.policy.device, sum(seconds.values()))
        if measured is not None:
            self.measured_cumulative = (self.measured_cumulative or 0.0) + measured
        record["gpu_hours"] = measured
        record["gpu_hours_cumulative"] = self.measured_cumulative
        return record


def measured_gpu_hours(device: torch.device, seconds: float) -> float | None:
    """Wall-clock x GPUs, on CUDA only (None elsewhere: the modeled figure is the one to read)."""
    if device.type != "cuda":
        return None
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    return seconds * world / 3600.0


def iteration_hours(config, counts: SampleFlops) -> dict:
    """Modeled GPU-hours of one training iteration of ``config`` (no evaluation) from its
    per-sample FLOPs, before running it (solrl_core.stages.modeled_iteration_hours counts them
    on the loaded model). Used to size a run to a GPU-hour budget.
    """
    explored = config.prompts_per_iteration * config.pool
    kept = config.prompts_per_iteration * config.keep
    # The trained-on samples are always on the T_train grid: regenerated, or the rollout itself.
    adaptive = schedule_counts(config)  # per group: explorer sample-steps and drafts scored
    rows, scored = ((config.prompts_per_iteration * adaptive[0], config.prompts_per_iteration * adaptive[1])
                    if adaptive else (None, 0))
    flops = stage_flops(config, counts, explored, rollout_steps(config), kept, train_steps(config), evaluated=True,
                        explore_rows=rows, scored_drafts=scored)
    hours = stage_hours(device_model(config), flops)
    return {"stages": {stage: hours[stage] for stage in TRAINING_STAGES},
            "total": sum(hours[stage] for stage in TRAINING_STAGES), "evaluate": hours["evaluate"],
            "flops_per_sample": {"policy_forward": counts.policy_forward.total,
                                 "explorer_forward": counts.explorer_forward.total,
                                 "explorer_forward_low_precision": counts.explorer_forward.low,
                                 "reference_forward": counts.reference_forward.total,
                                 "trained_forward_backward": counts.trained_forward_backward.total},
            "device": config.accounting.device, "utilization": config.accounting.utilization}
