"""Adaptive exploration: survivors continue the fixed scheme's trajectories exactly, the cost model
charges the sample-steps taken and the drafts scored, and `solrl fidelity --adaptive` measures it."""

from __future__ import annotations

import json

import pytest
import torch

from solrl_core import accounting, stages
from solrl_core.adaptive import explorer_rows, schedule_problem
from flows.cli import main
from solrl_core.config import ConfigError
from solrl_core.presets import resolve_config
from solrl_core.sampling import Trajectory, sample, sigma_grid

TINY = [("pool", 8), ("keep", 4), ("prompts_per_iteration", 2), ("explore.steps", 4), ("explore.chunk", 8),
        ("progress", False), ("explore.adaptive.score_at", [1, 2]), ("explore.adaptive.survivors", [6, 4])]


@pytest.mark.parametrize("kind", ["euler", "dpm2"])
def test_a_trajectory_advanced_in_pieces_and_cut_to_rows_is_the_one_run(kind):
    def velocity(x, sigma):
        return torch.sin(3 * x) + sigma[:, None]

    noise = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    whole = sample(kind, velocity, noise, 6, 1.0).latents
    part = Trajectory(kind, noise, sigma_grid(6, 1.0)).advance(velocity, 2)
    survivors = Trajectory.joined([part.rows([4, 1]), part.rows([0])]).advance(velocity, 3)
    finished = survivors.advance(velocity, 6)
    assert torch.equal(finished.x, whole[[4, 1, 0]])
    assert finished.velocity_rows == 3 * 4 and part.velocity_rows == 6 * 2


@pytest.fixture(scope="module")
def state():
    config = resolve_config("shapes-tiny", "sol_rl_adaptive", TINY + [("explore.backend", "none")])
    run = stages.initial_state(config)
    stages.quantize(run)
    return run


# Explorers whose quantization is row-local (no scale shared with batch-mates). The survivors run
# in a smaller batch than the fixed scheme's, and on some CPUs a float32 GEMM's blocking depends
# on the batch, so a row can come out one ulp apart (seen: 1.2e-7 on a reward). Full precision
# keeps that; an FP8 row can round one activation to the neighbouring E4M3 code (seen: 0.009).
# Full precision pins the trajectories (seeds of one prompt here differ by 0.0005 to 0.2); the FP8
# case checks only that the quantized path does not move them by more than such a rounding.
ROUNDING = {"none": 1e-6, "fp8-rowwise": 0.02}


@pytest.mark.parametrize("backend", ["none", "fp8-rowwise"])
def test_a_survivors_draft_is_the_fixed_schemes_draft_for_that_seed(state, backend):
    from solrl_core.models.adapters import OLD
    from solrl_core.quant.explorer import build_explorer

    config = state.config
    state.explorer = build_explorer(state.policy.transformer, backend, config.quant.skip, config.quant.min_dim)
    state.explorer.requantize(state.policy.transformer, adapter=OLD)
    config.explore.adaptive.survivors = [6, 6]  # run the survivors to explore.steps and rank them there
    try:
        adaptive = stages.explore(state, 0)
        config.explore.adaptive.enabled = False
        fixed = stages.explore(state, 0)
    finally:
        config.explore.adaptive.enabled, config.explore.adaptive.survivors = True, [6, 4]
    survived = torch.isfinite(adaptive.scores.combined)
    assert int(survived.sum()) == 2 * 6 and adaptive.pruned == 2 * 2
    assert torch.equal(adaptive.seeds, fixed.seeds)
    torch.testing.assert_close(adaptive.scores.combined[survived], fixed.scores.combined[survived],
                               rtol=0, atol=ROUNDING[backend])
    # pruned seeds rank in the middle, so the kept are the survivors' extremes
    kept = stages.rank(adaptive, config)
    assert bool(torch.isfinite(torch.gather(adaptive.combined(), 1, kept)).all())
    assert adaptive.explore_rows == 2 * explorer_rows([1, 2], [6, 6], 8, 4, 4) == 2 * (8 + 6 + 6 * 2)
    assert fixed.explore_rows == 2 * 8 * 4


