"""The proxy-drift alarm (fired by an injected degraded explorer, switching to a more faithful one)
and the reward-hacking alarm (a held-out reward falling beyond the accepted fall: quiet at make
run's end, firing at the lr 3e-3 run's), as they show in
metrics.jsonl and in the metrics MLflow receives."""

from __future__ import annotations

import dataclasses
import json

import pytest

from solrl_core import alarms, stages
from solrl_core.presets import resolve_config
from solrl_core.rewards.registry import RewardScores
from solrl_core.tracking import flatten_metrics
from solrl_core.training import run_training

TINY = [("pool", 8), ("keep", 4), ("prompts_per_iteration", 2), ("explore.steps", 3), ("explore.chunk", 8),
        ("regenerate.steps", 4), ("eval.prompts", 2), ("eval.seeds_per_prompt", 2), ("eval.steps", 4),
        ("progress", False)]


def metrics_of(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_degraded_explorer_fires_the_drift_alarm_and_the_run_switches_to_more_steps(tmp_path, monkeypatch):
    honest = stages.explore

    def backwards(state, iteration):  # an explorer whose rewards rank every pool upside down
        drafts = honest(state, iteration)
        scores = drafts.scores
        return dataclasses.replace(drafts, scores=RewardScores({k: -v for k, v in scores.per_reward.items()},
                                                               -scores.combined))

    monkeypatch.setattr(stages, "explore", backwards)
    config = resolve_config("shapes-tiny", "sol_rl", TINY + [
        ("iterations", 4), ("eval.every", 100), ("alarms.drift.threshold", 0.0), ("alarms.drift.window", 2),
        ("alarms.drift.switch_steps", 5)])
    lines = []
    run_training(config, tmp_path / "run", log=lines.append)
    records = metrics_of(tmp_path / "run")
    assert all(r["fidelity_spearman"] < 0 for r in records)
    assert [r["alarms"]["proxy_drift"] for r in records] == [0, 1, 1, 1]
    assert [r["alarms"]["drift_switched"] for r in records] == [0, 1, 0, 0]
    # from the iteration after the alarm the explorer takes 5 steps instead of 3
    explore_flops = [r["flops"]["explore"] for r in records]
    assert explore_flops[0] == explore_flops[1] and explore_flops[2] == pytest.approx(explore_flops[1] * 5 / 3)
    assert sum("warning: proxy drift" in line for line in lines) == 3
    assert flatten_metrics(records[1])["alarms/proxy_drift"] == 1  # what MLflow logs


def test_an_honest_explorer_raises_no_drift_alarm(tmp_path):
    config = resolve_config("shapes-tiny", "sol_rl", TINY + [("iterations", 1), ("alarms.drift.window", 1),
                                                              ("alarms.drift.threshold", -1.0)])
    run_training(config, tmp_path / "run", log=lambda line: None)
    assert metrics_of(tmp_path / "run")[0]["alarms"]["proxy_drift"] == 0


# make run's default job at its end (held-out compliance +0.1151, aesthetic -0.0105: inside the 0.03
# the project accepts), and the run that did hack (lr 3e-3, 8 optimizer steps per iteration: the
# trained compliance fell -0.012 while the held-out aesthetic fell -0.037).
MAKE_RUN_END = {"shapes-compliance": +0.1151, "shapes-aesthetic": -0.0105}
HACKED_END = {"shapes-compliance": -0.012, "shapes-aesthetic": -0.037}
BASE = {"shapes-compliance": 0.380, "shapes-aesthetic": 0.942}


def moved(base, change):
    return {name: base[name] + change[name] for name in base}


def test_hacking_rule():
    config = resolve_config("shapes-tiny", "sol_rl", TINY)  # the default alarm settings
    assert config.alarms.hacking.margin == 0.03
    quiet = alarms.check_hacking(config, BASE, moved(BASE, MAKE_RUN_END))
    assert quiet["reward_hacking"] == 0 and quiet["falling"] == []
    assert alarms.hacking_warning(quiet) is None
    hacked = alarms.check_hacking(config, BASE, moved(BASE, HACKED_END))
    assert hacked["reward_hacking"] == 1 and hacked["falling"] == ["shapes-aesthetic"]
    assert hacked["trained_change"] == pytest.approx(-0.012)
    warning = alarms.hacking_warning(hacked)
    assert "shapes-aesthetic -0.0370" in warning and "did not rise (-0.0120)" in warning
    rose = alarms.check_hacking(config, BASE, moved(BASE, {"shapes-compliance": 0.2, "shapes-aesthetic": -0.05}))
    assert rose["reward_hacking"] == 1 and "rose (+0.2000)" in alarms.hacking_warning(rose)
    # a fall just inside the limit is quiet, whatever the trained reward did; nothing held out: no record
    for trained in (0.3, 0.0, -0.2):
        within = alarms.check_hacking(config, BASE, moved(BASE, {"shapes-compliance": trained,
                                                                 "shapes-aesthetic": -0.029}))
        assert within["reward_hacking"] == 0
    nothing_held_out = resolve_config("shapes-tiny", "sol_rl", TINY + [("eval.rewards", ["shapes-compliance"])])
    assert alarms.check_hacking(nothing_held_out, BASE, moved(BASE, HACKED_END)) is None
    off = resolve_config("shapes-tiny", "sol_rl", TINY + [("alarms.hacking.enabled", False)])
    assert alarms.check_hacking(off, BASE, moved(BASE, HACKED_END)) is None


@pytest.mark.slow
@pytest.mark.parametrize("change, fires", [(MAKE_RUN_END, False), (HACKED_END, True)])
def test_a_run_warns_on_the_hacked_trade_off_and_not_on_make_runs(tmp_path, monkeypatch, change, fires):
    """A run whose trained evaluations land where make run's default job ended prints no warning;
    one that lands where the lr 3e-3 run ended does, in its log, metrics.jsonl and MLflow's metrics."""
    honest = stages.evaluate
    seen = {}

    def landing(state, adapter=stages.EMA):
        rewards, images = honest(state, adapter)
        if adapter is None:  # the base model
            seen.update(rewards)
            return rewards, images
        return moved(seen, change), images

    monkeypatch.setattr(stages, "evaluate", landing)
    config = resolve_config("shapes-tiny", "sol_rl", TINY + [("iterations", 1), ("eval.every", 1)])
    lines = []
    run_training(config, tmp_path / "run", log=lines.append)
    record = metrics_of(tmp_path / "run")[0]
    assert record["alarms"]["reward_hacking"] == int(fires)
    assert flatten_metrics(record)["alarms/reward_hacking"] == int(fires)
    assert any("warning: reward hacking" in line for line in lines) == fires


def test_every_evaluation_of_a_run_records_the_held_out_change_since_the_base(tmp_path):
    config = resolve_config("shapes-tiny", "sol_rl", TINY + [("iterations", 2), ("eval.every", 1),
                                                              ("train.lr", 1e-2)])
    run_training(config, tmp_path / "run", log=lambda line: None)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    base = summary["eval_reward_base"]
    for record in metrics_of(tmp_path / "run"):
        record_alarms = record["alarms"]
        assert record_alarms["held_out_change"]["shapes-aesthetic"] == pytest.approx(
            record["eval"]["shapes-aesthetic"] - base["shapes-aesthetic"])
        assert record_alarms["trained_change"] == pytest.approx(
            record["eval"]["shapes-compliance"] - base["shapes-compliance"])
        beyond_the_limit = record_alarms["held_out_change"]["shapes-aesthetic"] < -config.alarms.hacking.margin
        assert record_alarms["reward_hacking"] == int(beyond_the_limit)
        assert record_alarms["fall_limit"] == {"shapes-aesthetic": config.alarms.hacking.margin}


def test_a_run_whose_policy_hacks_the_trained_reward_is_flagged(tmp_path, monkeypatch):
    """The embedded world's tiny runs do not train long enough to hack compliance for real (both
    rewards drift down together at this size), so the policy's evaluations are made to: compliance
    up, aesthetic down, from the first trained evaluation on."""
    honest = stages.evaluate

    def hacked(state, adapter=stages.EMA):
        rewards, images = honest(state, adapter)
        if adapter is not None:  # not the base model
            rewards = {**rewards, "shapes-compliance": rewards["shapes-compliance"] + 0.5,
                       "shapes-aesthetic": rewards["shapes-aesthetic"] - 0.5}
        return rewards, images

    monkeypatch.setattr(stages, "evaluate", hacked)
    config = resolve_config("shapes-tiny", "sol_rl", TINY + [("iterations", 1), ("eval.every", 1)])
    lines = []
    run_training(config, tmp_path / "run", log=lines.append)
    record = metrics_of(tmp_path / "run")[0]
    assert record["alarms"]["reward_hacking"] == 1 and record["alarms"]["falling"] == ["shapes-aesthetic"]
    assert flatten_metrics(record)["alarms/reward_hacking"] == 1
    assert any("warning: reward hacking" in line for line in lines)


def test_a_run_resumed_after_the_drift_switch_continues_with_the_faithful_explorer(tmp_path, monkeypatch):
    import polars as pl

    from solrl_core import faults

    honest = stages.explore

    def backwards(state, iteration):
        drafts = honest(state, iteration)
        return dataclasses.replace(drafts, scores=RewardScores({k: -v for k, v in drafts.scores.per_reward.items()},
                                                               -drafts.scores.combined))

    monkeypatch.setattr(stages, "explore", backwards)
    config = resolve_config("shapes-tiny", "sol_rl", TINY + [
        ("iterations", 4), ("eval.every", 100), ("alarms.drift.threshold", 0.0), ("alarms.drift.window", 1),
        ("alarms.drift.switch_steps", 4), ("alarms.drift.switch_backend", "fp8")])
    run_training(config, tmp_path / "whole", log=lambda line: None)

    def stop_at_three(iteration):
        if iteration == 3:
            raise faults.InjectedFault("stopped")

    with monkeypatch.context() as patch:
        patch.setattr(faults, "at_iteration", stop_at_three)
        with pytest.raises(faults.InjectedFault):
            run_training(config, tmp_path / "resumed", log=lambda line: None)
    run_training(config, tmp_path / "resumed", log=lambda line: None, resume=True)
    whole, resumed = metrics_of(tmp_path / "whole"), metrics_of(tmp_path / "resumed")
    assert [r["alarms"] for r in resumed] == [r["alarms"] for r in whole]
    assert [r["flops"] for r in resumed] == [r["flops"] for r in whole]
    assert [r["modeled_gpu_hours"]["explore"] for r in resumed] == [r["modeled_gpu_hours"]["explore"] for r in whole]
    assert pl.read_parquet(tmp_path / "resumed" / "ledger.parquet").equals(
        pl.read_parquet(tmp_path / "whole" / "ledger.parquet"), null_equal=True)
