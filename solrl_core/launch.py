"""Starting a run on several ranks with torchrun: the `solrl run` scale-out flags, the checks made
before torchrun starts, and torchrun itself as a child process (the `--nproc-per-node N` of
`solrl run` and the `nproc_per_node` of a Prefect deployment both come here).

torchrun starts ``python -m flows.cli run ...`` (the `solrl` command) once per rank with RANK / WORLD_SIZE / ... in
the environment; the CLI reads them (see ``command_run``). Users may equally call torchrun
themselves: ``torchrun --nproc-per-node 8 -m flows.cli run ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from solrl_core import interrupts
from solrl_core.distributed import (DEFAULT_TIMEOUT_S, TIMEOUT_VARIABLE, DistributedError, check_rendezvous,
                                    require_timeout, split_endpoint)

# Set for rank 0 by a Prefect flow run that starts torchrun: the flow run's context, so rank 0's
# stage tasks are task runs of that flow run (see flows/solrl.py).
PREFECT_CONTEXT_VARIABLE = "SOLRL_PREFECT_CONTEXT"
# On a stop signal torchrun passes it to the ranks and waits this long before it kills them; rank 0
# needs the time to close its Prefect flow run and MLflow run (a few seconds).
TORCHRUN_SHUTDOWN_S = 30
_STOP_MARGIN_S = 15  # past that, torchrun itself is stuck: it and its ranks are killed
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


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


def check_local_gpus(launch: Launch, device_type: str, visible: int | None = None) -> None:
    """On GPUs a rank takes one GPU of its machine (distributed.process_group), so a node's ranks
    must not outnumber the GPUs it shows; more would put two ranks on one GPU or fail in NCCL's
    setup, minutes in. CPU ranks (gloo) share the cores and have no such limit."""
    if device_type != "cuda":
        return
    visible = torch.cuda.device_count() if visible is None else visible
    if launch.nproc_per_node > visible:
        shown_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={shown_devices})" if shown_devices is not None else ""
        instead = (f"use --nproc-per-node {visible} or fewer, or make more GPUs visible" if visible else
                   "run on the CPU (-S model.device=cpu) or on a machine with GPUs")
        raise DistributedError(f"--nproc-per-node {launch.nproc_per_node} needs one GPU per rank, but this machine "
                               f"shows {visible}{where}: {instead}")


def check_reachable(launch: Launch) -> None:
    if launch.nnodes > 1:
        check_rendezvous(launch.rdzv_endpoint, hosts_store=launch.node_rank == 0,
                         timeout_s=min(launch.rank_timeout, 60.0))


def torchrun_command(launch: Launch, run_arguments: list[str]) -> list[str]:
    """torchrun (the venv's, beside this Python) starting ``solrl run`` on every local rank."""
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun) if torchrun.exists() else "torchrun", f"--nproc-per-node={launch.nproc_per_node}",
               "--max-restarts=0", f"--shutdown-timeout={TORCHRUN_SHUTDOWN_S}"]
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
    ends in one line (the caller's) instead of torchrun's multi-page report.

    torchrun runs in a session of its own, so that a stop signal reaches it once, from here: a
    terminal's Ctrl-C reaches this process's group only, a supervisor's SIGTERM this pid only, and
    either way this process passes it on (see :func:`_stop_torchrun`); torchrun passes it to the
    ranks and waits for them. Sent twice, torchrun would break off its own shutdown and leave the
    ranks (each in a session of its own) running. Should this process die without a word
    (SIGKILL), torchrun gets SIGTERM from the kernel (:func:`_end_with_parent`)."""
    environment = {**os.environ, TIMEOUT_VARIABLE: str(launch.rank_timeout), **(extra_environment or {})}
    # One thread per rank unless told otherwise (torchrun would say the same in a warning).
    environment.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as stderr:
        process = subprocess.Popen(torchrun_command(launch, arguments), env=environment, stderr=stderr,
                                   stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_end_with_parent)
        try:
            process.wait()
        except BaseException as stop:  # Ctrl-C, SIGTERM (interrupts.Terminated), Prefect's TerminationSignal
            _stop_torchrun(process, _signal_to_pass_on(stop))
            raise
        stderr.seek(0)
        text = stderr.read()
    errors = [line.strip() for line in text.splitlines() if line.strip().startswith("solrl: error:")]
    main_errors = [line for line in errors if not line.startswith("solrl: error: rank ")]
    rank_error = (main_errors or errors or [None])[0]
    return Outcome(process.returncode, rank_error.removeprefix("solrl: error: ") if rank_error else None, text)


def _end_with_parent() -> None:
    """In torchrun's process, before it starts: SIGTERM when this (its parent) process dies. Linux
    only (prctl PR_SET_PDEATHSIG); elsewhere torchrun outlives a parent killed by SIGKILL."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def _signal_to_pass_on(stop: BaseException) -> int:
    """The signal that stopped this process (SIGINT for a bare KeyboardInterrupt), else SIGTERM."""
    if interrupts.received() is not None:
        return interrupts.received()
    if isinstance(stop, KeyboardInterrupt):
        return signal.SIGINT
    return int(getattr(stop, "signal", signal.SIGTERM))  # Prefect's TerminationSignal names its own


def _stop_torchrun(process: subprocess.Popen, signum: int) -> None:
    """Pass ``signum`` to torchrun and wait while it stops the ranks (SIGKILL for those that outlast
    its shutdown timeout); only if torchrun itself outlasts that, kill it and its ranks."""
    with interrupts.shielded():
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)
        deadline = time.monotonic() + TORCHRUN_SHUTDOWN_S + _STOP_MARGIN_S
        while process.poll() is None and time.monotonic() < deadline:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
            except BaseException:  # noqa: BLE001 - another signal (Prefect's handler raises): keep waiting
                continue
        if process.poll() is None:
            for pid in [*_children(process.pid), process.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.wait()


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (torchrun's ranks), from /proc (empty elsewhere)."""
    children = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = entry.read_text()
        except OSError:
            continue  # ended while being read
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:  # the field after the state: the parent pid
            children.append(int(entry.parent.name))
    return children
