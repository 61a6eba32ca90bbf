"""The project's dvc.yaml on the reduced study (params-ci.yaml as params.yaml) in a temporary git +
DVC repository: one `dvc repro` skips the base stage (the committed checkpoint: no pretraining)
and runs every other stage (the fidelity sweep, families x seeds, the comparison, both ablations'
points and their comparisons, the report); no two stages declare one output; a second `dvc repro` does nothing; an experiment
that changes one ablation's points reruns that ablation's stages (and the report) alone; a queued
sweep is listed by `dvc exp show`; and a run stage, run alone, writes its own run folder and
nothing else.

Every command is the README's, as a user types it in a fresh clone after `make install`:
`.venv/bin/dvc ...` from the project folder, the virtual environment neither activated nor on the
PATH (the stages find it through scripts/python)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml

from tests._services import BIN, ROOT, environment, run

pytestmark = pytest.mark.slow

CHECKPOINT = "solrl_core/world/checkpoints/shapes-tiny.safetensors"
DVC = ".venv/bin/dvc"  # as the README writes it, relative to the project folder
PRETRAIN_DEPS = ["solrl_core/world/pretrain.py", "solrl_core/world/scenes.py", "solrl_core/world/captions.py"]
PIPELINE = "reports/pipeline"
# Written by DVC itself, not by a stage: the lock, and the .gitignore beside each cached output;
# and the MLflow store every study run logs to (a tracker beside the pipeline, not an output of it).
DVC_BOOKKEEPING = re.compile(r"(^|/)\.gitignore$|^dvc\.lock$|^mlflow\.db$|^mlruns/")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = tmp_path_factory.mktemp("pipeline")
    # The code, as a clone has it: the stages run the workspace's own copy (`python -m` from it).
    for package in ("solrl_core", "flows", "tasks"):
        shutil.copytree(ROOT / package, path / package, ignore=shutil.ignore_patterns("__pycache__", "*.pretrain-state*"))
    for relative in ["dvc.yaml", "scripts/python", CHECKPOINT, *PRETRAIN_DEPS]:
        (path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, path / relative)
    shutil.copy2(ROOT / "params-ci.yaml", path / "params.yaml")  # the reduced study
    # The clone's .venv as `make install` leaves it (here: this environment), ignored by git.
    (path / ".venv").symlink_to(BIN.parent, target_is_directory=True)
    (path / ".gitignore").write_text(".venv\n")
    env = environment(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid", GIT_COMMITTER_NAME="t",
                      GIT_COMMITTER_EMAIL="t@example.invalid")
    # The user's shell: the environment not activated, its bin/ not on the PATH, no PYTHONPATH.
    env["PATH"] = os.pathsep.join(entry for entry in env["PATH"].split(os.pathsep)
                                  if entry and Path(entry).resolve() != BIN.resolve())
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "CI"):  # CI: keep the stage commands' own defaults
        env.pop(name, None)

    def sh(*args, timeout=600):
        return run(list(args), env, path, timeout=timeout)

    sh("git", "init", "-q")
    sh(DVC, "init", "-q")
    # The committed checkpoint is the base stage's output: record it without retraining.
    sh(DVC, "commit", "-f", "base")
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "reduced pipeline")
    return path, sh


def ran_stages(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


def files(path: Path) -> dict[str, tuple[int, int]]:
    """Every file of the workspace but git's, DVC's and the environment's: (mtime, size) by path."""
    found = {}
    for folder, subfolders, names in os.walk(path):
        subfolders[:] = [name for name in subfolders if name not in (".git", ".dvc", ".venv")]
        for name in names:
            stat = (Path(folder) / name).stat()
            found[(Path(folder) / name).relative_to(path).as_posix()] = (stat.st_mtime_ns, stat.st_size)
    return found


def written(before: dict, after: dict) -> set[str]:
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}


