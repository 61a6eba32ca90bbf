"""What users of the comparison's statistics rely on (solrl_core/intervals.py, solrl_core/speedup.py):
the t intervals are scipy's own, the blocked model reduces to the paired one for two families, Holm
and the power figures give their textbook values, the default interval holds its 95% in a seeded
simulation at 3, 5 and 10 seeds (where the old percentile bootstrap did not), and the threshold
speed-up is exact on noise-free time-scaled curves and says "undefined" when a seed never reaches."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from solrl_core import intervals, speedup

# ---------------------------------------------------------------------------------------------
# Welch, paired, blocked: scipy's intervals


@pytest.mark.parametrize("seed", range(5))
def test_welch_is_scipys_unequal_variance_t_test(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(0.50, 0.01 * (seed + 1), 3 + seed)
    b = rng.normal(0.49, 0.02, 4 + 2 * seed)
    entry = intervals.welch(a, b)
    reference = stats.ttest_ind(a, b, equal_var=False)
    interval = reference.confidence_interval(0.95)
    assert entry["mean"] == pytest.approx(a.mean() - b.mean(), abs=1e-15)
    assert entry["ci"] == pytest.approx([interval.low, interval.high], rel=1e-10, abs=1e-15)
    assert entry["p"] == pytest.approx(reference.pvalue, rel=1e-9)
    assert entry["df"] == pytest.approx(reference.df, rel=1e-12)


def test_welch_adds_an_extra_variance_term_to_the_satterthwaite_sum():
    rng = np.random.default_rng(11)
    a, b = rng.normal(0.51, 0.012, 3), rng.normal(0.50, 0.006, 5)
    extra, extra_df = 0.011 ** 2, 63
    entry = intervals.welch(a, b, extra_variance=extra, extra_df=extra_df)
    va, vb = a.var(ddof=1) / 3, b.var(ddof=1) / 5
    se = math.sqrt(va + vb + extra)
    df = (va + vb + extra) ** 2 / (va ** 2 / 2 + vb ** 2 / 4 + extra ** 2 / extra_df)
    half = stats.t.ppf(0.975, df) * se
    assert entry["se"] == pytest.approx(se, rel=1e-12)
    assert entry["df"] == pytest.approx(df, rel=1e-12)
    assert entry["ci"] == pytest.approx([a.mean() - b.mean() - half, a.mean() - b.mean() + half], rel=1e-10)
    assert entry["p"] == pytest.approx(2 * stats.t.sf(abs(a.mean() - b.mean()) / se, df), rel=1e-9)
    assert entry["extra_se"] == pytest.approx(0.011)
    # a known extra variance (infinite df) adds to the SE and leaves only the seeds' terms in the df's denominator
    known = intervals.welch(a, b, extra_variance=extra)
    assert known["df"] == pytest.approx((va + vb + extra) ** 2 / (va ** 2 / 2 + vb ** 2 / 4), rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_paired_is_scipys_related_samples_t_test(seed):
    rng = np.random.default_rng(100 + seed)
    shared = rng.normal(0, 0.01, 3 + seed)
    a = 0.51 + shared + rng.normal(0, 0.005, len(shared))
    b = 0.50 + shared + rng.normal(0, 0.005, len(shared))
    entry = intervals.paired(a, b)
    reference = stats.ttest_rel(a, b)
    interval = reference.confidence_interval(0.95)
    assert entry["mean"] == pytest.approx((a - b).mean(), abs=1e-15)
    assert entry["ci"] == pytest.approx([interval.low, interval.high], rel=1e-10, abs=1e-15)
    assert entry["p"] == pytest.approx(reference.pvalue, rel=1e-9)
    assert entry["df"] == len(a) - 1
    with pytest.raises(ValueError, match="same seeds"):
        intervals.paired(a, b[:-1])


@pytest.mark.parametrize("seed", range(5))
def test_blocked_with_two_families_is_the_paired_interval(seed):
    """Two families blocked by seed: the residual mean square is half the differences' variance,
    so the pair's SE is the paired SE and its df n - 1 (an identity, not an approximation)."""
    rng = np.random.default_rng(200 + seed)
    n = 3 + seed
    a, b = rng.normal(0.52, 0.01, n), rng.normal(0.50, 0.02, n)
    entry = intervals.blocked({"a": a, "b": b})
    pair, reference = entry["pairs"]["a - b"], intervals.paired(a, b)
    assert entry["df"] == n - 1 == reference["df"]
    assert pair["mean"] == pytest.approx(reference["mean"], abs=1e-15)
    assert pair["se"] == pytest.approx(reference["se"], rel=1e-10)
    assert pair["ci"] == pytest.approx(reference["ci"], rel=1e-10, abs=1e-15)
    assert pair["p"] == pytest.approx(reference["p"], rel=1e-8)
    assert entry["pairs"]["b - a"]["ci"] == pytest.approx([-reference["ci"][1], -reference["ci"][0]], rel=1e-10)


