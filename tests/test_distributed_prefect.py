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

import pytest

from tests._services import BIN, ROOT, environment, prefect_api, prefect_server_with_deployment, run, service
from tests.test_distributed import TINY, assert_equivalent, outputs

pytestmark = pytest.mark.slow

ITERATIONS = 2
SETTINGS = [*TINY, f"iterations={ITERATIONS}"]
# Task runs expected: load, quantize, one per evaluation (the base one included; how many follows
# from eval.every, so it is read from the one-process summary) and these per iteration.
ITERATION_STAGES = ["explore", "rank", "regenerate", "update", "requantize"]


def _one_process(out) -> None:
    command = [sys.executable, str(ROOT / "tests" / "_run_process.py"), str(out), *SETTINGS]
    subprocess.run(command, env={**environment(), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, cwd=ROOT,
                   check=True, capture_output=True, timeout=600)


def test_two_rank_deployment_run_reports_every_stage_and_equals_one_process(tmp_path, record_property):
    reference = tmp_path / "one"
    _one_process(reference)
    out = tmp_path / "ranks"
    with prefect_server_with_deployment(tmp_path) as (api, env):
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
        [flow_run] = prefect_api(f"{api}/flow_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})
        task_runs = prefect_api(f"{api}/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200})

    worker_log = (tmp_path / "worker.log").read_text(errors="replace")
    assert flow_run["state_type"] == "COMPLETED", worker_log[-4000:]
    evaluations = len(json.loads((reference / "summary.json").read_text())["evaluations"])
    expected = sorted(["load", "quantize", *["evaluate"] * evaluations, *ITERATION_STAGES * ITERATIONS])
    assert sorted(task["name"].rsplit("-", 1)[0] for task in task_runs) == expected, worker_log[-4000:]
    assert all(task["state_type"] == "COMPLETED" for task in task_runs), [t["state_type"] for t in task_runs]
    assert all(task["flow_run_id"] == flow_run_id for task in task_runs)
    assert_equivalent(outputs(out), outputs(reference))
