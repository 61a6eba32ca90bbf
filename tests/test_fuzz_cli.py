"""Bad input, fuzzed: property-based tests of the `solrl` command's config overrides and arguments.

Invariants, checked on every generated input by calling ``flows.cli.main`` (solrl_core.cli with the flow passed in) in this process:

* an invalid invocation exits with code 2 and prints exactly one line on stderr, starting
  ``solrl: error:``, and nothing on stdout; never a traceback; ``solrl run`` creates no output
  directory (and never starts training: the flow and the training loop are replaced by stubs that
  fail the test if they are reached);
* a valid ``solrl config`` invocation resolves to a config holding the values given, and that
  config round-trips through the two forms the pipeline uses: the YAML mapping that ``solrl
  config`` prints (the form of ``params.yaml`` and ``summary.json``), read back with
  ``from_dict``; and the ``-S key=${value}`` text that the DVC stages render from ``params.yaml``
  (DVC's own ``to_str`` for scalars), read back with ``parse_override`` + ``resolve_config``.

Hypothesis runs derandomized (a fixed seed per test: CI sees the same examples every time) with
fixed example counts; every example is counted, and the last test reports the total.
"""

from __future__ import annotations

import collections
import math
import os
import time

import pytest
import yaml
from dvc.parsing.interpolate import to_str as dvc_to_str
from hypothesis import HealthCheck, assume, currently_in_test_context, given, note, settings
from hypothesis import strategies as st
from hypothesis.strategies import composite

# Validation and the commands import these lazily: importing them here keeps any import-time
# chatter out of the per-example stderr captures.
import solrl_core.ablations  # noqa: F401
import solrl_core.models.loading  # noqa: F401
import solrl_core.models.registry  # noqa: F401
import solrl_core.quant.explorer
import solrl_core.report  # noqa: F401
import solrl_core.report_readme  # noqa: F401
import solrl_core.rewards.registry
from solrl_core import cli, cli_studies
from solrl_core.accounting import AUTO_PROFILE, DEVICE_PROFILES
from flows.cli import main
from solrl_core.cli import build_parser
from solrl_core.config import (COMPILE_MODES, MAX_COUNT, Config, ConfigError, config_keys, declared_type, from_dict,
                               get_key, parse_override, to_yaml)
from solrl_core.models.registry import MODELS
from solrl_core.nft import ADVANTAGE_MODES
from solrl_core.presets import FAMILIES, PRESETS, resolve_config
from tests._cli_checks import assert_user_error, nothing_runs

settings.register_profile(
    "solrl-ci",
    deadline=None,  # a shared 2-core machine: timing says nothing about correctness
    # The same examples on every run, so CI is reproducible; SOLRL_FUZZ_EXPLORE=1 draws new ones
    # (with --hypothesis-seed=N to repeat a draw) when looking for more bugs by hand.
    derandomize=not os.environ.get("SOLRL_FUZZ_EXPLORE"),
    database=None,  # nothing written to .hypothesis/
    print_blob=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.data_too_large],
)
CI = settings.get_profile("solrl-ci")

BACKENDS = solrl_core.quant.explorer.BACKENDS
REWARDS = tuple(solrl_core.rewards.registry.REWARDS)
KEYS = config_keys()
TYPES = {key: declared_type(key) for key in KEYS}
NAME_KEYS = ("preset", "family")  # set with --preset / --family, never with -S
INT_KEYS = [k for k in KEYS if TYPES[k] is int]
FLOAT_KEYS = [k for k in KEYS if TYPES[k] is float]
BOOL_KEYS = [k for k in KEYS if TYPES[k] is bool]
STR_KEYS = [k for k in KEYS if TYPES[k] is str and k not in NAME_KEYS]
LIST_KEYS = [k for k in KEYS if TYPES[k] == list[str]]
DICT_KEYS = [k for k in KEYS if str(TYPES[k]).startswith("dict[")]
SECTIONS = sorted({key.rsplit(".", 1)[0] for key in KEYS if "." in key}
                  | {key.split(".", 1)[0] for key in KEYS if "." in key})
COUNTED = ("iterations", "pool", "keep", "prompts_per_iteration", "explore.steps", "explore.chunk", "regenerate.steps",
           "regenerate.chunk", "train.steps_per_iteration", "train.micro_batch", "train.lora.rank", "train.lora.alpha",
           "eval.every", "eval.steps", "eval.prompts", "eval.seeds_per_prompt", "eval.chunk", "model.resolution",
           "prompts.train_pool")

# Examples run, per test and per outcome; the last test reports them.
COUNTS: collections.Counter = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def stubs():
    with nothing_runs():
        yield


# ---------------------------------------------------------------------------------------------
# Running the command and checking its outcome


def invoke(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()  # drop anything an earlier example left
    if currently_in_test_context():
        note(f"argv={argv!r}")
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def count(test: str, outcome: str) -> None:
    COUNTS[test] += 1
    COUNTS[f"outcome: {outcome}"] += 1


def check_invalid_everywhere(capsys, tmp_path, test: str, extra: list[str], prefix: list[str] | None = None) -> None:
    """The same invalid arguments to `solrl config` and to `solrl run --out DIR`: both exit 2 with one
    line, and the run creates nothing (not DIR, nothing else in the temporary folder)."""
    code, out, err = invoke(capsys, ["config", *(prefix or []), *extra])
    assert_user_error(code, out, err)
    out_dir = tmp_path / f"run-{COUNTS[test]}"
    before = sorted(tmp_path.iterdir())
    code, out, err = invoke(capsys, ["run", "--out", str(out_dir), *(prefix or []), *extra])
    assert_user_error(code, out, err)
    assert not out_dir.exists(), f"{out_dir} was created by an invalid run"
    assert sorted(tmp_path.iterdir()) == before
    count(test, "exit 2")


def yaml_text(value) -> str:
    """``value`` as one line of YAML flow text, as a user would write it after ``-S key=``."""
    # Non-ASCII escaped (\\xE9, \\N): PyYAML writes a NEL inside a plain quoted string that it then
    # reads back as a line break.
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, allow_unicode=False)
    return text[: -len("\n...\n")] if text.endswith("\n...\n") else text.rstrip("\n")


