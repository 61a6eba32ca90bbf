"""Coverage of the comparison's 95% intervals, old and new, by seeded simulation; writes JSON and a markdown table.

    .venv/bin/python benchmarks/interval_coverage.py --out reports/benchmarks/interval_coverage.json
    .venv/bin/python benchmarks/interval_coverage.py --quick     # a smoke run: far fewer experiments, seconds

The comparison's unit of replication is the run seed, and a study holds 3 to 10 of them per family.
This measures, on simulated studies drawn from one fixed numpy Generator (its seed is in the JSON),
how often each interval holds the true value:

1. **A difference of two family means** (true difference 0.01; the study's pooled seed SD 0.0117),
   at 3, 5 and 10 seeds per family, in four noise cells: equal spreads, normal; unequal spreads
   (SD 0.006 against 0.018, ratio 3, as the study's families differ); skewed noise (a centred
   gamma of shape 2, skewness 1.41) with equal spreads; skewed and unequal (the hard case). On the
   same simulated data, side by side: the OLD interval (a percentile bootstrap of the seeds,
   resampled independently within each family, 2000 resamples: ``scipy.stats.bootstrap`` with
   ``method="percentile"``, which is what the comparison used before Welch) and
   the NEW default, ``intervals.welch``. Then:

   - a shared seed effect (the same run seed's values correlated 0.3 across families, as the
     study measured): ``intervals.paired`` beside Welch and the old bootstrap on the same data;
   - the evaluation set's error (one N(0, 0.011^2) draw per experiment shared by every seed of a
     family, the paired-over-images SE of the study's sol_rl - diffusionnft): Welch without it,
     Welch with ``extra_variance=0.011**2, extra_df=63``, and with that variance estimated as a
     64-image SE would be (0.011^2 chi2_63 / 63);
   - ``intervals.blocked`` on a 7-family table (every family at the same seeds, seed effect 0.3):
     coverage of one pair's interval. The model pools one residual spread, so besides the equal
     spreads it is run once where the pair's two families have SD 0.006 and 0.018 (the other five
     0.0117): the assumption broken, reported as such.

2. **The speed-up at a declared share of the baseline's gain** (``speedup.threshold_speedup``, at
   0.25, 0.5 and 0.75) by curve simulation. Each seed's reward curve is
   ``base + G_s (1 - exp(-h / tau_s)) + evaluation noise``: ``tau_s`` lognormal around the family's
   tau (the baseline's puts its end near its plateau, 1 - e^-3 of its gain; the candidate's is the
   baseline's / 1.5), ``G_s`` normal, the noise independent per evaluation, the base (the same
   model, the same images) exact at 0 hours. The grids are the study's: the baseline 67
   iterations evaluated every 6, the candidate 48 every 4, both to one budget (the unit of hours).
   The candidate's curve is the baseline's at 1.5x the hours, seed for seed in distribution, so
   every crossing time is 1.5x shorter: the true speed-up is 1.5 at every threshold (checked here
   in closed form; the noise-free curves on the grids give what linear interpolation makes of it).
   Reported: the interval's coverage of 1.5, the share whose lower end is above 1 (power), the
   share undefined (a seed never reached the target). Beside it the OLD instrument on the same
   curves: the paper's definition between the seeds' mean curves (``speedup.paper_speedup``, to
   the baseline's own final) with its old percentile bootstrap (seeds resampled within each family,
   undefined resamples ranked lowest, so the lower end is None when they reach the 2.5% tail, as
   the comparison's old percentile interval did: ``old_percentile_interval`` below).
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solrl_core import intervals, speedup  # noqa: E402
from solrl_core.ledger import atomic_write, write_json  # noqa: E402

GENERATOR_SEED = 20260051
SEEDS = (3, 5, 10)
CONFIDENCE = 0.95

# The difference of two family means.
TRUE_DIFFERENCE = 0.01
SD = 0.0117  # the study's pooled seed SD at the finals
UNEQUAL = (0.006, 0.018)  # ratio 3
GAMMA_SHAPE = 2.0
SEED_CORRELATION = 0.3  # between families' values at one run seed, as measured (issue 51)
EVAL_SE = 0.011  # the evaluation set's paired-over-images SE of a difference
EVAL_DF = 63  # 64 fixed evaluation images
NOISE_CELLS = {
    "equal spreads, normal": ("normal", (SD, SD)),
    "unequal spreads (ratio 3), normal": ("normal", UNEQUAL),
    "equal spreads, skewed": ("gamma", (SD, SD)),
    "unequal spreads (ratio 3), skewed": ("gamma", UNEQUAL),
}
BLOCKED_MEANS = (0.0, TRUE_DIFFERENCE, 0.02, -0.01, 0.005, 0.03, 0.015)  # family 1 - family 0 is the pair
BLOCKED_CELLS = {
    "equal spreads, normal": ("normal", (SD,) * 7),
    "equal spreads, skewed": ("gamma", (SD,) * 7),
    "pair's spreads 0.006 / 0.018 (one-spread assumption broken), normal": ("normal", (0.006, 0.018) + (SD,) * 5),
}

# The speed-up curves (hours in units of the budget).
BASE = 0.38
GAIN = 0.13
GAIN_SD = 0.008
TAU_BASELINE = 1 / 3  # the baseline ends at 1 - e^-3 = 95% of its gain
TRUE_SPEEDUP = 1.5
LOG_TAU_SD = 0.2
EVAL_NOISE = 0.008
BASELINE_HOURS = [0.0, *[k / 67 for k in range(6, 67, 6)], 1.0]  # 67 iterations, evaluated every 6 and at the end
CANDIDATE_HOURS = [0.0, *[k / 48 for k in range(4, 49, 4)]]  # 48 iterations, every 4
FRACTIONS = speedup.GAIN_FRACTIONS

FULL = {"experiments": 20000, "bootstrap_experiments": 20000, "bootstrap_resamples": 2000,
        "blocked_experiments": 3000, "blocked_broken_experiments": 2000,
        "speedup_experiments": 8000, "speedup_resamples": 2000}
QUICK = {"experiments": 600, "bootstrap_experiments": 600, "bootstrap_resamples": 500,
         "blocked_experiments": 150, "blocked_broken_experiments": 100,
         "speedup_experiments": 150, "speedup_resamples": 300}
BOOTSTRAP_CHUNK = 250  # experiments per scipy.stats.bootstrap call; each chunk draws its own resamples
DEFAULT_OUT = Path("reports/benchmarks/interval_coverage.json")
QUICK_OUT = Path(tempfile.gettempdir()) / "interval_coverage-quick.json"  # a smoke run never replaces the report


# ---------------------------------------------------------------------------------------------
# Simulated seeds



def old_percentile_interval(values: list[float | None], confidence: float) -> list[float | None]:
    """The comparison's former percentile interval of resampled values: undefined ones (None) rank
    below every defined one, and a quantile that falls among them has no value (None); linear
    between order statistics."""
    ranked = sorted(-math.inf if value is None else value for value in values)
    ends = []
    for q in ((1 - confidence) / 2, (1 + confidence) / 2):
        position = q * (len(ranked) - 1)
        low, high = math.floor(position), math.ceil(position)
        a, b = ranked[low], ranked[high]
        ends.append(None if -math.inf in (a, b) else a + (b - a) * (position - low))
    return ends

def standard_noise(rng: np.random.Generator, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """Mean 0, SD 1: normal, or a gamma of shape ``GAMMA_SHAPE`` centred and scaled (right-skewed)."""
    if kind == "normal":
        return rng.standard_normal(shape)
    return (rng.gamma(GAMMA_SHAPE, 1.0, shape) - GAMMA_SHAPE) / math.sqrt(GAMMA_SHAPE)


def family_values(rng: np.random.Generator, kind: str, sds: tuple[float, ...], means: tuple[float, ...],
                  experiments: int, seeds: int, correlation: float = 0.0) -> np.ndarray:
    """(families, experiments, seeds) seed values: family mean + its SD times a shared seed effect
    (weight sqrt(correlation)) plus the family's own noise, so any two families correlate by
    ``correlation`` at one seed."""
    own = standard_noise(rng, kind, (len(sds), experiments, seeds))
    if correlation > 0:
        shared = standard_noise(rng, kind, (1, experiments, seeds))
        own = math.sqrt(correlation) * shared + math.sqrt(1 - correlation) * own
    return np.asarray(means)[:, None, None] + np.asarray(sds)[:, None, None] * own


def coverage_record(intervals_: list[list[float] | None] | np.ndarray, truth: float) -> dict:
    """Coverage of ``truth`` over the experiments' intervals, its Monte Carlo SE, the mean width and
    which side the misses fall (an interval wholly below the truth misses low)."""
    array = np.asarray([[math.nan, math.nan] if ci is None else ci for ci in intervals_], dtype=float)
    low, high = array[:, 0], array[:, 1]
    defined = ~np.isnan(low) & ~np.isnan(high)
    covered = (low <= truth) & (truth <= high)
    share = float(covered[defined].mean()) if defined.any() else None
    count = int(defined.sum())
    return {"coverage": share, "mc_se": math.sqrt(share * (1 - share) / count) if count else None,
            "mean_width": float((high - low)[defined].mean()) if count else None, "experiments": len(array),
            "undefined": len(array) - count,
            "missed_low": float((high < truth)[defined].mean()) if count else None,
            "missed_high": float((low > truth)[defined].mean()) if count else None}


def old_bootstrap(a: np.ndarray, b: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The old interval for every experiment (rows of ``a`` and ``b``): a percentile bootstrap of
    mean(a) - mean(b), each family's seeds resampled on their own, in chunks of experiments."""
    def difference(x, y, axis):
        return x.mean(axis=axis) - y.mean(axis=axis)

    out = np.empty((len(a), 2))
    for start in range(0, len(a), BOOTSTRAP_CHUNK):
        chunk = slice(start, start + BOOTSTRAP_CHUNK)
        result = stats.bootstrap((a[chunk], b[chunk]), difference, n_resamples=resamples, vectorized=True,
                                 paired=False, axis=-1, method="percentile", confidence_level=CONFIDENCE, rng=rng)
        out[chunk, 0], out[chunk, 1] = result.confidence_interval.low, result.confidence_interval.high
    return out


