"""What a shapes-compliance gain is made of: the reward's terms (background, and each object's
amount of colour, location and shape) on the base model and after RL.

    .venv/bin/python benchmarks/compliance_anatomy.py --runs runs/study --out reports/benchmarks/compliance_anatomy.json

Two measurements, both on held-out evaluation prompts:

- ``spread``: the base model's images of ``--prompts`` prompts x ``--seeds`` seeds (the preset's
  evaluation sampler and steps). Per term: its mean, its spread across one prompt's seeds, and
  the best half of the seeds (by compliance) minus the worst half. Ranking a prompt's seeds can
  only teach a term its best and worst seeds differ on.
- ``runs`` (with ``--runs``, a comparison's or the DVC study's folder): every finished run's base
  and final evaluation images (``runs/<family>/seed-<s>/eval_images.safetensors``), each term's
  mean before and after, and compliance split by the captions' object count.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._threads import add_threads_option, use_threads  # noqa: E402

TERMS = ("compliance", "background", "amount", "location", "shape")


def seed_spread(terms: dict[str, torch.Tensor], prompts: int, seeds: int) -> dict:
    """Per term, over prompts: mean, within-prompt std, and best-half minus worst-half by compliance."""
    order = terms["compliance"].view(prompts, seeds).argsort(dim=1, descending=True)
    half = seeds // 2
    report = {}
    for name in TERMS:
        values = terms[name].view(prompts, seeds).double()
        ranked = values.gather(1, order)
        report[name] = {"mean": float(values.mean()), "within_prompt_std": float(values.std(dim=1).mean()),
                        "best_half_minus_worst_half": float((ranked[:, :half].mean(1) - ranked[:, half:].mean(1)).mean())}
    return report


def run_terms(root: Path, prompts: list[str], object_counts: torch.Tensor) -> dict:
    from safetensors.torch import load_file

    from solrl_core.world.rewards import compliance_terms

    runs = {}
    for run in sorted(root.glob("runs/*/seed-*")):
        images = run / "eval_images.safetensors"
        if not images.is_file():
            continue
        stored = load_file(str(images))
        before, after = compliance_terms(stored["base"], prompts), compliance_terms(stored["final"], prompts)
        entry = {name: {"base": float(before[name].mean()), "final": float(after[name].mean())} for name in TERMS}
        for count in sorted(set(object_counts.tolist())):
            chosen = object_counts == count
            entry[f"compliance_{count}_objects"] = {"base": float(before["compliance"][chosen].mean()),
                                                    "final": float(after["compliance"][chosen].mean()),
                                                    "images": int(chosen.sum())}
        runs[str(run.relative_to(root))] = entry
    if not runs:
        raise SystemExit(f"compliance_anatomy: no finished runs with evaluation images under {root / 'runs'}")
    keys = next(iter(runs.values())).keys()
    mean = {key: {side: sum(entry[key][side] for entry in runs.values()) / len(runs) for side in ("base", "final")}
            for key in keys}
    return {"runs": runs, "mean_over_runs": mean}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts for the base's seed spread")
    parser.add_argument("--seeds", type=int, default=32, help="seeds per prompt for the base's seed spread")
    parser.add_argument("--runs", type=Path, default=None, help="a comparison's folder with runs/<family>/seed-<s>")
    parser.add_argument("--out", type=Path, default=Path("reports/benchmarks/compliance_anatomy.json"))
    add_threads_option(parser)
    args = parser.parse_args()
    use_threads(args)

    from solrl_core import stages
    from solrl_core.ledger import atomic_write
    from solrl_core.presets import resolve_config
    from solrl_core.prompts import evaluation_prompts
    from solrl_core.world.captions import parse_caption
    from solrl_core.world.rewards import compliance_terms

    config = resolve_config("shapes-tiny", "sol_rl", [("eval.prompts", args.prompts),
                                                      ("eval.seeds_per_prompt", args.seeds), ("progress", False)])
    state = stages.initial_state(config)
    _, images = stages.evaluate(state, adapter=None)
    prompts = [p for p in state.eval_prompts for _ in range(args.seeds)]
    report = {"spread": {"prompts": args.prompts, "seeds": args.seeds, "sampler": config.sampler.kind,
                         "steps": config.eval.steps,
                         "terms": seed_spread(compliance_terms(images, prompts), args.prompts, args.seeds)}}
    if args.runs is not None:
        preset = resolve_config("shapes-tiny")
        eval_prompts = [p for p in evaluation_prompts(preset) for _ in range(preset.eval.seeds_per_prompt)]
        counts = torch.tensor([len(parse_caption(p).objects) for p in eval_prompts])
        report["runs_folder"] = str(args.runs)
        report.update(run_terms(args.runs, eval_prompts, counts))
    text = json.dumps(report, indent=1) + "\n"
    atomic_write(args.out, lambda temporary: Path(temporary).write_text(text, encoding="utf-8"))
    for name, entry in report["spread"]["terms"].items():
        print(f"base {name:11s} mean {entry['mean']:.3f}  within-prompt std {entry['within_prompt_std']:.3f}  "
              f"best half - worst half {entry['best_half_minus_worst_half']:+.3f}")
    for name, entry in report.get("mean_over_runs", {}).items():
        print(f"runs {name:22s} base {entry['base']:.4f}  final {entry['final']:.4f}  "
              f"change {entry['final'] - entry['base']:+.4f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
