"""One syntax for the list flags of every `solrl` subcommand: one comma-separated value.

``--seeds 0,1,2``, ``--families sol_rl,diffusionnft``, ``--explore-steps 2,4,6,8``: the same in
`compare`, `sweep`, `fidelity` and `sample`. The space-separated form (``--seeds 0 1 2``) is
refused in one line that shows the syntax, rather than argparse's "unrecognized arguments: 1 2".
"""

from __future__ import annotations

import argparse

from solrl_core.config import ConfigError, shown


class CommaList(argparse.Action):
    """Stores the flag's one comma-separated value as given; the subcommand parses its items."""

    def __init__(self, option_strings, dest, example: str, **kwargs):
        self.example = example
        kwargs.setdefault("metavar", example)
        # nargs="+" takes a space-separated list in, so that it can be named and refused here.
        super().__init__(option_strings, dest, nargs="+", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if not values:  # `--seeds=--`: argparse hands over an empty list
            raise ConfigError(f"{option_string} needs a value, e.g. {option_string} {self.example}")
        if len(values) != 1:
            raise ConfigError(f"{option_string} takes one comma-separated list, e.g. {option_string} {self.example}, "
                              f"not {shown(' '.join(values), 40)}")
        setattr(namespace, self.dest, values[0])


def add_list_argument(parser: argparse.ArgumentParser, flag: str, example: str, **kwargs) -> None:
    parser.add_argument(flag, action=CommaList, example=example, **kwargs)


def run_seed_list(text: str | None) -> list[int] | None:
    """``--seeds 0,1,2``: distinct run seeds in [0, 2**63); None keeps the single-seed layout."""
    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--seeds {text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not values or min(values) < 0 or max(values) >= 2**63:
        raise ConfigError(f"--seeds {text!r}: give run seeds from 0 to 2**63-1, e.g. 0,1,2")
    if len(set(values)) != len(values):
        raise ConfigError(f"--seeds {text!r}: each seed once; a repeated seed would train the same run twice")
    return values
