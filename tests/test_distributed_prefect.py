"""A 2-rank deployment run on a real Prefect server and worker (127.0.0.1), against one process.

`prefect deployment run solrl/shapes-tiny -p nproc_per_node=2`: the worker's flow run starts
torchrun (gloo, 2 CPU ranks); rank 0 runs the stages inside that flow run's context. The flow run
must complete, every stage must be a completed task run of *that* flow run (one per stage call, as
a one-process deployment run has), and the outputs must equal the one-process run's within
tests/test_distributed.py's TOLERANCE (see its docstring for why a tolerance).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from tests._services import BIN, ROOT, environment, free_port, run, service, wait_for_http
from tests.test_distributed import TINY, assert_equivalent, outputs

pytestmark = pytest.mark.slow

ITERATIONS = 2
SETTINGS = [*TINY, f"iterations={ITERATIONS}"]
# Task runs expected: load, quantize, one per evaluation (the base one included; how many follows
# from eval.every, so it is read from the one-process summary) and these per iteration.
ITERATION_STAGES = ["explore", "rank", "regenerate", "update", "requantize"]


def _api(url: str, body: dict) -> list | dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _one_process(out) -> None:
    command = [sys.executable, str(ROOT / "tests" / "_run_process.py"), str(out), *SETTINGS]
    subprocess.run(command, env={**environment(), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, cwd=ROOT,
                   check=True, capture_output=True, timeout=600)


def test_two_rank_deployment_run_reports_every_stage_and_equals_one_process(tmp_path, record_property):
    reference = tmp_path / "one"
    _one_process(reference)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = environment(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_API_URL=api,
                      PREFECT_WORKER_QUERY_SECONDS="2", PREFECT_WORKER_PREFETCH_SECONDS="2", PWD=str(ROOT),
                      OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = tmp_path / "ranks"
    with service([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui",
                  "--analytics-off"], tmp_path / "server.log", env, tmp_path) as server:
        wait_for_http(f"{api}/health", 180, server, tmp_path / "server.log")
        run([str(BIN / "prefect"), "work-pool", "create", "solrl-process", "--type", "process"], env, ROOT)
        run([str(BIN / "prefect"), "deploy", "--name", "shapes-tiny"], env, ROOT)
        with service([str(BIN / "prefect"), "worker", "start", "--pool", "solrl-process", "--type", "process"],
                     tmp_path / "worker.log", env, ROOT):
            started = time.monotonic()
            parameters = {"overrides": SETTINGS, "out": str(out), "tracking": False, "nproc_per_node": 2,
                          "rank_timeout": 120}
            result = run([str(BIN / "prefect"), "deployment", "run", "solrl/shapes-tiny", "--params",
                          json.dumps(parameters), "--watch", "--watch-interval", "2", "--watch-timeout", "480"],
                         env, ROOT, timeout=540)
            record_property("two_rank_deployment_run_s", round(time.monotonic() - started, 1))
        flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", result.stdout).group(1)
        [flow_run] = _api(f"{api}/flow_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})
        task_runs = _api(f"{api}/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200})

    worker_log = (tmp_path / "worker.log").read_text(errors="replace")
    assert flow_run["state_type"] == "COMPLETED", worker_log[-4000:]
    evaluations = len(json.loads((reference / "summary.json").read_text())["evaluations"])
    expected = sorted(["load", "quantize", *["evaluate"] * evaluations, *ITERATION_STAGES * ITERATIONS])
    assert sorted(task["name"].rsplit("-", 1)[0] for task in task_runs) == expected, worker_log[-4000:]
    assert all(task["state_type"] == "COMPLETED" for task in task_runs), [t["state_type"] for t in task_runs]
    assert all(task["flow_run_id"] == flow_run_id for task in task_runs)
    assert_equivalent(outputs(out), outputs(reference))
