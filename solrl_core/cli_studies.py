"""The measuring subcommands of `solrl`: `fidelity` (ranking study), `compare` (equal budget),
`study base|run|compare` (the DVC study's stages) and `sweep` (a comparison over many GPUs).

Kept beside cli.py so the training commands stay short. User errors raise ConfigError, which the
`solrl` entry point turns into one line on stderr and exit code 2, before anything is written.
List flags take one comma-separated value in every subcommand (solrl_core.cli_syntax).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import traceback
from pathlib import Path
from typing import Any

import torch

from solrl_core.ablations import ABLATION_FAMILY, ABLATIONS, ablation_overrides, ablation_points, variant_name
from solrl_core.accounting import DEVICE_PROFILES
from solrl_core.adaptive import schedule_problem
from solrl_core.cli_syntax import add_list_argument, run_seed_list
from solrl_core.command_errors import RunFailed, UserError
from solrl_core.config import MAX_COUNT, ConfigError, parse_override, shown
from solrl_core.fidelity import FidelityPlan, format_result, parse_schedules, plot_fidelity, run_fidelity
from solrl_core.models.loading import ModelFilesMissing
from solrl_core.presets import FAMILIES, PRESETS, resolve_config
from solrl_core.quant.explorer import BACKENDS, build_explorer
from solrl_core.recost import check_also_profiles

# The reports `--readme-only` builds the page from; with none of them there is nothing to show.
REPORTS = ("compare.json", "fidelity.json", "ablation-*/compare.json", "benchmarks/*.json")


def add_study_commands(commands) -> None:
    fidelity = commands.add_parser("fidelity", help="ranking fidelity of the explorer against full precision")
    fidelity.add_argument("--preset", default="shapes-tiny", help="preset name (default shapes-tiny; `solrl presets` lists them with descriptions)")
    fidelity.add_argument("--prompts", type=int, default=64, help="held-out prompts (default 64)")
    fidelity.add_argument("--pool", type=int, default=96, help="seeds per prompt (default 96)")
    add_list_argument(fidelity, "--explore-steps", "2,4,6,8", default="6",
                      help="explorer step counts, e.g. 2,4,6,8 (default 6)")
    add_list_argument(fidelity, "--backend", "emulated-nvfp4,fp8", default="emulated-nvfp4,fp8",
                      help="explorer backends, e.g. emulated-nvfp4,fp8 (default both)")
    fidelity.add_argument("--adaptive", default=None,
                          help="adaptive-exploration schedules to measure beside the fixed scheme, STEP:SURVIVORS "
                               "pairs, ';' between schedules, e.g. '1:48,2:24;2:48,4:32' (default: none)")
    fidelity.add_argument("--keep", type=int, default=None,
                          help="kept seeds K the schedules prune to and the rollout cost counts "
                               "(default 24, or the even part of --pool when smaller)")
    fidelity.add_argument("--out", required=True, help="JSON file to write (a PNG plot is written beside it)")
    _add_overrides(fidelity)

    compare = commands.add_parser("compare", help="train the families to one GPU-hour budget and compare")
    compare.add_argument("--preset", default="shapes-tiny", help="preset name (default shapes-tiny; `solrl presets` lists them with descriptions)")
    compare.add_argument("--budget-gpu-hours", type=float, help="modeled GPU-hours each family may spend")
    add_list_argument(compare, "--families", "sol_rl,diffusionnft", default=",".join(FAMILIES),
                      help=f"comma list of families (default all: {','.join(FAMILIES)}; `solrl families` describes them)")
    compare.add_argument("--ablation", default=None,
                         help=f"compare the points of one ablation of sol_rl instead: {', '.join(ABLATIONS)}")
    compare.add_argument("--device", default=None, help="device profile (same as -S accounting.device=...)")
    compare.add_argument("--evaluations", type=int, default=6, help="evaluations per family over the budget")
    add_list_argument(compare, "--seeds", "0,1,2", default=None,
                      help="run seeds, e.g. 0,1,2: every family trained once per seed into runs/<family>/seed-<s>, "
                           "reported as mean ± SE with Welch intervals and a verdict per claim (default: one run, the config's seed)")
    add_list_argument(compare, "--also-profile", "B200-measured", default=None,
                      help="device profiles to re-cost the same runs under, e.g. B200-measured, or none "
                           "(default: B200-measured when the runs' profile is B200)")
    compare.add_argument("--out", required=True, help="output directory (compare.json, compare.png, compare.md, ...)")
    compare.add_argument("--readme-only", action="store_true",
                         help="only rebuild OUT/README.md from the reports already in OUT")
    compare.add_argument("--restate", action="store_true",
                         help="recompute the statistics of OUT/compare.json (and OUT/ablation-*/compare.json) from the "
                              "per-seed curves they hold, rewrite them and their compare.md, then OUT/README.md; "
                              "no run folder is needed")
    compare.add_argument("--speedup-fraction", type=float, default=None,
                         help="share of diffusionnft's mean gain the speed-up's verdict is read at, declared before "
                              "the runs (default 0.5; with --restate: the report's own)")
    _add_overrides(compare)
    _add_study_stages(commands.add_parser("study", help="the DVC study's stages: base, run, compare "
                                                        "(dvc.yaml, params.yaml; docs/study.md)"))
    _add_sweep(commands.add_parser("sweep", help="a comparison's or an ablation's runs as Prefect deployment "
                                                 "runs over the devices of one machine"))


def _add_study_stages(study: argparse.ArgumentParser) -> None:
    stages = study.add_subparsers(dest="stage", required=True)
    base = stages.add_parser("base", help="what every run starts from: pretrain the embedded world's checkpoint, "
                                          "or check a real model's files and write their manifest")
    base.add_argument("--params", default="params.yaml", help="the study (default params.yaml)")
    base.add_argument("--overwrite-packaged", action="store_true",
                      help="allow rebuilding the packaged base checkpoint (as for `solrl pretrain`)")
    for name, text in (("run", "train one (family or ablation point, seed) of the study"),
                       ("compare", "compare the study's finished runs (families, or one ablation's points)")):
        stage = stages.add_parser(name, help=text)
        stage.add_argument("--root", required=True, help="the study's report folder (dvc.yaml's ${root})")
        stage.add_argument("--params", default="params.yaml", help="the study (default params.yaml)")
        stage.add_argument("--ablation", default=None, help="an ablation of the params' ablations")
        if name == "run":
            stage.add_argument("--family", default=None, help="an entry of the params' families")
            stage.add_argument("--point", default=None, help="the ablation's point")
            stage.add_argument("--seed", type=int, required=True, help="one of the study's seeds")
    power = stages.add_parser("power", help="before any run: what the planned study (its families and seeds) can "
                                            "resolve, from a pilot comparison's seed spreads")
    power.add_argument("--params", default="params.yaml", help="the planned study (default params.yaml)")
    power.add_argument("--pilot", required=True, help="a finished comparison's compare.json with >= 2 seeds a family")
    add_list_argument(power, "--differences", "0.01,0.02", default="0.01,0.02",
                      help="differences of final reward to size the study for (default 0.01,0.02)")


def _add_sweep(sweep: argparse.ArgumentParser) -> None:
    sweep.add_argument("--devices", type=int, required=True, help="devices of the worker's machine (one run each)")
    sweep.add_argument("--budget-gpu-hours", type=float, required=True, help="modeled GPU-hours each run may spend")
    sweep.add_argument("--out", default="reports/sweep", help="output directory (default reports/sweep)")
    sweep.add_argument("--preset", default="shapes-tiny", help="preset name (default shapes-tiny)")
    add_list_argument(sweep, "--families", "sol_rl,diffusionnft", default=None,
                      help="comma list of families (default all)")
    sweep.add_argument("--ablation", default=None, help=f"sweep one ablation's points instead: {', '.join(ABLATIONS)}")
    add_list_argument(sweep, "--seeds", "0,1,2", default=None, help="run seeds (default 0)")
    sweep.add_argument("--evaluations", type=int, default=6, help="evaluations per run over the budget")
    _add_overrides(sweep)
    sweep.add_argument("--deployment", default=None, help="the training deployment (default solrl/<preset>)")
    sweep.add_argument("--poll-seconds", type=float, default=5.0, help="how often finished runs are looked for")


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-S", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config key, e.g. -S regenerate.steps=10")


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected comma-separated integers, e.g. 2,4,6,8") from None
    if not values or min(values) < 1 or max(values) > MAX_COUNT:
        raise ConfigError(f"{flag} {text!r}: give step counts from 1 to {MAX_COUNT}, e.g. 2,4,6,8")
    return values


def _name_list(text: str, flag: str, allowed) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values:
        raise ConfigError(f"{flag} {text!r}: give at least one of: {', '.join(allowed)}")
    unknown = [value for value in values if value not in allowed]
    if unknown:
        raise ConfigError(f"{flag}: unknown {', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}")
    return list(dict.fromkeys(values))


def with_flag(overrides: list[tuple[str, Any]], flag: str, key: str, value: Any) -> list[tuple[str, Any]]:
    """The -S overrides, then the flag's own setting when it is given. The rule: a flag is short for
    ``-S key=value``, so both may be given only when they agree; a conflict is one line, never one
    of them silently (``--iterations 3 -S iterations=-1`` ran 3 iterations, unchecked)."""
    if value is None:
        return overrides
    # Of several -S settings of one key the last wins, so the flag must agree with that one.
    given = [setting for given_key, setting in overrides if given_key == key]
    if given and given[-1] != value:
        raise ConfigError(f"{flag} {shown(value, 40)} and -S {key}={shown(given[-1], 40)} disagree; {flag} is "
                          f"short for -S {key}=..., so give one of them")
    return [*overrides, (key, value)]


def one_value_each(args: argparse.Namespace) -> None:
    """argparse (3.11) reads ``--opt=--`` as an empty list of values; every option here takes one."""
    for name, value in vars(args).items():
        if isinstance(value, list) and name != "overrides":
            raise ConfigError(f"--{name.replace('_', '-')} needs a value")


def _profile_list(text: str | None) -> list[str] | None:
    """``--also-profile``: None is the default choice; ``none`` re-costs under no other profile."""
    if text is None:
        return None
    if text.strip() == "none":
        return []
    return _name_list(text, "--also-profile", DEVICE_PROFILES)


def _count(value: int, flag: str, least: int, why: str = "") -> int:
    if not least <= value <= MAX_COUNT:
        raise ConfigError(f"{flag} ({value}) must be from {least} to {MAX_COUNT}{why}")
    return value


def output_path(text: str, flag: str, directory: bool, kind: str | None = None) -> Path:
    """``--out`` resolved and checked before any work: a path that cannot name a place (``~nosuchuser``,
    too long), a file where a directory goes (or the reverse), or a file on the way is one line."""
    kind = kind or ("directory" if directory else "JSON file")
    try:
        out = Path(text).expanduser().resolve()
        exists, is_dir = out.exists(), out.is_dir()
        blocker = next(parent for parent in out.parents if parent.exists())
        blocked = not blocker.is_dir()
    except (OSError, RuntimeError, ValueError) as error:  # ~nosuchuser, ENAMETOOLONG, an embedded NUL
        raise ConfigError(f"{flag} {text!r} is not a usable path ({error}); give a {kind} path") from None
    if exists and is_dir != directory:
        raise ConfigError(f"{flag} {out} is a {'file, not a directory' if directory else 'directory'}; "
                          f"give a {kind} path")
    if blocked:
        raise ConfigError(f"{flag} {out}: {blocker} is a file, so nothing can be written under it")
    return out


def _resolve(preset: str, family: str, overrides: list[tuple]):
    return resolve_config(preset, family, overrides)


def _check_backends_available(backends: list[str]) -> None:
    """A backend this machine cannot run (te-nvfp4 off Blackwell) stops before any sampling."""
    for backend in backends:
        try:
            build_explorer(torch.nn.Sequential(), backend, [], 0)
        except RuntimeError as error:
            raise ConfigError(str(error)) from None


def command_fidelity(args: argparse.Namespace) -> int:
    one_value_each(args)
    steps = _int_list(args.explore_steps, "--explore-steps")
    backends = _name_list(args.backend, "--backend", BACKENDS)
    _count(args.prompts, "--prompts", 1)
    _count(args.pool, "--pool", 2, ": a ranking needs two seeds")
    keep = min(24, args.pool - args.pool % 2) if args.keep is None else _count(args.keep, "--keep", 2)
    if keep % 2 or keep > args.pool:
        raise ConfigError(f"--keep ({keep}) must be even and at most --pool ({args.pool})")
    schedules = _schedules(args.adaptive, args.pool, keep, steps)
    out = output_path(args.out, "--out", directory=False)
    overrides = [parse_override(text) for text in args.overrides]
    config = _resolve(args.preset, "sol_rl", overrides)
    _check_backends_available(backends)
    plan = FidelityPlan(prompts=args.prompts, pool=args.pool, explore_steps=tuple(steps), backends=tuple(backends),
                        schedules=schedules, keep=keep)
    try:
        report = run_fidelity(config, plan, out=out)
    except ModelFilesMissing as missing:
        raise ConfigError(str(missing)) from None
    plot_fidelity(report, out.with_suffix(".png"))
    print(f"full precision ({report['full_precision']['steps']} steps): mean reward "
          f"{report['full_precision']['reward_mean']:.4f}")
    for result in report["results"]:
        cost = result.get("cost", {}).get("B200-measured")
        speed = f"  speed-up {cost['speedup_vs_naive_scaling']:.2f}x (B200-measured)" if cost else ""
        print(f"{result['backend']:15s} {result['explore_steps']:2d} steps {result.get('schedule', 'fixed'):>12s}  "
              f"{format_result(result)}{speed}")
    print(f"wrote {out} and {out.with_suffix('.png')} in {report['seconds']:.0f}s")
    return 0


def _schedules(text: str | None, pool: int, keep: int, steps: list[int]) -> tuple:
    """``--adaptive``: schedules that fit --pool and --keep at one of --explore-steps at least."""
    if text is None:
        return ()
    try:
        schedules = parse_schedules(text)
    except ValueError as error:
        raise ConfigError(f"--adaptive: {error}") from None
    for schedule in schedules:
        problems = [schedule_problem(*schedule, pool, keep, count) for count in steps]
        if all(problems):
            raise ConfigError(f"--adaptive {','.join(f'{a}:{b}' for a, b in zip(*schedule))}: {problems[-1]}")
    return schedules


def command_compare(args: argparse.Namespace) -> int:
    one_value_each(args)
    out = output_path(args.out, "--out", directory=True)
    fraction = args.speedup_fraction
    if fraction is not None and not (math.isfinite(fraction) and 0 < fraction < 1):
        raise ConfigError(f"--speedup-fraction ({fraction}) must be a share between 0 and 1, e.g. 0.5")
    if args.restate:
        return _restate(out, fraction)
    if args.readme_only:
        if not out.is_dir():
            raise ConfigError(f"--out {out} does not exist; run the comparison first")
        if not any(any(out.glob(pattern)) for pattern in REPORTS):
            raise ConfigError(f"--out {out} holds none of {', '.join(REPORTS)}; run the comparison first")
        # deferred: peft and transformers at import time (start-up of every solrl command)
        from solrl_core.report_readme import write_readme

        print(f"wrote {write_readme(out)}")
        return 0
    budget = args.budget_gpu_hours
    if budget is None or not math.isfinite(budget) or budget <= 0:
        raise ConfigError(f"--budget-gpu-hours ({budget}) must be a positive number, e.g. 2e-5")
    _count(args.evaluations, "--evaluations", 1)
    seeds = run_seed_list(args.seeds)
    also_profiles = _profile_list(args.also_profile)
    overrides = with_flag([parse_override(text) for text in args.overrides], "--device", "accounting.device",
                          args.device)
    if args.ablation is not None:
        if args.ablation not in ABLATIONS:
            raise ConfigError(f"unknown --ablation '{args.ablation}'; allowed: {', '.join(ABLATIONS)}")
        variants = {variant_name(args.ablation, point): _resolve(args.preset, ABLATION_FAMILY,
                                                                 overrides + ablation_overrides(args.ablation, point))
                    for point in ablation_points(args.ablation)}
    else:
        variants = {family: _resolve(args.preset, family, overrides)
                    for family in _name_list(args.families, "--families", FAMILIES)}
    check_also_profiles(variants, also_profiles)  # a profile that cannot cost an explorer stops here
    command = _command_line(args)
    # Imported once the arguments are known to be good: in a fresh process the training stack's
    # imports (torchao) print warnings, which must not precede a one-line error.
    # deferred: peft and transformers at import time (start-up of every solrl command)
    from solrl_core.compare import run_comparison
    from solrl_core.report_readme import write_readme

    try:
        report = run_comparison(variants, budget, out, evaluations=args.evaluations, command=command, seeds=seeds,
                                also_profiles=also_profiles, speedup_fraction=fraction or 0.5)
    except ModelFilesMissing as missing:
        raise ConfigError(str(missing)) from None
    except FileExistsError as error:
        raise ConfigError(str(error)) from None
    except ConfigError:
        raise
    except Exception as failure:  # noqa: BLE001 - a run failing part way: one line, and how to go on
        raise _comparison_failed(failure) from None
    print((out / "compare.md").read_text(encoding="utf-8"), end="")
    from solrl_core.compare import ADAPTIVE, BASELINE, CANDIDATE  # deferred: peft at import time (as above)

    for name in (CANDIDATE, ADAPTIVE):
        for profile, entry in report.get("speedups_by_family", {}).get(name, {}).items():
            if entry["speedup"] is not None:
                interval = (f", 95% interval [{_times(entry['ci'][0])}, {_times(entry['ci'][1])}]"
                            if entry["ci"] is not None else "")
                print(f"speed-up to equal reward ({name} vs {BASELINE}, {profile}): {entry['speedup']:.2f}x{interval}")
    print(f"wrote {out / 'compare.json'}, compare.png, compare.md, samples_grid.png; {write_readme(out)}")
    return 0


def _restate(out: Path, fraction: float | None) -> int:
    """``--restate``: every comparison report under OUT restated from its own per-seed curves."""
    reports = [path.parent for path in [out / "compare.json", *sorted(out.glob("ablation-*/compare.json"))]
               if path.is_file()]
    if not reports:
        raise ConfigError(f"--out {out} holds no compare.json; run the comparison first")
    # deferred: torch and matplotlib at import time (start-up of every solrl command)
    from solrl_core.compare import write_restated
    from solrl_core.report_readme import write_readme

    for folder in reports:
        try:
            write_restated(folder, fraction)
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"{folder / 'compare.json'} cannot be restated ({type(error).__name__}: {error}); "
                              f"it needs the per-seed curves a comparison writes (families.*.runs)") from None
        print(f"restated {folder / 'compare.json'} and compare.md")
    print(f"wrote {write_readme(out)}")
    return 0


def _comparison_failed(failure: Exception) -> Exception:
    """A run of the comparison failed: one line (the full traceback with SOLRL_TRACEBACK=1) saying
    that the same command goes on from there, reusing finished runs and resuming the stopped one."""
    if os.environ.get("SOLRL_TRACEBACK"):
        traceback.print_exception(failure)
    what = f"{type(failure).__name__}: {failure}".splitlines()[0]
    return RunFailed(f"compare failed: {what}; run the same command again: finished runs are reused and a "
                     f"stopped one resumes from its last checkpoint")


def _times(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.2f}x"


def _command_line(args: argparse.Namespace) -> str:
    """The comparison's command, recorded in compare.json so the report says how to rebuild it."""
    parts = ["solrl", "compare", "--preset", args.preset, "--budget-gpu-hours", f"{args.budget_gpu_hours:g}"]
    parts += ["--ablation", args.ablation] if args.ablation else ["--families", args.families]
    parts += ["--device", args.device] if args.device else []
    parts += ["--evaluations", str(args.evaluations)]
    parts += ["--seeds", args.seeds] if args.seeds is not None else []
    parts += ["--also-profile", args.also_profile] if args.also_profile is not None else []
    parts += ["--out", args.out]
    for text in args.overrides:
        parts += ["-S", text]
    return " ".join(shlex.quote(part) for part in parts)


