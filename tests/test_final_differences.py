"""benchmarks/final_differences.py: a family probed in a report of its own is compared with the
study's families exactly as one report holding both would compare them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.final_differences import differences, evaluation_errors, family_finals, wide_finals  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STUDY = json.loads((ROOT / "reports" / "compare.json").read_text())


def _split(report: dict, names: list[str]) -> dict:
    """The part of a comparison report holding only ``names``: as if they ran in a study of their own."""
    return {**report, "families": {name: report["families"][name] for name in names}}


def test_a_pair_split_across_two_reports_reads_as_in_the_joint_report():
    recorded = STUDY["seed_statistics"]["final_differences"]
    for pair in ("sol_rl - diffusionnft", "naive_quant - sol_rl"):
        a, b = pair.split(" - ")
        reports = [_split(STUDY, [a]), _split(STUDY, [b])]
        result = differences(family_finals(reports), [(a, b)], evaluation_errors(reports))[pair]
        assert result["mean"] == pytest.approx(recorded[pair]["mean"], abs=1e-12)
        assert result["ci"] == pytest.approx(recorded[pair]["ci"], abs=1e-12)
        assert result["paired"]["ci"] == pytest.approx(recorded[pair]["paired"]["ci"], abs=1e-12)


def test_a_family_that_reads_differently_in_two_reports_stops():
    changed = json.loads(json.dumps(_split(STUDY, ["sol_rl"])))
    changed["families"]["sol_rl"]["runs"][0]["final_reward"] += 0.01
    with pytest.raises(SystemExit, match="sol_rl differs"):
        family_finals([_split(STUDY, ["sol_rl"]), changed])


def test_pairs_of_different_budgets_or_unknown_families_stop():
    other_budget = {**_split(STUDY, ["diffusionnft"]), "budget_gpu_hours": STUDY["budget_gpu_hours"] / 2}
    families = family_finals([_split(STUDY, ["sol_rl"]), other_budget])
    with pytest.raises(SystemExit, match="different budgets"):
        differences(families, [("sol_rl", "diffusionnft")])
    with pytest.raises(SystemExit, match="no report holds nope"):
        differences(families, [("nope", "sol_rl")])


def _wide_report(report: dict, final_of) -> dict:
    """An rl_gain.py --wide-eval report over a study's run folders (under runs/study/), each run's
    wide final given by ``final_of(name, seed)``."""
    rows = [{"run": f"runs/study/{run['run_dir']}", "trained_reward": "shapes-compliance",
             "wide": {"prompts": 128, "final": {"shapes-compliance": final_of(name, run["seed"])}}}
            for name, family in report["families"].items() for run in family["runs"]]
    return {"runs": rows}


def test_wide_finals_replace_each_run_s_final_by_its_own_folder_s():
    names = ["sol_rl", "diffusionnft"]
    families = family_finals([STUDY])
    wide = _wide_report(STUDY, lambda name, seed: 0.3 + 0.01 * seed + (0.05 if name == "sol_rl" else 0.0))
    widened = wide_finals({name: families[name] for name in names}, [STUDY], wide)
    for name in names:
        seeds = families[name]["seeds"]
        assert widened[name]["finals"] == pytest.approx([0.3 + 0.01 * s + (0.05 if name == "sol_rl" else 0.0)
                                                         for s in seeds])
        assert widened[name]["wide_prompts"] == 128
    result = differences(widened, [("sol_rl", "diffusionnft")])["sol_rl - diffusionnft"]
    assert result["mean"] == pytest.approx(0.05)
    # A run folder the wide report lacks, or holds twice, stops: a difference must pair every seed.
    short = {"runs": wide["runs"][1:]}
    with pytest.raises(SystemExit, match="holds 0 runs"):
        wide_finals({name: families[name] for name in names}, [STUDY], short)
    twice = {"runs": wide["runs"] + wide["runs"][:1]}
    with pytest.raises(SystemExit, match="holds 2 runs"):
        wide_finals({name: families[name] for name in names}, [STUDY], twice)
