"""Compute accounting (SPEC §9): device peaks, FLOP counting, per-stage precision, metrics fields,
accounting.device=auto, measured GPU-hours, and profiles measured by the GPU check."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from solrl_core import accounting, stages
from solrl_core.accounting import (
    AUTO_PROFILE,
    DEVICE_PROFILES,
    DeviceModel,
    Flops,
    SampleFlops,
    count_flops,
    count_sample_flops,
    device_profile,
    iteration_hours,
    measured_gpu_hours,
)
from solrl_core.compare import profile_basis
from solrl_core.config import Config, ConfigError, to_dict
from solrl_core.tracking import flatten_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import gpu_check  # noqa: E402
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


# --- accounting.device=auto --------------------------------------------------------------------

# A run's per-sample FLOPs, made up: enough to compare profiles without loading the model.
COUNTS = SampleFlops(policy_forward=Flops(0, 10**12), explorer_forward=Flops(7 * 10**11, 3 * 10**11),
                     reference_forward=Flops(0, 9 * 10**11), trained_forward_backward=Flops(0, 3 * 10**12),
                     requantize=Flops(0, 10**9), decode=Flops(0, 10**10))


def test_auto_is_the_default_and_is_b200_on_a_cpu_so_cpu_runs_cost_what_they_did():
    assert Config().accounting.device == AUTO_PROFILE
    for family in ("sol_rl", "diffusionnft", "naive_scaling"):
        auto = resolve_config("shapes-tiny", family, SMALL)
        explicit = resolve_config("shapes-tiny", family, SMALL + [("accounting.device", "B200")])
        # Resolved with the config, so the saved config, MLflow's params and a resume read B200.
        assert auto.accounting.device == "B200" and to_dict(auto) == to_dict(explicit)
        assert iteration_hours(auto, COUNTS) == iteration_hours(explicit, COUNTS)


@pytest.fixture
def gpu(monkeypatch):
    """A mocked CUDA device of a given name and capability (there is no GPU here)."""
    state = {"name": "NVIDIA H100 80GB HBM3", "capability": (9, 0)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: state["capability"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: state["name"])
    accounting._warn_once.cache_clear()
    return state


@pytest.mark.parametrize("name, capability, expected", [
    ("NVIDIA H100 80GB HBM3", (9, 0), "H100"), ("NVIDIA H100 PCIe", (9, 0), "H100"),
    ("NVIDIA H200", (9, 0), "H200"), ("NVIDIA B200", (10, 0), "B200"),
])
def test_auto_on_a_gpu_is_its_profile_by_name_and_capability(gpu, capsys, name, capability, expected):
    gpu.update(name=name, capability=capability)
    config = resolve_config("shapes-tiny", "sol_rl", [("model.device", "cuda"), ("explore.backend", "fp8")])
    assert config.accounting.device == expected
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("name, capability", [("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA H100 (renamed)", (8, 9)),
                                              ("NVIDIA B300", (10, 3))])
def test_auto_on_a_gpu_without_a_profile_is_b200_and_says_so_in_one_line(gpu, capsys, name, capability):
    gpu.update(name=name, capability=capability)
    config = resolve_config("shapes-tiny", "sol_rl", [("model.device", "cuda"), ("explore.backend", "fp8")])
    assert config.accounting.device == "B200"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("solrl: warning: accounting.device auto")
    assert name in err and "modeling GPU-hours on B200" in err
    resolve_config("shapes-tiny", "sol_rl", [("model.device", "cuda"), ("explore.backend", "fp8")])
    assert capsys.readouterr().err == ""  # once per process, not once per resolved config


def test_auto_models_an_fp4_explorer_on_a_hopper_at_b200_and_keeps_explicit_profiles(gpu, capsys):
    # emulated-nvfp4 stands in for Blackwell's FP4, which an H100 has no tensor cores for: the run
    # still starts, modeled on B200 with a warning, where an explicit H100 is the usual refusal.
    config = resolve_config("shapes-tiny", "sol_rl", [("model.device", "cuda")])  # emulated-nvfp4
    assert config.accounting.device == "B200" and "no FP4 tensor cores" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no FP4"):
        resolve_config("shapes-tiny", "sol_rl", [("model.device", "cuda"), ("accounting.device", "H100")])
    for explicit in ("B200", "B200-measured"):
        assert resolve_config("shapes-tiny", "sol_rl", [("model.device", "cuda"), ("explore.backend", "fp8"),
                                                        ("accounting.device", explicit)]).accounting.device == explicit
    # A run pinned to the CPU on a GPU machine computes on the CPU: B200, as every CPU run.
    assert resolve_config("shapes-tiny", "sol_rl", [("model.device", "cpu")]).accounting.device == "B200"


# --- measured GPU-hours ------------------------------------------------------------------------


def test_measured_gpu_hours_are_wall_clock_times_gpus_and_reach_mlflow_only_when_measured():
    assert measured_gpu_hours(torch.device("cuda"), 5400.0) == 1.5  # one process, one GPU
    assert measured_gpu_hours(torch.device("cpu"), 5400.0) is None
    record = {"modeled_gpu_hours_cumulative": 2e-6, "gpu_hours": 1.5, "gpu_hours_cumulative": 3.0}
    assert {"gpu_hours", "gpu_hours_cumulative", "modeled_gpu_hours_cumulative"} <= set(flatten_metrics(record))
    on_cpu = flatten_metrics({**record, "gpu_hours": None, "gpu_hours_cumulative": None})
    assert set(on_cpu) == {"modeled_gpu_hours_cumulative"}  # nothing logged where nothing was measured


# --- accounting.device=gpu-check:PATH ----------------------------------------------------------


def gpu_check_report(mode="gpu", gpu="NVIDIA H100 80GB HBM3", capability="sm_90", speedups=None, status="ok"):
    """The parts of benchmarks/gpu_check.py's JSON that a measured profile reads, in its layout."""
    speedups = {"fp8": 1.6, "emulated-nvfp4": 0.8} if speedups is None else speedups
    compiled = "compiled per block"
    variants = {name: {"ms": round(100.0 / speedup, 4), "mode": compiled, "peak_gib": 40.0} for name, speedup in speedups.items()}
    variants["te-nvfp4"] = {"skipped": "explore.backend te-nvfp4 cannot run here"}
    transformer = {"status": status, "seconds": 30.0}
    if status == "ok":
        transformer["result"] = {"bf16": {compiled: {"ms": 100.0, "mode": compiled, "peak_gib": 38.0}},
                                 "variants": variants, "speedup_vs_bf16": speedups}
    else:
        transformer.update(error="RuntimeError: out of memory", traceback="...")
    return {"mode": mode, "environment": {"gpu": gpu, "capability": capability, "gpu_memory_gib": 79.1},
            "explorer_target": "fp8", "sections": {"transformer": transformer}}


