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

from solrl_core import seed_stats
from solrl_core.accounting import SampleFlops, device_profile, iteration_hours
from solrl_core.checkpoint import CHECKPOINT, CheckpointError, read_metadata
from solrl_core.config import Config, from_dict, set_key, to_dict
from solrl_core.ledger import METRICS_FILE, SUMMARY_FILE, atomic_write, write_json
from solrl_core.mappings import changed_settings
from solrl_core.presets import FAMILIES, validate
from solrl_core.prompts import evaluation_prompts
from solrl_core.recost import check_also_profiles, recosted_hours
from solrl_core.rewards.registry import RewardSet
from solrl_core.stages import modeled_iteration_hours
from solrl_core.training import RunObserver, run_training

BASELINE, CANDIDATE = "diffusionnft", "sol_rl"
# Beyond the paper: reported beside sol_rl (its speed-up with its interval, and its difference to it).
ADAPTIVE = "sol_rl_adaptive"
# naive_scaling's control: its pool and cost, K kept at random (what keeping the extremes adds).
RANDOM_POOL = "random_pool"
GAIN_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
# The base model's and the latest evaluation's images, rewritten at every evaluation: a run resumed
# from its checkpoint does not evaluate the base again, and the sample grid still needs them.
EVAL_IMAGES = "eval_images.safetensors"
GRID_PROMPTS = 8

# SPEC §6: time to reach DiffusionNFT's final reward, and FLUX.1 at equal GPU-hours.
PAPER_SPEEDUP_TO_EQUAL_REWARD = {"SANA": 2.42, "FLUX.1": 3.00, "SD3.5-L": 4.64}


# ---------------------------------------------------------------------------------------------
# Curves and the speed-up to equal reward


Curve = list[tuple[float, float]]  # (GPU-hours, reward), GPU-hours ascending, first point the base


def first_crossing(curve: Curve, target: float) -> float | None:
    """GPU-hours at which ``curve`` first reaches ``target``, linear between evaluations; None if never."""
    if not curve:
        return None
    hours, reward = curve[0]
    if reward >= target:
        return hours
    for (h0, r0), (h1, r1) in zip(curve[:-1], curve[1:]):
        if r1 >= target:
            return h0 + (target - r0) / (r1 - r0) * (h1 - h0) if r1 != r0 else h1
    return None


# A speed-up that is not defined says why: the full sentence goes to compare.json, the short form
# to the tables and bullets, where the interval beside it already says the rest.
BASELINE_DID_NOT_IMPROVE = "the baseline did not improve on its start; no speed-up is defined"
CANDIDATE_NEVER_REACHED = "the candidate never reached the target within the budget"
# Each reason: its key in a bootstrap's undefined_reasons, and its short form.
_UNDEFINED = {BASELINE_DID_NOT_IMPROVE: ("baseline_did_not_improve", "undefined (no baseline gain)"),
              CANDIDATE_NEVER_REACHED: ("candidate_never_reached", "not reached")}


def speedup_to_equal_reward(baseline: Curve, candidate: Curve, fractions: Sequence[float] = GAIN_FRACTIONS) -> dict:
    """GPU-hours the baseline needs to reach a reward over those the candidate needs.

    Targets: the baseline's base reward plus ``fraction`` of its gain (fraction 1.0 is the
    baseline's own final evaluation reward, the paper's headline). The baseline's hours are its
    own first crossing of the target, so a curve that peaks before its end counts from the peak.
    """
    start, final = baseline[0][1], baseline[-1][1]
    gain = final - start
    result: dict = {"baseline_start_reward": start, "baseline_final_reward": final, "baseline_gain": gain, "at": {}}
    for fraction in fractions:
        entry: dict = {"target_reward": start + fraction * gain, "baseline_gpu_hours": None,
                       "candidate_gpu_hours": None, "speedup": None}
        if gain <= 0:
            entry["note"] = BASELINE_DID_NOT_IMPROVE
        else:
            entry["baseline_gpu_hours"] = first_crossing(baseline, entry["target_reward"])
            entry["candidate_gpu_hours"] = first_crossing(candidate, entry["target_reward"])
            if entry["candidate_gpu_hours"] is None:
                entry["note"] = CANDIDATE_NEVER_REACHED
            elif entry["candidate_gpu_hours"] > 0:
                entry["speedup"] = entry["baseline_gpu_hours"] / entry["candidate_gpu_hours"]
        result["at"][f"{fraction:g}"] = entry
    result["speedup_to_equal_reward"] = result["at"].get("1", {}).get("speedup")
    return result


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
                   also_profiles: list[str] | None = None) -> dict:
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
                          weighted_metric(first.rewards), command, also_profiles=also_profiles)
    report["seconds"] = round(time.perf_counter() - started, 1)
    write_outputs(report, results, out_dir)
    return report


