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
import sys
from pathlib import Path

from prefect import flow, get_run_logger

from solrl_core.compare import COMPARE_METRICS_FILE, compare_finished_runs, write_metrics  # noqa: F401 - re-exported
from solrl_core.config import parse_override


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
