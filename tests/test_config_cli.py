"""The typed config, its presets and families, and the `solrl` command's handling of user errors."""

import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

# Validation imports these lazily; importing them up front keeps any import-time chatter out of
# the in-process stderr captures below (the fresh-process test checks a real user sees none).
import solrl_core.quant.explorer  # noqa: F401
import solrl_core.rewards.registry  # noqa: F401
from flows.cli import main
from solrl_core.config import Config, ConfigError, config_keys, from_dict
from solrl_core.presets import PRESETS, resolve_config


@pytest.fixture
def out_dir(tmp_path):
    return tmp_path / "out"


@pytest.fixture(autouse=True)
def training_must_not_start(monkeypatch):
    """If a user error slipped through, `solrl run` would start training; make that a failure."""
    fake = types.ModuleType("solrl_core.training")

    def run_training(*args, **kwargs):
        raise AssertionError("training started although the invocation was invalid")

    fake.run_training = run_training
    monkeypatch.setitem(sys.modules, "solrl_core.training", fake)


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_user_error(code, err, *needles):
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


INVALID_RUNS = {
    "keep_above_pool": (["-S", "pool=8", "-S", "keep=16"], ["keep", "pool"]),
    "odd_keep": (["-S", "keep=5"], ["keep", "even"]),
    "zero_keep": (["-S", "keep=0"], ["keep"]),
    "unknown_preset": (["--preset", "no-such-preset"], ["preset", "no-such-preset"]),
    "unknown_family": (["--family", "grpo"], ["family", "grpo"]),
    "unknown_reward": (["-S", "rewards={nope: 1.0}"], ["reward", "nope"]),
    "unknown_backend": (["-S", "explore.backend=int3"], ["explore.backend", "int3"]),
    "unknown_compile_mode": (["-S", "model.compile=fast"], ["model.compile", "fast", "none, blocks, whole"]),
    "zero_explore_steps": (["-S", "explore.steps=0"], ["explore.steps"]),
    "zero_regenerate_steps": (["-S", "regenerate.steps=0"], ["regenerate.steps"]),
    "zero_lr": (["-S", "train.lr=0"], ["train.lr"]),
    "negative_lr": (["-S", "train.lr=-0.001"], ["train.lr"]),
    "nan_lr": (["-S", "train.lr=.nan"], ["train.lr"]),
    "negative_seed": (["-S", "seed=-1"], ["seed"]),
    "unknown_key_suggests_close_one": (["-S", "explor.steps=4"], ["explor.steps", "explore.steps"]),
    "non_integer_pool": (["-S", "pool=abc"], ["pool", "abc"]),
    "boolean_pool": (["-S", "pool=true"], ["pool"]),
    "unclosed_yaml_value": (["-S", "pool=[1"], ["pool"]),
    "override_without_equals": (["-S", "pool"], ["pool", "="]),
    "preset_via_override": (["-S", "preset=shapes-tiny"], ["preset"]),
    "section_set_as_scalar": (["-S", "explore=4"], ["explore"]),
}


@pytest.mark.parametrize("name", list(INVALID_RUNS))
def test_invalid_run_exits_2_with_one_line_and_writes_nothing(name, capsys, out_dir):
    extra, needles = INVALID_RUNS[name]
    code, _, err = run_cli(capsys, "run", "--out", str(out_dir), *extra)
    assert_one_line_user_error(code, err, *needles)
    assert not out_dir.exists()


def test_unknown_key_without_close_match_points_to_key_listing(capsys, out_dir):
    code, _, err = run_cli(capsys, "run", "--out", str(out_dir), "-S", "zzzzqqq=1")
    assert_one_line_user_error(code, err, "zzzzqqq", "--keys")
    assert not out_dir.exists()


def test_run_refuses_non_empty_out_dir_and_leaves_it_untouched(capsys, out_dir):
    out_dir.mkdir()
    keeper = out_dir / "previous.txt"
    keeper.write_text("earlier run")
    code, _, err = run_cli(capsys, "run", "--out", str(out_dir), "-S", "iterations=1")
    assert_one_line_user_error(code, err, "not empty")
    assert sorted(p.name for p in out_dir.iterdir()) == ["previous.txt"]
    assert keeper.read_text() == "earlier run"


