"""Prefect's ephemeral server ends with the process that started it, however that process ends.

Without ``PREFECT_API_URL``, ``solrl run`` has Prefect start a temporary API server as a child
process (uvicorn, about 200 MB). Prefect stops it at exit (``atexit``), which never runs when the
run is killed (SIGKILL, the OOM killer, a lost node): the server lived on with no parent, and on
a machine where runs crash and resume they piled up.

So the server is started here, before the flow, and a watchdog process (the standard library
only, a few MB) waits for this process to end and then stops the server. It learns of the end from
a pipe that only this process holds open (end-of-file the moment it dies, by any cause), and as a
fallback from its parent pid changing. A pidfd names the server, so a pid reused after the server
has already stopped is never signalled.

The server and its watchdog each run in a session of their own, outside the run's process group:
a terminal's Ctrl-C (SIGINT to the whole foreground group) used to kill the server at once, and
the interrupted flow then spent minutes retrying to report its end to it. Now the run reports to
a live server, and the watchdog, which a signal to the group cannot reach either, stops it once
the run's process has ended (Prefect's own exit handler usually has by then).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WATCHDOG = Path(__file__).with_name("_server_watchdog.py")
# Server pid -> its watchdog. The Popen objects hold the pipes' write ends: dropped, the watchdog
# would take it as this process's end.
_watchdogs: dict[int, subprocess.Popen] = {}


def uses_ephemeral_server() -> bool:
    from prefect.settings import get_current_settings

    return not get_current_settings().api.url


def end_server_with_this_process() -> int | None:
    """Start Prefect's ephemeral server (the one the flow will use) and a watchdog bound to this
    process; returns the server's pid, or None when a configured server is used instead."""
    if not uses_ephemeral_server():
        return None
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # Prefect's own instance: its clients connect to this one
    _in_a_session_of_its_own(server)
    server.start()
    pid = server.server_process.pid
    watchdog = _watchdogs.get(pid)
    if watchdog is None or watchdog.poll() is not None:
        _watchdogs[pid] = subprocess.Popen(
            [sys.executable, "-I", "-S", str(WATCHDOG), str(pid)], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)
    return pid


def _in_a_session_of_its_own(server) -> None:
    """Have ``server`` start its uvicorn process in a new session. Prefect builds the command (its
    arguments, its settings in the environment) in ``_run_uvicorn_command``, with no way to ask
    for a session: so, for that one call, the ``subprocess`` its module sees starts new sessions."""
    from prefect.server.api import server as server_module

    prefect_command = type(server)._run_uvicorn_command

    def run_uvicorn_in_own_session() -> subprocess.Popen:
        server_module.subprocess = _NewSessionSubprocess()
        try:
            return prefect_command(server)
        finally:
            server_module.subprocess = subprocess

    server._run_uvicorn_command = run_uvicorn_in_own_session  # also for a retry on a taken port


class _NewSessionSubprocess:
    """The ``subprocess`` module, except that ``Popen`` starts the child in a new session."""

    def __getattr__(self, name: str):
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args, **kwargs) -> subprocess.Popen:  # noqa: N802 - subprocess's name
        return subprocess.Popen(*args, **{**kwargs, "start_new_session": True})
