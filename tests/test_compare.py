"""The equal-budget comparison: speed-up to equal reward on synthetic curves, budget sizing, the
report files, the ablation override sets, and one small comparison through the CLI."""

from __future__ import annotations

import json

import pytest

from solrl_core.ablations import ABLATIONS, ablation_overrides, main as ablations_main
from flows.cli import main
from solrl_core.compare import (first_crossing, markdown_table, plot_curves, restate_report, size_to_budget,
                                speedup_to_equal_reward)
from solrl_core.config import parse_override
from solrl_core.presets import resolve_config

LINEAR = [(0.0, 0.1), (1.0, 0.2), (2.0, 0.3), (3.0, 0.4), (4.0, 0.5)]  # +0.1 reward per GPU-hour


def test_first_crossing_interpolates_between_evaluations():
    assert first_crossing(LINEAR, 0.25) == pytest.approx(1.5)
    assert first_crossing(LINEAR, 0.1) == 0.0
    assert first_crossing(LINEAR, 0.5) == pytest.approx(4.0)
    assert first_crossing(LINEAR, 0.51) is None


def test_speedup_of_a_candidate_four_times_as_fast():
    candidate = [(hours / 4, reward) for hours, reward in LINEAR]
    result = speedup_to_equal_reward(LINEAR, candidate)
    assert result["speedup_to_equal_reward"] == pytest.approx(4.0)
    for fraction in ("0.25", "0.5", "0.75", "1"):
        assert result["at"][fraction]["speedup"] == pytest.approx(4.0)
    assert result["at"]["0.5"]["target_reward"] == pytest.approx(0.3)
    assert result["at"]["0.5"]["baseline_gpu_hours"] == pytest.approx(2.0)


def test_speedup_differs_along_the_gain_when_the_candidate_starts_fast():
    candidate = [(0.0, 0.1), (0.5, 0.3), (2.0, 0.5)]  # quick early gain, then slower
    result = speedup_to_equal_reward(LINEAR, candidate)
    assert result["at"]["0.5"]["speedup"] == pytest.approx(2.0 / 0.5)
    assert result["at"]["1"]["speedup"] == pytest.approx(4.0 / 2.0)


def test_baseline_peaking_early_counts_from_its_first_crossing():
    baseline = [(0.0, 0.1), (1.0, 0.5), (2.0, 0.4)]  # final 0.4, first reached at 0.75 h
    result = speedup_to_equal_reward(baseline, [(0.0, 0.1), (0.25, 0.4)])
    assert result["at"]["1"]["baseline_gpu_hours"] == pytest.approx(0.75)
    assert result["speedup_to_equal_reward"] == pytest.approx(3.0)


def test_no_speedup_when_the_candidate_never_gets_there_or_the_baseline_never_improves():
    slow = [(0.0, 0.1), (4.0, 0.2)]
    assert speedup_to_equal_reward(LINEAR, slow)["speedup_to_equal_reward"] is None
    flat = [(0.0, 0.3), (4.0, 0.2)]
    result = speedup_to_equal_reward(flat, LINEAR)
    assert result["speedup_to_equal_reward"] is None and "did not improve" in result["at"]["1"]["note"]


def test_budget_sizing_takes_whole_iterations_and_spreads_evaluations():
    config = resolve_config("shapes-tiny", "sol_rl")
    sized = size_to_budget(config, budget_gpu_hours=10.0, evaluations=3, iteration_hours=0.9)
    assert sized.iterations == 11 and sized.eval.every == 4
    assert size_to_budget(config, 1.0, 3, iteration_hours=0.25).iterations == 4  # exact fit, no float loss
    assert size_to_budget(config, 0.1, 3, iteration_hours=0.9).iterations == 1
    assert config.iterations != 11  # the input config is left alone


def synthetic_report() -> dict:
    """A two-family, one-seed compare.json, its statistics filled by the restating path (the one
    a committed report goes through)."""
    def family(curve, iterations):
        points = [{"iteration": round(h * iterations / curve[-1][0]) - 1, "modeled_gpu_hours": h, "reward": r,
                   "rewards": {"shapes-compliance": r, "shapes-aesthetic": 0.5}} for h, r in curve]
        return {"family": "x", "iterations": iterations, "modeled_gpu_hours_per_iteration": 1.0,
                "modeled_gpu_hours_used": curve[-1][0], "cpu_seconds": 10.0,
                "final_rewards": {"shapes-compliance": curve[-1][1], "shapes-aesthetic": 0.5},
                "final_reward": curve[-1][1], "base_rewards": {"shapes-compliance": 0.1, "shapes-aesthetic": 0.5},
                "curve": points, "seeds": [0], "runs": [{"seed": 0, "curve": points}]}

    candidate = [(h / 4, r) for h, r in LINEAR]
    report = {"preset": "shapes-tiny", "metric": "shapes-compliance", "budget_gpu_hours": 4.0,
              "device_profile": "B200", "utilization": 0.4, "seeds": [0],
              "families": {"diffusionnft": family(LINEAR, 4), "sol_rl": family(candidate, 16)}}
    report["families"]["diffusionnft"]["family"] = "diffusionnft"
    report["families"]["sol_rl"]["family"] = "sol_rl"
    return restate_report(report)