def test_blocked_seed_effect_test_finds_a_strong_shared_seed_effect():
    rng = np.random.default_rng(3)
    seed_effect = rng.normal(0, 0.03, 5)  # the same run seed moves every family alike
    table = {f"family{i}": 0.5 + 0.01 * i + seed_effect + rng.normal(0, 0.003, 5) for i in range(4)}
    entry = intervals.blocked(table)
    assert entry["seed_effect"]["df"] == [4, 12]
    assert entry["seed_effect"]["p"] < 1e-4
    # and without one, no evidence of it
    independent = {name: 0.5 + rng.normal(0, 0.003, 5) for name in table}
    assert intervals.blocked(independent)["seed_effect"]["p"] > 0.01


def test_blocked_residual_sd_on_an_additive_table_with_known_residuals():
    rng = np.random.default_rng(4)
    families, seeds = 4, 6
    residual = rng.normal(0, 0.01, (families, seeds))
    residual -= residual.mean(axis=1, keepdims=True)  # double-centred: exactly what the additive fit leaves
    residual -= residual.mean(axis=0, keepdims=True)
    family_effect, seed_effect = np.array([0.0, 0.01, 0.03, -0.02]), rng.normal(0, 0.02, seeds)
    table = 0.5 + family_effect[:, None] + seed_effect[None, :] + residual
    entry = intervals.blocked({f"f{i}": table[i] for i in range(families)})
    df = (families - 1) * (seeds - 1)
    assert entry["df"] == df
    assert entry["residual_sd"] == pytest.approx(math.sqrt((residual ** 2).sum() / df), rel=1e-9)
    pair = entry["pairs"]["f1 - f0"]
    assert pair["mean"] == pytest.approx(0.01, abs=1e-12)
    assert pair["se"] == pytest.approx(entry["residual_sd"] * math.sqrt(2 / seeds), rel=1e-12)


# ---------------------------------------------------------------------------------------------
# Holm and power


def test_holm_textbook_values():
    assert intervals.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_holm_is_monotone_capped_and_keeps_none():
    rng = np.random.default_rng(5)
    p = rng.uniform(0, 0.2, 12).tolist()
    adjusted = intervals.holm(p)
    order = np.argsort(p)
    assert all(adjusted[i] <= adjusted[j] for i, j in zip(order, order[1:]))  # same order as the raw p
    assert all(q >= raw for q, raw in zip(adjusted, p)) and max(adjusted) <= 1.0
    assert intervals.holm([0.01, None, 0.04]) == pytest.approx([0.02, None, 0.04])
    assert intervals.holm([None, None]) == [None, None]
    assert intervals.holm([0.6, 0.7]) == [1.0, 1.0]