def string_text(value: str) -> str:
    """A string key's value as `-S` takes it: as written, or YAML-quoted where writing it bare would
    lose something (surrounding blanks, a leading quote)."""
    return value if value == value.strip() and not value.startswith(("'", '"')) else yaml_text(value)


# ---------------------------------------------------------------------------------------------
# Strategies

ANY_TEXT = st.text(max_size=40)
UNICODE_WORDS = st.sampled_from(["é", "日本語", "ß", "\u2028", "\u0085", "\x00", "\t", "\n", "🙂", "\ufeff", " "])
PATHISH = st.text(st.characters(categories=["L", "N"], include_characters="/._-~:+@,=#%&*!|>?[]{} "), max_size=30)
# allow_subnormal=False: the tests run with denormals flushed to zero, as runs do (tests/conftest.py
# calls solrl_core.numerics.flush_denormals; the `solrl` command calls it too), so subnormal floats
# cannot be represented in this process (hypothesis refuses to generate them).
FINITE = st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=False)
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
HUGE_INTS = st.one_of(st.integers(min_value=MAX_COUNT + 1, max_value=2**4000),
                      st.integers(min_value=-(2**4000), max_value=-(MAX_COUNT + 1)))
SCALARS = st.one_of(st.integers(), FINITE, NON_FINITE, st.booleans(), ANY_TEXT, st.none())
NESTED = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(ANY_TEXT, inner, max_size=3)), max_leaves=6)

FLOAT_RANGES = {  # valid values of each float key
    "train.lr": (1e-8, 1.0), "train.beta1": (0.0, 0.999), "train.beta2": (0.0, 0.999),
    "train.ema_max_decay": (0.0, 0.999), "train.eta_max": (0.0, 0.999), "train.timestep_fraction": (1e-3, 1.0),
    "accounting.utilization": (1e-3, 1.0), "train.weight_decay": (0.0, 10.0), "train.kl_weight": (0.0, 10.0),
    "train.eta_rate": (0.0, 1.0), "train.nft_beta": (1e-3, 10.0), "train.adv_clip": (1e-3, 10.0),
    "train.grad_clip": (1e-3, 10.0), "sampler.shift": (1e-3, 10.0), "model.guidance": (-1e6, 1e6),
}
STRING_CHOICES = {  # valid values of each validated string key
    "explore.backend": BACKENDS, "sampler.kind": ("euler", "dpm2"), "model.dtype": ("auto", "float32", "bfloat16"),
    "model.loader": tuple(MODELS), "model.device": ("auto", "cpu", "cuda", "cuda:1"),
    "model.compile": COMPILE_MODES,
    "accounting.device": tuple(DEVICE_PROFILES), "train.adv_mode": ADVANTAGE_MODES,
}


@composite
def valid_override(draw) -> tuple[str, str, object]:
    """(key, `-S` text, the value the config must then hold) with a value of the right type, mostly
    in range; a few combinations still break cross-key rules (keep > pool, fp4 on an H100)."""
    key = draw(st.sampled_from([k for k in KEYS if k not in NAME_KEYS]))
    kind = TYPES[key]
    if kind is int:
        if key == "seed":
            value = draw(st.integers(0, 2**63 - 1))
        elif key == "keep":
            value = draw(st.integers(1, 12).map(lambda half: 2 * half))
        elif key == "quant.min_dim":
            value = draw(st.integers(0, 10**6))
        else:
            value = draw(st.one_of(st.integers(1, 64), st.integers(1, MAX_COUNT)))
        return key, draw(st.sampled_from([str(value), dvc_to_str(value)])), value
    if kind is float:
        low, high = FLOAT_RANGES.get(key, (1e-3, 1.0))
        value = draw(st.one_of(st.floats(low, high, allow_subnormal=False), st.integers(math.ceil(low), math.floor(high))))
        text = draw(st.sampled_from([yaml_text(value), dvc_to_str(value), format(value, "e"), repr(value)]))
        return key, text, float(text)  # format(.., "e") keeps 7 digits: the value is what the text says
    if kind is bool:
        value = draw(st.booleans())
        text = draw(st.sampled_from([dvc_to_str(value), yaml_text(value), "yes" if value else "no",
                                     "on" if value else "off", "True" if value else "False"]))
        return key, text, value
    if kind is str:
        if key in STRING_CHOICES:
            value = draw(st.sampled_from(STRING_CHOICES[key]))
        elif key.startswith("prompts."):
            value = draw(st.sampled_from(["", str(PRESETS["flux-imagereward"]["settings"]["prompts"]["train_file"])]))
        else:  # model.path: any text (`solrl config` does not look at model files; `run` does)
            value = draw(st.one_of(PATHISH, ANY_TEXT, UNICODE_WORDS))
        return key, string_text(value), value
    if kind == list[str]:
        names = {"eval.rewards": st.sampled_from(REWARDS), "train.lora.targets": st.sampled_from(
            ["to_q", "to_k", "to_v", "to_out.0", "proj_out"])}.get(key, st.one_of(PATHISH, ANY_TEXT))
        value = draw(st.lists(names, min_size=1, max_size=4))
        return key, yaml_text(value), [str(item) for item in value]
    # dict[str, float] (rewards) or dict[str, str] (reward_paths)
    if key == "rewards":
        value = draw(st.dictionaries(st.sampled_from(REWARDS), st.floats(-10, 10, allow_subnormal=False), min_size=1, max_size=3))
        return key, yaml_text(value), {name: float(weight) for name, weight in value.items()}
    value = draw(st.dictionaries(st.sampled_from(REWARDS), st.one_of(PATHISH, ANY_TEXT), max_size=3))
    return key, yaml_text(value), value


