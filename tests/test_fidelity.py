"""The ranking-fidelity metrics on hand-made rankings, and a small study through the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from flows.cli import main
from solrl_core.fidelity import proxy_order, ranking_metrics, reference_ranks, true_ranks
from solrl_core.selection import select_extremes

POOL = 96


def distinct_truth(groups: int = 3, pool: int = POOL, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(groups, pool, generator=generator, dtype=torch.float64)


def test_perfect_proxy_scores_perfectly():
    truth = distinct_truth()
    metrics = ranking_metrics(truth.clone(), truth)
    assert metrics["spearman"] == pytest.approx(1.0)
    assert metrics["kendall"] == pytest.approx(1.0)
    assert metrics["top_k_precision"] == {"4": 1.0, "8": 1.0, "12": 1.0}
    assert metrics["bottom_k_precision"] == {"4": 1.0, "8": 1.0, "12": 1.0}
    assert metrics["bottom_k_contamination"] == {"4": 0.0, "8": 0.0, "12": 0.0}
    assert metrics["mean_true_rank_top12"] == pytest.approx(6.5)
    assert metrics["mean_true_rank_bottom12"] == pytest.approx(90.5)


def test_reversed_proxy_scores_the_opposite():
    truth = distinct_truth()
    metrics = ranking_metrics(-truth, truth)
    assert metrics["spearman"] == pytest.approx(-1.0)
    assert metrics["kendall"] == pytest.approx(-1.0)
    assert metrics["top_k_precision"] == {"4": 0.0, "8": 0.0, "12": 0.0}
    assert metrics["bottom_k_contamination"] == {"4": 1.0, "8": 1.0, "12": 1.0}
    assert metrics["mean_true_rank_top12"] == pytest.approx(90.5)
    assert metrics["mean_true_rank_bottom12"] == pytest.approx(6.5)


def test_only_the_order_matters():
    truth = distinct_truth()
    metrics = ranking_metrics(truth**3 * 7 - 2, truth)  # a monotone distortion of the rewards
    assert metrics["spearman"] == pytest.approx(1.0) and metrics["top_k_precision"]["12"] == 1.0


def test_one_swap_across_the_top_boundary_costs_one_pick():
    truth = torch.arange(POOL, 0, -1, dtype=torch.float64)[None]  # seed 0 best ... seed 95 worst
    proxy = truth.clone()
    proxy[0, 3], proxy[0, 4] = truth[0, 4], truth[0, 3]  # the 4th and 5th best trade places
    metrics = ranking_metrics(proxy, truth)
    assert metrics["top_k_precision"]["4"] == pytest.approx(3 / 4)
    assert metrics["top_k_precision"]["8"] == 1.0
    assert metrics["mean_true_rank_top12"] == pytest.approx(6.5)  # the same 12 seeds, another order


def test_ties_in_the_truth_do_not_penalise_a_perfect_proxy():
    truth = torch.tensor([[5.0, 4.0, 4.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    metrics = ranking_metrics(truth.clone(), truth, ks=(2,), tail=2)
    assert metrics["top_k_precision"]["2"] == 1.0  # either tied 4.0 is a true top-2 seed
    assert true_ranks(truth[0]).tolist()[:4] == [1.0, 3.0, 3.0, 3.0]


def test_picks_follow_the_rank_stage():
    proxy = distinct_truth(groups=4, pool=20, seed=3).float()
    proxy[1, 5] = float("nan")  # an unscored draft sits in the middle, as in training
    order = proxy_order(proxy)
    kept = select_extremes(proxy, 8)
    assert torch.equal(order[:, :4], kept[:, :4]) and torch.equal(order[:, -4:], kept[:, 4:])


def test_reference_ranks_are_the_papers():
    reference = reference_ranks(POOL)
    assert reference["perfect"] == {"mean_true_rank_top12": 6.5, "mean_true_rank_bottom12": 90.5}
    assert reference["random"] == {"mean_true_rank_top12": 48.5, "mean_true_rank_bottom12": 48.5}


def test_fidelity_cli_writes_one_result_per_backend_and_step_count(tmp_path):
    out = tmp_path / "fidelity.json"
    code = main(["fidelity", "--prompts", "2", "--pool", "8", "--explore-steps", "2,3", "--backend",
                 "emulated-nvfp4,none", "--out", str(out), "-S", "regenerate.steps=3", "-S", "progress=false"])
    assert code == 0
    report = json.loads(out.read_text())
    assert [(r["backend"], r["explore_steps"]) for r in report["results"]] == [
        ("emulated-nvfp4", 2), ("emulated-nvfp4", 3), ("none", 2), ("none", 3)]
    for result in report["results"]:
        assert {"spearman", "kendall", "top_k_precision", "bottom_k_contamination",
                "mean_true_rank_top4", "mean_true_rank_bottom4"} <= set(result)
        assert set(result["top_k_precision"]) == {"4"}  # K = 8 and 12 need a larger pool
    # The full-precision policy at T_train steps is the truth itself.
    assert report["results"][-1]["spearman"] == pytest.approx(1.0)
    assert report["config"]["pool"] == 8 and report["config"]["full_precision_steps"] == 3
    assert out.with_suffix(".png").stat().st_size > 0


def test_fidelity_study_extends_a_finished_one_without_resampling_the_truth(tmp_path, capsys):
    out = tmp_path / "fidelity.json"
    common = ["fidelity", "--prompts", "1", "--pool", "6", "--out", str(out), "-S", "regenerate.steps=2",
              "-S", "progress=false"]
    assert main(common + ["--explore-steps", "1", "--backend", "none"]) == 0
    first = json.loads(out.read_text())
    assert len(first["full_precision"]["rewards"][0]) == 6
    assert main(common + ["--explore-steps", "1,2", "--backend", "fp8,none"]) == 0
    assert "reusing the full-precision rewards and 1 results" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert [(r["backend"], r["explore_steps"]) for r in report["results"]] == [
        ("fp8", 1), ("fp8", 2), ("none", 1), ("none", 2)]
    assert report["results"][2] == first["results"][0]
    assert report["config"]["backends"] == ["fp8", "none"] and report["config"]["explore_steps"] == [1, 2]


@pytest.mark.parametrize("arguments, message", [
    (["--explore-steps", "6,x"], "--explore-steps"),
    (["--explore-steps", "0"], "--explore-steps"),
    (["--backend", "int3"], "--backend"),
    (["--pool", "1"], "--pool"),
    pytest.param(["--backend", "te-nvfp4"], "te-nvfp4",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU may run te-nvfp4")),
])
def test_fidelity_cli_errors_are_one_line_exit_2(tmp_path, capsys, arguments, message):
    out = tmp_path / "f.json"
    assert main(["fidelity", "--out", str(out), *arguments]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error
    assert not out.exists()
