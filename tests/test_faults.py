"""Faults a long run meets, each with its defined outcome (never a silently wrong ledger, never a
non-finite weight):

| fault | outcome |
|---|---|
| a reward model returns NaN/inf for some images | those images are unscored: null in the ledger, counted in the metrics, never ranked best or worst while the group has enough scored drafts, left out of the update |
| a reward model raises once (a Prefect task crash) | the stage's task retries; the run is identical to an untroubled one |
| a reward model keeps raising | the run stops: exit 1, one line naming the last good checkpoint; resuming later gives the untroubled run |
| every image of an iteration is unscored | the run stops the same way (a diverged policy or a broken reward model) |
| a non-finite loss | its micro-batch is skipped and counted; the step uses the rest |
| an optimizer step that makes a weight non-finite | the run stops; the checkpoint on disk stays the last finite one |
| the disk fills up while writing | the run stops: exit 1, one line; the file being written keeps its last good version; resume continues |
| an unwritable output directory | exit 2, one line, before anything runs; nothing created |
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest
import torch
from safetensors.torch import load_file

from solrl_core import faults
from solrl_core.checkpoint import CHECKPOINT, NonFiniteState, read_metadata
from flows.cli import main
from solrl_core.ledger import read_metrics
from solrl_core.rewards import registry
from solrl_core.world.rewards import shapes_compliance

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent

SMALL = ["-S", "prompts_per_iteration=2", "-S", "pool=8", "-S", "keep=4", "-S", "eval.prompts=2",
         "-S", "eval.seeds_per_prompt=2", "-S", "eval.steps=4", "-S", "eval.every=2", "-S", "explore.steps=3",
         "-S", "regenerate.steps=4", "-S", "train.micro_batch=64", "-S", "progress=false",
         "-S", "rewards={flaky: 1.0}"]
ITERATIONS = 2


class FlakyReward:
    """shapes-compliance, but failing on demand: ``nonfinite`` puts NaN/inf on some batch positions,
    ``raise_on_calls`` makes given calls (1-based) raise, like a reward server that drops out."""

    def __init__(self):
        self.calls = 0
        self.nonfinite = False
        self.raise_on_calls: set[int] | None = set()
        self.raise_from_call: int | None = None

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        self.calls += 1
        if self.calls in self.raise_on_calls or (self.raise_from_call and self.calls >= self.raise_from_call):
            raise ConnectionError(f"reward server dropped the connection (call {self.calls})")
        scores = shapes_compliance(images, prompts)
        if self.nonfinite:
            position = torch.arange(len(prompts))
            scores = torch.where(position % 4 == 0, torch.full_like(scores, math.nan), scores)
            scores = torch.where(position % 8 == 1, torch.full_like(scores, math.inf), scores)
        return scores


def flaky_record(load) -> registry.RewardSpec:
    """The "flaky" reward's record: analytic like the one it wraps (no files, free to score)."""
    return registry.RewardSpec("flaky", load, files=None, scoring_flops=0.0, parameters=0)


@pytest.fixture()
def flaky(monkeypatch) -> FlakyReward:
    reward = FlakyReward()
    monkeypatch.setitem(registry.REWARDS, "flaky", flaky_record(lambda: reward))
    return reward


@pytest.fixture(autouse=True)
def no_injected_faults(monkeypatch):
    monkeypatch.delenv(faults.ENVIRONMENT, raising=False)
    faults.reset()
    yield
    faults.reset()


def run(out, *extra) -> int:
    return main(["run", "--preset", "shapes-tiny", "--family", "sol_rl", "--iterations", str(ITERATIONS),
                 "--out", str(out), "--no-tracking", *SMALL, *extra])


def resume(out) -> int:
    return main(["run", "--resume", str(out), "--no-tracking"])


@pytest.fixture(scope="module")
def untroubled(tmp_path_factory) -> pl.DataFrame:
    """The reference: the same run with a reward that never fails."""
    out = tmp_path_factory.mktemp("untroubled") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(registry.REWARDS, "flaky", flaky_record(FlakyReward))
        assert run(out) == 0
    return pl.read_parquet(out / "ledger.parquet")


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("solrl: error:"), err[-3000:]
    return err


def finite_lora(out) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in load_file(str(out / "lora.safetensors")).values())


# --- rewards ---------------------------------------------------------------------------------