def difference_cells(rng: np.random.Generator, sizes: dict, progress) -> dict:
    """Every difference-of-means cell (module doc, part 1): {noise cell: {seeds: {method: record}}}."""
    experiments, boot_experiments = sizes["experiments"], min(sizes["bootstrap_experiments"], sizes["experiments"])
    resamples = sizes["bootstrap_resamples"]
    means = (TRUE_DIFFERENCE, 0.0)
    independent, shared, evaluation = {}, {}, {}
    for cell, (kind, sds) in NOISE_CELLS.items():
        independent[cell], shared[cell], evaluation[cell] = {}, {}, {}
        for n in SEEDS:
            a, b = family_values(rng, kind, sds, means, experiments, n)
            independent[cell][str(n)] = {
                "old_percentile_bootstrap": coverage_record(old_bootstrap(a[:boot_experiments], b[:boot_experiments],
                                                                          resamples, rng), TRUE_DIFFERENCE),
                "welch": coverage_record([intervals.welch(x, y)["ci"] for x, y in zip(a, b)], TRUE_DIFFERENCE)}

            a, b = family_values(rng, kind, sds, means, experiments, n, SEED_CORRELATION)
            shared[cell][str(n)] = {
                "old_percentile_bootstrap": coverage_record(old_bootstrap(a[:boot_experiments], b[:boot_experiments],
                                                                          resamples, rng), TRUE_DIFFERENCE),
                "welch": coverage_record([intervals.welch(x, y)["ci"] for x, y in zip(a, b)], TRUE_DIFFERENCE),
                "paired": coverage_record([intervals.paired(x, y)["ci"] for x, y in zip(a, b)], TRUE_DIFFERENCE),
                "observed_correlation": float(np.mean([np.corrcoef(x, y)[0, 1] for x, y in zip(a[:2000], b[:2000])]))}

            a, b = family_values(rng, kind, sds, means, experiments, n)
            a = a + rng.normal(0.0, EVAL_SE, (experiments, 1))  # the evaluation set's error of the difference
            estimated = EVAL_SE ** 2 * rng.chisquare(EVAL_DF, experiments) / EVAL_DF
            evaluation[cell][str(n)] = {
                "welch_without_evaluation_term": coverage_record(
                    [intervals.welch(x, y)["ci"] for x, y in zip(a, b)], TRUE_DIFFERENCE),
                "welch_with_known_evaluation_term": coverage_record(
                    [intervals.welch(x, y, extra_variance=EVAL_SE ** 2, extra_df=EVAL_DF)["ci"] for x, y in zip(a, b)],
                    TRUE_DIFFERENCE),
                "welch_with_estimated_evaluation_term": coverage_record(
                    [intervals.welch(x, y, extra_variance=v, extra_df=EVAL_DF)["ci"]
                     for x, y, v in zip(a, b, estimated)],
                    TRUE_DIFFERENCE)}
            plain, paired_, evaluated = independent[cell][str(n)], shared[cell][str(n)], evaluation[cell][str(n)]
            progress(f"difference  {cell}, {n} seeds: old {plain['old_percentile_bootstrap']['coverage']:.3f}"
                     f"  welch {plain['welch']['coverage']:.3f}  paired {paired_['paired']['coverage']:.3f}"
                     f"  welch+eval {evaluated['welch_with_known_evaluation_term']['coverage']:.3f}")
    return {"independent_seeds": independent, "shared_seed_effect": shared, "evaluation_error": evaluation}