def compare_finished_runs(runs_dir: Path, out_dir: Path, budget_gpu_hours: float, command: str = "",
                          families: list[str] | None = None, seeds: list[int] | None = None) -> dict:
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
                                  weighted_metric(first.rewards), command)
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
                 metric: Callable[[dict], float], command: str, also_profiles: list[str] | None = None) -> dict:
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
    if BASELINE in curves:
        baseline = as_curve(curves[BASELINE])
        report["speedups"] = {name: speedup_to_equal_reward(baseline, as_curve(mean_points))
                              for name, mean_points in curves.items() if name != BASELINE}
        headline = report["speedups"].get(CANDIDATE)
        report["speedup_to_equal_reward"] = headline["speedup_to_equal_reward"] if headline else None
        report["speedup_at_fraction_of_gain"] = (
            {fraction: entry["speedup"] for fraction, entry in headline["at"].items()} if headline else None)
    if "naive_quant" in results and CANDIDATE in results:
        report["naive_quant_below_sol_rl"] = (report["families"]["naive_quant"]["final_reward"]
                                              < report["families"][CANDIDATE]["final_reward"])
    statistics = seed_statistics(runs, points, device, also_profiles, first.accounting.utilization)
    report["seed_statistics"] = statistics
    report["speedup_by_profile"] = speedup_by_profile(statistics, CANDIDATE)
    # Every family's, sol_rl_adaptive's beside sol_rl's (the same entries as speedup_by_profile).
    by_family = {name: speedup_by_profile(statistics, name) for name in runs if name != BASELINE}
    report["speedups_by_family"] = {name: entry for name, entry in by_family.items() if entry}
    if "naive_quant - sol_rl" in statistics["final_differences"]:
        report["naive_quant_minus_sol_rl"] = statistics["final_differences"]["naive_quant - sol_rl"]
    report["final_reward_spread"] = final_reward_spread(results, first)
    report["paper"] = {"speedup_to_equal_reward": PAPER_SPEEDUP_TO_EQUAL_REWARD}
    return report


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


# Final-reward differences reported with their bootstrap interval (where both variants ran).
DIFFERENCE_PAIRS = (("naive_quant", CANDIDATE), (CANDIDATE, BASELINE), (CANDIDATE, "naive_scaling"),
                    (ADAPTIVE, CANDIDATE), (ADAPTIVE, BASELINE), ("naive_scaling", RANDOM_POOL),
                    (RANDOM_POOL, BASELINE))


def variant_pairs(families: dict[str, str]) -> list[tuple[str, str]]:
    """(variant, the family it varies) for each compared variant whose family is compared too:
    ``families`` maps each compared name to the family its runs trained (a study's sol_rl with
    an FP8 explorer, named sol_rl_fp8, is read against sol_rl)."""
    return [(name, family) for name, family in families.items() if name != family and family in families]


def _trained_families(runs: dict) -> dict[str, str]:
    return {name: seed_runs(result)[0]["config"].family for name, result in runs.items()}


def speedup_by_profile(statistics: dict, name: str) -> dict:
    """``name``'s speed-up to the baseline's final reward under each cost profile, with its
    bootstrap interval and how often it is undefined; empty without a baseline."""
    keys = ("speedup", "ci", "resamples", "undefined_share", "undefined_reasons", "note")
    return {profile: {key: entry["speedups"][name][key] for key in keys}
            for profile, entry in statistics["profiles"].items() if name in entry["speedups"]}


