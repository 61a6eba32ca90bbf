"""The training loop: iterations of explore -> rank -> regenerate -> update -> requantize, with
evaluation every ``eval.every`` iterations, writing the ledger, metrics and summary of a run, and a
checkpoint every ``checkpoint.every`` iterations that ``resume=True`` continues from exactly."""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from torchvision.utils import save_image

from solrl_core import alarms, distributed, faults, run_lock, stages
from solrl_core.accounting import sample_flops
from solrl_core.distributed import current as current_world
from solrl_core.checkpoint import (CHECKPOINT, DIGEST_KEY, Checkpoint, discard_temporaries, load_checkpoint,
                                   require_finite, restore, rewind_outputs, save_checkpoint, tensors_digest)
from solrl_core.config import Config, to_dict
from solrl_core.ledger import LEDGER_FILE, LORA_FILE, METRICS_FILE, SUMMARY_FILE
from solrl_core.ledger import append_jsonl, append_ledger, atomic_write, ledger_frame, write_json
from solrl_core.models.adapters import EMA, adapter_state
from solrl_core.numerics import flush_denormals
from solrl_core.quant.backends import spec as backend_spec
from solrl_core.rewards.registry import finite_mean

# The evaluation samples as PNG grids: the base model's, and the latest evaluated policy's.
GRIDS = SAMPLES_BASE, SAMPLES_FINAL = ("samples_base.png", "samples_final.png")


# A stage runner calls one stage: (stage name, function, *args) -> result. The default calls it
# directly; the Prefect flow passes one that runs each stage as a task. One loop serves both.
StageRunner = Callable[..., object]


def call_directly(stage: str, function: Callable, *args, **kwargs):
    return function(*args, **kwargs)


class RunObserver:
    """Hooks for trackers (MLflow) and reporters; every hook is optional."""

    def on_start(self, config: Config, out_dir: Path) -> None: ...

    def on_resume(self, config: Config, out_dir: Path, base_eval: dict[str, float], history: list[dict]) -> None:
        """A resumed run: ``history`` holds the metrics records of the iterations already run."""
        self.on_start(config, out_dir)

    def on_evaluation(self, iteration: int, rewards: dict[str, float], images: torch.Tensor) -> None: ...

    def on_iteration(self, metrics: dict) -> None: ...

    def on_end(self, summary: dict) -> None: ...


@dataclass
class StageClock:
    """Wall-clock seconds per stage of one iteration, around whatever runner executes the stage."""

    runner: StageRunner = call_directly
    seconds: dict[str, float] = field(default_factory=dict)

    def time(self, stage: str, function: Callable, *args, **kwargs):
        started = time.perf_counter()
        result = self.runner(stage, function, *args, **kwargs)
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - started
        return result


def run_iteration(state: stages.RunState, iteration: int, out_dir: Path, runner: StageRunner = call_directly) -> dict:
    """One Sol-RL iteration; appends the ledger rows and returns the metrics record."""
    clock = StageClock(runner)
    drafts = clock.time("explore", stages.explore, state, iteration)
    selection = clock.time("rank", stages.rank, drafts, state.config)
    rollout = clock.time("regenerate", stages.regenerate, state, drafts, selection)
    report = clock.time("update", stages.update, state, rollout, iteration)
    clock.time("requantize", stages.requantize, state)
    fidelity = stages.online_fidelity(drafts, selection, rollout)
    # Under torchrun: every rank's groups, so rank 0 writes what one process would.
    drafts, selection, rollout, report, fidelity = stages.whole_iteration(drafts, selection, rollout, report, fidelity)
    if current_world().is_main:
        append_ledger(out_dir / LEDGER_FILE, _iteration_ledger_frame(drafts, selection, rollout, report))
    faults.point("ledger")
    # Modeled GPU-hours from FLOPs counted on the real model (SPEC §9), measured ones on CUDA.
    compute = state.accountant.iteration(
        state, explored=drafts.seeds.numel(), explore_steps=len(drafts.sigmas) - 1, kept=rollout.seeds.numel(),
        train_steps=len(rollout.sigmas) - 1, evaluated=should_evaluate(state.config, iteration), seconds=clock.seconds,
        explore_rows=drafts.explore_rows, scored_drafts=drafts.scored_drafts)
    metrics = _iteration_metrics(iteration, drafts, rollout, report, fidelity, clock, compute)
    if state.config.explore.adaptive.enabled:
        metrics["adaptive"] = {"explore_sample_steps": drafts.explore_rows, "scored_drafts": drafts.scored_drafts,
                               "pruned": drafts.pruned}
    metrics["alarms"] = alarms.observe_drift(state, metrics["fidelity_spearman"])
    return metrics


