"""The Sol-RL stages as plain functions: quantize, explore, rank, regenerate, update, requantize,
evaluate. Each takes the run state and plain records and returns a plain record, so a Prefect
task can wrap each one without moving a model across a process boundary.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch

from solrl_core import adaptive, distributed, faults
from solrl_core.accounting import Accountant, iteration_hours, sample_flops
from solrl_core.distributed import current as current_world
from solrl_core.checkpoint import NonFiniteState
from solrl_core.config import Config, rollout_steps, train_steps
from solrl_core.models.adapters import EMA, OLD, TRAINED, active_adapter, attach_adapters, blend_adapters
from solrl_core.models.policy import FlowPolicy
from solrl_core.models.compilation import compile_transformer
from solrl_core.models.registry import load_policy, model_spec
from solrl_core.nft import ema_decay, group_advantages, nft_loss, old_policy_rate, optimality_weight
from solrl_core.progress import progress
from solrl_core.quant.backends import check_runs_here
from solrl_core.quant.explorer import Explorer, build_explorer
from solrl_core.rewards.registry import RewardFailure, RewardScores, RewardSet, finite_mean
from solrl_core.sampling import sample, sigma_grid
from solrl_core.seeds import batch_noise, derive_seed, draw_seeds, noise_from_seed
from solrl_core.dealing import deal_to_steps
from solrl_core.selection import select_extremes, select_random, spearman
from solrl_core.prompts import evaluation_prompts, training_prompts

EVAL_SEED = 20260406  # evaluation seeds are fixed across runs so every run sees the same noises


@dataclass
class RunState:
    """Everything a run mutates; owned by the training loop (or the Prefect flow)."""

    config: Config
    policy: FlowPolicy
    rewards: RewardSet
    optimizer: torch.optim.Optimizer
    train_prompts: list[str]
    eval_prompts: list[str]
    explorer: Explorer | None = None
    optimizer_steps: int = 0
    # The run's GPU-hours so far, charged at the config's device profile (the checkpoint saves it).
    accountant: Accountant = field(init=False)
    # The proxy-drift alarm switched to the more faithful explorer (alarms.drift.switch_*).
    drift_switched: bool = False
    drift_below: int = 0  # iterations in a row with the online fidelity below alarms.drift.threshold

    def __post_init__(self):
        self.accountant = Accountant.for_config(self.config)


@dataclass
class Drafts:
    iteration: int
    prompts: list[str]  # [P]
    prompt_ids: list[int]  # index into the training prompt pool
    seeds: torch.Tensor  # [P, N] int64
    scores: RewardScores  # per_reward [P*N], combined [P*N]
    sigmas: torch.Tensor
    latents: torch.Tensor | None  # [P, N, ...], kept only when the family trains on drafts
    full_precision: bool  # drafts drawn without a quantized explorer
    first_slot: int = 0  # global index of the first group: this rank's shard starts there
    # Explorer sample-steps taken (pool x steps for the fixed scheme, fewer when adaptive), the
    # intermediate drafts scored, and the seeds pruned before the end (NaN scores, not failures).
    explore_rows: int = 0
    scored_drafts: int = 0
    pruned: int = 0

    def combined(self) -> torch.Tensor:
        return self.scores.combined.view(len(self.prompts), -1)


@dataclass
class Rollout:
    """The samples the update trains on: [P, K] seeds with their clean latents and rewards."""

    prompts: list[str]
    seeds: torch.Tensor
    latents: torch.Tensor  # [P, K, ...]
    sigmas: torch.Tensor
    scores: RewardScores  # flat [P*K]
    full_precision: bool
    first_slot: int = 0  # as Drafts.first_slot

    def combined(self) -> torch.Tensor:
        return self.scores.combined.view(len(self.prompts), -1)


@dataclass
class UpdateReport:
    loss: float
    policy_loss: float
    kl_loss: float
    grad_norm: float
    optimizer_steps: int
    skipped_micro_batches: int
    skipped_steps: int
    old_policy_rate: float
    ema_decay: float
    advantages: torch.Tensor = field(repr=False)  # [P, K]; NaN where the sample's reward was not finite
    unscored_samples: int = 0  # trained-on samples left out because their reward was not finite
    # [P, K] the optimizer step (0-based, within the iteration) each kept sample trained in;
    # -1 where it trained in none (its reward was not finite). Empty when not recorded.
    update_steps: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long), repr=False)


# ---------------------------------------------------------------------------------------------
# Set-up


def initial_state(config: Config) -> RunState:
    check_runs_here(config.explore.backend, config.model.device)  # one line before anything loads
    torch.manual_seed(config.seed)
    policy = load_policy(config)
    lora = config.train.lora
    attach_adapters(policy.transformer, lora.rank, lora.alpha, lora.targets, seed=config.seed)
    # After the adapters: the compiled blocks trace the LoRA layers peft put in.
    compile_transformer(policy.transformer, config.model.compile, model_spec(config.model.loader).repeated_blocks,
                        policy.device)
    trainable = [p for p in policy.transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.train.lr, betas=(config.train.beta1, config.train.beta2),
                                  weight_decay=config.train.weight_decay)
    rewards = RewardSet(config.rewards, extra=config.eval.rewards, paths=config.reward_paths,
                        offload=config.model.offload_rewards)
    return RunState(config=config, policy=policy, rewards=rewards, optimizer=optimizer,
                    train_prompts=training_prompts(config), eval_prompts=evaluation_prompts(config))


def modeled_iteration_hours(config: Config) -> dict:
    """Modeled GPU-hours of one training iteration of ``config``, before running it: loads the
    policy and builds the explorer to count its per-sample FLOPs (seconds on the embedded world)."""
    state = initial_state(config)
    quantize(state)
    return iteration_hours(config, sample_flops(state))


def quantize(state: RunState) -> dict:
    """Build the explorer (a quantized view of the sampling policy) and quantize its weights."""
    started = time.perf_counter()
    config = state.config
    state.explorer = build_explorer(state.policy.transformer, config.explore.backend, config.quant.skip,
                                    config.quant.min_dim, config.quant.fused)
    state.explorer.requantize(state.policy.transformer, adapter=OLD)
    # backend: the one that runs (explore.backend=auto resolved for this device)
    return {**state.explorer.describe(state.policy.transformer), "requested": config.explore.backend,
            "seconds": time.perf_counter() - started}


def requantize(state: RunState) -> float:
    """Sync the updated sampling ("old") policy into the explorer; returns seconds taken."""
    started = time.perf_counter()
    state.explorer.requantize(state.policy.transformer, adapter=OLD)
    return time.perf_counter() - started


# ---------------------------------------------------------------------------------------------
# Rollout


def choose_prompts(state: RunState, iteration: int) -> list[int]:
    generator = torch.Generator().manual_seed(derive_seed(state.config.seed, "prompts", iteration))
    order = torch.randperm(len(state.train_prompts), generator=generator)
    count = state.config.prompts_per_iteration
    return [int(order[i % len(order)]) for i in range(count)]


def explore(state: RunState, iteration: int) -> Drafts:
    """Draw N seeds per prompt and sample them with the explorer; score the drafts.

    Under torchrun, this rank's block of the iteration's prompt groups; seeds by global slot."""
    config = state.config
    chosen = choose_prompts(state, iteration)
    slots = distributed.shard(len(chosen))
    prompt_ids = [chosen[slot] for slot in slots]
    prompts = [state.train_prompts[i] for i in prompt_ids]
    seeds = torch.tensor([draw_seeds(config.seed, iteration, slot, config.pool) for slot in slots])
    flat_prompts = [p for p in prompts for _ in range(config.pool)]
    steps = explore_steps(state)
    if config.explore.adaptive.enabled:
        schedule = config.explore.adaptive
        scores, sigmas, counts = explore_adaptively(state, flat_prompts, seeds.flatten().tolist(), steps, config.pool,
                                                    config.keep, schedule.score_at, schedule.survivors, state.explorer)
        faults.point("explore")
        latents = None
    else:
        latents, sigmas = _sample_seeds(state, flat_prompts, seeds.flatten().tolist(), steps,
                                        config.explore.chunk, adapter=OLD, explorer=state.explorer, label="explore")
        faults.point("explore")  # the pool is sampled, not yet scored
        scores = _score(state, latents, flat_prompts, list(config.rewards))
        counts = {"explore_rows": len(flat_prompts) * steps}
    if not bool(torch.isfinite(scores.combined).any()):
        raise RewardFailure(f"no finite reward for any of the {len(flat_prompts)} images explored in iteration "
                            f"{iteration}: the policy diverged or the reward model is broken")
    keep_latents = not config.regenerate.enabled
    return Drafts(iteration=iteration, prompts=prompts, prompt_ids=prompt_ids, seeds=seeds, scores=scores,
                  sigmas=sigmas, latents=latents.view(len(prompts), config.pool, *latents.shape[1:]) if keep_latents else None,
                  full_precision=config.explore.backend == "none", first_slot=slots.start,
                  **counts)


def explore_steps(state: RunState) -> int:
    """Explorer steps this iteration: the config's, or the drift alarm's more faithful count."""
    switch = state.config.alarms.drift.switch_steps
    return switch if state.drift_switched and switch and state.config.regenerate.enabled else rollout_steps(state.config)


def explore_adaptively(state: RunState, flat_prompts: list[str], seeds: list[int], steps: int, pool: int, keep: int,
                       score_at: list[int], survivors: list[int],
                       explorer: Explorer | None) -> tuple[RewardScores, torch.Tensor, dict]:
    """Groups of ``pool`` rows pruned on intermediate drafts (solrl_core.adaptive) with the
    sampling policy under ``explorer``; scores NaN where pruned. Also used by solrl fidelity."""
    config, policy, names = state.config, state.policy, list(state.config.rewards)

    def noise_of(rows: list[int]) -> torch.Tensor:
        return batch_noise([seeds[row] for row in rows], policy.latent_shape, torch.float32, policy.device)

    def velocity_of(rows: list[int]):
        conditioning = policy.conditioning([flat_prompts[row] for row in rows])

        def velocity(x, sigma):
            with torch.no_grad(), active_adapter(policy.transformer, OLD), _explorer_active(explorer, policy):
                return policy.velocity(x, sigma, conditioning)
        return velocity

    def score(latents: torch.Tensor, rows: list[int]):
        scored = _score(state, latents, [flat_prompts[row] for row in rows], names)
        return scored.combined, scored.per_reward

    result = adaptive.explore_adaptively(config.sampler.kind, config.sampler.shift, steps, len(seeds) // pool, pool,
                                         keep, config.explore.chunk, score_at, survivors, noise_of, velocity_of, score)
    combined = result.scores.clone()
    per_reward = {name: result.per_reward.get(name, torch.full_like(combined, float("nan"))).clone()
                  for name in names}
    if result.finished:
        final = _score(state, result.latents, [flat_prompts[row] for row in result.finished], names)
        combined[result.finished] = final.combined.float()
        for name in names:
            per_reward[name][result.finished] = final.per_reward[name].float()
    survivors = len(result.survivors[-1])
    counts = {"explore_rows": result.velocity_rows, "scored_drafts": result.scored_drafts,
              "pruned": len(seeds) - survivors}
    return RewardScores(per_reward=per_reward, combined=combined), sigma_grid(steps, config.sampler.shift), counts


def rank(drafts: Drafts, config: Config) -> torch.Tensor:
    """[P, K] indices into each group's pool: the K/2 best and K/2 worst drafts, or (selection
    "random", the random_pool control) K drafts drawn at random whatever their rewards."""
    if config.selection == "random":
        groups, pool = drafts.seeds.shape
        return select_random(groups, pool, config.keep, config.seed, drafts.iteration, drafts.first_slot)
    return select_extremes(drafts.combined(), config.keep)


def regenerate(state: RunState, drafts: Drafts, selection: torch.Tensor) -> Rollout:
    """Re-sample the kept seeds with the full-precision sampling policy at T_train steps.

    Families that train on their rollout take the kept drafts as they are.
    """
    config = state.config
    kept_seeds = torch.gather(drafts.seeds, 1, selection)
    if not config.regenerate.enabled:
        return _kept_drafts(drafts, selection, kept_seeds)
    flat_prompts = [p for p in drafts.prompts for _ in range(selection.shape[1])]
    latents, sigmas = _sample_seeds(state, flat_prompts, kept_seeds.flatten().tolist(), train_steps(config),
                                    config.regenerate.chunk, adapter=OLD, explorer=None, label="regenerate")
    scores = _score(state, latents, flat_prompts, list(config.rewards))
    return Rollout(prompts=drafts.prompts, seeds=kept_seeds,
                   latents=latents.view(*selection.shape, *latents.shape[1:]), sigmas=sigmas, scores=scores,
                   full_precision=True, first_slot=drafts.first_slot)


def whole_iteration(drafts: Drafts, selection: torch.Tensor, rollout: Rollout, report: UpdateReport,
                    fidelity: list[float]) -> tuple[Drafts, torch.Tensor, Rollout, UpdateReport, list[float]]:
    """Every rank's drafts, selection, rollout, advantages and fidelity joined in global group
    order (without latents), for the ledger and the metrics; one process: its own, unchanged."""
    if not current_world().distributed:
        return drafts, selection, rollout, report, fidelity
    parts = distributed.all_gather_objects((
        drafts.prompts, drafts.prompt_ids, drafts.seeds, drafts.scores, selection, rollout.seeds, rollout.scores,
        report.advantages, fidelity, report.update_steps, (drafts.explore_rows, drafts.scored_drafts, drafts.pruned)))
    column = list(zip(*parts))
    explore_rows, scored_drafts, pruned = (sum(values) for values in zip(*column[10]))

    def scores(records: tuple[RewardScores, ...]) -> RewardScores:
        return RewardScores(per_reward={name: torch.cat([r.per_reward[name] for r in records])
                                        for name in records[0].per_reward},
                            combined=torch.cat([r.combined for r in records]))

    whole_drafts = Drafts(iteration=drafts.iteration, prompts=sum(column[0], []), prompt_ids=sum(column[1], []),
                          seeds=torch.cat(column[2]), scores=scores(column[3]), sigmas=drafts.sigmas, latents=None,
                          full_precision=drafts.full_precision, explore_rows=explore_rows,
                          scored_drafts=scored_drafts, pruned=pruned)
    whole_rollout = Rollout(prompts=whole_drafts.prompts, seeds=torch.cat(column[5]), latents=torch.empty(0),
                            sigmas=rollout.sigmas, scores=scores(column[6]), full_precision=rollout.full_precision)
    whole_report = replace(report, advantages=torch.cat(column[7]), update_steps=torch.cat(column[9]))
    return whole_drafts, torch.cat(column[4]), whole_rollout, whole_report, sum(column[8], [])


def _kept_drafts(drafts: Drafts, selection: torch.Tensor, kept_seeds: torch.Tensor) -> Rollout:
    groups, keep = selection.shape
    flat_index = (selection + torch.arange(groups)[:, None] * drafts.seeds.shape[1]).flatten()
    per_reward = {name: scores[flat_index] for name, scores in drafts.scores.per_reward.items()}
    latents = torch.stack([drafts.latents[g, selection[g]] for g in range(groups)])
    return Rollout(prompts=drafts.prompts, seeds=kept_seeds, latents=latents, sigmas=drafts.sigmas,
                   scores=RewardScores(per_reward, drafts.scores.combined[flat_index]),
                   full_precision=drafts.full_precision, first_slot=drafts.first_slot)


def online_fidelity(drafts: Drafts, selection: torch.Tensor, rollout: Rollout) -> list[float]:
    """Per prompt, Spearman between explorer and full-precision rewards of the kept seeds."""
    if drafts.latents is not None:
        return []  # no regeneration: the explorer's scores are the trained-on scores
    explorer_kept = torch.gather(drafts.combined(), 1, selection)
    return [spearman(explorer_kept[g], rollout.combined()[g]) for g in range(selection.shape[0])]


def _sample_seeds(state: RunState, prompts: list[str], seeds: list[int], steps: int, chunk: int, adapter: str,
                  explorer: Explorer | None, label: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one latent per (prompt, seed) in chunks; chunking never changes a sample's noise."""
    config, policy = state.config, state.policy
    outputs, sigmas = [], None
    starts = range(0, len(seeds), chunk)
    for start in progress(starts, label, enabled=config.progress):
        chunk_seeds, chunk_prompts = seeds[start:start + chunk], prompts[start:start + chunk]
        noise = batch_noise(chunk_seeds, policy.latent_shape, torch.float32, policy.device)
        conditioning = policy.conditioning(chunk_prompts)
        with torch.no_grad(), active_adapter(policy.transformer, adapter), _explorer_active(explorer, policy):
            result = sample(config.sampler.kind, lambda x, s: policy.velocity(x, s, conditioning), noise, steps,
                            config.sampler.shift)
        outputs.append(result.latents.cpu())
        sigmas = result.sigmas
    return torch.cat(outputs), sigmas


