"""What a perfect teacher buys make run's adapter (issue 10, item 2): the same LoRA, optimizer and
step budget as the RL update, fine-tuned by flow matching on the renderer's own drawings of the
training captions instead of on the policy's ranked samples.

    .venv/bin/python benchmarks/perfect_teacher.py --out reports/benchmarks/perfect_teacher.json \
        --set prompts_per_iteration=24 --set pool=16 --set keep=4

RL teaches only what a prompt's best and worst seeds differ on; a teacher whose every image is
the ground truth (compliance ~1) has no such limit. Everything else is the run's own: the config
(the preset, the sol_rl family and any ``--set`` overrides), its LoRA (rank, targets, seed), its
AdamW and learning rate, and per optimizer step as many (image, noise level) pairs as the RL
update trains on, at the same noise levels (the regeneration sampler's grid, ``timestep_fraction``
of it per image). The evaluation adapter is an EMA blended once per iteration as the RL's is.
Evaluations at ``--checkpoints`` optimizer steps (make run's budget is iterations x
steps_per_iteration) give compliance, aesthetic and the reward's terms on the run's held-out
prompts and seeds, for the EMA and the trained adapter.

It answers whether the ground truth is a shortcut: if likelihood training on perfect drawings
cannot raise held-out compliance in the budget, the base already sits where flow matching puts a
model of its size, and a reward gain has to come from optimising the reward itself.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._threads import add_threads_option, use_threads  # noqa: E402

TERMS = ("compliance", "background", "amount", "location", "shape")


def ground_truth_latents(prompts: list[str], image_size: int, patch: int) -> torch.Tensor:
    """The renderer's drawing of each caption, as the policy's packed pixel latents."""
    from solrl_core.models.flux import pack_patches
    from solrl_core.world.captions import parse_caption
    from solrl_core.world.scenes import render

    images = torch.stack([render(parse_caption(prompt), image_size) for prompt in prompts])
    return pack_patches(images * 2 - 1, patch)


def items_per_step(config) -> tuple[int, int]:
    """(images, noise levels per image) of one RL optimizer step: the kept samples of an iteration
    split over its steps, each trained at ``timestep_fraction`` of the regeneration grid."""
    from solrl_core.config import train_steps
    from solrl_core.stages import timesteps_per_sample

    levels = timesteps_per_sample(train_steps(config), config.train.timestep_fraction)
    images = config.prompts_per_iteration * config.keep // config.train.steps_per_iteration
    return max(1, images), levels


def flow_matching_step(state, latents: torch.Tensor, prompts: list[str], levels: int, grid: torch.Tensor,
                       generator: torch.Generator) -> float:
    """One AdamW step of rectified flow matching (velocity = noise - clean) on the trained adapter."""
    from solrl_core.models.adapters import TRAINED, active_adapter

    policy, train = state.policy, state.config.train
    chosen = torch.stack([torch.randperm(len(grid), generator=generator)[:levels] for _ in prompts])  # [B, levels]
    sigma = grid[chosen.flatten()]
    clean = latents.repeat_interleave(levels, dim=0)
    noise = torch.randn(clean.shape, generator=generator)
    sigma_b = sigma.view(-1, 1, 1)
    noisy = (1 - sigma_b) * clean + sigma_b * noise
    conditioning = policy.conditioning([p for p in prompts for _ in range(levels)])
    state.optimizer.zero_grad(set_to_none=True)
    with active_adapter(policy.transformer, TRAINED):
        velocity = policy.velocity(noisy, sigma, conditioning)
    loss = ((velocity - (noise - clean)) ** 2).mean()
    loss.backward()
    trainable = state.optimizer.param_groups[0]["params"]
    torch.nn.utils.clip_grad_norm_(trainable, train.grad_clip)
    state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def evaluate_terms(state, adapter) -> dict[str, float]:
    """The run's own evaluation (compliance and aesthetic as ``stages.evaluate`` scores them), with
    the terms compliance is made of, from the same images."""
    from solrl_core import stages
    from solrl_core.world.rewards import compliance_terms

    means, images = stages.evaluate(state, adapter=adapter)
    prompts = [p for p in state.eval_prompts for _ in range(state.config.eval.seeds_per_prompt)]
    terms = compliance_terms(images, prompts)
    result = {"compliance": means["shapes-compliance"]}
    result.update({name: float(terms[name].mean()) for name in TERMS if name != "compliance"})
    result["aesthetic"] = means["shapes-aesthetic"]
    return result


class BadRequest(ValueError):
    """A request this benchmark cannot carry out; the message is one actionable line."""


def resolve(overrides: list[str], checkpoints_text: str):
    from solrl_core.config import ConfigError, parse_override
    from solrl_core.presets import resolve_config

    try:
        checkpoints = sorted({int(text) for text in checkpoints_text.split(",")})
    except ValueError:
        raise BadRequest(f"--checkpoints are optimizer steps >= 1, comma-separated (e.g. 40,160), "
                         f"got {checkpoints_text!r}") from None
    try:
        config = resolve_config("shapes-tiny", "sol_rl", [parse_override(text) for text in overrides]
                                + [("progress", False)])
    except ConfigError as error:
        raise BadRequest(str(error)) from None
    if config.model.loader != "shapes-tiny":
        raise BadRequest(f"the teacher draws the shapes world's captions; model.loader is {config.model.loader!r}")
    scored = set(config.rewards) | set(config.eval.rewards)
    if not {"shapes-compliance", "shapes-aesthetic"} <= scored:
        raise BadRequest(f"the teacher reports shapes-compliance and shapes-aesthetic; eval.rewards is "
                         f"{list(config.eval.rewards)}")
    if checkpoints[0] < 1:
        raise BadRequest(f"--checkpoints are optimizer steps >= 1, got {checkpoints_text!r}")
    return config, checkpoints


def teach(config, checkpoints: list[int]) -> dict:
    """Fine-tune the run's trained adapter on ground truth; evaluate at each checkpoint."""
    from solrl_core import stages
    from solrl_core.config import train_steps
    from solrl_core.models.adapters import EMA, TRAINED, blend_adapters
    from solrl_core.nft import ema_decay
    from solrl_core.sampling import sigma_grid

    state = stages.initial_state(config)
    side = int(math.isqrt(state.policy.latent_shape[0]))
    patch = int(math.isqrt(state.policy.latent_shape[1] // 3))
    grid = sigma_grid(train_steps(config), config.sampler.shift)[:-1]  # sigma = 0 carries no signal
    images, levels = items_per_step(config)
    picker = random.Random(f"perfect-teacher|{config.seed}")
    generator = torch.Generator().manual_seed(config.seed)

    base = evaluate_terms(state, None)
    evaluations = [{"step": 0, "ema": base, "trained": base}]
    print(f"base: {base}", flush=True)
    started, losses = time.perf_counter(), []
    for step in range(1, checkpoints[-1] + 1):
        prompts = [state.train_prompts[picker.randrange(len(state.train_prompts))] for _ in range(images)]
        losses.append(flow_matching_step(state, ground_truth_latents(prompts, side * patch, patch), prompts,
                                         levels, grid, generator))
        state.optimizer_steps = step
        if step % config.train.steps_per_iteration == 0:  # the RL blends its EMA once per iteration
            blend_adapters(state.policy.transformer, source=TRAINED, target=EMA,
                           keep=ema_decay(step, config.train.ema_max_decay))
        if step in checkpoints:
            entry = {"step": step, "seconds": round(time.perf_counter() - started, 1),
                     "loss": round(sum(losses[-20:]) / len(losses[-20:]), 5),
                     "ema": evaluate_terms(state, EMA), "trained": evaluate_terms(state, TRAINED)}
            evaluations.append(entry)
            print(f"step {step}: loss {entry['loss']:.4f} ema {entry['ema']} trained {entry['trained']}", flush=True)

    budget = config.iterations * config.train.steps_per_iteration
    at_budget = next((e for e in evaluations if e["step"] == budget), None)
    return {
        "what": "LoRA flow matching on ground-truth renders of the training captions, with make run's "
                "adapter, optimizer, learning rate and (image, noise level) pairs per optimizer step",
        "lora": {"rank": config.train.lora.rank, "alpha": config.train.lora.alpha,
                 "targets": config.train.lora.targets},
        "lr": config.train.lr, "images_per_step": images, "noise_levels_per_image": levels,
        "make_run_budget_steps": budget, "threads": torch.get_num_threads(),
        "eval": {"prompts": config.eval.prompts, "seeds_per_prompt": config.eval.seeds_per_prompt,
                 "sampler": config.sampler.kind, "steps": config.eval.steps},
        "base": base,
        "evaluations": evaluations,
        "gain_at_budget": None if at_budget is None else
        {adapter: at_budget[adapter]["compliance"] - base["compliance"] for adapter in ("ema", "trained")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override, as solrl run -S takes it (the run whose budget is taught)")
    parser.add_argument("--checkpoints", default="40,80,160,320,640",
                        help="optimizer steps at which to evaluate, comma-separated")
    parser.add_argument("--out", type=Path, default=Path("reports/benchmarks/perfect_teacher.json"))
    add_threads_option(parser)
    args = parser.parse_args(argv)
    use_threads(args)

    from solrl_core.ledger import write_json

    try:
        config, checkpoints = resolve(args.overrides, args.checkpoints)
    except BadRequest as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    report = {"overrides": args.overrides, **teach(config, checkpoints)}
    write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