def _wrong_type_values(kind):
    """Values YAML reads as something the key's declared type refuses."""
    if kind is int:
        return st.one_of(FINITE, NON_FINITE, st.booleans(), ANY_TEXT,
                         st.lists(SCALARS, max_size=3), st.dictionaries(ANY_TEXT, SCALARS, max_size=2), st.none())
    if kind is float:
        return st.one_of(st.booleans(), ANY_TEXT.filter(_not_float_text), st.lists(SCALARS, max_size=3),
                         st.dictionaries(ANY_TEXT, SCALARS, max_size=2), st.none())
    if kind is bool:
        return st.one_of(st.integers(), FINITE, ANY_TEXT, st.lists(SCALARS, max_size=3), st.none(),
                         st.dictionaries(ANY_TEXT, SCALARS, max_size=2))
    if kind is str:  # reachable through a section mapping only: `-S` keeps a string key's text
        return st.one_of(st.booleans(), st.none(), st.lists(SCALARS, min_size=1, max_size=3),
                         st.dictionaries(ANY_TEXT, SCALARS, min_size=1, max_size=2))
    if kind == list[str]:
        return st.one_of(st.integers(), FINITE, st.booleans(), st.dictionaries(ANY_TEXT, SCALARS, max_size=2),
                         st.lists(st.one_of(st.lists(SCALARS, max_size=2), st.dictionaries(ANY_TEXT, SCALARS, max_size=2),
                                            st.booleans(), st.none()), min_size=1, max_size=3))
    # list[int]: `-S key=1,2` is a comma list, so a text of integers (or of none: '') is not wrong
    return st.one_of(st.integers(), FINITE, st.booleans(), ANY_TEXT.filter(_not_int_list_text),
                     st.lists(SCALARS, max_size=3).filter(_not_int_list), st.none())


def _not_int_list(values: list) -> bool:
    return not all(isinstance(value, int) and not isinstance(value, bool) for value in values)


def _not_int_list_text(text: str) -> bool:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    return bool(parts) and not all(part.lstrip("+-").isdigit() for part in parts)


def _not_float_text(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return True
    return False


@composite
def wrong_type_override(draw) -> list[str]:
    """`-S key=<value of another type>`, directly or through the key's section (`-S model={path: [a]}`)."""
    key = draw(st.sampled_from([k for k in KEYS if k not in NAME_KEYS]))
    value = draw(_wrong_type_values(TYPES[key]))
    if TYPES[key] is str or ("." in key and draw(st.booleans())):
        section, _, leaf = key.rpartition(".")
        assume(section)  # a top-level string key has no section to go through
        return ["-S", f"{section}={yaml_text({leaf: value})}"]
    return ["-S", f"{key}={yaml_text(value)}"]


@composite
def out_of_range_override(draw) -> list[str]:
    kind = draw(st.sampled_from(["count", "seed", "float", "huge-float", "huge"]))
    if kind == "count":
        key, value = draw(st.sampled_from(COUNTED)), draw(st.one_of(st.integers(max_value=0),
                                                                    st.integers(min_value=MAX_COUNT + 1)))
    elif kind == "seed":
        key, value = "seed", draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63)))
    elif kind == "float":
        key, value = draw(st.sampled_from(FLOAT_KEYS)), draw(NON_FINITE)
    elif kind == "huge-float":  # an integer no float can hold, or a decimal that overflows to inf
        key = draw(st.sampled_from(FLOAT_KEYS))
        return ["-S", f"{key}={draw(st.sampled_from(['1' * 400, '-' + '9' * 309, '1e999', '-1e400', '0x' + 'f' * 300]))}"]
    else:
        key, value = draw(st.sampled_from([k for k in INT_KEYS if k != "seed"])), draw(HUGE_INTS)
    return ["-S", f"{key}={value if isinstance(value, int) else yaml_text(value)}"]


def _is_valid_key_or_section(key: str) -> bool:
    return key.strip() in KEYS or key.strip() in SECTIONS


def _mutations(key: str):
    """Misspellings of a real key: a character dropped, doubled, swapped or replaced, a case change."""
    return st.one_of(
        st.integers(0, len(key) - 1).map(lambda i: key[:i] + key[i + 1:]),
        st.integers(0, len(key) - 1).map(lambda i: key[:i] + key[i] + key[i:]),
        st.integers(0, len(key) - 2).map(lambda i: key[:i] + key[i + 1] + key[i] + key[i + 2:]),
        st.tuples(st.integers(0, len(key) - 1), st.characters()).map(lambda p: key[:p[0]] + p[1] + key[p[0] + 1:]),
        st.just(key.upper()), st.just(key.replace(".", "_")), st.just(key + "s"), st.just("__class__." + key),
        st.just(key.replace(".", "..")), st.just(key + ".x"),
    )


@composite
def unknown_key_override(draw) -> list[str]:
    key = draw(st.one_of(st.sampled_from(KEYS).flatmap(_mutations), ANY_TEXT, UNICODE_WORDS,
                         st.sampled_from(["rewards.shapes-compliance", "reward_paths.clipscore", "train.lora.x",
                                          "model.__dict__", "__class__.seed", "train.__init__", "progress.x"])))
    key = key.replace("=", "")
    assume(key.strip() and not _is_valid_key_or_section(key))
    value = draw(st.one_of(st.just("1"), ANY_TEXT.map(lambda t: t.replace("\x00", ""))))
    return ["-S", f"{key}={value}"]


MALFORMED = st.one_of(
    ANY_TEXT.filter(lambda t: "=" not in t),  # no '=' at all
    st.tuples(st.sampled_from(["", " ", "\t", "\n"]), ANY_TEXT).map(lambda p: f"{p[0]}={p[1]}"),  # an empty key
    st.sampled_from(["", "=", "==", " = ", "pool", "pool 48", "-S", "pool:48", "pool=48=49"]),
)
BROKEN = object()  # what _loaded returns for text YAML cannot read


def _loaded(text: str):
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError):
        return BROKEN


BROKEN_YAML = st.one_of(
    st.sampled_from(["[1", "{a", "a: b: c", "*x", "&a", "!!python/object:os.system x", "%YAML", "@", "`", "- a\n- b",
                     "[1, 2", "{a: [}", "'unclosed", '"unclosed', "! !", "]", "}", "a:\n  - b\n c", "\x00", "\x85x",
                     "[" * 1200, "{a: " * 1200, "1" * 5000, "0x" + "f" * 5000, "~", "null", ""]),
    st.tuples(st.sampled_from(["[", "{", "'", '"', "*", "!!", "%", "@", "`"]), ANY_TEXT).map("".join).filter(
        lambda text: _loaded(text) is BROKEN),
)


