"""Intervals for differences between families of runs, and what a study of that size can resolve.

The unit of replication is the run seed: a family's value at one point (its final reward, its
reward at an equal budget or after equal iterations) is one number per seed. With 3 to 10 seeds
a percentile bootstrap does not hold its level (about 80% coverage at 3 seeds for a "95%"
interval, 0.88 at 5: ``benchmarks/interval_coverage.py``), so every interval here is a t
interval, its quantile from ``scipy.stats``:

- ``welch``: the default. Two families, unequal spreads allowed, Welch-Satterthwaite degrees of
  freedom. An optional extra variance term (the finite evaluation set's, with its own degrees
  of freedom) joins the Satterthwaite sum.
- ``paired``: the same run seed of two families shares its LoRA initialisation, training prompts,
  timesteps, training noise, dealing and (for equal pools) exploration noise, so per-seed
  differences are a valid paired design (``scipy.stats.ttest_rel``). Reported beside Welch, never
  chosen after looking at which is narrower.
- ``blocked``: every family run at the same seeds: family as effect, run seed as block, one pooled
  residual variance (additive two-way ANOVA). Its seed-effect F test says whether pairing matters.

``holm`` corrects a family of claims; ``smallest_resolvable`` and ``seeds_needed`` give the power
of a planned study from a pilot's spreads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize, stats

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE
POWER = 0.8


def _interval(mean: float, se: float, df: float, confidence: float) -> tuple[list[float], float | None]:
    """(interval, two-sided p) of a t statistic; a zero SE gives the point itself and p only when
    the difference is exactly 0 (identical values: nothing to test)."""
    if se == 0 or not math.isfinite(df):
        return [mean, mean], (1.0 if mean == 0 else None)
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * se
    return [mean - half, mean + half], float(2 * stats.t.sf(abs(mean) / se, df))


def welch(a: Sequence[float], b: Sequence[float], extra_variance: float = 0.0, extra_df: float = math.inf,
          confidence: float = CONFIDENCE) -> dict:
    """mean(a) - mean(b) with Welch's t interval; ``extra_variance`` (with ``extra_df``) is a further
    independent error of the difference, such as the evaluation set's, added to its variance."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or len(b) < 2:
        return {"method": "welch", "mean": float(a.mean() - b.mean()), "se": None, "df": None, "ci": None,
                "p": None, "seeds": [len(a), len(b)]}
    terms = [(a.var(ddof=1) / len(a), len(a) - 1), (b.var(ddof=1) / len(b), len(b) - 1)]
    if extra_variance > 0:
        terms.append((extra_variance, extra_df))
    variance = sum(v for v, _ in terms)
    denominator = sum(v * v / df for v, df in terms if v > 0)
    df = variance * variance / denominator if denominator > 0 else math.inf
    mean = float(a.mean() - b.mean())
    ci, p = _interval(mean, math.sqrt(variance), df, confidence)
    return {"method": "welch", "mean": mean, "se": math.sqrt(variance), "df": df, "ci": ci, "p": p,
            "seeds": [len(a), len(b)], "extra_se": math.sqrt(extra_variance) if extra_variance > 0 else None}


