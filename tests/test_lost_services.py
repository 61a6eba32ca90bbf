"""A tracking or orchestration server lost mid-run does not fail the run.

Each test is a real `solrl run` of three tiny iterations against a real server on 127.0.0.1. The
run pauses at the start of its second iteration (``SOLRL_FAULT=pause@explore:1``, after its
checkpoint of one iteration); the test kills the server's whole process group with SIGKILL, then
lets the run go on. Then:

* the run ends with exit 0 and its summary, stderr is one warning line naming the lost server,
  and neither stream holds a traceback;
* the run folder is complete (three metrics lines, the summary, the checkpoint of 3 iterations);
* MLflow: with the server started again on the same store, `solrl run --resume` brings the MLflow
  run up to date: every step logged exactly once, the run FINISHED.

Seconds from the kill to the run's exit are recorded as the property ``kill_to_exit_s`` (no limit
asserted: figures for docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from solrl_core import faults
from solrl_core.checkpoint import load_checkpoint, read_metadata
from tests._services import BIN, ROOT, environment, free_port, service, wait_for_http
from tests.test_interrupt import SERVER, checkpointed_iterations, completed, kill_group, process_tree

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")]

ITERATIONS = 3
TINY = ["prompts_per_iteration=2", "pool=8", "keep=4", "eval.prompts=2", "eval.steps=4", "eval.every=2",
        "explore.steps=3", "regenerate.steps=4", "train.micro_batch=64", "progress=false"]
RUN_TIMEOUT_S = 600


def solrl_run(*arguments: str) -> list[str]:
    return [str(BIN / "solrl"), "run", *arguments, *[part for setting in TINY for part in ("-S", setting)]]


def start(command: list[str], log: Path, **env: str) -> subprocess.Popen:
    with log.with_suffix(".out").open("w") as out, log.with_suffix(".err").open("w") as err:
        return subprocess.Popen(command, env=environment(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **env), cwd=ROOT,
                                stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)


def run_losing_a_server(command: list[str], out: Path, log: Path, kill, record_property,
                        **env: str) -> subprocess.CompletedProcess:
    """``command`` paused before its second iteration; ``kill(process)`` there; the finished run."""
    gate = log.with_suffix(".gate")
    process = start(command, log, **{faults.ENVIRONMENT: "pause@explore:1", faults.GATE_ENVIRONMENT: str(gate)},
                    **env)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while (checkpointed_iterations(out) or 0) < 1:
            assert process.poll() is None, completed(process, log).stderr[-3000:]
            assert time.monotonic() < deadline, "no checkpoint of one iteration"
            time.sleep(0.2)
        kill(process)
        killed = time.monotonic()
        gate.touch()
        process.wait(timeout=RUN_TIMEOUT_S)
        record_property("kill_to_exit_s", round(time.monotonic() - killed, 1))
    finally:
        kill_group(process)
    return completed(process, log)


def assert_finished_with_one_warning(result: subprocess.CompletedProcess, out: Path, warning: str) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(warning), result.stderr[-3000:]
    assert str(out) in lines[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert "evaluation reward" in result.stdout  # the closing summary table
    assert len((out / "metrics.jsonl").read_text().splitlines()) == ITERATIONS
    assert json.loads((out / "summary.json").read_text())["iterations"] == ITERATIONS
    assert read_metadata(out)["next_iteration"] == ITERATIONS
    load_checkpoint(out)  # every tensor against its digest


def kill_group_of(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGKILL)
    server.wait(30)


@contextmanager
def mlflow_server(store: Path, port: int, log: Path):
    with service([str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{store}", "--host", "127.0.0.1",
                  "--port", str(port), "--workers", "1"], log, environment(), store.parent) as process:
        wait_for_http(f"http://127.0.0.1:{port}/health", 180, process, log)
        yield process


def test_a_lost_mlflow_server_warns_once_and_resume_logs_every_step_once(tmp_path, record_property):
    from mlflow import MlflowClient

    out, store, port = tmp_path / "run", tmp_path / "mlflow.db", free_port()
    uri = f"http://127.0.0.1:{port}"
    command = solrl_run("--iterations", str(ITERATIONS), "--tracking-uri", uri, "--out", str(out))
    with mlflow_server(store, port, tmp_path / "mlflow-1.log") as server:
        result = run_losing_a_server(command, out, tmp_path / "run", lambda _: kill_group_of(server), record_property)
    assert_finished_with_one_warning(result, out, f"solrl: warning: MLflow tracking at {uri} failed")
    assert f"`solrl run --resume {out}`" in result.stderr
    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]

    with mlflow_server(store, port, tmp_path / "mlflow-2.log"):
        process = start([str(BIN / "solrl"), "run", "--resume", str(out), "--tracking-uri", uri], tmp_path / "resumed")
        try:
            process.wait(timeout=RUN_TIMEOUT_S)
        finally:
            kill_group(process)
        resumed = completed(process, tmp_path / "resumed")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "Traceback" not in resumed.stdout + resumed.stderr and "warning" not in resumed.stderr
        client = MlflowClient(uri)
        assert client.get_run(run_id).info.status == "FINISHED"
        for key, steps in (("modeled_gpu_hours_cumulative", [0, 1, 2, 3]), ("kept_reward_mean", [1, 2, 3]),
                           ("seconds/explore", [1, 2, 3]), ("eval/shapes-compliance", [0, 2, 3])):
            logged = sorted(point.step for point in client.get_metric_history(run_id, key))
            assert logged == steps, f"{key}: {logged}"


def kill_the_ephemeral_server(process: subprocess.Popen) -> None:
    servers = [pid for (pid, _), line in process_tree(process.pid).items() if SERVER in line]
    assert servers, "no ephemeral Prefect server among the run's processes"
    for pid in servers:
        os.kill(pid, signal.SIGKILL)


def test_a_lost_ephemeral_prefect_server_lets_the_run_finish(tmp_path, record_property):
    out = tmp_path / "run"
    command = solrl_run("--iterations", str(ITERATIONS), "--no-tracking", "--out", str(out))
    result = run_losing_a_server(command, out, tmp_path / "run", kill_the_ephemeral_server, record_property)
    assert_finished_with_one_warning(result, out, "solrl: warning: lost the Prefect API at http://127.0.0.1:")


def test_a_lost_prefect_api_url_server_lets_the_run_finish(tmp_path, record_property):
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {"PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": api}
    with service([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui",
                  "--analytics-off"], tmp_path / "server.log", environment(**env), tmp_path) as server:
        wait_for_http(f"{api}/health", 180, server, tmp_path / "server.log")
        out = tmp_path / "run"
        command = solrl_run("--iterations", str(ITERATIONS), "--no-tracking", "--out", str(out))
        result = run_losing_a_server(command, out, tmp_path / "run", lambda _: kill_group_of(server),
                                     record_property, **env)
    assert_finished_with_one_warning(result, out, f"solrl: warning: lost the Prefect API at {api}")
