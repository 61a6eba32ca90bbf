"""Equal-budget comparison (SPEC §5-§6): every family (or every point of an ablation) trained to
the same modeled GPU-hour budget through the one training loop, then reward-vs-GPU-hour curves,
the speed-up to equal reward, a plot, a markdown table and sample grids.

Budget: each variant runs as many whole iterations as fit in the budget, counting the training
stages only (explore, rank, regenerate, update, requantize). Evaluation is the same measurement
for every family and is not charged, so a family that runs more iterations is not penalised for
being evaluated more often.

Seeds: with ``seeds``, every variant trains once per run seed (``runs/<name>/seed-<s>``), all sized
to the same budget; the report gives mean ± standard error across seeds at every evaluation and a
bootstrap over seeds (solrl_core.seed_stats) for the speed-up and the final-reward differences.

Cost profiles: budgets are sized on the runs' own device profile; the same runs are re-costed
from the FLOPs per stage that metrics.jsonl records under other profiles (``also_profiles``; by
default B200-measured beside B200), so one set of runs gives the speed-up under each cost model.
"""

from __future__ import annotations

import copy
import json
import math
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from solrl_core import compare_markdown, compare_stats, seed_stats
from solrl_core.accounting import SampleFlops, device_profile, iteration_hours
from solrl_core.checkpoint import CHECKPOINT, CheckpointError, read_metadata
from solrl_core.config import Config, from_dict, set_key, to_dict
from solrl_core.ledger import METRICS_FILE, SUMMARY_FILE, atomic_write, write_json
from solrl_core.mappings import changed_settings
from solrl_core.presets import FAMILIES, validate
from solrl_core.prompts import evaluation_prompts
from solrl_core.recost import check_also_profiles, recosted_hours
from solrl_core.rewards.registry import RewardSet
from solrl_core.speedup import DEFAULT_FRACTION, first_crossing, speedup_to_equal_reward  # noqa: F401 (re-exported)
from solrl_core.stages import modeled_iteration_hours
from solrl_core.training import RunObserver, run_training

BASELINE, CANDIDATE = "diffusionnft", "sol_rl"
# Beyond the paper: reported beside sol_rl (its speed-up with its interval, and its difference to it).
ADAPTIVE = "sol_rl_adaptive"
# naive_scaling's control: its pool and cost, K kept at random (what keeping the extremes adds).
RANDOM_POOL = "random_pool"
# The base model's and the latest evaluation's images, rewritten at every evaluation: a run resumed
# from its checkpoint does not evaluate the base again, and the sample grid still needs them.
EVAL_IMAGES = "eval_images.safetensors"
GRID_PROMPTS = 8

# SPEC §6: time to reach DiffusionNFT's final reward, and FLUX.1 at equal GPU-hours.
PAPER_SPEEDUP_TO_EQUAL_REWARD = {"SANA": 2.42, "FLUX.1": 3.00, "SD3.5-L": 4.64}


# ---------------------------------------------------------------------------------------------
# Curves and the speed-up to equal reward


Curve = list[tuple[float, float]]  # (GPU-hours, reward), GPU-hours ascending, first point the base


def curve_from_run(run_dir: Path, metric: Callable[[dict], float]) -> list[dict]:
    """Evaluation points of a run: the base at 0 GPU-hours, then each evaluation at the cumulative
    modeled GPU-hours of the iteration it followed (and measured CPU seconds beside it)."""
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    points = [{"iteration": -1, "modeled_gpu_hours": 0.0, "gpu_hours": None, "cpu_seconds": 0.0,
               "rewards": summary["eval_reward_base"], "reward": metric(summary["eval_reward_base"])}]
    seconds = 0.0
    for line in (run_dir / METRICS_FILE).read_text().splitlines():
        record = json.loads(line)
        seconds += record["seconds"]["total"]
        if "eval" in record:
            points.append({"iteration": record["iteration"],
                           "modeled_gpu_hours": record["modeled_gpu_hours_cumulative"],
                           "gpu_hours": record.get("gpu_hours_cumulative"), "cpu_seconds": round(seconds, 1),
                           "rewards": record["eval"], "reward": metric(record["eval"])})
    return points


def as_curve(points: list[dict]) -> Curve:
    return [(p["modeled_gpu_hours"], p["reward"]) for p in points]


def weighted_metric(weights: dict[str, float]) -> Callable[[dict], float]:
    """The training reward (the weighted sum that ranks seeds) from a run's evaluation means."""
    return lambda rewards: float(sum(weight * rewards[name] for name, weight in weights.items()))


def metric_name(weights: dict[str, float]) -> str:
    if len(weights) == 1 and next(iter(weights.values())) == 1.0:
        return next(iter(weights))
    return " + ".join(f"{weight:g}*{name}" for name, weight in weights.items())


