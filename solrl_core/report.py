"""The end-of-run summary table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def print_summary(summary: dict, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"Sol-RL {summary['family']} on {summary['preset']}: {summary['iterations']} iterations "
                        f"in {summary['seconds']:.0f}s")
    table.add_column("evaluation reward")
    table.add_column("base", justify="right")
    table.add_column("final", justify="right")
    table.add_column("change", justify="right")
    for name, base in summary["eval_reward_base"].items():
        final = summary["eval_reward_final"][name]
        table.add_row(name, f"{base:.4f}", f"{final:.4f}", f"{final - base:+.4f}")
    console.print(table)
    width = max(len(name) for name in summary["outputs"])
    for name, path in summary["outputs"].items():
        console.print(f"  {name:{width}s} {path}", soft_wrap=True)  # a long path stays on its line
