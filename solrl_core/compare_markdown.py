"""compare.md from a comparison report (compare.json): the families' table, then every claim with
its interval and verdict (compare_stats), the blocked analysis and the study's power.

Every difference reads "resolved" or "not resolved" after Holm's correction over its family of
claims; descriptive tables (mean ± SE at equal GPU-hours) carry no verdict.
"""

from __future__ import annotations

from solrl_core.speedup import BASELINE_DID_NOT_IMPROVE, CANDIDATE_NEVER_REACHED, SEEDS_NEVER_REACHED

BASELINE = "diffusionnft"

# A speed-up that is not defined says why: the full sentence goes to compare.json, the short form
# to the tables, where the counts beside it say the rest.
_UNDEFINED = {BASELINE_DID_NOT_IMPROVE: "undefined (no baseline gain)", CANDIDATE_NEVER_REACHED: "not reached",
              SEEDS_NEVER_REACHED: "not reached by every seed"}


def markdown_table(report: dict) -> str:
    families = report["families"]
    reward_names = list(next(iter(families.values()))["final_rewards"])
    statistics = report.get("seed_statistics") or {}
    own = (statistics.get("speedups") or {}).get(report["device_profile"], {})
    seeds = max(len(entry.get("seeds", [None])) for entry in families.values())
    fraction = statistics.get("speedup_fraction")
    header = (["family", "iterations", "modeled GPU-h / iteration", "modeled GPU-h used",
               "CPU s" if seeds == 1 else f"CPU s ({seeds} seeds)"]
              + [f"final {name}" for name in reward_names]
              + ([f"speed-up to {fraction:.0%} of {BASELINE}'s gain [95% interval]"] if own else []))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, entry in families.items():
        row = [name, str(entry["iterations"]), f"{entry['modeled_gpu_hours_per_iteration']:.3g}",
               f"{entry['modeled_gpu_hours_used']:.3g}", f"{entry['cpu_seconds']:.0f}"]
        row += [_mean_pm(entry["final_rewards"][reward], entry.get("final_rewards_se", {}).get(reward))
                for reward in reward_names]
        if own:
            row.append("1 (the baseline)" if name == BASELINE else
                       speedup_cell(own[name]["threshold"]) if name in own else "n/a")
        lines.append("| " + " | ".join(row) + " |")
    base = next(iter(families.values()))["base_rewards"]
    lines += ["", "Base model: " + ", ".join(f"{name} {value:.4f}" for name, value in base.items()) + "."]
    if seeds > 1:
        lines += ["", f"Each family trained once per run seed ({', '.join(map(str, report['seeds']))}), every run "
                  f"sized to the same budget; rewards and GPU-hours are means over the seeds (± standard error "
                  f"across seeds), CPU seconds their sum."]
    if statistics.get("final_differences") is not None and seeds > 1:
        lines += claims(report)
    return "\n".join(lines) + "\n"


def claims(report: dict) -> list[str]:
    """Every difference and speed-up with its interval and verdict, then the blocked analysis,
    the descriptive curve table and the power of the study."""
    statistics, metric, device = report["seed_statistics"], report["metric"], report["device_profile"]
    method = statistics["method"]
    seeds = {len(s) for s in statistics["seeds"].values()}
    counts = method["holm"]
    lines = ["", "### Claims", "",
             f"{_seed_count(seeds)} seeds a family. Intervals: {method['confidence']:.0%} {method['interval']}; "
             f"the paired interval over run seeds beside it (not the verdict's). A claim is **resolved** when "
             f"its Holm-adjusted p is below {method['alpha']:g}: Holm over the {counts['primary']} primary claims "
             f"(final differences and declared speed-ups), and separately over the {counts['curve_points']} "
             f"curve points (equal budget, equal iterations). At the finals the evaluation set's own error "
             f"(the paired-over-images SE of the {_images(report)} fixed evaluation images) is in the interval."]
    if statistics["final_differences"]:
        lines += ["", f"| final {metric} difference | mean | 95% interval (Welch, with evaluation set) | p | "
                  "Holm p | verdict | paired interval (r) | evaluation-set SE |", "|---|---|---|---|---|---|---|---|"]
        for pair, entry in statistics["final_differences"].items():
            lines.append(f"| {pair} | {entry['mean']:+.4f} | {_ci(entry['ci'])} | {_p(entry['p'])} | "
                         f"{_p(entry['p_holm'])} | {entry['verdict']} | {_paired(entry)} | "
                         f"{_num(entry.get('extra_se'), '.4f')} |")
    lines += speedup_lines(report)
    lines += _blocked_lines(statistics.get("blocked"), metric)
    for key, label, unit in (("equal_budget", "at equal modeled GPU-hours", "gpu_hours"),
                             ("equal_iterations", "after equal iterations", "iterations")):
        lines += _curve_point_lines(statistics.get(key), label, unit, metric)
    lines += descriptive_grid(report)
    lines += power_lines(statistics)
    return lines