# ---------------------------------------------------------------------------------------------
# Running the variants


class _EvaluationImages(RunObserver):
    """Keeps the base model's and the latest evaluation images, for the sample grids, and writes
    them to ``run_dir`` after every evaluation (a resumed run starts from what was written)."""

    def __init__(self, run_dir: Path, images: dict[str, torch.Tensor] | None = None):
        self.run_dir = run_dir
        self.images: dict[str, torch.Tensor] = dict(images or {})

    def on_evaluation(self, iteration: int, rewards: dict[str, float], images: torch.Tensor) -> None:
        self.images["base" if iteration < 0 else "final"] = images.detach().cpu().float().contiguous()
        kept = dict(self.images)
        atomic_write(self.run_dir / EVAL_IMAGES, lambda temporary: save_file(kept, temporary))


def size_to_budget(config: Config, budget_gpu_hours: float, evaluations: int, iteration_hours: float) -> Config:
    """The config with as many whole iterations as fit the budget, evaluated ~``evaluations`` times."""
    iterations = max(1, math.floor(budget_gpu_hours / iteration_hours * (1 + 1e-9)))
    sized = copy.deepcopy(config)
    set_key(sized, "iterations", iterations)
    set_key(sized, "eval.every", max(1, math.ceil(iterations / evaluations)))
    return validate(sized)


def plan_variant(config: Config, run_dir: Path, budget_gpu_hours: float, evaluations: int,
                 estimate: dict | None = None) -> dict:
    """Size one variant to the budget; say whether ``run_dir`` already holds its finished run.
    Without ``estimate``, the finished run's recorded FLOPs size it where they can (nothing loads),
    else the model is loaded to count them."""
    estimate = estimate or reusable_estimate(config, run_dir, budget_gpu_hours, evaluations) \
        or modeled_iteration_hours(config)
    sized = size_to_budget(config, budget_gpu_hours, evaluations, estimate["total"])
    summary_path = run_dir / SUMMARY_FILE
    finished = (summary_path.exists() and (run_dir / EVAL_IMAGES).exists()
                and json.loads(summary_path.read_text())["config"] == to_dict(sized))
    resume = not finished and interrupted_run_of(run_dir, sized)
    if not finished and not resume and run_dir.exists() and any(run_dir.iterdir()):
        raise FileExistsError(f"{run_dir} holds another run; delete it or choose a new --out")
    return {"config": sized, "estimate": estimate, "run_dir": run_dir, "reused": finished, "resume": resume,
            "seed": sized.seed}


def reusable_estimate(config: Config, run_dir: Path, budget_gpu_hours: float, evaluations: int) -> dict | None:
    """The iteration estimate from the FLOPs per sample that ``run_dir``'s finished run recorded,
    when sizing ``config`` with it gives that run's very config (so the counts are this config's:
    sizing changes only iterations and eval.every, which change no per-sample FLOP); else None."""
    summary_path = run_dir / SUMMARY_FILE
    if not summary_path.is_file() or not (run_dir / EVAL_IMAGES).exists():
        return None
    summary = json.loads(summary_path.read_text())
    if "flops_per_sample" not in summary:
        return None
    estimate = recorded_estimate(config, summary, summary_path)
    sized = size_to_budget(config, budget_gpu_hours, evaluations, estimate["total"])
    return estimate if summary["config"] == to_dict(sized) else None


def recorded_estimate(config: Config, summary: dict, summary_path: Path) -> dict:
    """One iteration's modeled cost from the FLOPs per sample a finished run's summary recorded."""
    try:
        counts = SampleFlops.from_record(summary["flops_per_sample"])
    except ValueError as error:
        raise ValueError(f"{summary_path}: flops_per_sample: {error}; delete the run and train it again") from None
    return iteration_hours(config, counts)


def interrupted_run_of(run_dir: Path, sized: Config) -> bool:
    """Whether ``run_dir`` holds this very config's run, stopped after a checkpoint: then it is
    resumed (bit-exactly, as ``solrl run --resume``), so a stop costs at most one iteration."""
    if not (run_dir / CHECKPOINT).is_file() or not (run_dir / EVAL_IMAGES).is_file():
        return False
    try:
        return read_metadata(run_dir)["config"] == to_dict(sized)
    except CheckpointError:
        return False


def with_seed(config: Config, seed: int) -> Config:
    seeded = copy.deepcopy(config)
    set_key(seeded, "seed", seed)
    return validate(seeded)


