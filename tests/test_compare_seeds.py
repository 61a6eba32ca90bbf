"""The comparison across run seeds and cost profiles: mean ± SE, interpolation onto a common grid and
the speed-up from per-seed crossing times on constructed curves whose answers are known, re-costing a run's recorded
FLOPs under another device profile, and one tiny `solrl compare --seeds 0,1` end to end."""

from __future__ import annotations

import json
import math

import pytest

from solrl_core import seed_stats
from flows.cli import main
from solrl_core.compare_markdown import speedup_text
from solrl_core.speedup import SEEDS_NEVER_REACHED, threshold_speedup
from solrl_core.config import parse_override
from solrl_core.presets import resolve_config
from solrl_core.recost import recosted_hours

LINEAR = [(0.0, 0.1), (1.0, 0.2), (2.0, 0.3), (3.0, 0.4), (4.0, 0.5)]  # +0.1 reward per GPU-hour
FAST = [(hours / 4, reward) for hours, reward in LINEAR]  # the same gains in a quarter of the GPU-hours
FLAT = [(hours, 0.1) for hours, _ in FAST]  # never improves, on FAST's grid


# ---------------------------------------------------------------------------------------------
# Mean, standard error, grids


def test_mean_and_standard_error_across_seeds():
    mean, se = seed_stats.mean_se([1.0, 2.0, 3.0])
    assert mean == 2.0 and se == pytest.approx(1 / math.sqrt(3))  # sample SD 1, over sqrt(3)
    assert seed_stats.mean_se([0.4]) == (0.4, None)  # one seed: no standard error


def test_interpolation_is_linear_between_evaluations_and_never_extrapolates():
    curve = [(0.0, 0.0), (2.0, 1.0), (4.0, 1.0)]
    assert seed_stats.on_grid(curve, [0.0, 1.0, 2.0, 3.0, 4.0]) == pytest.approx([0.0, 0.5, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="outside"):
        seed_stats.interpolate(curve, 4.5)


def test_seeds_on_one_grid_average_point_by_point():
    result = seed_stats.mean_curve([[(0.0, 0.1), (1.0, 0.3)], [(0.0, 0.1), (1.0, 0.5)]])
    assert not result["interpolated"] and result["gpu_hours"] == [0.0, 1.0]
    assert result["mean"] == pytest.approx([0.1, 0.4])
    assert result["se"] == pytest.approx([0.0, 0.1])  # two seeds: SE = |a - b| / 2


def test_seeds_on_different_grids_are_interpolated_up_to_the_shortest():
    result = seed_stats.mean_curve([[(0.0, 0.0), (1.0, 1.0), (2.0, 2.0)], [(0.0, 0.0), (1.5, 3.0)]])
    assert result["interpolated"] and result["gpu_hours"] == [0.0, 1.0, 1.5]
    assert result["mean"] == pytest.approx([0.0, (1.0 + 2.0) / 2, (1.5 + 3.0) / 2])


def test_families_share_a_grid_only_when_their_iteration_costs_match():
    same = [[(0.0, 0.1), (1.0, 0.2)], [(0.0, 0.1), (1.0 + 1e-12, 0.4)]]  # float noise of the same costs
    assert seed_stats.common_grid(same, 4) == ([0.0, 1.0], False)
    grid, interpolated = seed_stats.common_grid([[(0.0, 0.0), (2.0, 2.0)], [(0.0, 0.0), (1.0, 1.0), (3.0, 3.0)]], 4)
    assert interpolated and grid == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])  # ends where the shortest ends


# ---------------------------------------------------------------------------------------------
# The speed-up at a declared share of the baseline's gain, from each seed's curve


def test_identical_seeds_give_the_exact_speedup_and_a_zero_width_interval():
    result = threshold_speedup([LINEAR, LINEAR, LINEAR], [FAST, FAST, FAST], 0.5)
    assert result["speedup"] == pytest.approx(4.0) and result["ci"] == pytest.approx([4.0, 4.0])
    assert result["target_reward"] == pytest.approx(0.3) and result["never_reached"] == {"baseline": 0, "candidate": 0}


def test_a_seed_that_never_reaches_the_share_leaves_the_speedup_undefined():
    result = threshold_speedup([LINEAR, LINEAR], [FAST, FLAT], 0.5)
    assert result["speedup"] is None and result["ci"] is None and result["never_reached"]["candidate"] == 1
    # compare.json keeps the reason in full; the tables' cell says it in a few words.
    assert result["note"] == SEEDS_NEVER_REACHED and speedup_text(result).startswith("not reached by every seed")