def _explorer_active(explorer: Explorer | None, policy: FlowPolicy):
    return explorer.active(policy.transformer) if explorer is not None else nullcontext()


def _score(state: RunState, latents: torch.Tensor, prompts: list[str], names: list[str],
           chunk: int = 64) -> RewardScores:
    """Decode and score in chunks: a whole pool of decoded 1024 px images would not fit in memory.
    Offloaded reward models come to the device once for all the chunks, and leave after."""
    parts = []
    with state.rewards.on_device(names):
        for start in range(0, len(prompts), chunk):
            images = state.policy.decode(latents[start:start + chunk].to(state.policy.device))
            parts.append(state.rewards.score(images, prompts[start:start + chunk], names))
    return RewardScores(per_reward={name: torch.cat([p.per_reward[name] for p in parts]) for name in names},
                        combined=torch.cat([p.combined for p in parts]))


# ---------------------------------------------------------------------------------------------
# Update


@dataclass
class _TrainItem:
    sample: int  # flat index into the rollout
    sigma: float
    noise_seed: int


def update(state: RunState, rollout: Rollout, iteration: int) -> UpdateReport:
    """DiffusionNFT on the rollout: group advantages, then train.steps_per_iteration AdamW steps,
    each on a seeded random share of the kept samples (solrl_core.dealing), then the old policy's
    soft update at the rate its optimizer-step count gives (the reference's return_decay)."""
    config, train = state.config, state.config.train
    # The advantage's std is over the whole iteration: the kept rewards of every rank's groups.
    all_advantages = group_advantages(torch.cat(distributed.all_gather_objects(rollout.combined())))
    advantages = all_advantages[rollout.first_slot:rollout.first_slot + rollout.seeds.shape[0]]
    weights = optimality_weight(advantages, train.adv_clip, train.adv_mode).flatten()
    flat_latents = rollout.latents.flatten(0, 1)
    flat_prompts = [p for p in rollout.prompts for _ in range(rollout.seeds.shape[1])]
    # A sample whose reward is not finite (the reward model failed on it) has no advantage: it
    # is left out of the update, and counted.
    scored = torch.isfinite(advantages).flatten()
    all_scored = torch.isfinite(all_advantages).flatten()
    items = [item for item in _train_items(config, rollout, iteration) if scored[item.sample]]
    parts = deal_to_steps(all_scored, train.steps_per_iteration, config.seed, iteration)
    first_sample = rollout.first_slot * rollout.seeds.shape[1]
    my_parts = parts[first_sample:first_sample + rollout.seeds.numel()].view(rollout.seeds.shape)
    totals = {"loss": 0.0, "policy": 0.0, "kl": 0.0, "grad_norm": 0.0, "skipped": 0, "skipped_steps": 0}
    for step_number in range(train.steps_per_iteration):
        if step_number:
            faults.point("update")  # between optimizer steps
        step_items = [item for item in items if parts[first_sample + item.sample] == step_number]
        # Every rank divides by the step's item count over all ranks, so summed gradients are the
        # one-process gradient.
        step_total = _timesteps_per_sample(config, rollout) * int((parts == step_number).sum())
        step = _optimizer_step(state, step_items, step_total, flat_latents, flat_prompts, weights)
        for key in totals:
            totals[key] += step[key]
    steps = train.steps_per_iteration
    # The reference counts the rate in optimizer steps (return_decay(global_step), after the
    # iteration's steps), not iterations: with several steps an iteration the old policy lags more.
    eta = old_policy_rate(state.optimizer_steps, train.eta_rate, train.eta_max)
    blend_adapters(state.policy.transformer, source=TRAINED, target=OLD, keep=eta)
    decay = ema_decay(state.optimizer_steps, train.ema_max_decay)  # the last step's (_optimizer_step blends)
    return UpdateReport(loss=totals["loss"] / steps, policy_loss=totals["policy"] / steps, kl_loss=totals["kl"] / steps,
                        grad_norm=totals["grad_norm"] / steps, optimizer_steps=state.optimizer_steps,
                        skipped_micro_batches=totals["skipped"], skipped_steps=totals["skipped_steps"],
                        old_policy_rate=eta, ema_decay=decay, advantages=advantages,
                        unscored_samples=int((~all_scored).sum()), update_steps=my_parts)