def declared_outputs(path: Path, stages: set[str]) -> list[str]:
    lock = yaml.safe_load((path / "dvc.lock").read_text())["stages"]
    return [out["path"] for name in stages for out in lock[name].get("outs", [])]


def outside(names: set[str], outputs: list[str]) -> set[str]:
    """The files among ``names`` that are neither under one of ``outputs`` nor DVC's own."""
    return {name for name in names if not DVC_BOOKKEEPING.search(name)
            and not any(name == out or name.startswith(out.rstrip("/") + "/") for out in outputs)}


def study_runs(path: Path, study: dict) -> dict[tuple[str, str, str, str], object]:
    """The study's MLflow runs in the workspace's store, by (variant, ablation, point, seed) tags."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(study["tracking"]["experiment"])
    assert experiment is not None, "the study logged no MLflow experiment"
    found = {}
    for run in client.search_runs([experiment.experiment_id]):
        tags = run.data.tags
        key = (tags["solrl.variant"], tags.get("solrl.ablation", ""), tags.get("solrl.ablation_point", ""),
               tags["solrl.seed"])
        assert key not in found, f"two MLflow runs for {key}"
        found[key] = run
    return found


def test_repro_runs_the_pipeline_and_versions_ledger_and_lora(repo):
    path, sh = repo
    stages = set(sh(DVC, "stage", "list", "--name-only").stdout.split())
    study = yaml.safe_load((path / "params.yaml").read_text())
    runs = {f"train@{family}-{seed}" for family in study["families"] for seed in study["seeds"]}
    points = {f"{name}@{point}-{seed}" for name, section in study["ablations"].items()
              for point in section["points"] for seed in section["seeds"]}
    assert stages == {"base", "fidelity", "compare", "report", *runs, *points,
                      *(f"ablation@{name}" for name in study["ablations"])}

    result = sh(DVC, "repro")
    assert "'base' didn't change" in result.stdout, result.stdout[-2000:]
    assert ran_stages(result.stdout) == stages - {"base"}, result.stdout[-2000:]
    # No two stages declare one output, nor one inside another's.
    outputs = declared_outputs(path, stages)
    assert len(outputs) == len(set(outputs))
    assert not [(a, b) for a in outputs for b in outputs if a != b and a.startswith(b.rstrip("/") + "/")]

    run_dir = path / PIPELINE / "runs/sol_rl/seed-0"
    ledger = pl.read_parquet(run_dir / "ledger.parquet")
    assert ledger.height >= 2 * 8 and ledger["selected"].sum() == ledger.height // 2
    assert (run_dir / "lora.safetensors").is_file()
    lock = yaml.safe_load((path / "dvc.lock").read_text())
    [train_out] = lock["stages"]["train@sol_rl-0"]["outs"]
    assert train_out["path"] == f"{PIPELINE}/runs/sol_rl/seed-0" and train_out["md5"].endswith(".dir")
    # The ledger and the LoRA adapters sit in DVC's cache, not in git.
    assert "/seed-0" in (path / PIPELINE / "runs/sol_rl/.gitignore").read_text().split()

    report = json.loads((path / PIPELINE / "compare.json").read_text())
    assert list(report["families"]) == ["diffusionnft", "sol_rl", "sol_rl_adaptive"]
    assert set(report["speedups_by_family"]) == {"sol_rl", "sol_rl_adaptive"}
    for name, section in study["ablations"].items():
        ablation = json.loads((path / PIPELINE / f"ablation-{name}/compare.json").read_text())
        assert list(ablation["families"]) == [f"{name}={point}" for point in section["points"]]
    page = (path / PIPELINE / "README.md").read_text()
    assert "## Ranking fidelity" in page and "**paper** NVFP4" in page and "sol_rl_adaptive" in page
    assert "## Ablation: explore-steps" in page and "## Ablation: pool" in page and "paper HPSv2" in page

    # Every run of the study is in MLflow, in the study's experiment, tagged by what it is in the
    # study, with the modeled GPU-hours to plot its rewards against.
    logged = study_runs(path, study)
    assert set(logged) == ({(family, "", "", str(seed)) for family in study["families"] for seed in study["seeds"]}
                         | {(f"{name}={point}", name, str(point), str(seed)) for name, section in study["ablations"].items()
                            for point in section["points"] for seed in section["seeds"]})
    for run in logged.values():
        assert run.info.status == "FINISHED" and run.data.tags["solrl.study"] == study["tracking"]["experiment"]
        assert run.data.metrics["modeled_gpu_hours_cumulative"] > 0 and "eval/shapes-compliance" in run.data.metrics

    again = sh(DVC, "repro")
    assert not ran_stages(again.stdout), again.stdout[-2000:]
    assert set(study_runs(path, study)) == set(logged)  # nothing ran, nothing logged
    assert "Data and pipelines are up to date" in sh(DVC, "status").stdout
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "repro")


def test_experiment_with_set_params_runs_and_a_queued_pool_sweep_is_listed(repo):
    path, sh = repo
    before = files(path)
    # One more point of the pool ablation: its new run, its comparison and the report, nothing else.
    result = sh(DVC, "exp", "run", "-S", "ablations.pool.points=[6,8]")
    assert ran_stages(result.stdout) == {"pool@8-0", "ablation@pool", "report"}, result.stdout[-2000:]
    assert outside(written(before, files(path)) - {"params.yaml"},
                   declared_outputs(path, {"pool@8-0", "ablation@pool", "report"})) == set()
    ablation = json.loads((path / PIPELINE / "ablation-pool/compare.json").read_text())
    assert list(ablation["families"]) == ["pool=6", "pool=8"]
    assert json.loads((path / PIPELINE / "ablation-pool/runs/pool=8/seed-0/summary.json").read_text())[
        "config"]["pool"] == 8
    # The experiment's new run is logged beside the others, tagged with the DVC experiment it ran in.
    study = yaml.safe_load((path / "params.yaml").read_text())
    assert study_runs(path, study)[("pool=8", "pool", "8", "0")].data.tags.get("solrl.dvc_experiment")
    # A sweep over sol_rl's pool: one queued experiment per value (`dvc exp run --run-all` runs them
    # through the same execution as the experiment above; the test stops at the queue for time).
    sh(DVC, "exp", "run", "--queue", "-S", "families.sol_rl.pool=8,10,12")
    shown = json.loads(sh(DVC, "exp", "show", "--json").stdout)
    ran, queued = set(), set()
    for commit in shown:
        for experiment in commit.get("experiments") or []:
            for revision in experiment.get("revs", []):
                params = revision["data"]["params"]["params.yaml"]["data"]
                if (experiment.get("executor") or {}).get("state") == "queued":
                    queued.add(params["families"]["sol_rl"]["pool"])
                else:
                    metrics = revision["data"]["metrics"][f"{PIPELINE}/ablation-pool/compare_metrics.json"]["data"]
                    assert metrics["final_reward.pool=8"] > 0
                    ran.add(tuple(params["ablations"]["pool"]["points"]))
    assert ran == {(6, 8)}, json.dumps(shown)[:3000]
    assert queued == {8, 10, 12}, json.dumps(shown)[:3000]


def test_a_run_stage_alone_writes_only_its_own_run_folder(repo):
    path, sh = repo
    stage = "train@sol_rl_adaptive-0"
    before = files(path)
    sh(DVC, "repro", "--force", "--single-item", stage)
    changed = written(before, files(path))
    assert any(name.startswith(f"{PIPELINE}/runs/sol_rl_adaptive/seed-0/") for name in changed)
    assert outside(changed, declared_outputs(path, {stage})) == set()
    # Its outputs are new (the run records its own seconds), so what reads them is out of date:
    # the comparison, and nothing else, until it runs.
    status = json.loads(sh(DVC, "status", "--json").stdout)
    assert list(status) == ["compare"], status
    assert [list(change) for change in status["compare"]] == [["changed deps"]], status
