"""Ranking fidelity of the explorer (SPEC §6): does a cheap draft rank a prompt's seeds the way the
full-precision policy does?

For P held-out prompts x N seeds, the same seeds are sampled twice: by the full-precision policy at
T_train steps (the truth) and by the explorer (a backend at T_explore steps, the proxy). Both are
scored with the run's reward; the metrics below compare the two rankings prompt by prompt. The
picks the metrics judge follow the rank stage's order (``select_extremes``: stable, NaN worst), so
ties and NaNs are treated exactly as in training.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from solrl_core.accounting import DeviceModel, backend_precision, count_sample_flops, profile_problem, scoring_flops
from solrl_core.adaptive import schedule_problem
from solrl_core.config import Config, to_dict
from solrl_core.ledger import write_json
from solrl_core.prompts import evaluation_prompts
from solrl_core.quant.explorer import build_explorer
from solrl_core.rewards.registry import finite_mean
from solrl_core.seeds import derive_seed
from solrl_core.selection import average_ranks, kendall_tau, rank_order, spearman

TOP_K = (4, 8, 12)
TAIL = 12  # the paper's K/2 at K = 24: the kept best and kept worst halves

# SPEC §6: NVFP4 6-step drafts vs BF16, 256 prompts x 96 seeds (FP8 as the proxy: ranks only).
PAPER = {
    "emulated-nvfp4": {"spearman": 0.927, "kendall": 0.798, "top_k_precision": {"4": 0.969, "8": 0.950, "12": 0.933},
                       "mean_true_rank_top12": 8.5, "mean_true_rank_bottom12": 87.0},
    "fp8": {"mean_true_rank_top12": 7.7, "mean_true_rank_bottom12": 87.8},
}


# ---------------------------------------------------------------------------------------------
# Metrics on two scorings of the same seeds


def true_ranks(truth: torch.Tensor) -> torch.Tensor:
    """1-based ranks within one group, 1 = best (highest reward); ties share their average rank."""
    return average_ranks(-truth.double())


def ranking_metrics(proxy: torch.Tensor, truth: torch.Tensor, ks: Sequence[int] = TOP_K, tail: int = TAIL) -> dict:
    """Fidelity of ``proxy`` [P, N] (explorer rewards) to ``truth`` [P, N] (full-precision rewards).

    - spearman, kendall: rank correlations per prompt, averaged over prompts (NaN prompts, e.g. a
      constant reward, are left out of the mean).
    - top_k_precision[k]: share of the explorer's top-k that are truly top-k (a pick tied with the
      true k-th best counts as truly top-k).
    - bottom_k_precision[k]: the same for the bottom k.
    - bottom_k_contamination[k]: share of the explorer's bottom-k that are truly top-k: "worst"
      picks that are among the best, the selection error that flips an advantage's sign.
    - mean_true_rank_top{tail} / _bottom{tail}: mean 1-based true rank (1 = best) of the explorer's
      tail best / tail worst picks; perfect (tail+1)/2 and N - (tail-1)/2, random (N+1)/2.
    """
    if proxy.shape != truth.shape or proxy.dim() != 2:
        raise ValueError(f"proxy {tuple(proxy.shape)} and truth {tuple(truth.shape)} must both be [prompts, seeds]")
    groups, pool = proxy.shape
    tail = min(tail, pool // 2)
    ks = [k for k in ks if 2 * k <= pool]
    truth = truth.double()
    truth_clean = torch.nan_to_num(truth, nan=-math.inf)
    scored = torch.isfinite(proxy)  # adaptive exploration leaves pruned seeds unscored: correlations over the rest
    result = {
        "spearman": _finite_mean([spearman(proxy[g][scored[g]], truth[g][scored[g]]) for g in range(groups)]),
        "kendall": _finite_mean([kendall_tau(proxy[g][scored[g]], truth[g][scored[g]]) for g in range(groups)]),
        "top_k_precision": {}, "bottom_k_precision": {}, "bottom_k_contamination": {},
    }
    descending = truth_clean.sort(dim=1, descending=True).values
    order = proxy_order(proxy)
    for k in ks:
        top, bottom = _gather(truth_clean, order[:, :k]), _gather(truth_clean, order[:, pool - k:])
        kth_best, kth_worst = descending[:, k - 1:k], descending[:, pool - k:pool - k + 1]
        result["top_k_precision"][str(k)] = float((top >= kth_best).double().mean())
        result["bottom_k_precision"][str(k)] = float((bottom <= kth_worst).double().mean())
        result["bottom_k_contamination"][str(k)] = float((bottom >= kth_best).double().mean())
    if tail >= 1:
        ranks = torch.stack([true_ranks(truth_clean[g]) for g in range(groups)])
        result[f"mean_true_rank_top{tail}"] = float(_gather(ranks, order[:, :tail]).mean())
        result[f"mean_true_rank_bottom{tail}"] = float(_gather(ranks, order[:, pool - tail:]).mean())
    return result


def proxy_order(proxy: torch.Tensor) -> torch.Tensor:
    """Each group's seeds from best to worst by the proxy: the rank stage's order (select_extremes
    keeps the head and the tail of it), unscored drafts in the middle as in training."""
    return rank_order(proxy)


def reference_ranks(pool: int, tail: int = TAIL) -> dict:
    """Mean true ranks of a perfect and of a random proxy, for reading the measured ones."""
    tail = min(tail, pool // 2)
    return {"perfect": {f"mean_true_rank_top{tail}": (tail + 1) / 2, f"mean_true_rank_bottom{tail}": pool - (tail - 1) / 2},
            "random": {f"mean_true_rank_top{tail}": (pool + 1) / 2, f"mean_true_rank_bottom{tail}": (pool + 1) / 2}}


def _gather(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.gather(values, 1, index)


def _finite_mean(values: list[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


# ---------------------------------------------------------------------------------------------
# The study


Schedule = tuple[tuple[int, ...], tuple[int, ...]]  # adaptive exploration: (score_at, survivors)


@dataclasses.dataclass(frozen=True)
class FidelityPlan:
    prompts: int = 64
    pool: int = 96
    explore_steps: tuple[int, ...] = (6,)
    backends: tuple[str, ...] = ("emulated-nvfp4", "fp8")
    # Adaptive schedules measured beside the fixed scheme at every (backend, explore steps), and the
    # kept K they prune towards and the rollout cost is modeled with.
    schedules: tuple[Schedule, ...] = ()
    keep: int = 24


def schedule_label(schedule: Schedule | None) -> str:
    """``fixed``, or ``1:48,2:24`` (after step 1 keep 48 per group, after step 2 keep 24)."""
    if schedule is None:
        return "fixed"
    return ",".join(f"{step}:{count}" for step, count in zip(*schedule))


def parse_schedules(text: str) -> tuple[Schedule, ...]:
    """``1:48,2:24;2:32`` -> (((1, 2), (48, 24)), ((2,), (32,))); ValueError with the reason."""
    schedules = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        pairs = [pair.split(":") for pair in part.split(",")]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"schedule {part!r} is not STEP:SURVIVORS pairs, e.g. 1:48,2:24")
        try:
            steps, counts = zip(*[(int(a), int(b)) for a, b in pairs])
        except ValueError:
            raise ValueError(f"schedule {part!r}: steps and survivor counts are integers, e.g. 1:48,2:24") from None
        schedules.append((tuple(steps), tuple(counts)))
    if not schedules:
        raise ValueError("give at least one schedule, e.g. 1:48,2:24")
    return tuple(schedules)


def rollout_cost(state, counts, backend: str, device: str, pool: int, keep: int, train_steps: int,
                 explorer_sample_steps: int, scored_drafts: int) -> dict | None:
    """One group's modeled rollout (explore + scoring of intermediate drafts + regeneration of the
    kept) against naive scaling (pool x T_train at full precision), on ``device``'s profile; the
    stage costs in BF16 policy sample-steps. None when the profile cannot model the backend."""
    if profile_problem(device, backend) is not None:
        return None
    model = DeviceModel(device, state.config.accounting.utilization, backend_precision(backend, device))
    step = model.hours(counts.policy_forward)
    explore = model.hours(counts.explorer_forward * explorer_sample_steps, model.explore_precision)
    scoring = model.hours((counts.decode + scoring_flops(state.config.rewards)) * scored_drafts)
    regenerate = step * keep * train_steps
    naive = step * pool * train_steps
    total = explore + scoring + regenerate
    return {"explorer_sample_steps": explorer_sample_steps, "scored_drafts": scored_drafts,
            "explore_steps_equivalent": explore / step, "scoring_steps_equivalent": scoring / step,
            "regenerate_steps_equivalent": regenerate / step, "rollout_steps_equivalent": total / step,
            "naive_steps": pool * train_steps, "speedup_vs_naive_scaling": naive / total}


def explorer_counts(state, explorer):
    """The per-sample FLOPs with ``explorer`` as the run's explorer (counted, nothing changes)."""
    saved, state.explorer = state.explorer, explorer
    try:
        return count_sample_flops(state)
    finally:
        state.explorer = saved


