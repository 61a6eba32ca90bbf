"""Statistics across run seeds for the equal-budget comparison: mean ± standard error curves,
curves on a common GPU-hour grid, and a bootstrap over seeds for the speed-up to equal reward and
for differences of final rewards.

Pure functions on plain lists (a curve is ``[(GPU-hours, reward), ...]``, hours ascending, the first
point the base model at 0), so every answer here can be checked on constructed curves.

The bootstrap resamples *seeds*, with replacement, within each family independently (the families
are independent experiments; nothing pairs seed 0 of one family with seed 0 of another), from one
fixed generator, so a report is reproducible. The interval is the percentile interval of the
statistic over the resamples.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

Curve = list[tuple[float, float]]

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20260406
CONFIDENCE = 0.95
# Two grids are "the same" when every point agrees to this relative tolerance (float sums of the
# same per-iteration costs can differ in the last bits between runs).
GRID_TOLERANCE = 1e-9


def mean_se(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and standard error (sample standard deviation / sqrt(n)); no SE from one value."""
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None
    variance = math.fsum((value - mean) ** 2 for value in values) / (n - 1)
    return mean, math.sqrt(variance / n)


def interpolate(curve: Curve, hours: float) -> float:
    """The curve's reward at ``hours``, linear between evaluations; never extrapolated."""
    first, last = curve[0][0], curve[-1][0]
    if not first - _slack(first) <= hours <= last + _slack(last):
        raise ValueError(f"{hours:g} GPU-hours is outside the curve's evaluations [{first:g}, {last:g}]")
    if hours <= first:
        return curve[0][1]
    for (h0, r0), (h1, r1) in zip(curve[:-1], curve[1:]):
        if hours <= h1:
            return r1 if h1 == h0 else r0 + (hours - h0) / (h1 - h0) * (r1 - r0)
    return curve[-1][1]


def _slack(hours: float) -> float:
    return abs(hours) * GRID_TOLERANCE


def same_grid(curves: Sequence[Curve]) -> bool:
    """Whether every curve is evaluated at the same GPU-hours (same iteration costs and evaluations)."""
    grid = [hours for hours, _ in curves[0]]
    return all(len(curve) == len(grid) and all(abs(h - g) <= max(_slack(g), _slack(h)) for (h, _), g in
                                                zip(curve, grid)) for curve in curves[1:])


def seed_grid(curves: Sequence[Curve]) -> tuple[list[float], bool]:
    """The grid one family's seeds are averaged on, and whether it had to be interpolated.

    The seeds of one family share their iteration cost, so they share their evaluation hours and the
    grid is exactly theirs. Should they not (a different sizing), every hour any seed was evaluated
    at, up to the end of the shortest seed's curve, each seed's reward interpolated there.
    """
    if same_grid(curves):
        return [hours for hours, _ in curves[0]], False
    end = min(curve[-1][0] for curve in curves)
    hours = sorted({h for curve in curves for h, _ in curve if h <= end + _slack(end)})
    return hours, True


def common_grid(curves: Sequence[Curve], intervals: int) -> tuple[list[float], bool]:
    """A GPU-hour grid every curve covers, and whether rewards on it are interpolated.

    Curves of different families land on the same hours only when their iteration costs match;
    then their own grid is used. Otherwise ``intervals`` equal steps from 0 to the end of the
    shortest curve, where each curve is read by linear interpolation between its evaluations.
    """
    if same_grid(curves):
        return [hours for hours, _ in curves[0]], False
    end = min(curve[-1][0] for curve in curves)
    return [end * step / intervals for step in range(intervals + 1)], True


def on_grid(curve: Curve, grid: Sequence[float]) -> list[float]:
    return [interpolate(curve, hours) for hours in grid]