def test_markdown_table_and_plot(tmp_path):
    report = synthetic_report()
    assert report["speedup_to_equal_reward"] == pytest.approx(4.0)  # a time-scaled curve: the scale
    table = markdown_table(report)
    assert "| sol_rl | 16 |" in table and "4.00x" in table and "| diffusionnft | 4 |" in table
    plot_curves(report, tmp_path / "compare.png")
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"


def test_ablations_are_valid_sol_rl_configs(capsys):
    assert list(ABLATIONS["explore-steps"]) == ["2", "4", "6", "8"]
    assert list(ABLATIONS["pool"]) == ["24", "48", "72", "96"]
    for name, points in ABLATIONS.items():
        for point in points:
            config = resolve_config("shapes-tiny", "sol_rl", ablation_overrides(name, point))
            if name == "pool":
                assert (config.pool, config.keep) == (int(point), 24)
            else:
                assert config.explore.steps == int(point)
    assert ablations_main(["explore-steps", "4"]) == 0
    assert capsys.readouterr().out.split() == ["-S", "explore.steps=4"]
    assert ablations_main(["pool", "5"]) == 2


@pytest.mark.parametrize("arguments, message", [
    (["--budget-gpu-hours", "-1"], "--budget-gpu-hours"),
    ([], "--budget-gpu-hours"),
    (["--budget-gpu-hours", "1e-6", "--families", "sol_rl,grpo"], "grpo"),
    (["--budget-gpu-hours", "1e-6", "--ablation", "lr"], "--ablation"),
    (["--budget-gpu-hours", "1e-6", "--device", "H100"], "no FP4"),
])
def test_compare_cli_errors_are_one_line_exit_2(tmp_path, capsys, arguments, message):
    out = tmp_path / "cmp"
    assert main(["compare", "--out", str(out), *arguments]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error
    assert not out.exists()


# Small, but each family keeps its own pool and keep (SPEC section 5).
TINY = ["-S", "prompts_per_iteration=1", "-S", "eval.prompts=2", "-S", "eval.steps=3", "-S", "explore.steps=2",
        "-S", "regenerate.steps=3", "-S", "train.timestep_fraction=0.34", "-S", "progress=false"]


def test_compare_cli_runs_every_family_through_one_loop(tmp_path):
    from solrl_core.stages import modeled_iteration_hours

    # A budget of one sol_rl iteration: every family gets the same modeled GPU-hours.
    sol = resolve_config("shapes-tiny", "sol_rl", [parse_override(text) for text in TINY[1::2]])
    budget = 1.01 * modeled_iteration_hours(sol)["total"]
    out = tmp_path / "cmp"
    args = ["compare", "--families", "diffusionnft,naive_quant,sol_rl", "--budget-gpu-hours", f"{budget!r}",
            "--evaluations", "1", "--out", str(out), *TINY]
    assert main(args) == 0
    report = json.loads((out / "compare.json").read_text())
    assert set(report["families"]) == {"diffusionnft", "naive_quant", "sol_rl"}
    assert report["families"]["sol_rl"]["iterations"] == 1
    for entry in report["families"].values():
        assert entry["modeled_gpu_hours_used"] <= budget
        assert entry["curve"][0]["modeled_gpu_hours"] == 0.0
        assert entry["base_rewards"] == report["families"]["sol_rl"]["base_rewards"]  # one base, one eval set
    assert "speedup_to_equal_reward" in report and set(report["speedups"]["sol_rl"]["at"]) == {
        "0.25", "0.5", "0.75", "1"}
    # One seed a family: every difference is stated, none is resolved (no interval from one seed).
    difference = report["seed_statistics"]["final_differences"]["naive_quant - sol_rl"]
    assert difference["ci"] is None and difference["verdict"] == "undefined"
    assert report["paper"]["speedup_to_equal_reward"]["FLUX.1"] == 3.00  # the paper's figures beside ours
    assert len(report["grid"]) == 2 and set(report["grid"][0]["rewards"]) == {
        "base", "diffusionnft", "naive_quant", "sol_rl"}
    for name in ("compare.png", "compare.md", "samples_grid.png", "README.md"):
        assert (out / name).stat().st_size > 0
    # A second call reads the finished runs back instead of training again.
    assert main(args) == 0
    assert all(e["reused_finished_run"] for e in json.loads((out / "compare.json").read_text())["families"].values())
    # The pipeline's way in, from the finished single-seed runs, gives the same comparison.
    from flows.compare import compare_finished_runs

    again = compare_finished_runs(out / "runs", tmp_path / "again", budget)
    assert {name: entry["final_reward"] for name, entry in again["families"].items()} == {
        name: entry["final_reward"] for name, entry in report["families"].items()}