def plan_seeds(config: Config, variant_dir: Path, budget_gpu_hours: float, evaluations: int,
               seeds: Sequence[int] | None) -> list[dict]:
    """One plan per run seed, in ``variant_dir/seed-<s>``; without ``seeds``, the one run of the
    config's own seed in ``variant_dir`` itself (the single-seed layout)."""
    if seeds is None:
        return [plan_variant(config, variant_dir, budget_gpu_hours, evaluations)]
    if (variant_dir / SUMMARY_FILE).exists():
        raise FileExistsError(f"{variant_dir} holds a single-seed run; delete it or choose a new --out for --seeds")
    plans, estimate = [], None
    for seed in seeds:
        plans.append(plan_variant(with_seed(config, seed), variant_dir / seed_dir_name(seed), budget_gpu_hours,
                                  evaluations, estimate))
        estimate = plans[-1]["estimate"]  # the seed changes no FLOP: one estimate sizes every seed
    return plans


def seed_dir_name(seed: int) -> str:
    return f"seed-{seed}"


def seed_runs(result: dict | list[dict]) -> list[dict]:
    """A variant's runs, one per seed: a single run (the single-seed layout) is a list of one."""
    return result if isinstance(result, list) else [result]


def finished_results(runs_dir: Path, names: Sequence[str] | None = None) -> dict[str, list[dict]]:
    """The finished runs under ``runs_dir``, per variant: ``<name>/summary.json`` (one seed) or
    ``<name>/seed-<s>/summary.json`` (seeds in ascending order), with their estimates and images.
    The estimates come from the FLOPs per sample each summary recorded: no model is loaded. A
    summary written before they were recorded has them counted again, on the loaded model."""

    def run_dirs(variant_dir: Path) -> list[Path]:
        if (variant_dir / SUMMARY_FILE).is_file():
            return [variant_dir]
        seeded = [p for p in variant_dir.glob("seed-*") if (p / SUMMARY_FILE).is_file() and p.name[5:].isdigit()]
        return sorted(seeded, key=lambda p: int(p.name[5:]))

    names = list(names) if names else sorted(p.name for p in runs_dir.iterdir() if p.is_dir() and run_dirs(p))
    results: dict[str, list[dict]] = {}
    for name in names:
        dirs = run_dirs(runs_dir / name)
        if not dirs:
            raise FileNotFoundError(f"no finished run (summary.json) in {runs_dir / name} or its seed-* folders")
        results[name], estimate = [], None
        for run_dir in dirs:
            summary = json.loads((run_dir / SUMMARY_FILE).read_text())
            config = validate(from_dict(summary["config"]))
            if estimate is None:
                estimate = recorded_estimate(config, summary, run_dir / SUMMARY_FILE) if "flops_per_sample" in summary \
                    else modeled_iteration_hours(config)
            results[name].append({"config": config, "estimate": estimate, "run_dir": run_dir, "reused": True,
                                  "seed": config.seed, "summary": summary,
                                  "images": load_file(str(run_dir / EVAL_IMAGES))})
    return results


def run_variant(name: str, plan: dict, log: Callable[[str], None], observers: Sequence[RunObserver] = ()) -> dict:
    """Train one sized variant (or read back its finished run) and load its evaluation images;
    ``observers`` (a tracker) watch the training, not a reused run."""
    sized, run_dir = plan["config"], plan["run_dir"]
    if plan["reused"]:
        log(f"compare: {name}: reusing the finished run in {run_dir}")
    else:
        log(f"compare: {name}: {sized.iterations} iterations of {plan['estimate']['total']:.3g} modeled GPU-hours "
            f"({sized.accounting.device}), evaluated every {sized.eval.every}"
            + (f"; resuming the interrupted run in {run_dir}" if plan.get("resume") else ""))
        keeper = _EvaluationImages(run_dir, load_file(str(run_dir / EVAL_IMAGES)) if plan.get("resume") else None)
        run_training(sized, run_dir, log=lambda line: log(f"  {name:14s} {line}"), observers=[keeper, *observers],
                     resume=bool(plan.get("resume")))
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    return {**plan, "summary": summary, "images": load_file(str(run_dir / EVAL_IMAGES))}