def test_seed_spread_widens_the_interval_around_the_geometric_mean():
    slower = [(hours / 2, reward) for hours, reward in LINEAR]
    result = threshold_speedup([LINEAR, LINEAR], [FAST, slower], 0.5)
    assert result["speedup"] == pytest.approx(math.sqrt(4.0 * 2.0))  # geometric mean of 4x and 2x
    assert result["ci"][0] < result["speedup"] < result["ci"][1] and result["p"] is not None


def test_one_seed_gives_a_point_and_no_interval():
    result = threshold_speedup([LINEAR], [FAST], 0.5)
    assert result["speedup"] == pytest.approx(4.0) and result["ci"] is None
    assert speedup_text(result) == "4.00x"


# ---------------------------------------------------------------------------------------------
# Re-costing a run's recorded FLOPs


def write_metrics(run_dir, records):
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_recosting_charges_the_explorer_per_profile(tmp_path):
    config = resolve_config("shapes-tiny", "sol_rl")  # emulated NVFP4 explorer, B200, utilisation 0.4
    flops = {"explore": 1.0e15, "rank": 0, "regenerate": 2.0e14, "update": 3.0e14, "requantize": 1.0e12,
             "evaluate": 9.0e15}
    write_metrics(tmp_path / "run", [{"iteration": 0, "flops": flops}, {"iteration": 1, "flops": flops}])
    # 80% of the explorer's FLOPs are in its quantized layers.
    estimate = {"flops_per_sample": {"explorer_forward": 100, "explorer_forward_low_precision": 80}}
    second = 3600 * 1e12 * 0.4
    others = (2.0e14 + 3.0e14 + 1.0e12) / 2250 / second  # BF16 in both profiles; evaluation is not charged
    peak = recosted_hours(tmp_path / "run", config, estimate, "B200")
    assert peak[-1] == 0.0
    assert peak[0] == pytest.approx((0.8e15 / 9000 + 0.2e15 / 2250) / second + others)
    assert peak[1] == pytest.approx(2 * peak[0])
    measured = recosted_hours(tmp_path / "run", config, estimate, "B200-measured")
    assert measured[0] == pytest.approx(1.0e15 * 0.46 / 2250 / second + others)  # the calibrated explorer step


def test_a_run_without_recorded_flops_cannot_be_recosted(tmp_path):
    from solrl_core.config import ConfigError

    write_metrics(tmp_path / "old", [{"iteration": 0}])
    estimate = {"flops_per_sample": {"explorer_forward": 1, "explorer_forward_low_precision": 1}}
    with pytest.raises(ConfigError, match="records no FLOPs"):
        recosted_hours(tmp_path / "old", resolve_config("shapes-tiny", "sol_rl"), estimate, "B200-measured")


# ---------------------------------------------------------------------------------------------
# The CLI


