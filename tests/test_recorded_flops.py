"""A run records the FLOPs per sample it counted on its model in summary.json, so a report rebuilt
from finished runs (and a comparison that finds its runs finished) costs them under any profile
without loading a model: on FLUX, loading 12 B parameters only to write a report."""

from __future__ import annotations

import json
import shutil

import pytest

from solrl_core import accounting, stages
from solrl_core.accounting import Flops, SampleFlops
from solrl_core.compare import finished_results, plan_variant, run_comparison
from solrl_core.config import parse_override
from solrl_core.presets import resolve_config

TINY = ["prompts_per_iteration=1", "eval.prompts=2", "eval.steps=3", "explore.steps=2", "regenerate.steps=3",
        "train.timestep_fraction=0.34", "progress=false"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One sol_rl run of one iteration, trained by `solrl compare`'s loop: (config, budget, out)."""
    config = resolve_config("shapes-tiny", "sol_rl", [parse_override(text) for text in TINY])
    budget = 1.01 * stages.modeled_iteration_hours(config)["total"]
    out = tmp_path_factory.mktemp("recorded") / "cmp"
    run_comparison({"sol_rl": config}, budget, out, evaluations=1, log=lambda line: None, also_profiles=[])
    return config, budget, out


@pytest.fixture
def no_model(monkeypatch):
    """Loading a policy or counting FLOPs on one fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded (or its FLOPs counted) to rebuild a report")

    monkeypatch.setattr(stages, "load_policy", refuse)
    monkeypatch.setattr(accounting, "count_sample_flops", refuse)


def test_the_summary_records_the_flops_per_sample_the_run_counted(finished):
    config, _, out = finished
    summary = json.loads((out / "runs/sol_rl/summary.json").read_text())
    state = stages.initial_state(config)
    stages.quantize(state)
    counted = accounting.count_sample_flops(state)
    assert SampleFlops.from_record(summary["flops_per_sample"]) == counted
    assert counted.explorer_forward.low > 0 and counted.trained_forward_backward.total > counted.policy_forward.total


def test_rebuilding_a_report_from_finished_runs_loads_no_model(finished, no_model, tmp_path):
    from flows.compare import compare_finished_runs

    config, budget, out = finished
    recorded = json.loads((out / "compare.json").read_text())["families"]["sol_rl"]
    rebuilt = compare_finished_runs(out / "runs", tmp_path / "again", budget)["families"]["sol_rl"]
    for key in ("modeled_gpu_hours_per_iteration", "modeled_gpu_hours_per_stage", "modeled_gpu_hours_used",
                "final_reward"):
        assert rebuilt[key] == pytest.approx(recorded[key], rel=1e-12), key
    # `solrl compare` run again over its finished runs: sized from their records, reused, nothing loaded.
    plan = plan_variant(config, out / "runs/sol_rl", budget, evaluations=1)
    assert plan["reused"] and plan["estimate"]["total"] == pytest.approx(recorded["modeled_gpu_hours_per_iteration"])


def test_a_summary_from_before_the_record_has_its_flops_counted_again(finished, tmp_path):
    """Older finished runs still report: their FLOPs are counted on the loaded model, as before."""
    _, _, out = finished
    runs = tmp_path / "runs"
    shutil.copytree(out / "runs", runs)
    summary_path = runs / "sol_rl/summary.json"
    summary = json.loads(summary_path.read_text())
    del summary["flops_per_sample"]
    summary_path.write_text(json.dumps(summary))
    (old,) = finished_results(runs)["sol_rl"]
    (new,) = finished_results(out / "runs")["sol_rl"]
    assert old["estimate"] == new["estimate"]


@pytest.mark.parametrize("record, problem", [
    ({"policy_forward": {"low": 0, "high": 1}}, "expected the FLOPs of the calls policy_forward, explorer_forward"),
    ({**SampleFlops(*[Flops(1, 2)] * 6).to_record(), "decode": {"low": -1, "high": 2}}, "decode: expected"),
    ({**SampleFlops(*[Flops(1, 2)] * 6).to_record(), "decode": {"low": 1.5, "high": 2}}, "decode: expected"),
])
def test_a_damaged_record_is_refused_saying_what_is_wrong(record, problem):
    with pytest.raises(ValueError, match=problem):
        SampleFlops.from_record(record)
    assert SampleFlops.from_record(SampleFlops(*[Flops(1, 2)] * 6).to_record()) == SampleFlops(*[Flops(1, 2)] * 6)
