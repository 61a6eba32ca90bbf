"""The DVC study's params (solrl_core/study.py, `solrl study`): params.yaml is the whole study (five families and
sol_rl with the FP8 explorer x three seeds, the paper's ablation points, each run a valid config),
params-ci.yaml the same study reduced, bad params stop a stage with one line and exit code 2,
writing nothing, and a family variant trains and is compared as its family with its own keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flows.cli import main as solrl
from solrl_core.ablations import ABLATION_KEYS, ABLATIONS
from solrl_core.config import ConfigError, get_key
from solrl_core.presets import FAMILIES
from solrl_core.study import ablation_config, family_config, family_of, load_study
from tests._services import ROOT


def main(arguments: list[str]) -> int:
    """`solrl study ARGUMENTS`, in this process."""
    return solrl(["study", *arguments])


def test_params_yaml_is_the_whole_study_and_every_run_of_it_resolves():
    study = load_study(ROOT / "params.yaml")
    assert [name for name in study.families if name in FAMILIES] == list(FAMILIES) and len(study.seeds) >= 3
    for name, points in ABLATIONS.items():  # the paper's points, whose HPSv2 the report puts beside
        assert list(map(str, study.ablations[name]["points"])) == list(points)
    configs = {name: family_config(study, name) for name in study.families}
    for name, config in configs.items():
        assert (config.family, config.pool, config.keep) == (family_of(study, name), study.families[name]["pool"],
                                                             study.families[name]["keep"])
    sol_rl = configs["sol_rl"]
    # Equal budgets compare like with like: every family trains on as many images per iteration
    # (prompt groups x kept), whatever its pool (reports/benchmarks/study_shape/ says why 12 kept).
    trained = {(config.prompts_per_iteration, config.keep) for config in configs.values()}
    assert trained == {(sol_rl.prompts_per_iteration, sol_rl.keep)}
    # Item 4 of issue 10: NVFP4 does not rank as the paper's at any width trained here, so the
    # comparison also runs sol_rl with the FP8 explorer, otherwise sol_rl as the study sets it.
    fp8 = family_config(study, "sol_rl_fp8")
    assert fp8.explore.backend == "fp8" and sol_rl.explore.backend == "emulated-nvfp4"
    fp8.explore.backend = sol_rl.explore.backend
    assert fp8 == sol_rl
    for name, section in study.ablations.items():
        for point in section["points"]:
            config = ablation_config(study, name, str(point))
            assert get_key(config, ABLATION_KEYS[name]) == point
            # Everything but the ablation's one key is sol_rl's, as the study sets it.
            assert config.keep == sol_rl.keep and config.family == "sol_rl"


def test_the_ci_study_has_the_same_sections_as_the_full_one():
    full, ci = (yaml.safe_load((ROOT / name).read_text()) for name in ("params.yaml", "params-ci.yaml"))
    assert list(full) == list(ci)
    assert set(full["ablations"]) == set(ci["ablations"]) and set(full["compare"]) == set(ci["compare"])
    assert set(ci["families"]) <= set(full["families"])
    study = load_study(ROOT / "params-ci.yaml")
    for family in study.families:
        family_config(study, family)
    for name, section in study.ablations.items():
        for point in section["points"]:
            ablation_config(study, name, str(point))


def write_params(tmp_path: Path, change) -> Path:
    params = yaml.safe_load((ROOT / "params-ci.yaml").read_text())
    change(params)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.mark.parametrize("change, arguments, message", [
    (lambda p: p.update(iterations=3), ["--family", "sol_rl"], "unknown key 'iterations'"),
    (lambda p: p.update(seeds=[0, 0]), ["--family", "sol_rl"], "each seed once"),
    (lambda p: p["families"].update(grpo={}), ["--family", "sol_rl"], "unknown family 'grpo'"),
    (lambda p: p["families"].update(fast={"family": "grpo"}), ["--family", "sol_rl"], "fast.family: unknown family"),
    (lambda p: p["families"]["sol_rl"].update(family="naive_quant"), ["--family", "sol_rl"], "name of its own"),
    (lambda p: p["families"].update(fast={"family": "sol_rl", "explore": {"backend": "int3"}}),
     ["--family", "fast"], "int3"),
    (lambda p: p["ablations"].update(lr={"points": [1], "seeds": [0]}), ["--family", "sol_rl"], "unknown ablation"),
    (lambda p: p["compare"].update(budget_gpu_hours=-1), ["--family", "sol_rl"], "compare.budget_gpu_hours"),
    (lambda p: p["ablations"]["pool"].update(budget_gpu_hours=0), ["--family", "sol_rl"],
     "ablations.pool.budget_gpu_hours"),
    (lambda p: p["ablations"]["pool"].update(iterations=3), ["--family", "sol_rl"], "ablations.pool: unknown key"),
    (lambda p: p["settings"].update(pool="many"), ["--family", "sol_rl"], "pool"),
    (lambda p: None, ["--family", "naive_quant"], "no family 'naive_quant' under families"),
    (lambda p: None, ["--ablation", "pool", "--point", "96"], "no point of pool '96'"),
    (lambda p: None, ["--family", "sol_rl", "--point", "6"], "--family F, or --ablation A with --point P"),
])
def test_bad_params_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, change, arguments, message):
    params = write_params(tmp_path, change)
    root = tmp_path / "pipeline"
    assert main(["run", "--params", str(params), "--root", str(root), "--seed", "0", *arguments]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error, error
    assert not root.exists()


def test_a_seed_outside_the_study_and_a_comparison_without_its_runs_are_one_line(tmp_path, capsys):
    params = write_params(tmp_path, lambda p: None)
    root = tmp_path / "pipeline"
    assert main(["run", "--params", str(params), "--root", str(root), "--family", "sol_rl", "--seed", "7"]) == 2
    assert "seed 7 is not one of the study's seeds" in capsys.readouterr().err
    assert main(["compare", "--params", str(params), "--root", str(root)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no finished run" in error
    assert not root.exists()


def test_an_ablation_trains_to_its_own_budget_or_else_the_comparisons(tmp_path):
    # The comparison's budget is set by when diffusionnft flattens; an ablation of sol_rl names its
    # own, and its runs and its comparison are sized to it, the families' runs to theirs.
    def budgets(params):
        params["compare"]["budget_gpu_hours"] = 3.0e-9
        params["ablations"]["pool"]["budget_gpu_hours"] = 9.0e-9
        del params["ablations"]["explore-steps"]["budget_gpu_hours"]

    params = write_params(tmp_path, budgets)
    study = load_study(params)
    assert (study.budget_of(), study.budget_of("pool"), study.budget_of("explore-steps")) == (3.0e-9, 9.0e-9, 3.0e-9)
    root = tmp_path / "pipeline"
    assert main(["run", "--params", str(params), "--root", str(root), "--ablation", "pool", "--point", "6",
                 "--seed", "0"]) == 0
    assert main(["compare", "--params", str(params), "--root", str(root), "--ablation", "pool"]) == 0
    report = json.loads((root / "ablation-pool" / "compare.json").read_text())
    assert report["budget_gpu_hours"] == 9.0e-9
    run = report["families"]["pool=6"]
    per_iteration = run["modeled_gpu_hours_per_iteration"]
    # As many whole iterations as fit the ablation's budget: more than the comparison's would allow.
    assert run["iterations"] * per_iteration <= 9.0e-9 < (run["iterations"] + 1) * per_iteration
    assert run["iterations"] > 3.0e-9 // per_iteration


def test_a_family_variant_trains_as_its_family_with_its_own_keys_and_is_compared_against_it(tmp_path):
    def fp8_variant(params):
        params["families"] = {"diffusionnft": params["families"]["diffusionnft"], "sol_rl": params["families"]["sol_rl"],
                              "sol_rl_fp8": {"family": "sol_rl", **params["families"]["sol_rl"],
                                             "explore": {"backend": "fp8"}}}
        params["seeds"] = [0, 1]

    params = write_params(tmp_path, fp8_variant)
    root = tmp_path / "pipeline"
    for name in ("diffusionnft", "sol_rl", "sol_rl_fp8"):
        for seed in ("0", "1"):
            assert main(["run", "--params", str(params), "--root", str(root), "--family", name, "--seed", seed]) == 0
    assert main(["compare", "--params", str(params), "--root", str(root)]) == 0
    report = json.loads((root / "compare.json").read_text())
    assert list(report["families"]) == ["diffusionnft", "sol_rl", "sol_rl_fp8"]
    summary = json.loads((root / "runs" / "sol_rl_fp8" / "seed-0" / "summary.json").read_text())
    assert summary["config"]["family"] == "sol_rl" and summary["config"]["explore"]["backend"] == "fp8"
    # Read against the family it varies, with an interval over the two seeds.
    difference = report["seed_statistics"]["final_differences"]["sol_rl_fp8 - sol_rl"]
    assert difference["ci"] is not None and difference["ci"][0] <= difference["mean"] <= difference["ci"][1]
    assert "sol_rl_fp8 - sol_rl" in report["final_reward_spread"]["paired_differences"]
    # The comparison's page and the report's README say where the variant stands against its family.
    assert "| sol_rl_fp8 - sol_rl |" in (root / "compare.md").read_text()
    assert "| B200 (sized the budget) | sol_rl_fp8 |" in (root / "compare.md").read_text()
    from solrl_core.report_readme import write_readme

    page = write_readme(root).read_text()
    assert f"sol_rl_fp8 - sol_rl {difference['mean']:+.4f}" in page and difference["verdict"] in page


# ---------------------------------------------------------------------------------------------
# params.yaml is untrusted input (issue 45): a name that becomes a folder never leads out of the
# study's root, and a malformed file (deep, binary, huge, an alias bomb) is one line naming it.

@pytest.fixture
def no_training(monkeypatch):
    """A name that slipped through would train (and write where it names): fail instead."""
    import solrl_core.compare

    def refuse(*args, **kwargs):
        raise AssertionError("a run started although its params were invalid")

    monkeypatch.setattr(solrl_core.compare, "run_variant", refuse)


TRAVERSAL_NAMES = ["/tmp/solrl-outside", "../escape", "..", ".", "a/b", "a\\b", "x" * 65, "", "sol rl", "é", 7]


def _variant_named(name):
    def change(params):
        params["families"][name] = {"family": "sol_rl"}
    return change


@pytest.mark.parametrize("name", TRAVERSAL_NAMES, ids=repr)
def test_a_family_name_that_is_not_one_folder_is_one_line_naming_the_key(tmp_path, capsys, no_training, name):
    """Was: root/"runs"/<name> built unchecked; an absolute name or '..' put the run outside --root."""
    params = write_params(tmp_path, _variant_named(name))
    before = sorted(tmp_path.iterdir())
    assert main(["run", "--params", str(params), "--root", str(tmp_path / "pipeline"), "--family", str(name),
                 "--seed", "0"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "families" in error and "not a usable name" in error, error
    assert sorted(tmp_path.iterdir()) == before and not Path("/tmp/solrl-outside").exists()


@pytest.mark.parametrize("point", ["../../escape", "/abs", "..", [1, 2], None], ids=repr)
def test_an_ablation_point_that_is_not_one_folder_is_one_line_naming_the_key(tmp_path, capsys, no_training,
                                                                             point):
    params = write_params(tmp_path, lambda p: p["ablations"]["pool"].update(points=[6, point]))
    before = sorted(tmp_path.iterdir())
    assert main(["run", "--params", str(params), "--root", str(tmp_path / "pipeline"), "--ablation", "pool",
                 "--point", str(point), "--seed", "0"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "ablations.pool.points" in error and "not a usable name" in error, error
    assert sorted(tmp_path.iterdir()) == before


def test_a_preset_name_that_is_not_one_folder_is_refused(tmp_path, capsys, no_training):
    params = write_params(tmp_path, lambda p: p.update(preset="../" * 30 + "shapes-tiny"))
    assert main(["run", "--params", str(params), "--root", str(tmp_path / "r"), "--family", "sol_rl",
                 "--seed", "0"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "preset" in error and len(error) < 300, error


ALIAS_BOMB = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'x'] * 10)}]\n" for i in range(9))


def _write(text: str | bytes):
    def write(path: Path) -> None:
        (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return write


def _sparse(size: int):
    def write(path: Path) -> None:
        with open(path, "wb") as handle:
            handle.truncate(size)
    return write


BAD_FILES = {  # how the file is made, what the one line must say
    "nested_10000_deep": (_write("settings: " + "[" * 10_000 + "]" * 10_000 + "\n"), ["line 1", "nested deeper"]),
    "mapping_nested_deep": (_write("".join(" " * i + "a:\n" for i in range(200))), ["nested deeper"]),
    "binary": (_write(Path("/bin/ls").read_bytes()[:65536]), ["line 1", "not UTF-8"]),
    "latin1_on_line_3": (_write(b"preset: shapes-tiny\nseeds: [0]\nfamilies: {caf\xe9: {}}\n"),
                         ["line 3", "not UTF-8"]),
    "huge_sparse_4gb": (_sparse(4 * 2**30), ["4.0 GiB", "at most"]),
    "just_over_the_bound": (_write("#" * (4 * 2**20) + "\n"), ["at most"]),
    "alias_bomb": (_write(ALIAS_BOMB), ["aliases are expanded"]),
    "alias_loop": (_write("settings: &a {x: *a}\n"), ["loop"]),
    "nul_character": (_write("preset: shapes-tiny\nseeds: [0\x00]\n"), ["line 2", "not allowed"]),
    "integer_of_9000_digits": (_write("seeds: [" + "9" * 9000 + "]\n"), ["number too long"]),
    "python_tag": (_write("settings: !!python/object/apply:os.system [echo hi]\n"), ["line 1", "not valid YAML"]),
    "tab_indent": (_write("settings:\n\tpool: 4\n"), ["line 2", "not valid YAML"]),
    "huge_unknown_key": (_write("? " + "k" * 100_000 + "\n: 1\n"), ["unknown key"]),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_malformed_params_file_is_one_short_line_naming_it(tmp_path, capsys, no_training, name):
    """Were: a RecursionError traceback of ~3000 lines (10 000 levels deep), a UnicodeDecodeError
    traceback (/bin/ls), a MemoryError (4 GB); now each is one line naming the file, exit 2."""
    make, needles = BAD_FILES[name]
    params = tmp_path / "params.yaml"
    try:
        make(params)
        code = main(["run", "--params", str(params), "--root", str(tmp_path / "pipeline"), "--family", "sol_rl",
                     "--seed", "0"])
    finally:
        params.unlink()  # a 4 GB file, even a sparse one, is not left behind
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1 and len(error) < 400, error[:1000]
    assert error.startswith("solrl: error: ") and "params.yaml" in error and "Traceback" not in error
    for needle in needles:
        assert needle in error, (needle, error)
    assert not (tmp_path / "pipeline").exists()


@pytest.mark.parametrize("target", ["/dev/zero", "directory", "missing"])
def test_params_that_are_not_a_regular_file_are_one_line(tmp_path, capsys, target):
    """/dev/zero would be read forever (and a FIFO would wait forever) were it opened as a file."""
    path = {"directory": str(tmp_path), "missing": str(tmp_path / "nope.yaml")}.get(target, target)
    assert main(["run", "--params", path, "--root", str(tmp_path / "r"), "--family", "sol_rl", "--seed", "0"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and path in error, error


NAME_TEXT = st.text(st.characters(categories=["L", "N", "P", "S", "Z", "Cc"]), max_size=70)


@settings(max_examples=150, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(NAME_TEXT, st.sampled_from(["..", ".", "/", "~", "a/../..", "C:\\x", "-", "a.b_c-1"])))
def test_any_family_name_is_refused_or_names_one_folder_inside_the_root(tmp_path, name):
    """The property behind the cases above: whatever a families key is, the study refuses it, or its
    runs' folder is one safe component directly under root/runs."""
    from solrl_core.study import variant_dir

    params = tmp_path / "params.yaml"
    study = yaml.safe_load((ROOT / "params-ci.yaml").read_text())
    study["families"][name] = {"family": "sol_rl"}
    params.write_text(yaml.safe_dump(study))
    try:
        loaded = load_study(params)
    except ConfigError as error:
        assert "\n" not in str(error) and len(str(error)) < 400
        assert "families" in str(error)
        return
    root = tmp_path / "root"
    folder = variant_dir(root, name)
    assert folder.parent == root / "runs" and folder.resolve().parent == (root / "runs").resolve()
    assert name in loaded.families and name not in (".", "..")


# ---------------------------------------------------------------------------------------------
# A study run's MLflow run ends as `solrl run`'s does: KILLED when stopped, FAILED when it failed.

@pytest.mark.parametrize("stop, status", [(KeyboardInterrupt, "KILLED"), (RuntimeError, "FAILED")])
def test_a_stopped_study_run_is_killed_in_mlflow_and_a_failed_one_failed(tmp_path, monkeypatch, stop, status):
    """Ctrl-C (SIGTERM unwinds the same way) while the run trains, raised where the run's own log
    line is written; or an error there."""
    from mlflow import MlflowClient

    from solrl_core.study import run_one

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    study = load_study(write_params(tmp_path, lambda p: None))
    root = tmp_path / "pipeline"
    run_dir = root / "runs" / "sol_rl" / "seed-0"

    def stop_once_tracked(line: str) -> None:
        if (run_dir / "mlflow_run.json").exists():  # the MLflow run is open
            raise stop("stopped mid-run")

    with pytest.raises(stop):
        run_one(study, root, 0, family="sol_rl", log=stop_once_tracked)
    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    assert MlflowClient(uri).get_run(run_id).info.status == status
