"""One writer per run folder: an exclusive OS lock held for the run's whole life.

Two runs into one ``--out`` (a command re-run in a second terminal, a deployment started twice)
would interleave their records in one folder without a word. So the writing process takes
``fcntl.flock`` on ``.solrl.lock`` inside the folder before it writes anything, and keeps it until
the run ends. The kernel releases the lock when the holder dies by any cause (SIGKILL, the OOM
killer), so a killed run's folder is resumable at once: a left-behind lock file is not a lock.

The holder writes its pid, host and start time into the file, so that a refused run can say who
holds the folder. Under torchrun, the launcher that holds the lock names itself to its ranks
(:data:`HOLDER_ENVIRONMENT`); rank 0 then writes under the launcher's lock instead of failing on it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from solrl_core.command_errors import UserError

LOCK_FILE = ".solrl.lock"
# Set by a process holding a folder's lock for the processes it starts (torchrun's ranks): "pid:folder".
HOLDER_ENVIRONMENT = "SOLRL_RUN_FOLDER_HOLDER"
# A holder writes its record right after it takes the lock; a refused run waits this long for it.
_RECORD_WAIT_S = 1.0

# Folders this process holds: resolved path -> (open lock file descriptor, nesting depth). The CLI
# takes the lock before Prefect starts, the training loop again inside the flow: one lock.
_held: dict[Path, list[int]] = {}


class RunFolderBusy(UserError):
    """Another live run holds the folder."""


@contextlib.contextmanager
def held(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir`` (created if needed) for the duration; raises :class:`RunFolderBusy` at once
    when another run holds it."""
    folder = Path(out_dir).resolve()
    if folder in _held or _inherited(folder):
        _held.setdefault(folder, [-1, 0])[1] += 1
        try:
            yield
        finally:
            _release(folder)
        return
    created = not folder.exists()
    descriptor = _acquire(folder)
    _held[folder] = [descriptor, 1]
    try:
        yield
    finally:
        _release(folder, created)


def require_free(out_dir: Path) -> None:
    """Raise :class:`RunFolderBusy` when another run holds ``out_dir`` (for the checks a run makes
    before it takes the lock itself, so that their answer is not about a folder mid-write)."""
    folder = Path(out_dir).resolve()
    path = folder / LOCK_FILE
    if folder in _held or _inherited(folder) or not path.is_file():
        return
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return  # unreadable or gone: the run's own checks will say what is wrong with the folder
    try:
        if not _try_lock(descriptor, fcntl.LOCK_SH):
            raise RunFolderBusy(_busy_line(folder, descriptor))
        fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


def environment_for_children(out_dir: Path) -> dict[str, str]:
    """What the processes this one starts need to write under its lock of ``out_dir`` (none when
    this process does not hold it)."""
    folder = Path(out_dir).resolve()
    return {HOLDER_ENVIRONMENT: f"{os.getpid()}:{folder}"} if folder in _held else {}


def _inherited(folder: Path) -> bool:
    """Whether a parent holds ``folder`` for this process: it named itself in the environment and
    the lock file's record says it is the holder (a stale variable grants nothing)."""
    pid, _, named = os.environ.get(HOLDER_ENVIRONMENT, "").partition(":")
    if not pid.isdigit() or Path(named) != folder:
        return False
    record = _read_record(folder / LOCK_FILE)
    return record.get("pid") == int(pid) and record.get("host") == socket.gethostname() and _alive(int(pid))


def _acquire(folder: Path) -> int:
    """The lock file's descriptor, exclusively locked and holding this process's record."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _lock_unless_recorded(descriptor):
            try:
                raise RunFolderBusy(_busy_line(folder, descriptor))
            finally:
                os.close(descriptor)
        # A holder removes the file as it ends; a lock taken on a removed file guards nothing.
        if _same_file(descriptor, path):
            break
        os.close(descriptor)
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "since": datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")}
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, json.dumps(record).encode("utf-8"), 0)
    return descriptor


def _release(folder: Path, created: bool = False) -> None:
    entry = _held[folder]
    entry[1] -= 1
    if entry[1] > 0:
        return
    del _held[folder]
    descriptor = entry[0]
    if descriptor < 0:  # a parent's lock: it removes the file
        return
    # Removed while still locked, so that no other run takes a lock on a file about to go.
    with contextlib.suppress(OSError):
        (folder / LOCK_FILE).unlink()
    os.close(descriptor)
    if created:  # a run stopped before writing anything leaves no empty folder behind
        with contextlib.suppress(OSError):
            folder.rmdir()


def _lock_unless_recorded(descriptor: int) -> bool:
    """Take the exclusive lock, retrying for a moment while whoever holds it has written no record:
    that is a holder still starting, or another run's momentary :func:`require_free` probe."""
    deadline = time.monotonic() + _RECORD_WAIT_S
    while not _try_lock(descriptor, fcntl.LOCK_EX):
        if _parse(os.pread(descriptor, 4096, 0)) or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _try_lock(descriptor: int, kind: int) -> bool:
    try:
        fcntl.flock(descriptor, kind | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _same_file(descriptor: int, path: Path) -> bool:
    try:
        on_disk = path.stat()
    except FileNotFoundError:
        return False
    opened = os.fstat(descriptor)
    return (opened.st_dev, opened.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _busy_line(folder: Path, descriptor: int) -> str:
    record = _wait_for_record(descriptor)
    holder = (f"pid {record.get('pid', '?')} on {record.get('host', '?')}, since {record.get('since', '?')}"
              if record else "a process that has not yet said who it is")
    return (f"run folder {folder} is in use by another run ({holder}); wait for it to end, stop it, "
            f"or choose another folder")


def _wait_for_record(descriptor: int) -> dict:
    deadline = time.monotonic() + _RECORD_WAIT_S
    while True:
        record = _parse(os.pread(descriptor, 4096, 0))
        if record or time.monotonic() > deadline:
            return record
        time.sleep(0.05)


def _read_record(path: Path) -> dict:
    try:
        return _parse(path.read_bytes()[:4096])
    except OSError:
        return {}


def _parse(data: bytes) -> dict:
    try:
        record = json.loads(data.decode("utf-8"))
    except ValueError:  # empty (being written) or not ours
        return {}
    return record if isinstance(record, dict) else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
