"""What the `solrl` user-error tests share: stubs that make sure an invocation never trains, and the
check of a user error (exit code 2, one line on stderr, nothing on stdout)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import solrl_core.compare
import solrl_core.fidelity


class TrainingStarted(BaseException):
    """Raised by the stubs: an invocation that reaches them would have trained (or sampled). A
    BaseException, so that no `except Exception` on the way can turn it into an exit code."""


def _refuse(*args, **kwargs):
    raise TrainingStarted("a run started although the invocation was invalid")


@contextmanager
def nothing_runs() -> Iterator[None]:
    """`solrl run` imports flows.solrl (and its flow the training loop) only once its checks pass:
    stub both, and the studies' sampling and training, so an input that slips through fails loudly."""
    flow = types.ModuleType("flows.solrl")
    flow.run_locally = flow.resumed = _refuse
    training = types.ModuleType("solrl_core.training")
    training.run_training = _refuse
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "flows.solrl", flow)
        patch.setitem(sys.modules, "solrl_core.training", training)
        patch.setattr(solrl_core.fidelity, "run_fidelity", _refuse)
        patch.setattr(solrl_core.compare, "run_comparison", _refuse)
        yield


def assert_user_error(code: int, out: str, err: str, *needles: str) -> None:
    """Exit code 2, nothing on stdout, and exactly one line on stderr saying what is wrong."""
    assert "Traceback" not in err, err
    assert code == 2, (code, err)
    assert out == "", out
    assert err.startswith("solrl: error: ") and err.endswith("\n"), repr(err)
    assert err.count("\n") == 1 and len(err.splitlines()) == 1, f"not one line: {err!r}"
    assert len(err.strip()) > len("solrl: error: ") + 5, repr(err)
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
