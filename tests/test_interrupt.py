"""Ctrl-C and SIGTERM stop `solrl run` within seconds, with one line, and leave nothing running.

Was: a terminal's Ctrl-C (SIGINT to the whole foreground group) killed Prefect's ephemeral server
at once; the interrupted flow then retried for minutes to report its end to it, and the run
blamed ConnectError; SIGTERM ended it with no word. Each test here is a real `solrl run` in a
session of its own (so it is the foreground group a terminal would signal), stopped by a real
signal once its second checkpoint is written; then:

* the exit code is 128 + the signal (130, 143), stderr is one line that names the checkpointed
  iteration count and the resume command, and neither stream holds a traceback;
* every process the run had started (Prefect's server and its watchdog; torchrun, its ranks and
  rank 0's server) has ended;
* the checkpoint loads (its tensors match their digest), and the command the line gives continues
  the run to its end; a tracked run's MLflow run is KILLED, then FINISHED by the resume.

Seconds from the signal to the exit are recorded as the property ``stop_s`` (no limit asserted:
they are figures for docs/reliability.md, measured on whatever machine runs the suite). Ctrl-C to
the group and SIGTERM to the main process alone, each resumed, are rows of the fault matrix
(tests/test_fault_matrix.py), which drives them with the helpers here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from solrl_core.checkpoint import CheckpointError, load_checkpoint, read_metadata
from tests._services import BIN, ROOT, environment

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")]

ITERATIONS = 40  # far more than run before the signal: it always lands mid-run
TINY = ["prompts_per_iteration=2", "pool=8", "keep=4", "eval.prompts=4", "progress=false"]
START_TIMEOUT_S = 600  # to the second checkpoint, on a busy machine
STOP_TIMEOUT_S = 60  # a run that has not ended this long after the signal hangs: the test fails
SERVER = "prefect.server.api.server"


def solrl_run(*arguments: str) -> list[str]:
    return [str(BIN / "solrl"), "run", "--preset", "shapes-tiny", "--family", "sol_rl",
            *[part for override in TINY for part in ("-S", override)], *arguments]


def start(command: list[str], log: Path) -> subprocess.Popen:
    """The command in a new session: its own process group, as a terminal's foreground job."""
    env = environment(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with log.with_suffix(".out").open("w") as out, log.with_suffix(".err").open("w") as err:
        return subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def finish(command: list[str], log: Path, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess:
    process = start(command, log)
    try:
        process.wait(timeout=timeout)
    finally:
        kill_group(process)
    return completed(process, log)


def completed(process: subprocess.Popen, log: Path) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(process.args, process.returncode, log.with_suffix(".out").read_text(),
                                       log.with_suffix(".err").read_text())


def kill_group(process: subprocess.Popen) -> None:
    """Whatever is left in the run's group, so a failing test leaves nothing running either."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def checkpointed_iterations(out: Path) -> int | None:
    try:
        return read_metadata(out)["next_iteration"]
    except CheckpointError:
        return None  # not written yet (or being renamed into place)


def wait_for_checkpoint(process: subprocess.Popen, out: Path, iterations: int, log: Path) -> None:
    """Until the checkpoint covers ``iterations`` (1: the second checkpoint; the first is written
    after the base evaluation)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while (checkpointed_iterations(out) or 0) < iterations:
        if process.poll() is not None:
            raise AssertionError(f"the run ended before its checkpoint: {completed(process, log).stderr[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no checkpoint of {iterations} iteration(s) in {START_TIMEOUT_S} s")
        time.sleep(0.2)


# --- processes, from /proc -------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after "pid (name) ": state, ppid, ... (None: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_tree(root: int) -> dict[tuple[int, str], str]:
    """(pid, start time) -> command line of ``root`` and every live descendant. The start time
    tells a process from a later one that got its pid."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) and fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier += children
    found = {}
    for pid in tree:
        if (fields := _stat_fields(pid)) is not None:
            found[(pid, fields[19])] = _command_line(pid)  # field 22 of stat: the start time
    return found


def alive(processes: dict[tuple[int, str], str]) -> dict[tuple[int, str], str]:
    """Those of ``processes`` still running (a zombie has ended: only its exit status is left)."""
    return {key: line for key, line in processes.items()
            if (fields := _stat_fields(key[0])) is not None and fields[0] != "Z" and fields[19] == key[1]}


def wait_until_gone(processes: dict[tuple[int, str], str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while alive(processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(processes), f"still running after the run ended: {alive(processes)}"


# --- one interrupted run ---------------------------------------------------------------------


def interrupt(command: list[str], out: Path, log: Path, signum: int, to_group: bool, record_property,
              after_iterations: int = 1) -> tuple[subprocess.CompletedProcess, dict]:
    """Start ``command``, send ``signum`` (to its group, or to its pid alone) once the checkpoint
    covers ``after_iterations``; the finished process, and the processes it had running then."""
    process = start(command, log)
    try:
        wait_for_checkpoint(process, out, after_iterations, log)
        running = process_tree(process.pid)
        sent = time.monotonic()
        (os.killpg if to_group else os.kill)(process.pid, signum)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {STOP_TIMEOUT_S} s after {signal.Signals(signum).name}") from None
        record_property("stop_s", round(time.monotonic() - sent, 1))
        wait_until_gone(running)
        record_property("all_gone_s", round(time.monotonic() - sent, 1))
    finally:
        kill_group(process)
    return completed(process, log), running


def assert_stopped_in_one_line(result: subprocess.CompletedProcess, signum: int, out: Path,
                               resume: str) -> int:
    """Exit 128 + signum, stderr the one interrupt line; returns the checkpointed iteration count."""
    done = read_metadata(out)["next_iteration"]
    assert result.returncode == 128 + signum, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"solrl: interrupted after {done} of {ITERATIONS} iterations (checkpoint in {out}); resume with `{resume}`"]
    assert "Traceback" not in result.stdout + result.stderr
    load_checkpoint(out)  # every tensor against its digest: the checkpoint is whole
    return done


def assert_the_server_was_running(running: dict) -> None:
    """The run's processes at the signal held Prefect's server and its watchdog: the ones that must
    not outlive it (wait_until_gone checked that they ended)."""
    lines = list(running.values())
    assert any(SERVER in line for line in lines), lines
    assert any("_server_watchdog.py" in line for line in lines), lines


def resume_to_the_end(out: Path, done: int, log: Path, *arguments: str) -> subprocess.CompletedProcess:
    """`solrl run --resume OUT` (the command the line gave), one iteration past the checkpoint."""
    resumed = finish([str(BIN / "solrl"), "run", "--resume", str(out), "-S", f"iterations={done + 1}", *arguments],
                     log)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {out / 'checkpoint.safetensors'} before iteration {done}" in resumed.stdout
    assert len((out / "metrics.jsonl").read_text().splitlines()) == done + 1
    assert (out / "summary.json").is_file()
    return resumed


def mlflow_status(tracking_uri: str, out: Path) -> str:
    import json

    from mlflow import MlflowClient

    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    return MlflowClient(tracking_uri).get_run(run_id).info.status


def a_tracking_store(tmp_path: Path) -> str:
    """A new SQLite store, created here: its tables' creation logs lines on stderr, which belong
    to no run."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()
    return uri


# --- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize(("signum", "to_group", "tracking"), [
    (signal.SIGTERM, True, False),
    (signal.SIGINT, False, True),
], ids=["sigterm-to-the-group", "sigint-to-the-run-alone-tracked"])
def test_either_signal_either_way_stops_the_run(tmp_path, record_property, signum, to_group, tracking):
    """The other two ways of sending: SIGTERM to the group (``kill -TERM -PGID``), SIGINT to the
    main process alone; the checkpoint is whole (resuming from it: the fault matrix's SIGINT and
    SIGTERM rows, tests/test_fault_matrix.py)."""
    out = tmp_path / "run"
    uri = a_tracking_store(tmp_path) if tracking else None
    command = solrl_run("--iterations", str(ITERATIONS), *(["--tracking-uri", uri] if uri else ["--no-tracking"]),
                        "--out", str(out))
    result, running = interrupt(command, out, tmp_path / "run", signum, to_group=to_group,
                                record_property=record_property)
    assert_stopped_in_one_line(result, signum, out, f"solrl run --resume {out}")
    assert_the_server_was_running(running)
    if uri:
        assert mlflow_status(uri, out) == "KILLED"


