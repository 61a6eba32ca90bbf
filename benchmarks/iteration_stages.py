"""Time per stage of one sol_rl iteration vs one naive_scaling iteration, side by side in one process,
and the requantize share of a sol_rl iteration; writes JSON.

    .venv/bin/python benchmarks/iteration_stages.py --out reports/benchmarks/iteration_stages.json

Both families run the real `run_iteration` (the training loop's own) on the same preset. The families
alternate when --repeats > 1 so the machine's load drift hits both; per-stage medians are reported,
with the modeled GPU-hours per stage (FLOPs on the device profile) beside the measured CPU seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solrl_core import stages  # noqa: E402
from solrl_core.config import parse_override  # noqa: E402
from solrl_core.ledger import write_json  # noqa: E402
from solrl_core.presets import resolve_config  # noqa: E402
from solrl_core.training import run_iteration  # noqa: E402
from benchmarks._threads import add_threads_option, use_threads  # noqa: E402

FAMILIES = ("sol_rl", "naive_scaling")
ROLLOUT = ("explore", "rank", "regenerate")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="shapes-tiny")
    parser.add_argument("--repeats", type=int, default=1, help="iterations per family, alternating")
    parser.add_argument("--out", default="reports/benchmarks/iteration_stages.json")
    add_threads_option(parser)
    parser.add_argument("-S", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    use_threads(args)

    overrides = [parse_override(o) for o in args.overrides] + [("progress", False)]
    states = {}
    for family in FAMILIES:
        states[family] = stages.initial_state(resolve_config(args.preset, family, overrides))
        stages.quantize(states[family])
    records = {family: [] for family in FAMILIES}
    with tempfile.TemporaryDirectory() as scratch:
        for iteration in range(args.repeats):
            for family in FAMILIES:
                metrics = run_iteration(states[family], iteration, Path(scratch) / family)
                records[family].append(metrics)
                print(f"{family:14s} iteration {iteration}: {metrics['seconds']['total']:.1f}s "
                      + " ".join(f"{k} {v:.1f}" for k, v in metrics["seconds"].items() if k != "total"))

    families = {}
    for family, runs in records.items():
        stage_names = list(runs[0]["seconds"])
        families[family] = {
            "seconds": {s: statistics.median(r["seconds"][s] for r in runs) for s in stage_names},
            "modeled_gpu_hours": runs[0]["modeled_gpu_hours"],
            "flops": runs[0]["flops"],
        }
    sol, naive = families["sol_rl"], families["naive_scaling"]

    def rollout(entry: dict, key: str) -> float:
        return sum(entry[key].get(stage, 0.0) for stage in ROLLOUT)

    config = states["sol_rl"].config
    result = {
        "preset": args.preset, "repeats": args.repeats, "device": str(states["sol_rl"].policy.device),
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "setup": (f"{config.prompts_per_iteration} prompts x pool {config.pool}, keep {config.keep}; sol_rl explores "
                  f"{config.explore.steps} steps with {config.explore.backend} and regenerates "
                  f"{config.regenerate.steps}; naive_scaling samples the pool at {config.regenerate.steps} steps; "
                  f"{config.accounting.device} profile, utilisation {config.accounting.utilization:g}"),
        "families": families,
        "requantize_share": {
            "measured": sol["seconds"]["requantize"] / sol["seconds"]["total"],
            "modeled": sol["modeled_gpu_hours"]["requantize"] / sol["modeled_gpu_hours"]["total"],
        },
        "rollout_speedup": {"measured": rollout(naive, "seconds") / rollout(sol, "seconds"),
                            "modeled": rollout(naive, "modeled_gpu_hours") / rollout(sol, "modeled_gpu_hours")},
        "iteration_speedup": {"measured": naive["seconds"]["total"] / sol["seconds"]["total"],
                              "modeled": naive["modeled_gpu_hours"]["total"] / sol["modeled_gpu_hours"]["total"]},
        "note": ("CPU seconds include reward scoring and, for sol_rl, emulated quantization (slower than full "
                 "precision here); the modeled requantize share counts only the LoRA merges' FLOPs, while on a GPU "
                 "requantizing is memory-bound (the paper: about 2%)."),
    }
    out = Path(args.out)
    write_json(out, result)
    print(f"requantize share {result['requantize_share']['measured']:.2%} measured, "
          f"{result['requantize_share']['modeled']:.2%} modeled; rollout speed-up "
          f"{result['rollout_speedup']['measured']:.2f}x measured, {result['rollout_speedup']['modeled']:.2f}x modeled")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
