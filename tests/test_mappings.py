"""One nested merge and one nested diff, with one rule for which keys are whole values: the config
schema's mappings (``rewards``, ``reward_paths``) are one setting each; sections go key by key."""

from __future__ import annotations

import pytest

from solrl_core.config import Config, ConfigError, set_key, to_dict
from solrl_core.mappings import changed_settings, merge_nested, whole_value_keys
from solrl_core.presets import PAPER_DEFAULTS, PRESETS, resolve_config


def test_the_whole_values_are_the_mappings_the_config_sets_whole():
    """The list is read from the schema, and it is the schema's own rule: a dotted key into one of
    these is refused by set_key, a dotted key into a section is not."""
    assert whole_value_keys() == {"rewards", "reward_paths"}
    for key in whole_value_keys():
        with pytest.raises(ConfigError, match="is a mapping and is set whole"):
            set_key(Config(), f"{key}.some-name", 1.0)
    set_key(Config(), "explore.adaptive.enabled", True)


def test_a_later_mapping_replaces_rewards_whole_and_merges_sections_key_by_key():
    base = {"rewards": {"shapes-compliance": 1.0}, "reward_paths": {"clipscore": "/a"},
            "explore": {"steps": 6, "chunk": 24, "adaptive": {"enabled": False, "survivors": [48, 24]}}}
    over = {"rewards": {"pickscore": 1.0}, "reward_paths": {"hpsv2": "/b"}, "explore": {"adaptive": {"enabled": True}}}
    assert merge_nested(base, over) == {
        "rewards": {"pickscore": 1.0}, "reward_paths": {"hpsv2": "/b"},
        "explore": {"steps": 6, "chunk": 24, "adaptive": {"enabled": True, "survivors": [48, 24]}}}
    assert base["explore"]["adaptive"]["enabled"] is False  # the inputs are left as they were


def test_a_real_preset_trains_on_its_own_reward_only():
    """flux-imagereward: the paper's defaults, the model's settings and {imagereward: 1} merged;
    the embedded world's default reward does not leak into the weighted sum."""
    settings = PRESETS["flux-imagereward"]["settings"]
    assert settings["rewards"] == {"imagereward": 1.0}
    assert settings["train"]["lora"]["rank"] == PAPER_DEFAULTS["train"]["lora"]["rank"]
    assert resolve_config("flux-imagereward", "sol_rl").rewards == {"imagereward": 1.0}


def test_changed_settings_name_keys_a_user_can_set_and_rebuild_the_config():
    """Every key reported is one `-S KEY=VALUE` accepts, and setting them all onto the reference
    gives the other config back. Was: a comparison reported `reward_paths.clipscore`, a key
    set_key refuses."""
    reference = Config()
    other = resolve_config("shapes-tiny", "sol_rl_adaptive", [
        ("rewards", {"shapes-compliance": 0.5, "shapes-aesthetic": 0.5}), ("reward_paths", {"clipscore": "/m"}),
        ("explore.adaptive.score_at", [1, 2]), ("train.lora.rank", 4), ("seed", 7)])
    changed = changed_settings(to_dict(reference), to_dict(other))
    assert {"rewards", "reward_paths", "train.lora.rank", "seed"} <= set(changed)
    assert "reward_paths.clipscore" not in changed and "rewards.shapes-aesthetic" not in changed
    rebuilt = Config()
    for key, value in changed.items():
        set_key(rebuilt, key, value)
    assert to_dict(rebuilt) == to_dict(other)
    assert changed_settings(to_dict(other), to_dict(other)) == {}