def test_nonfinite_rewards_are_null_counted_never_kept_and_never_trained(flaky, tmp_path):
    flaky.nonfinite = True
    out = tmp_path / "run"
    assert run(out) == 0
    ledger = pl.read_parquet(out / "ledger.parquet")
    metrics = read_metrics(out / "metrics.jsonl")
    unscored = ledger.filter(pl.col("explore_reward").is_null())
    # Positions 0 and 4 (NaN) and 1 (inf) of each 16-image batch: 3 of each group of 8 drafts.
    assert unscored.height == 3 * 2 * ITERATIONS
    assert [m["nonfinite_rewards"]["explore"] for m in metrics] == [6] * ITERATIONS
    assert not ledger.filter(pl.col("explore_reward").is_nan()).height, "stored as null, never as NaN"
    assert not unscored["selected"].any(), "5 scored drafts per group fill the 4 kept slots"
    # The regenerated batch of 8 has positions 0, 4 and 1 unscored too: no advantage, not trained.
    kept = ledger.filter(pl.col("selected"))
    assert kept.filter(pl.col("fp_reward").is_null()).height == 3 * ITERATIONS
    assert kept.filter(pl.col("fp_reward").is_null())["advantage"].is_null().all()
    assert kept.filter(pl.col("fp_reward").is_not_null())["advantage"].is_not_null().all()
    assert [m["nonfinite_rewards"]["trained"] for m in metrics] == [3] * ITERATIONS
    assert all(math.isfinite(m["loss"]) and m["optimizer_steps"] > 0 for m in metrics)
    assert finite_lora(out)
    evaluation = metrics[-1]["eval"]["flaky"]
    assert math.isfinite(evaluation), "the evaluation mean leaves unscored images out"


def test_an_iteration_with_no_scored_image_stops_the_run(flaky, tmp_path, capsys):
    out = tmp_path / "run"
    original = flaky.__call__

    def all_nan_from_iteration_one(images, prompts):
        scores = original(images, prompts)
        return torch.full_like(scores, math.nan) if flaky.calls >= 4 else scores  # base eval, iter 0: calls 1-3

    registry.REWARDS["flaky"] = flaky_record(lambda: all_nan_from_iteration_one)
    assert run(out) == 1
    err = one_error_line(capsys)
    assert "no finite reward" in err and "(1 iterations done)" in err
    assert read_metadata(out)["next_iteration"] == 1


def test_a_reward_that_raises_once_is_retried_and_changes_nothing(flaky, untroubled, tmp_path):
    flaky.raise_on_calls = {4}  # iteration 1's exploration (calls: base eval 1, iteration 0: 2-3)
    out = tmp_path / "run"
    assert run(out) == 0
    assert flaky.calls == 1 + 2 * ITERATIONS + 1 + 1  # evaluations 1 + 1, explore/regenerate 2 per iteration, + retry
    assert pl.read_parquet(out / "ledger.parquet").equals(untroubled, null_equal=True)


def test_a_reward_that_keeps_raising_stops_the_run_and_resume_continues_it(flaky, untroubled, tmp_path, capsys):
    flaky.raise_from_call = 4
    out = tmp_path / "run"
    assert run(out) == 1
    err = one_error_line(capsys)
    assert "ConnectionError" in err and "(1 iterations done)" in err and f"solrl run --resume {out}" in err
    assert not (out / "summary.json").exists()
    flaky.raise_from_call = None  # the reward server is back
    assert resume(out) == 0
    assert pl.read_parquet(out / "ledger.parquet").equals(untroubled, null_equal=True)


# --- the update ----------------------------------------------------------------------------


def _one_rollout(micro_batch: int = 64):
    from solrl_core import stages
    from solrl_core.config import parse_override
    from solrl_core.presets import resolve_config

    overrides = [parse_override(text) for text in SMALL[1::2] if not text.startswith("rewards")]
    # Two optimizer steps over the 8 kept samples, so the step holding a broken sample also holds
    # good ones (the preset's 8 steps would give that sample a step of its own).
    config = resolve_config("shapes-tiny", "sol_rl", overrides + [("train.micro_batch", micro_batch),
                                                                  ("train.steps_per_iteration", 2)])
    state = stages.initial_state(config)
    stages.quantize(state)
    drafts = stages.explore(state, 0)
    return state, stages.regenerate(state, drafts, stages.rank(drafts, config))


def test_a_nonfinite_loss_skips_its_micro_batch_and_keeps_the_weights_finite():
    from solrl_core import stages

    state, rollout = _one_rollout(micro_batch=1)
    rollout.latents[0, 0] = math.nan  # one sample a broken sampler returned
    report = stages.update(state, rollout, 0)
    assert report.skipped_micro_batches > 0
    assert report.optimizer_steps == state.config.train.steps_per_iteration, "the other samples still train"
    assert all(bool(torch.isfinite(p).all()) for p in state.optimizer.param_groups[0]["params"])


def test_an_optimizer_step_that_leaves_a_nonfinite_weight_stops_the_update():
    """AdamW's step is bounded by the learning rate, but a low-precision or fused optimizer can
    overflow; the weights are checked after every step, before anything samples or saves them."""
    from solrl_core import stages
    from solrl_core.checkpoint import require_finite

    state, rollout = _one_rollout()
    step = state.optimizer.step

    def overflowing_step(*args, **kwargs):
        result = step(*args, **kwargs)
        with torch.no_grad():
            state.optimizer.param_groups[0]["params"][0].view(-1)[0] = math.inf
        return result

    state.optimizer.step = overflowing_step
    with pytest.raises(NonFiniteState, match="non-finite LoRA weight"):
        stages.update(state, rollout, 0)
    with pytest.raises(NonFiniteState):
        require_finite({"adapters/x": torch.tensor([1.0, math.inf])})


