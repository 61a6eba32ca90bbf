"""benchmarks/final_differences.py: a family probed in a report of its own is compared with the
study's families exactly as one report holding both would compare them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.final_differences import differences, family_finals  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STUDY = json.loads((ROOT / "reports" / "compare.json").read_text())


def _split(report: dict, names: list[str]) -> dict:
    """The part of a comparison report holding only ``names``: as if they ran in a study of their own."""
    return {**report, "families": {name: report["families"][name] for name in names}}


def test_a_pair_split_across_two_reports_reads_as_in_the_joint_report():
    recorded = STUDY["seed_statistics"]["final_differences"]
    for pair in ("sol_rl - diffusionnft", "naive_quant - sol_rl"):
        a, b = pair.split(" - ")
        families = family_finals([_split(STUDY, [a]), _split(STUDY, [b])])
        result = differences(families, [(a, b)])[pair]
        assert result["mean"] == pytest.approx(recorded[pair]["mean"], abs=1e-12)
        assert result["ci"] == pytest.approx(recorded[pair]["ci"], abs=1e-12)


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
