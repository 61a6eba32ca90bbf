"""`solrl run` killed with SIGKILL takes its Prefect ephemeral server with it.

Was: each killed run left its server (`uvicorn ... prefect.server.api.server`, about 200 MB) running
with no parent. The run here is a real `solrl run` in a session of its own, killed by SIGKILL in
its first explore stage (SOLRL_FAULT); every process of that session must then end by itself, and
so must the server, which runs in a session of its own (out of reach of a terminal's Ctrl-C:
tests/test_interrupt.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._services import ROOT, environment

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")]

TINY = ["prompts_per_iteration=2", "pool=8", "keep=4", "eval.prompts=2", "eval.steps=4", "explore.steps=3",
        "regenerate.steps=4", "iterations=1", "progress=false"]
SERVER = "prefect.server.api.server"


def processes_in_group(group: int) -> dict[int, str]:
    """pid -> command line of every live process whose process group is ``group``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (name) "
            if int(fields[2]) == group and fields[0] != "Z":  # field 5 of stat: the process group
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue  # ended while being read
    return found


def servers_on(port: int) -> dict[int, str]:
    """pid -> command line of every live Prefect server process listening on ``port``, wherever it runs."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # not a process, or ended while being read
        if SERVER in line and f"--port {port} " in line:
            found[int(entry.name)] = line
    return found


def test_a_sigkilled_run_leaves_no_prefect_server_behind(tmp_path):
    env = environment(SOLRL_FAULT="kill@explore:0")  # no PREFECT_API_URL: the ephemeral server
    arguments = [sys.executable, "-m", "flows.cli", "run", "--out", str(tmp_path / "run"), "--no-tracking",
                 *[f"-S{override}" for override in TINY]]
    log = tmp_path / "run.log"
    with log.open("w") as output:
        process = subprocess.Popen(arguments, env=env, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert process.wait(timeout=600) == -signal.SIGKILL, log.read_text()[-3000:]
        started = re.search(r"Starting temporary server on http://127\.0\.0\.1:(\d+)", log.read_text())
        assert started, log.read_text()[-3000:]
        deadline = time.monotonic() + 60
        left = {**processes_in_group(process.pid), **servers_on(int(started[1]))}
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = {**processes_in_group(process.pid), **servers_on(int(started[1]))}
        assert not left, f"still running after the run was killed: {left}"
    finally:
        try:  # whatever is left, so a failing test leaves nothing running either
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_watchdog_stops_a_server_once_its_parent_is_gone(tmp_path):
    """The watchdog alone, on a stand-in server: its parent's pipe closes, the server gets SIGTERM."""
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        watchdog = subprocess.Popen([sys.executable, "-I", "-S", str(ROOT / "flows" / "_server_watchdog.py"),
                                     str(server.pid)], stdin=subprocess.PIPE)
        time.sleep(0.5)
        assert server.poll() is None and watchdog.poll() is None, "nothing may stop while the parent lives"
        watchdog.stdin.close()  # as when this process dies: the pipe's last write end closes
        assert watchdog.wait(timeout=30) == 0
        assert server.wait(timeout=30) == -signal.SIGTERM
    finally:
        if server.poll() is None:
            server.kill()
