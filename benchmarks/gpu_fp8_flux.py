"""FLUX.1-dev-sized forward throughput: BF16 against the project's FP8 explorer (and, if time is
left, the emulated-NVFP4 explorer), at the 512 px shapes of the flux-* presets.

Weights are random: speed does not depend on them, and the relative error of the explorer's output
against BF16 on the same input is still a fair check of the quantized forward. Built for one
H100/H200 (sm_90: real FP8 GEMMs through torch._scaled_mm) within about 8 minutes; writes one JSON
object to stdout and, when $OUT is set, to $OUT/gpu_fp8_flux.json.

    python benchmarks/gpu_fp8_flux.py                       # the GPU check
    python benchmarks/gpu_fp8_flux.py --size tiny --device cpu --batches 1 --repeats 1   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from solrl_core.models.flux import make_flux_forward  # noqa: E402
from solrl_core.models.memory import FLUX_DEV_CONFIG  # noqa: E402
from solrl_core.presets import FLUX_QUANT_SKIP, MODEL_PRESETS  # noqa: E402
from solrl_core.quant.explorer import build_explorer  # noqa: E402
from solrl_core.quant.fp8 import _can_use_scaled_mm  # noqa: E402

TINY_CONFIG = {**FLUX_DEV_CONFIG, "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16,
               "num_attention_heads": 2, "joint_attention_dim": 64, "pooled_projection_dim": 32, "axes_dims_rope": (4, 6, 6)}
RESOLUTION = 512
TEXT_TOKENS = 512  # FLUX.1-dev's T5 sequence length
LATENT_CHANNELS = 64  # 16 VAE channels packed 2x2
TIME_BUDGET_S = 420  # leave room under an 8-minute limit


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["flux-dev", "tiny"], default="flux-dev")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-nvfp4", action="store_true", help="skip the emulated-NVFP4 comparison")
    return parser.parse_args()


def build_transformer(size: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Random weights, created directly on the device in the target dtype (no fp32 staging copy)."""
    from diffusers import FluxTransformer2DModel

    config = FLUX_DEV_CONFIG if size == "flux-dev" else TINY_CONFIG
    previous = torch.get_default_dtype()
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = FluxTransformer2DModel(**config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval().requires_grad_(False)


def inputs(model: torch.nn.Module, batch: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, dict]:
    generator = torch.Generator(device="cpu").manual_seed(1234 + batch)
    tokens = (RESOLUTION // 16) ** 2
    latents = torch.randn(batch, tokens, model.config.in_channels, generator=generator).to(device, dtype)
    conditioning = {
        "prompt_embeds": torch.randn(batch, TEXT_TOKENS, model.config.joint_attention_dim, generator=generator).to(device, dtype),
        "pooled_prompt_embeds": torch.randn(batch, model.config.pooled_projection_dim, generator=generator).to(device, dtype),
    }
    return latents, conditioning


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_forward(forward, model, latents, sigma, conditioning, device, warmup: int, repeats: int):
    """(seconds per forward, output of the last call)."""
    with torch.no_grad():
        for _ in range(warmup):
            output = forward(model, latents, sigma, conditioning)
        synchronize(device)
        started = time.perf_counter()
        for _ in range(repeats):
            output = forward(model, latents, sigma, conditioning)
        synchronize(device)
    return (time.perf_counter() - started) / max(repeats, 1), output


def relative_error(output: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    output, reference = output.float(), reference.float()
    return {
        "relative_l2": float((output - reference).norm() / reference.norm().clamp_min(1e-12)),
        "cosine": float(torch.nn.functional.cosine_similarity(output.flatten(), reference.flatten(), dim=0)),
        "finite": bool(torch.isfinite(output).all()),
    }


def memory_gib(device: torch.device) -> float | None:
    return round(torch.cuda.memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None


def main() -> dict:
    args = parse_args()
    started = time.perf_counter()
    device = torch.device(args.device)
    dtype = torch.bfloat16
    flux_settings = MODEL_PRESETS["flux.1-dev"]["settings"]
    report: dict = {"size": args.size, "resolution": RESOLUTION, "text_tokens": TEXT_TOKENS, "device": str(device),
                    "torch": torch.__version__, "dtype": "bfloat16", "batches": args.batches}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
        report["capability"] = "sm_%d%d" % torch.cuda.get_device_capability(device)

    model = build_transformer(args.size, device, dtype)
    report["parameters"] = sum(p.numel() for p in model.parameters())
    report["build_seconds"] = round(time.perf_counter() - started, 1)
    report["memory_gib_bf16_model"] = memory_gib(device)
    forward = make_flux_forward(RESOLUTION // 16, RESOLUTION // 16, guidance=1.0)

    min_dim = flux_settings["quant"]["min_dim"] if args.size == "flux-dev" else 0
    backends = ["fp8"] + ([] if args.skip_nvfp4 else ["emulated-nvfp4"])
    results: dict[str, dict] = {"bf16": {}}
    for backend in backends:
        results[backend] = {}
    explorers = {}
    for backend in backends:
        if time.perf_counter() - started > TIME_BUDGET_S:
            report.setdefault("skipped", []).append(f"{backend}: time budget")
            continue
        quantize_started = time.perf_counter()
        explorer = build_explorer(model, backend, FLUX_QUANT_SKIP, min_dim)
        explorer.requantize(model, adapter=None)
        synchronize(device)
        explorers[backend] = explorer
        results[backend]["quantized_layers"] = len(explorer.layer_names)
        results[backend]["requantize_seconds"] = round(time.perf_counter() - quantize_started, 2)
        results[backend]["memory_gib_after_requantize"] = memory_gib(device)
        if backend == "fp8":
            first = model.get_submodule(explorer.layer_names[0])
            probe = torch.zeros(1, first.in_features, device=device, dtype=dtype)
            results[backend]["real_fp8_gemm"] = _can_use_scaled_mm(probe, explorer._cached_weights[explorer.layer_names[0]][0])

    for batch in args.batches:
        latents, conditioning = inputs(model, batch, device, dtype)
        sigma = torch.full((batch,), 0.7, device=device)
        seconds, reference = timed_forward(forward, model, latents, sigma, conditioning, device, args.warmup, args.repeats)
        results["bf16"][f"batch_{batch}"] = {"seconds_per_forward": round(seconds, 4),
                                             "samples_per_second": round(batch / seconds, 3)}
        for backend, explorer in explorers.items():
            if time.perf_counter() - started > TIME_BUDGET_S:
                report.setdefault("skipped", []).append(f"{backend} batch {batch}: time budget")
                continue
            # Emulated NVFP4 runs fp32 GEMMs (a fidelity tool, not a fast path): time it briefly.
            warmup, repeats = (1, min(args.repeats, 2)) if backend == "emulated-nvfp4" else (args.warmup, args.repeats)
            with explorer.active(model):
                seconds_q, output = timed_forward(forward, model, latents, sigma, conditioning, device, warmup, repeats)
            results[backend][f"batch_{batch}"] = {
                "seconds_per_forward": round(seconds_q, 4), "samples_per_second": round(batch / seconds_q, 3),
                "speedup_vs_bf16": round(seconds / seconds_q, 3), **relative_error(output, reference)}
        if device.type == "cuda":
            report[f"peak_memory_gib_batch_{batch}"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    report["results"] = results
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    return report


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = main()
    text = json.dumps(result, indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "gpu_fp8_flux.json").write_text(text + "\n")
