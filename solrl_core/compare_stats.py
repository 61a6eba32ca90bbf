"""The comparison's statistics across run seeds, from per-seed curves alone (so a committed
compare.json can be restated without its runs): every difference with Welch's interval and the
paired one beside it, the families as a blocked design, the speed-up at the declared threshold,
the power of the study, and a verdict per claim after Holm's correction.

What a run seed shares across families, and so why pairing by seed is valid: the LoRA
initialisation, each iteration's training prompts, the training timesteps and noise, the dealing
of kept samples to optimizer steps, and the exploration noise of a prompt slot's first N seeds
(a pool of 12 sees the first 12 of a pool of 48's noises). Every run is evaluated on the same
fixed images. Pairing does not make Welch's interval wrong: Welch's is the default verdict, the
paired and blocked analyses are printed beside it, and neither is chosen after the fact.

Two families of claims, each corrected by Holm on its own and counted in the report:
"primary" (the final difference of every compared pair and the declared speed-up of every
family under the budget's own cost profile) and "curve points" (differences at equal budget and
after equal iterations at the declared checkpoints). The evaluation set's share of the error is
counted at the finals, where the final images are kept: the paired-over-images standard error of
the difference (seed-averaged per image) joins Welch's variance with its own degrees of freedom.
It also holds a share of the seed noise already in Welch's term, so the sum is conservative.
"""

from __future__ import annotations

from collections.abc import Sequence

from solrl_core import intervals, seed_stats, speedup

Curve = list[tuple[float, float]]

CHECKPOINTS = (0.25, 0.5, 0.75)
POWER_DIFFERENCES = (0.01, 0.02)


def iterations_done(point: dict) -> int:
    """A curve point's ``iteration`` is the last one finished (-1: the base, before any)."""
    return point["iteration"] + 1


def reward_after(points: list[dict], iterations: float) -> float:
    """A run's reward after ``iterations`` iterations, linear between its evaluations."""
    steps = [(iterations_done(p), p["reward"]) for p in points]
    for (x0, y0), (x1, y1) in zip(steps, steps[1:]):
        if x0 <= iterations <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (iterations - x0) / (x1 - x0)
    raise ValueError(f"no evaluation brackets iteration {iterations} (the run has {steps[-1][0]})")


def pair_difference(a: Sequence[float], b: Sequence[float], same_seeds: bool, extra_se: float | None = None,
                    extra_df: float | None = None) -> dict:
    """Welch's difference (the verdict's), and the paired one beside it when the seeds match."""
    entry = intervals.welch(a, b, extra_variance=(extra_se or 0.0) ** 2,
                            extra_df=float(extra_df) if extra_df else float("inf"))
    if same_seeds and len(a) >= 2:
        entry["paired"] = intervals.paired(a, b)
    return entry


def evaluation_errors(spread: dict | None) -> dict[str, dict]:
    """Each pair's evaluation-set SE at the finals, and over how many images, from a report's
    ``final_reward_spread``."""
    if not spread:
        return {}
    return {pair: {"se": entry["se"], "images": spread["images"]}
            for pair, entry in spread.get("paired_differences", {}).items()}


def evaluation_error(errors: dict[str, dict], a: str, b: str) -> dict | None:
    """``a - b``'s evaluation-set SE: the same for the pair read either way round."""
    return errors.get(f"{a} - {b}") or errors.get(f"{b} - {a}")


def apply_holm(entries: list[dict]) -> int:
    """Each entry's Holm-adjusted p and verdict over ``entries`` as one family of claims; their count."""
    adjusted = intervals.holm([entry.get("p") for entry in entries])
    for entry, p in zip(entries, adjusted):
        entry["p_holm"] = p
        entry["verdict"] = intervals.verdict(entry)
    return len(entries)


