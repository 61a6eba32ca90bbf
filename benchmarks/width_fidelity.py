"""How the explorer's ranking grows with the model's width (issue: ranking fidelity, item 4).

Each width is a checkpoint pretrained with the same recipe, only the number of 16-channel heads
differing (``solrl pretrain --heads H``). Per width: its held-out compliance as a user meets it
(benchmarks/base_model.py's measure), then the draft ranking of fidelity_anatomy.py's layer-group
variants against full precision (same truth, seeds and metrics as ``solrl fidelity``), and which
of those variants the preset's size rule (skip list + ``min_dim``) picks at that width.

    .venv/bin/python benchmarks/width_fidelity.py --checkpoint 128=runs/width/w128.safetensors \\
        --prompts 32 --out reports/benchmarks/width_fidelity.json

Widths measured by separate processes land in one report: each entry is merged into ``--out``
under a lock as it completes (a width measured again replaces its entry), and the plot beside it
(``.png``) is redrawn from all entries.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._threads import add_threads_option, use_threads  # noqa: E402
from benchmarks.base_model import measure_base  # noqa: E402
from benchmarks.fidelity_anatomy import (NVFP4, VARIANTS, linear_names, measure_variants,  # noqa: E402
                                         unknown_variants)
from solrl_core.ledger import atomic_write, write_json  # noqa: E402

DEFAULT_VARIANTS = ["all layers W4A4", "skip list W4A4", "MLPs only W4A4", "skip list W8A8 FP8", "full precision"]
PLOTTED = ("spearman", "top-12 precision")


def parse_checkpoint(text: str) -> tuple[int, str]:
    """``128=runs/w128.safetensors`` -> (128, path); an empty path is the committed checkpoint."""
    width, separator, path = text.partition("=")
    if not separator or not width.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give WIDTH=PATH, e.g. 128=runs/width/w128.safetensors "
                                         "(64= for the committed checkpoint)")
    if path and not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"{path}: no such checkpoint; pretrain it with "
                                         f"`solrl pretrain --heads {int(width) // 16} --out {path}`")
    return int(width), path


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def preset_rule_variant(model_path: str) -> dict:
    """The layers the shapes-tiny preset's explorer quantizes at this width (skip list + min_dim),
    and the variant with the same layers, when one has them."""
    from solrl_core import stages
    from solrl_core.presets import resolve_config
    from solrl_core.quant.explorer import select_quantized_layers

    config = resolve_config("shapes-tiny", "sol_rl", [("model.path", model_path), ("progress", False)])
    model = stages.initial_state(config).policy.transformer
    chosen = set(select_quantized_layers(model, config.quant.skip, config.quant.min_dim, config.quant.fused))
    # The preset's backend rounds weights and inputs alike (NVFP4, 16-value blocks).
    same = [name for name, (globs, weights, activations) in VARIANTS.items()
            if globs and weights is NVFP4 and activations is NVFP4 and set(linear_names(model, globs)) == chosen]
    return {"skip": list(config.quant.skip), "min_dim": config.quant.min_dim, "quantized_layers": len(chosen),
            "same_layers_as": same}


def checked_training_record(width: int, model_path: str) -> tuple[Path, dict]:
    """The checkpoint and its training record; one line and exit 2 when it is not of that width."""
    from solrl_core.models.shapes_tiny import read_checkpoint
    from solrl_core.world import SHAPES_TINY_CHECKPOINT

    checkpoint = Path(model_path) if model_path else SHAPES_TINY_CHECKPOINT
    arch, *_, training = read_checkpoint(checkpoint)
    actual = arch.num_attention_heads * arch.attention_head_dim
    if actual != width:
        print(f"{checkpoint}: a width-{actual} model ({arch.num_attention_heads} heads), not width {width}; "
              f"pass it as {actual}={model_path}", file=sys.stderr)
        raise SystemExit(2)
    return checkpoint, training


def measure_width(width: int, model_path: str, args: argparse.Namespace) -> dict:
    checkpoint, training = checked_training_record(width, model_path)
    started = time.perf_counter()
    base, _, _ = measure_base(model_path, args.eval_prompts, args.eval_seeds)
    compliance = base["rewards"]["shapes-compliance"]
    print(f"width {width}: held-out compliance {compliance['mean']:.4f} ± {compliance['se']:.4f}", flush=True)
    ranking = measure_variants(model_path, args.prompts, args.pool, args.explore_steps, args.variants,
                               log=lambda line: print(f"width {width}: {line}", flush=True))
    return {"width": width, "checkpoint": model_path or "committed", "checkpoint_sha256": file_digest(checkpoint),
            "training": training, "held_out": {key: base[key] for key in ("prompts", "seeds_per_prompt", "sampler",
                                                                          "steps")},
            "held_out_rewards": base["rewards"], "preset_explorer": preset_rule_variant(model_path),
            "ranking": ranking, "seconds": round(time.perf_counter() - started, 1)}


@contextlib.contextmanager
def locked(path: Path):
    # The lock lives outside the report's folder, so nothing but the report and its plot lands there.
    name = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"width_fidelity-{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def merge_entry(out: Path, entry: dict) -> dict:
    """Add (or replace) one width's entry in the report at ``out``; returns the merged report."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked(out):
        report = json.loads(out.read_text()) if out.exists() else {"widths": []}
        report["widths"] = sorted([w for w in report["widths"] if w["width"] != entry["width"]] + [entry],
                                  key=lambda w: w["width"])
        write_json(out, report)
        return report


