"""The seed ledger: one Parquet row per explored seed, appended atomically."""

import json

import polars as pl
import pytest
import torch

from solrl_core.ledger import append_jsonl, append_ledger, ledger_frame, write_json

REWARD_NAMES = ("shapes-compliance", "shapes-aesthetic")


def make_frame(iteration, groups=2, pool=6, keep=2, with_fp=True):
    generator = torch.Generator().manual_seed(iteration)
    seeds = torch.randint(0, 2**62, (groups, pool), generator=generator, dtype=torch.int64)
    seeds[0, 0] = 2**62 - 1  # the largest seed must survive the Parquet round trip
    explore_scores = {name: torch.rand(groups, pool, generator=generator) for name in REWARD_NAMES}
    explore_combined = 0.7 * explore_scores[REWARD_NAMES[0]] + 0.3 * explore_scores[REWARD_NAMES[1]]
    selection = torch.stack([torch.randperm(pool, generator=generator)[:keep] for _ in range(groups)])
    fp_scores = {name: torch.rand(groups, keep, generator=generator) for name in REWARD_NAMES} if with_fp else None
    fp_combined = torch.rand(groups, keep, generator=generator) if with_fp else None
    advantages = torch.randn(groups, keep, generator=generator)
    update_steps = torch.randint(0, 3, (groups, keep), generator=generator)
    frame = ledger_frame(iteration, [f"prompt {iteration}-{g}" for g in range(groups)],
                         [100 * iteration + g for g in range(groups)], seeds, explore_scores, explore_combined,
                         selection, fp_scores, fp_combined, advantages, update_steps)
    inputs = dict(seeds=seeds, explore_scores=explore_scores, explore_combined=explore_combined,
                  selection=selection, fp_scores=fp_scores, fp_combined=fp_combined, advantages=advantages,
                  update_steps=update_steps)
    return frame, inputs


EXPECTED_COLUMNS = [
    "iteration", "prompt_id", "prompt", "seed", "explore_reward",
    "explore_shapes-compliance", "explore_shapes-aesthetic", "selected", "fp_reward",
    "fp_shapes-compliance", "fp_shapes-aesthetic", "advantage", "update_step",
]


def test_ledger_has_the_documented_columns_and_types():
    frame, _ = make_frame(0)
    assert frame.columns == EXPECTED_COLUMNS
    assert frame.schema["seed"] == pl.Int64
    assert frame.schema["selected"] == pl.Boolean
    assert frame.schema["prompt"] == pl.String
    assert frame.schema["iteration"].is_integer() and frame.schema["prompt_id"].is_integer()
    assert frame.schema["update_step"].is_integer()
    for column in EXPECTED_COLUMNS:
        if column.startswith(("explore_", "fp_")) or column == "advantage":
            assert frame.schema[column] == pl.Float64, column


def test_ledger_has_one_row_per_explored_seed_in_group_order():
    frame, inputs = make_frame(3, groups=2, pool=6)
    assert frame.height == 12
    assert frame["seed"].to_list() == inputs["seeds"].flatten().tolist()
    assert frame["prompt_id"].to_list() == [300] * 6 + [301] * 6
    assert frame["prompt"].to_list() == ["prompt 3-0"] * 6 + ["prompt 3-1"] * 6
    assert set(frame["iteration"].to_list()) == {3}
    assert frame["explore_reward"].to_list() == pytest.approx(inputs["explore_combined"].flatten().tolist())
    assert frame["explore_shapes-aesthetic"].to_list() == pytest.approx(
        inputs["explore_scores"]["shapes-aesthetic"].flatten().tolist())


def test_kept_rows_carry_fp_rewards_and_advantages_and_the_rest_are_null():
    frame, inputs = make_frame(1, groups=2, pool=6, keep=2)
    pool = 6
    selected = frame["selected"].to_list()
    assert sum(selected) == 4
    for g in range(2):
        for k, index in enumerate(inputs["selection"][g].tolist()):
            row = frame.row(g * pool + index, named=True)
            assert row["selected"] is True
            assert row["advantage"] == pytest.approx(inputs["advantages"][g, k].item())
            assert row["update_step"] == int(inputs["update_steps"][g, k])
            assert row["fp_reward"] == pytest.approx(inputs["fp_combined"][g, k].item())
            for name in REWARD_NAMES:
                assert row[f"fp_{name}"] == pytest.approx(inputs["fp_scores"][name][g, k].item())
    unselected = frame.filter(~pl.col("selected"))
    assert unselected.height == 8
    for column in ("fp_reward", "fp_shapes-compliance", "fp_shapes-aesthetic", "advantage", "update_step"):
        assert unselected[column].null_count() == 8, column
        assert frame.filter(pl.col("selected"))[column].null_count() == 0, column
    assert unselected["explore_reward"].null_count() == 0


