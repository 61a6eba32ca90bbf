"""The `solrl` console script: solrl_core's CLI with the Prefect flow passed in.

solrl_core imports nothing from flows/ or tasks/; this module is where the command meets the
orchestrator. Every message, option and exit code is solrl_core.cli's.

    solrl run --preset shapes-tiny --out runs/demo      # the console script
    python -m flows.cli run ...                         # the same, e.g. under torchrun -m
    python -m flows.cli sweep ...                       # where the console script is not on the PATH
"""

from __future__ import annotations

import sys
from pathlib import Path

from solrl_core import cli


def run_locally(**parameters) -> dict:
    # Deferred for start-up time: importing Prefect takes seconds, and `solrl config`, `pretrain`
    # and a run stopped by bad input never need it.
    from flows.solrl import run_locally as run_flow

    return run_flow(**parameters)


def train_in_flow_context(context_file: Path, config, out_dir: Path, **options) -> None:
    from flows.solrl import train_in_flow_context as train  # deferred for start-up time, as above

    train(context_file, config, out_dir, **options)


def sweep(**parameters) -> dict:
    from flows.sweep import sweep as sweep_flow  # deferred for start-up time, as above

    return sweep_flow(**parameters)


RUNNERS = cli.FlowRunners(run_locally=run_locally, train_in_flow_context=train_in_flow_context, sweep=sweep)


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, RUNNERS)


if __name__ == "__main__":
    sys.exit(main())