def command_study(args: argparse.Namespace) -> int:
    """A stage of the DVC study; FileExistsError (a run folder in the way), FileNotFoundError (a
    comparison without its runs) and missing model files are user errors, one line."""
    # deferred: torch and diffusers at import time (start-up of every solrl command)
    from solrl_core.study import ablation_dir, compare_study, load_study, run_one
    from solrl_core.study_base import make_base

    one_value_each(args)
    study = load_study(Path(args.params))
    if args.stage == "power":
        return _study_power(study, args)
    try:
        if args.stage == "base":
            make_base(study, overwrite_packaged=args.overwrite_packaged)
            return 0
        root = Path(args.root)
        if args.stage == "compare":
            compare_study(study, root, args.ablation, command=_study_command_line(args))
            print(f"wrote {(ablation_dir(root, args.ablation) if args.ablation else root) / 'compare.json'}")
            return 0
        if (args.family is None) == (args.ablation is None) or (args.ablation is None) != (args.point is None):
            raise ConfigError("study run: give --family F, or --ablation A with --point P")
        print(f"wrote {run_one(study, root, args.seed, args.family, args.ablation, args.point)}")
    except (FileExistsError, FileNotFoundError, ModelFilesMissing) as error:
        raise ConfigError(str(error.args[0] if error.args else error)) from None
    return 0


