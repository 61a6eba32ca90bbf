"""Per-sample against per-tensor activation scales of the explorer, side by side in one run; writes JSON.

    .venv/bin/python benchmarks/per_sample_scale.py --out reports/benchmarks/per_sample_scale.json
    .venv/bin/python benchmarks/per_sample_scale.py --quick     # a smoke run: tiny sizes, under a minute

The explorer takes each activation's tensor-level scale per sample (solrl_core/quant/activation_scale.py),
so a draft does not depend on the samples sharing its explore chunk. Before, one scale covered the
whole chunk; that mode is reachable here only (``_per_tensor_scales``), through the same kernels as
it ran. For each backend (emulated NVFP4, FP8) and mode this measures:

- ranking fidelity against full precision, as ``solrl fidelity`` measures it (held-out prompts,
  the same seeds sampled at full precision at ``regenerate.steps`` and by the explorer at
  ``explore.steps``, solrl_core.fidelity.ranking_metrics), once per run seed (each seed draws other
  noise): mean and standard error over the seeds, and the per-seed paired difference per-sample
  minus per-tensor (same seeds, same truth) with its standard error. The explorer samples in
  chunks of ``explore.chunk`` (the preset's 96: with the default pool of 48, two prompt groups per
  chunk, as in the study's runs), which is what a per-tensor scale spans;
- the explorer's forward time on one batch, modes and backends interleaved so drift in the
  machine's load hits all alike, median of the repeats (full precision beside them). On a CPU the
  quantized backends are emulated in fp32: the times are the emulation's.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._threads import add_threads_option, use_threads  # noqa: E402
from solrl_core import stages  # noqa: E402
from solrl_core.cli_syntax import add_list_argument, run_seed_list  # noqa: E402
from solrl_core.config import ConfigError, parse_override  # noqa: E402
from solrl_core.fidelity import fidelity_seeds, ranking_metrics  # noqa: E402
from solrl_core.ledger import write_json  # noqa: E402
from solrl_core.models.adapters import OLD, active_adapter  # noqa: E402
from solrl_core.presets import resolve_config  # noqa: E402
from solrl_core.prompts import evaluation_prompts  # noqa: E402
from solrl_core.quant.activation_scale import _per_tensor_scales  # noqa: E402
from solrl_core.quant.explorer import build_explorer  # noqa: E402
from solrl_core.seed_stats import mean_se  # noqa: E402

BACKENDS = ("emulated-nvfp4", "fp8")
MODES = {"per-sample": nullcontext, "per-tensor": _per_tensor_scales}
# The study's explore and full-precision steps (params.yaml) and its pool of 48.
FULL = {"prompts": 32, "pool": 48, "seeds": "0,1,2", "batch": 96, "repeats": 7,
        "overrides": ["explore.steps=6", "regenerate.steps=10"]}
DEFAULT_OUT = Path("reports/benchmarks/per_sample_scale.json")
QUICK_OUT = Path(tempfile.gettempdir()) / "per_sample_scale-quick.json"  # a smoke run never replaces the report
QUICK = {"prompts": 4, "pool": 8, "seeds": "0,1", "batch": 16, "repeats": 2,
         "overrides": ["explore.steps=2", "regenerate.steps=3", "explore.chunk=16"]}


def fidelity_for_seed(config, seed: int, prompts: int, pool: int, explorers: dict, state) -> dict:
    """Ranking metrics of every (backend, mode) against full precision, for one run seed's noise."""
    config = dataclasses.replace(config, seed=seed)
    held_out = evaluation_prompts(dataclasses.replace(config, eval=dataclasses.replace(config.eval, prompts=prompts)))
    flat_prompts = [p for p in held_out for _ in range(pool)]
    seeds = [s for g in range(len(held_out)) for s in fidelity_seeds(seed, g, pool)]

    def rewards(steps: int, chunk: int, explorer) -> torch.Tensor:
        latents, _ = stages._sample_seeds(state, flat_prompts, seeds, steps, chunk, adapter=OLD, explorer=explorer,
                                          label="fidelity")
        return stages._score(state, latents, flat_prompts, list(config.rewards)).combined.view(len(held_out), pool)

    truth = rewards(config.regenerate.steps, config.regenerate.chunk, None)
    result = {}
    for backend, explorer in explorers.items():
        drafts = {}
        for mode, scales in MODES.items():
            with scales():
                drafts[mode] = rewards(config.explore.steps, config.explore.chunk, explorer)
            result[(backend, mode)] = ranking_metrics(drafts[mode], truth)
        moved = (drafts["per-sample"] - drafts["per-tensor"]).abs()
        result[(backend, "draft_reward_change")] = {"mean": float(moved.mean()), "max": float(moved.max())}
    return result


def summarize(per_seed: list[dict]) -> dict:
    """Mean ± SE over seeds of each metric, per (backend, mode), and the paired per-seed differences."""
    def flat(metrics: dict, prefix: str = "") -> dict[str, float]:
        out = {}
        for key, value in metrics.items():
            if isinstance(value, dict):
                out.update(flat(value, f"{prefix}{key}."))
            elif value is not None:
                out[prefix + key] = value
        return out

    def stats(values: list[float]) -> dict:
        mean, se = mean_se(values)
        return {"mean": mean, "se": se, "per_seed": values}

    summary = {}
    for backend in BACKENDS:
        modes = {mode: [flat(seed[(backend, mode)]) for seed in per_seed] for mode in MODES}
        names = [name for name in modes["per-sample"][0] if all(name in m for ms in modes.values() for m in ms)]
        summary[backend] = {
            **{mode: {name: stats([m[name] for m in records]) for name in names} for mode, records in modes.items()},
            "per_sample_minus_per_tensor": {name: stats([a[name] - b[name] for a, b in
                                                         zip(modes["per-sample"], modes["per-tensor"])])
                                            for name in names},
            "draft_reward_change": [seed[(backend, "draft_reward_change")] for seed in per_seed],
        }
    return summary