def test_seeds_needed_for_the_study_spread():
    """Pooled seed SD 0.0117 (issue 51): ~7 seeds per family for 0.02, ~23 for 0.01, as the normal
    approximation n = 2 ((z_.975 + z_.8) sd / d)^2 + 1 says (6.4 and 22.5)."""
    def normal_approximation(d, sd):
        return 2 * ((stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * sd / d) ** 2 + 1

    assert intervals.seeds_needed(0.02, 0.0117) == 7
    assert intervals.seeds_needed(0.01, 0.0117) == 23
    for d in (0.02, 0.01):
        n = intervals.seeds_needed(d, 0.0117)
        assert abs(n - normal_approximation(d, 0.0117)) < 1.2
        assert intervals.power(d, 0.0117, n) >= 0.8 > intervals.power(d, 0.0117, n - 1)


def test_smallest_resolvable_falls_with_seeds_and_has_the_target_power():
    values = [intervals.smallest_resolvable(0.0117, n) for n in range(2, 16)]
    assert all(later < earlier for earlier, later in zip(values, values[1:]))
    assert values[1] == pytest.approx(0.036, abs=0.002)  # 3 seeds: ~0.036 (issue 51)
    for n, d in zip(range(2, 16), values):
        assert intervals.power(d, 0.0117, n) == pytest.approx(0.8, abs=1e-8)
    assert intervals.smallest_resolvable(0.0117, 1) is None


# ---------------------------------------------------------------------------------------------
# Coverage: the default interval holds its level at the study's numbers of seeds

COVERAGE_EXPERIMENTS = 5000  # per cell: Monte Carlo SE ~0.003
TRUE_DIFFERENCE, SD = 0.01, 0.0117
COVERAGE_CELLS = {"equal spreads, normal": ("normal", (SD, SD)),
                  "unequal spreads (ratio 3), normal": ("normal", (0.006, 0.018)),
                  "equal spreads, skewed": ("gamma", (SD, SD))}


def _noise(rng, kind, shape):
    if kind == "normal":
        return rng.standard_normal(shape)
    return (rng.gamma(2.0, 1.0, shape) - 2.0) / math.sqrt(2.0)  # centred gamma, shape 2: skewness 1.41


def _families(rng, kind, sds, experiments, seeds):
    return (TRUE_DIFFERENCE + sds[0] * _noise(rng, kind, (experiments, seeds)),
            sds[1] * _noise(rng, kind, (experiments, seeds)))


def _coverage(cis):
    cis = np.asarray(cis)
    return float(np.mean((cis[:, 0] <= TRUE_DIFFERENCE) & (TRUE_DIFFERENCE <= cis[:, 1])))


def test_welch_interval_covers_95_percent_at_3_5_and_10_seeds():
    """Welch's interval of a difference of two family means, in a seeded simulation. The long-run
    coverages (10^6 experiments, benchmarks/interval_coverage.py measures them at 20 000) are
    0.965 / 0.956 / 0.952 with equal spreads, 0.949 / 0.947 / 0.949 with unequal ones (the
    tightest, ~2.5 Monte Carlo SEs above the bar) and 0.970 / 0.966 / 0.957 with skewed noise. Skewed
    AND unequal noise is the known shortfall (~0.93 at every number of seeds): reported by the
    benchmark, not held to 0.94 here."""
    rng = np.random.default_rng(51)
    coverage = {}
    for cell, (kind, sds) in COVERAGE_CELLS.items():
        for seeds in (3, 5, 10):
            a, b = _families(rng, kind, sds, COVERAGE_EXPERIMENTS, seeds)
            coverage[cell, seeds] = _coverage([intervals.welch(x, y)["ci"] for x, y in zip(a, b)])
    below = {key: value for key, value in coverage.items() if value < 0.94}
    assert not below, f"Welch's 95% interval covers below 0.94: {below} (all: {coverage})"


def test_the_old_percentile_bootstrap_did_not_hold_its_level_at_3_seeds():
    """Why the method changed: the old interval, a percentile bootstrap of 3 seeds resampled within
    each family (2000 resamples), covers ~0.80 where it claims 0.95."""
    rng = np.random.default_rng(52)
    a, b = _families(rng, "normal", (SD, SD), 3000, 3)

    def difference(x, y, axis):
        return x.mean(axis=axis) - y.mean(axis=axis)

    cis = []
    for start in range(0, len(a), 250):
        result = stats.bootstrap((a[start:start + 250], b[start:start + 250]), difference, n_resamples=2000,
                                 vectorized=True, paired=False, axis=-1, method="percentile", rng=rng)
        cis.extend(zip(result.confidence_interval.low, result.confidence_interval.high))
    assert _coverage(cis) < 0.90


# ---------------------------------------------------------------------------------------------
# The speed-up at a declared share of the baseline's gain

HOURS = [0.0, 0.1, 0.25, 0.4, 0.6, 0.8, 1.0]


def _saturating(tau, gain=0.13, hours=HOURS, scale=1.0):
    """A noise-free reward curve, optionally run ``scale`` times faster (its hours divided)."""
    return [(h / scale, 0.38 + gain * (1 - math.exp(-h / tau))) for h in hours]


@pytest.mark.parametrize("fraction", speedup.GAIN_FRACTIONS)
def test_a_time_scaled_candidate_gives_exactly_its_scale(fraction):
    baseline = [_saturating(tau) for tau in (0.25, 0.3, 0.4)]
    candidate = [_saturating(tau, scale=1.5) for tau in (0.25, 0.3, 0.4)]  # each seed's curve, 1.5x sooner
    entry = speedup.threshold_speedup(baseline, candidate, fraction)
    assert entry["speedup"] == pytest.approx(1.5, rel=1e-12)
    assert entry["ci"][0] <= 1.5 <= entry["ci"][1]
    assert entry["baseline_gpu_hours"] == pytest.approx(1.5 * entry["candidate_gpu_hours"], rel=1e-12)
    assert entry["never_reached"] == {"baseline": 0, "candidate": 0}


def test_a_seed_that_never_reaches_leaves_the_speedup_undefined():
    baseline = [_saturating(tau) for tau in (0.25, 0.3, 0.4)]
    candidate = [_saturating(0.25, scale=1.5), _saturating(0.3, scale=1.5), _saturating(0.3, gain=0.01, scale=1.5)]
    entry = speedup.threshold_speedup(baseline, candidate, 0.5)
    assert entry["speedup"] is None and entry["ci"] is None and entry["p"] is None
    assert entry["never_reached"] == {"baseline": 0, "candidate": 1}
    assert entry["note"] == speedup.SEEDS_NEVER_REACHED


@pytest.mark.parametrize("seed", range(5))
def test_the_speedup_interval_holds_its_point_estimate(seed):
    rng = np.random.default_rng(300 + seed)

    def noisy(tau, scale):
        return [(h, r + (rng.normal(0, 0.008) if h > 0 else 0.0)) for h, r in _saturating(tau, scale=scale)]

    baseline = [noisy(0.3 * math.exp(rng.normal(0, 0.2)), 1.0) for _ in range(4)]
    candidate = [noisy(0.3 * math.exp(rng.normal(0, 0.2)), 1.5) for _ in range(4)]
    for fraction in speedup.GAIN_FRACTIONS:
        entry = speedup.threshold_speedup(baseline, candidate, fraction)
        assert entry["speedup"] is not None
        assert entry["ci"][0] < entry["speedup"] < entry["ci"][1]
        assert entry["speedup"] == pytest.approx(entry["baseline_gpu_hours"] / entry["candidate_gpu_hours"], rel=1e-12)