# A comparison report holds every seed's curve and the statistics: megabytes at most.
PILOT_BYTES = 256 * 1024 * 1024


def _study_power(study, args: argparse.Namespace) -> int:
    """``solrl study power``: the planned study's pairs (as its comparison will print them) against
    a pilot's spreads; one table, nothing written."""
    from solrl_core.compare import BASELINE, statistic_pairs  # deferred: torch at import time
    from solrl_core.compare_stats import planned_power
    from solrl_core.safe_input import read_text
    from solrl_core.study import family_of

    differences = []
    for text in args.differences.split(","):
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"--differences: {shown(text, 20)} is not a positive number; give e.g. 0.01,0.02")
        differences.append(value)
    try:
        pilot = json.loads(read_text(Path(args.pilot), f"--pilot {args.pilot}", limit=PILOT_BYTES))
    except json.JSONDecodeError as error:
        raise ConfigError(f"--pilot {args.pilot}: not JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(pilot, dict) or not isinstance(pilot.get("families"), dict) or not all(
            isinstance(entry, dict) and isinstance(entry.get("runs"), list) for entry in pilot["families"].values()):
        raise ConfigError(f"--pilot {args.pilot} is not a comparison report (compare.json with families.*.runs)")
    families = {name: family_of(study, name) for name in study.families}
    pairs = statistic_pairs(families)
    comparisons = len(pairs) + sum(name != BASELINE for name in families) * (BASELINE in families)
    result = planned_power(pilot, pairs, len(study.seeds), max(1, comparisons), differences)
    if not result["pairs"]:
        raise ConfigError(f"--pilot {args.pilot} has no pair of the planned study with >= 2 seeds on both sides")
    heads = [f"seeds for {d:g}" for d in differences]
    print(f"{args.params}: {len(study.seeds)} seeds a family, {result['comparisons']} primary claims (Holm); "
          f"spreads from {args.pilot}; 80% power, two-sided 5%")
    print("| pair | pilot seed SD | smallest resolvable | corrected | " + " | ".join(heads) + " | "
          + " | ".join(f"{h} (corrected)" for h in heads) + " |")
    print("|---|---|---|---|" + "---|" * (2 * len(heads)))
    for pair, row in result["pairs"].items():
        cells = [row["seeds_needed"][f"{d:g}"] for d in differences] + \
                [row["seeds_needed_corrected"][f"{d:g}"] for d in differences]
        print(f"| {pair} | {row['sd']:.4f} | {row['smallest_resolvable']:.4f} | "
              f"{row['smallest_resolvable_corrected']:.4f} | " + " | ".join("> 10000" if c is None else str(c)
                                                                           for c in cells) + " |")
    if result["not_in_pilot"]:
        print("not in the pilot (or one seed): " + ", ".join(result["not_in_pilot"]))
    return 0


