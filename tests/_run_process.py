"""A training run in a process of its own, for the kill-and-resume tests:

    python tests/_run_process.py OUT [--resume] [KEY=VALUE ...]

runs ``solrl_core.training.run_training`` with the stage functions called directly (the loop the
Prefect flow also runs) on shapes-tiny / sol_rl with the given overrides. SOLRL_FAULT in the
environment injects the fault (see solrl_core/faults.py).

Tests start it with :func:`run_process` on the SMALL run below.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solrl_core.config import parse_override  # noqa: E402
from solrl_core.presets import resolve_config  # noqa: E402
from solrl_core.training import run_training  # noqa: E402

ITERATIONS = 4
# Two optimizer steps per iteration (the preset's) so that a fault can strike between them.
SMALL = ["prompts_per_iteration=2", "pool=8", "keep=4", "eval.prompts=2", "eval.seeds_per_prompt=2", "eval.steps=4",
         "eval.every=2", "explore.steps=3", "regenerate.steps=4", "train.micro_batch=64", "train.steps_per_iteration=2",
         "progress=false", f"iterations={ITERATIONS}"]


def run_process(out: Path, *extra: str, fault: str | None = None, resume: bool = False) -> int:
    """The SMALL run (``extra`` overrides after it) into ``out`` in a process of its own; its exit code."""
    environment = {**os.environ, "SOLRL_FAULT": fault or ""}
    command = [sys.executable, str(Path(__file__).resolve()), str(out), *(["--resume"] if resume else []),
               *SMALL, *extra]
    return subprocess.run(command, env=environment, cwd=ROOT, capture_output=True, text=True, timeout=900).returncode


def main(argv: list[str]) -> int:
    out, rest = Path(argv[0]), argv[1:]
    resume = "--resume" in rest
    overrides = [parse_override(text) for text in rest if text != "--resume"]
    config = resolve_config("shapes-tiny", "sol_rl", overrides)
    run_training(config, out, log=lambda line: None, resume=resume)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
