"""Advice in a user-error message, written for the way the run was started.

The library writes what to do in the command line's terms (``-S model.path=DIR``, ``SOLRL_FLUX_PATH=DIR``),
which is right for ``solrl run``. A flow run of a deployment takes settings as its ``overrides``
parameter and reads variables from its worker's environment, so there the same advice reads
``prefect deployment run solrl/<name> --params '{"overrides": ["model.path=DIR"]}'`` and
``SOLRL_FLUX_PATH=DIR in the worker's environment``.
"""

from __future__ import annotations

import json
import re

# `-S key=value` as the messages write it: quoted when the value has spaces or braces.
CLI_SETTING = re.compile(r"-S (?:'(?P<quoted>[^']+)'|(?P<plain>[^\s,;()']+))")
# A model's or reward's variable given as a placeholder (SOLRL_FLUX_PATH=DIR).
VARIABLE = re.compile(r"\b(?P<name>SOLRL_[A-Z0-9_]+)=(?P<value>[A-Z]+)\b")


def for_deployment(message: str, deployment: str) -> str:
    """``message`` with each command-line setting and variable written as a deployment takes it."""

    def setting(match: re.Match) -> str:
        parameters = json.dumps({"overrides": [match["quoted"] or match["plain"]]})
        return f"`prefect deployment run {deployment} --params '{parameters}'`"

    def variable(match: re.Match) -> str:
        return f"{match['name']}={match['value']} in the worker's environment"

    return VARIABLE.sub(variable, CLI_SETTING.sub(setting, message))


def advice_for_this_run(error: Exception) -> Exception:
    """``error`` with its advice rewritten when this flow run belongs to a deployment; as it is
    (the command line's advice) when ``solrl run`` started the flow in its own process."""
    from prefect.runtime import deployment, flow_run

    name = deployment.get_name()
    if not name:
        return error
    return type(error)(for_deployment(str(error), f"{flow_run.get_flow_name()}/{name}"))