def test_stopping_at_keep_decides_the_kept_seeds_and_charges_only_the_steps_taken(state):
    state.explorer = None
    drafts = stages.explore(state, 1)
    assert drafts.explore_rows == 2 * (8 * 1 + 6 * 1) and drafts.scored_drafts == 2 * (8 + 6)
    kept = stages.rank(drafts, state.config)
    assert int(torch.isfinite(drafts.combined()).sum()) == 2 * 4
    assert bool(torch.isfinite(torch.gather(drafts.combined(), 1, kept)).all())
    counts = accounting.sample_flops(state)
    flops = accounting.stage_flops(state.config, counts, 16, 4, 8, 10, False, drafts.explore_rows,
                                   drafts.scored_drafts)
    assert flops["explore"] == counts.explorer_forward * 28
    assert flops["rank"] == counts.decode * 28  # the embedded world's rewards are free; the decode is not


def test_real_rewards_charge_their_scoring_per_draft():
    assert accounting.scoring_flops(["shapes-compliance"]).total == 0
    assert accounting.scoring_flops(["pickscore"]).total > accounting.scoring_flops(["imagereward"]).total > 0
    with pytest.raises(ValueError, match="no scoring cost"):
        accounting.scoring_flops(["mystery"])


@pytest.mark.parametrize("schedule, message", [
    (([2, 1], [6, 4]), "rise strictly"), (([1, 4], [6, 4]), "below explore.steps"), (([1, 2], [5, 4]), "even"),
    (([1, 2], [8, 4]), "below pool"), (([1, 2], [6, 2]), ">= keep"), (([1], [6, 4]), "one length"),
])
def test_bad_schedules_are_one_line(schedule, message):
    assert message in schedule_problem(*schedule, pool=8, keep=4, steps=4)
    with pytest.raises(ConfigError, match="explore.adaptive"):
        resolve_config("shapes-tiny", "sol_rl_adaptive", TINY[:-2] + [("explore.adaptive.score_at", schedule[0]),
                                                                      ("explore.adaptive.survivors", schedule[1])])


def test_fidelity_reports_schedules_beside_the_fixed_scheme_with_their_modeled_speedup(tmp_path):
    out = tmp_path / "fidelity.json"
    code = main(["fidelity", "--prompts", "2", "--pool", "8", "--keep", "4", "--explore-steps", "3",
                 "--backend", "emulated-nvfp4", "--adaptive", "1:6,2:4;1:4", "--out", str(out),
                 "-S", "regenerate.steps=3", "-S", "progress=false"])
    assert code == 0
    results = json.loads(out.read_text())["results"]
    assert [r["schedule"] for r in results] == ["fixed", "1:6,2:4", "1:4"]
    speedups = [r["cost"]["B200-measured"]["speedup_vs_naive_scaling"] for r in results]
    steps = [r["cost"]["B200-measured"]["explorer_sample_steps"] for r in results]
    assert steps == [8 * 3, 8 + 6, 8] and speedups[0] < speedups[1] < speedups[2]
    # c = 0.46, r = 1: 8 x 3 / (0.46 x 24 + 4 x 3) for the fixed scheme
    assert speedups[0] == pytest.approx(24 / (0.46 * 24 + 12), rel=0.05)
    for result in results:
        assert {"top_k_precision", "bottom_k_contamination", "mean_true_rank_top4", "mean_true_rank_bottom4"} <= set(result)


def test_fidelity_schedule_errors_are_one_line_exit_2(tmp_path, capsys):
    out = tmp_path / "f.json"
    assert main(["fidelity", "--out", str(out), "--pool", "8", "--keep", "4", "--adaptive", "1:7"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--adaptive" in error and not out.exists()


def test_a_groups_pruning_does_not_depend_on_the_other_groups_in_the_shard(state):
    """What keeps torchrun ranks deciding as one process does: batches never mix prompt groups, so
    even a per-tensor-scaled explorer sees the same batch-mates for a group on any shard."""
    from solrl_core.models.adapters import OLD
    from solrl_core.quant.explorer import build_explorer

    config = state.config
    explorer = build_explorer(state.policy.transformer, "emulated-nvfp4", config.quant.skip, config.quant.min_dim)
    explorer.requantize(state.policy.transformer, adapter=OLD)
    prompts = [state.train_prompts[0]] * 8 + [state.train_prompts[1]] * 8
    seeds = list(range(100, 116))

    def run(rows):
        scores, _, _ = stages.explore_adaptively(state, [prompts[r] for r in rows], [seeds[r] for r in rows], 4, 8, 4,
                                                 [1, 2], [6, 6], explorer)
        return scores.combined

    together = run(list(range(16)))
    apart = torch.cat([run(list(range(8))), run(list(range(8, 16)))])
    assert torch.equal(together.isnan(), apart.isnan())
    assert torch.equal(together.nan_to_num(), apart.nan_to_num())
