"""Starting a run on several ranks with torchrun: the `solrl run` scale-out flags, the checks made
before torchrun starts, and torchrun itself as a child process (the `--nproc-per-node N` of
`solrl run` and the `nproc_per_node` of a Prefect deployment both come here).

torchrun starts ``python -m flows.cli run ...`` (the `solrl` command) once per rank with RANK / WORLD_SIZE / ... in
the environment; the CLI reads them (see ``command_run``). Users may equally call torchrun
themselves: ``torchrun --nproc-per-node 8 -m flows.cli run ...``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from solrl_core.distributed import (DEFAULT_TIMEOUT_S, TIMEOUT_VARIABLE, DistributedError, check_rendezvous,
                                    require_timeout, split_endpoint)

# Set for rank 0 by a Prefect flow run that starts torchrun: the flow run's context, so rank 0's
# stage tasks are task runs of that flow run (see flows/solrl.py).
PREFECT_CONTEXT_VARIABLE = "SOLRL_PREFECT_CONTEXT"


@dataclass(frozen=True)
class Launch:
    """How many ranks, on how many nodes, meeting where."""

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str = "solrl"
    rank_timeout: float = DEFAULT_TIMEOUT_S

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def needs_torchrun(self) -> bool:
        return self.world_size > 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scale-out (torchrun)")
    group.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                       help="ranks on this machine, one per GPU (gloo on CPUs): starts torchrun for you")
    group.add_argument("--nnodes", type=int, default=None, metavar="N", help="machines in the job (default 1)")
    group.add_argument("--node-rank", type=int, default=None, metavar="R", help="this machine's index (default 0)")
    group.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                       help="c10d rendezvous address, the same on every node (required with --nnodes > 1)")
    group.add_argument("--rdzv-id", default=None, metavar="ID", help="job id shared by the nodes (default solrl)")
    group.add_argument("--rank-timeout", type=float, default=None, metavar="SECONDS",
                       help=f"a rank that dies or hangs ends the run within this (default {DEFAULT_TIMEOUT_S})")


def from_arguments(args: argparse.Namespace) -> Launch:
    chosen = {name: getattr(args, name) for name in ("nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint",
                                                     "rdzv_id", "rank_timeout") if getattr(args, name) is not None}
    return checked(Launch(**chosen))


def checked(launch: Launch) -> Launch:
    """The flags' own sense, before any config or file is looked at."""
    if launch.nproc_per_node < 1:
        raise DistributedError(f"--nproc-per-node ({launch.nproc_per_node}) must be >= 1 (one rank per GPU)")
    if launch.nnodes < 1:
        raise DistributedError(f"--nnodes ({launch.nnodes}) must be >= 1")
    if not 0 <= launch.node_rank < launch.nnodes:
        raise DistributedError(f"--node-rank ({launch.node_rank}) must be from 0 to --nnodes - 1 ({launch.nnodes - 1})")
    require_timeout(launch.rank_timeout)
    if launch.nnodes > 1:
        if not launch.rdzv_endpoint:
            raise DistributedError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        split_endpoint(launch.rdzv_endpoint)
    elif launch.rdzv_endpoint is not None:
        split_endpoint(launch.rdzv_endpoint)
    return launch


def check_reachable(launch: Launch) -> None:
    if launch.nnodes > 1:
        check_rendezvous(launch.rdzv_endpoint, hosts_store=launch.node_rank == 0,
                         timeout_s=min(launch.rank_timeout, 60.0))


def torchrun_command(launch: Launch, run_arguments: list[str]) -> list[str]:
    """torchrun (the venv's, beside this Python) starting ``solrl run`` on every local rank."""
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun) if torchrun.exists() else "torchrun", f"--nproc-per-node={launch.nproc_per_node}",
               "--max-restarts=0"]
    if launch.nnodes == 1 and launch.rdzv_endpoint is None:
        command.append("--standalone")  # a free port on this machine, no rendezvous to set up
    else:
        command += [f"--nnodes={launch.nnodes}", f"--node-rank={launch.node_rank}", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={launch.rdzv_endpoint}", f"--rdzv-id={launch.rdzv_id}",
                    f"--rdzv-conf=join_timeout={int(launch.rank_timeout)}"]
    return command + ["-m", "flows.cli", "run", *run_arguments]


def run_arguments(preset: str | None, family: str | None, overrides: list[str], iterations: int | None,
                  out: Path | None, resume: Path | None, tracking: bool, tracking_uri: str | None) -> list[str]:
    """The `solrl run` arguments each rank gets (no scale-out flags: the ranks read torchrun's
    environment instead)."""
    arguments = [*(["--preset", preset] if preset else []), *(["--family", family] if family else [])]
    for override in overrides:
        arguments += ["-S", override]
    if iterations is not None:
        arguments += ["--iterations", str(iterations)]
    arguments += ["--resume", str(resume)] if resume is not None else ["--out", str(out)]
    if not tracking:
        arguments.append("--no-tracking")
    if tracking_uri:
        arguments += ["--tracking-uri", tracking_uri]
    return arguments


@dataclass
class Outcome:
    returncode: int
    rank_error: str | None  # rank 0's (or else the first rank's) one-line error, when one printed it
    stderr: str


def start(launch: Launch, arguments: list[str], extra_environment: dict[str, str] | None = None) -> Outcome:
    """Run torchrun to the end. Its children's stdout passes through; stderr is kept, so a failed run
    ends in one line (the caller's) instead of torchrun's multi-page report."""
    environment = {**os.environ, TIMEOUT_VARIABLE: str(launch.rank_timeout), **(extra_environment or {})}
    # One thread per rank unless told otherwise (torchrun would say the same in a warning).
    environment.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as stderr:
        process = subprocess.run(torchrun_command(launch, arguments), env=environment, stderr=stderr,
                                 stdin=subprocess.DEVNULL)
        stderr.seek(0)
        text = stderr.read()
    errors = [line.strip() for line in text.splitlines() if line.strip().startswith("solrl: error:")]
    main_errors = [line for line in errors if not line.startswith("solrl: error: rank ")]
    rank_error = (main_errors or errors or [None])[0]
    return Outcome(process.returncode, rank_error.removeprefix("solrl: error: ") if rank_error else None, text)
