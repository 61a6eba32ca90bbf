"""A training run in a process of its own, for the kill-and-resume tests:

    python tests/_run_process.py OUT [--resume] [KEY=VALUE ...]

runs ``solrl_core.training.run_training`` with the stage functions called directly (the loop the
Prefect flow also runs) on shapes-tiny / sol_rl with the given overrides. SOLRL_FAULT in the
environment injects the fault (see solrl_core/faults.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from solrl_core.config import parse_override  # noqa: E402
from solrl_core.presets import resolve_config  # noqa: E402
from solrl_core.training import run_training  # noqa: E402


def main(argv: list[str]) -> int:
    out, rest = Path(argv[0]), argv[1:]
    resume = "--resume" in rest
    overrides = [parse_override(text) for text in rest if text != "--resume"]
    config = resolve_config("shapes-tiny", "sol_rl", overrides)
    run_training(config, out, log=lambda line: None, resume=resume)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
