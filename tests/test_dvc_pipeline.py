"""The project's dvc.yaml, reduced (sol_rl alone, a few seeds), in a temporary git + DVC repository:
`dvc repro` skips the committed pretraining and runs fidelity -> train -> compare -> report, the seed
ledger and LoRA checkpoint are DVC-cached outputs, `dvc exp run -S ...` reruns only what depends
on the changed params, and a queued sweep over pool sizes is listed by `dvc exp show`.

Every command is the README's, as a user types it in a fresh clone after `make install`:
`.venv/bin/dvc ...` from the project folder, the virtual environment neither activated nor on the
PATH (the stages find it through scripts/python)."""

from __future__ import annotations

import json
import os
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


def reduced_params() -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params.update(prompts_per_iteration=2, explore={"steps": 3}, regenerate={"steps": 4},
                  eval={"prompts": 2, "steps": 4}, families={"sol_rl": {"pool": 8, "keep": 4}})
    params["compare"].update(budget_gpu_hours=3e-9, evaluations=1)  # one or two iterations
    params["fidelity"].update(prompts=1, pool=4, explore_steps="2", backends="emulated-nvfp4")
    return params


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = tmp_path_factory.mktemp("pipeline")
    # The code, as a clone has it: the stages run the workspace's own copy (`python -m` from it).
    for package in ("solrl_core", "flows", "tasks"):
        shutil.copytree(ROOT / package, path / package, ignore=shutil.ignore_patterns("__pycache__", "*.pretrain-state*"))
    for relative in ["dvc.yaml", "scripts/python", CHECKPOINT, *PRETRAIN_DEPS]:
        (path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, path / relative)
    (path / "params.yaml").write_text(yaml.safe_dump(reduced_params(), sort_keys=False))
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
    # The committed checkpoint is the pretrain stage's output: record it without retraining.
    sh(DVC, "commit", "-f", "pretrain")
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "reduced pipeline")
    return path, sh


def test_repro_runs_the_pipeline_and_versions_ledger_and_lora(repo):
    path, sh = repo
    result = sh(DVC, "repro")
    assert "'pretrain' didn't change" in result.stdout, result.stdout[-2000:]
    run_dir = path / "reports/pipeline/runs/sol_rl"
    ledger = pl.read_parquet(run_dir / "ledger.parquet")
    assert ledger.height >= 2 * 8 and ledger["selected"].sum() == ledger.height // 2
    assert (run_dir / "lora.safetensors").is_file()
    report = json.loads((path / "reports/pipeline/compare.json").read_text())
    assert set(report["families"]) == {"sol_rl"}
    assert (path / "reports/pipeline/fidelity.json").is_file() and (path / "reports/pipeline/README.md").is_file()
    lock = yaml.safe_load((path / "dvc.lock").read_text())
    [train_out] = lock["stages"]["train@sol_rl"]["outs"]
    assert train_out["path"] == "reports/pipeline/runs/sol_rl" and train_out["md5"].endswith(".dir")
    # The ledger and the LoRA adapters sit in DVC's cache, not in git.
    assert "/sol_rl" in (path / "reports/pipeline/runs/.gitignore").read_text().split()
    assert "Data and pipelines are up to date" in sh(DVC, "status").stdout
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "repro")


def test_experiment_with_set_params_runs_and_a_queued_pool_sweep_is_listed(repo):
    path, sh = repo
    result = sh(DVC, "exp", "run", "-S", "explore.steps=2", "-S", "families.sol_rl.pool=6")
    assert "'fidelity' didn't change" in result.stdout, result.stdout[-2000:]
    summary = json.loads((path / "reports/pipeline/runs/sol_rl/summary.json").read_text())
    assert summary["config"]["explore"]["steps"] == 2 and summary["config"]["pool"] == 6
    # A sweep over pool sizes: one queued experiment per value (`dvc exp run --run-all` runs them
    # through the same execution as the experiment above; the test stops at the queue for time).
    sh(DVC, "exp", "run", "--queue", "-S", "families.sol_rl.pool=8,10,12")
    shown = json.loads(sh(DVC, "exp", "show", "--json").stdout)
    ran, queued = set(), set()
    for commit in shown:
        for experiment in commit.get("experiments") or []:
            for revision in experiment.get("revs", []):
                params = revision["data"]["params"]["params.yaml"]["data"]
                point = (params["explore"]["steps"], params["families"]["sol_rl"]["pool"])
                if (experiment.get("executor") or {}).get("state") == "queued":
                    queued.add(point)
                else:
                    metrics = revision["data"]["metrics"]["reports/pipeline/compare_metrics.json"]["data"]
                    assert metrics["final_reward.sol_rl"] > 0
                    ran.add(point)
    assert ran == {(2, 6)}, json.dumps(shown)[:3000]
    assert {pool for _, pool in queued} == {8, 10, 12}, json.dumps(shown)[:3000]
