"""The method families (SPEC §5, and adaptive exploration), each declared once as a record.

A family is a mapping of settings applied after the preset and before the user's overrides.
Every list of family names (``--family``, ``--families``, validation, the comparison's order,
the DVC study) reads :data:`FAMILIES`; adding a family is one record here.

Families without regeneration train on their rollout, which runs at T_train
(``regenerate.steps``, solrl_core.config.train_steps); families with it draft at explore.steps
and regenerate the kept seeds at T_train.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    name: str
    # Nested config mapping applied onto the preset (solrl_core.config.apply_mapping).
    settings: dict[str, Any]
    description: str


FAMILIES: dict[str, Family] = {family.name: family for family in (
    Family("diffusionnft", {"pool": 24, "keep": 24, "explore": {"backend": "none"}, "regenerate": {"enabled": False}},
           "the baseline: 24 full-precision samples per prompt, all trained on"),
    Family("naive_scaling", {"pool": 96, "keep": 24, "explore": {"backend": "none"}, "regenerate": {"enabled": False}},
           "96 full-precision samples per prompt, the 24 most extreme trained on"),
    # The control of naive_scaling: the same full-precision pool, so the same cost, but K kept at
    # random; against it naive_scaling measures what keeping the extremes adds to exploring more.
    Family("random_pool", {"pool": 96, "keep": 24, "selection": "random", "explore": {"backend": "none"},
                           "regenerate": {"enabled": False}},
           "96 full-precision samples per prompt, 24 of them drawn at random trained on (the control of naive_scaling)"),
    Family("naive_quant", {"pool": 96, "keep": 24, "regenerate": {"enabled": False}},
           "96 quantized samples per prompt, the 24 most extreme trained on as they are"),
    Family("sol_rl", {"pool": 96, "keep": 24, "regenerate": {"enabled": True}},
           "96 quantized drafts per prompt, the 24 most extreme regenerated in full precision and trained on"),
    # Beyond the paper (solrl_core.adaptive): the pool is pruned on 1- and 2-step drafts, and the
    # 24 seeds left after step 2 are the kept ones: 96 + 48 explorer sample-steps per group
    # instead of 96 x 6.
    Family("sol_rl_adaptive", {"pool": 96, "keep": 24, "regenerate": {"enabled": True},
                               "explore": {"adaptive": {"enabled": True, "score_at": [1, 2], "survivors": [48, 24]}}},
           "sol_rl with the pool pruned on 1- and 2-step drafts (adaptive exploration)"),
)}

