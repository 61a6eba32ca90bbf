"""Nested config mappings: merging them (presets over defaults) and listing what differs between
two (a resume's overrides, a comparison variant's settings), under one rule.

The rule is the config schema's own, as ``config.set_key`` applies it: a *section* (a nested
config dataclass: ``model``, ``explore``, ``explore.adaptive``, ...) merges and compares key by
key; a value the schema declares as a *mapping* (``dict[str, ...]``: ``rewards`` name -> weight,
``reward_paths`` name -> path) is one setting, replaced and compared whole. So a preset's
``rewards: {pickscore: 1.0}`` replaces the defaults' rewards rather than adding to them, and a
changed reward weight is reported as ``rewards``, the key a user sets.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterator
from typing import Any

from solrl_core.config import Config


@functools.cache
def whole_value_keys() -> frozenset[str]:
    """Dotted keys the config schema declares as mappings: they are replaced and compared whole."""
    return frozenset(_mapping_fields(Config, ""))


def _mapping_fields(section: type, prefix: str) -> Iterator[str]:
    types = typing.get_type_hints(section)
    for field in dataclasses.fields(section):
        declared = types[field.name]
        if dataclasses.is_dataclass(declared):
            yield from _mapping_fields(declared, f"{prefix}{field.name}.")
        elif typing.get_origin(declared) is dict:
            yield f"{prefix}{field.name}"


def _is_section(key: str, *values: Any) -> bool:
    return all(isinstance(value, dict) for value in values) and key not in whole_value_keys()


def merge_nested(*mappings: dict[str, Any]) -> dict[str, Any]:
    """Nested mappings merged left to right: later values win, sections merge key by key."""
    return _merge(mappings, "")


def _merge(mappings: typing.Sequence[dict[str, Any]], prefix: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for mapping in mappings:
        for key, value in mapping.items():
            dotted = f"{prefix}{key}"
            if key in result and _is_section(dotted, result[key], value):
                result[key] = _merge((result[key], value), f"{dotted}.")
            else:
                result[key] = value
    return result


def changed_settings(before: dict[str, Any], after: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> ``after``'s value, for every setting of ``after`` that differs from ``before``
    (a key ``before`` lacks counts as changed; one only ``before`` has does not)."""
    changed: dict[str, Any] = {}
    for key, value in after.items():
        dotted = f"{prefix}{key}"
        if key in before and _is_section(dotted, before[key], value):
            changed.update(changed_settings(before[key], value, f"{dotted}."))
        elif before.get(key) != value:
            changed[dotted] = value
    return changed
