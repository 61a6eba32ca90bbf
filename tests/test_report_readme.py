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


def _ranking(variant: str, spearman: float, top12: float) -> dict:
    return {"variant": variant, "spearman": spearman, "top_k_precision": {"12": top12}}


def test_the_width_table_gives_each_width_its_base_compliance_preset_rule_and_every_variants_ranking(tmp_path):
    def width(channels: int, compliance: float, results: list[dict], same_as: list[str]) -> dict:
        return {"width": channels, "training": {"parameters": channels * 1000, "steps": 6000, "seconds": 600.0},
                "held_out": {"prompts": 64, "seeds_per_prompt": 2},
                "held_out_rewards": {"shapes-compliance": {"mean": compliance, "se": 0.03}},
                "preset_explorer": {"quantized_layers": 16, "same_layers_as": same_as},
                "ranking": {"prompts": 32, "pool": 96, "explore_steps": 6, "full_precision_steps": 10,
                            "results": results}}

    (tmp_path / "benchmarks").mkdir()
    wide = width(128, 0.62, [_ranking("all layers W4A4", 0.7, 0.5), _ranking("skip list W8A8 FP8", 0.95, 0.8)], [])
    wide["training"]["threads"] = 2
    wide["held_out_rewards"]["shapes-compliance"]["within_prompt_std_mean"] = 0.09
    report = {"widths": [width(32, 0.31, [_ranking("all layers W4A4", 0.5, 0.3)], ["MLPs only W4A4"]), wide]}
    (tmp_path / "benchmarks" / "width_fidelity.json").write_text(json.dumps(report))
    page = write_readme(tmp_path).read_text(encoding="utf-8")
    rows = [line for line in page.splitlines() if line.startswith("| 32 |") or line.startswith("| 128 |")]
    assert rows == ["| 32 | 32,000 | 6000 steps, 600 s | 0.310 ± 0.030 | MLPs only W4A4 | 0.500 / 0.300 | n/a |",
                    "| 128 | 128,000 | 6000 steps, 600 s on 2 thread(s) | 0.620 ± 0.030 (seed std 0.090) | 16 layers | "
                    "0.700 / 0.500 | 0.950 / 0.800 |"]
    assert "32 held-out prompts x 96 seeds at 6 steps" in page


def test_the_kept_gap_table_gives_every_pool_size_beside_the_extreme_value_estimate(tmp_path):
    rows = [{"pool": n, "keep": 24, "gap_mean": gap, "gap_se": 0.02, "extreme_value_estimate": theory,
             "best_half_mean": best} for n, gap, theory, best in ((24, 0.309, 1.022, 0.525), (96, 0.593, 1.225, 0.662))]
    (tmp_path / "pool_gap.json").write_text(json.dumps(
        {"source": "fidelity.json", "prompts": 64, "seeds": 96, "full_precision_steps": 10, "rows": rows}))
    page = write_readme(tmp_path).read_text(encoding="utf-8")
    assert "64 held-out prompts x the first N of 96 seeds" in page
    table = [line for line in page.splitlines() if line.startswith("| 24 |") or line.startswith("| 96 |")]
    assert table == ["| 24 | 0.309 ± 0.020 | 1.022 | 0.525 |", "| 96 | 0.593 ± 0.020 | 1.225 | 0.662 |"]
    assert "pool_gap.png" not in page  # no plot beside the JSON, no link to one