def blocked_cells(rng: np.random.Generator, sizes: dict, progress) -> dict:
    """``intervals.blocked`` on 7 families at the same seeds (correlation 0.3): the coverage of
    family 1 - family 0's interval."""
    names = [f"f{i}" for i in range(len(BLOCKED_MEANS))]
    pair = f"{names[1]} - {names[0]}"
    result = {}
    for cell, (kind, sds) in BLOCKED_CELLS.items():
        experiments = sizes["blocked_experiments" if len(set(sds)) == 1 else "blocked_broken_experiments"]
        result[cell] = {}
        for n in SEEDS:
            table = family_values(rng, kind, sds, BLOCKED_MEANS, experiments, n, SEED_CORRELATION)
            cis, seed_p = [], []
            for e in range(experiments):
                entry = intervals.blocked({name: table[i, e] for i, name in enumerate(names)})
                cis.append(entry["pairs"][pair]["ci"])
                seed_p.append(entry["seed_effect"]["p"])
            result[cell][str(n)] = {"blocked": coverage_record(cis, TRUE_DIFFERENCE),
                                    "seed_effect_p_below_0.05": float(np.mean(np.asarray(seed_p) < 0.05))}
            progress(f"blocked     {cell}, {n} seeds: {result[cell][str(n)]['blocked']['coverage']:.3f}")
    return {"families": len(names), "means": list(BLOCKED_MEANS), "pair": pair, "seed_correlation": SEED_CORRELATION,
            "cells": {cell: {"noise": kind, "sds": list(sds)} for cell, (kind, sds) in BLOCKED_CELLS.items()},
            "coverage": result}