def seed_statistics(runs: dict[str, list[dict]], points: dict[str, list[list[dict]]], device: str,
                    also_profiles: list[str], utilization: float) -> dict:
    """Across seeds: mean ± SE curves under each cost profile, the variants on one GPU-hour grid,
    the speed-ups to the baseline's final reward and the final-reward differences, each with a
    bootstrap interval over seeds (when every variant has at least two)."""
    sizes = {name: len(seed_list) for name, seed_list in runs.items()}
    draws = seed_stats.resample_indices(sizes) if min(sizes.values()) >= 2 else None
    finals = {name: [seed[-1]["reward"] for seed in seed_points] for name, seed_points in points.items()}
    differences = {}
    for a, b in [*DIFFERENCE_PAIRS, *variant_pairs(_trained_families(runs))]:
        if a in finals and b in finals:
            differences[f"{a} - {b}"] = (seed_stats.bootstrap_difference(finals, a, b, draws) if draws else
                                         {"mean": seed_stats.mean_se(finals[a])[0] - seed_stats.mean_se(finals[b])[0],
                                          "se": None, "ci": None, "resamples": 0,
                                          "seeds": {a: len(finals[a]), b: len(finals[b])}})
    profiles = {}
    for profile in (device, *also_profiles):
        curves = {name: [profile_curve(run, seed_points, profile, device) for run, seed_points in
                         zip(runs[name], points[name])] for name in runs}
        profiles[profile] = {"role": "the runs' own profile: it sized the budget" if profile == device else
                             f"re-costed from the recorded FLOPs of the same runs; the budget was sized under {device}",
                             "basis": profile_basis(profile, utilization), **profile_statistics(curves, draws)}
    return {"seeds": {name: [run["seed"] for run in seed_list] for name, seed_list in runs.items()},
            "bootstrap": ({"resamples": seed_stats.BOOTSTRAP_RESAMPLES, "seed": seed_stats.BOOTSTRAP_SEED,
                           "confidence": seed_stats.CONFIDENCE,
                           "method": "percentile interval; seeds drawn with replacement within each variant "
                                     "independently; a resample with no defined speed-up ranks below every "
                                     "defined one"} if draws else None),
            "final_differences": differences, "profiles": profiles}


def profile_curve(run: dict, seed_points: list[dict], profile: str, device: str) -> Curve:
    """One run's (GPU-hours, reward) curve under ``profile``: as recorded under the run's own device,
    re-costed from its metrics under any other."""
    if profile == device:
        return as_curve(seed_points)
    hours = recosted_hours(run["run_dir"], run["config"], run["estimate"], profile)
    return [(hours[p["iteration"]], p["reward"]) for p in seed_points]


def profile_statistics(curves: dict[str, list[Curve]], draws: dict[str, list[list[int]]] | None) -> dict:
    """Under one cost profile: each variant's mean ± SE curve, all variants on one grid, and the
    speed-up of every variant to the baseline's final reward with its bootstrap interval."""
    means = {name: seed_stats.mean_curve(seed_curves) for name, seed_curves in curves.items()}
    every = [curve for seed_curves in curves.values() for curve in seed_curves]
    # Variants land on the same GPU-hours only if their iteration costs match; otherwise each
    # seed's curve is read on a common grid by linear interpolation between its evaluations.
    grid, interpolated = seed_stats.common_grid(every, max(1, min(len(curve) - 1 for curve in every)))
    common = {}
    for name, seed_curves in curves.items():
        values = [seed_stats.on_grid(curve, grid) for curve in seed_curves]
        stats = [seed_stats.mean_se([row[i] for row in values]) for i in range(len(grid))]
        common[name] = {"reward": [m for m, _ in stats], "reward_se": [se for _, se in stats]}
    families = {name: {"curve": [{"gpu_hours": h, "reward": m, "reward_se": se}
                                 for h, m, se in zip(mean["gpu_hours"], mean["mean"], mean["se"])],
                       "interpolated_across_seeds": mean["interpolated"],
                       "gpu_hours_used": seed_stats.mean_se([curve[-1][0] for curve in curves[name]])[0]}
                for name, mean in means.items()}
    speedups = ({name: bootstrap_speedup(means[BASELINE], means[name], BASELINE, name, draws)
                 for name in curves if name != BASELINE} if BASELINE in curves else {})
    return {"families": families, "common_grid": {"gpu_hours": grid, "interpolated": interpolated,
                                                  "families": common}, "speedups": speedups}


