"""Fault injection for the reliability tests: named points in the run where a test can make the
process die or fail, so that resume and error handling are tested on the real code path.

``SOLRL_FAULT="ACTION@POINT:ITERATION[,ACTION@POINT:ITERATION...]"``, read once per process:

* ``kill``   SIGKILL this process (nothing gets to clean up, as with an OOM kill or a lost node);
* ``raise``  raise :class:`InjectedFault` every time the point is reached in that iteration;
* ``raise-once``  raise the first time only (a transient failure: a retry succeeds);
* ``enospc`` raise ``OSError(ENOSPC)`` (a full disk) at a write point;
* ``hang``   sleep for ever, alive (a rank stuck in a driver call or a deadlock: under torchrun
  the other ranks must end the run within ``--rank-timeout``);
* ``pause``  wait, alive, until the file named by ``SOLRL_FAULT_GATE`` exists: the test changes
  the world around the run at a known point (stops a server the run reports to), then lets it go on.

Points (see the ``faults.point`` calls): ``explore`` (pool sampled, not yet scored), ``update``
(between optimizer steps), ``ledger`` (ledger written, metrics and checkpoint not yet),
``checkpoint`` (checkpoint's temporary file written, not yet renamed into place), and
``write:<file name>`` (a temporary file of that output half-written).

Under torchrun, ``SOLRL_FAULT_RANK=R`` confines the faults to the rank R (a rank that dies while
the others run on).

Unset (the normal case) every point is one dictionary lookup.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass

ENVIRONMENT = "SOLRL_FAULT"
RANK_ENVIRONMENT = "SOLRL_FAULT_RANK"
GATE_ENVIRONMENT = "SOLRL_FAULT_GATE"
ACTIONS = ("kill", "raise", "raise-once", "enospc", "hang", "pause")


class InjectedFault(RuntimeError):
    """The failure a ``raise`` fault injects."""


@dataclass(frozen=True)
class Fault:
    action: str
    point: str
    iteration: int


def parse(text: str) -> list[Fault]:
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        action, _, rest = item.partition("@")
        point, _, iteration = rest.rpartition(":")
        if action not in ACTIONS or not point or not iteration.lstrip("-").isdigit():
            raise ValueError(f"{ENVIRONMENT}: '{item}' is not ACTION@POINT:ITERATION with ACTION in {ACTIONS}")
        faults.append(Fault(action, point, int(iteration)))
    return faults


_current_iteration = -1
_fired: set[Fault] = set()
_faults: list[Fault] | None = None


def at_iteration(iteration: int) -> None:
    """The training loop says which iteration it is in (-1: set-up and the base evaluation)."""
    global _current_iteration
    _current_iteration = iteration


def point(name: str) -> None:
    """A place where an injected fault may strike; does nothing unless SOLRL_FAULT names it."""
    global _faults
    if _faults is None:
        wanted_rank = os.environ.get(RANK_ENVIRONMENT, "")
        this_rank = wanted_rank == "" or wanted_rank == os.environ.get("RANK", "0")
        _faults = parse(os.environ.get(ENVIRONMENT, "")) if this_rank else []
    for fault in _faults:
        if fault.point == name and fault.iteration == _current_iteration:
            _strike(fault)


def _strike(fault: Fault) -> None:
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.action == "hang":
        while True:
            time.sleep(3600)
    if fault.action == "pause":
        _wait_for_gate()
        return
    if fault.action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if fault.action == "raise-once" and fault in _fired:
        return
    _fired.add(fault)
    raise InjectedFault(f"injected fault at {fault.point} in iteration {fault.iteration}")


def _wait_for_gate() -> None:
    gate = os.environ.get(GATE_ENVIRONMENT)
    if not gate:
        raise ValueError(f"{ENVIRONMENT}: a pause needs {GATE_ENVIRONMENT}, the file whose existence ends it")
    while not os.path.exists(gate):
        time.sleep(0.1)


def reset() -> None:
    """Forget parsed faults and what fired (tests that change SOLRL_FAULT in one process)."""
    global _faults, _current_iteration
    _faults, _current_iteration = None, -1
    _fired.clear()