def forward_seconds(state, explorers: dict, batch: int, repeats: int) -> dict:
    """Median seconds of one explorer forward per (backend, mode), and of the full-precision one."""
    policy, transformer = state.policy, state.policy.transformer
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn((batch, *policy.latent_shape), generator=generator).to(policy.device)
    sigma = torch.full((batch,), 0.5, device=policy.device)
    conditioning = policy.conditioning([state.train_prompts[i % len(state.train_prompts)] for i in range(batch)])

    def forward(backend: str | None, mode: str):
        with torch.no_grad(), active_adapter(transformer, OLD), MODES[mode](), \
                explorers[backend].active(transformer) if backend else nullcontext():
            policy.velocity(latents, sigma, conditioning)
        if policy.device.type == "cuda":
            torch.cuda.synchronize(policy.device)

    variants = [("full precision", None, "per-sample")] + [
        (f"{backend} {mode}", backend, mode) for backend in BACKENDS for mode in MODES]
    for _, backend, mode in variants:  # warm-up (and the GPU path's compiles)
        forward(backend, mode)
    timings: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for _ in range(repeats):
        for name, backend, mode in variants:
            started = time.perf_counter()
            forward(backend, mode)
            timings[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(values) for name, values in timings.items()}
    return {"batch": batch, "repeats": repeats, "median_s": medians, "all_s": timings,
            "per_sample_over_per_tensor": {b: medians[f"{b} per-sample"] / medians[f"{b} per-tensor"]
                                           for b in BACKENDS}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (4 prompts x 8 seeds, 2 seeds, 2 repeats)")
    parser.add_argument("--preset", default="shapes-tiny")
    parser.add_argument("--prompts", type=int, default=None, help=f"held-out prompts (default {FULL['prompts']})")
    parser.add_argument("--pool", type=int, default=None, help=f"seeds per prompt (default {FULL['pool']})")
    add_list_argument(parser, "--seeds", "0,1,2", default=None, help=f"run seeds (default {FULL['seeds']})")
    parser.add_argument("--batch", type=int, default=None, help=f"batch of the timed forward (default {FULL['batch']})")
    parser.add_argument("--repeats", type=int, default=None, help=f"timed repeats (default {FULL['repeats']})")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"JSON to write (default {DEFAULT_OUT}; with --quick {QUICK_OUT})")
    parser.add_argument("-S", dest="overrides", action="append", default=[],
                        help="config KEY=VALUE, after the defaults")
    add_threads_option(parser)
    try:  # the list syntax's one-line refusals (`--seeds 0 1`, a repeated or negative seed)
        args = parser.parse_args(argv)
        sizes = QUICK if args.quick else FULL
        seeds = run_seed_list(args.seeds or sizes["seeds"])
    except ConfigError as error:
        parser.error(str(error))
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    prompts, pool = args.prompts or sizes["prompts"], args.pool or sizes["pool"]
    batch, repeats = args.batch or sizes["batch"], args.repeats or sizes["repeats"]
    if min(prompts, pool, batch, repeats) < 1 or pool < 4:
        parser.error("--prompts, --batch and --repeats must be >= 1 and --pool >= 4")
    use_threads(args)

    started = time.perf_counter()
    overrides = [parse_override(text) for text in [*sizes["overrides"], *args.overrides]] + [("progress", False)]
    config = resolve_config(args.preset, "sol_rl", overrides)
    state = stages.initial_state(config)  # fresh adapters: "old" is the base model
    transformer = state.policy.transformer
    explorers = {}
    for backend in BACKENDS:
        explorers[backend] = build_explorer(transformer, backend, config.quant.skip, config.quant.min_dim,
                                            config.quant.fused)
        explorers[backend].requantize(transformer, adapter=OLD)
    per_seed = []
    for seed in seeds:
        per_seed.append(fidelity_for_seed(config, seed, prompts, pool, explorers, state))
        print(f"seed {seed}: " + "  ".join(f"{b} {m} spearman {per_seed[-1][(b, m)]['spearman']:.4f}"
                                          for b in BACKENDS for m in MODES), flush=True)
    speed = forward_seconds(state, explorers, batch, repeats)
    result = {
        "mode": "quick" if args.quick else "full", "preset": args.preset, "model_path": config.model.path,
        "prompts": prompts, "pool": pool, "seeds": seeds, "explore_steps": config.explore.steps,
        "full_precision_steps": config.regenerate.steps, "explore_chunk": config.explore.chunk,
        "prompt_groups_per_chunk": config.explore.chunk / pool, "rewards": config.rewards,
        "device": str(state.policy.device), "dtype": str(state.policy.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "quantized_layers": {b: len(e.layer_names) for b, e in explorers.items()},
        "fidelity": summarize(per_seed), "forward": speed,
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_json(out, result)
    for backend in BACKENDS:
        difference = result["fidelity"][backend]["per_sample_minus_per_tensor"]["spearman"]
        se = f" ± {difference['se']:.4f}" if difference["se"] is not None else ""
        print(f"{backend}: spearman per-sample - per-tensor {difference['mean']:+.4f}{se}; forward per-sample / "
              f"per-tensor {speed['per_sample_over_per_tensor'][backend]:.3f}")
    print(f"wrote {out} in {result['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