def bootstrap_speedup(baseline: dict, candidate: dict, baseline_name: str, candidate_name: str,
                      draws: dict[str, list[list[int]]] | None) -> dict:
    """The speed-up to the baseline's final reward between the seeds' mean curves (the headline),
    and over resamples of the seeds: its interval and how often, and why, it is undefined."""
    def speedup(baseline_values: list[float], candidate_values: list[float]) -> dict:
        return speedup_to_equal_reward(list(zip(baseline["gpu_hours"], baseline_values)),
                                       list(zip(candidate["gpu_hours"], candidate_values)), (1.0,))["at"]["1"]

    point = speedup(baseline["mean"], candidate["mean"])
    result = {"speedup": point["speedup"], "note": point.get("note"), "target_reward": point["target_reward"],
              "baseline_gpu_hours": point["baseline_gpu_hours"], "candidate_gpu_hours": point["candidate_gpu_hours"],
              "ci": None, "ci_defined_only": None, "resamples": 0, "undefined_share": None, "undefined_reasons": {}}
    if draws is None:
        return result
    reasons: dict[str, int] = {}

    def statistic(picks: dict[str, list[int]]) -> float | None:
        entry = speedup(seed_stats.resampled_mean(baseline["per_seed"], picks[baseline_name]),
                        seed_stats.resampled_mean(candidate["per_seed"], picks[candidate_name]))
        if entry["speedup"] is None:
            reason = _UNDEFINED.get(entry.get("note"), ("other",))[0]
            reasons[reason] = reasons.get(reason, 0) + 1
        return entry["speedup"]

    sampled = seed_stats.bootstrap(statistic, {baseline_name: draws[baseline_name],
                                               candidate_name: draws[candidate_name]})
    result.update(ci=sampled["ci"], ci_defined_only=sampled["ci_defined_only"], resamples=sampled["resamples"],
                  undefined_share=sampled["undefined_share"], undefined_reasons=reasons)
    return result


def final_reward_spread(results: dict, config: Config) -> dict:
    """The final evaluation's trained reward per image: each variant's mean and standard error, and
    paired differences (same prompts and seeds) between the families, to read gaps against noise.
    This is evaluation noise only; the spread across run seeds is in ``seed_statistics``."""
    prompts = [p for p in evaluation_prompts(config) for _ in range(config.eval.seeds_per_prompt)]
    scorer = RewardSet(config.rewards, paths=config.reward_paths)
    # With several run seeds, each evaluation image's reward is its mean over the seeds' runs.
    per_image = {name: torch.stack([scorer.score(run["images"]["final"], prompts).combined.double()
                                    for run in seed_runs(result)]).mean(0)
                 for name, result in results.items()}
    pairs = [(CANDIDATE, BASELINE), (CANDIDATE, "naive_quant"), (CANDIDATE, "naive_scaling"), ("naive_quant", BASELINE),
             (ADAPTIVE, CANDIDATE), ("naive_scaling", RANDOM_POOL), *variant_pairs(_trained_families(results))]
    return {"images": len(prompts), "per_variant": {name: _mean_se(values) for name, values in per_image.items()},
            "paired_differences": {f"{a} - {b}": _mean_se(per_image[a] - per_image[b])
                                   for a, b in pairs if a in per_image and b in per_image}}


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


