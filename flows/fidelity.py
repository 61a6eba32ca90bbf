"""The ``fidelity`` flow: the ranking-fidelity study of ``solrl_core.fidelity`` (explorer drafts vs
full-precision samples of the same seeds), its JSON and plot."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger

from solrl_core.config import parse_override


@flow(name="fidelity", persist_result=False, log_prints=False)
def fidelity(out: str = "reports/fidelity.json", preset: str = "shapes-tiny", prompts: int = 64, pool: int = 96,
             explore_steps: list[int] | None = None, backends: list[str] | None = None,
             overrides: list[str] | None = None) -> dict:
    """Spearman, Kendall, top-K precision and mean true ranks per (backend, explore steps)."""
    from solrl_core.fidelity import FidelityPlan, format_result, plot_fidelity, run_fidelity
    from solrl_core.presets import resolve_config

    logger = get_run_logger()
    config = resolve_config(preset, "sol_rl", [parse_override(text) for text in overrides or []])
    plan = FidelityPlan(prompts=prompts, pool=pool, explore_steps=tuple(explore_steps or [6]),
                        backends=tuple(backends or ["emulated-nvfp4", "fp8"]))
    path = Path(out).expanduser().resolve()
    report = run_fidelity(config, plan, out=path, log=logger.info)
    plot_fidelity(report, path.with_suffix(".png"))
    for result in report["results"]:
        logger.info(f"{result['backend']:15s} {result['explore_steps']:2d} steps  {format_result(result)}")
    return {"out": str(path), "results": [{k: v for k, v in r.items() if not isinstance(v, (dict, list))}
                                          for r in report["results"]]}
