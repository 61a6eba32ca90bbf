"""A short run through the real code path: the CLI writes its outputs, is reproducible, and the
four families differ exactly where SPEC section 5 says they do."""

from __future__ import annotations

import json

import polars as pl
import pytest

from flows.cli import main

SMALL = ["-S", "prompts_per_iteration=2", "-S", "pool=8", "-S", "keep=4", "-S", "eval.prompts=2",
         "-S", "eval.seeds_per_prompt=2", "-S", "eval.steps=4", "-S", "eval.every=2", "-S", "explore.steps=3",
         "-S", "regenerate.steps=4", "-S", "train.micro_batch=64", "-S", "progress=false"]


def run_cli(out, family="sol_rl", iterations=2, extra=()):
    code = main(["run", "--preset", "shapes-tiny", "--family", family, "--iterations", str(iterations),
                 "--out", str(out), *SMALL, *extra])
    assert code == 0
    return pl.read_parquet(out / "ledger.parquet"), json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def sol_rl_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sol_rl")
    return out, *run_cli(out)


def test_run_writes_ledger_metrics_and_summary(sol_rl_run):
    out, ledger, summary = sol_rl_run
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [0, 1]
    assert set(summary["eval_reward_base"]) == {"shapes-compliance", "shapes-aesthetic"}
    assert set(summary["eval_reward_final"]) == {"shapes-compliance", "shapes-aesthetic"}
    assert ledger.height == 2 * 2 * 8  # iterations x prompts x pool
    for record in metrics:
        assert set(record["seconds"]) >= {"explore", "rank", "regenerate", "update", "requantize"}
        assert len(record["fidelity_spearman_per_prompt"]) == 2


def test_ledger_records_kept_seeds_with_full_precision_rewards(sol_rl_run):
    _, ledger, _ = sol_rl_run
    per_group = ledger.group_by(["iteration", "prompt_id"]).agg(pl.col("selected").sum())
    assert per_group["selected"].to_list() == [4] * per_group.height
    kept, dropped = ledger.filter(pl.col("selected")), ledger.filter(~pl.col("selected"))
    assert kept["fp_reward"].null_count() == 0 and kept["advantage"].null_count() == 0
    assert dropped["fp_reward"].null_count() == dropped.height
    # Kept seeds are the extremes of the explorer's ranking within each group.
    for _, group in ledger.group_by(["iteration", "prompt_id"]):
        best_two = group.sort("explore_reward", descending=True, maintain_order=True).head(2)
        assert best_two["selected"].all()


def test_same_config_twice_gives_identical_ledgers(sol_rl_run, tmp_path):
    _, ledger, summary = sol_rl_run
    again, summary_again = run_cli(tmp_path / "again")
    assert again.equals(ledger)
    assert summary_again["eval_reward_final"] == summary["eval_reward_final"]


def test_other_seed_draws_other_noises(sol_rl_run, tmp_path):
    _, ledger, _ = sol_rl_run
    other, _ = run_cli(tmp_path / "other", iterations=1, extra=["-S", "seed=1"])
    assert set(other["seed"].to_list()).isdisjoint(ledger["seed"].to_list())


def test_diffusionnft_trains_on_its_whole_full_precision_group(tmp_path):
    ledger, _ = run_cli(tmp_path / "nft", family="diffusionnft", iterations=1, extra=["-S", "pool=4"])
    assert ledger["selected"].all()  # pool == keep
    assert (ledger["fp_reward"] == ledger["explore_reward"]).all()  # the rollout is full precision


def test_naive_quant_trains_on_quantized_samples_without_full_precision_rewards(tmp_path):
    ledger, _ = run_cli(tmp_path / "nq", family="naive_quant", iterations=1)
    kept = ledger.filter(pl.col("selected"))
    assert kept.height == 2 * 4
    assert kept["fp_reward"].null_count() == kept.height
    assert kept["advantage"].null_count() == 0


def test_naive_scaling_and_sol_rl_explore_the_same_seeds_with_different_rollouts(sol_rl_run, tmp_path):
    _, sol_ledger, _ = sol_rl_run
    scaling, _ = run_cli(tmp_path / "ns", family="naive_scaling", iterations=1,
                         extra=["-S", "regenerate.steps=4"])
    first = sol_ledger.filter(pl.col("iteration") == 0)
    # Same seeds (a pure function of the run seed); 4-bit 3-step drafts vs full-precision 4-step rollouts.
    assert first["seed"].to_list() == scaling["seed"].to_list()
    assert first["explore_reward"].to_list() != scaling["explore_reward"].to_list()


def test_the_ledger_shows_which_optimizer_step_each_kept_seed_trained_in(sol_rl_run):
    """The preset's 8 optimizer steps an iteration over its 2 x 4 kept seeds: each step gets one,
    a seeded random deal (the reference shuffles), not the order the rank stage keeps them in."""
    _, ledger, _ = sol_rl_run
    assert ledger.filter(~pl.col("selected"))["update_step"].null_count() == ledger.filter(~pl.col("selected")).height
    orders = []
    for (iteration,), rows in ledger.filter(pl.col("selected")).group_by(["iteration"], maintain_order=True):
        assert sorted(rows["update_step"].to_list()) == list(range(8)), iteration
        # In rank order (each group's best two, then its worst two) the steps would be 0, 1, ..., 7.
        ranked = rows.sort(["prompt_id", "explore_reward"], descending=[False, True], maintain_order=True)
        orders.append(ranked["update_step"].to_list())
    assert orders[0] != orders[1], "each iteration deals anew"


def test_random_pool_keeps_k_seeds_at_random_whatever_their_rewards(tmp_path):
    ledger, _ = run_cli(tmp_path / "rp", family="random_pool", iterations=2, extra=["-S", "regenerate.steps=4"])
    scaling, _ = run_cli(tmp_path / "ns", family="naive_scaling", iterations=1, extra=["-S", "regenerate.steps=4"])
    first = ledger.filter(pl.col("iteration") == 0)
    # naive_scaling's pool (the same seeds, at full precision, the same rewards), another kept set.
    assert first["seed"].to_list() == scaling["seed"].to_list()
    assert first["explore_reward"].to_list() == pytest.approx(scaling["explore_reward"].to_list())
    assert first["selected"].to_list() != scaling["selected"].to_list()
    per_group = ledger.group_by(["iteration", "prompt_id"]).agg(pl.col("selected").sum())
    assert per_group["selected"].to_list() == [4] * per_group.height
    kept = ledger.filter(pl.col("selected"))
    assert (kept["fp_reward"] == kept["explore_reward"]).all()  # trained on its full-precision pool as drawn
