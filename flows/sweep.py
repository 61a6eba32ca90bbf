"""The ``sweep`` flow: a comparison's families x seeds grid, or an ablation's points x seeds, run in
parallel over the devices of one machine as deployment runs of the training flow.

Each grid point is a run of the ``solrl/<preset>`` deployment (prefect.yaml) on its work pool,
pinned to one device through the flow run's job variables (``CUDA_VISIBLE_DEVICES``; a process
worker puts them in the run's environment). This flow hands out the devices: at most one run per
device at a time, the next point starting on the device a finished one frees. The work pool's
concurrency limit, set to the same number of devices, keeps any other submitter from oversubscribing
them. Every point is sized to the budget exactly as `solrl compare` sizes it and written where
`solrl compare` looks for it (``<out>/runs/<name>/seed-<s>``, with the evaluation images), so:

* the sweep ends with the comparison of its finished runs (``compare.json`` etc. in ``out``, as
  ``python -m flows.compare --from-runs <out>/runs``), and
* `solrl compare --families ... --seeds ... --out <out>` with the same settings reuses the runs
  instead of training them again; a point already finished is not run again, an interrupted one
  is resumed from its checkpoint.

Its command is `solrl sweep` (arguments checked in solrl_core.cli_studies); ``python -m flows.sweep``
is the same command:

    solrl sweep --devices 8 --budget-gpu-hours 2 --seeds 0,1,2 --out reports/sweep
    solrl sweep --devices 8 --budget-gpu-hours 2 --ablation pool --seeds 0,1 --out reports/pool
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from prefect import flow, get_run_logger

from solrl_core.config import ConfigError, parse_override, to_dict
from solrl_core.presets import FAMILIES

DEVICE_VARIABLE = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class Point:
    """One run of the grid: a variant (family or ablation point) at one seed, already sized."""

    name: str
    family: str
    overrides: tuple[str, ...]
    seed: int
    run_dir: Path
    reused: bool
    resume: bool


def grid(preset: str, families: list[str], ablation: str | None, seeds: list[int], overrides: list[str],
         budget_gpu_hours: float, evaluations: int, out_dir: Path) -> list[Point]:
    """Every (variant, seed) sized to the budget by `solrl compare`'s own planning, with the
    overrides that make the training flow resolve exactly that sized config."""
    from solrl_core.ablations import ABLATION_FAMILY, ablation_points, variant_name
    from solrl_core.compare import plan_seeds
    from solrl_core.presets import resolve_config

    if ablation:
        variants = {variant_name(ablation, point): (ABLATION_FAMILY, [*overrides, *_as_overrides(settings)])
                    for point, settings in ablation_points(ablation).items()}
    else:
        variants = {family: (family, list(overrides)) for family in families}
    points = []
    for name, (family, texts) in variants.items():
        config = resolve_config(preset, family, [parse_override(text) for text in texts])
        for plan in plan_seeds(config, out_dir / "runs" / name, budget_gpu_hours, evaluations, seeds):
            sized = plan["config"]
            texts_sized = (*texts, f"seed={sized.seed}", f"iterations={sized.iterations}",
                           f"eval.every={sized.eval.every}")
            resolved = resolve_config(preset, family, [parse_override(text) for text in texts_sized])
            if to_dict(resolved) != to_dict(sized):  # the run would not be the one compare reuses
                raise ConfigError(f"sweep: {name} seed {sized.seed}: its overrides do not give the sized config")
            points.append(Point(name, family, texts_sized, sized.seed, plan["run_dir"], plan["reused"],
                                bool(plan["resume"])))
    return points


def _as_overrides(settings: dict) -> list[str]:
    return [f"{key}={json.dumps(value)}" for key, value in settings.items()]


def parameters_of(point: Point, preset: str) -> dict:
    """The training deployment's parameters for one point (no MLflow: the comparison is the record)."""
    common = {"family": point.family, "overrides": list(point.overrides), "tracking": False, "keep_eval_images": True}
    if point.resume:  # the checkpoint holds the sized config: nothing to override
        return {**common, "overrides": [], "resume": str(point.run_dir), "preset": preset}
    return {**common, "out": str(point.run_dir), "preset": preset}


@flow(name="sweep", persist_result=False, log_prints=False)
def sweep(budget_gpu_hours: float, devices: int, out: str = "reports/sweep", preset: str = "shapes-tiny",
          families: list[str] | None = None, ablation: str | None = None, seeds: list[int] | None = None,
          evaluations: int = 6, overrides: list[str] | None = None, deployment: str | None = None,
          poll_seconds: float = 5.0) -> dict:
    """Run every (variant, seed) of the grid as a run of ``deployment`` (default ``solrl/<preset>``),
    ``devices`` at a time, each on its own device; then compare the finished runs in ``out``."""
    from flows.compare import compare_finished_runs

    if devices < 1:
        raise ConfigError(f"devices ({devices}) must be >= 1")
    logger = get_run_logger()
    out_dir = Path(out).expanduser().resolve()
    points = grid(preset, families or list(FAMILIES), ablation, seeds or [0], overrides or [], budget_gpu_hours,
                  evaluations, out_dir)
    outcomes = run_points([p for p in points if not p.reused], devices, deployment or f"solrl/{preset}", preset,
                          poll_seconds, logger.info)
    failed = [name for name, state in outcomes.items() if state != "COMPLETED"]
    if failed:
        raise RuntimeError(f"sweep: {len(failed)} of {len(points)} runs did not complete ({', '.join(failed)}); "
                           f"run the sweep again to resume them")
    report = compare_finished_runs(out_dir / "runs", out_dir, budget_gpu_hours, command="solrl sweep",
                                   families=list(dict.fromkeys(p.name for p in points)))
    logger.info(f"sweep: {len(points)} runs ({sum(p.reused for p in points)} reused); wrote {out_dir / 'compare.json'}")
    return {"runs": len(points), "reused": sum(p.reused for p in points), "out": str(out_dir),
            "speedup_to_equal_reward": report.get("speedup_to_equal_reward")}


def run_points(points: list[Point], devices: int, deployment: str, preset: str, poll_seconds: float,
               log) -> dict[str, str]:
    """Deployment runs of ``points``, at most one per device at a time; their final state types."""
    from prefect import get_client
    from prefect.deployments import run_deployment

    waiting, free, running, outcomes = deque(points), list(range(devices)), {}, {}
    with get_client(sync_client=True) as client:
        while waiting or running:
            while waiting and free:
                point, device = waiting.popleft(), free.pop(0)
                flow_run = run_deployment(deployment, parameters=parameters_of(point, preset), timeout=0,
                                          job_variables={"env": {DEVICE_VARIABLE: str(device)}},
                                          flow_run_name=f"{point.name}-seed-{point.seed}")
                running[flow_run.id] = (point, device)
                log(f"sweep: {point.name} seed {point.seed} on device {device} (flow run {flow_run.name})")
            time.sleep(poll_seconds)
            for flow_run_id, (point, device) in list(running.items()):
                state = client.read_flow_run(flow_run_id).state
                if state is not None and state.is_final():
                    del running[flow_run_id]
                    free.append(device)
                    outcomes[f"{point.name} seed {point.seed}"] = state.type.value
                    log(f"sweep: {point.name} seed {point.seed}: {state.type.value}")
    return outcomes


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.sweep ARGS``: `solrl sweep ARGS`."""
    from flows.cli import main as solrl

    return solrl(["sweep", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