def speedup_lines(report: dict) -> list[str]:
    statistics, metric, device = report["seed_statistics"], report["metric"], report["device_profile"]
    speedups = statistics.get("speedups") or {}
    if not speedups:
        return []
    fraction = statistics["speedup_fraction"]
    lines = ["", f"Speed-up to equal {metric}: GPU-hours {BASELINE} needs over GPU-hours the family needs to first "
             f"reach its base plus a share of {BASELINE}'s mean gain, from each seed's own curve (ratio of geometric "
             f"means, Welch's interval on log GPU-hours). The declared share is {fraction:.0%} (params.yaml "
             f"compare.speedup_fraction, fixed before the runs): its verdict is a primary claim under the profile "
             f"that sized the budget. Other shares are printed with their intervals and no verdict. The paper's "
             f"definition (to {BASELINE}'s final reward, between the seeds' mean curves: on the baseline's plateau, "
             f"a point estimate with no interval) is the last column.", "",
             "| cost profile | family | target | speed-up | 95% interval | Holm p | verdict | other shares | "
             "paper's definition |", "|---|---|---|---|---|---|---|---|---|"]
    for profile, entries in speedups.items():
        label = f"{profile} (sized the budget)" if profile == device else f"{profile} (re-costed)"
        for name, entry in entries.items():
            threshold = entry["threshold"]
            others = "; ".join(f"{float(share):.0%}: {speedup_cell(value)}" for share, value in entry["fractions"].items()
                               if float(share) != fraction)
            holm = _p(threshold.get("p_holm")) if profile == device else "–"
            verdict = threshold.get("verdict", "–") if profile == device else "–"
            lines.append(f"| {label} | {name} | {threshold['target_reward']:.4f} | {speedup_text(threshold)} | "
                         f"{_ci(threshold['ci'], '.2f', 'x')} | {holm} | {verdict} | {others} | "
                         f"{speedup_text(entry['paper'])} |")
    return lines


def _blocked_lines(blocked: dict | None, metric: str) -> list[str]:
    if not blocked or not blocked.get("seed_effect"):
        return []
    effect = blocked["seed_effect"]
    return ["", f"Blocked analysis of the final {metric} (family as effect, run seed as block, pooled residual SD "
            f"{blocked['residual_sd']:.4f} on {blocked['df']} df): the seed effect F({effect['df'][0]}, "
            f"{effect['df'][1]}) = {effect['f']:.2f}, p = {effect['p']:.3f}. Its pair intervals assume one spread "
            f"for every family and are in compare.json (seed_statistics.blocked), not the verdict."]


