"""One writer per run folder (solrl_core/run_lock.py): a second run into a held folder stops at
once with exit 2 and one line naming the holder; a holder killed by SIGKILL holds nothing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from solrl_core import run_lock

ROOT = Path(__file__).resolve().parent.parent
# A process that holds FOLDER (argv[1]) until it is killed, saying when it has it.
HOLDER = ("import sys, time; from pathlib import Path; from solrl_core import run_lock\n"
          "with run_lock.held(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(600)")


@pytest.fixture()
def holder(tmp_path):
    """Another process holding tmp_path/run; SIGKILLed at the end if still alive."""
    folder = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    yield folder, process
    process.kill()
    process.wait()


def test_a_held_folder_is_refused_naming_the_holder(holder):
    folder, process = holder
    with pytest.raises(run_lock.RunFolderBusy) as refused, run_lock.held(folder):
        pass
    message = str(refused.value)
    assert f"pid {process.pid} on {socket.gethostname()}, since " in message and str(folder) in message
    with pytest.raises(run_lock.RunFolderBusy):
        run_lock.require_free(folder)


def test_a_sigkilled_holder_holds_nothing(holder):
    folder, process = holder
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert (folder / run_lock.LOCK_FILE).exists(), "the file stays; the lock died with its holder"
    run_lock.require_free(folder)
    with run_lock.held(folder):
        record = json.loads((folder / run_lock.LOCK_FILE).read_text())
        assert record["pid"] == os.getpid()
    assert not (folder / run_lock.LOCK_FILE).exists(), "a run that ends removes its lock file"


def test_the_lock_nests_in_one_process_and_passes_to_its_ranks(tmp_path):
    folder = tmp_path / "run"
    with run_lock.held(folder):
        with run_lock.held(folder):  # the CLI took it, the training loop takes it again
            pass
        assert (folder / run_lock.LOCK_FILE).exists(), "still held after the inner release"
        environment = {**os.environ, **run_lock.environment_for_children(folder)}
        child = subprocess.run([sys.executable, "-c", HOLDER.replace("time.sleep(600)", "pass"), str(folder)],
                               cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)
        assert child.returncode == 0 and child.stdout.strip() == "held", child.stderr[-2000:]
        assert (folder / run_lock.LOCK_FILE).exists(), "a rank writing under its launcher's lock leaves it"
        stale = {**os.environ, run_lock.HOLDER_ENVIRONMENT: f"1:{folder}"}  # a variable is no lock
        refused = subprocess.run([sys.executable, "-c", HOLDER.replace("time.sleep(600)", "pass"), str(folder)],
                                 cwd=ROOT, env=stale, capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "RunFolderBusy" in refused.stderr
    assert not folder.exists(), "a folder the lock created and nothing was written to is removed"


@pytest.mark.slow
def test_two_runs_into_one_folder_at_once_one_runs_the_other_stops(tmp_path):
    """The issue's case: the same tiny run twice at the same moment into one --out."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "flows.cli", "run", "--preset", "shapes-tiny", "--family", "sol_rl",
               "--iterations", "2", "--out", str(out), "--no-tracking", "-S", "prompts_per_iteration=2",
               "-S", "pool=8", "-S", "keep=4", "-S", "eval.prompts=2", "-S", "eval.steps=4", "-S", "explore.steps=3",
               "-S", "regenerate.steps=4", "-S", "progress=false"]
    processes = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True) for _ in range(2)]
    try:
        outcomes = outcomes_as_they_end(processes)
    finally:
        for process in processes:
            with_group_killed(process)
    codes = sorted(code for code, _, _ in outcomes)
    assert codes == [0, 2], [(code, err[-2000:]) for code, err, _ in outcomes]
    [(_, refusal, seconds)] = [outcome for outcome in outcomes if outcome[0] == 2]
    line = refusal.strip()
    assert line.count("\n") == 0 and line.startswith("solrl: error: run folder"), line
    assert "is in use by another run (pid " in line and socket.gethostname() in line
    assert seconds < 60, f"refused after {seconds:.0f} s: it waited for the other run instead of stopping at once"
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(text)["iteration"] for text in lines] == [0, 1], "one run's records, not two"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def outcomes_as_they_end(processes: list[subprocess.Popen], timeout: float = 900) -> list[tuple[int, str, float]]:
    """(exit code, stderr, seconds to exit) of each process, timed as each one ends."""
    started, ended = time.monotonic(), {}
    while len(ended) < len(processes) and time.monotonic() - started < timeout:
        for index, process in enumerate(processes):
            if index not in ended and process.poll() is not None:
                ended[index] = time.monotonic() - started
        time.sleep(0.2)
    return [(process.wait(timeout=1), process.stderr.read(), ended[index]) for index, process in enumerate(processes)]


def with_group_killed(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # Prefect's server of a run that failed a check
    except ProcessLookupError:
        pass
