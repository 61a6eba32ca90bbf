"""What moves the held-out gain of ``make run`` (issue 10, item 2): one table of finished runs.

Each argument is a finished run folder (``solrl run --out DIR`` with any ``-S`` overrides). Its
summary.json holds the resolved config and every evaluation. A row's settings are the keys where
that config differs from the reference (the preset and family it ran, as resolved today), so the
table cannot misstate what ran. Runs with the same settings and different seeds are pooled: the
mean gain and its standard error over seeds.

    .venv/bin/python benchmarks/rl_gain.py runs/probe/* --out reports/benchmarks/rl_gain.json

The gain is the held-out reward the run trains on (final evaluation minus the base model's); the
peak is the best evaluation during the run. The untrained held-out rewards (the aesthetic) are
reported beside it, because a gain bought by hacking the trained reward shows up there.

``--terms`` also says what a shapes-compliance gain is made of: each run's base and final
evaluation images are sampled again (the base model, and the final EMA adapter from the run's
lora.safetensors, at the run's own prompts, seeds, sampler and steps) and split into the reward's
terms (background; each object's amount of colour, location and shape). The base images are
sampled once for all runs that share a base model and evaluation. The resampled compliance must
match the one each run recorded, so the split is of the images the run was scored on.

``--wide-eval N`` scores each run's base and final (EMA) policy again on N held-out prompts, at
the run's own seeds per prompt, sampler and steps: a run's evaluation is a few dozen images, so a
gain read from it carries the luck of those images. The run's own evaluation set is the first
prompts and seeds of the wider one (both are prefixes of one deterministic list), and their
resampled means must match the run's record. Each run gets its gain on the wide set with a standard
error over prompts (per-prompt final minus base: the same noises on both sides, so the pairing
removes the prompts' own difficulty), and each setting the mean of its runs' wide gains.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._threads import add_threads_option, use_threads  # noqa: E402
from solrl_core.config import ConfigError, from_dict, to_dict  # noqa: E402
from solrl_core.ledger import SUMMARY_FILE, write_json  # noqa: E402
from solrl_core.presets import resolve_config  # noqa: E402
from solrl_core.seed_stats import mean_se  # noqa: E402
from solrl_core.tracking import base_checkpoint, file_md5, flatten_params  # noqa: E402

# Issue 10's goal for make run: this much gain in the trained reward, at most this aesthetic loss.
GOAL_GAIN, GOAL_UNTRAINED_DROP = 0.10, 0.03
# Keys that name a run rather than change what it learns.
NOT_SETTINGS = ("seed", "progress")
# Resampled compliance against the recorded one. In the committed report every run resampled to
# exactly its record (two of them were made on 2 threads); the bound leaves room for a changed
# float order, while another base model or adapter moves a mean by far more.
RESAMPLE_TOLERANCE = 1e-3
TERMS_OF = {"shapes-compliance": ("background", "amount", "location", "shape")}


def _objects_in_caption(prompt: str) -> str:
    from solrl_core.world.captions import parse_caption

    count = len(parse_caption(prompt).objects)
    return f"{count} object{'s' * (count != 1)}"


# How the wide evaluation splits a world reward's change by prompt. The world's list of distinct
# held-out scenes holds 166 with one object; past about 150 prompts it runs out of them and the
# list turns to two-object scenes (share 0.22 in the first 64, 0.29 in 128, 0.89 in prompts
# 257-512, against 0.3 as scenes are drawn), which the base and RL both draw worse: a split says
# how much of a gain is the mix.
STRATA_OF = {"shapes-compliance": _objects_in_caption}


class BadRun(Exception):
    """A folder that is not a finished run this table can read; the message says which and why."""


def read_run(folder: Path) -> dict:
    path = folder / SUMMARY_FILE
    if not path.is_file():
        raise BadRun(f"{folder}: no {SUMMARY_FILE}; give finished run folders (`solrl run --out DIR`)")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        config, evaluations = summary["config"], summary["evaluations"]
    except (ValueError, KeyError) as error:
        raise BadRun(f"{path}: not a run summary ({error}); rerun the run or leave the folder out") from None
    if not evaluations or evaluations[0].get("iteration") != -1:
        raise BadRun(f"{path}: no base evaluation; the gain needs one (a run from an older version?)")
    return summary


def reference_settings(preset: str, family: str) -> dict[str, str]:
    try:
        return flatten_params(to_dict(resolve_config(preset, family)))
    except ConfigError as error:
        raise BadRun(f"preset {preset!r} / family {family!r} no longer resolve: {error}") from None


def settings_of(config: dict, reference: dict[str, str]) -> dict[str, str]:
    """The dotted keys where a run's config differs from the reference, with the run's values. A
    ``model.path`` that names the very weights the reference loads is no change: a run made on a
    copy of a checkpoint before it was committed trained the committed base."""
    flat = flatten_params(config)
    keys = sorted((set(flat) | set(reference)) - set(NOT_SETTINGS))
    changed = [key for key in keys if flat.get(key) != reference.get(key)]
    if "model.path" in changed and same_weights(config, reference):
        changed.remove("model.path")
    return {key: as_given(flat.get(key, "(unset)")) for key in changed}


def same_weights(config: dict, reference: dict[str, str]) -> bool:
    """Whether the run's and the reference's model.path hold the same bytes, each resolved as the
    tracker resolves the base checkpoint it tags (the embedded world's empty path: its committed
    checkpoint); a path that is not one file compares unequal."""
    models = [config["model"], {"loader": reference["model.loader"], "path": reference["model.path"]}]
    files = [base_checkpoint(from_dict({"model": model})) for model in models]
    if not all(file is not None and file.is_file() for file in files):
        return False
    return len({checkpoint_md5(file) for file in files}) == 1


@functools.cache
def checkpoint_md5(file: Path) -> str:
    """Each checkpoint is hashed once per report, however many runs name it."""
    return file_md5(file)


def as_given(value: str) -> str:
    """A path inside the working directory as a user would type it there (runs resolve paths to
    absolute ones; a report should not carry this machine's folders)."""
    path = Path(value)
    if path.is_absolute() and path.is_relative_to(Path.cwd()):
        return str(path.relative_to(Path.cwd()))
    return value


def run_row(folder: Path, summary: dict, reference: dict[str, str]) -> dict:
    config = summary["config"]
    trained = list(config["rewards"])[0]
    untrained = [name for name in config["eval"]["rewards"] if name not in config["rewards"]]
    evaluations = summary["evaluations"]
    base, final = evaluations[0], evaluations[-1]
    peak = max(evaluations[1:] or evaluations, key=lambda e: e[trained])
    return {
        "run": str(folder), "family": config["family"], "seed": config["seed"], "iterations": config["iterations"],
        "settings": settings_of(config, reference),
        "seconds": summary.get("seconds"), "threads": summary.get("threads"),
        "trained_reward": trained, "untrained_rewards": untrained,
        "base": {name: base[name] for name in [trained, *untrained]},
        "final": {name: final[name] for name in [trained, *untrained]},
        "gain": final[trained] - base[trained],
        "peak_gain": peak[trained] - base[trained], "peak_iteration": peak["iteration"],
        "untrained_change": {name: final[name] - base[name] for name in untrained},
        "evaluations": evaluations,
    }


# What the base model's evaluation images depend on: runs that agree on these sections share them.
BASE_IMAGE_SECTIONS = ("model", "sampler", "eval", "prompts", "rewards")


def base_images_key(config: dict) -> str:
    return json.dumps({section: config[section] for section in BASE_IMAGE_SECTIONS}, sort_keys=True)


def compliance_terms_of_run(folder: Path, summary: dict,
                            base_terms: dict[str, dict[str, float]] | None = None) -> dict[str, dict[str, float]] | None:
    """{term: {"base", "final"}} means of the run's evaluation images, resampled (module doc);
    None when the run trained a reward without terms.

    ``base_terms`` carries the base side between runs (keyed by ``base_images_key``): runs of one
    base model and evaluation sample the same base images, so they are sampled once. Each run's
    own record is still checked against them."""
    trained = list(summary["config"]["rewards"])[0]
    if trained not in TERMS_OF:
        return None
    adapters = _final_adapters(folder, "--terms")
    from solrl_core.world.rewards import compliance_terms

    state = _resampling_state(summary)
    prompts = [p for p in state.eval_prompts for _ in range(state.config.eval.seeds_per_prompt)]
    sides = _resampled_sides(adapters, state, {} if base_terms is None else base_terms,
                             base_images_key(summary["config"]),
                             lambda images: {name: float(values.mean())
                                             for name, values in compliance_terms(images, prompts).items()})
    for side, recorded in zip(sides, (summary["evaluations"][0], summary["evaluations"][-1])):
        if abs(sides[side]["compliance"] - recorded[trained]) > RESAMPLE_TOLERANCE:
            raise BadRun(f"{folder}: its {side} images resampled score {trained} {sides[side]['compliance']:.4f}, "
                         f"the run recorded {recorded[trained]:.4f}; it was made by other code or another base model")
    return {name: {"base": sides["base"][name], "final": sides["final"][name]}
            for name in ("compliance", *TERMS_OF[trained])}


def _resampling_state(summary: dict, eval_prompts: int | None = None):
    """The run's base model, prompts, seeds and evaluation as it ran them (``eval_prompts``: as many
    held-out prompts instead), ready for ``stages.evaluate``."""
    from solrl_core import stages
    from solrl_core.config import Config, apply_mapping

    config = Config()
    apply_mapping(config, summary["config"])
    if eval_prompts is not None:
        config.eval.prompts = eval_prompts
    try:
        return stages.initial_state(config)
    except ValueError as error:  # e.g. more held-out prompts than the prompt source holds
        raise BadRun(f"cannot evaluate on {config.eval.prompts} held-out prompts: {error}") from None


def _final_adapters(folder: Path, option: str) -> Path:
    """The run's saved adapters (its final EMA among them), checked before any image is sampled."""
    adapters = folder / "lora.safetensors"
    if not adapters.is_file():
        raise BadRun(f"{folder}: no lora.safetensors, so its final images cannot be resampled; leave out {option}")
    return adapters


def _resampled_sides(adapters: Path, state, base_cache: dict, key: str, measure) -> dict:
    """{"base", "final"}: ``measure`` of the images of the run's base model and of its final EMA
    adapter on ``state``'s evaluation. Runs that share a base model and evaluation (``key``) share
    the base side through ``base_cache``, so it is sampled once; each caller still checks it
    against its own run's record."""
    from solrl_core import stages
    from solrl_core.checkpoint import CheckpointError, load_verified
    from solrl_core.models.adapters import EMA, load_adapter_state

    sides = {}
    for side, adapter in (("base", None), ("final", EMA)):
        if side == "base" and key in base_cache:
            sides[side] = base_cache[key]
            continue
        if adapter is not None:
            try:  # the digest the run recorded: a damaged file is named, never sampled
                tensors, _ = load_verified(adapters, "adapter file")
            except CheckpointError as error:
                raise BadRun(str(error)) from None
            load_adapter_state(state.policy.transformer, tensors)
        _, images = stages.evaluate(state, adapter)
        sides[side] = measure(images)
    base_cache[key] = sides["base"]
    return sides


def wide_evaluation_of_run(folder: Path, summary: dict, prompts: int,
                           base_scores: dict[str, dict] | None = None) -> dict:
    """The run's gain on ``prompts`` held-out prompts (module doc): {"prompts", "samples", "base",
    "final", "change": {reward: {"mean", "se"}}}, standard errors over prompts.

    ``base_scores`` carries the base model's per-image rewards between runs that share them
    (``base_images_key`` of the widened config)."""
    config = summary["config"]
    trained = list(config["rewards"])[0]
    recorded_samples = config["eval"]["prompts"] * config["eval"]["seeds_per_prompt"]
    if prompts < config["eval"]["prompts"]:
        raise BadRun(f"--wide-eval {prompts} is fewer held-out prompts than {folder} was evaluated on "
                     f"({config['eval']['prompts']}); give at least that many")
    adapters = _final_adapters(folder, "--wide-eval")
    state = _resampling_state(summary, prompts)
    names = list(dict.fromkeys([trained, *config["eval"]["rewards"]]))
    prompt_list = [p for p in state.eval_prompts for _ in range(state.config.eval.seeds_per_prompt)]
    scores = _resampled_sides(adapters, state, {} if base_scores is None else base_scores,
                              base_images_key(to_dict(state.config)),
                              lambda images: state.rewards.score(images, prompt_list, names).per_reward)
    for side, recorded in zip(scores, (summary["evaluations"][0], summary["evaluations"][-1])):
        own = float(scores[side][trained][:recorded_samples].double().mean())
        if abs(own - recorded[trained]) > RESAMPLE_TOLERANCE:
            raise BadRun(f"{folder}: its {side} evaluation resampled within the wide set scores {trained} {own:.4f}, "
                         f"the run recorded {recorded[trained]:.4f}; it was made by other code or another base model")
    change = {}
    for name in names:
        mean, se = mean_se(per_prompt_means(scores["final"][name] - scores["base"][name], prompts))
        change[name] = {"mean": mean, "se": se}
    wide = {"prompts": prompts, "samples": prompts * state.config.eval.seeds_per_prompt,
            "base": {name: float(scores["base"][name].double().mean()) for name in names},
            "final": {name: float(scores["final"][name].double().mean()) for name in names},
            "change": change}
    if trained in STRATA_OF:
        wide["change_by_stratum"] = change_by_stratum(
            scores["final"][trained] - scores["base"][trained], state.eval_prompts, STRATA_OF[trained])
    return wide


def per_prompt_means(differences, prompts: int) -> list[float]:
    """Per-image values (prompt-major, as evaluated: each prompt's seeds together) averaged per prompt."""
    return differences.double().reshape(prompts, -1).mean(1).tolist()


def change_by_stratum(differences, prompts: list[str], stratum_of) -> dict[str, dict]:
    """Per-image final-minus-base differences (prompt-major, as evaluated) grouped by each prompt's
    stratum: {stratum: {"prompts", "mean", "se"}}, standard errors over that stratum's prompts."""
    per_prompt = per_prompt_means(differences, len(prompts))
    groups: dict[str, list[float]] = {}
    for prompt, difference in zip(prompts, per_prompt):
        groups.setdefault(stratum_of(prompt), []).append(difference)
    return {name: dict(zip(("prompts", "mean", "se"), (len(values), *mean_se(values))))
            for name, values in sorted(groups.items())}


def label(settings: dict[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in settings.items()) or "the preset as it is"


def pool_by_settings(rows: list[dict]) -> list[dict]:
    """One entry per family and distinct settings, its seeds pooled; best mean gain first. Settings
    are a run's differences from its own family, so two families' runs with the same differences
    are different runs and never pooled."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["family"], label(row["settings"])), []).append(row)
    pooled = []
    for (family, name), members in groups.items():
        members = sorted(members, key=lambda m: m["seed"])  # seeds and runs listed in the same order
        gain, gain_se = mean_se([m["gain"] for m in members])
        peak, _ = mean_se([m["peak_gain"] for m in members])
        untrained = {key: mean_se([m["untrained_change"][key] for m in members])[0]
                     for key in members[0]["untrained_change"]}
        terms = members[0].get("terms")
        term_change = None if terms is None else {
            key: mean_se([m["terms"][key]["final"] - m["terms"][key]["base"] for m in members])[0] for key in terms}
        wide = [m["wide"] for m in members if m.get("wide") is not None]
        wide_gain = None if not wide else dict(zip(("mean", "se"), mean_se([w["change"][m["trained_reward"]]["mean"]
                                                                          for w, m in zip(wide, members)])))
        pooled.append({
            "family": family, "settings": name, "seeds": [m["seed"] for m in members],
            "iterations": members[0]["iterations"],
            "gain_mean": gain, "gain_se": gain_se, "peak_gain_mean": peak, "untrained_change_mean": untrained,
            "term_change_mean": term_change,
            "wide_gain": wide_gain,
            "meets_goal": gain >= GOAL_GAIN and all(change >= -GOAL_UNTRAINED_DROP for change in untrained.values()),
            "runs": [m["run"] for m in members],
        })
    return sorted(pooled, key=lambda entry: -entry["gain_mean"])


def build_report(folders: list[Path], terms: bool = False, wide_eval: int | None = None) -> dict:
    summaries = [(folder, read_run(folder)) for folder in folders]
    references: dict[tuple[str, str], dict[str, str]] = {}
    rows = []
    base_terms: dict[str, dict[str, float]] = {}
    base_scores: dict[str, dict] = {}
    for folder, summary in summaries:
        key = (summary["config"]["preset"], summary["config"]["family"])
        if key not in references:
            references[key] = reference_settings(*key)
        row = run_row(folder, summary, references[key])
        if terms:
            row["terms"] = compliance_terms_of_run(folder, summary, base_terms)
        if wide_eval is not None:
            row["wide"] = wide_evaluation_of_run(folder, summary, wide_eval, base_scores)
        rows.append(row)
    return {
        "reference": [{"preset": preset, "family": family} for preset, family in references],
        "goal": {"gain": GOAL_GAIN, "untrained_drop_at_most": GOAL_UNTRAINED_DROP},
        "settings": pool_by_settings(rows),
        "runs": rows,
    }


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of prompts of at least 1")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    parser.add_argument("--out", type=Path, default=Path("reports/benchmarks/rl_gain.json"))
    parser.add_argument("--terms", action="store_true",
                        help="also split each run's compliance gain into the reward's terms (resamples its images)")
    parser.add_argument("--wide-eval", type=positive_int, metavar="PROMPTS",
                        help="also score each run's base and final policy on this many held-out prompts (module doc)")
    add_threads_option(parser)
    args = parser.parse_args(argv)
    use_threads(args)
    try:
        report = build_report(args.runs, terms=args.terms, wide_eval=args.wide_eval)
    except BadRun as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    write_json(args.out, report)
    for entry in report["settings"]:
        se = f" ± {entry['gain_se']:.4f}" if entry["gain_se"] is not None else ""
        untrained = ", ".join(f"{k} {v:+.4f}" for k, v in entry["untrained_change_mean"].items())
        made_of = "".join(f"; {k} {v:+.4f}" for k, v in (entry["term_change_mean"] or {}).items() if k != "compliance")
        print(f"{entry['gain_mean']:+.4f}{se} (peak {entry['peak_gain_mean']:+.4f}; {untrained}{made_of}; seeds "
              f"{entry['seeds']}): {entry['family']}, {entry['settings']}")
    for row in report["runs"]:
        if row.get("wide") is not None:
            wide = row["wide"]
            changes = ", ".join(f"{name} {c['mean']:+.4f} ± {c['se']:.4f}" for name, c in wide["change"].items())
            strata = "".join(f"; {name} ({c['prompts']} prompts) {c['mean']:+.4f}"
                             for name, c in wide.get("change_by_stratum", {}).items())
            print(f"on {wide['prompts']} held-out prompts ({wide['samples']} images): {changes} "
                  f"(SE over prompts){strata}: {row['family']} seed {row['seed']}, {row['run']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