def run_comparison(variants: dict[str, Config], budget_gpu_hours: float, out_dir: Path, evaluations: int = 6,
                   command: str = "", log: Callable[[str], None] = print, seeds: Sequence[int] | None = None,
                   also_profiles: list[str] | None = None, speedup_fraction: float = DEFAULT_FRACTION) -> dict:
    """Train every variant to the budget under ``out_dir/runs/<name>`` (``.../seed-<s>`` for each
    of ``seeds``) and write the report files.

    Every variant and seed is sized (and its run directory checked) before any trains, so a
    conflict stops the comparison before it writes anything.
    """
    started = time.perf_counter()
    also_profiles = check_also_profiles(variants, also_profiles)
    plans = {name: plan_seeds(config, out_dir / "runs" / name, budget_gpu_hours, evaluations, seeds)
             for name, config in variants.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {name: [run_variant(name if seeds is None else f"{name} seed {plan['seed']}", plan, log)
                      for plan in seed_plans] for name, seed_plans in plans.items()}
    first = next(iter(variants.values()))
    report = build_report(variants, results, budget_gpu_hours, metric_name(first.rewards),
                          weighted_metric(first.rewards), command, also_profiles=also_profiles,
                          speedup_fraction=speedup_fraction)
    report["seconds"] = round(time.perf_counter() - started, 1)
    write_outputs(report, results, out_dir)
    return report


def compare_finished_runs(runs_dir: Path, out_dir: Path, budget_gpu_hours: float, command: str = "",
                          families: list[str] | None = None, seeds: list[int] | None = None,
                          speedup_fraction: float = DEFAULT_FRACTION) -> dict:
    """compare.json, compare.png, compare.md and samples_grid.png in ``out_dir`` from the finished
    runs in ``runs_dir/<name>/`` or, one per run seed, ``runs_dir/<name>/seed-<s>/`` (each with
    summary.json, metrics.jsonl and the evaluation images).

    ``families`` (in their order) and ``seeds`` pick the runs; without them every finished run is
    compared, the families in presets.FAMILIES's order. A named run that is not there is an error,
    and a run left over from an earlier selection is not read."""
    started = time.perf_counter()
    found = finished_results(runs_dir, families)
    if not found:
        raise FileNotFoundError(f"no finished runs (summary.json) under {runs_dir}")
    if seeds is not None:
        found = _only_seeds(found, seeds, runs_dir)
    order = {name: index for index, name in enumerate(families or FAMILIES)}
    results = {name: found[name] for name in sorted(found, key=lambda name: (order.get(name, len(order)), name))}
    variants = {name: runs[0]["config"] for name, runs in results.items()}
    first = next(iter(variants.values()))
    report = build_report(variants, results, budget_gpu_hours, metric_name(first.rewards),
                          weighted_metric(first.rewards), command, speedup_fraction=speedup_fraction)
    report["seconds"] = round(time.perf_counter() - started, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_outputs(report, results, out_dir)
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
    write_json(path, metrics)


def build_report(variants: dict[str, Config], results: dict, budget: float, metric_label: str,
                 metric: Callable[[dict], float], command: str, also_profiles: list[str] | None = None,
                 speedup_fraction: float = DEFAULT_FRACTION) -> dict:
    """compare.json's content from the finished runs: ``results[name]`` is one run or a list of
    runs, one per seed; a variant's curve, final rewards and speed-ups are means over its seeds."""
    runs = {name: seed_runs(result) for name, result in results.items()}
    points = {name: [curve_from_run(run["run_dir"], metric) for run in seed_list] for name, seed_list in runs.items()}
    curves = {name: seed_mean_points(seed_points) for name, seed_points in points.items()}
    first = next(iter(variants.values()))
    device = first.accounting.device
    also_profiles = check_also_profiles(variants, also_profiles)
    report: dict = {
        "preset": first.preset, "command": command, "metric": metric_label,
        "budget_gpu_hours": budget, "gpu_hours_basis": profile_basis(device, first.accounting.utilization)
        + "; CPU seconds measured beside",
        "device_profile": device, "utilization": first.accounting.utilization,
        "seeds": [run["seed"] for run in runs[next(iter(runs))]],
        "families": {},
    }
    for name, seed_list in runs.items():
        report["families"][name] = family_entry(name, seed_list, points[name], curves[name], first)
    report["final_reward_spread"] = final_reward_spread(results, first, statistic_pairs(trained_families(runs)))
    report["seed_statistics"] = seed_statistics(runs, points, device, also_profiles, report["final_reward_spread"],
                                                speedup_fraction)
    headlines(report)
    report["paper"] = {"speedup_to_equal_reward": PAPER_SPEEDUP_TO_EQUAL_REWARD}
    return report


def headlines(report: dict) -> None:
    """compare.json's top-level readings, from its statistics: the mean-curve point speed-ups at
    each share of the baseline's gain (the paper's definition at 1), each family's declared
    threshold speed-up under every profile (the verdict's), sol_rl's as the headline."""
    statistics, curves = report["seed_statistics"], report["families"]
    for key in ("speedups", "speedup_at_fraction_of_gain", "naive_quant_below_sol_rl", "naive_quant_minus_sol_rl"):
        report.pop(key, None)
    if BASELINE in curves:
        baseline = as_curve(curves[BASELINE]["curve"])
        report["speedups"] = {name: speedup_to_equal_reward(baseline, as_curve(entry["curve"]))
                              for name, entry in curves.items() if name != BASELINE}
    by_family = {name: {profile: entry[name]["threshold"] for profile, entry in statistics["speedups"].items()
                        if name in entry} for name in curves if name != BASELINE}
    report["speedups_by_family"] = {name: entry for name, entry in by_family.items() if entry}
    report["speedup_by_profile"] = report["speedups_by_family"].get(CANDIDATE, {})
    own = report["speedup_by_profile"].get(report["device_profile"])
    report["speedup_to_equal_reward"] = own["speedup"] if own else None
    report["speedup_fraction"] = statistics["speedup_fraction"]
    if CANDIDATE in report.get("speedups", {}):
        report["speedup_to_baseline_final"] = report["speedups"][CANDIDATE]["speedup_to_equal_reward"]
    if "naive_quant - sol_rl" in statistics["final_differences"]:
        report["naive_quant_minus_sol_rl"] = statistics["final_differences"]["naive_quant - sol_rl"]


def family_entry(name: str, seed_list: list[dict], seed_points: list[list[dict]], mean_points: list[dict],
                 reference: Config) -> dict:
    """One variant's compare.json entry: the fields of a single run, as means over the seeds (with
    their SE beside), and each seed's own run under ``runs``."""
    config = seed_list[0]["config"]
    finals = [points[-1]["reward"] for points in seed_points]
    final_reward, final_se = seed_stats.mean_se(finals)
    reward_names = list(seed_list[0]["summary"]["eval_reward_final"])
    final_rewards = {reward: seed_stats.mean_se([run["summary"]["eval_reward_final"][reward] for run in seed_list])
                     for reward in reward_names}
    used = [points[-1]["modeled_gpu_hours"] if len(points) > 1 else 0.0 for points in seed_points]
    single = len(seed_list) == 1 and seed_list[0]["run_dir"].name == name
    return {
        "family": config.family, "iterations": config.iterations, "eval_every": config.eval.every,
        "modeled_gpu_hours_per_iteration": seed_list[0]["estimate"]["total"],
        "modeled_gpu_hours_per_stage": seed_list[0]["estimate"]["stages"],
        "modeled_gpu_hours_used": seed_stats.mean_se(used)[0],
        "cpu_seconds": round(math.fsum(run["summary"]["seconds"] for run in seed_list), 2),
        "final_rewards": {reward: mean for reward, (mean, _) in final_rewards.items()},
        "final_rewards_se": {reward: se for reward, (_, se) in final_rewards.items()},
        "final_reward": final_reward, "final_reward_se": final_se,
        "base_rewards": seed_list[0]["summary"]["eval_reward_base"], "curve": mean_points,
        "run_dir": f"runs/{name}", "reused_finished_run": all(run["reused"] for run in seed_list),
        "seeds": [run["seed"] for run in seed_list],
        "runs": [{"seed": run["seed"], "run_dir": f"runs/{name}" if single else f"runs/{name}/{run['run_dir'].name}",
                  "final_reward": points[-1]["reward"], "final_rewards": run["summary"]["eval_reward_final"],
                  "cpu_seconds": run["summary"]["seconds"], "reused_finished_run": run["reused"], "curve": points}
                 for run, points in zip(seed_list, seed_points)],
        "overrides": {key: value for key, value in changed_settings(to_dict(reference), to_dict(config)).items()
                      if key != "seed"},
        "config": to_dict(config),
    }


def seed_mean_points(seed_points: list[list[dict]]) -> list[dict]:
    """A variant's evaluations as means over its seeds, with the keys of one run's points plus
    ``reward_se``, ``rewards_se`` and ``seeds``. The seeds of a variant share its iteration cost and
    so its evaluation hours; should they not, each seed is interpolated (seed_stats.seed_grid) and
    the point has no single iteration."""
    def mean(value: Callable[[dict], float]) -> dict:
        return seed_stats.mean_curve([[(p["modeled_gpu_hours"], value(p)) for p in points] for points in seed_points])

    reward = mean(lambda p: p["reward"])
    per_reward = {name: mean(lambda p, name=name: p["rewards"][name]) for name in seed_points[0][0]["rewards"]}
    seconds = mean(lambda p: p["cpu_seconds"])
    shared = not reward["interpolated"]
    result = []
    for i, hours in enumerate(reward["gpu_hours"]):
        measured = [points[i]["gpu_hours"] for points in seed_points] if shared else [None]
        result.append({
            "iteration": seed_points[0][i]["iteration"] if shared else None, "modeled_gpu_hours": hours,
            "gpu_hours": None if None in measured else seed_stats.mean_se(measured)[0],
            "cpu_seconds": round(seconds["mean"][i], 1),
            "rewards": {name: entry["mean"][i] for name, entry in per_reward.items()},
            "rewards_se": {name: entry["se"][i] for name, entry in per_reward.items()},
            "reward": reward["mean"][i], "reward_se": reward["se"][i], "seeds": len(seed_points)})
    return result


def profile_basis(device: str, utilization: float) -> str:
    """How GPU-hours are modeled under ``device``, in words for the report."""
    profile = device_profile(device)
    if profile.step_costs:
        shares = ", ".join(f"an explorer step at {precision.upper()} charged {share:g} of its FLOPs at BF16"
                           for precision, share in profile.step_costs.items())
        return (f"modeled: {device}, calibrated to {profile.source} ({shares}; every other stage "
                f"FLOPs / BF16 peak) x utilisation {utilization:g}")
    return f"modeled: FLOPs / ({device} dense peak per stage precision x utilisation {utilization:g})"


# Pairs compared at the finals, at equal budget and after equal iterations (where both ran), each
# with its verdict; a study's variants are read against the family they vary too.
DIFFERENCE_PAIRS = (("naive_quant", CANDIDATE), (CANDIDATE, BASELINE), (CANDIDATE, "naive_scaling"),
                    (ADAPTIVE, CANDIDATE), (ADAPTIVE, BASELINE), ("naive_scaling", RANDOM_POOL),
                    (RANDOM_POOL, BASELINE))


def variant_pairs(families: dict[str, str]) -> list[tuple[str, str]]:
    """(variant, the family it varies) for each compared variant whose family is compared too:
    ``families`` maps each compared name to the family its runs trained (a study's sol_rl with
    an FP8 explorer, named sol_rl_fp8, is read against sol_rl)."""
    return [(name, family) for name, family in families.items() if name != family and family in families]


def statistic_pairs(families: dict[str, str]) -> list[tuple[str, str]]:
    """The pairs a report compares (``families``: each compared name and the family its runs
    trained): the method's pairs and each variant against its family, or, for an ablation's points
    (all of one family under their own names), each point against the first."""
    names = list(families)
    pairs = [(a, b) for a, b in [*DIFFERENCE_PAIRS, *variant_pairs(families)] if a in families and b in families]
    if pairs or len(names) < 2 or any(name in FAMILIES for name in names):
        return pairs
    return [(name, names[0]) for name in names[1:]]


def trained_families(runs: dict) -> dict[str, str]:
    return {name: seed_runs(result)[0]["config"].family for name, result in runs.items()}


def restate_report(report: dict, speedup_fraction: float | None = None) -> dict:
    """``report`` (a compare.json) with its statistics recomputed from the per-seed curves it holds,
    so a committed comparison is restated without its run folders. A re-costed profile is kept
    where each family's seeds share their evaluation hours (its mean curve's hours are then every
    seed's); the final's evaluation-set SE comes from the pairs the report scored per image."""
    families = report["families"]
    points = {name: [run["curve"] for run in entry["runs"]] for name, entry in families.items()}
    device = report["device_profile"]
    profiles = {device: {name: [as_curve(run) for run in runs] for name, runs in points.items()}}
    recorded = (report.get("seed_statistics") or {}).get("profiles", {})
    for profile, entry in recorded.items():
        if profile == device or any(family.get("interpolated_across_seeds") or len(family["curve"]) != len(points[name][0])
                                    for name, family in entry["families"].items()):
            continue
        profiles[profile] = {name: [list(zip([p["gpu_hours"] for p in family["curve"]], [p["reward"] for p in run]))
                                    for run in points[name]] for name, family in entry["families"].items()}
    fraction = speedup_fraction or report.get("speedup_fraction") or DEFAULT_FRACTION
    statistics = compare_stats.statistics(
        points, {name: [run["seed"] for run in entry["runs"]] for name, entry in families.items()},
        statistic_pairs({name: entry["family"] for name, entry in families.items()}), profiles, device, BASELINE,
        eval_se=compare_stats.evaluation_errors(report.get("final_reward_spread")), fraction=fraction)
    for profile, entry in statistics["profiles"].items():
        entry.update({key: recorded[profile][key] for key in ("role", "basis") if key in recorded.get(profile, {})})
    restated = {**report, "seed_statistics": statistics}
    headlines(restated)
    return restated


def write_restated(out_dir: Path, speedup_fraction: float | None = None) -> dict:
    """OUT/compare.json and compare.md rewritten with restated statistics (plots and grids kept)."""
    report = restate_report(json.loads((out_dir / "compare.json").read_text(encoding="utf-8")), speedup_fraction)
    write_json(out_dir / "compare.json", report)
    atomic_write(out_dir / "compare.md", lambda temporary: Path(temporary).write_text(markdown_table(report),
                                                                                      encoding="utf-8"))
    return report


def seed_statistics(runs: dict[str, list[dict]], points: dict[str, list[list[dict]]], device: str,
                    also_profiles: list[str], spread: dict, speedup_fraction: float) -> dict:
    """compare_stats.statistics over the runs: each seed's curve under every cost profile (the runs'
    own, and re-costed from their recorded FLOPs), the final's evaluation-set SE per pair."""
    profiles = {profile: {name: [profile_curve(run, seed_points, profile, device) for run, seed_points in
                                 zip(runs[name], points[name])] for name in runs} for profile in (device, *also_profiles)}
    statistics = compare_stats.statistics(
        points, {name: [run["seed"] for run in seed_list] for name, seed_list in runs.items()},
        statistic_pairs(trained_families(runs)),
        profiles, device, BASELINE, eval_se=compare_stats.evaluation_errors(spread), fraction=speedup_fraction)
    utilization = runs[next(iter(runs))][0]["config"].accounting.utilization
    for profile, entry in statistics["profiles"].items():
        entry["role"] = ("the runs' own profile: it sized the budget" if profile == device else
                         f"re-costed from the recorded FLOPs of the same runs; the budget was sized under {device}")
        entry["basis"] = profile_basis(profile, utilization)
    return statistics


def profile_curve(run: dict, seed_points: list[dict], profile: str, device: str) -> Curve:
    """One run's (GPU-hours, reward) curve under ``profile``: as recorded under the run's own device,
    re-costed from its metrics under any other."""
    if profile == device:
        return as_curve(seed_points)
    hours = recosted_hours(run["run_dir"], run["config"], run["estimate"], profile)
    return [(hours[p["iteration"]], p["reward"]) for p in seed_points]


def final_reward_spread(results: dict, config: Config, pairs: Sequence[tuple[str, str]]) -> dict:
    """The final evaluation's trained reward per image: each variant's mean and standard error, and
    paired differences (same prompts and seeds, each image's reward averaged over the run seeds)
    for every compared pair: the evaluation set's share of a final difference's error."""
    prompts = [p for p in evaluation_prompts(config) for _ in range(config.eval.seeds_per_prompt)]
    scorer = RewardSet(config.rewards, paths=config.reward_paths)
    per_image = {name: torch.stack([scorer.score(run["images"]["final"], prompts).combined.double()
                                    for run in seed_runs(result)]).mean(0)
                 for name, result in results.items()}
    return {"images": len(prompts), "per_variant": {name: _mean_se(values) for name, values in per_image.items()},
            "paired_differences": {f"{a} - {b}": _mean_se(per_image[a] - per_image[b]) for a, b in pairs}}


def _mean_se(values: torch.Tensor) -> dict:
    return {"mean": float(values.mean()), "se": float(values.std() / math.sqrt(values.numel()))}


# ---------------------------------------------------------------------------------------------
# Outputs: compare.json, compare.png, compare.md, samples_grid.png


def write_outputs(report: dict, results: dict, out_dir: Path) -> None:
    plot_curves(report, out_dir / "compare.png")
    # One image per prompt per variant keeps the grid readable: the first seed's runs.
    first_seed = {name: seed_runs(result)[0] for name, result in results.items()}
    report["grid"] = plot_base_and_final_samples(first_seed, out_dir / "samples_grid.png")
    report["grid_run_seed"] = next(iter(first_seed.values()))["seed"]
    report["files"] = {"plot": "compare.png", "table": "compare.md", "grid": "samples_grid.png"}
    write_json(out_dir / "compare.json", report)
    (out_dir / "compare.md").write_text(markdown_table(report), encoding="utf-8")


def _pyplot():
    # deferred: matplotlib at import time (start-up of every comparison, which plots only at its end)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib at import time (after the backend is chosen)

    return plt


def plot_curves(report: dict, path: Path) -> None:
    """Reward vs modeled GPU-hours, one line per family (the mean over seeds, with a ± SE band when
    there are several); one panel per evaluation reward, then the trained reward re-costed under
    each other device profile."""
    plt = _pyplot()
    first = next(iter(report["families"].values()))
    names = [report["metric"]] + [name for name in first["final_rewards"] if name != report["metric"]]
    profiles = [profile for profile in report.get("seed_statistics", {}).get("profiles", {})
                if profile != report["device_profile"]]
    panels = len(names) + len(profiles)
    figure, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 3.8), squeeze=False)
    colours = {family: f"C{index}" for index, family in enumerate(report["families"])}
    seeds = max(len(entry.get("seeds", [None])) for entry in report["families"].values())
    for axis, reward_name in zip(axes[0], names):
        for family, entry in report["families"].items():
            trained = reward_name == report["metric"]
            _plot_mean(axis, [p["modeled_gpu_hours"] for p in entry["curve"]],
                       [p["reward"] if trained else p["rewards"][reward_name] for p in entry["curve"]],
                       [p.get("reward_se") if trained else p.get("rewards_se", {}).get(reward_name)
                        for p in entry["curve"]], family, colours[family])
        if reward_name == report["metric"] and BASELINE in report["families"]:
            axis.axhline(report["families"][BASELINE]["final_reward"], color="grey", linestyle="--", linewidth=0.8,
                         label=f"{BASELINE} final")
        axis.set(xlabel=f"modeled GPU-hours ({report['device_profile']}, utilisation {report['utilization']:g})",
                 ylabel=f"evaluation {reward_name}", title=reward_name)
    for axis, profile in zip(axes[0][len(names):], profiles):
        for family, entry in report["seed_statistics"]["profiles"][profile]["families"].items():
            _plot_mean(axis, [p["gpu_hours"] for p in entry["curve"]], [p["reward"] for p in entry["curve"]],
                       [p["reward_se"] for p in entry["curve"]], family, colours[family])
        if BASELINE in report["families"]:
            axis.axhline(report["families"][BASELINE]["final_reward"], color="grey", linestyle="--", linewidth=0.8)
        axis.set(xlabel=f"modeled GPU-hours ({profile}, re-costed)", ylabel=f"evaluation {report['metric']}",
                 title=f"{report['metric']}, {profile} (same runs)")
    for axis in axes[0]:
        axis.ticklabel_format(axis="x", style="sci", scilimits=(-3, 3))
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    over = f", mean ± SE over {seeds} seeds" if seeds > 1 else ""
    figure.suptitle(f"{report['preset']}: equal budget of {report['budget_gpu_hours']:.3g} modeled GPU-hours "
                    f"({report['device_profile']}){over}")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _plot_mean(axis, hours: list[float], values: list[float], ses: list[float | None], label: str, colour: str):
    axis.plot(hours, values, marker="o", markersize=3, label=label, color=colour)
    if ses and all(se is not None for se in ses):
        axis.fill_between(hours, [v - se for v, se in zip(values, ses)], [v + se for v, se in zip(values, ses)],
                          color=colour, alpha=0.18, linewidth=0)


