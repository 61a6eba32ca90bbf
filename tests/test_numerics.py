"""Flush-to-zero is the project's processes' setting, never an import's side effect: importing
solrl_core leaves torch's flag as the importer had it, and the `solrl` command sets it
(solrl_core.numerics). Each check runs in a fresh interpreter, whose flag nothing else touched."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

# torch has no getter for the flag: a product that lands in fp32's subnormal range shows it (0 when
# subnormals are flushed). 2e-38 * 0.5 = 1e-38 < 2^-126 ~ 1.18e-38.
PROBE = "def flushes():\n    return (torch.tensor([2e-38]) * 0.5).item() == 0.0\n"


def flag_after(setup: str, action: str) -> tuple[bool, bool]:
    """(flag before ``action``, flag after it), in a fresh interpreter."""
    script = "import torch\n" + PROBE + setup + "\nbefore = flushes()\n" + action + "\nprint(before, flushes())\n"
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    before, after = result.stdout.split()[-2:]
    return before == "True", after == "True"


@pytest.mark.parametrize("flushed", [False, True])
def test_importing_solrl_core_leaves_flush_to_zero_as_it_found_it(flushed):
    before, after = flag_after(f"torch.set_flush_denormal({flushed})", "import solrl_core")
    assert before is flushed and after is flushed


def test_importing_the_modules_that_run_work_sets_nothing_either():
    """The CLI, the training loop and the explorer, which once relied on the import-time flush."""
    before, after = flag_after("torch.set_flush_denormal(False)",
                               "import solrl_core.cli, solrl_core.training, solrl_core.quant.explorer")
    assert (before, after) == (False, False)


def test_the_solrl_command_flushes_denormals():
    before, after = flag_after("torch.set_flush_denormal(False)",
                               "import contextlib, io\nfrom solrl_core import cli\n"
                               "with contextlib.redirect_stdout(io.StringIO()):\n    assert cli.main(['presets']) == 0")
    assert (before, after) == (False, True)


def test_the_tests_run_with_a_run_s_numerics():
    assert (torch.tensor([2e-38]) * 0.5).item() == 0.0  # tests/conftest.py flushed denormals
