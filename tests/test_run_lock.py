"""One writer per run folder (solrl_core/run_lock.py): a second run into a held folder stops at
once with exit 2 and one line naming the holder; a holder killed by SIGKILL holds nothing. Two
real runs into one folder at once are a row of the fault matrix (tests/test_fault_matrix.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
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