def _study_command_line(args: argparse.Namespace) -> str:
    """The comparison stage's command, recorded in compare.json."""
    parts = ["solrl", "study", args.stage, "--root", args.root, "--params", args.params]
    parts += ["--ablation", args.ablation] if args.ablation else []
    return " ".join(shlex.quote(part) for part in parts)


def command_sweep(args: argparse.Namespace, runners=None) -> int:
    """The sweep flow (flows/sweep.py), passed in by the `solrl` console script as ``runners.sweep``:
    the arguments are checked here, before Prefect starts."""
    one_value_each(args)
    _count(args.devices, "--devices", 1)
    if not math.isfinite(args.budget_gpu_hours) or args.budget_gpu_hours <= 0:
        raise ConfigError(f"--budget-gpu-hours ({args.budget_gpu_hours}) must be a positive number, e.g. 2")
    if args.preset not in PRESETS:
        raise ConfigError(f"unknown --preset {shown(args.preset, 40)}; allowed: {', '.join(PRESETS)}")
    if args.ablation is not None and args.ablation not in ABLATIONS:
        raise ConfigError(f"unknown --ablation {shown(args.ablation, 40)}; allowed: {', '.join(ABLATIONS)}")
    families = None if args.families is None else _name_list(args.families, "--families", FAMILIES)
    _count(args.evaluations, "--evaluations", 1)
    if not math.isfinite(args.poll_seconds) or args.poll_seconds <= 0:
        raise ConfigError(f"--poll-seconds ({args.poll_seconds}) must be a positive number of seconds")
    if runners is None or getattr(runners, "sweep", None) is None:
        raise UserError("solrl sweep runs a Prefect flow, which solrl_core.cli cannot start on its own: "
                        "use the `solrl` command (or python -m flows.cli sweep ...)")
    try:
        result = runners.sweep(budget_gpu_hours=args.budget_gpu_hours, devices=args.devices, out=args.out,
                               preset=args.preset, families=families, ablation=args.ablation,
                               seeds=run_seed_list(args.seeds), evaluations=args.evaluations,
                               overrides=list(args.overrides), deployment=args.deployment,
                               poll_seconds=args.poll_seconds)
    except (KeyError, FileExistsError) as error:  # an unknown deployment, a run folder in the way
        raise ConfigError(str(error.args[0] if error.args else error)) from None
    except RuntimeError as failure:  # some runs did not complete: running it again resumes them
        raise RunFailed(str(failure)) from None
    print(json.dumps(result))
    return 0


STUDY_COMMANDS = {"fidelity": command_fidelity, "compare": command_compare, "study": command_study,
                  "sweep": command_sweep}