def test_ctrl_c_on_two_ranks_stops_every_rank_and_resume_continues_on_two(tmp_path, record_property):
    """`--nproc-per-node 2`: Ctrl-C reaches the launcher's group; the launcher passes it to
    torchrun, torchrun to the ranks. The launcher, torchrun, both ranks and rank 0's server end;
    the line's resume command (on 2 ranks) continues the run."""
    out = tmp_path / "run"
    command = solrl_run("--iterations", str(ITERATIONS), "--no-tracking", "--nproc-per-node", "2", "--out", str(out))
    result, running = interrupt(command, out, tmp_path / "run", signal.SIGINT, to_group=True,
                                record_property=record_property)
    done = assert_stopped_in_one_line(result, signal.SIGINT, out, f"solrl run --resume {out} --nproc-per-node 2")
    lines = list(running.values())
    assert len([line for line in lines if "torchrun" in line]) == 1, lines
    ranks = [line for line in lines if re.search(r"-m flows\.cli run\b", line) and "torchrun" not in line]
    assert len(ranks) == 2, lines
    assert_the_server_was_running(running)
    resume_to_the_end(out, done, tmp_path / "resumed", "--no-tracking", "--nproc-per-node", "2")


def test_ctrl_c_before_the_first_checkpoint_says_nothing_was_saved(tmp_path, record_property):
    """Stopped before anything was saved: the line says so and offers no resume (which could only
    fail); the folder holds no checkpoint."""
    out = tmp_path / "run"
    process = start(solrl_run("--iterations", str(ITERATIONS), "--no-tracking", "--out", str(out)), tmp_path / "run")
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not out.is_dir() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the folder is made before Prefect starts, seconds before the first checkpoint
        assert checkpointed_iterations(out) is None
        running = process_tree(process.pid)
        sent = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=STOP_TIMEOUT_S)
        record_property("stop_s", round(time.monotonic() - sent, 1))
        wait_until_gone(running)
    finally:
        kill_group(process)
    result = completed(process, tmp_path / "run")
    assert result.returncode == 130, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"solrl: interrupted before the first checkpoint, so nothing was saved: remove {out} and run the same "
        f"command again"]
    assert checkpointed_iterations(out) is None
