"""Orchestration + tracking overhead per iteration: the training loop with every stage a Prefect
task and MLflow logging, against the same loop calling the stage functions directly, same config.

Two measurements, both in this process, written as JSON:

* end to end: wall-clock seconds of each iteration (between consecutive ``on_iteration`` calls),
  direct vs flow (Prefect's ephemeral server, MLflow to a temporary SQLite store); the first
  iteration (FLOP counting) and the last (evaluation) are left out of the medians;
* fixed cost: what the orchestration adds per iteration independent of the model, measured on its
  own with many repetitions: a Prefect task call (same options as the stage tasks, five per
  iteration) and the MLflow observer's per-iteration logging. Divided by the direct iteration time
  it gives the overhead share without the noise of two long runs on a shared machine.

    python benchmarks/orchestration_overhead.py                         # make-run config, 4 iterations
    python benchmarks/orchestration_overhead.py --iterations 6 --pairs 2 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _key, _value in {"DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                     "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1",
                     "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"}.items():
    os.environ.setdefault(_key, _value)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.utilities.annotations import opaque  # noqa: E402

from flows.solrl import train  # noqa: E402
from solrl_core.config import parse_override  # noqa: E402
from solrl_core.presets import resolve_config  # noqa: E402
from solrl_core.tracking import MlflowObserver  # noqa: E402
from solrl_core.training import RunObserver, run_training  # noqa: E402
from benchmarks._threads import add_threads_option, use_threads  # noqa: E402

STAGE_TASKS_PER_ITERATION = 5  # explore, rank, regenerate, update, requantize


class IterationClock(RunObserver):
    """Wall-clock seconds of each iteration, from the previous iteration's end (or the base evaluation)."""

    def __init__(self):
        self.marks: list[float] = []

    def on_evaluation(self, iteration, rewards, images) -> None:
        if iteration < 0:
            self.marks.append(time.perf_counter())

    def on_iteration(self, metrics) -> None:
        self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def steady(seconds: list[float]) -> list[float]:
    """Leave out the first iteration (one-off FLOP counting) and the last (it evaluates)."""
    return seconds[1:-1] if len(seconds) > 2 else seconds


@flow(name="solrl-overhead-benchmark", persist_result=False)
def flow_run(overrides: list[str], preset: str, family: str, out: str, tracking_uri: str) -> dict:
    config = resolve_config(preset, family, [parse_override(text) for text in overrides])
    clock = IterationClock()
    summary = train(config, Path(out), tracking=True, tracking_uri=tracking_uri, observers=[clock])
    return {"iteration_seconds": clock.seconds(), "run_seconds": summary["seconds"]}


def _noop(payload):
    return payload


noop = task(_noop, name="noop", cache_policy=NO_CACHE, persist_result=False)


@flow(name="solrl-task-overhead", persist_result=False)
def task_overhead(calls: int) -> list[float]:
    payload = {"tensor": torch.zeros(1024)}
    noop(opaque(payload))  # warm-up
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        noop(opaque(payload))
        seconds.append(time.perf_counter() - started)
    return seconds


def mlflow_iteration_cost(config, metrics: dict, tracking_uri: str, out_dir: Path, calls: int) -> list[float]:
    observer = MlflowObserver(tracking_uri, run_name="overhead-probe", log=lambda line: None)
    observer.on_start(config, out_dir)
    seconds = []
    for index in range(calls):
        record = {**metrics, "iteration": index}
        started = time.perf_counter()
        observer.on_iteration(record)
        seconds.append(time.perf_counter() - started)
    observer.finish("FINISHED")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="shapes-tiny")
    parser.add_argument("--family", default="sol_rl")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("-S", dest="overrides", action="append", default=[])
    parser.add_argument("--task-calls", type=int, default=50)
    parser.add_argument("--out", default="reports/benchmarks/orchestration_overhead.json")
    add_threads_option(parser)
    parser.add_argument("--pairs", type=int, default=1,
                        help="direct run then flow run, this many times; medians over all their iterations")
    args = parser.parse_args(argv)
    use_threads(args)
    overrides = [*args.overrides, f"iterations={args.iterations}", "progress=false"]
    config = resolve_config(args.preset, args.family, [parse_override(text) for text in overrides])

    with tempfile.TemporaryDirectory(prefix="solrl-overhead-") as scratch:
        scratch = Path(scratch)
        uri = f"sqlite:///{scratch / 'mlflow.db'}"
        direct, flowed = [], []
        for pair in range(args.pairs):  # alternating, so a slow spell of a shared machine hits both
            clock = IterationClock()
            run_training(config, scratch / f"direct-{pair}", log=lambda line: None, observers=[clock])
            direct.append(clock.seconds())
            flowed.append(flow_run(overrides, args.preset, args.family, str(scratch / f"flow-{pair}"),
                                   uri)["iteration_seconds"])
        per_task = task_overhead(args.task_calls)
        metrics = json.loads((scratch / "direct-0" / "metrics.jsonl").read_text().splitlines()[0])
        per_log = mlflow_iteration_cost(config, metrics, uri, scratch / "probe", 20)

    direct_median = statistics.median([s for run in direct for s in steady(run)])
    flow_median = statistics.median([s for run in flowed for s in steady(run)])
    fixed = STAGE_TASKS_PER_ITERATION * statistics.median(per_task) + statistics.median(per_log)
    report = {
        "what": "orchestration (Prefect task per stage, ephemeral server) + tracking (MLflow, SQLite) overhead "
                "per training iteration vs calling the stage functions directly, same config",
        "config": {"preset": config.preset, "family": config.family, "iterations": config.iterations,
                   "prompts_per_iteration": config.prompts_per_iteration, "pool": config.pool, "keep": config.keep,
                   "explore_steps": config.explore.steps, "regenerate_steps": config.regenerate.steps,
                   "overrides": args.overrides},
        "machine": {"cpu_threads": torch.get_num_threads(), "cpu_cores": os.cpu_count(),
                    "machine": platform.machine(), "load_average": os.getloadavg()},
        "pairs": args.pairs,
        "end_to_end": {
            "direct_iteration_seconds": direct, "flow_iteration_seconds": flowed,
            "direct_median_s": direct_median, "flow_median_s": flow_median,
            "overhead_percent": 100 * (flow_median - direct_median) / direct_median,
        },
        "fixed_cost": {
            "prefect_task_call_median_s": statistics.median(per_task),
            "prefect_task_call_p90_s": sorted(per_task)[int(0.9 * len(per_task))],
            "mlflow_iteration_logging_median_s": statistics.median(per_log),
            "per_iteration_s": fixed,
            "overhead_percent_of_direct_iteration": 100 * fixed / direct_median,
        },
        "target_percent": 3.0,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"direct_median_s": round(direct_median, 3), "flow_median_s": round(flow_median, 3),
                      "end_to_end_overhead_percent": round(report["end_to_end"]["overhead_percent"], 2),
                      "fixed_cost_per_iteration_s": round(fixed, 4),
                      "fixed_cost_percent": round(report["fixed_cost"]["overhead_percent_of_direct_iteration"], 2)}))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