def _timesteps_per_sample(config: Config, rollout: Rollout) -> int:
    # sigma = 0 carries no training signal
    return timesteps_per_sample(len(rollout.sigmas) - 1, config.train.timestep_fraction)


def timesteps_per_sample(grid: int, fraction: float) -> int:
    """How many of a sample's ``grid`` nonzero sampler timesteps the update trains on: the
    fraction of the grid, rounded, at least one and at most all of it."""
    return min(grid, max(1, round(fraction * grid)))


def _train_items(config: Config, rollout: Rollout, iteration: int) -> list[_TrainItem]:
    """For each sample, a seeded random subset of its sampler timesteps, each with fresh noise.

    Seeds are keyed by the sample's global index (this rank's shard starts at ``first_slot``)."""
    grid = rollout.sigmas[:-1].tolist()  # sigma = 0 carries no training signal
    per_sample = _timesteps_per_sample(config, rollout)
    first_sample = rollout.first_slot * rollout.seeds.shape[1]
    items = []
    for sample_index in range(rollout.seeds.numel()):
        global_index = first_sample + sample_index
        generator = torch.Generator().manual_seed(derive_seed(config.seed, "timesteps", iteration, global_index))
        chosen = torch.randperm(len(grid), generator=generator)[:per_sample].sort().values.tolist()
        for t_index in chosen:
            items.append(_TrainItem(sample_index, grid[t_index],
                                    derive_seed(config.seed, "train-noise", iteration, global_index, t_index)))
    return items


