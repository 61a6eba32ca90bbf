"""benchmarks/rl_gain.py: the table of what moves make run's held-out gain states what each run
changed from its own record, pools seeds honestly, and refuses folders it cannot read."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.rl_gain import main
from solrl_core.config import parse_override, to_dict
from solrl_core.presets import resolve_config


def _finished_run(folder, overrides=(), seed=0, compliance=(0.50, 0.55), aesthetic=(0.95, 0.94), family="sol_rl"):
    """A run folder as `solrl run` leaves it: summary.json with the resolved config and evaluations."""
    config = resolve_config("shapes-tiny", family, [parse_override(o) for o in (*overrides, f"seed={seed}")])
    evaluations = [{"iteration": -1, "shapes-compliance": compliance[0], "shapes-aesthetic": aesthetic[0]},
                   {"iteration": 4, "shapes-compliance": max(compliance) + 0.01, "shapes-aesthetic": aesthetic[0]},
                   {"iteration": 19, "shapes-compliance": compliance[1], "shapes-aesthetic": aesthetic[1]}]
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(
        {"config": to_dict(config), "evaluations": evaluations, "seconds": 300.0, "threads": 2}))
    return folder


def _report(tmp_path, folders):
    out = tmp_path / "rl_gain.json"
    assert main([*map(str, folders), "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_a_row_names_exactly_the_settings_its_run_changed(tmp_path):
    changed = _finished_run(tmp_path / "a", ["pool=16", "keep=4", "prompts_per_iteration=24"], seed=3)
    preset = _finished_run(tmp_path / "b")
    rows = {row["run"]: row for row in _report(tmp_path, [changed, preset])["runs"]}
    # The seed names the run; it is not a setting.
    assert rows[str(changed)]["settings"] == {"keep": "4", "pool": "16", "prompts_per_iteration": "24"}
    assert rows[str(preset)]["settings"] == {}


def test_a_copy_of_the_committed_checkpoint_is_no_change_and_other_weights_are(tmp_path):
    from solrl_core.world import SHAPES_TINY_CHECKPOINT

    copy, other = tmp_path / "copy.safetensors", tmp_path / "other.safetensors"
    copy.write_bytes(SHAPES_TINY_CHECKPOINT.read_bytes())
    weights = bytearray(SHAPES_TINY_CHECKPOINT.read_bytes())
    weights[-1] ^= 1  # one bit of the last weight
    other.write_bytes(bytes(weights))
    on_copy = _finished_run(tmp_path / "a", [f"model.path={copy}", "pool=48"])
    on_other = _finished_run(tmp_path / "b", [f"model.path={other}"])
    rows = {row["run"]: row for row in _report(tmp_path, [on_copy, on_other])["runs"]}
    assert rows[str(on_copy)]["settings"] == {"pool": "48"}
    assert rows[str(on_other)]["settings"] == {"model.path": str(other)}


def test_seeds_of_one_setting_pool_into_a_mean_and_its_standard_error(tmp_path):
    runs = [_finished_run(tmp_path / "s0", ["train.lr=0.002"], seed=0, compliance=(0.50, 0.56)),
            _finished_run(tmp_path / "s1", ["train.lr=0.002"], seed=1, compliance=(0.50, 0.60)),
            _finished_run(tmp_path / "p0", seed=0, compliance=(0.50, 0.51), aesthetic=(0.95, 0.90))]
    report = _report(tmp_path, runs)
    best, preset = report["settings"]
    assert best["settings"] == "train.lr=0.002" and best["seeds"] == [0, 1]
    assert best["gain_mean"] == pytest.approx(0.08)
    assert best["gain_se"] == pytest.approx(math.sqrt(0.04**2 / 2 / 2))
    assert best["peak_gain_mean"] == pytest.approx(0.09)  # the iteration-4 evaluation, 0.01 over the best final
    assert not best["meets_goal"]  # +0.08 is short of +0.10
    # One seed has no standard error, and a gain paid for in the aesthetic is reported beside it.
    assert preset["settings"] == "the preset as it is" and preset["gain_se"] is None
    assert preset["untrained_change_mean"]["shapes-aesthetic"] == pytest.approx(-0.05)


def test_two_families_runs_with_the_same_changes_are_never_pooled(tmp_path):
    # Settings are differences from the run's own family: naive_scaling at the preset is not sol_rl.
    sol_rl = _finished_run(tmp_path / "sol", seed=0, compliance=(0.50, 0.60))
    scaling = _finished_run(tmp_path / "scaling", seed=1, compliance=(0.50, 0.52), family="naive_scaling")
    entries = _report(tmp_path, [sol_rl, scaling])["settings"]
    assert [(e["family"], e["settings"], e["seeds"]) for e in entries] == [
        ("sol_rl", "the preset as it is", [0]), ("naive_scaling", "the preset as it is", [1])]
    assert [e["gain_mean"] for e in entries] == pytest.approx([0.10, 0.02])


def test_the_goal_needs_the_gain_and_the_untrained_reward_kept(tmp_path):
    kept = _finished_run(tmp_path / "kept", ["train.lr=0.002"], compliance=(0.50, 0.61), aesthetic=(0.95, 0.93))
    hacked = _finished_run(tmp_path / "hacked", compliance=(0.50, 0.70), aesthetic=(0.95, 0.90))
    goals = {entry["settings"]: entry["meets_goal"] for entry in _report(tmp_path, [kept, hacked])["settings"]}
    assert goals == {"train.lr=0.002": True, "the preset as it is": False}


def test_a_folder_that_is_not_a_finished_run_stops_with_one_line(tmp_path, capsys):
    good = _finished_run(tmp_path / "good")
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    out = tmp_path / "rl_gain.json"
    assert main([str(good), str(unfinished), "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "unfinished" in error and "summary.json" in error
    assert not out.exists()


def test_the_reports_page_has_a_row_per_setting_best_gain_first(tmp_path):
    from solrl_core.report_readme import write_readme

    runs = [_finished_run(tmp_path / "runs" / "lr", ["train.lr=0.002"], compliance=(0.50, 0.58)),
            _finished_run(tmp_path / "runs" / "preset", compliance=(0.50, 0.51))]
    (tmp_path / "benchmarks").mkdir()
    assert main([*map(str, runs), "--out", str(tmp_path / "benchmarks" / "rl_gain.json")]) == 0
    page = write_readme(tmp_path).read_text(encoding="utf-8")
    rows = [line for line in page.splitlines() if line.startswith("| train.lr=0.002 |")
            or line.startswith("| the preset as it is |")]
    assert rows[0].startswith("| train.lr=0.002 | 0 | 20 | +0.0800 |")
    assert rows[1].startswith("| the preset as it is | 0 | 20 | +0.0100 |")
    assert "300 (2)" in rows[0]


def test_a_later_table_s_rows_join_the_page_after_the_first_table_s(tmp_path):
    """Runs made after the first table's run folders are gone go to rl_gain_<name>.json; the page
    shows one table with the first file's rows, then each later file's."""
    from solrl_core.report_readme import write_readme

    (tmp_path / "benchmarks").mkdir()
    first = _finished_run(tmp_path / "runs" / "preset", compliance=(0.50, 0.51))
    later = _finished_run(tmp_path / "runs" / "lr", ["train.lr=0.002"], compliance=(0.50, 0.58))
    assert main([str(first), "--out", str(tmp_path / "benchmarks" / "rl_gain.json")]) == 0
    assert main([str(later), "--out", str(tmp_path / "benchmarks" / "rl_gain_later.json")]) == 0
    page = write_readme(tmp_path).read_text(encoding="utf-8")
    rows = [line for line in page.splitlines() if line.startswith(("| the preset as it is |", "| train.lr=0.002 |"))]
    assert [row.split(" | ")[0] for row in rows] == ["| the preset as it is", "| train.lr=0.002"]
    assert rows[1].startswith("| train.lr=0.002 | 0 | 20 | +0.0800 |")


def test_the_made_of_sentence_names_the_rows_that_start_from_another_base():
    from solrl_core.report_readme import _terms_sentence

    def run(name, amount):
        return {"run": name, "terms": {"compliance": {"base": 0.5}, "amount": {"base": amount}}}

    report = {"runs": [run("a", 0.7), run("b", 0.7), run("wide", 0.9)],
              "settings": [{"settings": "the preset as it is", "runs": ["a"]},
                           {"settings": "train.lr=0.002", "runs": ["b"]},
                           {"settings": "model.path=wide.safetensors", "runs": ["wide"]}]}
    sentence = _terms_sentence(report)
    assert "the base scores amount 0.700;" in sentence
    assert "`model.path=wide.safetensors` start from another base: amount 0.900" in sentence


def test_the_made_of_sentence_names_several_settings_on_one_other_base_by_its_checkpoint():
    """Settings tried on one other base read as that base's path, not as one run-together list."""
    from solrl_core.report_readme import _terms_sentence

    def run(name, amount, model_path=None):
        settings = {"model.path": model_path} if model_path else {}
        return {"run": name, "settings": settings,
                "terms": {"compliance": {"base": 0.5}, "amount": {"base": amount}}}

    report = {"runs": [run("a", 0.7), run("b", 0.7), run("early1", 0.6, "early.safetensors"),
                       run("early2", 0.6, "early.safetensors"), run("mixed", 0.4, "x.safetensors")],
              "settings": [{"settings": "the preset as it is", "runs": ["a"]},
                           {"settings": "train.lr=0.002", "runs": ["b"]},
                           {"settings": "model.path=early.safetensors", "runs": ["early1"]},
                           {"settings": "model.path=early.safetensors, train.lr=0.0003", "runs": ["early2"]},
                           {"settings": "model.path=x.safetensors, pool=16", "runs": ["mixed"]}]}
    sentence = _terms_sentence(report)
    assert "the runs of `model.path=early.safetensors` (2 settings) start from another base: amount 0.600" in sentence
    assert "the runs of `model.path=x.safetensors, pool=16` start from another base: amount 0.400" in sentence


