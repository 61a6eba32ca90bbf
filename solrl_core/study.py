"""The DVC study (dvc.yaml, params.yaml): what its stages' `solrl study` commands do.

params.yaml describes the whole study: the settings every run shares, each family's own, the run
seeds, the budget, the points of the paper's two ablations, and the base file the run stages
depend on. Each stage names one piece of it:

    solrl study base --params params.yaml                          # base
    solrl study run --root R --family sol_rl --seed 0              # train@sol_rl-0
    solrl study run --root R --ablation pool --point 48 --seed 0   # pool@48-0
    solrl study compare --root R                                   # compare
    solrl study compare --root R --ablation pool                   # ablation@pool

The base stage makes what every run starts from (solrl_core.study_base): for the embedded world it
pretrains the checkpoint ``base`` names; for a real model it checks that the model's local files
are there and writes ``base``, a manifest of them, which the run stages depend on instead of a
model folder of tens of GB.

A run stage trains one (family or ablation point, seed) to its budget (compare.budget_gpu_hours,
or the ablation's own budget_gpu_hours), sized exactly as `solrl compare` sizes it, and writes its
own run folder and nothing else:

    R/runs/<family>/seed-<s>/                               a family's run
    R/ablation-<name>/runs/<name>=<point>/seed-<s>/         an ablation point's run (sol_rl, one key varied)

A comparison stage reads the runs params.yaml names (a folder left by an earlier choice of
families, seeds or points is not read) and writes compare.json, .md, .png, samples_grid.png and
compare_metrics.json into R (families) or R/ablation-<name> (one ablation). No Prefect: the run
folders are the record. Each run is also logged to MLflow (params.yaml's tracking section): one
experiment for the study, a run per (variant, seed) tagged with its family, variant, seed and
ablation point, so `make mlflow-ui` plots the sweep against modeled GPU-hours; a run stopped by
Ctrl-C or SIGTERM is KILLED there, one that failed FAILED. The store is MLFLOW_TRACKING_URI, else
./mlflow.db (where `dvc repro` runs: the project folder). Bad params are one ConfigError line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from solrl_core import interrupts
from solrl_core.ablations import ABLATION_FAMILY, ABLATION_KEYS, variant_name
from solrl_core.config import ConfigError, parse_override, shown
from solrl_core.presets import FAMILIES, resolve_config
from solrl_core.safe_input import load_yaml, path_component

# params.yaml's keys; the fidelity stage passes its own section to `solrl fidelity` itself.
STUDY_KEYS = ("preset", "base", "settings", "families", "seeds", "compare", "ablations", "fidelity", "tracking")
TRACKING_KEYS = ("experiment", "enabled")


@dataclass(frozen=True)
class Study:
    preset: str
    settings: dict[str, Any]  # config keys every run shares
    # entry name -> its own config keys; an entry is a family of FAMILIES, or a variant of one
    # (its own name, with `family:` naming the family it varies: a sol_rl with an FP8 explorer)
    families: dict[str, dict[str, Any]]
    seeds: list[int]
    budget_gpu_hours: float
    evaluations: int
    device: str
    # ablation -> {"points": [...], "seeds": [...], "budget_gpu_hours": its runs' budget}
    ablations: dict[str, dict[str, Any]]
    # The MLflow experiment every run of the study logs to; None: the study is not tracked.
    experiment: str | None = None
    # The file the base stage writes and every run stage depends on (solrl_core.study_base): the
    # embedded world's checkpoint, or a real model's manifest; None: not named (older params).
    base: str | None = None
    # The share of the baseline's mean gain the speed-up is read at (its verdict), declared with
    # the study before any run: on the rise, below the baseline's plateau (solrl_core/speedup.py).
    speedup_fraction: float = 0.5

    def budget_of(self, ablation: str | None = None) -> float:
        """The modeled budget a run trains to: the comparison's, or an ablation's own."""
        return self.budget_gpu_hours if ablation is None else self.ablations[ablation]["budget_gpu_hours"]


def load_study(path: Path) -> Study:
    """params.yaml as a Study, every section checked; a problem is one ConfigError naming the key."""
    # Bounded in size and depth, strictly UTF-8: a binary or absurd file is one line naming it.
    params = load_yaml(path)
    where = path.name
    params = _mapping(params, where)
    unknown = [key for key in params if key not in STUDY_KEYS]
    if unknown:
        raise ConfigError(f"{where}: unknown key {shown(unknown[0], 40)}; allowed: {', '.join(STUDY_KEYS)} "
                          f"(config keys every run shares go under settings:)")
    compare = _mapping(params.get("compare"), f"{where}: compare")
    budget = _positive(compare.get("budget_gpu_hours"), f"{where}: compare.budget_gpu_hours")
    return Study(preset=path_component(_text(params.get("preset"), f"{where}: preset"), f"{where}: preset"),
                 settings=_mapping(params.get("settings", {}), f"{where}: settings"),
                 families=_families(params.get("families"), where),
                 seeds=_seeds(params.get("seeds"), f"{where}: seeds"),
                 budget_gpu_hours=budget,
                 evaluations=_count(compare.get("evaluations"), f"{where}: compare.evaluations"),
                 device=_text(compare.get("device"), f"{where}: compare.device"),
                 ablations=_ablations(params.get("ablations", {}), where, budget),
                 experiment=_experiment(params.get("tracking", {}), where, params.get("preset")),
                 base=None if params.get("base") is None else _text(params["base"], f"{where}: base"),
                 speedup_fraction=_share(compare.get("speedup_fraction", 0.5), f"{where}: compare.speedup_fraction"))


def _share(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ConfigError(f"{where}: expected a share of the baseline's gain between 0 and 1, got {shown(value, 40)}")
    return float(value)


def _experiment(value: Any, where: str, preset: str) -> str | None:
    """tracking: {experiment: NAME, enabled: true}: the study's MLflow experiment (default
    <preset>-study, apart from the preset's own experiment that single `solrl run`s log to)."""
    tracking = _mapping(value, f"{where}: tracking")
    unknown = [key for key in tracking if key not in TRACKING_KEYS]
    if unknown:
        raise ConfigError(f"{where}: tracking: unknown key {shown(unknown[0], 40)}; allowed: {', '.join(TRACKING_KEYS)}")
    enabled = tracking.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}: tracking.enabled: expected true or false, got {shown(enabled, 40)}")
    experiment = _text(tracking.get("experiment", f"{preset}-study"), f"{where}: tracking.experiment")
    return experiment if enabled else None