# ---------------------------------------------------------------------------------------------
# The speed-up


def crossing_hours(tau: float, gain: float, target_gain: float) -> float:
    """Hours at which base + gain (1 - exp(-h / tau)) reaches base + target_gain (closed form)."""
    return -tau * math.log(1 - target_gain / gain)


def truth_checks() -> dict:
    """The true speed-up: the closed-form ratio of the noise-free crossing times (1.5 at every
    threshold, since the candidate's curve is the baseline's at 1.5x the hours), and what the
    noise-free curves on the study's grids give (linear interpolation between evaluations)."""
    tau_candidate = TAU_BASELINE / TRUE_SPEEDUP
    baseline_gain = GAIN * (1 - math.exp(-1 / TAU_BASELINE))
    closed = {f"{f:g}": (crossing_hours(TAU_BASELINE, GAIN, f * baseline_gain)
                         / crossing_hours(tau_candidate, GAIN, f * baseline_gain)) for f in (*FRACTIONS, 1.0)}

    def noise_free(hours: list[float], tau: float) -> list[tuple[float, float]]:
        return [(h, BASE + GAIN * (1 - math.exp(-h / tau))) for h in hours]

    baseline = [noise_free(BASELINE_HOURS, TAU_BASELINE)] * 2
    candidate = [noise_free(CANDIDATE_HOURS, tau_candidate)] * 2
    gridded = {f"{f:g}": speedup.threshold_speedup(baseline, candidate, f)["speedup"] for f in FRACTIONS}
    gridded["1 (paper's, mean curves)"] = speedup.paper_speedup(baseline[0], candidate[0])["speedup"]
    return {"closed_form_crossing_ratio": closed,
            "closed_form_is_exactly_the_scale": all(abs(v - TRUE_SPEEDUP) < 1e-12 for v in closed.values()),
            "noise_free_on_the_grids": gridded}