def _iteration_ledger_frame(drafts, selection, rollout, report):
    """The iteration's ledger rows: every draft's seed and rewards, which were kept, and the
    trained samples' full-precision rewards and advantages."""
    has_fp = rollout.full_precision
    return ledger_frame(
        drafts.iteration, drafts.prompts, drafts.prompt_ids, drafts.seeds,
        {k: v.view(drafts.seeds.shape) for k, v in drafts.scores.per_reward.items()}, drafts.combined(), selection,
        rollout.scores.per_reward if has_fp else None, rollout.combined() if has_fp else None, report.advantages,
        report.update_steps,
    )


def _iteration_metrics(iteration, drafts, rollout, report, fidelity, clock, compute: dict | None = None) -> dict:
    kept = rollout.combined()
    half = kept.shape[1] // 2
    finite_fidelity = [rho for rho in fidelity if math.isfinite(rho)]
    return {
        "iteration": iteration,
        "explore_reward_mean": finite_mean(drafts.scores.combined),
        "kept_reward_mean": finite_mean(kept.flatten()),
        # The signal Sol-RL scales: best-half minus worst-half reward of the trained samples.
        "kept_gap": finite_mean(kept[:, :half]) - finite_mean(kept[:, half:]) if kept.shape[1] > 1 else 0.0,
        # Images a reward model gave no finite score: counted, never ranked high, never trained on.
        "nonfinite_rewards": {"explore": int((~torch.isfinite(drafts.scores.combined)).sum()) - drafts.pruned,
                              "trained": report.unscored_samples},
        "loss": report.loss, "policy_loss": report.policy_loss, "kl_loss": report.kl_loss,
        "grad_norm": report.grad_norm, "optimizer_steps": report.optimizer_steps,
        "skipped_micro_batches": report.skipped_micro_batches, "skipped_steps": report.skipped_steps,
        "old_policy_rate": report.old_policy_rate, "ema_decay": report.ema_decay,
        "fidelity_spearman": sum(finite_fidelity) / len(finite_fidelity) if finite_fidelity else None,
        "fidelity_spearman_per_prompt": fidelity,
        "seconds": {**clock.seconds, "total": sum(clock.seconds.values())},
        **(compute or {}),
    }


def should_evaluate(config: Config, iteration: int) -> bool:
    return (iteration + 1) % config.eval.every == 0 or iteration + 1 == config.iterations


def should_checkpoint(config: Config, iteration: int) -> bool:
    return (iteration + 1) % config.checkpoint.every == 0 or iteration + 1 == config.iterations


def run_training(config: Config, out_dir: Path, log: Callable[[str], None] = print,
                 runner: StageRunner = call_directly, observers: list[RunObserver] = (),
                 resume: bool = False) -> dict:
    """Run ``config.iterations`` iterations; returns the summary also written to summary.json.

    ``resume``: continue the run in ``out_dir`` from its checkpoint; the ledger, metrics and
    adapters come out identical to those of a run that was never interrupted.

    Under torchrun every rank runs this loop on its shard; rank 0 alone writes files and calls
    the observers (the other ranks' ``observers`` are ignored).

    Rank 0 holds the folder's lock (solrl_core.run_lock) throughout, whoever started the loop (the
    CLI, which took it already, or a deployment's flow run): one writer per run folder.
    """
    flush_denormals()  # a deployment's flow run starts here, not in the `solrl` command
    if not current_world().is_main:
        return _run_training(config, out_dir, log, runner, observers, resume)
    with run_lock.held(out_dir):
        return _run_training(config, out_dir, log, runner, observers, resume)