def plot_base_and_final_samples(results: dict, path: Path, rows: int = GRID_PROMPTS) -> list[dict]:
    """The same evaluation prompts and seeds drawn by the base model and by each variant's final
    policy, side by side, with every image's rewards; returns those rewards."""
    plt = _pyplot()
    first = next(iter(results.values()))
    config = first["config"]
    per_prompt = config.eval.seeds_per_prompt
    prompts = [p for p in evaluation_prompts(config) for _ in range(per_prompt)]
    # The first seed of the first ``rows`` prompts: one image per prompt keeps the grid readable.
    picked = [i * per_prompt for i in range(min(rows, len(prompts) // per_prompt))]
    scorer = RewardSet(config.rewards, extra=config.eval.rewards, paths=config.reward_paths)
    names = list(dict.fromkeys(list(config.rewards) + list(config.eval.rewards)))
    columns = {"base": first["images"]["base"]} | {name: result["images"]["final"] for name, result in results.items()}
    scores = {name: scorer.score(images[picked], [prompts[i] for i in picked], names).per_reward
              for name, images in columns.items()}
    figure, axes = plt.subplots(len(picked), len(columns), figsize=(2.2 * len(columns) + 2.6, 2.1 * len(picked)),
                                squeeze=False)
    records = []
    for row, index in enumerate(picked):
        records.append({"prompt": prompts[index], "eval_sample": index, "rewards": {}})
        for column, (name, images) in enumerate(columns.items()):
            axis = axes[row][column]
            axis.imshow(images[index].permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
            values = {reward: float(scores[name][reward][row]) for reward in scores[name]}
            records[-1]["rewards"][name] = values
            axis.set_xlabel("  ".join(f"{_short(reward)} {value:.2f}" for reward, value in values.items()), fontsize=7)
            if row == 0:
                axis.set_title(name, fontsize=9)
            if column == 0:
                axis.set_ylabel(_wrap(prompts[index], 26), rotation=0, ha="right", va="center", fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return records


def _short(reward: str) -> str:
    return reward.removeprefix("shapes-")


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width))


# compare.md is compare_markdown's; re-exported for the callers that write it from a report.
markdown_table = compare_markdown.markdown_table