def simulate_curves(rng: np.random.Generator, hours: list[float], tau: float, experiments: int,
                    seeds: int) -> np.ndarray:
    """(experiments, seeds, points) rewards: base + G_s (1 - exp(-h / tau_s)) + evaluation noise,
    the base exact at 0 hours."""
    h = np.asarray(hours)
    taus = tau * np.exp(rng.normal(0.0, LOG_TAU_SD, (experiments, seeds, 1)))
    gains = rng.normal(GAIN, GAIN_SD, (experiments, seeds, 1))
    rewards = BASE + gains * (1 - np.exp(-h / taus)) + rng.normal(0.0, EVAL_NOISE, (experiments, seeds, len(h)))
    rewards[:, :, 0] = BASE
    return rewards


def paper_speedups(baseline_hours: np.ndarray, baseline_means: np.ndarray, candidate_hours: np.ndarray,
                   candidate_means: np.ndarray) -> np.ndarray:
    """``speedup.paper_speedup`` for many pairs of mean curves at once (rows; NaN where it is None):
    each curve's first crossing of the baseline's final, linear between evaluations."""
    target = baseline_means[:, -1]
    gain_positive = target - baseline_means[:, 0] > 0

    def first(hours: np.ndarray, values: np.ndarray) -> np.ndarray:
        reached = values >= target[:, None]
        k = reached.argmax(axis=1)
        rows = np.arange(len(values))
        previous = np.maximum(k - 1, 0)
        r0, r1 = values[rows, previous], values[rows, k]
        with np.errstate(divide="ignore", invalid="ignore"):
            crossing = np.where(k == 0, hours[0], np.where(r1 != r0, hours[previous] + (target - r0) / (r1 - r0)
                                                         * (hours[k] - hours[previous]), hours[k]))
        return np.where(reached.any(axis=1), crossing, np.nan)

    baseline_at, candidate_at = first(baseline_hours, baseline_means), first(candidate_hours, candidate_means)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = baseline_at / candidate_at
    return np.where(gain_positive & (candidate_at > 0), ratio, np.nan)


def _geometric_mean(logs: list[float]) -> float | None:
    return math.exp(float(np.mean(logs))) if logs else None


