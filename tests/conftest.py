"""Session defaults for the tests: runs the tests start log to a throwaway MLflow store (never the
project's mlflow.db), and nothing phones home. Set before any test imports Prefect or MLflow. The
tests run with the numerics of a run (flush-to-zero, solrl_core.numerics), which importing
solrl_core no longer sets."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

from solrl_core.cli import QUIET_ENVIRONMENT
from solrl_core.numerics import flush_denormals

for _key, _value in QUIET_ENVIRONMENT.items():
    os.environ.setdefault(_key, _value)
flush_denormals()  # before any test starts torch's threads, which inherit it

_STORE = tempfile.mkdtemp(prefix="solrl-test-mlflow-")
atexit.register(shutil.rmtree, _STORE, ignore_errors=True)
os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{_STORE}/mlflow.db")


@pytest.fixture(scope="session")
def tiny_reward_folders(tmp_path_factory):
    """A tiny random instance of each real reward model in its own folder (built once a session)."""
    import _tiny

    return _tiny.save_reward_models(tmp_path_factory.mktemp("tiny-rewards"))


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """A finished one-iteration tiny run (tests/_run_process.py's SMALL), run once a session: the
    resume and fault-matrix tests read it or damage a copy of it, never the folder itself."""
    from tests._run_process import run_process

    out = tmp_path_factory.mktemp("finished") / "run"
    assert run_process(out, "iterations=1") == 0
    return out