def statistics(points: dict[str, list[list[dict]]], seeds: dict[str, list[int]], pairs: Sequence[tuple[str, str]],
               profile_curves: dict[str, dict[str, list[Curve]]], device: str, baseline: str | None,
               eval_se: dict[str, dict] | None = None, fraction: float = speedup.DEFAULT_FRACTION,
               checkpoints: Sequence[float] = CHECKPOINTS) -> dict:
    """The statistics block of compare.json.

    ``points[name]``: each seed's evaluation points (``iteration``, ``modeled_gpu_hours``,
    ``reward``) under the budget's profile; ``profile_curves[profile][name]``: each seed's curve
    under every cost profile (``device`` the budget's own); ``eval_se[pair]``: the final's
    paired-over-images ``se`` over ``images``.
    """
    pairs = [(a, b) for a, b in pairs if a in points and b in points]
    same = {pair: seeds[pair[0]] == seeds[pair[1]] for pair in pairs}
    finals = {name: [run[-1]["reward"] for run in runs] for name, runs in points.items()}
    primary, curve_points = [], []

    final_differences = {}
    for a, b in pairs:
        spread = evaluation_error(eval_se or {}, a, b)
        entry = pair_difference(finals[a], finals[b], same[(a, b)], spread and spread["se"],
                                spread and spread["images"] - 1)
        final_differences[f"{a} - {b}"] = entry
        primary.append(entry)

    equal_budget = _equal_budget(profile_curves[device], pairs, same, checkpoints)
    equal_iterations = _equal_iterations(points, pairs, same, checkpoints)
    for table in (equal_budget, equal_iterations):
        curve_points += [entry for entries in table["differences"].values() for entry in entries]

    profiles = {profile: profile_statistics(curves) for profile, curves in profile_curves.items()}
    speedups = {}
    if baseline in points:
        for profile, curves in profile_curves.items():
            speedups[profile] = {name: speedup_entry(curves[baseline], curves[name], fraction)
                                 for name in curves if name != baseline}
        primary += [entry["threshold"] for entry in speedups[device].values()]

    shared = len({tuple(s) for s in seeds.values()}) == 1
    holm = {"primary": apply_holm(primary), "curve_points": apply_holm(curve_points)}
    return {
        "method": {"interval": "Welch's t (unequal spreads, Welch-Satterthwaite df), scipy.stats.t quantiles",
                   "confidence": intervals.CONFIDENCE,
                   "paired": "scipy.stats.ttest_rel on per-seed differences, beside Welch where the seeds match",
                   "blocked": "additive two-way model: family effect, run seed block, pooled residual variance",
                   "evaluation_set": "at the finals, the paired-over-images SE of the difference joins the variance",
                   "speedup": f"ratio of geometric mean per-seed crossing times of {fraction:g} of the baseline's "
                              "mean gain, Welch's interval on log hours; the paper's definition as a point beside",
                   "holm": holm, "alpha": intervals.ALPHA},
        "seeds": seeds, "final_differences": final_differences,
        "blocked": intervals.blocked(finals) if shared and len(finals) > 1 else None,
        "power": {f"{a} - {b}": intervals.power_entry(finals[a], finals[b], POWER_DIFFERENCES, holm["primary"])
                  for a, b in pairs},
        "equal_budget": equal_budget, "equal_iterations": equal_iterations,
        "speedup_fraction": fraction, "speedups": speedups, "profiles": profiles,
    }


def speedup_entry(baseline: list[Curve], candidate: list[Curve], fraction: float) -> dict:
    """One family's speed-ups: the declared threshold's (the verdict's), every other fraction of the
    gain with its interval, and the paper's definition between the mean curves."""
    fractions = sorted({fraction, *speedup.GAIN_FRACTIONS})
    means = [_mean_curve(curves) for curves in (baseline, candidate)]
    return {"threshold": speedup.threshold_speedup(baseline, candidate, fraction),
            "fractions": {f"{f:g}": speedup.threshold_speedup(baseline, candidate, f) for f in fractions},
            "paper": speedup.paper_speedup(*means)}


def _mean_curve(curves: list[Curve]) -> Curve:
    mean = seed_stats.mean_curve(curves)
    return list(zip(mean["gpu_hours"], mean["mean"]))


def _equal_budget(curves: dict[str, list[Curve]], pairs, same, checkpoints) -> dict:
    """Differences at shares of the budget every run covers (each seed's curve interpolated)."""
    end = min(curve[-1][0] for runs in curves.values() for curve in runs)
    hours = [end * share for share in checkpoints]
    values = {name: [[seed_stats.interpolate(curve, h) for curve in runs] for h in hours] for name, runs in curves.items()}
    return {"checkpoints": list(checkpoints), "gpu_hours": hours,
            "differences": {f"{a} - {b}": [{"gpu_hours": h, **pair_difference(values[a][i], values[b][i], same[(a, b)])}
                                           for i, h in enumerate(hours)] for a, b in pairs}}