def test_families_without_regeneration_have_null_fp_columns_but_advantages():
    frame, _ = make_frame(2, with_fp=False)
    for column in ("fp_reward", "fp_shapes-compliance", "fp_shapes-aesthetic"):
        assert frame[column].null_count() == frame.height
    assert frame.filter(pl.col("selected"))["advantage"].null_count() == 0


def test_append_ledger_concatenates_iterations_and_round_trips(tmp_path):
    path = tmp_path / "run" / "ledger.parquet"
    frames = [make_frame(i)[0] for i in range(3)]
    for frame in frames:
        append_ledger(path, frame)
    ledger = pl.read_parquet(path)
    assert ledger.height == sum(f.height for f in frames)
    assert ledger["iteration"].to_list() == [i for f in frames for i in f["iteration"].to_list()]
    assert ledger["seed"].to_list() == [s for f in frames for s in f["seed"].to_list()]
    assert 2**62 - 1 in ledger["seed"].to_list()
    assert ledger.columns == EXPECTED_COLUMNS
    assert ledger.equals(pl.concat(frames, how="vertical_relaxed"))


def test_append_ledger_accepts_an_all_null_fp_iteration_after_a_full_one(tmp_path):
    path = tmp_path / "ledger.parquet"
    append_ledger(path, make_frame(0)[0])
    append_ledger(path, make_frame(1, with_fp=False)[0])
    ledger = pl.read_parquet(path)
    assert ledger.schema["fp_reward"] == pl.Float64
    assert ledger.filter(pl.col("iteration") == 1)["fp_reward"].null_count() == 12


def test_failed_append_leaves_the_previous_ledger_intact_and_no_temp_files(tmp_path, monkeypatch):
    path = tmp_path / "ledger.parquet"
    append_ledger(path, make_frame(0)[0])
    before = path.read_bytes()

    def write_half_then_fail(self, file, *args, **kwargs):
        with open(file, "wb") as handle:
            handle.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", write_half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        append_ledger(path, make_frame(1)[0])
    monkeypatch.undo()

    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.parquet"]
    assert set(pl.read_parquet(path)["iteration"].to_list()) == {0}


def test_failed_first_append_creates_no_ledger(tmp_path, monkeypatch):
    def fail(self, file, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pl.DataFrame, "write_parquet", fail)
    with pytest.raises(KeyboardInterrupt):
        append_ledger(tmp_path / "ledger.parquet", make_frame(0)[0])
    assert list(tmp_path.iterdir()) == []


def test_json_outputs_are_written_whole_and_jsonl_appends(tmp_path):
    summary = tmp_path / "summary.json"
    write_json(summary, {"reward": torch.tensor([1.0, 2.0]), "out": tmp_path})
    assert json.loads(summary.read_text()) == {"reward": [1.0, 2.0], "out": str(tmp_path)}
    metrics = tmp_path / "metrics.jsonl"
    append_jsonl(metrics, {"iteration": 0})
    append_jsonl(metrics, {"iteration": 1})
    assert [json.loads(line) for line in metrics.read_text().splitlines()] == [{"iteration": 0}, {"iteration": 1}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "summary.json"]


def test_a_kept_sample_that_trained_in_no_step_has_a_null_update_step():
    frame, inputs = make_frame(2, groups=1, pool=6, keep=2)
    steps = inputs["update_steps"].clone()
    steps[0, 1] = -1  # its reward was not finite: kept, left out of the update
    frame = ledger_frame(2, ["p"], [0], inputs["seeds"], inputs["explore_scores"], inputs["explore_combined"],
                         inputs["selection"], inputs["fp_scores"], inputs["fp_combined"], inputs["advantages"], steps)
    kept = inputs["selection"][0].tolist()
    assert frame["update_step"][kept[0]] == int(steps[0, 0]) and frame["update_step"][kept[1]] is None