def test_missing_subcommand_and_unknown_flag_are_one_line_usage_errors(capsys, out_dir):
    code, _, err = run_cli(capsys)
    assert_one_line_user_error(code, err)
    code, _, err = run_cli(capsys, "run", "--out", str(out_dir), "--no-such-flag")
    assert_one_line_user_error(code, err, "--no-such-flag")
    assert not out_dir.exists()


def test_config_command_rejects_invalid_config_the_same_way(capsys):
    code, out, err = run_cli(capsys, "config", "-S", "keep=7")
    assert_one_line_user_error(code, err, "keep")
    assert out == ""


def test_fresh_process_user_error_is_exactly_one_stderr_line(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--out", str(out), "-S", "keep=5"],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1],
    )
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("solrl: error:") and "keep" in lines[0]
    assert not out.exists()


def test_run_refuses_an_existing_file_as_out_dir(capsys, tmp_path):
    target = tmp_path / "results.txt"
    target.write_text("not a directory")
    code, _, err = run_cli(capsys, "run", "--out", str(target), "-S", "iterations=1")
    assert_one_line_user_error(code, err, "results.txt")
    assert target.read_text() == "not a directory"


def test_seed_beyond_int64_is_rejected_at_validation():
    try:
        resolve_config("shapes-tiny", "sol_rl", [("seed", 2**63)])
    except ConfigError as error:
        assert "seed" in str(error)
    else:
        raise AssertionError("seed 2**63 passed validation")


@pytest.mark.parametrize("resolution", [8193, 32768, 2**31 - 1])
def test_flux_resolution_beyond_the_largest_is_one_line_not_an_overflow(capsys, resolution):
    """FLUX's shift is derived from the resolution (exp of the token count): a vast resolution is
    refused by its range before the derived rule runs (the fuzzer found 32768 overflowing)."""
    code, _, err = run_cli(capsys, "config", "--preset", "flux-imagereward", "-S", f"model.resolution={resolution}")
    assert_one_line_user_error(code, err, "model.resolution", "8192")


def test_infinite_learning_rate_is_rejected():
    try:
        resolve_config("shapes-tiny", "sol_rl", [("train.lr", float("inf"))])
    except ConfigError as error:
        assert "train.lr" in str(error)
    else:
        raise AssertionError("train.lr=inf passed validation")


# --- valid configurations --------------------------------------------------------------------

SETTABLE = {
    "pool": ("pool", "48", 48),
    "keep": ("keep", "12", 12),
    "prompts_per_iteration": ("prompts_per_iteration", "3", 3),
    "iterations": ("iterations", "5", 5),
    "seed": ("seed", "123", 123),
    "explore.steps": ("explore.steps", "4", 4),
    "explore.backend": ("explore.backend", "fp8", "fp8"),
    "regenerate.steps": ("regenerate.steps", "14", 14),
    "train.lr": ("train.lr", "0.002", 0.002),
}


@pytest.mark.parametrize("name", list(SETTABLE))
def test_named_key_is_settable_and_lands_in_config(name):
    key, text, expected = SETTABLE[name]
    config = resolve_config("shapes-tiny", "sol_rl", [(key, yaml.safe_load(text))])
    value = config
    for part in key.split("."):
        value = getattr(value, part)
    assert value == expected
    assert type(value) is type(expected)


