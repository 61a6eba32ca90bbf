"""The README's deployment commands, for real: a Prefect server on 127.0.0.1, a process work pool,
`prefect deploy --all` from prefect.yaml, a worker, and `prefect deployment run solrl/shapes-tiny`
with one short iteration given as parameters. The flow run must complete, run every stage as a
task and write the run's outputs. Timings of each step are printed (pytest -s) and attached to
the test report."""

from __future__ import annotations

import json
import re
import subprocess
import time

import polars as pl
import pytest

from tests._services import BIN, ROOT, environment, free_port, prefect_api, run, service, wait_for_http

pytestmark = pytest.mark.slow

STAGES = {"load", "quantize", "evaluate", "explore", "rank", "regenerate", "update", "requantize"}
DEPLOYMENTS = {"shapes-tiny", "flux-imagereward", "flux-clipscore", "sana-hpsv2", "sd35l-pickscore"}
SHORT = ["prompts_per_iteration=2", "pool=8", "keep=4", "eval.prompts=2", "eval.steps=4", "explore.steps=3",
         "regenerate.steps=4", "train.micro_batch=64"]


def test_deployment_runs_one_iteration_on_a_worker(tmp_path, record_property):
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = environment(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_API_URL=api,
                      PREFECT_WORKER_QUERY_SECONDS="2", PREFECT_WORKER_PREFETCH_SECONDS="2", PWD=str(ROOT),
                      MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", HF_HOME=str(tmp_path / "hf"))
    env.pop("SOLRL_FLUX_PATH", None)  # the flux-imagereward run below must find no weights
    timings = {}
    started = time.monotonic()
    with service([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui",
                  "--analytics-off"], tmp_path / "server.log", env, tmp_path) as server:
        wait_for_http(f"{api}/health", 180, server, tmp_path / "server.log")
        timings["server_start_s"] = time.monotonic() - started

        mark = time.monotonic()
        run([str(BIN / "prefect"), "work-pool", "create", "solrl-process", "--type", "process"], env, ROOT)
        deployed = run([str(BIN / "prefect"), "deploy", "--all"], env, ROOT)
        timings["pool_and_deploy_s"] = time.monotonic() - mark
        deployments = prefect_api(f"{api}/deployments/filter", {"limit": 50})
        assert {d["name"] for d in deployments} == DEPLOYMENTS, deployed.stdout[-2000:]

        out = tmp_path / "run"
        with service([str(BIN / "prefect"), "worker", "start", "--pool", "solrl-process", "--type", "process"],
                     tmp_path / "worker.log", env, ROOT):
            mark = time.monotonic()
            parameters = {"iterations": 1, "overrides": SHORT, "out": str(out)}
            result = run([str(BIN / "prefect"), "deployment", "run", "solrl/shapes-tiny", "--params",
                          json.dumps(parameters), "--watch", "--watch-interval", "2", "--watch-timeout", "480"],
                         env, ROOT, timeout=540)
            timings["deployment_run_s"] = time.monotonic() - mark
            # A real preset without its weights: the flow run fails with one line whose advice is
            # in the deployment's terms (its overrides parameter, the worker's environment).
            missing = subprocess.run(
                [str(BIN / "prefect"), "deployment", "run", "solrl/flux-imagereward", "--params",
                 json.dumps({"out": str(tmp_path / "flux")}), "--watch", "--watch-interval", "2",
                 "--watch-timeout", "300"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=360,
                stdin=subprocess.DEVNULL)

        flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", result.stdout).group(1)
        [flow_run] = prefect_api(f"{api}/flow_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})
        task_runs = prefect_api(f"{api}/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200})
        missing_id = re.search(r"UUID:\s*([0-9a-f-]{36})", missing.stdout).group(1)
        [missing_run] = prefect_api(f"{api}/flow_runs/filter", {"flow_runs": {"id": {"any_": [missing_id]}}})

    assert missing_run["state_type"] == "FAILED", missing.stdout[-3000:]
    message = missing_run["state"]["message"]
    assert "flux.1-dev weights not found" in message and "\n" not in message, message
    assert """prefect deployment run solrl/flux-imagereward --params '{"overrides": ["model.path=DIR"]}'""" in message
    assert "SOLRL_FLUX_PATH=DIR in the worker's environment" in message and "-S " not in message, message
    assert not (tmp_path / "flux").exists()

    assert flow_run["state_type"] == "COMPLETED", result.stdout[-3000:]
    # Every stage ran as a task: load, quantize, two evaluations and one of each iteration stage.
    names = sorted(run["name"].rsplit("-", 1)[0] for run in task_runs)
    assert names == sorted([*STAGES, "evaluate"]), names
    assert all(run["state_type"] == "COMPLETED" for run in task_runs)
    for name in ("ledger.parquet", "metrics.jsonl", "summary.json", "lora.safetensors", "samples_final.png"):
        assert (out / name).is_file(), f"{name} missing from {sorted(p.name for p in out.iterdir())}"
    ledger = pl.read_parquet(out / "ledger.parquet")
    assert ledger.height == 2 * 8 and ledger["selected"].sum() == 2 * 4
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iterations"] == 1 and summary["config"]["pool"] == 8
    worker_log = (tmp_path / "worker.log").read_text(errors="replace")
    for stage in STAGES:  # the runner's one line per stage, from inside Prefect task runs
        assert re.search(rf"- {stage}\s+[0-9.]+ s", worker_log), f"no '{stage}' line in the worker log"
    timings["total_s"] = time.monotonic() - started
    for key, value in timings.items():
        record_property(key, round(value, 1))
    print("prefect deployment timings:", json.dumps({k: round(v, 1) for k, v in timings.items()}))


def test_the_command_line_keeps_its_own_advice():
    """`solrl run` (the flow in its own process, no deployment) keeps the -S advice."""
    from flows.deployment_advice import advice_for_this_run
    from solrl_core.models.loading import ModelFilesMissing

    error = ModelFilesMissing("weights not found; give it with -S model.path=DIR or SOLRL_FLUX_PATH=DIR")
    assert advice_for_this_run(error) is error


def test_deployment_advice_rewrites_every_command_line_setting():
    from flows.deployment_advice import for_deployment

    reward = for_deployment("put ImageReward.pt in a folder and give it with -S 'reward_paths={imagereward: DIR}' "
                            "or SOLRL_IMAGEREWARD_PATH=DIR, or pre-fill the cache", "solrl/flux-imagereward")
    assert """--params '{"overrides": ["reward_paths={imagereward: DIR}"]}'""" in reward
    assert "SOLRL_IMAGEREWARD_PATH=DIR in the worker's environment, or pre-fill" in reward and "-S" not in reward
    tiny = for_deployment("writes with -S model.path=FILE (empty: the committed one)", "solrl/shapes-tiny")
    assert tiny == ("""writes with `prefect deployment run solrl/shapes-tiny --params '{"overrides": """
                    """["model.path=FILE"]}'` (empty: the committed one)""")