def _curve_point_lines(table: dict | None, label: str, unit: str, metric: str) -> list[str]:
    if not table or not table["differences"]:
        return []
    points = next(iter(table["differences"].values()))
    heads = [f"{p[unit]:.3g} GPU-h" if unit == "gpu_hours" else f"after {p[unit]}" for p in points]
    lines = ["", f"{metric} differences {label} (Welch 95% interval; * resolved after Holm over the curve points):",
             "", "| pair | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for pair, entries in table["differences"].items():
        lines.append(f"| {pair} | " + " | ".join(
            f"{e['mean']:+.4f} {_ci(e['ci'])}" + (" *" if e.get("verdict") == "resolved" else "")
            for e in entries) + " |")
    return lines


def descriptive_grid(report: dict) -> list[str]:
    """Mean ± SE of every family at equal modeled GPU-hours: a description, no claim."""
    statistics, metric, device = report["seed_statistics"], report["metric"], report["device_profile"]
    grid = statistics["profiles"][device]["common_grid"]
    names = list(grid["families"])
    lines = ["", f"Evaluation {metric} at equal modeled GPU-hours ({device}), mean ± SE over seeds (descriptive)"
             + (": the families' iteration costs differ, so each seed's curve is read on this common grid by "
                "linear interpolation between its evaluations." if grid["interpolated"] else "."), "",
             "| modeled GPU-h | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for i, hours in enumerate(grid["gpu_hours"]):
        lines.append(f"| {hours:.3g} | " + " | ".join(
            _mean_pm(grid["families"][name]["reward"][i], grid["families"][name]["reward_se"][i])
            for name in names) + " |")
    return lines


def power_lines(statistics: dict) -> list[str]:
    power = {pair: entry for pair, entry in statistics.get("power", {}).items() if entry.get("sd")}
    if not power:
        return []
    first = next(iter(power.values()))
    lines = ["", f"Power (80%, two-sided 5%, from each pair's pooled seed SD): the smallest difference the study "
             f"resolves with its seeds, and the seeds per family needed for 0.01 and 0.02 (alone; and with a "
             f"Bonferroni bound over the {first['comparisons']} primary claims, Holm's first step):", "",
             "| pair | seed SD | seeds | smallest resolvable | seeds for 0.01 | seeds for 0.02 | "
             "corrected 0.01 | corrected 0.02 |", "|---|---|---|---|---|---|---|---|"]
    for pair, entry in power.items():
        needed, corrected = entry["seeds_needed"], entry["seeds_needed_corrected"]
        lines.append(f"| {pair} | {entry['sd']:.4f} | {entry['seeds']} | {_num(entry['smallest_resolvable'], '.4f')} | "
                     f"{_num(needed.get('0.01'), 'd')} | {_num(needed.get('0.02'), 'd')} | "
                     f"{_num(corrected.get('0.01'), 'd')} | {_num(corrected.get('0.02'), 'd')} |")
    return lines


def speedup_cell(entry: dict) -> str:
    text = speedup_text(entry)
    if entry.get("ci"):
        text += f" {_ci(entry['ci'], '.2f', 'x')}"
    return text


def speedup_text(entry: dict) -> str:
    """A speed-up as a table cell: ``1.23x``, or why there is none in a few words."""
    note = entry.get("note")
    short = _UNDEFINED.get(note, note)
    if entry.get("never_reached") and note == SEEDS_NEVER_REACHED:
        missing = entry["never_reached"]
        short = f"{short} ({BASELINE} {missing['baseline']}, family {missing['candidate']} never)"
    return _fmt(entry.get("speedup"), ".2f", short or "n/a", suffix="x")


def _paired(entry: dict) -> str:
    paired = entry.get("paired")
    if not paired or paired.get("ci") is None:
        return "–"
    r = paired.get("correlation")
    return f"{_ci(paired['ci'])} ({'–' if r is None else f'{r:+.2f}'})"


def _images(report: dict) -> str:
    return str((report.get("final_reward_spread") or {}).get("images", "the"))


def _seed_count(counts: set[int]) -> str:
    return " to ".join(str(c) for c in sorted(counts)) if len(counts) > 1 else str(next(iter(counts)))


def _ci(ci: list | None, spec: str = "+.4f", suffix: str = "") -> str:
    if ci is None:
        return "n/a"
    return f"[{ci[0]:{spec}}{suffix}, {ci[1]:{spec}}{suffix}]"


def _p(p: float | None) -> str:
    return "–" if p is None else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _num(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _mean_pm(mean: float, se: float | None, spec: str = ".4f") -> str:
    return f"{mean:{spec}}" if se is None else f"{mean:{spec}} ± {se:.4f}"


def _fmt(value, spec: str, missing: str, suffix: str = "") -> str:
    return missing if value is None else f"{value:{spec}}{suffix}"
