"""The DVC study's params (flows/study.py): params.yaml is the whole study (five families and
sol_rl with the FP8 explorer x three seeds, the paper's ablation points, each run a valid config),
params-ci.yaml the same study reduced, bad params stop a stage with one line and exit code 2,
writing nothing, and a family variant trains and is compared as its family with its own keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from flows.study import ablation_config, family_config, family_of, load_study, main
from solrl_core.ablations import ABLATION_KEYS, ABLATIONS
from solrl_core.config import get_key
from solrl_core.presets import FAMILIES
from tests._services import ROOT


def test_params_yaml_is_the_whole_study_and_every_run_of_it_resolves():
    study = load_study(ROOT / "params.yaml")
    assert [name for name in study.families if name in FAMILIES] == list(FAMILIES) and len(study.seeds) >= 3
    for name, points in ABLATIONS.items():  # the paper's points, whose HPSv2 the report puts beside
        assert list(map(str, study.ablations[name]["points"])) == list(points)
    configs = {name: family_config(study, name) for name in study.families}
    for name, config in configs.items():
        assert (config.family, config.pool, config.keep) == (family_of(study, name), study.families[name]["pool"],
                                                             study.families[name]["keep"])
    sol_rl = configs["sol_rl"]
    # Equal budgets compare like with like: every family trains on as many images per iteration
    # (prompt groups x kept), whatever its pool (reports/benchmarks/study_shape/ says why 12 kept).
    trained = {(config.prompts_per_iteration, config.keep) for config in configs.values()}
    assert trained == {(sol_rl.prompts_per_iteration, sol_rl.keep)}
    # Item 4 of issue 10: NVFP4 does not rank as the paper's at any width trained here, so the
    # comparison also runs sol_rl with the FP8 explorer, otherwise sol_rl as the study sets it.
    fp8 = family_config(study, "sol_rl_fp8")
    assert fp8.explore.backend == "fp8" and sol_rl.explore.backend == "emulated-nvfp4"
    fp8.explore.backend = sol_rl.explore.backend
    assert fp8 == sol_rl
    for name, section in study.ablations.items():
        for point in section["points"]:
            config = ablation_config(study, name, str(point))
            assert get_key(config, ABLATION_KEYS[name]) == point
            # Everything but the ablation's one key is sol_rl's, as the study sets it.
            assert config.keep == sol_rl.keep and config.family == "sol_rl"


def test_the_ci_study_has_the_same_sections_as_the_full_one():
    full, ci = (yaml.safe_load((ROOT / name).read_text()) for name in ("params.yaml", "params-ci.yaml"))
    assert list(full) == list(ci)
    assert set(full["ablations"]) == set(ci["ablations"]) and set(full["compare"]) == set(ci["compare"])
    assert set(ci["families"]) <= set(full["families"])
    study = load_study(ROOT / "params-ci.yaml")
    for family in study.families:
        family_config(study, family)
    for name, section in study.ablations.items():
        for point in section["points"]:
            ablation_config(study, name, str(point))


def write_params(tmp_path: Path, change) -> Path:
    params = yaml.safe_load((ROOT / "params-ci.yaml").read_text())
    change(params)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.mark.parametrize("change, arguments, message", [
    (lambda p: p.update(iterations=3), ["--family", "sol_rl"], "unknown key 'iterations'"),
    (lambda p: p.update(seeds=[0, 0]), ["--family", "sol_rl"], "each seed once"),
    (lambda p: p["families"].update(grpo={}), ["--family", "sol_rl"], "unknown family 'grpo'"),
    (lambda p: p["families"].update(fast={"family": "grpo"}), ["--family", "sol_rl"], "fast.family: unknown family"),
    (lambda p: p["families"]["sol_rl"].update(family="naive_quant"), ["--family", "sol_rl"], "name of its own"),
    (lambda p: p["families"].update(fast={"family": "sol_rl", "explore": {"backend": "int3"}}),
     ["--family", "fast"], "int3"),
    (lambda p: p["ablations"].update(lr={"points": [1], "seeds": [0]}), ["--family", "sol_rl"], "unknown ablation"),
    (lambda p: p["compare"].update(budget_gpu_hours=-1), ["--family", "sol_rl"], "compare.budget_gpu_hours"),
    (lambda p: p["ablations"]["pool"].update(budget_gpu_hours=0), ["--family", "sol_rl"],
     "ablations.pool.budget_gpu_hours"),
    (lambda p: p["ablations"]["pool"].update(iterations=3), ["--family", "sol_rl"], "ablations.pool: unknown key"),
    (lambda p: p["settings"].update(pool="many"), ["--family", "sol_rl"], "pool"),
    (lambda p: None, ["--family", "naive_quant"], "no family 'naive_quant' under families"),
    (lambda p: None, ["--ablation", "pool", "--point", "96"], "no point of pool '96'"),
    (lambda p: None, ["--family", "sol_rl", "--point", "6"], "--family F, or --ablation A with --point P"),
])
def test_bad_params_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, change, arguments, message):
    params = write_params(tmp_path, change)
    root = tmp_path / "pipeline"
    assert main(["run", "--params", str(params), "--root", str(root), "--seed", "0", *arguments]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error, error
    assert not root.exists()


def test_a_seed_outside_the_study_and_a_comparison_without_its_runs_are_one_line(tmp_path, capsys):
    params = write_params(tmp_path, lambda p: None)
    root = tmp_path / "pipeline"
    assert main(["run", "--params", str(params), "--root", str(root), "--family", "sol_rl", "--seed", "7"]) == 2
    assert "seed 7 is not one of the study's seeds" in capsys.readouterr().err
    assert main(["compare", "--params", str(params), "--root", str(root)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no finished run" in error
    assert not root.exists()


def test_an_ablation_trains_to_its_own_budget_or_else_the_comparisons(tmp_path):
    # The comparison's budget is set by when diffusionnft flattens; an ablation of sol_rl names its
    # own, and its runs and its comparison are sized to it, the families' runs to theirs.
    def budgets(params):
        params["compare"]["budget_gpu_hours"] = 3.0e-9
        params["ablations"]["pool"]["budget_gpu_hours"] = 9.0e-9
        del params["ablations"]["explore-steps"]["budget_gpu_hours"]

    params = write_params(tmp_path, budgets)
    study = load_study(params)
    assert (study.budget_of(), study.budget_of("pool"), study.budget_of("explore-steps")) == (3.0e-9, 9.0e-9, 3.0e-9)
    root = tmp_path / "pipeline"
    assert main(["run", "--params", str(params), "--root", str(root), "--ablation", "pool", "--point", "6",
                 "--seed", "0"]) == 0
    assert main(["compare", "--params", str(params), "--root", str(root), "--ablation", "pool"]) == 0
    report = json.loads((root / "ablation-pool" / "compare.json").read_text())
    assert report["budget_gpu_hours"] == 9.0e-9
    run = report["families"]["pool=6"]
    per_iteration = run["modeled_gpu_hours_per_iteration"]
    # As many whole iterations as fit the ablation's budget: more than the comparison's would allow.
    assert run["iterations"] * per_iteration <= 9.0e-9 < (run["iterations"] + 1) * per_iteration
    assert run["iterations"] > 3.0e-9 // per_iteration


def test_a_family_variant_trains_as_its_family_with_its_own_keys_and_is_compared_against_it(tmp_path):
    def fp8_variant(params):
        params["families"] = {"diffusionnft": params["families"]["diffusionnft"], "sol_rl": params["families"]["sol_rl"],
                              "sol_rl_fp8": {"family": "sol_rl", **params["families"]["sol_rl"],
                                             "explore": {"backend": "fp8"}}}
        params["seeds"] = [0, 1]

    params = write_params(tmp_path, fp8_variant)
    root = tmp_path / "pipeline"
    for name in ("diffusionnft", "sol_rl", "sol_rl_fp8"):
        for seed in ("0", "1"):
            assert main(["run", "--params", str(params), "--root", str(root), "--family", name, "--seed", seed]) == 0
    assert main(["compare", "--params", str(params), "--root", str(root)]) == 0
    report = json.loads((root / "compare.json").read_text())
    assert list(report["families"]) == ["diffusionnft", "sol_rl", "sol_rl_fp8"]
    summary = json.loads((root / "runs" / "sol_rl_fp8" / "seed-0" / "summary.json").read_text())
    assert summary["config"]["family"] == "sol_rl" and summary["config"]["explore"]["backend"] == "fp8"
    # Read against the family it varies, with an interval over the two seeds.
    difference = report["seed_statistics"]["final_differences"]["sol_rl_fp8 - sol_rl"]
    assert difference["ci"] is not None and difference["ci"][0] <= difference["mean"] <= difference["ci"][1]
    assert "sol_rl_fp8 - sol_rl" in report["final_reward_spread"]["paired_differences"]
    # The comparison's page and the report's README say where the variant stands against its family.
    assert "| sol_rl_fp8 - sol_rl |" in (root / "compare.md").read_text()
    headline = next(line for line in (root / "compare.md").read_text().splitlines()
                    if line.startswith("- B200 (sized the budget):"))
    assert "sol_rl_fp8 " in headline
    from solrl_core.report_readme import write_readme

    page = write_readme(root).read_text()
    assert "sol_rl_fp8, a variant of sol_rl (params.yaml)" in page and "sol_rl_fp8 − sol_rl" in page
