"""What costs the explorer its ranking: W4A4 against weight-only and activation-only NVFP4, which
layer groups are quantized, and the block size, on the embedded world (issue: ranking fidelity).

For P held-out prompts x N seeds the full-precision policy at T_train steps is the truth; each
variant drafts the same seeds at T_explore steps and is scored by the metrics of `solrl fidelity`
(Spearman, Kendall, top-k precision, bottom-12 contamination, mean true ranks). The variants are
data (VARIANTS below): which Linear layers, how their weights and their inputs are rounded.

    .venv/bin/python benchmarks/fidelity_anatomy.py --prompts 16 --pool 96 --out reports/benchmarks/fidelity_anatomy.json
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._threads import add_threads_option, use_threads  # noqa: E402
from solrl_core.ledger import write_json  # noqa: E402
from solrl_core.quant.fp8 import quantize_fp8  # noqa: E402
from solrl_core.quant.nvfp4 import (  # noqa: E402
    _apply_scales,
    _block_scales_e4m3,
    _scale_into_e2m1_range,
    _split_into_blocks,
    _unblock,
    fake_quantize_nvfp4,
    round_to_e2m1,
    tensor_scales,
)


def fake_quantize_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """NVFP4's recipe (SPEC §3) with ``block`` values per scale instead of 16, for the block-size
    ablation only, from nvfp4.py's own steps; block 16 is checked against its quantizer in main()."""
    shape = x.shape
    flat = x.float().reshape(-1, shape[-1])
    pad = (-shape[-1]) % block
    blocks = F.pad(flat, (0, pad)).reshape(flat.shape[0], -1, block)
    scales = tensor_scales(flat.abs().amax())
    block_scales = _block_scales_e4m3(blocks, scales)
    values = _apply_scales(round_to_e2m1(_scale_into_e2m1_range(blocks, block_scales, scales)), block_scales,
                           scales.tensor_scale)
    return values.reshape(flat.shape[0], -1)[:, : shape[-1]].reshape(shape).to(x.dtype)


# Block-scale clip factors tried per block by the searched weight rounding (1.0 is NVFP4's amax rule).
SEARCHED_CLIPS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6)


def fake_quantize_searched(x: torch.Tensor, clips: tuple[float, ...] = SEARCHED_CLIPS) -> torch.Tensor:
    """NVFP4 weights whose E4M3 block scales are searched, not set by the block's amax: each block
    keeps the clip factor whose decoded values have the least squared error. The result is a valid
    NVFP4 tensor (any E4M3 block scale is), so a GPU kernel runs it unchanged; weights are rounded
    once per requantization, so the search costs nothing per step. Activations cannot be searched
    this way (their rounding happens inside every forward). Built from nvfp4.py's own steps: a
    block scaled by ``clip`` has exactly ``clip`` x its amax, so clip 1.0 is fake_quantize_nvfp4."""
    blocks = _split_into_blocks(x)
    scales = tensor_scales(blocks.abs().amax())

    def rounded(clip: float) -> torch.Tensor:
        block_scales = _block_scales_e4m3(blocks * clip, scales)  # clip < 1 saturates the largest at +-6
        return _apply_scales(round_to_e2m1(_scale_into_e2m1_range(blocks, block_scales, scales)),
                             block_scales, scales.tensor_scale)

    candidates = torch.stack([rounded(clip) for clip in clips])
    errors = (candidates - blocks).square().sum(-1)  # [clips, ..., n_blocks]
    best = errors.argmin(0)  # the first (largest) clip among equals: amax's rule unless another is better
    chosen = torch.gather(candidates, 0, best[None, ..., None].expand(1, *candidates.shape[1:]))[0]
    return _unblock(chosen, x.shape, x.dtype)


def fake_quantize_fp8(x: torch.Tensor) -> torch.Tensor:
    values, scale = quantize_fp8(x.float())
    return values.float() * scale


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


