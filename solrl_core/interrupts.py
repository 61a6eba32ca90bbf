"""How a `solrl` command stops on Ctrl-C (SIGINT) and on SIGTERM: the same way for both, in seconds.

Ctrl-C raises KeyboardInterrupt in the main thread. SIGTERM (``kill``, a supervisor, a batch
system's preemption) would end the process on the spot, with no word and no cleanup; here it
raises :class:`Terminated` instead, itself a KeyboardInterrupt, so that Prefect's engine, the
training loop and every ``finally`` unwind exactly as for Ctrl-C: the flow run and the MLflow run
are closed, the checkpoint (written atomically) stays the last complete one, and the CLI ends with
one line and exit code 128 + the signal's number (130, 143), as a shell reports a process killed
by it.

A second signal while the first one unwinds stops the process at once (``os._exit``): for whoever
does not want to wait for the reporting. The helper processes still end then: Prefect's server by
its watchdog, torchrun by its parent-death signal (see flows/ephemeral_server.py, launch.py).
Where a wait must not be cut short (torchrun stopping its ranks), :func:`shielded` makes further
signals wait for it instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# The stop signals this process received, in order (empty: none). Module state, because a signal
# handler has nowhere else to leave it, and one process has one set of handlers.
_received: list[int] = []
_shield_depth = 0


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C's KeyboardInterrupt is."""


class RunInterrupted(Exception):
    """A run stopped by a signal; the message is the CLI's one line (where its checkpoint is)."""

    def __init__(self, line: str, signum: int):
        super().__init__(line)
        self.exit_code = exit_code(signum)


def received() -> int | None:
    """The first stop signal this process received, or None."""
    return _received[0] if _received else None


def exit_code(signum: int) -> int:
    return 128 + int(signum)


def is_stop_signal(error: BaseException, also: tuple[type[BaseException], ...] = ()) -> bool:
    """Whether ``error`` ended a run because it was stopped (MLflow's KILLED) rather than failed:
    Ctrl-C, SIGTERM as :func:`stopping_on_signals` raises it (a KeyboardInterrupt too), an
    orchestrator's own stop exception among ``also`` (Prefect's TerminationSignal in a flow run);
    or any error after a stop signal arrived (under torchrun, a collective that broke off as a peer
    stopped)."""
    return isinstance(error, (KeyboardInterrupt, *also)) or received() is not None


def _on_stop_signal(signum: int, frame) -> None:
    _received.append(signum)
    if len(_received) == 1:
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    if _shield_depth == 0:
        print(f"solrl: stopped at once by a second {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        os._exit(exit_code(_received[0]))


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt / :class:`Terminated` for the duration (main
    thread only: elsewhere Python cannot set handlers, and the caller's stay).

    The previous handlers come back at the end, unless a signal arrived: then the process is
    ending, and its exit handlers (Prefect stopping its server) still get these."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    previous = {signum: signal.signal(signum, _on_stop_signal) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        if not _received:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Further stop signals are only recorded, not acted on, for the duration (a bounded wait)."""
    global _shield_depth
    _shield_depth += 1
    try:
        yield
    finally:
        _shield_depth -= 1