def _optimizer_step(state: RunState, items: list[_TrainItem], total_items: int, latents: torch.Tensor,
                    prompts: list[str], weights: torch.Tensor) -> dict:
    """One AdamW step over ``items`` (this rank's share of the step's ``total_items``)."""
    train, policy = state.config.train, state.policy
    state.optimizer.zero_grad(set_to_none=True)
    totals = {"loss": 0.0, "policy": 0.0, "kl": 0.0, "skipped": 0}
    micro = train.micro_batch
    for start in range(0, len(items), micro):
        batch = items[start:start + micro]
        result = _micro_batch_loss(state, batch, latents, prompts, weights)
        if not torch.isfinite(result.loss):
            totals["skipped"] += 1  # a non-finite loss is dropped, never propagated into the weights
            continue
        (result.loss * len(batch) / total_items).backward()
        share = len(batch) / total_items
        totals["loss"] += float(result.loss.detach()) * share
        totals["policy"] += result.policy_loss * share
        totals["kl"] += result.kl_loss * share
    trainable = [p for p in state.optimizer.param_groups[0]["params"]]
    if current_world().distributed:  # the step's loss, skips and gradient over every rank
        summed = distributed.sum_floats([totals["loss"], totals["policy"], totals["kl"], totals["skipped"]])
        totals.update(loss=summed[0], policy=summed[1], kl=summed[2], skipped=int(summed[3]))
        distributed.sum_gradients(trainable)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable, train.grad_clip)) if total_items else 0.0
    stepped = bool(total_items) and math.isfinite(grad_norm) and totals["skipped"] * micro < total_items
    if stepped:
        state.optimizer.step()
        state.optimizer_steps += 1
        _require_finite_weights(trainable)
        # The evaluation EMA follows every optimizer step, as in the reference code: its decay
        # min((1 + s) / (10 + s), 0.9) counts steps, so blending once per iteration would average
        # ~10 iterations (hundreds of steps) and evaluate a policy that lags the trained one.
        blend_adapters(policy.transformer, source=TRAINED, target=EMA,
                       keep=ema_decay(state.optimizer_steps, train.ema_max_decay))
    state.optimizer.zero_grad(set_to_none=True)
    return {"loss": totals["loss"], "policy": totals["policy"], "kl": totals["kl"],
            "grad_norm": grad_norm if math.isfinite(grad_norm) else 0.0, "skipped": totals["skipped"],
            "skipped_steps": 0 if stepped else 1}