def _equal_iterations(points: dict[str, list[list[dict]]], pairs, same, checkpoints) -> dict:
    """Differences after equal numbers of iterations, at shares of the shortest run's iterations
    (every family has then trained on as many samples: what a sample teaches)."""
    reach = min(iterations_done(run[-1]) for runs in points.values() for run in runs)
    done = [max(1, round(reach * share)) for share in checkpoints] + [reach]
    done = sorted(set(done))
    values = {name: [[reward_after(run, k) for run in runs] for k in done] for name, runs in points.items()}
    return {"iterations": done,
            "differences": {f"{a} - {b}": [{"iterations": k, **pair_difference(values[a][i], values[b][i], same[(a, b)])}
                                           for i, k in enumerate(done)] for a, b in pairs},
            "families": {name: [dict(zip(("mean", "se"), seed_stats.mean_se(v))) for v in rows]
                         for name, rows in values.items()}}


def profile_statistics(curves: dict[str, list[Curve]]) -> dict:
    """Under one cost profile: each family's mean ± SE curve and all of them on one GPU-hour grid
    (each seed's curve read there by linear interpolation when the families' costs differ)."""
    means = {name: seed_stats.mean_curve(seed_curves) for name, seed_curves in curves.items()}
    every = [curve for seed_curves in curves.values() for curve in seed_curves]
    grid, interpolated = seed_stats.common_grid(every, max(1, min(len(curve) - 1 for curve in every)))
    common = {}
    for name, seed_curves in curves.items():
        values = [seed_stats.on_grid(curve, grid) for curve in seed_curves]
        rows = [seed_stats.mean_se([row[i] for row in values]) for i in range(len(grid))]
        common[name] = {"reward": [m for m, _ in rows], "reward_se": [se for _, se in rows]}
    families = {name: {"curve": [{"gpu_hours": h, "reward": m, "reward_se": se}
                                 for h, m, se in zip(mean["gpu_hours"], mean["mean"], mean["se"])],
                       "per_seed": mean["per_seed"], "interpolated_across_seeds": mean["interpolated"],
                       "gpu_hours_used": seed_stats.mean_se([curve[-1][0] for curve in curves[name]])[0]}
                for name, mean in means.items()}
    return {"families": families, "common_grid": {"gpu_hours": grid, "interpolated": interpolated,
                                                  "families": common}}


def planned_power(pilot: dict, pairs: Sequence[tuple[str, str]], seeds: int, comparisons: int,
                  differences: Sequence[float] = POWER_DIFFERENCES) -> dict:
    """The power of a planned study from a pilot comparison's seed spreads (its compare.json):
    for each planned pair the pilot has both sides of, the pooled SD of their final rewards, the
    smallest difference ``seeds`` seeds a family resolve at 80% power, and the seeds needed for
    each of ``differences``, alone and under a Bonferroni bound over ``comparisons`` claims."""
    finals = {name: [run["final_reward"] for run in entry["runs"]] for name, entry in pilot["families"].items()}
    rows, missing = {}, []
    for a, b in pairs:
        if a not in finals or b not in finals or min(len(finals[a]), len(finals[b])) < 2:
            missing.append(f"{a} - {b}")
            continue
        sd = intervals.pooled_sd(finals[a], finals[b])
        rows[f"{a} - {b}"] = {
            "sd": sd, "pilot_seeds": [len(finals[a]), len(finals[b])],
            "smallest_resolvable": intervals.smallest_resolvable(sd, seeds),
            "smallest_resolvable_corrected": intervals.smallest_resolvable(sd, seeds, intervals.ALPHA / comparisons),
            "seeds_needed": {f"{d:g}": intervals.seeds_needed(d, sd) for d in differences},
            "seeds_needed_corrected": {f"{d:g}": intervals.seeds_needed(d, sd, intervals.ALPHA / comparisons)
                                       for d in differences}}
    return {"seeds": seeds, "comparisons": comparisons, "pairs": rows, "not_in_pilot": missing}