def fidelity_seeds(run_seed: int, prompt_index: int, pool: int) -> list[int]:
    return [derive_seed(run_seed, "fidelity", prompt_index * pool + i) for i in range(pool)]


def model_fingerprint(module: torch.nn.Module) -> str:
    """A cheap digest of a model's weights (name, shape, sum and absolute sum of each tensor): a
    retrained checkpoint gets a new one, so a study never reuses another model's truth."""
    digest = hashlib.blake2b(digest_size=12)
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            values = tensor.detach().double()
            digest.update(f"{name}|{tuple(tensor.shape)}|{float(values.sum()):.9e}|{float(values.abs().sum()):.9e}"
                          .encode())
    return digest.hexdigest()


def run_fidelity(config: Config, plan: FidelityPlan, out: Path | None = None,
                 log: Callable[[str], None] = print) -> dict:
    """Score the same seeds at full precision and with each (backend, explore steps); returns the
    report, also written to ``out`` after every pair, so a long study keeps its progress.

    The report keeps the full-precision rewards of every seed. When ``out`` already holds a study
    of the same model, prompts, seeds and truth, its truth and its results are reused: a second
    call resumes an interrupted study or adds (backend, steps) pairs without sampling the truth again.
    """
    # deferred: peft and transformers at import time (start-up of every solrl command: the CLI imports this module)
    from solrl_core import stages
    from solrl_core.models.adapters import OLD

    started = time.perf_counter()
    # Held-out prompts (the evaluation split): the study never looks at what RL trains on.
    config = dataclasses.replace(config, eval=dataclasses.replace(config.eval, prompts=plan.prompts))
    state = stages.initial_state(config)  # fresh adapters: "old" equals the base model
    prompts = evaluation_prompts(config)
    flat_prompts = [p for p in prompts for _ in range(plan.pool)]
    seeds = [s for g in range(len(prompts)) for s in fidelity_seeds(config.seed, g, plan.pool)]
    study = {"preset": config.preset, "model_path": config.model.path,
             "model_fingerprint": model_fingerprint(state.policy.transformer), "prompts": len(prompts),
             "pool": plan.pool, "full_precision_steps": config.regenerate.steps, "sampler": config.sampler.kind,
             "shift": config.sampler.shift, "rewards": config.rewards, "seed": config.seed,
             "dtype": str(state.policy.dtype).removeprefix("torch.")}
    previous = _previous_study(out, study)
    report = {
        "config": {**study, "device": str(state.policy.device), "threads": torch.get_num_threads()},
        "reference": {**reference_ranks(plan.pool), "paper": PAPER},
        "results": list(previous["results"]) if previous else [],
        "resolved_config": to_dict(config),
    }

    def sample_and_score(steps: int, explorer, label: str) -> tuple[torch.Tensor, float]:
        begun = time.perf_counter()
        chunk = config.explore.chunk if explorer is not None else config.regenerate.chunk
        latents, _ = stages._sample_seeds(state, flat_prompts, seeds, steps, chunk, adapter=OLD, explorer=explorer,
                                          label=label)
        scores = stages._score(state, latents, flat_prompts, list(config.rewards))
        return scores.combined.view(len(prompts), plan.pool), time.perf_counter() - begun

    def save() -> None:
        order = {backend: index for index, backend in enumerate(("emulated-nvfp4", "te-nvfp4", "fp8", "none"))}
        report["results"].sort(key=lambda r: (order.get(r["backend"], len(order)), r["explore_steps"],
                                               r.get("schedule", "fixed") != "fixed"))
        pairs = [(r["backend"], r["explore_steps"]) for r in report["results"]]
        report["config"]["backends"] = list(dict.fromkeys(backend for backend, _ in pairs))
        report["config"]["explore_steps"] = sorted({steps for _, steps in pairs})
        report["seconds"] = round(time.perf_counter() - started, 1)
        if out is not None:
            write_json(out, report)

    if previous:
        truth = torch.tensor(previous["full_precision"]["rewards"], dtype=torch.float32)
        report["full_precision"] = previous["full_precision"]
        log(f"fidelity: reusing the full-precision rewards and {len(report['results'])} results in {out}")
    else:
        truth, truth_seconds = sample_and_score(config.regenerate.steps, None, "full precision")
        report["full_precision"] = {"steps": config.regenerate.steps, "reward_mean": float(truth.mean()),
                                    "seconds": round(truth_seconds, 1), "seeds": torch.tensor(seeds).view(
                                        len(prompts), plan.pool).tolist(), "rewards": truth.tolist()}
        log(f"fidelity: full precision, {config.regenerate.steps} steps, {truth.numel()} samples in "
            f"{truth_seconds:.0f}s; mean reward {float(truth.mean()):.4f}")
        save()
    done = {(r["backend"], r["explore_steps"], r.get("schedule", "fixed")) for r in report["results"]}
    keep = min(plan.keep, plan.pool - plan.pool % 2)
    devices = list(dict.fromkeys([config.accounting.device, "B200-measured"]))
    for backend in plan.backends:
        todo = [(steps, schedule) for steps in plan.explore_steps for schedule in (None, *plan.schedules)
                if (backend, steps, schedule_label(schedule)) not in done]
        if not todo:
            continue
        explorer = build_explorer(state.policy.transformer, backend, config.quant.skip, config.quant.min_dim)
        explorer.requantize(state.policy.transformer, adapter=OLD)
        active = explorer if backend != "none" else None
        counts = explorer_counts(state, explorer)
        for steps, schedule in todo:
            begun = time.perf_counter()
            if schedule is not None:
                problem = schedule_problem(*schedule, plan.pool, keep, steps)
                if problem is not None:
                    log(f"fidelity: skipping schedule {schedule_label(schedule)} at {steps} steps: {problem}")
                    continue
                scores, _, taken = stages.explore_adaptively(state, flat_prompts, seeds, steps, plan.pool, keep,
                                                             list(schedule[0]), list(schedule[1]), active)
                proxy, seconds = scores.combined.view(len(prompts), plan.pool), time.perf_counter() - begun
                rows, scored = taken["explore_rows"] // len(prompts), taken["scored_drafts"] // len(prompts)
            elif active is None and steps == config.regenerate.steps:
                proxy, seconds = truth, 0.0  # the full-precision policy at T_train steps is the truth itself
                rows, scored = plan.pool * steps, 0
            else:
                proxy, seconds = sample_and_score(steps, active, f"{backend} {steps} steps")
                rows, scored = plan.pool * steps, 0
            metrics = ranking_metrics(proxy, truth)
            cost = {device: rollout_cost(state, counts, backend, device, plan.pool, keep, config.regenerate.steps,
                                         rows, scored) for device in devices}
            report["results"].append({"backend": backend, "explore_steps": steps, "schedule": schedule_label(schedule),
                                      **metrics, "explore_reward_mean": finite_mean(proxy.flatten()),
                                      "keep": keep, "cost": {d: c for d, c in cost.items() if c is not None},
                                      "seconds": round(seconds, 1)})
            log(f"fidelity: {backend:15s} {steps:2d} steps {schedule_label(schedule):>12s}  " + format_result(metrics)
                + _format_cost(report["results"][-1]))
            save()
    save()
    return report


