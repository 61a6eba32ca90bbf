"""The paper's ablations (SPEC §6) as named override sets on the sol_rl family.

One source for every sweeper: ``solrl compare --ablation explore-steps`` runs each point to the
same GPU-hour budget, and DVC (or a shell loop) can ask for one point's overrides:

    python -m solrl_core.ablations                     # every ablation as JSON
    python -m solrl_core.ablations explore-steps 4     # -S explore.steps=4   (one per line)
"""

from __future__ import annotations

import json
import sys
from typing import Any

ABLATION_FAMILY = "sol_rl"

# The one config key each ablation varies; everything else is the ablated family's. The DVC study
# (flows/study.py) takes its points from params.yaml and sets this key alone.
ABLATION_KEYS: dict[str, str] = {"explore-steps": "explore.steps", "pool": "pool"}

# name -> point -> {config key: value}; points keep their order. The pool ablation varies N at the
# paper's fixed K = 24.
ABLATIONS: dict[str, dict[str, dict[str, Any]]] = {
    "explore-steps": {str(steps): {ABLATION_KEYS["explore-steps"]: steps} for steps in (2, 4, 6, 8)},
    "pool": {str(pool): {ABLATION_KEYS["pool"]: pool, "keep": 24} for pool in (24, 48, 72, 96)},
}

# HPSv2 of the paper at each point (SPEC §6), for the report.
PAPER_HPSV2: dict[str, dict[str, float]] = {
    "explore-steps": {"2": 0.3587, "4": 0.3650, "6": 0.3686, "8": 0.3659},
    "pool": {"24": 0.3569, "48": 0.3622, "72": 0.3663, "96": 0.3686},
}


def ablation_points(name: str) -> dict[str, dict[str, Any]]:
    if name not in ABLATIONS:
        raise KeyError(f"unknown ablation '{name}'; allowed: {', '.join(ABLATIONS)}")
    return ABLATIONS[name]


def ablation_overrides(name: str, point: str) -> list[tuple[str, Any]]:
    """The (key, value) overrides of one point, in the form ``resolve_config`` takes."""
    points = ablation_points(name)
    if point not in points:
        raise KeyError(f"unknown point '{point}' of ablation '{name}'; allowed: {', '.join(points)}")
    return list(points[point].items())


def variant_name(name: str, point: str) -> str:
    return f"{name}={point}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not argv:
            print(json.dumps({"family": ABLATION_FAMILY, "ablations": ABLATIONS}, indent=2))
        elif len(argv) == 1:
            print(json.dumps(ablation_points(argv[0]), indent=2))
        else:
            for key, value in ablation_overrides(argv[0], argv[1]):
                print(f"-S {key}={json.dumps(value)}")
    except KeyError as error:
        print(f"ablations: error: {error.args[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