@pytest.mark.parametrize("arguments, message", [
    (["--seeds", "0,0"], "each seed once"),
    (["--seeds", "a,b"], "--seeds"),
    (["--seeds", "-1"], "--seeds"),
    (["--seeds", ","], "--seeds"),
    (["--also-profile", "B300"], "--also-profile"),
    (["--also-profile", "H100"], "no FP4"),  # the quantized families' explorer has no FP4 peak there
])
def test_seed_and_profile_errors_are_one_line_exit_2(tmp_path, capsys, arguments, message):
    out = tmp_path / "cmp"
    assert main(["compare", "--out", str(out), "--budget-gpu-hours", "1e-6", *arguments]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error
    assert not out.exists()


def test_seeds_refuse_a_folder_holding_a_single_seed_run(tmp_path, capsys):
    variant = tmp_path / "cmp" / "runs" / "sol_rl"
    variant.mkdir(parents=True)
    (variant / "summary.json").write_text("{}")
    assert main(["compare", "--families", "sol_rl", "--seeds", "0,1", "--budget-gpu-hours", "1e-6",
                 "--out", str(tmp_path / "cmp"), "-S", "progress=false"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "single-seed run" in error
    assert sorted(p.name for p in variant.iterdir()) == ["summary.json"]


TINY = ["-S", "prompts_per_iteration=1", "-S", "eval.prompts=2", "-S", "eval.steps=3", "-S", "explore.steps=2",
        "-S", "regenerate.steps=3", "-S", "train.timestep_fraction=0.34", "-S", "progress=false"]


def test_compare_with_two_seeds_reports_means_intervals_and_both_cost_profiles(tmp_path):
    from flows.compare import compare_finished_runs
    from solrl_core.stages import modeled_iteration_hours

    # Attention quantized too (min_dim 0): the explorer's FP4 share is then large enough that its
    # peak-FLOP cost is below the calibrated 0.46 of a BF16 step (the re-costing check below).
    tiny = [*TINY, "-S", "quant.min_dim=0"]
    sol = resolve_config("shapes-tiny", "sol_rl", [parse_override(text) for text in tiny[1::2]])
    budget = 1.01 * modeled_iteration_hours(sol)["total"]  # one sol_rl iteration per seed
    out = tmp_path / "cmp"
    args = ["compare", "--families", "diffusionnft,naive_quant,sol_rl", "--seeds", "0,1", "--budget-gpu-hours",
            f"{budget!r}", "--evaluations", "1", "--out", str(out), *tiny]
    assert main(args) == 0
    report = json.loads((out / "compare.json").read_text())
    assert report["seeds"] == [0, 1] and "--seeds 0,1" in report["command"]
    for name, entry in report["families"].items():
        assert [run["run_dir"] for run in entry["runs"]] == [f"runs/{name}/seed-0", f"runs/{name}/seed-1"]
        summaries = [json.loads((out / run["run_dir"] / "summary.json").read_text()) for run in entry["runs"]]
        assert [s["config"]["seed"] for s in summaries] == [0, 1]
        assert summaries[0]["iterations"] == summaries[1]["iterations"] == entry["iterations"]  # one budget
        finals = [run["final_reward"] for run in entry["runs"]]
        assert entry["final_reward"] == pytest.approx(sum(finals) / 2)
        assert entry["final_reward_se"] == pytest.approx(abs(finals[0] - finals[1]) / 2)
        assert entry["curve"][-1]["reward_se"] == pytest.approx(entry["final_reward_se"])
        assert entry["modeled_gpu_hours_used"] <= budget
    # The seed is the run's: two seeds of one family explore different noises.
    explore = [[json.loads(line)["explore_reward_mean"] for line in (out / "runs/sol_rl" / seed / "metrics.jsonl")
                .read_text().splitlines()] for seed in ("seed-0", "seed-1")]
    assert explore[0] != explore[1]

    statistics = report["seed_statistics"]
    assert set(statistics["profiles"]) == {"B200", "B200-measured"} and statistics["method"]["holm"]["primary"] >= 3
    for profile in ("B200", "B200-measured"):
        headline = report["speedup_by_profile"][profile]
        assert headline["speedup"] is None or headline["ci"] is None or len(headline["ci"]) == 2
    difference = report["naive_quant_minus_sol_rl"]
    assert difference["mean"] == pytest.approx(report["families"]["naive_quant"]["final_reward"]
                                               - report["families"]["sol_rl"]["final_reward"])
    assert difference["ci"][0] <= difference["mean"] <= difference["ci"][1]
    assert difference["verdict"] in ("resolved", "not resolved") and "paired" in difference  # seeds 0, 1 both
    # The evaluation set's SE is in the final's interval, scored per image for every compared pair.
    assert difference["extra_se"] == pytest.approx(
        report["final_reward_spread"]["paired_differences"]["naive_quant - sol_rl"]["se"])
    # Restating the report from its own per-seed curves gives back its statistics.
    from solrl_core.compare import restate_report

    restated = restate_report(report)
    for pair, entry in statistics["final_differences"].items():
        again = restated["seed_statistics"]["final_differences"][pair]
        assert again["ci"] == pytest.approx(entry["ci"]) and again["verdict"] == entry["verdict"]
    for profile, entry in report["speedup_by_profile"].items():
        assert restated["speedup_by_profile"][profile]["speedup"] == pytest.approx(entry["speedup"])
    # Re-costed: diffusionnft runs no FP4, so its hours are the same under both profiles; sol_rl's
    # explorer costs 0.46 of a BF16 step instead of its (smaller) FP4 peak share, so it used more.
    own, measured = statistics["profiles"]["B200"]["families"], statistics["profiles"]["B200-measured"]["families"]
    assert measured["diffusionnft"]["gpu_hours_used"] == pytest.approx(own["diffusionnft"]["gpu_hours_used"])
    assert measured["sol_rl"]["gpu_hours_used"] > own["sol_rl"]["gpu_hours_used"]
    # Re-costing under the runs' own profile gives back exactly what they recorded.
    run = out / "runs/sol_rl/seed-1"
    recorded = [json.loads(line)["modeled_gpu_hours_cumulative"] for line in (run / "metrics.jsonl").read_text()
                .splitlines()]
    again = recosted_hours(run, sol, modeled_iteration_hours(sol), "B200")
    assert [again[i] for i in range(len(recorded))] == pytest.approx(recorded, rel=1e-9)

    table = (out / "compare.md").read_text()
    assert "B200-measured (re-costed)" in table and "95% interval" in table and "| naive_quant - sol_rl |" in table
    assert "re-costed" in (out / "README.md").read_text()
    # The finished seed runs compare again without training (the pipeline's way in), to the same numbers.
    again = compare_finished_runs(out / "runs", tmp_path / "again", budget)
    assert {name: entry["final_reward"] for name, entry in again["families"].items()} == pytest.approx(
        {name: entry["final_reward"] for name, entry in report["families"].items()})
    assert again["speedup_by_profile"] == report["speedup_by_profile"]
    assert main(args) == 0
    assert all(e["reused_finished_run"] for e in json.loads((out / "compare.json").read_text())["families"].values())


def test_a_stopped_comparison_resumes_its_run_from_the_last_checkpoint(tmp_path, capsys, monkeypatch):
    from solrl_core import faults
    from solrl_core.stages import modeled_iteration_hours

    sol = resolve_config("shapes-tiny", "sol_rl", [parse_override(text) for text in TINY[1::2]])
    budget = 2.01 * modeled_iteration_hours(sol)["total"]  # two iterations
    out = tmp_path / "cmp"
    args = ["compare", "--families", "sol_rl", "--seeds", "3", "--budget-gpu-hours", f"{budget!r}",
            "--evaluations", "1", "--also-profile", "none", "--out", str(out), *TINY]
    monkeypatch.setenv(faults.ENVIRONMENT, "raise@explore:1")
    faults.reset()
    try:
        assert main(args) == 1
    finally:
        monkeypatch.delenv(faults.ENVIRONMENT)
        faults.reset()
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "run the same command again" in error
    run = out / "runs/sol_rl/seed-3"
    assert (run / "checkpoint.safetensors").is_file() and not (run / "summary.json").exists()
    assert main(args) == 0
    assert "resuming the interrupted run" in capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from_iteration"] == 1 and summary["config"]["seed"] == 3
    assert [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    report = json.loads((out / "compare.json").read_text())
    assert report["seeds"] == [3] and "seed_statistics" in report and len(report["grid"]) == 2


def test_sol_rl_adaptive_is_reported_beside_sol_rl_with_its_interval(tmp_path):
    from flows.compare import compare_finished_runs
    from solrl_core.stages import modeled_iteration_hours

    tiny = [*TINY, "-S", "explore.steps=3"]  # the adaptive schedule scores drafts at steps 1 and 2
    sol = resolve_config("shapes-tiny", "sol_rl", [parse_override(text) for text in tiny[1::2]])
    budget = 1.01 * modeled_iteration_hours(sol)["total"]
    out = tmp_path / "cmp"
    assert main(["compare", "--families", "diffusionnft,sol_rl,sol_rl_adaptive", "--seeds", "0,1",
                 "--budget-gpu-hours", f"{budget!r}", "--evaluations", "1", "--out", str(out), *tiny]) == 0
    report = json.loads((out / "compare.json").read_text())
    by_family = report["speedups_by_family"]
    assert set(by_family) == {"sol_rl", "sol_rl_adaptive"} and by_family["sol_rl"] == report["speedup_by_profile"]
    for profile in report["seed_statistics"]["profiles"]:
        entry = by_family["sol_rl_adaptive"][profile]
        assert entry == report["seed_statistics"]["speedups"][profile]["sol_rl_adaptive"]["threshold"]
    assert "sol_rl_adaptive - sol_rl" in report["seed_statistics"]["final_differences"]
    table = (out / "compare.md").read_text()
    assert "| B200 (sized the budget) | sol_rl |" in table and "| B200 (sized the budget) | sol_rl_adaptive |" in table
    assert "| sol_rl_adaptive - sol_rl |" in table
    # From the finished runs (the DVC study's and the sweep's way in): the families in FAMILIES' order.
    again = compare_finished_runs(out / "runs", tmp_path / "again", budget)
    assert list(again["families"]) == ["diffusionnft", "sol_rl", "sol_rl_adaptive"]
    assert again["speedups_by_family"] == by_family
