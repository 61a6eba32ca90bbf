"""Equal-budget comparison (SPEC §5-§6): every family (or every point of an ablation) trained to
the same modeled GPU-hour budget through the one training loop, then reward-vs-GPU-hour curves,
the speed-up to equal reward, a plot, a markdown table and sample grids.

Budget: each variant runs as many whole iterations as fit in the budget, counting the training
stages only (explore, rank, regenerate, update, requantize). Evaluation is the same measurement
for every family and is not charged, so a family that runs more iterations is not penalised for
being evaluated more often.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from solrl_core.config import Config, set_key, to_dict, validate
from solrl_core.ledger import write_json
from solrl_core.training import METRICS, SUMMARY, RunObserver, run_training

BASELINE, CANDIDATE = "diffusionnft", "sol_rl"
GAIN_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
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
            entry["note"] = "the baseline did not improve on its start; no speed-up is defined"
        else:
            entry["baseline_gpu_hours"] = first_crossing(baseline, entry["target_reward"])
            entry["candidate_gpu_hours"] = first_crossing(candidate, entry["target_reward"])
            if entry["candidate_gpu_hours"] is None:
                entry["note"] = "the candidate never reached the target within the budget"
            elif entry["candidate_gpu_hours"] > 0:
                entry["speedup"] = entry["baseline_gpu_hours"] / entry["candidate_gpu_hours"]
        result["at"][f"{fraction:g}"] = entry
    result["speedup_to_equal_reward"] = result["at"].get("1", {}).get("speedup")
    return result


def curve_from_run(run_dir: Path, metric: Callable[[dict], float]) -> list[dict]:
    """Evaluation points of a run: the base at 0 GPU-hours, then each evaluation at the cumulative
    modeled GPU-hours of the iteration it followed (and measured CPU seconds beside it)."""
    summary = json.loads((run_dir / SUMMARY).read_text())
    points = [{"iteration": -1, "modeled_gpu_hours": 0.0, "gpu_hours": None, "cpu_seconds": 0.0,
               "rewards": summary["eval_reward_base"], "reward": metric(summary["eval_reward_base"])}]
    seconds = 0.0
    for line in (run_dir / METRICS).read_text().splitlines():
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
    """Keeps the base model's and the latest evaluation images, for the sample grids."""

    def __init__(self):
        self.images: dict[str, torch.Tensor] = {}

    def on_evaluation(self, iteration: int, rewards: dict[str, float], images: torch.Tensor) -> None:
        self.images["base" if iteration < 0 else "final"] = images.detach().cpu().float().contiguous()


def size_to_budget(config: Config, budget_gpu_hours: float, evaluations: int, iteration_hours: float) -> Config:
    """The config with as many whole iterations as fit the budget, evaluated ~``evaluations`` times."""
    iterations = max(1, math.floor(budget_gpu_hours / iteration_hours * (1 + 1e-9)))
    sized = copy.deepcopy(config)
    set_key(sized, "iterations", iterations)
    set_key(sized, "eval.every", max(1, math.ceil(iterations / evaluations)))
    return validate(sized)


def plan_variant(config: Config, run_dir: Path, budget_gpu_hours: float, evaluations: int) -> dict:
    """Size one variant to the budget; say whether ``run_dir`` already holds its finished run."""
    from solrl_core.accounting import modeled_iteration_hours

    estimate = modeled_iteration_hours(config)
    sized = size_to_budget(config, budget_gpu_hours, evaluations, estimate["total"])
    summary_path = run_dir / SUMMARY
    finished = (summary_path.exists() and (run_dir / EVAL_IMAGES).exists()
                and json.loads(summary_path.read_text())["config"] == to_dict(sized))
    if not finished and run_dir.exists() and any(run_dir.iterdir()):
        raise FileExistsError(f"{run_dir} holds another run; delete it or choose a new --out")
    return {"config": sized, "estimate": estimate, "run_dir": run_dir, "reused": finished}


def run_variant(name: str, plan: dict, log: Callable[[str], None]) -> dict:
    """Train one sized variant (or read back its finished run) and load its evaluation images."""
    from safetensors.torch import load_file, save_file

    sized, run_dir = plan["config"], plan["run_dir"]
    if plan["reused"]:
        log(f"compare: {name}: reusing the finished run in {run_dir}")
    else:
        log(f"compare: {name}: {sized.iterations} iterations of {plan['estimate']['total']:.3g} modeled GPU-hours "
            f"({sized.accounting.device}), evaluated every {sized.eval.every}")
        keeper = _EvaluationImages()
        run_training(sized, run_dir, log=lambda line: log(f"  {name:14s} {line}"), observers=[keeper])
        save_file(keeper.images, str(run_dir / EVAL_IMAGES))
    summary = json.loads((run_dir / SUMMARY).read_text())
    return {**plan, "summary": summary, "images": load_file(str(run_dir / EVAL_IMAGES))}