def test_a_path_setting_reads_as_given_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prompts = tmp_path / "prompts" / "few.txt"
    prompts.parent.mkdir()
    prompts.write_text("a large red circle in the center on a white background\n")
    run = _finished_run(tmp_path / "run", [f"prompts.train_file={prompts}"])
    assert _report(tmp_path, [run])["runs"][0]["settings"] == {"prompts.train_file": "prompts/few.txt"}


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A real two-iteration run of make run's job, made small."""
    from flows.cli import main as solrl

    out = tmp_path_factory.mktemp("real") / "run"
    small = ["prompts_per_iteration=2", "pool=8", "keep=4", "eval.prompts=4", "eval.seeds_per_prompt=2",
             "eval.steps=4", "explore.steps=3", "regenerate.steps=4", "progress=false"]
    assert solrl(["run", "--preset", "shapes-tiny", "--iterations", "2", "--out", str(out), "--no-tracking",
                  *[arg for setting in small for arg in ("-S", setting)]]) == 0
    return out


def test_terms_split_the_images_the_run_was_scored_on(real_run, tmp_path):
    out = tmp_path / "rl_gain.json"
    assert main([str(real_run), "--terms", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    row, summary = report["runs"][0], json.loads((real_run / "summary.json").read_text())
    # The resampled images score what the run recorded, before and after training.
    assert row["terms"]["compliance"]["base"] == pytest.approx(summary["evaluations"][0]["shapes-compliance"], abs=1e-3)
    assert row["terms"]["compliance"]["final"] == pytest.approx(summary["evaluations"][-1]["shapes-compliance"], abs=1e-3)
    assert set(row["terms"]) == {"compliance", "background", "amount", "location", "shape"}
    assert all(0.0 <= side <= 1.0 for term in row["terms"].values() for side in term.values())
    change = report["settings"][0]["term_change_mean"]
    assert change["amount"] == pytest.approx(row["terms"]["amount"]["final"] - row["terms"]["amount"]["base"])


def test_terms_refuse_a_run_whose_record_its_images_do_not_match(real_run, tmp_path, capsys):
    import shutil

    altered = tmp_path / "altered"
    shutil.copytree(real_run, altered)
    summary = json.loads((altered / "summary.json").read_text())
    summary["evaluations"][-1]["shapes-compliance"] += 0.05  # a record of other images than these adapters draw
    (altered / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "rl_gain.json"
    assert main([str(altered), "--terms", "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "resampled" in error and "final" in error
    assert not out.exists()
    (altered / "lora.safetensors").unlink()
    assert main([str(altered), "--terms", "--out", str(out)]) == 2
    assert "lora.safetensors" in capsys.readouterr().err


def test_terms_sample_a_shared_base_once_and_still_check_every_record(real_run, tmp_path, monkeypatch, capsys):
    import shutil

    from solrl_core import stages

    twin = tmp_path / "twin"
    shutil.copytree(real_run, twin)
    calls = []
    evaluate = stages.evaluate
    monkeypatch.setattr(stages, "evaluate", lambda state, adapter=None: calls.append(adapter) or evaluate(state, adapter))
    out = tmp_path / "rl_gain.json"
    assert main([str(real_run), str(twin), "--terms", "--out", str(out)]) == 0
    assert calls.count(None) == 1 and len(calls) == 3  # one base, two finals
    first, second = json.loads(out.read_text())["runs"]
    assert first["terms"] == second["terms"]
    # A run whose recorded base is not the shared base's images is refused, cache or not.
    summary = json.loads((twin / "summary.json").read_text())
    summary["evaluations"][0]["shapes-compliance"] += 0.05
    (twin / "summary.json").write_text(json.dumps(summary))
    out.unlink()
    assert main([str(real_run), str(twin), "--terms", "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "twin" in error and "base" in error
    assert not out.exists()


def test_a_wide_evaluation_contains_the_run_s_own_and_pairs_base_with_final(real_run, tmp_path):
    summary = json.loads((real_run / "summary.json").read_text())
    base, final = summary["evaluations"][0], summary["evaluations"][-1]
    out = tmp_path / "rl_gain.json"
    # The run's own 4 prompts: the wide evaluation is its record, resampled.
    assert main([str(real_run), "--wide-eval", "4", "--out", str(out)]) == 0
    own = json.loads(out.read_text())["runs"][0]["wide"]
    assert own["samples"] == 8
    assert own["change"]["shapes-compliance"]["mean"] == pytest.approx(
        final["shapes-compliance"] - base["shapes-compliance"], abs=2e-3)
    assert own["change"]["shapes-aesthetic"]["mean"] == pytest.approx(
        final["shapes-aesthetic"] - base["shapes-aesthetic"], abs=2e-3)
    # Twelve prompts: three times the images, the change split by how many objects a prompt asks for.
    assert main([str(real_run), "--wide-eval", "12", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    wide = report["runs"][0]["wide"]
    assert wide["prompts"] == 12 and wide["samples"] == 24
    change, strata = wide["change"]["shapes-compliance"], wide["change_by_stratum"]
    assert sum(s["prompts"] for s in strata.values()) == 12 and set(strata) <= {"1 object", "2 objects"}
    assert sum(s["prompts"] * s["mean"] for s in strata.values()) / 12 == pytest.approx(change["mean"])
    assert change["mean"] == pytest.approx(wide["final"]["shapes-compliance"] - wide["base"]["shapes-compliance"])
    assert change["se"] > 0
    assert report["settings"][0]["wide_gain"] == {"mean": pytest.approx(change["mean"]), "se": None}


def test_a_wide_evaluation_refuses_a_record_it_does_not_contain(real_run, tmp_path, capsys):
    import shutil

    altered = tmp_path / "altered"
    shutil.copytree(real_run, altered)
    summary = json.loads((altered / "summary.json").read_text())
    summary["evaluations"][0]["shapes-compliance"] += 0.05  # a base of other images than these
    (altered / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "rl_gain.json"
    assert main([str(altered), "--wide-eval", "8", "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "wide set" in error and "base" in error
    # Fewer prompts than the run was scored on cannot contain its record.
    assert main([str(real_run), "--wide-eval", "2", "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "at least" in error
    assert not out.exists()
    with pytest.raises(SystemExit) as stopped:
        main([str(real_run), "--wide-eval", "zero", "--out", str(out)])
    assert stopped.value.code == 2 and "whole number" in capsys.readouterr().err


def test_the_reports_page_shows_each_seed_s_wide_gain_beside_its_own(real_run, tmp_path):
    import shutil

    from solrl_core.report_readme import write_readme

    (tmp_path / "benchmarks").mkdir()
    run = tmp_path / "runs" / "wide"
    shutil.copytree(real_run, run)
    out = tmp_path / "benchmarks" / "rl_gain.json"
    assert main([str(run), "--wide-eval", "8", "--out", str(out)]) == 0
    wide = json.loads(out.read_text())["runs"][0]["wide"]
    page = write_readme(tmp_path).read_text(encoding="utf-8")
    assert "on 8 held-out prompts, per seed" in page and "16 images" in page
    row = next(line for line in page.splitlines() if "keep=4" in line and "pool=8" in line)
    change = wide["change"]["shapes-compliance"]
    assert f"{change['mean']:+.4f} ± {change['se']:.4f}" in row.split(" | ")[-2]


def test_a_damaged_adapter_file_is_named_and_never_sampled(tmp_path, capsys):
    """The table resamples a run's final EMA from lora.safetensors: a file whose tensors no longer
    match the digest the run recorded is refused in one line, before any image is scored."""
    from solrl_core.training import run_training
    from test_end_to_end import SMALL

    run = tmp_path / "run"
    overrides = [parse_override(text) for text in SMALL[1::2]] + [("iterations", 1)]
    run_training(resolve_config("shapes-tiny", "sol_rl", overrides), run, log=lambda line: None)
    adapters = run / "lora.safetensors"
    data = bytearray(adapters.read_bytes())
    data[-64] ^= 0xFF  # in the last tensor's bytes: the header still parses
    adapters.write_bytes(bytes(data))
    out = tmp_path / "rl_gain.json"
    assert main([str(run), "--wide-eval", "2", "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "lora.safetensors is damaged" in error, error
    assert not out.exists()
