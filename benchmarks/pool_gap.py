"""The premise of rollout scaling, measured (SPEC §1, §6 theory): the kept-reward gap (mean of the
best K/2 minus the worst K/2, full precision) of a prompt's first N seeds, against N, beside the
extreme-value estimate 2σ·sqrt(2 ln N) for the prompt's reward spread σ.

It reads the full-precision rewards [prompts, 96 seeds] that `solrl fidelity` stores, so nothing is
sampled again; a seed's reward never depends on which other seeds are in the pool.

    .venv/bin/python benchmarks/pool_gap.py reports/fidelity.json --out reports/pool_gap.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from solrl_core.ledger import write_json  # noqa: E402

POOLS = (24, 48, 72, 96)


def kept_gap(rewards: torch.Tensor, keep: int) -> torch.Tensor:
    """Per prompt: mean of the best keep/2 minus mean of the worst keep/2 of ``rewards`` [P, N]."""
    ordered = rewards.sort(dim=1, descending=True).values
    half = keep // 2
    return ordered[:, :half].mean(1) - ordered[:, -half:].mean(1)


def gap_table(rewards: torch.Tensor, keep: int = 24, pools=POOLS) -> list[dict]:
    """Mean ± standard error over prompts of the kept gap at each pool size N (the first N seeds)."""
    rows = []
    sigma = rewards.std(dim=1)  # each prompt's spread, from its whole pool
    for pool in pools:
        if pool > rewards.shape[1] or pool < keep:
            continue
        gaps = kept_gap(rewards[:, :pool], keep)
        theory = 2 * sigma * math.sqrt(2 * math.log(pool))
        rows.append({"pool": pool, "keep": keep, "gap_mean": float(gaps.mean()),
                     "gap_se": float(gaps.std() / math.sqrt(len(gaps))),
                     "extreme_value_estimate": float(theory.mean()),
                     "best_half_mean": float(rewards[:, :pool].sort(1, descending=True).values[:, :keep // 2].mean())})
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pools = [r["pool"] for r in rows]
    figure, axis = plt.subplots(figsize=(4.8, 3.4))
    axis.errorbar(pools, [r["gap_mean"] for r in rows], yerr=[2 * r["gap_se"] for r in rows], marker="o",
                  capsize=3, label="measured kept gap (±2 SE)")
    axis.plot(pools, [r["extreme_value_estimate"] for r in rows], marker="s", linestyle="--",
              label="2σ·sqrt(2 ln N)")
    axis.set(xlabel="pool N (K = 24 kept)", ylabel="best 12 − worst 12 reward", title="kept-reward gap vs pool")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fidelity_json", type=Path)
    parser.add_argument("--keep", type=int, default=24)
    parser.add_argument("--out", type=Path, default=Path("reports/pool_gap.json"))
    args = parser.parse_args()
    study = json.loads(args.fidelity_json.read_text(encoding="utf-8"))
    rewards = torch.tensor(study["full_precision"]["rewards"], dtype=torch.float64)
    rows = gap_table(rewards, args.keep)
    report = {"source": str(args.fidelity_json), "prompts": rewards.shape[0], "seeds": rewards.shape[1],
              "full_precision_steps": study["full_precision"]["steps"], "rows": rows}
    write_json(args.out, report)
    plot(rows, args.out.with_suffix(".png"))
    for row in rows:
        print(f"N {row['pool']:3d}  gap {row['gap_mean']:.4f} ± {row['gap_se']:.4f}  "
              f"2σ·sqrt(2 ln N) {row['extreme_value_estimate']:.4f}")


if __name__ == "__main__":
    main()
