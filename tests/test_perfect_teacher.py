"""benchmarks/perfect_teacher.py: make run's adapter fine-tuned on ground truth, measured the way
a run is measured, so its figures can stand beside the RL's gain."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.perfect_teacher import ground_truth_latents, items_per_step, main  # noqa: E402

SMALL = ["iterations=1", "train.steps_per_iteration=2", "eval.prompts=2", "eval.seeds_per_prompt=2",
         "eval.steps=4", "regenerate.steps=4"]


def _args(settings: list[str]) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


def test_the_teacher_shows_the_renderer_s_drawings_which_score_as_ground_truth():
    from solrl_core.models.shapes_tiny import TinyArchitecture, latents_to_images
    from solrl_core.world.captions import training_prompts
    from solrl_core.world.rewards import shapes_compliance

    prompts = training_prompts(16, seed=3)
    images = latents_to_images(ground_truth_latents(prompts, image_size=32, patch=4), TinyArchitecture())
    assert float(shapes_compliance(images, prompts).min()) > 0.95


def test_each_step_trains_on_as_many_image_noise_pairs_as_an_rl_step():
    from solrl_core.presets import resolve_config

    config = resolve_config("shapes-tiny", "sol_rl")
    images, levels = items_per_step(config)
    kept = config.prompts_per_iteration * config.keep
    assert images * config.train.steps_per_iteration == kept
    assert levels == round(config.train.timestep_fraction * config.regenerate.steps)


def test_the_report_starts_from_the_base_a_run_records_and_its_gain_is_measured_at_the_run_s_budget(tmp_path):
    from solrl_core import stages
    from solrl_core.config import parse_override
    from solrl_core.presets import resolve_config

    out = tmp_path / "benchmarks" / "perfect_teacher.json"
    assert main([*_args(SMALL), "--checkpoints", "1,2", "--out", str(out), "--threads", "1"]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    config = resolve_config("shapes-tiny", "sol_rl", [parse_override(s) for s in SMALL] + [("progress", False)])
    base, _ = stages.evaluate(stages.initial_state(config), adapter=None)
    assert report["base"]["compliance"] == pytest.approx(base["shapes-compliance"], abs=1e-6)
    assert report["base"]["aesthetic"] == pytest.approx(base["shapes-aesthetic"], abs=1e-6)
    assert [entry["step"] for entry in report["evaluations"]] == [0, 1, 2]
    assert report["make_run_budget_steps"] == 2
    final = report["evaluations"][-1]
    assert report["gain_at_budget"]["trained"] == pytest.approx(final["trained"]["compliance"] - base["shapes-compliance"],
                                                                abs=1e-6)
    assert final["trained"] != report["base"]  # the adapter moved
    for entry in report["evaluations"]:
        assert all(0.0 <= value <= 1.0 for adapter in ("ema", "trained") for value in entry[adapter].values())

    from solrl_core.report_readme import write_readme

    row = next(line for line in write_readme(tmp_path).read_text(encoding="utf-8").splitlines()
               if line.startswith("| `perfect_teacher.json` |"))
    change = final["ema"]["compliance"] - report["base"]["compliance"]
    assert f"| {change:+.4f} ({report['gain_at_budget']['trained']:+.4f}) |" in row
    assert f"| the preset's ({report['base']['compliance']:.3f}) |" in row


def test_a_teacher_row_names_the_checkpoint_it_started_from(tmp_path):
    from solrl_core.report_readme import write_readme

    evaluation = {"compliance": 0.5, "amount": 0.5, "location": 0.5, "shape": 0.5, "aesthetic": 0.9}
    report = {"overrides": ["pool=16", "model.path=runs/base/s4500.safetensors"], "lr": 1e-3,
              "lora": {"rank": 8, "targets": ["to_q"]}, "make_run_budget_steps": 2, "base": evaluation,
              "evaluations": [{"step": 0, "ema": evaluation, "trained": evaluation},
                              {"step": 2, "ema": evaluation, "trained": evaluation}]}
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "perfect_teacher_b4500.json").write_text(json.dumps(report), encoding="utf-8")
    row = next(line for line in write_readme(tmp_path).read_text(encoding="utf-8").splitlines()
               if line.startswith("| `perfect_teacher_b4500.json` |"))
    assert "| `runs/base/s4500.safetensors` (0.500) |" in row


@pytest.mark.parametrize("argv, named", [
    (["--checkpoints", "0,4"], "--checkpoints"),
    (["--checkpoints", "four"], "four"),
    (["--set", "pool=many"], "pool"),
    (["--set", "model.loader=sd3"], "model.loader"),
    (["--set", "eval.rewards=[shapes-compliance]"], "eval.rewards"),
])
def test_a_bad_request_stops_with_one_line_and_writes_nothing(tmp_path, capsys, argv, named):
    out = tmp_path / "teacher.json"
    assert main([*argv, "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and named in error
    assert not out.exists()
