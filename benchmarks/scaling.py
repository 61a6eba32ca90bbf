"""Strong scaling on the CPU: one Sol-RL iteration at 1 and 2 ranks (torchrun, gloo), one thread
per rank, the same config (the same prompt groups, split across the ranks).

Each world size is one `solrl run` (1: in this machine's one process; W > 1: `--nproc-per-node W`,
real torchrun); the seconds per iteration are read from its metrics.jsonl (the stage clock of
rank 0, which waits for the others in every collective), the first iteration (FLOP counting) and
the last (evaluation) left out. Strong-scaling efficiency = t(1) / (W x t(W)).

    python benchmarks/scaling.py                                  # 8 prompt groups, 5 iterations
    python benchmarks/scaling.py --groups 2 --iterations 3 --pool 8 --keep 4    # a quick check

Writes reports/benchmarks/scaling.json (``--out`` to change). Needs as many free cores as ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def settings(args: argparse.Namespace) -> list[str]:
    overrides = [f"prompts_per_iteration={args.groups}", f"pool={args.pool}", f"keep={args.keep}",
                 f"explore.chunk={args.pool}", f"iterations={args.iterations}", "progress=false",
                 f"eval.every={args.iterations}"]
    return [part for override in overrides for part in ("-S", override)]


def measure(world_size: int, args: argparse.Namespace, folder: Path) -> dict:
    out = folder / f"ranks-{world_size}"
    command = [str(Path(sys.executable).with_name("solrl")), "run", *settings(args), "--no-tracking", "--out", str(out)]
    if world_size > 1:
        command += ["--nproc-per-node", str(world_size)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = time.monotonic()
    subprocess.run(command, env=environment, cwd=ROOT, check=True, capture_output=True, timeout=3600)
    wall = time.monotonic() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steady = [record["seconds"]["total"] for record in records[1:-1]] or [records[-1]["seconds"]["total"]]
    return {"ranks": world_size, "seconds_per_iteration": statistics.median(steady),
            "iteration_seconds": [round(r["seconds"]["total"], 3) for r in records],
            "stage_seconds_median": {stage: statistics.median(r["seconds"][stage] for r in records[1:-1] or records)
                                     for stage in ("explore", "rank", "regenerate", "update", "requantize")},
            "run_wall_seconds": round(wall, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=8, help="prompt groups per iteration (default 8)")
    parser.add_argument("--pool", type=int, default=24, help="seeds per group (default 24)")
    parser.add_argument("--keep", type=int, default=8, help="kept per group (default 8)")
    parser.add_argument("--iterations", type=int, default=5, help="iterations per run (default 5)")
    parser.add_argument("--ranks", default="1,2", help="world sizes to measure (default 1,2)")
    parser.add_argument("--out", default=str(ROOT / "reports" / "benchmarks" / "scaling.json"))
    args = parser.parse_args()
    sizes = [int(part) for part in args.ranks.split(",")]
    with tempfile.TemporaryDirectory(prefix="solrl-scaling-") as folder:
        results = [measure(size, args, Path(folder)) for size in sizes]
    base = next(r for r in results if r["ranks"] == 1)["seconds_per_iteration"]
    for result in results:
        result["speedup"] = base / result["seconds_per_iteration"]
        result["strong_scaling_efficiency"] = base / (result["ranks"] * result["seconds_per_iteration"])
    report = {"benchmark": "scaling", "backend": "gloo", "threads_per_rank": 1,
              "config": {"prompts_per_iteration": args.groups, "pool": args.pool, "keep": args.keep,
                         "iterations": args.iterations, "preset": "shapes-tiny", "family": "sol_rl"},
              "results": results, "cpu_count": os.cpu_count(), "machine": platform.machine(),
              "note": "seconds per iteration: median over iterations 2..n-1 of rank 0's stage clock"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({r["ranks"]: (round(r["seconds_per_iteration"], 3), round(r["strong_scaling_efficiency"], 3))
                      for r in results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
