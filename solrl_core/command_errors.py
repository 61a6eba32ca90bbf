"""How a `solrl` command ends when it does not succeed: the exit codes and their exceptions.

Kept apart from solrl_core.cli so that its subcommand modules (cli_studies) raise the same
errors without importing the CLI that imports them.
"""

from __future__ import annotations

USER_ERROR = 2
RUN_FAILED = 1


class UserError(Exception):
    """Bad input (exit code 2): one line, before anything is written."""


class RunFailed(Exception):
    """A run that started and then failed (exit code 1): the message says where it can resume."""
