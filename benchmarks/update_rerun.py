"""The study's families before and after a change to the update, and their rewards at equal
iterations beside the equal-budget finals.

Before/after: each family's final held-out reward (mean ± SE over seeds), the peak of its mean
curve and the iteration of that peak, in the report made before the change and the one after.
Equal iterations: each run's reward after 0, 8, 16, ... iterations (linear between its
evaluations), mean ± SE over seeds, and for each pair the difference with the comparison's own
interval (solrl_core.compare_stats.pair_difference: Welch's 95%, the paired one beside it) and a
verdict after Holm over every pair and point printed. A family's iterations cost what its pool
costs, so at an equal budget a cheap family runs more of them; at equal iterations every family
has trained on as many samples, and the pairs ask what a sample teaches: naive_scaling (the
extremes of a pool) against random_pool (random seeds of the same pool), and random_pool against
diffusionnft (random seeds either way, a control that should read zero).

    .venv/bin/python benchmarks/update_rerun.py --before reports/benchmarks/faithful_update/before.json \\
        --after reports/compare.json --pair naive_scaling:random_pool --pair random_pool:diffusionnft \\
        --out reports/benchmarks/faithful_update/update_rerun.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.final_differences import family_finals  # noqa: E402
from solrl_core.ledger import write_json  # noqa: E402
from solrl_core.compare_stats import apply_holm, iterations_done, pair_difference, reward_after  # noqa: E402
from solrl_core.seed_stats import mean_se  # noqa: E402

ITERATION_STEP = 8


def equal_iterations(report: dict, pairs: list[tuple[str, str]], step: int = ITERATION_STEP) -> dict:
    families = report["families"]
    reach = min(iterations_done(run["curve"][-1]) for family in families.values() for run in family["runs"])
    grid = list(range(0, reach + 1, step))
    per_seed = {name: {k: [reward_after(run["curve"], k) for run in family["runs"]] for k in grid}
                for name, family in families.items()}
    seeds = {name: [run["seed"] for run in family["runs"]] for name, family in families.items()}
    table = {name: [{"iterations": k, **dict(zip(("mean", "se"), mean_se(values[k])))} for k in grid]
             for name, values in per_seed.items()}
    differences = {f"{a} - {b}": [{"iterations": k, **pair_difference(per_seed[a][k], per_seed[b][k],
                                                                      seeds[a] == seeds[b])} for k in grid[1:]]
                   for a, b in pairs if a in per_seed and b in per_seed}
    apply_holm([entry for points in differences.values() for entry in points])
    return {"grid": grid, "families": table, "differences": differences}


def before_after(before: dict, after: dict) -> dict:
    old, new = family_finals([before]), family_finals([after])
    rows = {}
    for name in after["families"]:
        rows[name] = {"after": _summary(new[name])}
        if name in old:
            rows[name]["before"] = _summary(old[name])
    return rows


def _summary(entry: dict) -> dict:
    mean, se = mean_se(entry["finals"])
    return {"final": mean, "final_se": se, "seeds": entry["seeds"], "peak": entry["peak_of_mean_curve"]}


def markdown(result: dict) -> str:
    lines = ["| family | final before | final after | peak before (iteration) | peak after (iteration) |",
             "|---|---|---|---|---|"]
    for name, row in result["before_after"].items():
        cells = [_final(row.get("before")), _final(row["after"]), _peak(row.get("before")), _peak(row["after"])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    equal = result["equal_iterations"]
    lines += ["", "| family | " + " | ".join(f"after {k}" for k in equal["grid"]) + " |",
              "|---|" + "---|" * len(equal["grid"])]
    for name, points in equal["families"].items():
        lines.append(f"| {name} | " + " | ".join(_mean_se(p["mean"], p["se"]) for p in points) + " |")
    for pair, points in equal["differences"].items():
        lines.append(f"| {pair} | – | " + " | ".join(
            f"{p['mean']:+.4f} " + ("(one seed: no interval)" if p["ci"] is None else f"[{p['ci'][0]:+.4f}, {p['ci'][1]:+.4f}]")
            + (" *" if p["verdict"] == "resolved" else "")
            for p in points) + " |")
    lines += ["", "Differences: Welch 95% interval over seeds; * resolved after Holm over every pair and point above."]
    return "\n".join(lines) + "\n"


def _final(summary: dict | None) -> str:
    return "–" if summary is None else _mean_se(summary["final"], summary["final_se"])


def _peak(summary: dict | None) -> str:
    return "–" if summary is None else f"{summary['peak']['reward']:.4f} ({summary['peak']['iteration']})"


def _mean_se(mean: float, se: float | None) -> str:
    return f"{mean:.4f}" if se is None else f"{mean:.4f} ± {se:.4f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the study's compare.json before the change")
    parser.add_argument("--after", type=Path, required=True, help="its compare.json after the change")
    parser.add_argument("--pair", action="append", default=[], help="A:B, compared at equal iterations")
    parser.add_argument("--out", type=Path, required=True, help="JSON out (a .md table beside it)")
    args = parser.parse_args(argv)
    pairs = [tuple(text.split(":", 1)) for text in args.pair]
    if any(len(pair) != 2 for pair in pairs):
        raise SystemExit("update_rerun: give each --pair as A:B")
    before, after = (json.loads(path.read_text()) for path in (args.before, args.after))
    result = {"before": str(args.before), "after": str(args.after), "budget_gpu_hours": after["budget_gpu_hours"],
              "before_after": before_after(before, after), "equal_iterations": equal_iterations(after, pairs)}
    write_json(args.out, result)
    text = markdown(result)
    args.out.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
