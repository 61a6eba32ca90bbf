"""Adaptive exploration: prune the pool on the explorer's free drafts instead of running every seed
for all ``explore.steps``.

The fixed scheme samples all N seeds of a group for T_explore explorer steps and keeps the K/2
best and K/2 worst. Here the whole pool runs ``score_at[0]`` steps; each draft's x0-prediction of
its last velocity call (x - sigma * v, computed by the sampler anyway) is decoded and scored with
the run's rewards; the ``survivors[0]`` most extreme seeds of each group continue, and so on.

The rule (why "most extreme", half from each end): the rank stage keeps the K/2 best and the K/2
worst, so a seed can only matter if it may still end in either tail. Keeping S/2 from each end
leaves a margin of (S - K)/2 places per tail for seeds whose rank moves between the scoring step
and the end; the schedule trades that margin against cost, and ``solrl fidelity --adaptive``
measures the trade (top-k precision and true ranks against full precision) per schedule. The rule
uses a group's own scores only, in seed order for ties (select_extremes), so every rank of a
torchrun job decides the same for a group as one process would.

The survivors continue the same trajectory (solrl_core.sampling.Trajectory: same noise, same
solver state), so with an explorer whose samples do not depend on their batch-mates (``none``,
and the quantized backends, whose activation scales are per sample or per token) a survivor's
final draft is the fixed scheme's, bit for bit where the host's float32 GEMM gives a row the same
result in any batch; on a CPU whose GEMM blocking follows the batch size it is one ulp off at full
precision (1.2e-7 on a reward), and an FP8 row can then round an activation to the neighbouring
code (0.009 seen). TE's NVFP4 on a GPU scales each GEMM's whole input by one amax, so there a
survivor's draft moves by quantization noise when its chunk-mates are pruned, as it does when
``explore.chunk`` changes. Chunks never mix prompt groups, so a group's chunks are the same on any
number of ranks.

When the last survivor count is K the kept set is decided and exploration stops there: its
members are never ranked against each other (the update uses their full-precision rewards), which
is what takes the rollout below the fixed scheme's cost floor of N x T_explore explorer steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from solrl_core.sampling import Trajectory, Velocity, sigma_grid
from solrl_core.selection import select_extremes


def schedule_problem(score_at: Sequence[int], survivors: Sequence[int], pool: int, keep: int,
                     steps: int) -> str | None:
    """Why this schedule cannot run with this pool, keep and explore.steps, or None."""
    if not score_at or len(score_at) != len(survivors):
        return (f"score_at {list(score_at)} and survivors {list(survivors)} must be non-empty lists of one length, "
                f"e.g. -S explore.adaptive.score_at=[1,2] -S explore.adaptive.survivors=[48,24]")
    if any(b <= a for a, b in zip(score_at, score_at[1:])) or score_at[0] < 1 or score_at[-1] >= steps:
        return f"score_at {list(score_at)} must rise strictly from 1 to below explore.steps ({steps})"
    if any(s % 2 for s in survivors):
        return f"survivors {list(survivors)} must be even: half best, half worst"
    if any(b > a for a, b in zip(survivors, survivors[1:])) or survivors[0] >= pool or survivors[-1] < keep:
        return f"survivors {list(survivors)} must fall from below pool ({pool}) and stay >= keep ({keep})"
    return None


def explorer_rows(score_at: Sequence[int], survivors: Sequence[int], pool: int, keep: int, steps: int) -> int:
    """Explorer sample-steps per group the schedule takes (one velocity call per row and step)."""
    rows, alive, done = 0, pool, 0
    for stop, count in zip(score_at, survivors):
        rows += alive * (stop - done)
        alive, done = count, stop
        if count == keep:
            return rows
    return rows + alive * (steps - done)


def scored_per_group(score_at: Sequence[int], survivors: Sequence[int], pool: int) -> int:
    """Intermediate drafts per group the schedule decodes and scores."""
    return pool + sum(survivors[:-1][:len(score_at) - 1])


def schedule_counts(config) -> tuple[int, int] | None:
    """(explorer sample-steps, intermediate drafts scored) per group of an adaptive config, else None."""
    adaptive = config.explore.adaptive
    if not adaptive.enabled:
        return None
    return (explorer_rows(adaptive.score_at, adaptive.survivors, config.pool, config.keep, config.explore.steps),
            scored_per_group(adaptive.score_at, adaptive.survivors, config.pool))


@dataclass
class AdaptiveResult:
    latents: torch.Tensor  # [R, ...] final drafts of the rows that ran to the end (empty when stopped at K)
    finished: list[int]  # flat row indices of ``latents``
    scores: torch.Tensor  # [rows] combined score each row ended with (NaN where pruned before the end)
    per_reward: dict[str, torch.Tensor]  # the same per reward
    survivors: list[list[int]] = field(default_factory=list)  # per scoring, flat indices that continued
    velocity_rows: int = 0  # explorer sample-steps taken
    scored_drafts: int = 0  # intermediate drafts decoded and scored


# (rows' final or intermediate latents, flat row indices) -> (combined [R], per reward {name: [R]})
Scorer = Callable[[torch.Tensor, list[int]], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def explore_adaptively(kind: str, shift: float, steps: int, groups: int, pool: int, keep: int, chunk: int,
                       score_at: Sequence[int], survivors: Sequence[int],
                       noise_of: Callable[[list[int]], torch.Tensor],
                       velocity_of: Callable[[list[int]], Velocity], score: Scorer) -> AdaptiveResult:
    """Run the schedule over ``groups`` x ``pool`` rows (flat index g * pool + i).

    ``noise_of(rows)`` gives the rows' initial noise, ``velocity_of(rows)`` the explorer's velocity
    for a batch of them, ``score(latents, rows)`` their rewards. The caller scores the finished
    rows' final drafts itself (``finished``); their ``scores`` here are NaN.
    """
    sigmas = sigma_grid(steps, shift)
    total = groups * pool
    combined = torch.full((total,), float("nan"), dtype=torch.float32)
    per_reward: dict[str, torch.Tensor] = {}
    result = AdaptiveResult(latents=torch.empty(0), finished=[], scores=combined, per_reward=per_reward)
    alive = list(range(total))
    parts = [(rows, Trajectory(kind, noise_of(rows), sigmas)) for rows in _group_chunks(alive, pool, chunk)]
    for stop, count in zip(score_at, survivors):
        result.velocity_rows += _advance(parts, velocity_of, stop)
        drafts = torch.cat([trajectory.x0.cpu() for _, trajectory in parts])
        values, named = score(drafts, alive)
        result.scored_drafts += len(alive)
        combined[alive] = values.float()
        for name, scores in named.items():
            per_reward.setdefault(name, torch.full((total,), float("nan"), dtype=torch.float32))[alive] = scores.float()
        alive = _extremes(alive, combined, pool, count)
        result.survivors.append(list(alive))
        kept = set(alive)
        for name in [None, *per_reward]:  # rows pruned here keep no score: they rank in the middle
            target = combined if name is None else per_reward[name]
            target[[row for row in range(total) if row not in kept]] = float("nan")
        parts = _regroup(parts, alive, pool, chunk)
        if count == keep:
            return result
    result.velocity_rows += _advance(parts, velocity_of, steps)
    result.latents = torch.cat([trajectory.x.cpu() for _, trajectory in parts])
    result.finished = [row for rows, _ in parts for row in rows]
    combined[result.finished] = float("nan")
    for scores in per_reward.values():
        scores[result.finished] = float("nan")
    return result


def _advance(parts, velocity_of, until: int) -> int:
    """Advance every batch to step ``until``; returns the explorer sample-steps taken."""
    taken = 0
    for rows, trajectory in parts:
        before = trajectory.velocity_rows
        trajectory.advance(velocity_of(rows), until)
        taken += trajectory.velocity_rows - before
    return taken


def _extremes(alive: list[int], combined: torch.Tensor, pool: int, count: int) -> list[int]:
    """The ``count`` most extreme alive rows of each group (half best, half worst), ascending."""
    chosen = []
    for group in sorted({row // pool for row in alive}):
        rows = [row for row in alive if row // pool == group]
        picked = select_extremes(combined[rows][None], min(count, len(rows)))[0].tolist()
        chosen.extend(sorted(rows[i] for i in picked))
    return chosen


def _group_chunks(rows: list[int], pool: int, chunk: int) -> list[list[int]]:
    """Rows split into batches of at most ``chunk`` that never mix prompt groups."""
    batches = []
    for group in sorted({row // pool for row in rows}):
        members = [row for row in rows if row // pool == group]
        batches.extend(members[start:start + chunk] for start in range(0, len(members), chunk))
    return batches


def _regroup(parts, alive: list[int], pool: int, chunk: int):
    """The survivors' trajectories, re-batched by group."""
    where = {row: (index, position) for index, (rows, _) in enumerate(parts) for position, row in enumerate(rows)}
    regrouped = []
    for rows in _group_chunks(alive, pool, chunk):
        pieces = []
        for index in sorted({where[row][0] for row in rows}):
            positions = [where[row][1] for row in rows if where[row][0] == index]
            pieces.append(parts[index][1].rows(positions))
        regrouped.append((rows, Trajectory.joined(pieces)))
    return regrouped