@composite
def billion_laughs(draw) -> str:
    """A YAML value of aliases nested `depth` deep, each level repeating the one below `width` times."""
    depth, width = draw(st.integers(4, 9)), draw(st.integers(5, 10))
    levels = ["&l0 [" + ", ".join(["lol"] * width) + "]"]
    for level in range(1, depth):
        levels.append(f"&l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]")
    return "[" + ", ".join(levels) + "]"


# Every long option of every subcommand: a generated flag must not abbreviate one (argparse
# accepts unique prefixes, and `--h` would print the help and exit 0).
OPTIONS = sorted({option for parser in [build_parser()] for action in parser._actions
                  for sub in getattr(action, "choices", None) and action.choices.values() or []
                  for sub_action in sub._actions for option in sub_action.option_strings} | {"--help"})


def _one_line(text: str) -> bool:
    """No line break of any kind in ``text``: argparse quotes an unknown argument raw, so one with a
    line break gave two lines (a cli.py bug, now fixed and pinned by a test below)."""
    return len((text + "x").splitlines()) == 1


def _abbreviates_an_option(flag: str) -> bool:
    head = flag.split("=", 1)[0]
    return any(option.startswith(head) for option in OPTIONS if option.startswith("--")) or head in OPTIONS


@composite
def bad_arguments(draw) -> list[str]:
    """Arguments argparse refuses, or that fail right after parsing (`--iterations` out of range)."""
    kind = draw(st.sampled_from(["flag", "short", "iterations", "iterations-range", "dangling", "stray"]))
    if kind == "flag":
        name = draw(st.text(st.characters(categories=["L", "N"], include_characters="-_"), min_size=1, max_size=12))
        flag = "--" + name + draw(st.sampled_from(["", "=1", "=x"]))
        assume(not _abbreviates_an_option(flag))
        return [flag]
    if kind == "short":
        return ["-" + draw(st.characters(categories=["L"]).filter(lambda c: c not in "Sh"))]
    if kind == "iterations":
        text = draw(st.one_of(ANY_TEXT, UNICODE_WORDS, st.sampled_from(["1e3", "1.5", "", "ten", "0x10", "--1"]))
                    .filter(_one_line))  # `config` has no --iterations: argparse quotes the pair raw
        try:
            int(text)
            assume(False)
        except ValueError:
            pass
        assume(not text.startswith(("-h", "--h")))
        return ["--iterations", text]
    if kind == "iterations-range":
        return ["--iterations", str(draw(st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_COUNT + 1,
                                                                                         max_value=10**4000))))]
    if kind == "dangling":  # an option without its value, last on the line
        return [draw(st.sampled_from(["--preset", "--family", "-S", "--set", "--iterations"]))]
    # a positional argument no command takes
    return [draw(ANY_TEXT.filter(lambda t: not t.startswith("-") and _one_line(t)))]


# ---------------------------------------------------------------------------------------------
# Valid input: resolves, holds the values given, round-trips


def sets_of(overrides: list[tuple[str, str, object]]) -> list[str]:
    argv = []
    for key, text, _ in overrides:
        argv += ["-S", f"{key}={text}"]
    return argv


def dvc_form(config: Config) -> list[str]:
    """Every key as a DVC stage passes it: `key=${value}` with DVC's rendering of a scalar (strings
    as written, quoted only where bare text would lose blanks or a leading quote), YAML flow text
    for a list or a mapping (which DVC's cmd interpolation does not render)."""
    texts = []
    for key in KEYS:
        if key in NAME_KEYS:
            continue
        value = get_key(config, key)
        if isinstance(value, str):
            texts.append(f"{key}={string_text(value)}")
        elif isinstance(value, (list, dict)):
            texts.append(f"{key}={yaml_text(value)}")
        else:
            texts.append(f"{key}={dvc_to_str(value)}")
    return texts




PRESET_NAMES = st.sampled_from(list(PRESETS))
FAMILY_NAMES = st.sampled_from(list(FAMILIES))


@settings(CI, max_examples=250)
@given(preset=PRESET_NAMES, family=FAMILY_NAMES, overrides=st.lists(valid_override(), min_size=1, max_size=4))
def test_valid_overrides_resolve_hold_their_values_and_round_trip(capsys, preset, family, overrides):
    code, out, err = invoke(capsys, ["config", "--preset", preset, "--family", family, *sets_of(overrides)])
    if code != 0:  # right types, but a cross-key rule broken (keep > pool, fp4 on an H100, ...)
        assert_user_error(code, out, err)
        count("valid-typed overrides", "exit 2")
        return
    assert err == "", err
    printed = from_dict(yaml.safe_load(out))  # the params.yaml / summary.json form, read back
    assert printed == resolve_config(preset, family, [parse_override(t) for t in sets_of(overrides)[1::2]])
    assert (printed.preset, printed.family) == (preset, family)
    for key, _, value in {key: (key, text, value) for key, text, value in overrides}.values():  # last one wins
        held = get_key(printed, key)
        assert held == value and type(held) is type(value), (key, held, value)
    assert from_dict(yaml.safe_load(to_yaml(printed))) == printed
    # The DVC stages' form: every key as `-S key=${value}`.
    assert resolve_config(preset, family, [parse_override(text) for text in dvc_form(printed)]) == printed
    count("valid-typed overrides", "exit 0, round-tripped")


def test_every_preset_and_family_round_trips_as_resolved(capsys):
    for preset in PRESETS:
        for family in FAMILIES:
            code, out, err = invoke(capsys, ["config", "--preset", preset, "--family", family])
            assert code == 0 and err == "", err
            config = from_dict(yaml.safe_load(out))
            assert config == resolve_config(preset, family)
            assert resolve_config(preset, family, [parse_override(text) for text in dvc_form(config)]) == config