def speedup_cells(rng: np.random.Generator, sizes: dict, progress) -> dict:
    """Part 2 of the module doc: per seeds, the new threshold speed-up at every fraction and the
    old paper's bootstrap, on the same simulated curves."""
    experiments, resamples = sizes["speedup_experiments"], sizes["speedup_resamples"]
    hb, hc = np.asarray(BASELINE_HOURS), np.asarray(CANDIDATE_HOURS)
    result, checked, largest_mismatch = {}, 0, 0.0
    finals = []
    for n in SEEDS:
        baseline = simulate_curves(rng, BASELINE_HOURS, TAU_BASELINE, experiments, n)
        candidate = simulate_curves(rng, CANDIDATE_HOURS, TAU_BASELINE / TRUE_SPEEDUP, experiments, n)
        finals.append(baseline[:, :, -1].std(axis=1, ddof=1))
        new = {f: {"ci": [], "lower_above_1": 0, "undefined": 0, "log_speedup": []} for f in FRACTIONS}
        old = {"ci": [], "lower_above_1": 0, "lower_none": 0, "point_undefined": 0, "log_speedup": []}
        for e in range(experiments):
            b_curves = [list(zip(BASELINE_HOURS, row.tolist())) for row in baseline[e]]
            c_curves = [list(zip(CANDIDATE_HOURS, row.tolist())) for row in candidate[e]]
            for f in FRACTIONS:
                entry = speedup.threshold_speedup(b_curves, c_curves, f)
                record = new[f]
                if entry["speedup"] is None:
                    record["undefined"] += 1
                    record["ci"].append(None)
                    continue
                record["ci"].append(entry["ci"])
                record["log_speedup"].append(math.log(entry["speedup"]))
                record["lower_above_1"] += entry["ci"][0] > 1
            # the old instrument: the paper's speed-up between mean curves, seeds resampled in each family
            point = speedup.paper_speedup(list(zip(BASELINE_HOURS, baseline[e].mean(axis=0).tolist())),
                                          list(zip(CANDIDATE_HOURS, candidate[e].mean(axis=0).tolist())))["speedup"]
            if point is None:
                old["point_undefined"] += 1
            else:
                old["log_speedup"].append(math.log(point))
            picks_b = rng.integers(0, n, (resamples, n))
            picks_c = rng.integers(0, n, (resamples, n))
            means_b, means_c = baseline[e][picks_b].mean(axis=1), candidate[e][picks_c].mean(axis=1)
            values = paper_speedups(hb, means_b, hc, means_c)
            if checked < 400:  # the vectorized form is the library's paper_speedup, resample for resample
                for r in range(20):
                    library = speedup.paper_speedup(list(zip(BASELINE_HOURS, means_b[r].tolist())),
                                                    list(zip(CANDIDATE_HOURS, means_c[r].tolist())))["speedup"]
                    if (library is None) != bool(np.isnan(values[r])):
                        largest_mismatch = math.inf
                    elif library is not None:
                        largest_mismatch = max(largest_mismatch, abs(library - values[r]))
                    checked += 1
            ci = old_percentile_interval([None if np.isnan(v) else float(v) for v in values], CONFIDENCE)
            old["ci"].append(ci)
            old["lower_none"] += ci[0] is None
            old["lower_above_1"] += ci[0] is not None and ci[0] > 1
        row = {}
        for f in FRACTIONS:
            record = new[f]
            row[f"threshold {f:g}"] = {
                **coverage_record(record["ci"], TRUE_SPEEDUP),
                "lower_above_1": record["lower_above_1"] / experiments,
                "undefined_share": record["undefined"] / experiments,
                "geometric_mean_speedup": _geometric_mean(record["log_speedup"])}
        # an interval without a lower end (None) reaches down without bound: it covers 1.5 when its upper end does
        covered = [ci is None or ((ci[0] is None or ci[0] <= TRUE_SPEEDUP) and (ci[1] is None or TRUE_SPEEDUP <= ci[1]))
                   for ci in old["ci"]]
        share = float(np.mean(covered))
        row["old paper's, percentile bootstrap"] = {
            "coverage": share, "mc_se": math.sqrt(share * (1 - share) / experiments), "experiments": experiments,
            "lower_above_1": old["lower_above_1"] / experiments,
            "lower_end_none_share": old["lower_none"] / experiments,
            "point_undefined_share": old["point_undefined"] / experiments,
            "geometric_mean_speedup": _geometric_mean(old["log_speedup"])}
        result[str(n)] = row
        progress(f"speed-up    {n} seeds: " + "  ".join(
            f"{name} cov {r['coverage']:.3f} power {r['lower_above_1']:.3f}" for name, r in row.items()))
    simulated_final_sd = float(np.sqrt(np.mean(np.concatenate(finals) ** 2)))
    return {"coverage": result, "resamples_checked_against_library": checked,
            "largest_difference_from_library": largest_mismatch, "simulated_final_seed_sd": simulated_final_sd}