def paired(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> dict:
    """mean(a - b) over seeds paired by run seed (same order), with the paired t interval."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) != len(b):
        raise ValueError(f"paired differences need the same seeds: {len(a)} against {len(b)}")
    differences = a - b
    mean = float(differences.mean())
    if len(a) < 2:
        return {"method": "paired", "mean": mean, "se": None, "df": None, "ci": None, "p": None,
                "correlation": None}
    se = float(differences.std(ddof=1) / math.sqrt(len(a)))
    if se > 0:
        result = stats.ttest_rel(a, b)
        low, high = result.confidence_interval(confidence)
        ci, p = [float(low), float(high)], float(result.pvalue)
    else:
        ci, p = _interval(mean, 0.0, len(a) - 1, confidence)
    correlation = (float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else None)
    return {"method": "paired", "mean": mean, "se": se, "df": len(a) - 1, "ci": ci, "p": p,
            "correlation": correlation}


def blocked(values: dict[str, Sequence[float]], confidence: float = CONFIDENCE) -> dict:
    """Additive two-way model, family as effect and run seed as block, on a complete table
    (every family at the same seeds, in the same order): the pooled residual SD, the seed
    effect's F test, and the interval of every pair's difference from the pooled variance."""
    names = list(values)
    table = np.asarray([values[name] for name in names], dtype=float)
    families, seeds = table.shape
    if families < 2 or seeds < 2:
        return {"method": "blocked", "pairs": {}, "df": 0, "residual_sd": None, "seed_effect": None}
    grand = table.mean()
    family_means, seed_means = table.mean(axis=1), table.mean(axis=0)
    residual = table - family_means[:, None] - seed_means[None, :] + grand
    df = (families - 1) * (seeds - 1)
    mse = float((residual ** 2).sum() / df)
    ms_seed = float(families * ((seed_means - grand) ** 2).sum() / (seeds - 1))
    seed_effect = ({"f": ms_seed / mse, "df": [seeds - 1, df], "p": float(stats.f.sf(ms_seed / mse, seeds - 1, df))}
                   if mse > 0 else None)
    se = math.sqrt(2 * mse / seeds)
    pairs = {}
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if i != j:
                mean = float(family_means[i] - family_means[j])
                ci, p = _interval(mean, se, df, confidence)
                pairs[f"{a} - {b}"] = {"mean": mean, "se": se, "df": df, "ci": ci, "p": p}
    return {"method": "blocked", "residual_sd": math.sqrt(mse), "df": df, "seed_effect": seed_effect, "pairs": pairs}


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values over the defined ones (None stays None): a claim is
    resolved at level alpha when its adjusted p is below alpha, the family's error held at alpha."""
    defined = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    adjusted: list[float | None] = [None] * len(pvalues)
    running, m = 0.0, len(defined)
    for rank, (p, index) in enumerate(defined):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[index] = running
    return adjusted


def verdict(entry: dict, alpha: float = ALPHA) -> str:
    """"resolved" when the Holm-adjusted p is below alpha (the interval excludes 0 with room for
    the family), "not resolved" otherwise, "undefined" without an interval."""
    if entry.get("p_holm") is None:
        return "undefined"
    return "resolved" if entry["p_holm"] < alpha else "not resolved"


# ---------------------------------------------------------------------------------------------
# Power, from a pilot's seed spreads: two families of n seeds each, the same SD, Welch's test
# (at equal n and SD its df is 2(n-1), the two-sample t's).


def power(difference: float, sd: float, seeds: int, alpha: float = ALPHA) -> float:
    """Probability that a two-sided test at ``alpha`` resolves a true ``difference`` with ``seeds``
    runs per family of seed SD ``sd`` (noncentral t)."""
    df = 2 * (seeds - 1)
    noncentrality = difference / (sd * math.sqrt(2 / seeds))
    critical = stats.t.ppf(1 - alpha / 2, df)
    value = float(stats.nct.sf(critical, df, noncentrality) + stats.nct.cdf(-critical, df, noncentrality))
    # scipy's noncentral t has no value far in its tail, where the power is 1 to double precision
    return 1.0 if math.isnan(value) and abs(noncentrality) > critical else value


def smallest_resolvable(sd: float, seeds: int, alpha: float = ALPHA, target: float = POWER) -> float | None:
    """The smallest true difference resolved with probability ``target`` at ``seeds`` per family."""
    if seeds < 2 or not sd > 0:
        return None
    return float(optimize.brentq(lambda d: power(d, sd, seeds, alpha) - target, 1e-12 * sd, 100 * sd))


def seeds_needed(difference: float, sd: float, alpha: float = ALPHA, target: float = POWER,
                 most: int = 10_000) -> int | None:
    """Seeds per family to resolve ``difference`` with probability ``target``; None past ``most``."""
    if not sd > 0:
        return 2
    for seeds in range(2, most + 1):
        if power(difference, sd, seeds, alpha) >= target:
            return seeds
    return None


def pooled_sd(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The two families' seed SD pooled (their variances averaged, weighted by degrees of freedom)."""
    if len(a) < 2 or len(b) < 2:
        return None
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return math.sqrt(((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / (len(a) + len(b) - 2))


def power_entry(a: Sequence[float], b: Sequence[float], differences: Sequence[float] = (0.01, 0.02),
                comparisons: int = 1) -> dict:
    """For one pair: its pooled seed SD, the smallest difference it resolves at 80% power with its
    seeds, and the seeds per family needed for each of ``differences`` (alone, and under a
    Bonferroni bound over ``comparisons`` claims, which Holm's first step is)."""
    sd, seeds = pooled_sd(a, b), min(len(a), len(b))
    if sd is None:
        return {"sd": None, "seeds": seeds, "smallest_resolvable": None, "seeds_needed": {}}
    return {"sd": sd, "seeds": seeds, "smallest_resolvable": smallest_resolvable(sd, seeds),
            "seeds_needed": {f"{d:g}": seeds_needed(d, sd) for d in differences},
            "comparisons": comparisons,
            "seeds_needed_corrected": {f"{d:g}": seeds_needed(d, sd, ALPHA / comparisons) for d in differences}}
