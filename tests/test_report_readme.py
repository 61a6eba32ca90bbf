"""reports/README.md's fidelity table: every row says which explorer it measures."""

from __future__ import annotations

import json

from solrl_core.report_readme import write_readme


def _result(schedule: str | None, spearman: float, speedup: float) -> dict:
    result = {"backend": "emulated-nvfp4", "explore_steps": 6, "spearman": spearman, "kendall": spearman - 0.1,
              "top_k_precision": {"12": 0.5}, "bottom_k_contamination": {"12": 0.01},
              "mean_true_rank_top12": 14.0, "mean_true_rank_bottom12": 86.0,
              "cost": {"B200-measured": {"speedup_vs_naive_scaling": speedup}}}
    if schedule is not None:
        result["schedule"] = schedule
    return result


def test_adaptive_rows_name_their_schedule_and_rollout_speedup(tmp_path):
    # A fixed explorer and an adaptive schedule share backend and step count: the page must tell
    # them apart, and give the rollout cost each one buys its precision with.
    report = {"config": {"prompts": 4, "pool": 96, "full_precision_steps": 10, "dtype": "float32", "device": "cpu"},
              "reference": {"perfect": {"mean_true_rank_top12": 6.5, "mean_true_rank_bottom12": 90.5},
                            "random": {"mean_true_rank_top12": 48.5, "mean_true_rank_bottom12": 48.5}},
              "results": [_result("fixed", 0.84, 1.90), _result("2:48,4:32,5:24", 0.86, 2.48)]}
    (tmp_path / "fidelity.json").write_text(json.dumps(report))
    page = write_readme(tmp_path).read_text(encoding="utf-8")
    rows = [line for line in page.splitlines() if line.startswith("| emulated-nvfp4 | 6 |")]
    assert len(rows) == 2
    assert rows[0].startswith("| emulated-nvfp4 | 6 | fixed | 0.840 |") and rows[0].endswith("| 1.90x |")
    assert rows[1].startswith("| emulated-nvfp4 | 6 | 2:48,4:32,5:24 | 0.860 |") and rows[1].endswith("| 2.48x |")
    assert "rollout speed-up vs naive (B200-measured)" in page


def test_results_without_schedule_or_cost_read_as_the_fixed_explorer(tmp_path):
    # fidelity.json files written before adaptive exploration have neither key.
    old = _result(None, 0.9, 1.0)
    del old["cost"]
    report = {"config": {"prompts": 4, "pool": 96, "full_precision_steps": 10, "dtype": "float32", "device": "cpu"},
              "reference": {"perfect": {"mean_true_rank_top12": 6.5, "mean_true_rank_bottom12": 90.5},
                            "random": {"mean_true_rank_top12": 48.5, "mean_true_rank_bottom12": 48.5}},
              "results": [old]}
    (tmp_path / "fidelity.json").write_text(json.dumps(report))
    page = write_readme(tmp_path).read_text(encoding="utf-8")
    assert "| emulated-nvfp4 | 6 | fixed | 0.900 |" in page
    assert "rollout speed-up" not in page