def metric(result: dict, name: str) -> float:
    return result["spearman"] if name == "spearman" else result["top_k_precision"].get("12", float("nan"))


def _width_axis(axis, widths: list[dict], ylabel: str) -> None:
    axis.set_xscale("log", base=2)
    axis.set_xticks([w["width"] for w in widths], [str(w["width"]) for w in widths])
    axis.set_xlabel("model width (channels)")
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)


def plot_widths(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = report["widths"]
    names = list(dict.fromkeys(r["variant"] for w in widths for r in w["ranking"]["results"]))
    figure, axes = plt.subplots(1, len(PLOTTED) + 1, figsize=(15, 4.2))
    for axis, name in zip(axes, PLOTTED):
        for variant in names:
            points = [(w["width"], metric(r, name)) for w in widths for r in w["ranking"]["results"]
                      if r["variant"] == variant]
            axis.plot(*zip(*points), marker="o", label=variant)
        _width_axis(axis, widths, name)
    axes[0].legend(fontsize=7)
    compliance = [w["held_out_rewards"]["shapes-compliance"] for w in widths]
    axes[-1].errorbar([w["width"] for w in widths], [c["mean"] for c in compliance],
                      yerr=[c["se"] for c in compliance], marker="o", capsize=3)
    _width_axis(axes[-1], widths, "base held-out shapes-compliance (± SE)")
    first = widths[0]["ranking"]
    figure.suptitle(f"explorer ranking vs full precision ({first['prompts']} held-out prompts x {first['pool']} "
                    f"seeds, {first['explore_steps']} vs {first['full_precision_steps']} steps)")
    figure.tight_layout()
    atomic_write(path, lambda temporary: figure.savefig(temporary, dpi=100, format="png"))
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=parse_checkpoint, action="append", required=True,
                        help="WIDTH=PATH, repeatable; 64= is the committed checkpoint")
    parser.add_argument("--prompts", type=int, default=32, help="held-out prompts of the ranking study")
    parser.add_argument("--pool", type=int, default=96)
    parser.add_argument("--explore-steps", type=int, default=6)
    parser.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts of the compliance measure")
    parser.add_argument("--eval-seeds", type=int, default=2)
    parser.add_argument("--variants", type=lambda text: text.split(","), default=DEFAULT_VARIANTS)
    parser.add_argument("--out", type=Path, default=Path("reports/benchmarks/width_fidelity.json"))
    add_threads_option(parser)
    args = parser.parse_args()
    use_threads(args)
    problem = unknown_variants(args.variants)
    if problem:
        parser.error(problem)
    for width, model_path in args.checkpoint:
        report = merge_entry(args.out, {**measure_width(width, model_path, args), "threads": torch.get_num_threads()})
        plot_widths(report, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
