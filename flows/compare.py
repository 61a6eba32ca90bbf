"""The ``compare`` flow: the equal-GPU-hour comparison of the families (or of one ablation's points)
of ``solrl_core.compare``, and the report page beside it.

Two ways in:

* train: every variant trained to the budget, exactly as ``solrl compare`` does;
* from finished runs: the runs a pipeline or a sweep already trained (the DVC study's
  ``train@<family>-<seed>`` stages, flows/study.py; the sweep flow's deployment runs) compared
  without training again, so every family can carry its own overrides.

``python -m flows.compare --from-runs DIR ...`` runs the second without Prefect.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from prefect import flow, get_run_logger

from solrl_core.config import parse_override


def compare_finished_runs(runs_dir: Path, out_dir: Path, budget_gpu_hours: float, command: str = "",
                          families: list[str] | None = None, seeds: list[int] | None = None) -> dict:
    """compare.json, compare.png, compare.md and samples_grid.png in ``out_dir`` from the finished
    runs in ``runs_dir/<name>/`` or, one per run seed, ``runs_dir/<name>/seed-<s>/`` (each with
    summary.json, metrics.jsonl and the evaluation images).

    ``families`` (in their order) and ``seeds`` pick the runs; without them every finished run is
    compared, the families in presets.FAMILIES's order. A named run that is not there is an error,
    and a run left over from an earlier selection is not read."""
    from solrl_core import compare
    from solrl_core.presets import FAMILIES

    started = time.perf_counter()
    found = compare.finished_results(runs_dir, families)
    if not found:
        raise FileNotFoundError(f"no finished runs (summary.json) under {runs_dir}")
    if seeds is not None:
        found = _only_seeds(found, seeds, runs_dir)
    order = {name: index for index, name in enumerate(families or FAMILIES)}
    results = {name: found[name] for name in sorted(found, key=lambda name: (order.get(name, len(order)), name))}
    variants = {name: runs[0]["config"] for name, runs in results.items()}
    first = next(iter(variants.values()))
    report = compare.build_report(variants, results, budget_gpu_hours, compare.metric_name(first.rewards),
                                  compare.weighted_metric(first.rewards), command)
    report["seconds"] = round(time.perf_counter() - started, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    compare.write_outputs(report, results, out_dir)
    write_metrics(report, out_dir / COMPARE_METRICS_FILE)
    return report


def _only_seeds(found: dict[str, list[dict]], seeds: list[int], runs_dir: Path) -> dict[str, list[dict]]:
    """Each variant's runs of ``seeds``, in that order; a missing one is named."""
    picked = {}
    for name, runs in found.items():
        by_seed = {run["seed"]: run for run in runs}
        missing = [seed for seed in seeds if seed not in by_seed]
        if missing:
            raise FileNotFoundError(f"no finished run of {name} seed {missing[0]} in {runs_dir / name}")
        picked[name] = [by_seed[seed] for seed in seeds]
    return picked


COMPARE_METRICS_FILE = "compare_metrics.json"


def write_metrics(report: dict, path: Path) -> None:
    """The headline numbers as a flat metrics file (``dvc exp show`` and ``dvc metrics`` columns)."""
    metrics = {"speedup_to_equal_reward": report.get("speedup_to_equal_reward"),
               **{f"final_reward.{name}": entry["final_reward"] for name, entry in report["families"].items()},
               **{f"modeled_gpu_hours.{name}": entry["modeled_gpu_hours_used"]
                  for name, entry in report["families"].items()}}
    path.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")


def _variants(preset: str, families: list[str], ablation: str | None, overrides: list[str]) -> dict:
    from solrl_core.ablations import ABLATION_FAMILY, ablation_overrides, ablation_points, variant_name
    from solrl_core.presets import resolve_config

    pairs = [parse_override(text) for text in overrides]
    if ablation:
        return {variant_name(ablation, point): resolve_config(preset, ABLATION_FAMILY,
                                                              pairs + ablation_overrides(ablation, point))
                for point in ablation_points(ablation)}
    return {family: resolve_config(preset, family, pairs) for family in families}


@flow(name="compare", persist_result=False, log_prints=False)
def compare(budget_gpu_hours: float, out: str = "reports", preset: str = "shapes-tiny",
            families: list[str] | None = None, ablation: str | None = None, evaluations: int = 6,
            overrides: list[str] | None = None, from_runs: str | None = None, seeds: list[int] | None = None) -> dict:
    """Train every family (or ablation point) to ``budget_gpu_hours`` modeled GPU-hours, once per
    run seed in ``seeds`` if given, and compare; with ``from_runs``, compare the finished runs in
    that folder instead of training."""
    from solrl_core.compare import run_comparison
    from solrl_core.report_readme import write_readme

    logger = get_run_logger()
    out_dir = Path(out).expanduser().resolve()
    if from_runs:
        report = compare_finished_runs(Path(from_runs).expanduser().resolve(), out_dir, budget_gpu_hours,
                                       families=families)
    else:
        from solrl_core.presets import FAMILIES

        variants = _variants(preset, families or list(FAMILIES), ablation, overrides or [])
        report = run_comparison(variants, budget_gpu_hours, out_dir, evaluations=evaluations, log=logger.info,
                                seeds=seeds)
    readme = write_readme(out_dir)
    speedup = report.get("speedup_to_equal_reward")
    logger.info(f"speed-up to equal reward (sol_rl vs diffusionnft): {speedup if speedup is None else f'{speedup:.2f}x'}")
    logger.info(f"wrote {out_dir / 'compare.json'} and {readme}")
    return {"speedup_to_equal_reward": speedup, "out": str(out_dir)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.compare",
                                     description="compare finished runs without training again (no Prefect)")
    parser.add_argument("--from-runs", required=True, help="folder of finished runs, one sub-folder per family")
    parser.add_argument("--budget-gpu-hours", type=float, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    command = " ".join(["python -m flows.compare", *(argv if argv is not None else sys.argv[1:])])
    report = compare_finished_runs(Path(args.from_runs), Path(args.out), args.budget_gpu_hours, command=command)
    print((Path(args.out) / "compare.md").read_text(encoding="utf-8"), end="")
    print(f"speed-up to equal reward: {report.get('speedup_to_equal_reward')}; wrote {Path(args.out) / 'compare.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