NVFP4 = fake_quantize_nvfp4
ATTENTION = ["*attn.to_q", "*attn.to_k", "*attn.to_v", "*attn.to_out.0", "*attn.add_q_proj", "*attn.add_k_proj",
             "*attn.add_v_proj", "*attn.to_add_out"]
MLP = ["*ff.net.*", "*ff_context.net.*", "*proj_mlp", "single_transformer_blocks.*.proj_out"]
EMBEDDERS_AND_HEAD = ["x_embedder", "context_embedder", "time_text_embed.*", "norm_out.*", "proj_out"]
MODULATION = ["*norm1.linear", "*norm1_context.linear", "*norm.linear"]

# name: (layer globs, weight rounding, activation rounding). The shapes-tiny preset's explorer (skip list
# + min_dim 64) is "MLPs only" at width 64: every attention projection there is 64 x 64.
VARIANTS: dict[str, tuple[list[str], object, object]] = {
    "all layers W4A4": (["*"], NVFP4, NVFP4),
    "skip list W4A4": (ATTENTION + MLP, NVFP4, NVFP4),
    "skip list W4 only": (ATTENTION + MLP, NVFP4, identity),
    "skip list A4 only": (ATTENTION + MLP, identity, NVFP4),
    "attention only W4A4": (ATTENTION, NVFP4, NVFP4),
    "MLPs only W4A4": (MLP, NVFP4, NVFP4),  # min_dim 64 at width 64: attention (64 x 64) stays high
    "skip list W4A4 block 8": (ATTENTION + MLP, lambda x: fake_quantize_blocks(x, 8), lambda x: fake_quantize_blocks(x, 8)),
    "skip list W4A4 block 32": (ATTENTION + MLP, lambda x: fake_quantize_blocks(x, 32),
                                lambda x: fake_quantize_blocks(x, 32)),
    "skip list W4A4 searched weight scales": (ATTENTION + MLP, fake_quantize_searched, NVFP4),
    "skip list W4 only searched weight scales": (ATTENTION + MLP, fake_quantize_searched, identity),
    "MLPs only W4A4 searched weight scales": (MLP, fake_quantize_searched, NVFP4),
    "all layers W4A4 searched weight scales": (["*"], fake_quantize_searched, NVFP4),
    "skip list W8A8 FP8": (ATTENTION + MLP, fake_quantize_fp8, fake_quantize_fp8),
    "full precision": ([], identity, identity),
}


def linear_names(model: torch.nn.Module, globs: list[str]) -> list[str]:
    """The Linear layers (a LoRA wrapper counting as its base layer, as the explorer counts them)."""
    from solrl_core.quant.explorer import select_quantized_layers

    return [name for name in select_quantized_layers(model, skip=[], min_dim=0)
            if any(fnmatch.fnmatchcase(name, g) for g in globs)]


class RoundedExplorer:
    """The explorer's contract (``active(model)``) with one variant's rounding of weights and inputs."""

    def __init__(self, model: torch.nn.Module, globs: list[str], weights, activations):
        from solrl_core.quant.explorer import effective_linear_weights

        self.layer_names = linear_names(model, globs)
        merged = {name: effective_linear_weights(model.get_submodule(name), "old") for name in self.layer_names}
        self.cached = {name: (weights(weight), bias) for name, (weight, bias) in merged.items()}
        self.activations = activations

    def _forward(self, name: str):
        weight, bias = self.cached[name]

        def forward(x: torch.Tensor) -> torch.Tensor:
            return F.linear(self.activations(x.float()), weight, bias).to(x.dtype)
        return forward

    def active(self, model: torch.nn.Module):
        # The explorer's own forward swap (restores whatever forward each layer had, also on errors).
        from solrl_core.quant.explorer import _all_forwards_replaced

        return _all_forwards_replaced(model, {name: self._forward(name) for name in self.layer_names})


def parameter_share(model: torch.nn.Module, names: list[str]) -> float:
    """Share of the base model's parameters (LoRA adapters left out) in the quantized layers."""
    from solrl_core.quant.explorer import effective_linear_weights

    quantized = sum(effective_linear_weights(model.get_submodule(n), None)[0].numel() for n in names)
    return quantized / sum(p.numel() for name, p in model.named_parameters() if "lora_" not in name)