def _require_finite_weights(parameters: list[torch.Tensor]) -> None:
    """Stop the run rather than carry a non-finite weight into sampling or a checkpoint."""
    if not all(bool(torch.isfinite(p).all()) for p in parameters):
        raise NonFiniteState("an optimizer step produced a non-finite LoRA weight (learning rate too high?); "
                             "the run stops and its last good checkpoint is kept")


def _micro_batch_loss(state: RunState, batch: list[_TrainItem], latents: torch.Tensor, prompts: list[str],
                      weights: torch.Tensor):
    policy, train = state.policy, state.config.train
    index = torch.tensor([item.sample for item in batch])
    clean = latents[index].to(policy.device)
    sigma = torch.tensor([item.sigma for item in batch], device=policy.device)
    noise = torch.stack([noise_from_seed(item.noise_seed, policy.latent_shape) for item in batch]).to(policy.device)
    sigma_b = sigma.view(-1, *([1] * (clean.dim() - 1)))
    noisy = (1 - sigma_b) * clean + sigma_b * noise
    conditioning = policy.conditioning([prompts[i] for i in index.tolist()])
    with torch.no_grad():
        with active_adapter(policy.transformer, OLD):
            old_velocity = policy.velocity(noisy, sigma, conditioning)
        with active_adapter(policy.transformer, None):
            ref_velocity = policy.velocity(noisy, sigma, conditioning)
    velocity = policy.velocity(noisy, sigma, conditioning)
    return nft_loss(velocity, old_velocity, ref_velocity, noisy, clean, sigma, weights[index].to(policy.device),
                    train.nft_beta, train.adv_clip, train.kl_weight)


