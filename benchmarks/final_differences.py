"""Differences of final reward between families of different comparison reports, with the
comparison's own intervals over seeds and a verdict per pair after Holm over the pairs asked for.

A variant probed after the study (its own params file, its own runs) is compared with the study's
families without running them again: every run is a pure function of its config and seed, so the
study's per-seed finals in its compare.json are the runs' finals. The interval is the comparison's
own (solrl_core.compare_stats.pair_difference: Welch's 95% interval, the paired one beside it when
the seeds match, the evaluation set's SE joined where one report scored the pair per image), so a
pair reads as it does in one report holding both families.

    .venv/bin/python benchmarks/final_differences.py reports/compare.json \\
        reports/benchmarks/study_shape/adv-mode/compare.json \\
        --pair sol_rl_positive:sol_rl --pair sol_rl_negative:sol_rl \\
        --out reports/benchmarks/study_shape/adv-mode/differences.json

A family named in two reports must hold the same budget and per-seed finals in both, or it stops.

``--wide RL_GAIN_JSON`` compares the same runs' finals on a wider held-out set instead: each run's
final policy scored on the prompts of ``benchmarks/rl_gain.py --wide-eval N`` (run over every run
folder the pairs name, matched by folder). A report's curve is scored on its few dozen evaluation
images, and families evaluated on the same images share their luck, but not how each family's
policy happens to suit those prompts.

    .venv/bin/python benchmarks/rl_gain.py runs/study/runs/*/seed-* --wide-eval 128 --out wide.json
    .venv/bin/python benchmarks/final_differences.py reports/compare.json --wide wide.json \
        --pair sol_rl:diffusionnft --out differences-wide.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from solrl_core.ledger import write_json  # noqa: E402
from solrl_core.compare_stats import apply_holm, evaluation_error, pair_difference  # noqa: E402
from solrl_core.compare_stats import evaluation_errors as evaluation_errors_of  # noqa: E402
from solrl_core.seed_stats import mean_se  # noqa: E402


def evaluation_errors(reports: list[dict]) -> dict[str, dict]:
    """The final's evaluation-set SE of every pair a report scored per image, and over how many images."""
    return {pair: entry for report in reports
            for pair, entry in evaluation_errors_of(report.get("final_reward_spread")).items()}


def family_finals(reports: list[dict]) -> dict[str, dict]:
    """Each family's per-seed final rewards, seeds and budget, from whichever report holds it."""
    families: dict[str, dict] = {}
    for report in reports:
        for name, family in report["families"].items():
            entry = {"seeds": [run["seed"] for run in family["runs"]],
                     "finals": [run["final_reward"] for run in family["runs"]],
                     "budget_gpu_hours": report["budget_gpu_hours"], "peak_of_mean_curve": _peak(family)}
            if name in families and families[name]["finals"] != entry["finals"]:
                raise SystemExit(f"final_differences: {name} differs between the reports; compare one of them")
            families[name] = entry
    return families


def wide_finals(families: dict[str, dict], reports: list[dict], wide_report: dict) -> dict[str, dict]:
    """``families`` with each run's final replaced by its final on the wide evaluation (module doc)."""
    rows = [row for row in wide_report["runs"] if row.get("wide")]
    if not rows:
        raise SystemExit("final_differences: the --wide report holds no wide evaluation; run rl_gain.py with --wide-eval")
    folders = {name: [run["run_dir"] for run in family["runs"]]
               for report in reports for name, family in report["families"].items()}
    widened = {}
    for name, entry in families.items():
        finals = []
        for folder in folders[name]:
            match = [row for row in rows if Path(row["run"]).as_posix().endswith("/" + Path(folder).as_posix())
                     or Path(row["run"]).as_posix() == Path(folder).as_posix()]
            if len(match) != 1:
                raise SystemExit(f"final_differences: the --wide report holds {len(match)} runs of {name}'s {folder}; "
                                 "give rl_gain.py each run folder once")
            wide = match[0]["wide"]
            finals.append(wide["final"][match[0]["trained_reward"]])
        widened[name] = {**entry, "finals": finals, "wide_prompts": rows[0]["wide"]["prompts"]}
    return widened


def _peak(family: dict) -> dict:
    """The highest evaluation of the family's curve (the mean over seeds at each evaluation)."""
    best = max(family["curve"], key=lambda point: point["reward"])
    return {"reward": best["reward"], "iteration": best["iteration"], "modeled_gpu_hours": best["modeled_gpu_hours"]}


def differences(families: dict[str, dict], pairs: list[tuple[str, str]],
                evaluation: dict[str, dict] | None = None) -> dict[str, dict]:
    for name in {name for pair in pairs for name in pair}:
        if name not in families:
            raise SystemExit(f"final_differences: no report holds {name}; reports hold {', '.join(families)}")
    for a, b in pairs:
        if families[a]["budget_gpu_hours"] != families[b]["budget_gpu_hours"]:
            raise SystemExit(f"final_differences: {a} and {b} ran to different budgets")
    result = {}
    for a, b in pairs:
        spread = evaluation_error(evaluation or {}, a, b)
        result[f"{a} - {b}"] = pair_difference(families[a]["finals"], families[b]["finals"],
                                               families[a]["seeds"] == families[b]["seeds"],
                                               spread and spread["se"], spread and spread["images"] - 1)
    apply_holm(list(result.values()))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="compare.json files")
    parser.add_argument("--pair", action="append", required=True, help="A:B, for the final of A minus that of B")
    parser.add_argument("--wide", type=Path, help="benchmarks/rl_gain.py --wide-eval output over the runs (module doc)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    pairs = [tuple(text.split(":", 1)) for text in args.pair]
    if any(len(pair) != 2 for pair in pairs):
        raise SystemExit("final_differences: give each --pair as A:B")
    reports = [json.loads(path.read_text()) for path in args.reports]
    families = family_finals(reports)
    named = sorted({name for pair in pairs for name in pair})
    if args.wide is not None:
        families = wide_finals({name: families[name] for name in named if name in families}, reports,
                               json.loads(args.wide.read_text()))
    result = {"reports": [str(path) for path in args.reports], "wide": None if args.wide is None else str(args.wide),
              "families": {name: {**families.get(name, {}), **_mean(families.get(name))} for name in named},
              "differences": differences(families, pairs, None if args.wide else evaluation_errors(reports))}
    write_json(args.out, result)
    for name in named:
        entry = result["families"][name]
        peak = entry["peak_of_mean_curve"]
        se = "n/a (one seed)" if entry["final_se"] is None else f"{entry['final_se']:.4f}"
        where = f" on {entry['wide_prompts']} held-out prompts" if "wide_prompts" in entry else ""
        print(f"{name:>18}: final{where} {entry['final_mean']:.4f} ± {se}, peak of its curve {peak['reward']:.4f} "
              f"at iteration {peak['iteration']}")
    for pair, difference in result["differences"].items():
        interval = "n/a" if difference["ci"] is None else f"[{difference['ci'][0]:+.4f}, {difference['ci'][1]:+.4f}]"
        print(f"{pair:>28}: {difference['mean']:+.4f} {interval} (Welch 95%), Holm p "
              f"{difference['p_holm'] if difference['p_holm'] is None else round(difference['p_holm'], 3)}: "
              f"{difference['verdict']}, over seeds {difference['seeds']}")
    return 0


def _mean(entry: dict | None) -> dict:
    if not entry:
        return {}
    mean, se = mean_se(entry["finals"])
    return {"final_mean": mean, "final_se": se}


if __name__ == "__main__":
    sys.exit(main())