def test_params_yaml_overrides_resolve_as_the_dvc_stages_pass_them(capsys):
    """dvc.yaml renders params.yaml values into `-S key=${value}` with DVC's to_str; they must give
    the config those values describe."""
    from pathlib import Path

    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())

    def dotted(mapping, prefix=""):
        for key, value in mapping.items():
            if isinstance(value, dict):
                yield from dotted(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    # The shared settings (the fidelity stage renders them into -S flags) and the fidelity seed.
    pairs = {**dict(dotted(params["settings"])), "seed": params["fidelity"]["seed"], "progress": False}
    for name, entry in params["families"].items():
        # A variant (an entry with `family:`) trains that family with the entry's other keys.
        family = entry.get("family", name)
        own = dict(dotted({key: value for key, value in entry.items() if key != "family"}))
        texts = [f"{key}={dvc_to_str(value)}" for key, value in {**pairs, **own}.items()]
        argv = ["config", "--preset", params["preset"], "--family", family]
        code, out, err = invoke(capsys, argv + [part for text in texts for part in ("-S", text)])
        assert code == 0, err
        config = from_dict(yaml.safe_load(out))
        assert config.family == family
        for key, value in {**pairs, **own}.items():
            assert get_key(config, key) == value, key


# ---------------------------------------------------------------------------------------------
# Invalid input: exit 2, one line, nothing created


@settings(CI, max_examples=180)
@given(extra=wrong_type_override())
def test_values_of_the_wrong_type_exit_2(capsys, tmp_path, extra):
    check_invalid_everywhere(capsys, tmp_path, "wrong-type values", extra)


@settings(CI, max_examples=120)
@given(extra=out_of_range_override())
def test_out_of_range_numbers_exit_2(capsys, tmp_path, extra):
    check_invalid_everywhere(capsys, tmp_path, "out-of-range numbers", extra)


@settings(CI, max_examples=120)
@given(extra=unknown_key_override())
def test_unknown_and_misspelled_keys_exit_2(capsys, tmp_path, extra):
    check_invalid_everywhere(capsys, tmp_path, "unknown keys", extra)


@settings(CI, max_examples=80)
@given(text=MALFORMED)
def test_malformed_key_value_text_exits_2(capsys, tmp_path, text):
    assume(not text.startswith(("-h", "--h")))
    check_invalid_everywhere(capsys, tmp_path, "malformed key=value", ["-S", text])


@settings(CI, max_examples=100)
@given(key=st.sampled_from(INT_KEYS + FLOAT_KEYS + BOOL_KEYS + LIST_KEYS + DICT_KEYS),
       value=st.one_of(BROKEN_YAML, billion_laughs()))
def test_broken_yaml_and_alias_bombs_exit_2(capsys, tmp_path, key, value):
    """Not YAML, a YAML value of another type, or billions of aliased references (whose repr, were a
    message to quote it whole, would never finish): one line."""
    if TYPES[key] == list[str]:  # a list key takes text (split on commas) and lists of scalars
        loaded = _loaded(value)
        assume(loaded is BROKEN or not (isinstance(loaded, str) or isinstance(loaded, list) and all(
            isinstance(item, (str, int, float)) and not isinstance(item, bool) for item in loaded)))
    check_invalid_everywhere(capsys, tmp_path, "broken YAML values", ["-S", f"{key}={value}"])


@settings(CI, max_examples=80)
@given(flag=st.sampled_from(["--preset", "--family"]),
       name=st.one_of(ANY_TEXT, UNICODE_WORDS, st.sampled_from(["flux", "shapes_tiny", "Shapes-Tiny", "sol-rl",
                                                                "grpo", "SOL_RL", " sol_rl", "shapes-tiny "])))
def test_unknown_presets_and_families_exit_2(capsys, tmp_path, flag, name):
    assume(name not in ("", "--") and name not in PRESETS and name not in FAMILIES)  # both: pinned below
    check_invalid_everywhere(capsys, tmp_path, "unknown presets/families", [f"{flag}={name}"])


@settings(CI, max_examples=150)
@given(extra=bad_arguments())
def test_argparse_level_bad_arguments_exit_2(capsys, tmp_path, extra):
    """Unknown flags, `--iterations` garbage or out of range, an option missing its value, a stray
    positional. `config` has no --iterations, so there it is an unknown flag: exit 2 as well."""
    check_invalid_everywhere(capsys, tmp_path, "bad arguments", extra)


@settings(CI, max_examples=40)
@given(command=ANY_TEXT.filter(lambda t: not t.startswith("-") and _one_line(t)))
def test_unknown_subcommands_exit_2(capsys, command):
    assume(command not in ("run", "config", "pretrain", "fidelity", "compare"))
    code, out, err = invoke(capsys, [command])
    assert_user_error(code, out, err)
    count("unknown subcommands", "exit 2")


TOKENS = st.one_of(
    st.sampled_from(["--preset", "--family", "-S", "--set", "--keys", "shapes-tiny", "sol_rl", "diffusionnft",
                     "flux-imagereward", "pool=48", "keep=12", "keep=7", "train.lr=1e-3", "--iterations", "3"]),
    st.sampled_from(KEYS).map(lambda key: f"{key}="), ANY_TEXT.filter(_one_line), UNICODE_WORDS.filter(_one_line),
)


@settings(CI, max_examples=150)
@given(tokens=st.lists(TOKENS, max_size=6))
def test_any_config_command_line_exits_0_or_2_never_a_traceback(capsys, tokens):
    assume(not any(token in ("-h",) or (token.startswith("--h") and "--help".startswith(token.split("=")[0]))
                   for token in tokens))
    code, out, err = invoke(capsys, ["config", *tokens])
    if code == 0:
        assert err == "" and out
        if "--keys" not in tokens:
            assert from_dict(yaml.safe_load(out)) == from_dict(yaml.safe_load(to_yaml(from_dict(yaml.safe_load(out)))))
        count("free-form config lines", "exit 0")
    else:
        assert_user_error(code, out, err)
        count("free-form config lines", "exit 2")


# ---------------------------------------------------------------------------------------------
# The study commands' list and count arguments

BAD_STEP_LISTS = st.one_of(
    ANY_TEXT.filter(lambda t: not _parses_as_steps(t)),
    st.lists(st.integers(max_value=0), min_size=1, max_size=4).map(lambda v: ",".join(map(str, v))),
    st.lists(st.integers(min_value=MAX_COUNT + 1, max_value=10**30), min_size=1, max_size=3).map(
        lambda v: ",".join(map(str, v))),
    st.sampled_from(["", ",", " , ", "2,,x", "2;4", "2 4", "1.5", "1e3", "six"]),
)


def _parses_as_steps(text: str) -> bool:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        return False
    return bool(values) and all(1 <= value <= MAX_COUNT for value in values)


def _bad_names(allowed):
    return st.one_of(
        st.lists(ANY_TEXT, min_size=1, max_size=3).map(",".join).filter(
            lambda t: not t.strip(", ") or any(p.strip() and p.strip() not in allowed for p in t.split(","))),
        st.sampled_from(["", ",", "all", " , "]),
    )


@composite
def bad_fidelity_arguments(draw) -> list[str]:
    from solrl_core.quant.explorer import BACKENDS as backends

    kind = draw(st.sampled_from(["steps", "backend", "prompts", "pool", "no-value"]))
    if kind == "no-value":  # `--opt=--`: argparse (3.11) hands the command an empty list
        return [draw(st.sampled_from(["--explore-steps", "--backend", "--prompts", "--pool", "--preset"])) + "=--"]
    if kind == "steps":
        return ["--explore-steps", draw(BAD_STEP_LISTS)]
    if kind == "backend":
        return ["--backend", draw(_bad_names(backends))]
    low = 1 if kind == "prompts" else 2
    value = draw(st.one_of(st.integers(max_value=low - 1), st.integers(min_value=MAX_COUNT + 1, max_value=10**40)))
    return [f"--{kind}", str(value)]


@composite
def bad_compare_arguments(draw) -> list[str]:
    kind = draw(st.sampled_from(["families", "budget", "evaluations", "ablation", "device", "no-value"]))
    budget = ["--budget-gpu-hours", "1e-5"]
    if kind == "no-value":  # `--opt=--`: argparse (3.11) hands the command an empty list
        return budget + [draw(st.sampled_from(["--families", "--budget-gpu-hours", "--evaluations", "--ablation",
                                               "--device", "--preset"])) + "=--"]
    if kind == "families":
        return budget + ["--families", draw(_bad_names(FAMILIES))]
    if kind == "budget":
        text = draw(st.one_of(st.sampled_from(["nan", "inf", "-inf", "0", "-1e-5", "0.0", "", "x", "1e999"]),
                              st.floats(max_value=0, allow_subnormal=False).map(repr), ANY_TEXT.filter(lambda t: not t.startswith("-"))))
        try:
            assume(not (math.isfinite(float(text)) and float(text) > 0))
        except ValueError:
            pass
        return ["--budget-gpu-hours", text]
    if kind == "evaluations":
        return budget + ["--evaluations", str(draw(st.one_of(st.integers(max_value=0),
                                                             st.integers(min_value=MAX_COUNT + 1, max_value=10**40))))]
    if kind == "ablation":
        return budget + ["--ablation", draw(ANY_TEXT.filter(lambda t: t not in ("explore-steps", "pool")
                                                            and not t.startswith("-")))]
    return budget + ["--device", draw(ANY_TEXT.filter(lambda t: t not in (*DEVICE_PROFILES, AUTO_PROFILE)
                                                      and not t.startswith("-")))]


@settings(CI, max_examples=80)
@given(extra=bad_fidelity_arguments())
def test_fidelity_bad_lists_and_counts_exit_2_before_sampling(capsys, tmp_path, extra):
    out = tmp_path / f"fidelity-{COUNTS['fidelity arguments']}.json"
    code, stdout, err = invoke(capsys, ["fidelity", "--out", str(out), *extra])
    assert_user_error(code, stdout, err)
    assert not out.exists() and not out.with_suffix(".png").exists()
    count("fidelity arguments", "exit 2")


@settings(CI, max_examples=80)
@given(extra=bad_compare_arguments())
def test_compare_bad_lists_and_counts_exit_2_before_training(capsys, tmp_path, extra):
    out = tmp_path / f"compare-{COUNTS['compare arguments']}"
    code, stdout, err = invoke(capsys, ["compare", "--out", str(out), *extra])
    assert_user_error(code, stdout, err)
    assert not out.exists()
    count("compare arguments", "exit 2")


@settings(CI, max_examples=100)
@given(steps=st.lists(st.integers(1, MAX_COUNT), min_size=1, max_size=6), spaces=st.booleans(),
       families=st.lists(st.sampled_from(list(FAMILIES)), min_size=1, max_size=6))
def test_valid_study_lists_parse_to_what_they_say(steps, spaces, families):
    separator = " , " if spaces else ","
    assert cli_studies._int_list(separator.join(map(str, steps)), "--explore-steps") == steps
    assert cli_studies._name_list(separator.join(families), "--families", FAMILIES) == list(dict.fromkeys(families))
    count("valid study lists", "parsed")


# ---------------------------------------------------------------------------------------------
# Each bug the fuzzing found, pinned (the message must say what is wrong)

FOUND = {
    # a float key given an integer no float can hold: OverflowError traceback
    "float_key_huge_integer": (["-S", "train.lr=" + "1" * 400], ["train.lr", "too large"]),
    "reward_weight_huge_integer": (["-S", "rewards={shapes-compliance: 1" + "0" * 400 + "}"], ["rewards"]),
    # an integer of more than 4300 digits: ValueError traceback from YAML (and from any message quoting it)
    "integer_beyond_str_limit": (["-S", "pool=" + "1" * 5000], ["pool", "too long"]),
    "hex_integer_beyond_str_limit": (["-S", "pool=0x" + "f" * 5000], ["pool", "2147483647"]),
    # YAML nested thousands deep: RecursionError traceback
    "deeply_nested_value": (["-S", "quant.skip=" + "[" * 1200], ["quant.skip", "nested too deep"]),
    # attribute paths that are not fields: KeyError traceback (and a write to a class attribute)
    "dunder_key": (["-S", "__class__.seed=5"], ["__class__.seed", "unknown config key"]),
    # user text with a line break printed raw: two lines on stderr
    "key_with_newline": (["-S", "po\nol=4"], ["po\\nol", "pool"]),
    "preset_with_newline": (["--preset", "shapes\ntiny"], ["shapes\\ntiny"]),
    # accepted, then a crash deep in a run
    "unknown_model_loader": (["-S", "model.loader=bogus"], ["model.loader", "bogus", "shapes-tiny"]),
    "unknown_model_device": (["-S", "model.device=bogus"], ["model.device", "bogus"]),
    "meta_model_device": (["-S", "model.device=meta"], ["model.device"]),
    "absurd_pool": (["-S", "pool=" + "9" * 30], ["pool", "2147483647"]),
    "absurd_iterations_flag": (["--iterations", "9" * 30], ["iterations"]),
    "empty_lora_targets": (["-S", "train.lora.targets=[]"], ["train.lora.targets"]),
    "missing_prompt_file": (["-S", "prompts.train_file=/nonexistent/prompts.txt"],
                            ["prompts.train_file", "/nonexistent/prompts.txt"]),
    # accepted and silently ignored: a misspelled reward name in reward_paths
    "unknown_reward_path_name": (["-S", "reward_paths={clipscor: /models/clip}"], ["reward_paths", "clipscor"]),
    # misleading: "unknown key; run solrl config --keys" for a reward weight set by its dotted name
    "dotted_reward_weight": (["-S", "rewards.shapes-compliance=2"], ["rewards", "set whole", "shapes-compliance"]),
}


@pytest.mark.parametrize("name", list(FOUND))
def test_found_bug_is_one_clear_line(capsys, tmp_path, name):
    extra, needles = FOUND[name]
    check_invalid_everywhere(capsys, tmp_path, "found bugs", extra)
    code, _, err = invoke(capsys, ["config", *extra])
    for needle in needles:
        assert needle in err, (needle, err)


def test_alias_bomb_is_refused_in_a_moment(capsys, tmp_path):
    value = "[&a [x,x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], " \
            "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]]"
    started = time.perf_counter()
    check_invalid_everywhere(capsys, tmp_path, "found bugs", ["-S", f"pool={value}"])
    assert time.perf_counter() - started < 60  # quoted whole, its 10**6 leaves took forever


@pytest.mark.parametrize("text", ["2020-01-01", "0x1A", "true", "null", "1:30", "a #b", "012", "~", "[x]", "@home"])
def test_a_string_key_keeps_the_text_as_written(capsys, text):
    """Was: `-S model.path=2020-01-01` or `=true` refused ("expected a string"), `=0x1A` silently
    became "26", `=1:30` became "90" (YAML 1.1 reads them as dates, bools, ints)."""
    code, out, err = invoke(capsys, ["config", "-S", f"model.path={text}"])
    assert code == 0, err
    assert from_dict(yaml.safe_load(out)).model.path == text
    assert parse_override(f'model.path="{text}"') == ("model.path", text)  # quoted: YAML's string


def test_empty_family_is_not_the_default_one():
    """Was: resolve_config(preset, "") silently meant sol_rl."""
    with pytest.raises(ConfigError, match="unknown family ''"):
        resolve_config("shapes-tiny", "")


def test_readme_only_refuses_a_folder_without_reports(capsys, tmp_path):
    """Was: exit 0, writing a README.md with nothing in it."""
    code, out, err = invoke(capsys, ["compare", "--readme-only", "--out", str(tmp_path)])
    assert_user_error(code, out, err)
    assert "compare.json" in err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["compare", "--budget-gpu-hours", "1e-5", "--out", "~no-such-user-solrl/x"],
    ["fidelity", "--out", "~no-such-user-solrl/x.json"],
    ["compare", "--budget-gpu-hours", "1e-5", "--out", "x" * 5000],
    ["compare", "--budget-gpu-hours", "1e-5", "--families", ","],
    ["fidelity", "--prompts", "9" * 30],
    ["fidelity", "--explore-steps", "9" * 30],
    ["fidelity", "--explore-steps=--"],
    ["compare", "--budget-gpu-hours=--"],
    ["compare", "--budget-gpu-hours", "1e-5", "--families=--"],
    ["compare", "--budget-gpu-hours", "1e-5", "--preset=--"],
])
def test_study_output_paths_and_lists_are_checked_first(capsys, tmp_path, argv):
    """Was: RuntimeError / OSError tracebacks for an unusable --out, "unknown ','" for an empty
    list, absurd counts passed on to the study, and AttributeError / TypeError tracebacks for
    `--opt=--` (which argparse 3.11 reads as an empty list)."""
    if "--out" not in argv:
        argv = [*argv, "--out", str(tmp_path / ("x.json" if argv[0] == "fidelity" else "x"))]
    code, out, err = invoke(capsys, argv)
    assert_user_error(code, out, err)


