"""A comparison's families x seeds grid over two "devices" (flows/sweep.py), for real: a Prefect
server on 127.0.0.1, the training deployment on a process work pool whose concurrency limit is 2,
two workers, and the sweep flow handing out the devices. The four runs must all complete, each
pinned to one device (CUDA_VISIBLE_DEVICES in its job variables), two at a time at most, never two
at once on one device, and at least two in parallel; the sweep writes the comparison of its runs,
and `solrl compare`'s planning finds every run finished (it would reuse them, not train again)."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime

import pytest

from tests._services import BIN, ROOT, prefect_api, prefect_server_with_deployment, service

pytestmark = pytest.mark.slow

TINY = ["prompts_per_iteration=2", "pool=8", "keep=4", "eval.prompts=2", "eval.steps=4", "explore.steps=3",
        "regenerate.steps=4", "train.micro_batch=64", "progress=false"]
FAMILIES, SEEDS, DEVICES = ["diffusionnft", "sol_rl"], [0, 1], 2
BUDGET = 1e-12  # below one iteration's modeled cost: every run is sized to one iteration


def _interval(flow_run: dict) -> tuple[datetime, datetime]:
    """From the moment a worker claimed the run (its PENDING state: the run's process starts) to its end.

    The RUNNING state alone is the wrong window: a one-iteration run spends seconds in it after
    about ten of process start, so two workers busy at once can show running windows that miss
    each other by a fraction of a second."""
    return datetime.fromisoformat(flow_run["claimed_time"]), datetime.fromisoformat(flow_run["end_time"])


def _claimed_time(api: str, flow_run: dict) -> str:
    states = prefect_api(f"{api}/flow_run_states/?flow_run_id={flow_run['id']}")
    return min(state["timestamp"] for state in states if state["type"] == "PENDING")


def test_sweep_runs_the_grid_over_two_devices(tmp_path, record_property):
    out = tmp_path / "sweep"
    with prefect_server_with_deployment(tmp_path, concurrency_limit=DEVICES) as (api, env):
        worker = [str(BIN / "prefect"), "worker", "start", "--pool", "solrl-process", "--type", "process", "--limit", "1"]
        with service(worker, tmp_path / "worker0.log", env, ROOT), service(worker, tmp_path / "worker1.log", env, ROOT):
            command = [str(BIN / "solrl"), "sweep", "--devices", str(DEVICES), "--budget-gpu-hours", str(BUDGET),
                       "--families", ",".join(FAMILIES), "--seeds", ",".join(map(str, SEEDS)), "--evaluations", "1",
                       "--poll-seconds", "2", "--out", str(out), *[part for o in TINY for part in ("-S", o)]]
            result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900,
                                    stdin=subprocess.DEVNULL)
        deployments = prefect_api(f"{api}/deployments/filter", {"limit": 10})
        runs = prefect_api(f"{api}/flow_runs/filter", {"deployments": {"id": {"any_": [d["id"] for d in deployments]}},
                                                "limit": 50})
        for flow_run in runs:
            flow_run["claimed_time"] = _claimed_time(api, flow_run)

    logs = "".join((tmp_path / f"worker{i}.log").read_text(errors="replace")[-2000:] for i in range(2))
    assert result.returncode == 0, result.stderr[-3000:] + logs
    assert len(runs) == len(FAMILIES) * len(SEEDS) and all(r["state_type"] == "COMPLETED" for r in runs), logs
    devices = [r["job_variables"]["env"]["CUDA_VISIBLE_DEVICES"] for r in runs]
    assert set(devices) <= {str(d) for d in range(DEVICES)}, devices
    overlapping = [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:]
                   if _interval(a)[0] < _interval(b)[1] and _interval(b)[0] < _interval(a)[1]]
    assert overlapping, "no two runs ran at the same time"
    assert all(a["job_variables"] != b["job_variables"] for a, b in overlapping), "two runs shared a device"
    record_property("sweep_run_seconds_summed", round(sum((e - s).total_seconds() for s, e in map(_interval, runs)), 1))

    report = json.loads((out / "compare.json").read_text())
    assert set(report["families"]) == set(FAMILIES)
    for family in FAMILIES:
        assert [run["seed"] for run in report["families"][family]["runs"]] == SEEDS
    from flows.sweep import grid

    again = grid("shapes-tiny", FAMILIES, None, SEEDS, TINY, BUDGET, 1, out)
    assert len(again) == 4 and all(point.reused for point in again)  # `solrl compare` would train nothing