def _run_training(config: Config, out_dir: Path, log: Callable[[str], None], runner: StageRunner,
                  observers: list[RunObserver], resume: bool) -> dict:
    started = time.perf_counter()
    main = current_world().is_main
    observers = observers if main else ()
    # A checkpoint that cannot be resumed, or outputs that do not match it, stop the run before
    # the model loads; rows of iterations after the checkpoint are dropped (they are redone).
    checkpoint = load_checkpoint(out_dir) if resume else None
    history = _rewind(out_dir, checkpoint) if checkpoint is not None and main else []
    # Load the model and build the explorer first: a missing file or an unsupported backend
    # stops the run before anything is written.
    state = runner("load", stages.initial_state, config)
    if checkpoint is not None:
        restore(state, checkpoint)  # before quantize: the explorer is built from the "old" adapter
    quantize_report = runner("quantize", stages.quantize, state)
    if checkpoint is not None:  # the alarms' state after the iterations already run (rank 0 read them)
        if current_world().distributed:
            history_alarms = distributed.all_gather_objects([record.get("alarms", {}) for record in history])[0]
            alarms.restore_drift(state, [{"alarms": entry} for entry in history_alarms])
        else:
            alarms.restore_drift(state, history)
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
    for observer in observers:
        if checkpoint is None:
            observer.on_start(config, out_dir)
        else:
            observer.on_resume(config, out_dir, checkpoint.base_eval, history)
    log(f"explorer: {quantize_report['backend']} (explore.backend {quantize_report['requested']}) on "
        f"{quantize_report['quantized_layers']} layers, {quantize_report['quantized_share']:.0%} of the weights; "
        f"device {state.policy.device}, full precision {str(state.policy.dtype).removeprefix('torch.')}"
        + ("" if backend_spec(quantize_report["backend"]).batch_independent else
           "; its activation scale spans each GEMM's whole input, so drafts depend on explore.chunk and the "
           "number of ranks"))
    base_eval, first = _starting_point(state, runner, observers, out_dir, checkpoint, log)
    evaluations = [{"iteration": -1, **base_eval}]
    evaluations += [{"iteration": record["iteration"], **record["eval"]} for record in history if "eval" in record]
    for iteration in range(first, config.iterations):
        evaluation = _train_one(state, iteration, out_dir, runner, observers, log, base_eval)
        if evaluation is not None:
            evaluations.append({"iteration": iteration, **evaluation})
    summary = _summary(state, out_dir, evaluations, time.perf_counter() - started, checkpoint)
    if main:
        save_adapters(out_dir / LORA_FILE, state)
        write_json(out_dir / SUMMARY_FILE, summary)
    for observer in observers:
        observer.on_end(summary)
    return summary


def _starting_point(state, runner, observers, out_dir: Path, checkpoint: Checkpoint | None,
                    log: Callable[[str], None]) -> tuple[dict[str, float], int]:
    """(base evaluation, first iteration to run): evaluated and checkpointed for a new run, read
    from the checkpoint for a resumed one."""
    if checkpoint is None:
        base_eval = _evaluate(state, runner, observers, out_dir / SAMPLES_BASE, iteration=-1, adapter=None)
        if current_world().is_main:
            save_checkpoint(out_dir, state, next_iteration=0, base_eval=base_eval)
        first = 0
    else:
        base_eval, first = checkpoint.base_eval, checkpoint.next_iteration
        log(f"resumed from {out_dir / CHECKPOINT} before iteration {first} ({state.optimizer_steps} optimizer steps)")
    log("base      " + _format_rewards(base_eval))
    return base_eval, first


def _train_one(state, iteration: int, out_dir: Path, runner, observers, log: Callable[[str], None],
               base_eval: dict[str, float]) -> dict[str, float] | None:
    """One iteration with its evaluation (when due), outputs and checkpoint; returns the evaluation."""
    faults.at_iteration(iteration)
    metrics = run_iteration(state, iteration, out_dir, runner)
    if should_evaluate(state.config, iteration):
        metrics["eval"] = _evaluate(state, runner, observers, out_dir / SAMPLES_FINAL, iteration)
        hacking = alarms.check_hacking(state.config, base_eval, metrics["eval"])
        if hacking is not None:
            metrics["alarms"].update(hacking)
    if not current_world().is_main:
        return metrics.get("eval")
    for warning in (alarms.drift_warning(metrics["alarms"], state), alarms.hacking_warning(metrics["alarms"])):
        if warning:
            log(warning)
    append_jsonl(out_dir / METRICS_FILE, metrics)
    for observer in observers:
        observer.on_iteration(metrics)
    log(_iteration_line(metrics))
    if should_checkpoint(state.config, iteration):
        save_checkpoint(out_dir, state, next_iteration=iteration + 1, base_eval=base_eval)
    return metrics.get("eval")


