"""The embedded world's base model as a user meets it: held-out rewards (the preset's evaluation
sampler and steps, fixed evaluation seeds), how much a prompt's seeds differ, and a captioned grid.

    .venv/bin/python benchmarks/base_model.py --prompts 64 --out reports/base_model.json

Writes the JSON (means with standard errors over prompts, the per-prompt spread across seeds, the
checkpoint's training record) and, beside it, ``base_samples.png``: the first prompts, one row each,
their caption on the left and one image per evaluation seed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._threads import add_threads_option, use_threads  # noqa: E402
from solrl_core.ledger import write_json  # noqa: E402
from solrl_core.seed_stats import mean_se  # noqa: E402


def mean_and_se(values: torch.Tensor) -> dict:
    finite = values[torch.isfinite(values)].double().tolist()
    mean, se = mean_se(finite)
    return {"mean": mean, "se": se, "n": len(finite)}


def captioned_grid(images: torch.Tensor, prompts: list[str], per_prompt: int, rows: int, path: Path) -> None:
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = min(rows, len(prompts) // per_prompt)
    figure, axes = plt.subplots(rows, per_prompt + 1, figsize=(3.0 + 1.1 * per_prompt, 1.1 * rows), squeeze=False,
                                gridspec_kw={"width_ratios": [2.7] + [1] * per_prompt})
    for row in range(rows):
        axes[row][0].axis("off")
        axes[row][0].text(1.0, 0.5, textwrap.fill(prompts[row * per_prompt], 34), ha="right", va="center",
                          fontsize=7, transform=axes[row][0].transAxes)
        for column in range(per_prompt):
            axis = axes[row][column + 1]
            axis.imshow(images[row * per_prompt + column].permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
    figure.tight_layout(pad=0.3)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def measure_base(model_path: str, prompts: int, seeds: int) -> tuple[dict, torch.Tensor, list[str]]:
    """Held-out rewards of a checkpoint (means with SEs over prompts, the within-prompt spread),
    its training record, and the evaluation images with their captions."""
    from solrl_core import stages
    from solrl_core.models.shapes_tiny import read_checkpoint
    from solrl_core.presets import resolve_config
    from solrl_core.world import SHAPES_TINY_CHECKPOINT as CHECKPOINT

    config = resolve_config("shapes-tiny", "sol_rl", [("eval.prompts", prompts), ("eval.seeds_per_prompt", seeds),
                                                      ("model.path", model_path), ("progress", False)])
    state = stages.initial_state(config)
    _, images = stages.evaluate(state, adapter=None)  # its means are recomputed below, with SEs
    captions = [p for p in state.eval_prompts for _ in range(config.eval.seeds_per_prompt)]
    per_sample = state.rewards.score(images, captions, list(config.eval.rewards)).per_reward
    report = {"model_path": model_path or str(CHECKPOINT.name), "prompts": len(state.eval_prompts),
              "seeds_per_prompt": config.eval.seeds_per_prompt, "sampler": config.sampler.kind,
              "steps": config.eval.steps, "rewards": {}, "training": read_checkpoint(
                  Path(model_path) if model_path else CHECKPOINT)[3]}
    for name, values in per_sample.items():
        by_prompt = values.view(len(state.eval_prompts), config.eval.seeds_per_prompt)
        report["rewards"][name] = {**mean_and_se(by_prompt.mean(1)),
                                   "within_prompt_std_mean": float(by_prompt.std(1).mean()),
                                   "share_of_samples_above_0.5": float((values > 0.5).double().mean())}
    return report, images, captions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=2, help="evaluation seeds per prompt")
    parser.add_argument("--model-path", default="")
    parser.add_argument("--grid-rows", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("reports/base_model.json"))
    add_threads_option(parser)
    args = parser.parse_args()
    use_threads(args)

    report, images, captions = measure_base(args.model_path, args.prompts, args.seeds)
    for name, reward in report["rewards"].items():
        print(f"{name}: {reward['mean']:.4f} ± {reward['se']:.4f} (SE over prompts); "
              f"within-prompt std {reward['within_prompt_std_mean']:.3f}")
    write_json(args.out, report)
    captioned_grid(images, captions, args.seeds, args.grid_rows, args.out.with_name("base_samples.png"))


if __name__ == "__main__":
    main()
