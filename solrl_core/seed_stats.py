"""Curves across run seeds for the equal-budget comparison: mean ± standard error curves and
curves on a common GPU-hour grid. Intervals and verdicts are solrl_core.intervals'.

Pure functions on plain lists (a curve is ``[(GPU-hours, reward), ...]``, hours ascending, the first
point the base model at 0), so every answer here can be checked on constructed curves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Curve = list[tuple[float, float]]

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