def test_cli_config_prints_overrides_as_yaml(capsys):
    argv = ["config"]
    for key, text, _ in SETTABLE.values():
        argv += ["-S", f"{key}={text}"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0 and err == ""
    printed = yaml.safe_load(out)
    assert printed["pool"] == 48 and printed["keep"] == 12
    assert printed["prompts_per_iteration"] == 3 and printed["iterations"] == 5 and printed["seed"] == 123
    assert printed["explore"]["steps"] == 4 and printed["explore"]["backend"] == "fp8"
    assert printed["regenerate"]["steps"] == 14
    assert printed["train"]["lr"] == pytest.approx(0.002)


@pytest.mark.parametrize("text, expected", [("1e-3", 1e-3), ("3E-4", 3e-4), ("2e2", 200.0)])
def test_learning_rate_in_exponent_notation_is_accepted(capsys, text, expected):
    code, out, err = run_cli(capsys, "config", "-S", f"train.lr={text}")
    assert code == 0, err
    assert yaml.safe_load(out)["train"]["lr"] == pytest.approx(expected)


def test_override_order_defaults_then_preset_then_family_then_overrides():
    defaults = Config()
    preset_only = resolve_config("shapes-tiny", "sol_rl")
    # The preset overrides a default (shapes-tiny trains with a larger learning rate).
    assert defaults.train.lr == pytest.approx(3e-4)
    assert preset_only.train.lr == pytest.approx(PRESETS["shapes-tiny"]["settings"]["train"]["lr"])
    assert preset_only.train.lr != pytest.approx(defaults.train.lr)
    # The family overrides the preset.
    baseline = resolve_config("shapes-tiny", "diffusionnft")
    assert (baseline.pool, baseline.keep) == (24, 24)
    assert baseline.explore.backend == "none"
    assert baseline.regenerate.enabled is False
    assert preset_only.explore.backend == "emulated-nvfp4"
    assert preset_only.regenerate.enabled is True
    # -S overrides the family.
    overridden = resolve_config("shapes-tiny", "sol_rl", [("pool", 48), ("train.lr", 0.01)])
    assert overridden.pool == 48 and preset_only.pool == 96
    assert overridden.train.lr == pytest.approx(0.01)
    assert resolve_config("shapes-tiny", "diffusionnft", [("explore.backend", "fp8")]).explore.backend == "fp8"


def test_families_match_spec_table():
    expected = {
        "diffusionnft": (24, 24, False, "none"),
        "naive_scaling": (96, 24, False, "none"),
        "naive_quant": (96, 24, False, "emulated-nvfp4"),
        "sol_rl": (96, 24, True, "emulated-nvfp4"),
    }
    for family, (pool, keep, regenerates, backend) in expected.items():
        config = resolve_config("shapes-tiny", family)
        assert (config.pool, config.keep, config.regenerate.enabled, config.explore.backend) == (
            pool, keep, regenerates, backend), family
        assert config.family == family


def test_cli_override_wins_over_family(capsys):
    code, out, _ = run_cli(capsys, "config", "--family", "sol_rl", "-S", "pool=48")
    assert code == 0
    assert yaml.safe_load(out)["pool"] == 48
    code, out, _ = run_cli(capsys, "config", "--family", "diffusionnft")
    printed = yaml.safe_load(out)
    assert printed["pool"] == 24 and printed["explore"]["backend"] == "none"
    assert printed["regenerate"]["enabled"] is False


def test_resolve_config_raises_config_error_for_unknown_names():
    with pytest.raises(ConfigError, match="preset"):
        resolve_config("nope-preset", "sol_rl")
    with pytest.raises(ConfigError, match="family"):
        resolve_config("shapes-tiny", "nope-family")


def test_config_keys_lists_every_user_facing_key(capsys):
    code, out, err = run_cli(capsys, "config", "--keys")
    assert code == 0 and err == ""
    listed = out.split()
    for key in [*SETTABLE, "rewards", "train.eta_rate", "train.ema_max_decay", "sampler.kind"]:
        assert key in listed
    assert listed == config_keys()
    assert len(set(listed)) == len(listed)


ROUND_TRIPS = {
    "defaults": ("sol_rl", []),
    "customised": ("diffusionnft", ["train.lr=0.0025", "quant.skip=[a, b.*]",
                                     "rewards={shapes-compliance: 0.7, shapes-aesthetic: 0.3}", "explore.steps=2"]),
}


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
def test_config_yaml_round_trips_to_an_equal_config(capsys, name):
    family, overrides = ROUND_TRIPS[name]
    argv = ["config", "--family", family]
    for text in overrides:
        argv += ["-S", text]
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    round_tripped = from_dict(yaml.safe_load(out))
    parsed = [(key, yaml.safe_load(value)) for key, value in (text.split("=", 1) for text in overrides)]
    assert round_tripped == resolve_config("shapes-tiny", family, parsed)
    assert round_tripped.family == family
