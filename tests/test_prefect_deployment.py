"""The README's deployment commands, for real: a Prefect server on 127.0.0.1, a process work pool,
`prefect deploy --all` from prefect.yaml, a worker, and `prefect deployment run solrl/shapes-tiny`
with one short iteration given as parameters. The flow run must complete, run every stage as a
task and write the run's outputs. Timings of each step are printed (pytest -s) and attached to
the test report."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import polars as pl
import pytest

from tests._services import BIN, ROOT, environment, free_port, run, service, wait_for_http

pytestmark = pytest.mark.slow

STAGES = {"load", "quantize", "evaluate", "explore", "rank", "regenerate", "update", "requantize"}
DEPLOYMENTS = {"shapes-tiny", "flux-imagereward", "flux-clipscore", "sana-hpsv2", "sd35l-pickscore"}
SHORT = ["prompts_per_iteration=2", "pool=8", "keep=4", "eval.prompts=2", "eval.steps=4", "explore.steps=3",
         "regenerate.steps=4", "train.micro_batch=64"]


def _api(url: str, body: dict) -> list | dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_deployment_runs_one_iteration_on_a_worker(tmp_path, record_property):
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = environment(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_API_URL=api,
                      PREFECT_WORKER_QUERY_SECONDS="2", PREFECT_WORKER_PREFETCH_SECONDS="2", PWD=str(ROOT),
                      MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
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
        deployments = _api(f"{api}/deployments/filter", {"limit": 50})
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

        flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", result.stdout).group(1)
        [flow_run] = _api(f"{api}/flow_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})
        task_runs = _api(f"{api}/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200})

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
