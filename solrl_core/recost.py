"""The runs of a comparison re-costed under another device profile (SPEC §9): one set of runs, the
speed-up under each cost model.

A comparison sizes its budget on the runs' own profile. Every iteration's metrics.jsonl record
holds the FLOPs of each stage, so its GPU-hours under any other profile follow from the accounting
module's DeviceModel without training again. Light on imports (config and accounting only), so the
CLI checks a profile before it loads the training stack.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from solrl_core.accounting import TRAINING_STAGES, Flops, device_model, profile_problem, stage_hours
from solrl_core.config import Config, ConfigError
from solrl_core.ledger import METRICS_FILE


def default_also_profiles(device: str) -> list[str]:
    """The profiles a comparison re-costs its runs under unless told: the calibrated B200 profile
    beside the peak-FLOP one, so a B200 comparison reports both cost models."""
    return ["B200-measured"] if device == "B200" else []


def check_also_profiles(variants: dict[str, Config], profiles: list[str] | None) -> list[str]:
    """The profiles to re-cost under (the runs' own left out); one that cannot cost a variant's
    explorer (an unknown name, FP4 on Hopper) is a ConfigError before anything trains."""
    first = next(iter(variants.values()))
    chosen = default_also_profiles(first.accounting.device) if profiles is None else profiles
    chosen = [profile for profile in dict.fromkeys(chosen) if profile != first.accounting.device]
    for profile in chosen:
        for name, config in variants.items():
            problem = profile_problem(profile, config.explore.backend)
            if problem is not None:
                raise ConfigError(f"--also-profile {profile} for {name}: {problem}")
    return chosen


def on_profile(config: Config, device: str) -> Config:
    changed = copy.deepcopy(config)
    changed.accounting.device = device
    return changed


def recosted_hours(run_dir: Path, config: Config, estimate: dict, device: str) -> dict[int, float]:
    """Cumulative GPU-hours after each iteration of a finished run, re-costed under ``device``.

    From the FLOPs per stage (totals) that metrics.jsonl records for every iteration, through the
    accounting module's DeviceModel, so the formula lives in one place. Only the explorer's FLOPs
    have a low-precision part; its share is the run's per-sample one (``estimate``), which a
    calibrated profile (a share of the same FLOPs at BF16) does not even need. The base is at 0.
    """
    model = device_model(on_profile(config, device))
    per_sample = estimate["flops_per_sample"]
    low_share = (per_sample["explorer_forward_low_precision"] / per_sample["explorer_forward"]
                 if per_sample["explorer_forward"] else 0.0)
    hours, cumulative = {-1: 0.0}, 0.0
    for line in (run_dir / METRICS_FILE).read_text().splitlines():
        record = json.loads(line)
        if "flops" not in record:
            raise ConfigError(f"{run_dir / METRICS_FILE} records no FLOPs per stage (an older run); delete {run_dir} "
                              f"and run the comparison again to re-cost it under {device}")
        flops = {stage: Flops(high=int(record["flops"][stage])) for stage in TRAINING_STAGES}
        low = round(record["flops"]["explore"] * low_share)
        flops["explore"] = Flops(low=low, high=int(record["flops"]["explore"]) - low)
        cumulative += sum(stage_hours(model, flops).values())
        hours[record["iteration"]] = cumulative
    return hours