# ---------------------------------------------------------------------------------------------
# Report


def _cell(record: dict, width: bool = True) -> str:
    if record.get("coverage") is None:
        return "-"
    text = f"{record['coverage']:.3f} ± {record['mc_se']:.3f}"
    return f"{text} (w {record['mean_width']:.4f})" if width and record.get("mean_width") is not None else text


def markdown(result: dict) -> str:
    """The coverage tables."""
    d = result["difference"]
    lines = [f"# Coverage of 95% intervals ({result['mode']} run, generator seed {result['generator_seed']})", "",
             f"True difference {TRUE_DIFFERENCE}; coverage ± its Monte Carlo SE, (w) the mean interval width. "
             f"{result['sizes']['experiments']} experiments per cell for the t intervals, "
             f"{min(result['sizes']['bootstrap_experiments'], result['sizes']['experiments'])} for the bootstrap "
             f"({result['sizes']['bootstrap_resamples']} resamples).", "",
             "## Two families, independent seeds", "",
             "| noise | seeds | old: percentile bootstrap | new: Welch |", "|---|---|---|---|"]
    for cell, rows in d["independent_seeds"].items():
        for n, r in rows.items():
            lines.append(f"| {cell} | {n} | {_cell(r['old_percentile_bootstrap'])} | {_cell(r['welch'])} |")
    lines += ["", f"## Shared seed effect (correlation {SEED_CORRELATION} at one seed)", "",
              "| noise | seeds | old: percentile bootstrap | Welch | paired |", "|---|---|---|---|---|"]
    for cell, rows in d["shared_seed_effect"].items():
        for n, r in rows.items():
            lines.append(f"| {cell} | {n} | {_cell(r['old_percentile_bootstrap'])} | {_cell(r['welch'])} | "
                         f"{_cell(r['paired'])} |")
    lines += ["", f"## The evaluation set's error (SE {EVAL_SE} of the difference, df {EVAL_DF})", "",
              "| noise | seeds | Welch without it | Welch + known term | Welch + estimated term |",
              "|---|---|---|---|---|"]
    for cell, rows in d["evaluation_error"].items():
        for n, r in rows.items():
            lines.append(f"| {cell} | {n} | {_cell(r['welch_without_evaluation_term'])} | "
                         f"{_cell(r['welch_with_known_evaluation_term'])} | "
                         f"{_cell(r['welch_with_estimated_evaluation_term'])} |")
    b = result["blocked"]
    lines += ["", f"## Blocked: {b['families']} families at the same seeds, the interval of {b['pair']}", "",
              "| noise | seeds | blocked | seed effect p < 0.05 |", "|---|---|---|---|"]
    for cell, rows in b["coverage"].items():
        for n, r in rows.items():
            lines.append(f"| {cell} | {n} | {_cell(r['blocked'])} | {r['seed_effect_p_below_0.05']:.3f} |")
    s = result["speedup"]
    lines += ["", f"## The speed-up (true {TRUE_SPEEDUP}x)", "",
              f"{s['experiments']} experiments per row ({s['resamples']} resamples for the old bootstrap). "
              "Coverage among defined intervals; power: share with the lower end above 1 (undefined counts as "
              "not).", "",
              "| seeds | instrument | coverage of 1.5 | lower end > 1 | undefined | geometric mean estimate |",
              "|---|---|---|---|---|---|"]
    for n, rows in s["coverage"].items():
        for name, r in rows.items():
            undefined = (r["undefined_share"] if "undefined_share" in r
                         else f"point {r['point_undefined_share']:.3f}, lower end None {r['lower_end_none_share']:.3f}")
            undefined = f"{undefined:.3f}" if isinstance(undefined, float) else undefined
            estimate = "-" if r["geometric_mean_speedup"] is None else f"{r['geometric_mean_speedup']:.3f}"
            lines.append(f"| {n} | {name} | {_cell(r, width=False)} | {r['lower_above_1']:.3f} | {undefined} | "
                         f"{estimate} |")
    truth = s["truth"]
    lines += ["", "Closed-form ratio of noise-free crossing times: "
              + ", ".join(f"{k} {v:.12g}" for k, v in truth["closed_form_crossing_ratio"].items())
              + "; noise-free curves on the study's grids (linear interpolation): "
              + ", ".join(f"{k} {v:.4f}" for k, v in truth["noise_free_on_the_grids"].items())
              + f". Simulated seed SD of the baseline's final: {s['simulated_final_seed_sd']:.4f}.", "",
              f"Wall time {result['seconds']:.0f} s.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="far fewer experiments per cell (a smoke run)")
    parser.add_argument("--seed", type=int, default=GENERATOR_SEED,
                        help=f"the Generator's seed (default {GENERATOR_SEED})")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"JSON to write, the markdown beside it (default {DEFAULT_OUT}; with --quick {QUICK_OUT})")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    started = time.perf_counter()

    def progress(text: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {text}", flush=True)

    rng = np.random.default_rng(args.seed)
    difference = difference_cells(rng, sizes, progress)
    blocked = blocked_cells(rng, sizes, progress)
    truth = truth_checks()
    speed = speedup_cells(rng, sizes, progress)
    result = {
        "mode": "quick" if args.quick else "full", "generator": "numpy.random.default_rng", "generator_seed": args.seed,
        "sizes": sizes,
        "sizes_note": ("experiments per cell: 'experiments' for Welch, paired and the evaluation-term cells and "
                       "'bootstrap_experiments' for the old percentile bootstrap (the same simulated data; scipy "
                       f"resamples {BOOTSTRAP_CHUNK} experiments at a time with shared indices, fresh per chunk); "
                       "intervals.blocked costs ~3 ms a call (42 pairs), so its cells hold 'blocked_experiments' "
                       "(equal spreads) and 'blocked_broken_experiments' (the one-spread assumption broken); the "
                       "speed-up holds 'speedup_experiments' per number of seeds, each with 'speedup_resamples' "
                       "resamples for the old bootstrap"),
        "confidence": CONFIDENCE, "seeds": list(SEEDS),
        "difference": {"true_difference": TRUE_DIFFERENCE, "sd": SD, "unequal_sds": list(UNEQUAL),
                       "skewed_noise": (f"centred gamma, shape {GAMMA_SHAPE} "
                                        f"(skewness {2 / math.sqrt(GAMMA_SHAPE):.3f})"),
                       "seed_correlation": SEED_CORRELATION, "evaluation_se": EVAL_SE, "evaluation_df": EVAL_DF,
                       "cells": {cell: {"noise": kind, "sds": list(sds)} for cell, (kind, sds) in NOISE_CELLS.items()},
                       "old_method": ("scipy.stats.bootstrap(method='percentile', paired=False): each family's seeds "
                                      "resampled on their own, statistic mean(a) - mean(b)"),
                       **difference},
        "blocked": blocked,
        "speedup": {"true_speedup": TRUE_SPEEDUP, "base": BASE, "gain": GAIN, "gain_sd": GAIN_SD,
                    "tau_baseline": TAU_BASELINE, "tau_candidate": TAU_BASELINE / TRUE_SPEEDUP,
                    "log_tau_sd": LOG_TAU_SD, "evaluation_noise": EVAL_NOISE,
                    "baseline_hours": BASELINE_HOURS, "candidate_hours": CANDIDATE_HOURS,
                    "fractions": list(FRACTIONS), "experiments": sizes["speedup_experiments"],
                    "resamples": sizes["speedup_resamples"], "truth": truth,
                    "coverage_note": ("coverage among experiments with a defined interval; lower_above_1 and the "
                                      "undefined share over all experiments. The old bootstrap's interval without a "
                                      "lower end (undefined resamples in its 2.5% tail) counts as covering when its "
                                      "upper end is above 1.5"),
                    **speed},
        "python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_json(out, result)
    table = markdown(result)
    atomic_write(out.with_suffix(".md"), lambda temporary: Path(temporary).write_text(table, encoding="utf-8"))
    print(table)
    print(f"wrote {out} and {out.with_suffix('.md')} in {result['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