def run_comparison(variants: dict[str, Config], budget_gpu_hours: float, out_dir: Path, evaluations: int = 6,
                   command: str = "", log: Callable[[str], None] = print) -> dict:
    """Train every variant to the budget under ``out_dir/runs/<name>`` and write the report files.

    Every variant is sized (and its run directory checked) before any trains, so a conflict stops
    the comparison before it writes anything.
    """
    started = time.perf_counter()
    plans = {name: plan_variant(config, out_dir / "runs" / name, budget_gpu_hours, evaluations)
             for name, config in variants.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {name: run_variant(name, plan, log) for name, plan in plans.items()}
    first = next(iter(variants.values()))
    report = build_report(variants, results, budget_gpu_hours, metric_name(first.rewards),
                          weighted_metric(first.rewards), command)
    report["seconds"] = round(time.perf_counter() - started, 1)
    write_outputs(report, results, out_dir)
    return report


def build_report(variants: dict[str, Config], results: dict, budget: float, metric_label: str,
                 metric: Callable[[dict], float], command: str) -> dict:
    curves = {name: curve_from_run(result["run_dir"], metric) for name, result in results.items()}
    first = next(iter(variants.values()))
    report: dict = {
        "preset": first.preset, "command": command, "metric": metric_label,
        "budget_gpu_hours": budget, "gpu_hours_basis": f"modeled: FLOPs / ({first.accounting.device} dense peak per "
        f"stage precision x utilisation {first.accounting.utilization:g}); CPU seconds measured beside",
        "device_profile": first.accounting.device, "utilization": first.accounting.utilization,
        "families": {},
    }
    for name, result in results.items():
        points, config = curves[name], result["config"]
        report["families"][name] = {
            "family": config.family, "iterations": config.iterations, "eval_every": config.eval.every,
            "modeled_gpu_hours_per_iteration": result["estimate"]["total"],
            "modeled_gpu_hours_per_stage": result["estimate"]["stages"],
            "modeled_gpu_hours_used": points[-1]["modeled_gpu_hours"] if len(points) > 1 else 0.0,
            "cpu_seconds": result["summary"]["seconds"],
            "final_rewards": result["summary"]["eval_reward_final"], "final_reward": points[-1]["reward"],
            "base_rewards": result["summary"]["eval_reward_base"], "curve": points,
            "run_dir": f"runs/{name}", "reused_finished_run": result["reused"],
            "overrides": {key: value for key, value in _diff(to_dict(first), to_dict(config)).items()},
            "config": to_dict(config),
        }
    if BASELINE in curves:
        baseline = as_curve(curves[BASELINE])
        report["speedups"] = {name: speedup_to_equal_reward(baseline, as_curve(points))
                              for name, points in curves.items() if name != BASELINE}
        headline = report["speedups"].get(CANDIDATE)
        report["speedup_to_equal_reward"] = headline["speedup_to_equal_reward"] if headline else None
        report["speedup_at_fraction_of_gain"] = (
            {fraction: entry["speedup"] for fraction, entry in headline["at"].items()} if headline else None)
    if "naive_quant" in results and CANDIDATE in results:
        report["naive_quant_below_sol_rl"] = (report["families"]["naive_quant"]["final_reward"]
                                              < report["families"][CANDIDATE]["final_reward"])
    report["final_reward_spread"] = final_reward_spread(results, first)
    report["paper"] = {"speedup_to_equal_reward": PAPER_SPEEDUP_TO_EQUAL_REWARD}
    return report


def final_reward_spread(results: dict, config: Config) -> dict:
    """The final evaluation's trained reward per image: each variant's mean and standard error, and
    paired differences (same prompts and seeds) between the families, to read gaps against noise."""
    from solrl_core.prompts import evaluation_prompts
    from solrl_core.rewards.registry import RewardSet

    prompts = [p for p in evaluation_prompts(config) for _ in range(config.eval.seeds_per_prompt)]
    scorer = RewardSet(config.rewards, paths=config.reward_paths)
    per_image = {name: scorer.score(result["images"]["final"], prompts).combined.double()
                 for name, result in results.items()}
    pairs = [(CANDIDATE, BASELINE), (CANDIDATE, "naive_quant"), (CANDIDATE, "naive_scaling"), ("naive_quant", BASELINE)]
    return {"images": len(prompts), "per_variant": {name: _mean_se(values) for name, values in per_image.items()},
            "paired_differences": {f"{a} - {b}": _mean_se(per_image[a] - per_image[b])
                                   for a, b in pairs if a in per_image and b in per_image}}


def _mean_se(values: torch.Tensor) -> dict:
    return {"mean": float(values.mean()), "se": float(values.std() / math.sqrt(values.numel()))}


def _diff(reference: dict, other: dict, prefix: str = "") -> dict:
    changed = {}
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(reference.get(key), dict) and key not in ("rewards",):
            changed.update(_diff(reference[key], value, f"{prefix}{key}."))
        elif reference.get(key) != value:
            changed[f"{prefix}{key}"] = value
    return changed


# ---------------------------------------------------------------------------------------------
# Outputs: compare.json, compare.png, compare.md, samples_grid.png


def write_outputs(report: dict, results: dict, out_dir: Path) -> None:
    plot_curves(report, out_dir / "compare.png")
    report["grid"] = sample_grid(results, out_dir / "samples_grid.png")
    report["files"] = {"plot": "compare.png", "table": "compare.md", "grid": "samples_grid.png"}
    write_json(out_dir / "compare.json", report)
    (out_dir / "compare.md").write_text(markdown_table(report), encoding="utf-8")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(report: dict, path: Path) -> None:
    """Reward vs modeled GPU-hours, one line per family; one panel per evaluation reward."""
    plt = _pyplot()
    first = next(iter(report["families"].values()))
    names = [report["metric"]] + [name for name in first["final_rewards"] if name != report["metric"]]
    figure, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 3.8), squeeze=False)
    for axis, reward_name in zip(axes[0], names):
        for family, entry in report["families"].items():
            hours = [p["modeled_gpu_hours"] for p in entry["curve"]]
            values = [p["reward"] if reward_name == report["metric"] else p["rewards"][reward_name]
                      for p in entry["curve"]]
            axis.plot(hours, values, marker="o", markersize=3, label=family)
        if reward_name == report["metric"] and BASELINE in report["families"]:
            axis.axhline(report["families"][BASELINE]["final_reward"], color="grey", linestyle="--", linewidth=0.8,
                         label=f"{BASELINE} final")
        axis.set(xlabel=f"modeled GPU-hours ({report['device_profile']}, utilisation {report['utilization']:g})",
                 ylabel=f"evaluation {reward_name}", title=reward_name)
        axis.ticklabel_format(axis="x", style="sci", scilimits=(-3, 3))
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    figure.suptitle(f"{report['preset']}: equal budget of {report['budget_gpu_hours']:.3g} modeled GPU-hours")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def sample_grid(results: dict, path: Path, rows: int = GRID_PROMPTS) -> list[dict]:
    """The same evaluation prompts and seeds drawn by the base model and by each variant's final
    policy, side by side, with every image's rewards; returns those rewards."""
    from solrl_core.prompts import evaluation_prompts
    from solrl_core.rewards.registry import RewardSet

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
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def markdown_table(report: dict) -> str:
    families = report["families"]
    reward_names = list(next(iter(families.values()))["final_rewards"])
    speedups = report.get("speedups", {})
    header = (["family", "iterations", "modeled GPU-h / iteration", "modeled GPU-h used", "CPU s"]
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
        row += [f"{entry['final_rewards'][reward]:.4f}" for reward in reward_names]
        row += [_fmt(hours_to_final, ".3g", "not reached"), _fmt(speedup, ".2f", "n/a", suffix="x")] if speedups else []
        lines.append("| " + " | ".join(row) + " |")
    base = next(iter(families.values()))["base_rewards"]
    lines.append("")
    lines.append("Base model: " + ", ".join(f"{name} {value:.4f}" for name, value in base.items()) + ".")
    spread = report.get("final_reward_spread")
    if spread and spread["paired_differences"]:
        lines.append("")
        lines.append(f"Final {report['metric']} differences, paired over the same {spread['images']} evaluation "
                     "prompts and seeds (mean ± standard error): " + ", ".join(
                         f"{pair} {entry['mean']:+.4f} ± {entry['se']:.4f}"
                         for pair, entry in spread["paired_differences"].items()) + ".")
    if report.get("speedup_at_fraction_of_gain"):
        lines.append("")
        lines.append(f"Speed-up of {CANDIDATE} to equal reward at a share of {BASELINE}'s gain: " + ", ".join(
            f"{float(fraction):.0%}: {_fmt(value, '.2f', 'n/a', suffix='x')}"
            for fraction, value in report["speedup_at_fraction_of_gain"].items()) + ".")
    return "\n".join(lines) + "\n"


def _fmt(value, spec: str, missing: str, suffix: str = "") -> str:
    return missing if value is None else f"{value:{spec}}{suffix}"
