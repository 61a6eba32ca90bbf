"""Wall-clock estimate of a whole `dvc repro` of the study in params.yaml, from its stages' sizes;
writes JSON. Nothing is trained.

    .venv/bin/python benchmarks/study_wallclock.py --out reports/benchmarks/study_wallclock.json

How: every run stage (family x seed, ablation point x seed) is sized to its budget exactly as the
stage sizes itself (solrl_core.study's config, solrl_core.compare.size_to_budget on its modeled
iteration), which gives its iterations and evaluations. The calls each training stage makes per
iteration come from accounting.stage_flops, which multiplies a per-call quantity by the number of
calls; here it is fed measured CPU seconds per call instead of FLOPs: one sample through the
policy, through each explorer backend, forward + backward of the trained adapter, a decode, a
requantize, measured at the runs' batch sizes on the embedded world. Reward scoring (analytic,
so free in the FLOP model but not on a CPU) is added per scored image. The fidelity stage is its
full-precision truth plus every backend's drafts at every step count, scored; each stage adds one
measured process start (interpreter + the training stack's imports). The comparison and report
stages' own work (bootstrap, plots) is not modeled beyond their process start.

Seconds are CPU time of this process (time.process_time), so a machine shared with other jobs
inflates them less than wall-clock would; with the stages' one thread each they stand for
wall-clock on an idle core. DVC runs the stages one after another.
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._threads import add_threads_option, use_threads  # noqa: E402
from solrl_core.study import ablation_config, family_config, load_study  # noqa: E402
from solrl_core import stages  # noqa: E402
from solrl_core.accounting import Flops, SampleFlops, stage_flops  # noqa: E402
from solrl_core.adaptive import schedule_counts  # noqa: E402
from solrl_core.compare import size_to_budget  # noqa: E402
from solrl_core.config import rollout_steps, set_key, train_steps  # noqa: E402
from solrl_core.ledger import write_json  # noqa: E402
from solrl_core.models.adapters import OLD, TRAINED, active_adapter  # noqa: E402
from solrl_core.rewards.registry import RewardSet  # noqa: E402
from solrl_core.training import should_evaluate  # noqa: E402

TRAINING = ("explore", "rank", "regenerate", "update", "requantize")
IMPORTS = "import solrl_core.study, solrl_core.compare, solrl_core.training, solrl_core.fidelity"


def cpu_seconds(call, repeats: int = 3) -> float:
    """Median CPU seconds of ``call()`` over ``repeats`` (after one warm-up call)."""
    call()
    samples = []
    for _ in range(repeats):
        started = time.process_time()
        call()
        samples.append(time.process_time() - started)
    return statistics.median(samples)


def process_start_seconds() -> float:
    """CPU seconds (user + system) of a fresh interpreter importing what a stage imports."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", IMPORTS], check=True, cwd=Path(__file__).resolve().parents[1])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def per_call_seconds(config, backends: set[str]) -> dict:
    """Seconds per sample of each call an iteration makes, and per scored image, on ``config``'s model."""
    state = stages.initial_state(config)
    stages.quantize(state)
    policy, transformer = state.policy, state.policy.transformer
    batch = config.explore.chunk
    latents = torch.randn((batch, *policy.latent_shape), generator=torch.Generator().manual_seed(0))
    sigma = torch.full((batch,), 0.5)
    conditioning = policy.conditioning(state.train_prompts[:1] * batch)

    def forward(adapter):
        def call():
            with torch.no_grad(), active_adapter(transformer, adapter):
                policy.velocity(latents, sigma, conditioning)
        return call

    def forward_backward():
        with active_adapter(transformer, TRAINED):
            policy.velocity(latents, sigma, conditioning).square().mean().backward()
        for parameter in transformer.parameters():
            parameter.grad = None

    explorers = {}
    for backend in sorted(backends - {"none"}):
        explored = stages.initial_state(with_backend(config, backend))
        stages.quantize(explored)

        def call(explored=explored):
            with torch.no_grad(), active_adapter(explored.policy.transformer, OLD), \
                    explored.explorer.active(explored.policy.transformer):
                explored.policy.velocity(latents, sigma, conditioning)
        explorers[backend] = cpu_seconds(call) / batch
    with torch.no_grad():
        images = policy.decode(latents)
    scorer = RewardSet(config.rewards, extra=config.eval.rewards, paths=config.reward_paths)
    return {
        "policy_forward": cpu_seconds(forward(OLD)) / batch,
        "reference_forward": cpu_seconds(forward(None)) / batch,
        "trained_forward_backward": cpu_seconds(forward_backward) / batch,
        "decode": cpu_seconds(lambda: policy.decode(latents)) / batch,
        "requantize": cpu_seconds(lambda: stages.requantize(state)),
        "score": cpu_seconds(lambda: scorer.score(images, state.train_prompts[:1] * batch)) / batch,
        "explorer_forward": explorers,
        "batch": batch,
    }


def with_backend(config, backend: str):
    import copy

    changed = copy.deepcopy(config)
    set_key(changed, "explore.backend", backend)
    return changed