def test_a_learning_rate_that_overflows_stops_the_run_with_its_checkpoint_intact(flaky, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(out, "-S", "train.lr=1e39") == 1  # finite as a number, overflows float32 in the step
    err = one_error_line(capsys)
    assert "overflow" in err and "(0 iterations done)" in err
    checkpoint = load_file(str(out / CHECKPOINT))
    assert all(bool(torch.isfinite(t).all()) for t in checkpoint.values() if t.is_floating_point())


# --- the disk ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("target", "iteration", "done"), [
    ("ledger.parquet", 1, 1), ("checkpoint.safetensors", 1, 1), ("metrics.jsonl", 0, 0),
], ids=["ledger", "checkpoint", "metrics"])
def test_a_full_disk_stops_the_run_with_its_last_good_state_and_resume_continues(
        untroubled, tmp_path, capsys, monkeypatch, target, iteration, done):
    monkeypatch.setitem(registry.REWARDS, "flaky", flaky_record(FlakyReward))
    monkeypatch.setenv(faults.ENVIRONMENT, f"enospc@write:{target}:{iteration}")
    out = tmp_path / "run"
    assert run(out) == 1
    err = one_error_line(capsys)
    assert "No space left on device" in err and target in err and f"({done} iterations done)" in err
    assert not list(out.glob(".*")), "no temporary file is left behind"
    assert read_metadata(out)["next_iteration"] == done
    # Every file still holds a complete version: the ledger parses, the metrics lines are JSON.
    assert set(pl.read_parquet(out / "ledger.parquet")["iteration"].to_list()) <= set(range(iteration + 1))
    read_metrics(out / "metrics.jsonl")
    monkeypatch.delenv(faults.ENVIRONMENT)
    faults.reset()
    assert resume(out) == 0
    assert pl.read_parquet(out / "ledger.parquet").equals(untroubled, null_equal=True)
    assert finite_lora(out)


def test_an_output_directory_under_a_file_is_one_line_before_anything_runs(flaky, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert run(blocker / "run") == 2
    err = one_error_line(capsys)
    assert "is a file, so nothing can be written under it" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    assert flaky.calls == 0, "nothing ran"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where nobody (root included) can write")
def test_an_unwritable_output_directory_is_one_line_before_anything_runs(flaky, capsys):
    out = Path("/proc/solrl-test-run")
    assert run(out) == 2
    err = one_error_line(capsys)
    assert f"cannot write to output directory {out}" in err
    assert not out.exists() and flaky.calls == 0, "nothing created, nothing ran"


def test_only_the_stages_that_read_the_state_retry_once():
    """A retried update or requantize would apply its change twice; explore, rank, regenerate and
    evaluate only read the state, so a crash of theirs is retried once."""
    from tasks.stages import STAGE_TASKS

    retries = {name: task.retries for name, task in STAGE_TASKS.items()}
    assert retries == {"load": 0, "quantize": 0, "explore": 1, "rank": 1, "regenerate": 1, "update": 0,
                       "requantize": 0, "evaluate": 1}


def test_a_full_disk_reported_by_a_writing_library_is_the_oserror_it_is(tmp_path):
    """safetensors and polars report ENOSPC as errors of their own; the run's one line names the
    file and the cause whichever library was writing, and the previous file stays."""
    import errno

    from safetensors import SafetensorError

    from solrl_core.ledger import atomic_write

    target = tmp_path / "checkpoint.safetensors"
    target.write_bytes(b"previous")

    def full(temporary):
        Path(temporary).write_bytes(b"half")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(OSError) as raised:
        atomic_write(target, full)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(target)
    assert target.read_bytes() == b"previous" and sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_a_resume_that_fails_before_any_progress_does_not_advise_itself_again(untroubled, tmp_path, capsys,
                                                                              monkeypatch):
    """The advice of a failed resume that got no further than its checkpoint is to fix the cause,
    not the command that just failed."""
    monkeypatch.setitem(registry.REWARDS, "flaky", flaky_record(FlakyReward))
    out = tmp_path / "run"
    monkeypatch.setenv(faults.ENVIRONMENT, "raise@update:1")
    assert run(out) == 1
    assert f"resume with `solrl run --resume {out}`" in one_error_line(capsys), "the first failure may resume"
    faults.reset()
    assert resume(out) == 1  # the same fault strikes again in iteration 1
    err = one_error_line(capsys)
    assert "this resume got no further than its checkpoint (1 iterations done" in err and "--resume" not in err