def markdown_table(report: dict) -> str:
    families = report["families"]
    reward_names = list(next(iter(families.values()))["final_rewards"])
    speedups = report.get("speedups", {})
    seeds = max(len(entry.get("seeds", [None])) for entry in families.values())
    header = (["family", "iterations", "modeled GPU-h / iteration", "modeled GPU-h used",
               "CPU s" if seeds == 1 else f"CPU s ({seeds} seeds)"]
              + [f"final {name}" for name in reward_names]
              + ([f"GPU-h to {BASELINE} final", "speed-up"] if speedups else []))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, entry in families.items():
        at_final = speedups.get(name, {}).get("at", {}).get("1", {})
        hours_to_final = (at_final.get("candidate_gpu_hours") if name != BASELINE
                          else report.get("speedups", {}).get(CANDIDATE, {}).get("at", {}).get("1", {})
                          .get("baseline_gpu_hours"))
        speedup = at_final.get("speedup") if name != BASELINE else (1.0 if speedups else None)
        row = [name, str(entry["iterations"]), f"{entry['modeled_gpu_hours_per_iteration']:.3g}",
               f"{entry['modeled_gpu_hours_used']:.3g}", f"{entry['cpu_seconds']:.0f}"]
        row += [_mean_pm(entry["final_rewards"][reward], entry.get("final_rewards_se", {}).get(reward))
                for reward in reward_names]
        row += [_fmt(hours_to_final, ".3g", "not reached"), _fmt(speedup, ".2f", "n/a", suffix="x")] if speedups else []
        lines.append("| " + " | ".join(row) + " |")
    base = next(iter(families.values()))["base_rewards"]
    lines.append("")
    lines.append("Base model: " + ", ".join(f"{name} {value:.4f}" for name, value in base.items()) + ".")
    if seeds > 1:
        lines.append("")
        lines.append(f"Each family trained once per run seed ({', '.join(map(str, report['seeds']))}), every run "
                     f"sized to the same budget; rewards, GPU-hours and speed-ups are means over the seeds "
                     f"(± standard error across seeds), CPU seconds their sum.")
    spread = report.get("final_reward_spread")
    if spread and spread["paired_differences"]:
        lines.append("")
        averaged = f", each image's reward averaged over the {seeds} seeds' runs" if seeds > 1 else ""
        lines.append(f"Final {report['metric']} differences, paired over the same {spread['images']} evaluation "
                     f"prompts and seeds{averaged} (mean ± standard error, evaluation noise only): " + ", ".join(
                         f"{pair} {entry['mean']:+.4f} ± {entry['se']:.4f}"
                         for pair, entry in spread["paired_differences"].items()) + ".")
    lines += method_speedups(report)
    if report.get("speedup_at_fraction_of_gain"):
        lines.append("")
        lines.append(f"Speed-up of {CANDIDATE} to equal reward at a share of {BASELINE}'s gain: " + ", ".join(
            f"{float(fraction):.0%}: {_fmt(value, '.2f', 'n/a', suffix='x')}"
            for fraction, value in report["speedup_at_fraction_of_gain"].items()) + ".")
    if "seed_statistics" in report:
        lines += seed_tables(report, seeds)
    return "\n".join(lines) + "\n"


def method_speedups(report: dict) -> list[str]:
    """compare.md's headline: sol_rl's and sol_rl_adaptive's speed-ups to the baseline's final
    reward side by side (and those of a study's variants of them, such as sol_rl with the FP8
    explorer), under each cost profile, with their bootstrap intervals over seeds."""
    methods = [name for name, entry in report["families"].items() if entry["family"] in (CANDIDATE, ADAPTIVE)]
    by_family = {name: report.get("speedups_by_family", {}).get(name) for name in methods}
    by_family = {name: entry for name, entry in by_family.items() if entry}
    if not by_family:
        return []
    lines = ["", f"Speed-up to {BASELINE}'s final {report['metric']} (95% bootstrap interval over seeds):", ""]
    for profile in next(iter(by_family.values())):
        label = f"{profile} (sized the budget)" if profile == report["device_profile"] else f"{profile} (re-costed)"
        lines.append(f"- {label}: " + "; ".join(
            f"{name} {speedup_text(entry[profile])}"
            + (f" {_interval(entry[profile]['ci'])}" if entry[profile]["ci"] is not None else " (one seed: no interval)")
            for name, entry in by_family.items() if profile in entry))
    return lines


