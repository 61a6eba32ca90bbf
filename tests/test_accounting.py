"""Compute accounting (SPEC §9): device peaks, FLOP counting, per-stage precision, metrics fields."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from solrl_core import stages
from solrl_core.accounting import (
    DEVICE_PROFILES,
    DeviceModel,
    Flops,
    count_flops,
    count_sample_flops,
)
from solrl_core.config import ConfigError
from solrl_core.presets import resolve_config
from solrl_core.stages import modeled_iteration_hours
from solrl_core.training import run_training

SMALL = [("prompts_per_iteration", 2), ("pool", 8), ("keep", 4), ("eval.prompts", 2), ("eval.steps", 3),
         ("explore.steps", 3), ("regenerate.steps", 4), ("progress", False)]


def test_device_profiles_carry_the_spec_peaks():
    assert DEVICE_PROFILES["B200"] == {"bf16": 2250.0, "fp8": 4500.0, "fp4": 9000.0}
    for hopper in ("H100", "H200"):
        assert DEVICE_PROFILES[hopper] == {"bf16": 989.0, "fp8": 1979.0, "fp4": None}


def test_hours_divide_flops_by_peak_times_utilisation():
    one_hour_bf16 = int(2250e12 * 0.5 * 3600)
    model = DeviceModel("B200", utilization=0.5)
    assert model.hours(Flops(high=one_hour_bf16)) == pytest.approx(1.0)
    assert model.hours(Flops(low=one_hour_bf16), "fp4") == pytest.approx(0.25)
    assert model.hours(Flops(low=one_hour_bf16), "fp8") == pytest.approx(0.5)
    with pytest.raises(ValueError):
        DeviceModel("H100").hours(Flops(low=1), "fp4")


def test_the_measured_profile_reproduces_the_papers_explore_to_rollout_ratio():
    """SPEC §10: on SD3.5-L the 96 x 6 FP4 exploration took 125 s against 451 s for the 96 x 10
    BF16 rollout; the measured profile charges an explorer step 0.46 of a BF16 step of the same
    FLOPs (whatever share of them is quantized), where the peak profile says 0.25."""
    step = Flops(low=int(9e14), high=int(1e14))
    measured, peak = DeviceModel("B200-measured", utilization=0.4), DeviceModel("B200", utilization=0.4)
    explore = measured.hours(step * (96 * 6), "fp4")
    rollout = measured.hours(step * (96 * 10))
    assert explore / rollout == pytest.approx(125 / 451, rel=0.01)
    assert rollout == pytest.approx(peak.hours(step * (96 * 10)))
    assert peak.hours(step, "fp4") < measured.hours(step, "fp4")


def test_counted_flops_split_by_module():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
    flops = count_flops(lambda: model(torch.zeros(4, 16)), quantized_layers=frozenset({"0"}))
    assert flops.low == 2 * 4 * 16 * 32
    assert flops.high == 2 * 4 * 32 * 8


def test_cpu_attention_is_counted():
    q = k = v = torch.zeros(1, 2, 10, 8)
    flops = count_flops(lambda: F.scaled_dot_product_attention(q, k, v))
    assert flops.total == 2 * (2 * 2 * 10 * 8 * 10)  # q @ k^T and scores @ v


@pytest.fixture(scope="module")
def sol_rl_state():
    state = stages.initial_state(resolve_config("shapes-tiny", "sol_rl", SMALL))
    stages.quantize(state)
    return state


def test_sample_flops_on_the_real_model(sol_rl_state):
    counts = count_sample_flops(sol_rl_state)
    # The explorer quantizes most of the compute; attention and skipped layers stay high precision.
    assert 0.5 < counts.explorer_forward.low / counts.explorer_forward.total < 1.0
    assert counts.policy_forward.low == 0
    assert counts.reference_forward.total < counts.policy_forward.total  # no LoRA matmuls
    assert 1.5 < counts.trained_forward_backward.total / counts.policy_forward.total < 3.5
    # Counting leaves no gradient behind.
    assert all(p.grad is None for p in sol_rl_state.policy.transformer.parameters())


def test_explore_stage_is_charged_at_the_explorer_precision():
    hours = {}
    for backend in ("emulated-nvfp4", "fp8", "none"):
        config = resolve_config("shapes-tiny", "sol_rl", SMALL + [("explore.backend", backend)])
        hours[backend] = modeled_iteration_hours(config)["stages"]
    assert hours["emulated-nvfp4"]["explore"] < hours["fp8"]["explore"] < hours["none"]["explore"]
    assert hours["emulated-nvfp4"]["update"] == pytest.approx(hours["none"]["update"])  # always BF16


def test_sol_rl_iteration_costs_less_than_naive_scaling():
    sol = modeled_iteration_hours(resolve_config("shapes-tiny", "sol_rl", SMALL))
    naive = modeled_iteration_hours(resolve_config("shapes-tiny", "naive_scaling", SMALL))
    assert sol["total"] < naive["total"]
    assert sol["stages"]["regenerate"] > 0 and naive["stages"]["regenerate"] == 0


@pytest.mark.parametrize("override, message", [
    (("accounting.device", "A100"), "unknown accounting.device"),
    (("accounting.device", "H100"), "no FP4"),
    (("accounting.utilization", 0.0), "accounting.utilization"),
])
def test_accounting_config_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config("shapes-tiny", "sol_rl", [override])


def test_hopper_profile_models_the_fp8_explorer():
    config = resolve_config("shapes-tiny", "sol_rl", [("accounting.device", "H100"), ("explore.backend", "fp8")])
    assert config.accounting.device == "H100"


def test_metrics_carry_modeled_and_measured_gpu_hours(tmp_path):
    config = resolve_config("shapes-tiny", "sol_rl", SMALL + [("iterations", 2), ("eval.every", 2)])
    run_training(config, tmp_path, log=lambda line: None)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        modeled = record["modeled_gpu_hours"]
        assert set(modeled) == {"explore", "rank", "regenerate", "update", "requantize", "total"}
        assert modeled["total"] == pytest.approx(sum(v for k, v in modeled.items() if k != "total"))
        assert record["gpu_hours"] is None and record["gpu_hours_cumulative"] is None  # not on CUDA
        assert record["seconds"]["total"] > 0  # measured wall-clock beside the modeled hours
    assert records[1]["modeled_gpu_hours_cumulative"] == pytest.approx(
        records[0]["modeled_gpu_hours"]["total"] + records[1]["modeled_gpu_hours"]["total"])
    assert records[0]["modeled_gpu_hours_evaluate"] == 0 < records[1]["modeled_gpu_hours_evaluate"]