def _format_cost(result: dict) -> str:
    cost = result.get("cost", {}).get("B200-measured")
    return f"  speed-up {cost['speedup_vs_naive_scaling']:.2f}x (B200-measured)" if cost else ""


def _previous_study(out: Path | None, study: dict) -> dict | None:
    """The report already in ``out`` when it is the same study (same model, prompts, seeds, truth)."""
    if out is None or not out.is_file():
        return None
    try:
        previous = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    same = {key: previous.get("config", {}).get(key) for key in study} == study
    return previous if same and "rewards" in previous.get("full_precision", {}) else None


def format_result(metrics: dict) -> str:
    precision = metrics["top_k_precision"]
    ranks = [key for key in metrics if key.startswith("mean_true_rank_")]
    return (f"rho {_fmt(metrics['spearman'])}  tau {_fmt(metrics['kendall'])}  "
            + " ".join(f"P@{k} {v:.3f}" for k, v in precision.items())
            + "  " + " ".join(f"{key.removeprefix('mean_true_rank_')} {metrics[key]:.1f}" for key in ranks))


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def plot_fidelity(report: dict, path: Path) -> None:
    """Spearman and top-12 precision against explore steps, one line per backend."""
    # deferred: matplotlib at import time (start-up of every solrl command)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib at import time (after the backend is chosen)

    figure, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    backends = list(dict.fromkeys(r["backend"] for r in report["results"]))
    largest_k = max((int(k) for r in report["results"] for k in r["top_k_precision"]), default=None)
    for backend in backends:
        rows = sorted((r for r in report["results"] if r["backend"] == backend and r.get("schedule", "fixed") == "fixed"),
                      key=lambda r: r["explore_steps"])
        steps = [r["explore_steps"] for r in rows]
        axes[0].plot(steps, [r["spearman"] for r in rows], marker="o", label=backend)
        if largest_k is not None:
            axes[1].plot(steps, [r["top_k_precision"].get(str(largest_k)) for r in rows], marker="o", label=backend)
    paper = PAPER["emulated-nvfp4"]
    axes[0].plot([6], [paper["spearman"]], marker="*", markersize=11, linestyle="", color="black",
                 label="paper NVFP4 (256 x 96)")
    if largest_k is not None and str(largest_k) in paper["top_k_precision"]:
        axes[1].plot([6], [paper["top_k_precision"][str(largest_k)]], marker="*", markersize=11, linestyle="",
                     color="black", label="paper NVFP4 (256 x 96)")
    full_steps = report["config"]["full_precision_steps"]
    axes[0].set(xlabel="explore steps", ylabel="Spearman rho (mean over prompts)",
                title=f"explorer vs full precision ({full_steps} steps)")
    axes[1].set(xlabel="explore steps", ylabel=f"top-{largest_k} precision", title="best seeds kept correctly")
    for axis in axes:
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
