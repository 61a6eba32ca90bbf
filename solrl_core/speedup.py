"""The speed-up to equal reward: how many GPU-hours the baseline needs to reach a reward, over how
many the candidate needs.

Two definitions, both on reward-vs-GPU-hour curves (``[(GPU-hours, reward), ...]``, hours
ascending, the first point the base model at 0):

- **At a declared threshold** (the comparison's own, and its verdict): the target is the base
  reward plus a fraction of the baseline's mean gain, the fraction fixed before the runs
  (``compare.speedup_fraction`` in params.yaml, default 0.5: on the rise, below the plateau, where
  a crossing time is set by the curve's slope rather than by noise). Each seed's own curve gives a
  crossing time; the speed-up is the ratio of the two families' geometric mean crossing times,
  with Welch's interval on the log crossing times (``intervals.welch``), so its coverage is the
  t interval's (checked on simulated curves by ``benchmarks/interval_coverage.py``). A seed that
  never reaches the target leaves the speed-up undefined: "not resolved", with the count.
- **The paper's** (secondary): to the baseline's own final reward, between the seeds' mean curves.
  The target sits on the baseline's plateau, where a crossing time is mostly noise, so it is given
  as a point estimate beside the threshold's, labelled as the paper's definition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from solrl_core import intervals

Curve = list[tuple[float, float]]

DEFAULT_FRACTION = 0.5
GAIN_FRACTIONS = (0.25, 0.5, 0.75)

BASELINE_DID_NOT_IMPROVE = "the baseline did not improve on its start; no speed-up is defined"
CANDIDATE_NEVER_REACHED = "the candidate never reached the target within the budget"
SEEDS_NEVER_REACHED = "a seed's run never reached the target within the budget"


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


def mean_gain_target(baseline: Sequence[Curve], fraction: float) -> tuple[float, float]:
    """(target reward, the baseline's mean gain): the base plus ``fraction`` of the mean over the
    baseline's seeds of final minus base reward."""
    gains = [curve[-1][1] - curve[0][1] for curve in baseline]
    start = math.fsum(curve[0][1] for curve in baseline) / len(baseline)
    gain = math.fsum(gains) / len(gains)
    return start + fraction * gain, gain


def threshold_speedup(baseline: Sequence[Curve], candidate: Sequence[Curve], fraction: float,
                      confidence: float = intervals.CONFIDENCE) -> dict:
    """The speed-up to ``fraction`` of the baseline's mean gain, per seed, with its interval."""
    target, gain = mean_gain_target(baseline, fraction)
    entry: dict = {"fraction": fraction, "target_reward": target, "baseline_gain": gain, "speedup": None,
                   "ci": None, "p": None, "baseline_gpu_hours": None, "candidate_gpu_hours": None}
    if gain <= 0:
        return {**entry, "note": BASELINE_DID_NOT_IMPROVE}
    hours = {"baseline": [first_crossing(curve, target) for curve in baseline],
             "candidate": [first_crossing(curve, target) for curve in candidate]}
    entry["never_reached"] = {side: sum(h is None for h in values) for side, values in hours.items()}
    if any(h is None or h <= 0 for values in hours.values() for h in values):
        return {**entry, "note": SEEDS_NEVER_REACHED}
    logs = {side: [math.log(h) for h in values] for side, values in hours.items()}
    entry["baseline_gpu_hours"] = math.exp(math.fsum(logs["baseline"]) / len(logs["baseline"]))
    entry["candidate_gpu_hours"] = math.exp(math.fsum(logs["candidate"]) / len(logs["candidate"]))
    result = intervals.welch(logs["baseline"], logs["candidate"], confidence=confidence)
    entry.update(speedup=math.exp(result["mean"]), p=result["p"], df=result["df"],
                 ci=None if result["ci"] is None else [math.exp(result["ci"][0]), math.exp(result["ci"][1])])
    return entry


def speedup_to_equal_reward(baseline: Curve, candidate: Curve, fractions: Sequence[float] = (*GAIN_FRACTIONS, 1.0)) -> dict:
    """Point estimates between two (mean) curves: GPU-hours the baseline needs to first reach its
    base reward plus ``fraction`` of its gain, over those the candidate needs. Fraction 1.0 is the
    baseline's own final reward, the paper's definition; a baseline that peaks early counts from
    its first crossing."""
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


def paper_speedup(baseline: Curve, candidate: Curve) -> dict:
    """The paper's definition between mean curves: to the baseline's own final reward."""
    return speedup_to_equal_reward(baseline, candidate, (1.0,))["at"]["1"]
