"""Real service processes for the orchestration tests: started on 127.0.0.1 with a free port, in
their own process group, and always stopped (the group, by its id) when the test ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the venv's console scripts: prefect, mlflow, dvc, solrl

# No telemetry, no hub; the same as the Makefile exports.
QUIET = {"DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
         "DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
         "PREFECT_CLI_PROMPT": "false", "PREFECT_LOGGING_COLORS": "false", "CI": os.environ.get("CI", "true")}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def environment(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "MLFLOW_"))}
    return {**env, **QUIET, **extra}


def wait_for_http(url: str, timeout: float, process: subprocess.Popen | None = None, log: Path | None = None) -> float:
    """Seconds until ``url`` answers 200; fails early if ``process`` exits."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{process.args[:3]} exited with {process.returncode}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout:.0f}s:\n{_tail(log)}")


@contextmanager
def service(args: list[str], log: Path, env: dict[str, str], cwd: Path):
    """A long-running process (server, worker) with its output in ``log``."""
    with log.open("wb") as output:
        process = subprocess.Popen(args, stdout=output, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield process
    finally:
        stop(process)


def stop(process: subprocess.Popen, grace: float = 20) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    try:  # children left behind in the group (a flow-run subprocess, uvicorn workers)
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"{' '.join(map(str, args[:4]))} failed ({result.returncode}):\n" \
                                   f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def prefect_api(url: str, body: dict | None = None) -> list | dict:
    """POST ``body`` to a Prefect server's REST endpoint ``url`` (e.g. .../flow_runs/filter), or,
    without a body, GET it (e.g. .../flow_run_states/?flow_run_id=...)."""
    import json

    request = (urllib.request.Request(url, method="GET") if body is None else
               urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                      headers={"Content-Type": "application/json"}))
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@contextmanager
def prefect_server_with_deployment(tmp_path: Path, name: str = "shapes-tiny", concurrency_limit: int | None = None):
    """A real Prefect server on a free loopback port, the `solrl-process` work pool (optionally
    with a concurrency limit) and the deployment ``name`` of prefect.yaml; yields (api url, env)
    for the workers and clients the test starts."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = environment(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_API_URL=api,
                      PREFECT_WORKER_QUERY_SECONDS="2", PREFECT_WORKER_PREFETCH_SECONDS="2", PWD=str(ROOT),
                      OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with service([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui",
                  "--analytics-off"], tmp_path / "server.log", env, tmp_path) as server:
        wait_for_http(f"{api}/health", 180, server, tmp_path / "server.log")
        run([str(BIN / "prefect"), "work-pool", "create", "solrl-process", "--type", "process"], env, ROOT)
        if concurrency_limit is not None:
            run([str(BIN / "prefect"), "work-pool", "set-concurrency-limit", "solrl-process", str(concurrency_limit)],
                env, ROOT)
        run([str(BIN / "prefect"), "deploy", "--name", name], env, ROOT)
        yield api, env


def _tail(log: Path | None, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:] if log is not None and log.exists() else ""