def _mapping(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping (key: value lines), got {type(value).__name__}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a name, got {shown(value, 40)}")
    return value


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ConfigError(f"{where}: expected a positive number, got {shown(value, 40)}")
    return float(value)


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected a whole number >= 1, got {shown(value, 40)}")
    return value


def _seeds(value: Any, where: str) -> list[int]:
    if (not isinstance(value, list) or not value
            or any(isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**63 for s in value)):
        raise ConfigError(f"{where}: expected a list of run seeds from 0 to 2**63-1, e.g. [0, 1, 2], "
                          f"got {shown(value, 40)}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{where}: each seed once; a repeated seed would train the same run twice")
    return value


def _families(value: Any, where: str) -> dict[str, dict[str, Any]]:
    families = _mapping(value, f"{where}: families")
    if not families:
        raise ConfigError(f"{where}: families: name at least one of {', '.join(FAMILIES)}")
    for name, settings in families.items():
        # Each entry's name becomes its runs' folder, root/runs/<name>: one safe component.
        path_component(name, f"{where}: families")
        settings = _mapping(settings if settings is not None else {}, f"{where}: families.{name}")
        base = settings.get(VARIANT_OF)
        if base is None and name not in FAMILIES:
            raise ConfigError(f"{where}: families: unknown family {shown(name, 40)}; "
                              f"allowed: {', '.join(FAMILIES)} "
                              f"(or a variant of one: its own name, with {VARIANT_OF}: <family> among its keys)")
        if base is not None and base not in FAMILIES:
            raise ConfigError(f"{where}: families.{name}.{VARIANT_OF}: unknown family {shown(base, 40)}; "
                              f"allowed: {', '.join(FAMILIES)}")
        if base is not None and name in FAMILIES and base != name:
            raise ConfigError(f"{where}: families.{name}: a family's own entry cannot be a variant of "
                              f"{shown(base, 40)}; "
                              f"give the variant a name of its own")
    return {name: settings or {} for name, settings in families.items()}


# The key of a families entry that makes it a variant of a family: the family's settings, then the
# entry's other keys.
VARIANT_OF = "family"


def family_of(study: Study, name: str) -> str:
    """The family an entry of params.yaml's families trains: its own name, or the one it varies."""
    return study.families[name].get(VARIANT_OF, name)


def _ablations(value: Any, where: str, default_budget: float) -> dict[str, dict[str, Any]]:
    """Each ablation's points and seeds, and the budget its runs train to: its own
    ``budget_gpu_hours`` where it names one (an ablation of sol_rl need not run as long as the
    comparison, whose budget is set by when diffusionnft flattens), else the comparison's."""
    ablations = _mapping(value, f"{where}: ablations")
    for name, section in ablations.items():
        if name not in ABLATION_KEYS:
            raise ConfigError(f"{where}: ablations: unknown ablation {shown(name, 40)}; "
                              f"allowed: {', '.join(ABLATION_KEYS)}")
        section = _mapping(section, f"{where}: ablations.{name}")
        points = section.get("points")
        if not isinstance(points, list) or not points or len(set(map(str, points))) != len(points):
            raise ConfigError(f"{where}: ablations.{name}.points: expected a list of distinct values, "
                              f"got {shown(points, 40)}")
        for point in points:  # a point names its runs' folder, ablation-<name>/runs/<name>=<point>
            path_component(str(point) if isinstance(point, (int, float, str)) else point,
                           f"{where}: ablations.{name}.points")
        unknown = [key for key in section if key not in ("points", "seeds", "budget_gpu_hours")]
        if unknown:
            raise ConfigError(f"{where}: ablations.{name}: unknown key {shown(unknown[0], 40)}; "
                              f"allowed: points, seeds, budget_gpu_hours")
        budget = section.get("budget_gpu_hours", default_budget)
        ablations[name] = {"points": points, "seeds": _seeds(section.get("seeds"), f"{where}: ablations.{name}.seeds"),
                           "budget_gpu_hours": _positive(budget, f"{where}: ablations.{name}.budget_gpu_hours")}
    return ablations


# ---------------------------------------------------------------------------------------------
# Configs and folders of the study's runs


def _settings_overrides(settings: dict[str, Any]) -> list[tuple[str, Any]]:
    # DVC's logs are not a terminal: no progress bars in the stages.
    return [("progress", False), *settings.items()]


def _study_config(study: Study, name: str, varied: list[tuple[str, Any]] = ()):
    """preset -> family -> the shared settings -> the entry's own settings -> ``varied``."""
    own = [(key, value) for key, value in study.families[name].items() if key != VARIANT_OF]
    return resolve_config(study.preset, family_of(study, name), [*_settings_overrides(study.settings), *own,
                                                                 *varied, ("accounting.device", study.device)])


def family_config(study: Study, family: str):
    """A family's (or a family variant's) config, as the study sets it."""
    _known(family, study.families, "family", "families")
    return _study_config(study, family)


def ablation_config(study: Study, ablation: str, point: str):
    """An ablation point's config: the ablated family's, as the study sets it, with the ablation's
    one key at ``point``."""
    _known(ablation, study.ablations, "ablation", "ablations")
    _known(point, {str(p): p for p in study.ablations[ablation]["points"]}, f"point of {ablation}",
           f"ablations.{ablation}.points")
    _known(ABLATION_FAMILY, study.families, "family", "families (the ablations vary its settings)")
    return _study_config(study, ABLATION_FAMILY, [parse_override(f"{ABLATION_KEYS[ablation]}={point}")])


def _known(name: str, allowed, what: str, key: str) -> None:
    if name not in allowed:
        raise ConfigError(f"params.yaml has no {what} {name!r} under {key}; it has: {', '.join(map(str, allowed))}")


def ablation_dir(root: Path, ablation: str) -> Path:
    return root / f"ablation-{ablation}"


def variant_dir(root: Path, family: str | None = None, ablation: str | None = None, point: str | None = None) -> Path:
    """The folder of a variant's seed runs (``seed-<s>`` inside), where solrl compare puts them too."""
    if ablation is None:
        return root / "runs" / family
    return ablation_dir(root, ablation) / "runs" / variant_name(ablation, point)


# ---------------------------------------------------------------------------------------------
# The run and comparison stages


def run_one(study: Study, root: Path, seed: int, family: str | None = None, ablation: str | None = None,
            point: str | None = None, log=print) -> Path:
    """Train one (variant, seed) of the study to its budget into its own folder; a finished run of
    the same config there is kept, an interrupted one resumes (as solrl compare does)."""
    if ablation is None:
        config, seeds, name = family_config(study, family), study.seeds, family
    else:
        config, seeds = ablation_config(study, ablation, point), study.ablations[ablation]["seeds"]
        name = variant_name(ablation, point)
    if seed not in seeds:
        raise ConfigError(f"seed {seed} is not one of the study's seeds for {name} ({', '.join(map(str, seeds))})")
    # Imported once the params are known to be good: the training stack's imports print warnings.
    # deferred: torch and diffusers at import time (start-up of the study's checks of its params)
    from solrl_core.compare import plan_seeds, run_variant

    [plan] = plan_seeds(config, variant_dir(root, family, ablation, point), study.budget_of(ablation),
                        study.evaluations, [seed])
    tracker = None if study.experiment is None else _tracker(study, name, seed, ablation, point, log)
    try:
        run_variant(f"{name} seed {seed}", plan, log, observers=[tracker] if tracker else [])
    except BaseException as ended:
        if tracker is not None:  # Ctrl-C or SIGTERM: KILLED, as a stopped `solrl run` is
            tracker.finish("KILLED" if interrupts.is_stop_signal(ended) else "FAILED")
        raise
    return plan["run_dir"]


def _tracker(study: Study, name: str, seed: int, ablation: str | None, point: str | None, log):
    """The MLflow observer of one study run: the study's experiment, the run named and tagged by
    what it is in the study (the tags the UI filters and groups the sweep by)."""
    # deferred: mlflow at import time (start-up of the study's checks of its params)
    from solrl_core.tracking import MlflowObserver

    tags = {"solrl.study": study.experiment, "solrl.variant": name, "solrl.seed": str(seed),
            "solrl.ablation": ablation or "", "solrl.ablation_point": "" if point is None else str(point),
            # `dvc exp run` names its experiment in the stage's environment: which sweep a run belongs to
            "solrl.dvc_experiment": os.environ.get("DVC_EXP_NAME", "")}
    return MlflowObserver(run_name=f"{name} seed {seed}", tags={key: value for key, value in tags.items() if value},
                          log=log, experiment=study.experiment)


def compare_study(study: Study, root: Path, ablation: str | None = None, command: str = "") -> dict:
    """The comparison of the study's families (or of one ablation's points) from their finished runs."""
    # deferred: torch and matplotlib at import time (start-up of the study's checks of its params)
    from solrl_core.compare import compare_finished_runs

    if ablation is None:
        names, seeds, out = list(study.families), study.seeds, root
    else:
        _known(ablation, study.ablations, "ablation", "ablations")
        names = [variant_name(ablation, str(point)) for point in study.ablations[ablation]["points"]]
        seeds, out = study.ablations[ablation]["seeds"], ablation_dir(root, ablation)
    return compare_finished_runs(out / "runs", out, study.budget_of(ablation), command=command, families=names,
                                 seeds=seeds, speedup_fraction=study.speedup_fraction)