def mean_curve(curves: Sequence[Curve]) -> dict:
    """The seeds' mean curve with its standard error at each point of the family's grid."""
    grid, interpolated = seed_grid(curves)
    values = [on_grid(curve, grid) for curve in curves]
    points = [mean_se([row[i] for row in values]) for i in range(len(grid))]
    return {"gpu_hours": grid, "mean": [m for m, _ in points], "se": [s for _, s in points],
            "seeds": len(curves), "interpolated": interpolated, "per_seed": values}


def resample_indices(sizes: dict[str, int], resamples: int = BOOTSTRAP_RESAMPLES,
                     seed: int = BOOTSTRAP_SEED) -> dict[str, list[list[int]]]:
    """For each family, ``resamples`` draws of its seed indices with replacement, from a generator of
    its own seeded by the bootstrap seed and the family's name: a pair's interval then depends only
    on the two families' runs, not on which other families share the report or their order."""
    return {name: _family_draws(n, resamples, random.Random(f"{seed}:{name}")) for name, n in sizes.items()}


def _family_draws(n: int, resamples: int, generator: random.Random) -> list[list[int]]:
    return [generator.choices(range(n), k=n) for _ in range(resamples)]


def resampled_mean(values: Sequence[Sequence[float]], picks: Sequence[int]) -> list[float]:
    """Point-wise mean over the picked seeds of per-seed values on one grid."""
    return [math.fsum(values[i][point] for i in picks) / len(picks) for point in range(len(values[0]))]


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (linear between order statistics) of ascending values; ``-inf`` stands for
    an undefined resample ranked below every defined one, and a quantile that touches one is None."""
    position = q * (len(sorted_values) - 1)
    low, high = math.floor(position), math.ceil(position)
    a, b = sorted_values[low], sorted_values[high]
    if a == -math.inf or b == -math.inf:
        return None
    return a + (b - a) * (position - low)


def interval(values: Sequence[float | None], confidence: float = CONFIDENCE) -> list[float | None] | None:
    """Percentile interval of the defined-or-undefined (None) resampled values, None ranked lowest."""
    if not values:
        return None
    ranked = sorted(-math.inf if value is None else value for value in values)
    tail = (1 - confidence) / 2
    return [percentile(ranked, tail), percentile(ranked, 1 - tail)]


def bootstrap(statistic: Callable[[dict[str, list[int]]], float | None], draws: dict[str, list[list[int]]],
              confidence: float = CONFIDENCE) -> dict:
    """A statistic of the resampled seeds (one list of picked indices per family) over every resample.

    Undefined resamples (None) are counted and ranked below every defined value, so an interval whose
    lower end falls among them has no lower end (None); ``ci_defined_only`` leaves them out.
    """
    resamples = len(next(iter(draws.values())))
    values = [statistic({name: picks[r] for name, picks in draws.items()}) for r in range(resamples)]
    defined = [value for value in values if value is not None]
    return {"ci": interval(values, confidence), "ci_defined_only": interval(defined, confidence),
            "resamples": resamples, "undefined": resamples - len(defined),
            "undefined_share": (resamples - len(defined)) / resamples}


def bootstrap_difference(finals: dict[str, Sequence[float]], a: str, b: str, draws: dict[str, list[list[int]]],
                         confidence: float = CONFIDENCE) -> dict:
    """Mean final reward of ``a`` minus that of ``b``: the difference, its SE (independent families),
    and its bootstrap interval over seeds."""
    mean_a, se_a = mean_se(finals[a])
    mean_b, se_b = mean_se(finals[b])
    se = math.hypot(se_a, se_b) if se_a is not None and se_b is not None else None

    def difference(picks: dict[str, list[int]]) -> float:
        return (math.fsum(finals[a][i] for i in picks[a]) / len(picks[a])
                - math.fsum(finals[b][i] for i in picks[b]) / len(picks[b]))

    result = bootstrap(difference, {a: draws[a], b: draws[b]}, confidence)
    return {"mean": mean_a - mean_b, "se": se, "ci": result["ci"], "resamples": result["resamples"],
            "seeds": {a: len(finals[a]), b: len(finals[b])}}