def seed_tables(report: dict, seeds: int) -> list[str]:
    """compare.md's across-seed part: rewards at equal GPU-hours, the speed-up under each cost
    profile and the final-reward differences, each with its bootstrap interval."""
    statistics, metric, device = report["seed_statistics"], report["metric"], report["device_profile"]
    bootstrap = statistics["bootstrap"]
    lines: list[str] = []
    own = statistics["profiles"][device]
    if seeds > 1:
        grid = own["common_grid"]
        names = list(grid["families"])
        lines += ["", f"Evaluation {metric} at equal modeled GPU-hours ({device}), mean ± SE over seeds"
                  + (": the families' iteration costs differ, so each seed's curve is read on this common grid by "
                     "linear interpolation between its evaluations." if grid["interpolated"] else
                     ": every family was evaluated at these GPU-hours."), "",
                  "| modeled GPU-h | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
        for i, hours in enumerate(grid["gpu_hours"]):
            lines.append(f"| {hours:.3g} | " + " | ".join(
                _mean_pm(grid["families"][name]["reward"][i], grid["families"][name]["reward_se"][i])
                for name in names) + " |")
    if own["speedups"]:
        how = (f"bootstrap {bootstrap['confidence']:.0%} interval: {bootstrap['resamples']} resamples of the seeds, "
               f"with replacement within each family independently, bootstrap seed {bootstrap['seed']}; a resample "
               f"whose mean curve never reaches the target ranks below every defined speed-up, so an interval "
               f"reaching into them has no lower end" if bootstrap else "one seed per family: no interval")
        lines += ["", f"Speed-up to {BASELINE}'s final {metric} (GPU-hours {BASELINE} needs / GPU-hours the family "
                  f"needs, between the seeds' mean curves; {how}):", "",
                  f"| cost profile | family | target {metric} | {BASELINE} GPU-h | family GPU-h | speed-up | "
                  "95% interval | resamples undefined (never reached) |", "|---|---|---|---|---|---|---|---|"]
        for profile, entry in statistics["profiles"].items():
            label = f"{profile} (sized the budget)" if profile == device else f"{profile} (re-costed)"
            for name, result in entry["speedups"].items():
                lines.append(f"| {label} | {name} | {result['target_reward']:.4f} | "
                             f"{_fmt(result['baseline_gpu_hours'], '.3g', 'n/a')} | "
                             f"{_fmt(result['candidate_gpu_hours'], '.3g', 'not reached')} | "
                             f"{speedup_text(result)} | "
                             f"{_interval(result['ci'])} | {_undefined(result)} |")
    others = [profile for profile in statistics["profiles"] if profile != device]
    for profile in others:
        used = statistics["profiles"][profile]["families"]
        lines += ["", f"Under {profile} the same runs are re-costed from the FLOPs per stage each iteration recorded "
                  f"({statistics['profiles'][profile]['basis']}). The budget was sized under {device}, so the "
                  f"re-costed curves cover a different budget per family: " + ", ".join(
                      f"{name} {entry['gpu_hours_used']:.3g}" for name, entry in used.items())
                  + f" GPU-hours (budget {report['budget_gpu_hours']:.3g} under {device})."]
    differences = statistics["final_differences"]
    if differences:
        lines += ["", f"| final {metric} difference (across seeds) | mean ± SE | bootstrap 95% interval |",
                  "|---|---|---|"]
        for pair, entry in differences.items():
            lines.append(f"| {pair} | {_mean_pm(entry['mean'], entry['se'], '+.4f')} | "
                         f"{_interval(entry['ci'], '+.4f', '')} |")
    return lines


def _mean_pm(mean: float, se: float | None, spec: str = ".4f") -> str:
    return f"{mean:{spec}}" if se is None else f"{mean:{spec}} ± {se:.4f}"


def _interval(ci: list | None, spec: str = ".2f", suffix: str = "x") -> str:
    if ci is None:
        return "n/a"
    if ci == [None, None]:
        return "none defined"
    return f"[{_fmt(ci[0], spec, 'not reached', suffix)}, {_fmt(ci[1], spec, 'not reached', suffix)}]"


def _undefined(result: dict) -> str:
    if not result["resamples"]:
        return "n/a"
    never = result["undefined_reasons"].get("candidate_never_reached", 0) / result["resamples"]
    return f"{result['undefined_share']:.1%} ({never:.1%})"


def speedup_text(entry: dict) -> str:
    """A speed-up as a table cell: ``1.23x``, or why there is none in a few words."""
    note = entry.get("note")
    short = _UNDEFINED[note][1] if note in _UNDEFINED else note
    return _fmt(entry["speedup"], ".2f", short or "n/a", suffix="x")


def _fmt(value, spec: str, missing: str, suffix: str = "") -> str:
    return missing if value is None else f"{value:{spec}}{suffix}"