def measure_variants(model_path: str, prompts: int, pool: int, explore_steps: int, variant_names: list[str],
                     on_result=lambda report: None, log=print) -> dict:
    """Truth (full precision at the preset's T_train steps) and each variant's draft ranking on one
    checkpoint; ``on_result`` gets the report after the truth and after every variant."""
    from solrl_core import stages
    from solrl_core.fidelity import fidelity_seeds, format_result, ranking_metrics
    from solrl_core.models.adapters import OLD
    from solrl_core.presets import resolve_config
    from solrl_core.prompts import evaluation_prompts

    config = resolve_config("shapes-tiny", "sol_rl", [("eval.prompts", prompts), ("model.path", model_path),
                                                      ("progress", False)])
    state = stages.initial_state(config)
    held_out = evaluation_prompts(config)
    flat_prompts = [p for p in held_out for _ in range(pool)]
    seeds = [s for g in range(len(held_out)) for s in fidelity_seeds(config.seed, g, pool)]
    model = state.policy.transformer

    def scored(steps: int, explorer) -> torch.Tensor:
        latents, _ = stages._sample_seeds(state, flat_prompts, seeds, steps, 96, adapter=OLD, explorer=explorer,
                                          label="anatomy")
        return stages._score(state, latents, flat_prompts, list(config.rewards)).combined.view(len(held_out), pool)

    started = time.perf_counter()
    truth = scored(config.regenerate.steps, None)
    report = {"prompts": len(held_out), "pool": pool, "explore_steps": explore_steps,
              "full_precision_steps": config.regenerate.steps, "model_path": model_path or "committed",
              "threads": torch.get_num_threads(), "truth_reward_mean": float(truth.mean()),
              "truth_seconds": round(time.perf_counter() - started, 1), "results": []}
    log(f"truth: {truth.numel()} samples, mean {float(truth.mean()):.4f} ({report['truth_seconds']:.0f}s)")
    on_result(report)
    for name in variant_names:
        globs, weights, activations = VARIANTS[name]
        begun = time.perf_counter()
        explorer = RoundedExplorer(model, globs, weights, activations) if globs else None
        proxy = scored(explore_steps, explorer)
        metrics = ranking_metrics(proxy, truth)
        layers = explorer.layer_names if explorer else []
        report["results"].append({"variant": name, "quantized_layers": len(layers),
                                  "quantized_parameter_share": round(parameter_share(model, layers), 4),
                                  **metrics, "seconds": round(time.perf_counter() - begun, 1)})
        log(f"{name:28s} layers {len(layers):3d}  " + format_result(metrics))
        on_result(report)
    return report


def unknown_variants(names: list[str]) -> str | None:
    """The one-line complaint about names that are not in VARIANTS, or None."""
    unknown = [name for name in names if name not in VARIANTS]
    return f"unknown variant(s) {', '.join(unknown)}; choose from: {', '.join(VARIANTS)}" if unknown else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--pool", type=int, default=96)
    parser.add_argument("--explore-steps", type=int, default=6)
    parser.add_argument("--model-path", default="")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, default=Path("reports/benchmarks/fidelity_anatomy.json"))
    add_threads_option(parser)
    args = parser.parse_args()
    use_threads(args)
    problem = unknown_variants(args.variants.split(","))
    if problem:
        parser.error(problem)
    probe = torch.randn(7, 48)
    assert torch.equal(fake_quantize_blocks(probe, 16), fake_quantize_nvfp4(probe)), "block-16 rounding disagrees"
    assert torch.equal(fake_quantize_searched(probe, (1.0,)), fake_quantize_nvfp4(probe)), "searched rounding disagrees"
    measure_variants(args.model_path, args.prompts, args.pool, args.explore_steps, args.variants.split(","),
                     on_result=lambda report: write_json(args.out, report),
                     log=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