# ---------------------------------------------------------------------------------------------
# Evaluation


def evaluation_seeds(config: Config) -> list[int]:
    return [derive_seed(EVAL_SEED, "eval", i) for i in range(config.eval.prompts * config.eval.seeds_per_prompt)]


def evaluate(state: RunState, adapter: str | None = EMA) -> tuple[dict[str, float], torch.Tensor | None]:
    """Mean of every evaluation reward over held-out prompts x fixed seeds; also the images.

    Under torchrun each rank takes a block of the (prompt, seed) pairs; every rank gets the
    means, rank 0 alone the images (None elsewhere)."""
    config = state.config
    prompts = [p for p in state.eval_prompts for _ in range(config.eval.seeds_per_prompt)]
    seeds = evaluation_seeds(config)
    mine = distributed.shard(len(prompts))
    prompts, seeds = prompts[mine.start:mine.stop], seeds[mine.start:mine.stop]
    latents, _ = _sample_seeds(state, prompts, seeds, config.eval.steps, config.eval.chunk,
                               adapter=adapter, explorer=None, label="evaluate")
    names = list(dict.fromkeys(list(config.rewards) + list(config.eval.rewards)))
    images = state.policy.decode(latents.to(state.policy.device)).cpu()
    per_reward = state.rewards.score(images, prompts, names).per_reward
    if current_world().distributed:
        every_rank = distributed.all_gather_objects(per_reward)
        per_reward = {name: torch.cat([scores[name] for scores in every_rank]) for name in names}
        gathered = distributed.gather_to_main(images)
        images = torch.cat(gathered) if gathered is not None else None
    # Mean over the images a reward could score (a failed image is left out, not averaged as NaN).
    means = {name: finite_mean(values) for name, values in per_reward.items()}
    return means, images