def _summary(state, out_dir: Path, evaluations: list[dict], seconds: float, checkpoint: Checkpoint | None) -> dict:
    config = state.config
    final_eval = {k: v for k, v in evaluations[-1].items() if k != "iteration"}
    return {
        "preset": config.preset, "family": config.family, "iterations": config.iterations,
        "eval_reward_base": {k: v for k, v in evaluations[0].items() if k != "iteration"},
        "eval_reward_final": final_eval, "evaluations": evaluations,
        "seconds": round(seconds, 2),
        "resumed_from_iteration": checkpoint.next_iteration if checkpoint is not None else None,
        "device": str(state.policy.device), "dtype": str(state.policy.dtype).removeprefix("torch."),
        "explore_backend": state.explorer.backend,  # explore.backend=auto resolved for this device
        # Counted on the loaded model at the first iteration (accounting.sample_flops caches them):
        # a report rebuilt from this run costs it under any profile without loading the model again.
        "flops_per_sample": sample_flops(state).to_record(),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.machine(),
        # The sample grids too (when written), so the closing table says where the pictures are.
        "outputs": {name: str(out_dir / name) for name in (LEDGER_FILE, METRICS_FILE, SUMMARY_FILE, LORA_FILE, CHECKPOINT, *GRIDS)
                    if name not in GRIDS or (out_dir / name).exists()},
        "config": to_dict(config),
    }


def _rewind(out_dir: Path, checkpoint: Checkpoint) -> list[dict]:
    """Drop what a killed run left past its checkpoint; the metrics records of the iterations run."""
    discard_temporaries(out_dir)
    return rewind_outputs(out_dir, checkpoint)


def _evaluate(state, runner, observers, grid_path: Path, iteration: int, adapter: str | None = EMA) -> dict:
    rewards, images = runner("evaluate", stages.evaluate, state, adapter)
    if images is None:  # a rank other than 0: the grid and the observers are rank 0's
        return rewards
    save_grid(grid_path, images, state.config)
    for observer in observers:
        observer.on_evaluation(iteration, rewards, images)
    return rewards


def save_adapters(path: Path, state: stages.RunState) -> None:
    """The LoRA adapters as safetensors, written to a temporary name and renamed into place, with
    the digest of their tensors that every reader checks (checkpoint.load_verified)."""
    tensors = adapter_state(state.policy.transformer)
    require_finite(tensors)
    metadata = {"preset": state.config.preset, "family": state.config.family, DIGEST_KEY: tensors_digest(tensors)}
    atomic_write(path, lambda temporary: save_file(tensors, temporary, metadata=metadata))


def save_grid(path: Path, images: torch.Tensor, config: Config) -> None:
    """Evaluation samples as one PNG: a row per prompt, a column per seed."""
    save_image(images, str(path), nrow=config.eval.seeds_per_prompt * 8, padding=1)


def _format_rewards(rewards: dict[str, float]) -> str:
    return "  ".join(f"{name} {value:.4f}" for name, value in rewards.items())


def _iteration_line(metrics: dict) -> str:
    fidelity = metrics["fidelity_spearman"]
    parts = [
        f"iter {metrics['iteration']:3d}",
        f"explore {metrics['explore_reward_mean']:.4f}",
        f"kept gap {metrics['kept_gap']:.4f}",
        f"loss {metrics['loss']:.4f}",
        f"fidelity {fidelity:.3f}" if fidelity is not None else "fidelity  n/a",
        f"{metrics['seconds']['total']:.1f}s",
    ]
    unscored = metrics.get("nonfinite_rewards", {})
    if any(unscored.values()):
        parts.append(f"unscored images {unscored['explore']} explored / {unscored['trained']} trained")
    if "eval" in metrics:
        parts.append("eval " + _format_rewards(metrics["eval"]))
    return " | ".join(parts)
