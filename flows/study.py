"""``python -m flows.study ARGS``: `solrl study ARGS`, the DVC study's stages (solrl_core.study).

Kept so that the commands recorded in earlier reports' compare.json still run."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from flows.cli import main as solrl

    return solrl(["study", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