def write_report(tmp_path, report) -> str:
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps(report))
    return f"gpu-check:{path}"


def test_a_gpu_checks_json_is_a_profile_with_the_fp8_step_it_measured(tmp_path):
    report = gpu_check_report()
    assert gpu_check._transformer_speedup("fp8")(report) == 1.6  # the check's own reader agrees on the layout
    name = write_report(tmp_path, report)
    profile = device_profile(name)
    assert profile.peaks == DEVICE_PROFILES["H100"] and profile.capability == (9, 0)
    assert profile.step_costs == {"fp8": pytest.approx(1 / 1.6)}  # emulated NVFP4's bf16 GEMMs measure no FP4
    assert profile.basis("fp8") == "measured (the GPU check's forwards in gpu_check.json)"
    assert device_profile("H100").basis("fp8") == "peak ratio"
    # An explorer step costs the measured share of the same FLOPs at BF16; BF16 stages as on H100.
    step, model = Flops(low=int(8e14), high=int(2e14)), DeviceModel(name, utilization=0.4)
    assert model.hours(step, "fp8") == pytest.approx(step.total / 1.6 / (989e12 * 0.4) / 3600)
    assert model.hours(step) == DeviceModel("H100", utilization=0.4).hours(step)
    config = resolve_config("shapes-tiny", "sol_rl", [("accounting.device", name), ("explore.backend", "fp8")])
    assert config.accounting.device == name  # the saved config says where the step cost came from
    assert "calibrated to the GPU check's forwards in gpu_check.json" in profile_basis(name, 0.4)
    with pytest.raises(ConfigError, match="no FP4"):  # H100 has no FP4, measured or not
        resolve_config("shapes-tiny", "sol_rl", [("accounting.device", name)])


@pytest.mark.parametrize("report, message", [
    (gpu_check_report(mode="rehearsal"), "rehearsal's CPU timings"),
    (gpu_check_report(status="error"), "transformer section did not finish"),
    (gpu_check_report(speedups={"emulated-nvfp4": 0.8}), "timed none of fp8, te-nvfp4"),
    (gpu_check_report(gpu="NVIDIA A100-SXM4-80GB", capability="sm_80"), "has no device profile"),
    ({"mode": "gpu"}, "not a GPU check's JSON"),
])
def test_a_gpu_check_that_measured_no_explorer_step_is_refused_in_one_line(tmp_path, report, message):
    with pytest.raises(ConfigError, match=message) as error:
        resolve_config("shapes-tiny", "sol_rl", [("accounting.device", write_report(tmp_path, report)),
                                                 ("explore.backend", "fp8")])
    assert "\n" not in str(error.value)