def test_fidelity_refuses_an_out_path_under_a_file(capsys, tmp_path):
    """Was: accepted; the JSON write failed after the whole study had sampled."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, out, err = invoke(capsys, ["fidelity", "--out", str(blocker / "study.json")])
    assert_user_error(code, out, err)
    assert "is a file" in err


# ---------------------------------------------------------------------------------------------
# Bugs the fuzzing found in solrl_core/cli.py, each pinned.


@pytest.mark.parametrize("out", ["~no-such-user-solrl/run", "x" * 5000])
def test_cli_run_unusable_out_is_one_line(capsys, out):
    code, stdout, err = invoke(capsys, ["run", "--out", out])
    assert_user_error(code, stdout, err)


def test_cli_unknown_argument_with_newline_is_one_line(capsys):
    code, out, err = invoke(capsys, ["config", "--fo\no"])
    assert_user_error(code, out, err)


@pytest.mark.parametrize("flag", ["--preset", "--family"])
@pytest.mark.parametrize("value", ["", "--"])  # argparse (3.11) reads --preset=-- as [], falsy as well
def test_cli_empty_preset_or_family_is_refused(capsys, flag, value):
    code, out, err = invoke(capsys, ["config", f"{flag}={value}"])
    assert_user_error(code, out, err)


# ---------------------------------------------------------------------------------------------
# Issue 45: a flag and the -S setting it is short for, and prompt files as untrusted input


@settings(CI, max_examples=60)
@given(flag=st.integers(min_value=1, max_value=MAX_COUNT),
       setting=st.one_of(st.integers(), ANY_TEXT.filter(lambda text: _one_line(text) and _loaded(text) is not BROKEN)))
def test_iterations_flag_against_a_different_setting_exits_2(capsys, tmp_path, flag, setting):
    """Was: `--iterations 3 -S iterations=-1` ran 3 iterations, the setting never looked at. The
    rule (solrl_core/cli.py): a flag is short for its -S setting, so the two must agree."""
    assume(_loaded(str(setting)) != flag)
    out_dir = tmp_path / f"run-{COUNTS['flag against setting']}"
    for argv in (["run", "--out", str(out_dir), "--iterations", str(flag), "-S", f"iterations={setting}"],
                 ["run", "--out", str(out_dir), "-S", f"iterations={setting}", "--iterations", str(flag)],
                 ["run", "--resume", str(tmp_path), "--iterations", str(flag), "-S", f"iterations={setting}"]):
        code, out, err = invoke(capsys, argv)
        assert_user_error(code, out, err, "--iterations", "disagree")
        assert not out_dir.exists()
    count("flag against setting", "exit 2")


def test_a_flag_and_a_setting_that_agree_are_one_setting():
    args = build_parser().parse_args(["run", "--out", "x", "--iterations", "5", "-S", "iterations=5"])
    assert cli.resolve_from_args(args).iterations == 5
    # Of several -S settings of a key the last wins, so that is the one the flag must agree with (a
    # deployment hands its ranks the preset's settings, the user's, then --iterations).
    args = build_parser().parse_args(["run", "--out", "x", "-S", "iterations=3", "-S", "iterations=2",
                                      "--iterations", "2"])
    assert cli.resolve_from_args(args).iterations == 2


def test_compare_device_flag_against_a_different_setting_exits_2(capsys, tmp_path):
    code, out, err = invoke(capsys, ["compare", "--budget-gpu-hours", "1e-5", "--out", str(tmp_path / "c"),
                                     "--device", "B200", "-S", "accounting.device=H100"])
    assert_user_error(code, out, err, "--device 'B200'", "accounting.device='H100'", "disagree")
    assert not (tmp_path / "c").exists()


def _sparse_file(path, size):
    with open(path, "wb") as handle:
        handle.truncate(size)


UNTRUSTED_PROMPT_FILES = {  # how the file is made, what the one line must say
    "sparse_4gb": (lambda path: _sparse_file(path, 4 * 2**30), ["4.0 GiB", "at most"]),
    "one_1mb_line": (lambda path: path.write_text("a" * 2**20 + "\n"), ["line 1", "longer than"]),
    "long_line_after_good_ones": (lambda path: path.write_text(f"{SHAPES_CAPTION}\n" * 3 + "b" * 9000),
                                  ["line 4", "longer than"]),
    "binary": (lambda path: path.write_bytes(bytes(range(256)) * 64), ["line 2", "not UTF-8"]),  # byte 10 ends line 1
    "latin1_on_line_3": (lambda path: path.write_bytes(f"{SHAPES_CAPTION}\n\ncaf\xe9\n".encode("latin-1")),
                         ["line 3", "not UTF-8"]),
    "fifo": (lambda path: os.mkfifo(path), ["not a regular file"]),
    # a line the grammar refuses, just under the line bound: the message quotes a prefix of it
    "ungrammatical_8k_line": (lambda path: path.write_text("x" * 8000 + "\n"), ["line 1", "shapes-compliance"]),
}
SHAPES_CAPTION = "a large red circle at the top left on a white background"


@pytest.mark.parametrize("key", ["prompts.train_file", "prompts.eval_file"])
@pytest.mark.parametrize("name", list(UNTRUSTED_PROMPT_FILES))
def test_untrusted_prompt_files_are_one_short_line(capsys, tmp_path, key, name):
    """Were: a MemoryError traceback (a 4 GB file is read whole), a 1 MB line echoed twice (2 MB on
    the terminal); a FIFO would have hung the command. Now each is one line of at most 400
    characters, naming the key, the file and the line."""
    make, needles = UNTRUSTED_PROMPT_FILES[name]
    target = tmp_path / "prompts.txt"
    make(target)
    try:
        check_invalid_everywhere(capsys, tmp_path, "untrusted prompt files", ["-S", f"{key}={target}"])
        code, out, err = invoke(capsys, ["config", "-S", f"{key}={target}"])
    finally:
        target.unlink()  # a 4 GB file, even a sparse one, is not left behind
    assert_user_error(code, out, err, key, str(target), *needles)
    assert len(err) - len(str(target)) < 400, err[:1000]


# ---------------------------------------------------------------------------------------------


def test_zz_examples_were_run_and_none_raised():
    """Runs last in this file: how many generated examples ran, and how they ended. Every example
    above either returned exit code 0 or 2 as checked, or the test failed; none raised."""
    fuzzed = {name: n for name, n in COUNTS.items() if not name.startswith("outcome:") and name != "found bugs"}
    total = sum(fuzzed.values())
    outcomes = {name.removeprefix("outcome: "): n for name, n in COUNTS.items() if name.startswith("outcome:")}
    print(f"\nfuzz: {total} generated examples, zero tracebacks; by test {dict(fuzzed)}; by outcome {outcomes}")
    if len(fuzzed) >= 10:  # the whole file ran (not one test picked with -k)
        assert total >= 1000, fuzzed
        assert COUNTS["valid-typed overrides"] >= 250 and COUNTS["outcome: exit 0, round-tripped"] >= 100, COUNTS
