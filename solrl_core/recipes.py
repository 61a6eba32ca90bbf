"""Recipes: a YAML config file (``solrl run --config FILE``, a deployment's ``config_file``).

A recipe is any part of what `solrl config` prints, nested or with dotted keys. It is merged
after the preset and the family and before ``-S``: it becomes ``-S`` settings placed ahead of the
user's own, so the last setting of a key wins as it always does, and everything downstream (the
Prefect flow, torchrun's ranks, the checkpoint's record) sees ordinary ``key=value`` strings.

Only the keys whose value differs from what the preset and family already give become settings
(for a key the preset derives, such as FLUX's ``sampler.shift`` from ``model.resolution``: from
what it derives from the file's other settings). A file that `solrl config` printed restates
every key; counting a restated value as a setting would pin it, and ``-S model.resolution=1024``
on top of the file would keep the old shift. Fed back, the file therefore resolves exactly as the
command that printed it, with or without more ``-S``.

``preset`` and ``family`` in the file name the preset and family when ``--preset`` /
``--family`` is not given; given beside the flag they must agree (the file's values were meant
for its own preset), else one line, as for a flag and its ``-S`` setting (cli_studies.with_flag).
The file must resolve on its own: a bad key or value in it is one line naming the file and key.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from solrl_core.config import Config, ConfigError, declared_type, get_key, parse_override, set_key, shown
from solrl_core.presets import FAMILIES, PRESETS, resolve_config
from solrl_core.safe_input import load_yaml

DEFAULT_PRESET, DEFAULT_FAMILY = "shapes-tiny", "sol_rl"


@dataclass(frozen=True)
class Recipe:
    preset: str
    family: str
    settings: tuple[tuple[str, str], ...]  # (key, its `key=value` text), in the file's order

    def overrides(self, skip: frozenset[str] = frozenset()) -> list[str]:
        return [text for key, text in self.settings if key not in skip]


@contextlib.contextmanager
def _naming(label: str):
    """Every config error inside names the file it came from."""
    try:
        yield
    except ConfigError as error:
        raise ConfigError(f"{label}: {error}") from None


def read_recipe(path: str | Path, preset: str | None = None, family: str | None = None) -> Recipe:
    """The recipe in ``path``; ``preset`` / ``family``: the flags' values (None: not given)."""
    label = str(path)
    mapping = load_yaml(Path(path).expanduser(), label)
    if not isinstance(mapping, dict) or not mapping:
        got = "nothing" if mapping is None or mapping == {} else f"a {type(mapping).__name__}"
        raise ConfigError(f"{label}: expected a mapping of config keys, as `solrl config` prints, got {got}")
    mapping = dict(mapping)  # _name takes the names out of it
    preset, family = _name(mapping, "preset", preset, PRESETS, label), _name(mapping, "family", family, FAMILIES, label)
    # None is "not given"; an empty name is an error resolve_config reports, not the default.
    preset = DEFAULT_PRESET if preset is None else preset
    family = DEFAULT_FAMILY if family is None else family
    baseline = resolve_config(preset, family)
    with _naming(label):
        pairs = _underived(_changed(list(_leaves(mapping)), baseline), preset, family)
        resolve_config(preset, family, pairs)  # out of range, or rules across keys: the file's fault
        settings = tuple((key, override_text(key, value)) for key, value in pairs)
    return Recipe(preset, family, settings)


def _name(mapping: dict, key: str, flag: str | None, known, label: str) -> str | None:
    """The preset or family: the flag's, the file's, or None (the default); a disagreement is an error."""
    in_file = mapping.pop(key, None)
    if in_file is None:
        return flag
    if not isinstance(in_file, str) or in_file not in known:
        raise ConfigError(f"{label}: unknown {key} {shown(in_file, 40)}; allowed: {', '.join(known)}")
    if flag is not None and flag != in_file:
        # Worded for both callers: the --preset flag, and a deployment's preset parameter.
        raise ConfigError(f"the {key} given ({shown(flag, 40)}) and {label}'s {key}: {in_file} disagree; the file's "
                          f"settings are for its own {key}: give one of them (--{key} or the file's)")
    return in_file


def _leaves(mapping: dict, prefix: str = ""):
    """(dotted key, value) for every setting in a nested or dotted mapping; a section's mapping is
    walked, anything else is a leaf that set_key checks. An unknown key's mapping is walked too, so
    that a misspelt section is reported by its whole key (``explor.steps``: did you mean
    ``explore.steps``?); an empty one stays a leaf, refused rather than ignored."""
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        kind = declared_type(path)
        if isinstance(value, dict) and (dataclasses.is_dataclass(kind) or (kind is None and value)):
            yield from _leaves(value, f"{path}.")
        else:
            yield path, value


def _changed(leaves: list[tuple[str, Any]], baseline: Config) -> list[tuple[str, Any]]:
    """The leaves, type-checked and coerced, that differ from ``baseline`` (see the module's note)."""
    trial = copy.deepcopy(baseline)
    values: dict[str, Any] = {}
    for key, value in leaves:
        set_key(trial, key, value)
        values[key] = get_key(trial, key)
    return [(key, value) for key, value in values.items() if value != get_key(baseline, key)]


def _underived(pairs: list[tuple[str, Any]], preset: str, family: str) -> list[tuple[str, Any]]:
    """``pairs`` less the derived keys whose value is what the preset derives from the other pairs."""
    derived = PRESETS[preset].get("derived", {})
    plain = [(key, value) for key, value in pairs if key not in derived]
    if len(plain) == len(pairs):
        return pairs
    rederived = resolve_config(preset, family, plain)
    return [(key, value) for key, value in pairs if key not in derived or value != get_key(rederived, key)]


def override_text(key: str, value: Any) -> str:
    """``key=value`` text that parse_override reads back as ``value`` (what travels to the flow and
    to torchrun's ranks): a string key's text as written where that is exact, else flow YAML."""
    if isinstance(value, str) and value == value.strip() and not value.startswith(("'", '"')):
        text = f"{key}={value}"
    else:
        style = '"' if isinstance(value, str) else None
        dumped = yaml.safe_dump(value, default_flow_style=True, default_style=style, width=float("inf"),
                                allow_unicode=True)
        # A bare scalar is dumped as a document with an end marker ("5\n...\n").
        text = f"{key}=" + dumped.removesuffix("\n").removesuffix("\n...")
    if parse_override(text) != (key, value):  # pragma: no cover - a guard: no value found so far fails it
        raise ConfigError(f"{key}: {shown(value, 40)} cannot be passed on as a -S setting")
    return text


def merged(path: str | Path | None, preset: str | None, family: str | None, overrides: list[str],
           iterations: int | None) -> tuple[str | None, str | None, list[str]]:
    """The preset, family and ``-S`` texts once the recipe in ``path`` (if any) is merged: its
    settings first, so that ``-S`` wins. ``iterations`` (a flag short for ``-S iterations=N``)
    wins over the file too, so the file's own is left out rather than contradicting it."""
    if path is None:
        return preset, family, list(overrides)
    recipe = read_recipe(path, preset, family)
    skip = frozenset({"iterations"}) if iterations is not None else frozenset()
    return recipe.preset, recipe.family, [*recipe.overrides(skip), *overrides]