def iteration_seconds(config, seconds: dict) -> dict[str, float]:
    """CPU seconds of each stage of one iteration of ``config`` (its calls counted as
    accounting.iteration_hours counts them), plus reward scoring, and of one evaluation."""
    backend = config.explore.backend
    explorer = seconds["policy_forward"] if backend == "none" else seconds["explorer_forward"][backend]
    per_call = SampleFlops(policy_forward=Flops(high=seconds["policy_forward"]), explorer_forward=Flops(high=explorer),
                           reference_forward=Flops(high=seconds["reference_forward"]),
                           trained_forward_backward=Flops(high=seconds["trained_forward_backward"]),
                           requantize=Flops(high=seconds["requantize"] if backend != "none" else 0.0),
                           decode=Flops(high=seconds["decode"]))
    prompts = config.prompts_per_iteration
    adaptive = schedule_counts(config)
    rows, scored = (prompts * adaptive[0], prompts * adaptive[1]) if adaptive else (None, 0)
    calls = stage_flops(config, per_call, prompts * config.pool, rollout_steps(config), prompts * config.keep,
                        train_steps(config), evaluated=True, explore_rows=rows, scored_drafts=scored)
    result = {stage: calls[stage].total for stage in (*TRAINING, "evaluate")}
    # Rewards: every draft is scored, then every regenerated sample; each evaluation image.
    images = prompts * config.pool + (prompts * config.keep if config.regenerate.enabled else 0)
    result["rank"] += images * seconds["score"] + images * seconds["decode"]
    result["evaluate"] += config.eval.prompts * config.eval.seeds_per_prompt * (seconds["score"] + seconds["decode"])
    return result


def run_stage_estimate(config, study, budget_gpu_hours: float, seconds: dict) -> dict:
    from solrl_core.stages import modeled_iteration_hours

    sized = size_to_budget(config, budget_gpu_hours, study.evaluations, modeled_iteration_hours(config)["total"])
    stage = iteration_seconds(sized, seconds)
    evaluations = 1 + sum(should_evaluate(sized, i) for i in range(sized.iterations))  # the base, then each
    training = sized.iterations * sum(stage[name] for name in TRAINING)
    return {"iterations": sized.iterations, "evaluations": evaluations,
            "seconds_per_iteration": {name: round(stage[name], 3) for name in TRAINING},
            "seconds_per_evaluation": round(stage["evaluate"], 3),
            "seconds": round(training + evaluations * stage["evaluate"], 1)}


def fidelity_estimate(params: dict, config, seconds: dict) -> float:
    fidelity = params["fidelity"]
    samples = fidelity["prompts"] * fidelity["pool"]
    steps = [int(step) for step in str(fidelity["explore_steps"]).split(",")]
    backends = str(fidelity["backends"]).split(",")
    drafts = sum(seconds["explorer_forward"][backend] * sum(steps) for backend in backends)
    scored = 1 + len(backends) * len(steps)
    return samples * (train_steps(config) * seconds["policy_forward"] + drafts
                      + scored * (seconds["score"] + seconds["decode"]))


def main(argv: list[str] | None = None) -> int:
    from solrl_core.safe_input import load_yaml

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", default="reports/benchmarks/study_wallclock.json")
    add_threads_option(parser)
    args = parser.parse_args(argv)
    use_threads(args)
    study = load_study(Path(args.params))
    params = load_yaml(Path(args.params))  # within the same bounds load_study read it by
    # stage -> (its config, the budget it is sized to: the comparison's, or its ablation's own)
    runs = {f"train@{family}-{seed}": (family_config(study, family), study.budget_of())
            for family in study.families for seed in study.seeds}
    runs.update({f"{name}@{point}-{seed}": (ablation_config(study, name, str(point)), study.budget_of(name))
                 for name, section in study.ablations.items() for point in section["points"]
                 for seed in section["seeds"]})
    reference = family_config(study, "sol_rl")
    backends = {config.explore.backend for config, _ in runs.values()} | set(str(params["fidelity"]["backends"]).split(","))
    seconds = per_call_seconds(reference, backends)
    start = process_start_seconds()
    print(f"per sample: policy {seconds['policy_forward'] * 1e3:.2f} ms, explorers "
          + ", ".join(f"{b} {s * 1e3:.2f} ms" for b, s in seconds["explorer_forward"].items())
          + f", forward+backward {seconds['trained_forward_backward'] * 1e3:.2f} ms; process start {start:.1f} s")

    variants: dict[str, dict] = {}  # the seed changes no cost: one estimate per variant
    stage_estimates = {}
    for name, (config, budget) in runs.items():
        variant = name.rsplit("-", 1)[0]
        if variant not in variants:
            variants[variant] = run_stage_estimate(config, study, budget, seconds)
            print(f"{variant:26s} {variants[variant]['iterations']:3d} iterations, "
                  f"{variants[variant]['evaluations']} evaluations: {variants[variant]['seconds']:.0f} s per run")
        stage_estimates[name] = variants[variant]["seconds"] + start
    stage_estimates["fidelity"] = fidelity_estimate(params, reference, seconds) + start
    comparisons = ["compare", *(f"ablation@{name}" for name in study.ablations), "report"]
    stage_estimates.update({name: start for name in comparisons})
    total = math.fsum(stage_estimates.values())
    report = {"params": args.params, "threads": torch.get_num_threads(), "device": "cpu",
              "method": __doc__.split("How: ", 1)[1].strip(),
              "per_call_seconds": seconds, "process_start_seconds": start,
              "variants": variants, "stages": {name: round(value, 1) for name, value in stage_estimates.items()},
              "total_seconds": round(total, 1), "total_hours": round(total / 3600, 2)}
    write_json(Path(args.out), report)
    print(f"{len(stage_estimates)} stages (pretrain cached): about {total / 3600:.1f} h; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
