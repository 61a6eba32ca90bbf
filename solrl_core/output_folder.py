"""The output folder of a run: new (or holding nothing but what a killed run leaves) and writable,
checked before anything heavy starts. Used by `solrl run` and its preflight, `solrl check`."""

from __future__ import annotations

import contextlib
from pathlib import Path

from solrl_core import run_lock
from solrl_core.cli_studies import output_path
from solrl_core.command_errors import UserError

# Not a run's outputs: a lock file a killed run left (no lock once its holder is dead) and the
# probe of a run that is checking it can write here.
_NO_OUTPUTS = (run_lock.LOCK_FILE, ".solrl-write-probe")


def new_output_directory(text: str) -> Path:
    out_dir = output_path(text, "--out", directory=True)
    if out_dir.exists() and any(not entry.name.startswith(_NO_OUTPUTS) for entry in out_dir.iterdir()):
        run_lock.require_free(out_dir)  # a run writing there now is the answer, not its files
        raise UserError(f"output directory {out_dir} is not empty; choose a new --out (or --resume it)")
    return out_dir


def writable_or_raise(out_dir: Path) -> None:
    """Create ``out_dir`` if needed and write a probe file in it: an unwritable place (a file on the
    path, no permission, a read-only or full disk) is one line before the run starts, not a crash
    after an hour of exploring. A directory this check created is removed again on failure."""
    created = [parent for parent in (out_dir, *out_dir.parents) if not parent.exists()]
    probe = out_dir / ".solrl-write-probe"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"0" * 4096)
        probe.unlink()
    except OSError as error:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
            for directory in created:
                if directory.exists():
                    directory.rmdir()
        raise UserError(f"cannot write to output directory {out_dir}: {error.strerror or error}; "
                        "choose a writable place with free space") from None
