"""Watchdog of Prefect's ephemeral server (see flows/ephemeral_server.py):

    python -I -S flows/_server_watchdog.py SERVER_PID

waits until the process that started it ends (its stdin, a pipe only that process holds, reaches
end-of-file; or its parent pid changes), then stops the server: SIGTERM, and SIGKILL after a grace
period. Standard library only, so it starts in milliseconds and holds a few MB.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

POLL_SECONDS = 1.0
GRACE_SECONDS = 10.0


def open_server(pid: int) -> int | None:
    """A pidfd for the server (Linux 5.3+): it names that process, never a later one with its pid."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here, or the server is already gone
        return None


def send(pid: int, pidfd: int | None, signum: int) -> bool:
    """Signal the server; False once it is gone."""
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


def wait_for_parent_to_end(parent: int) -> None:
    while True:
        readable, _, _ = select.select([sys.stdin.fileno()], [], [], POLL_SECONDS)
        if readable and not os.read(sys.stdin.fileno(), 4096):
            return  # end-of-file: the parent is gone, however it ended
        if os.getppid() != parent:
            return  # reparented: the parent is gone (a forked child may still hold the pipe)


def stop_server(pid: int, pidfd: int | None) -> None:
    if not send(pid, pidfd, signal.SIGTERM):
        return
    deadline = time.monotonic() + GRACE_SECONDS
    while time.monotonic() < deadline:
        if pidfd is not None:
            if select.select([pidfd], [], [], 0.2)[0]:  # readable: the server has exited
                return
        elif not send(pid, None, 0):
            return
        else:
            time.sleep(0.2)
    send(pid, pidfd, signal.SIGKILL)


def main(argv: list[str]) -> int:
    server = int(argv[0])
    parent = os.getppid()
    # Started in a session of its own, out of reach of a terminal's Ctrl-C; should a SIGINT come
    # anyway (sent to it directly), it must still outlive its parent to clean up after it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pidfd = open_server(server)
    wait_for_parent_to_end(parent)
    stop_server(server, pidfd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
