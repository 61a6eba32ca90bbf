"""The one prepared GPU check (issue 12): is the explorer faster than BF16, and what does a real
iteration cost? Writes one JSON (default $OUT/gpu_check.json, else reports/benchmarks/gpu_check.json).

1. layers: per-layer microbenchmarks at FLUX.1-dev's real shapes (batch 24, 512 px: 1024 image +
   512 text tokens): BF16 F.linear, the fp8 explorer path (compiled quantize + _scaled_mm),
   bare _scaled_mm on a pre-quantized input, the emulated NVFP4 path (bf16 GEMM on decoded
   codes); the profiler's kernel names for one call of each, so the report shows what ran.
2. transformer: a FLUX.1-dev-size transformer (random weights, BF16) forward at batch 24, 512 px,
   full precision vs the fp8 explorer vs emulated NVFP4 (vs te-nvfp4 where it runs), with the
   peak memory of each.
3. iteration: one full Sol-RL iteration of a mid-size random FLUX-class model through the real
   stages (explore, rank, regenerate, update, requantize) with explore.backend=auto, with the
   seconds and peak memory of each stage.

    python benchmarks/gpu_check.py            # on the GPU machine, about 3-5 minutes on an H200
    python benchmarks/gpu_check.py --smoke    # tiny shapes, any machine, well under 2 minutes (CI)

Goals (issue 12, H200): fp8 explorer forward >= 1.5x BF16; emulated NVFP4 within 1.3x of BF16.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler's own chatter off stderr

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from solrl_core.ledger import write_json  # noqa: E402
from solrl_core.quant import nvfp4_linear  # noqa: E402
from solrl_core.quant.fp8 import FP8Tensor, fp8_matmul, quantize_activation, quantize_fp8  # noqa: E402

# FLUX.1-dev at batch 24, 512 px: (name, tokens M, in K, out N) of its quantized layers.
BATCH, IMAGE_TOKENS, TEXT_TOKENS = 24, 1024, 512
FLUX_LAYERS = [
    ("joint.attn.to_q (image)", BATCH * IMAGE_TOKENS, 3072, 3072),
    ("joint.ff.net.0.proj (image)", BATCH * IMAGE_TOKENS, 3072, 12288),
    ("joint.ff.net.2 (image)", BATCH * IMAGE_TOKENS, 12288, 3072),
    ("single.proj_mlp", BATCH * (IMAGE_TOKENS + TEXT_TOKENS), 3072, 12288),
    ("single.attn.to_q", BATCH * (IMAGE_TOKENS + TEXT_TOKENS), 3072, 3072),
    ("single.proj_out", BATCH * (IMAGE_TOKENS + TEXT_TOKENS), 15360, 3072),
]
SMOKE_LAYERS = [("tiny", 64, 64, 128), ("tiny-wide", 64, 128, 64)]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def milliseconds(function, device: torch.device, repeats: int, warmup: int = 2) -> float:
    """Median wall time of one call, ms (the GPU synchronised around each)."""
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        function()
        synchronize(device)
        times.append((time.perf_counter() - started) * 1e3)
    return round(statistics.median(times), 4)


def kernels_of(function, device: torch.device, limit: int = 8) -> list[str]:
    """Names of the kernels (CUDA) or ops (CPU) one call runs, by time spent."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        function()
        synchronize(device)
    events = [e for e in profiler.key_averages()
              if (e.device_type.name == "CUDA") == (device.type == "cuda") and not e.key.startswith("ProfilerStep")]
    attribute = "device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events.sort(key=lambda e: getattr(e, attribute, 0), reverse=True)
    return [e.key[:120] for e in events[:limit]]


# --- 1. layers ---------------------------------------------------------------------------------


def layer_paths(m: int, k: int, n: int, device: torch.device, dtype: torch.dtype) -> dict:
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, k, device=device, dtype=dtype, generator=generator)
    weight = torch.randn(n, k, device=device, generator=generator) / k**0.5
    bias = torch.zeros(n, device=device, dtype=dtype)
    w16 = weight.to(dtype)
    w8 = quantize_fp8(weight)
    w8 = FP8Tensor(w8.data.contiguous(), w8.scale)
    x8 = quantize_activation(x)
    packed = nvfp4_linear.pack_weight(weight, bias, dtype)
    from solrl_core.quant.implementations import EmulatedNVFP4

    nvfp4 = EmulatedNVFP4()
    paths = {
        "bf16_linear": lambda: F.linear(x, w16, bias),
        "fp8_explorer": lambda: fp8_matmul(quantize_activation(x), w8, bias, dtype),
        "fp8_prequantized_scaled_mm": lambda: fp8_matmul(x8, w8, bias, dtype),
        "nvfp4_emulated": lambda: nvfp4.matmul(nvfp4.quantize_activation(x), packed, x),
    }
    return paths


def check_layers(device: torch.device, dtype: torch.dtype, shapes, repeats: int) -> list[dict]:
    results = []
    for name, m, k, n in shapes:
        paths = layer_paths(m, k, n, device, dtype)
        record = {"layer": name, "M": m, "K": k, "N": n, "ms": {}, "tflops": {}, "kernels": {}}
        for path, function in paths.items():
            record["ms"][path] = milliseconds(function, device, repeats)
            record["tflops"][path] = round(2 * m * k * n / (record["ms"][path] * 1e-3) / 1e12, 1)
            record["kernels"][path] = kernels_of(function, device)
        record["speedup_vs_bf16"] = {p: round(record["ms"]["bf16_linear"] / v, 3) for p, v in record["ms"].items()}
        results.append(record)
        del paths
    return results


# --- 2. transformer ----------------------------------------------------------------------------


def random_flux(config: dict, device: torch.device, dtype: torch.dtype):
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        model = FluxTransformer2DModel(**config)
    model = model.to_empty(device=device)
    if dtype != torch.float32:
        model = model.to(dtype)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02, generator=generator)
    return model.eval().requires_grad_(False)


def flux_inputs(config: dict, batch: int, image_tokens: int, text_tokens: int, device, dtype) -> dict:
    generator = torch.Generator(device=device).manual_seed(1)
    side = int(image_tokens**0.5)
    from solrl_core.models.flux import image_token_ids

    inputs = dict(
        hidden_states=torch.randn(batch, image_tokens, config["in_channels"], device=device, dtype=dtype, generator=generator),
        encoder_hidden_states=torch.randn(batch, text_tokens, config["joint_attention_dim"], device=device, dtype=dtype,
                                          generator=generator),
        pooled_projections=torch.randn(batch, config["pooled_projection_dim"], device=device, dtype=dtype, generator=generator),
        timestep=torch.full((batch,), 0.5, device=device, dtype=dtype),
        img_ids=image_token_ids(side, side).to(device, dtype), txt_ids=torch.zeros(text_tokens, 3, device=device, dtype=dtype),
        return_dict=False)
    if config.get("guidance_embeds"):
        inputs["guidance"] = torch.ones(batch, device=device)
    return inputs


def peak_gib(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def check_transformer(device, dtype, config: dict, batch: int, image_tokens: int, text_tokens: int, repeats: int) -> dict:
    from solrl_core.presets import FLUX_QUANT_SKIP
    from solrl_core.quant.backends import unavailable_reason
    from solrl_core.quant.explorer import build_explorer

    model = random_flux(config, device, dtype)
    inputs = flux_inputs(config, batch, image_tokens, text_tokens, device, dtype)
    forward = lambda: model(**inputs)  # noqa: E731
    report = {"config": {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}, "batch": batch,
              "image_tokens": image_tokens, "text_tokens": text_tokens, "ms": {}, "peak_gib": {}, "quantized": {}}
    with torch.no_grad():
        reset_peak(device)
        report["ms"]["bf16"] = milliseconds(forward, device, repeats, warmup=1)
        report["peak_gib"]["bf16"] = peak_gib(device)
        reference = forward()[0].float()
        for backend in ("fp8", "emulated-nvfp4", "te-nvfp4"):
            if unavailable_reason(backend, device) is not None:
                report["ms"][backend] = None
                continue
            reset_peak(device)
            explorer = build_explorer(model, backend, FLUX_QUANT_SKIP, 1000 if not _smoke else 0)
            explorer.requantize(model, adapter=None)
            report["quantized"][backend] = explorer.describe(model)
            with explorer.active(model):
                report["ms"][backend] = milliseconds(forward, device, repeats, warmup=1)
                out = forward()[0].float()
            report["peak_gib"][backend] = peak_gib(device)
            report.setdefault("relative_error_vs_bf16", {})[backend] = round(
                ((out - reference).norm() / reference.norm()).item(), 5)
            del explorer
    report["speedup_vs_bf16"] = {b: (round(report["ms"]["bf16"] / v, 3) if v else None) for b, v in report["ms"].items()}
    del model
    reset_peak(device)
    return report


# --- 3. one Sol-RL iteration -------------------------------------------------------------------


def check_iteration(arch_kwargs: dict, overrides: list[tuple[str, object]]) -> dict:
    from solrl_core import stages
    from solrl_core.models.shapes_tiny import ShapesTextEncoder, TinyArchitecture, build_transformer, save_checkpoint
    from solrl_core.presets import resolve_config

    arch = TinyArchitecture(**arch_kwargs)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder) / "mid-flux.safetensors"
        save_checkpoint(checkpoint, arch, build_transformer(arch), ShapesTextEncoder(arch), {"random": True})
        config = resolve_config("shapes-tiny", "sol_rl", [("model.path", str(checkpoint)), ("explore.backend", "auto"),
                                                          ("progress", False), *overrides])
        state = stages.initial_state(config)
    device = state.policy.device
    report = {"architecture": arch_kwargs, "device": str(device), "dtype": str(state.policy.dtype),
              "parameters": sum(p.numel() for p in state.policy.transformer.parameters()),
              "seconds": {}, "peak_gib": {}}

    def stage(name, function, *args):
        reset_peak(device)
        synchronize(device)
        started = time.perf_counter()
        result = function(*args)
        synchronize(device)
        report["seconds"][name] = round(time.perf_counter() - started, 3)
        report["peak_gib"][name] = peak_gib(device)
        return result

    report["quantize"] = {k: v for k, v in stage("quantize", stages.quantize, state).items() if k != "seconds"}
    drafts = stage("explore", stages.explore, state, 0)
    selection = stage("rank", stages.rank, drafts, config)
    rollout = stage("regenerate", stages.regenerate, state, drafts, selection)
    update = stage("update", stages.update, state, rollout, 0)
    stage("requantize", stages.requantize, state)
    report["loss"] = update.loss
    report["pool"], report["keep"], report["prompts"] = config.pool, config.keep, config.prompts_per_iteration
    return report


# --- the check ---------------------------------------------------------------------------------

_smoke = False


def environment(device: torch.device) -> dict:
    record = {"torch": torch.__version__, "python": platform.python_version(), "device": str(device)}
    if device.type == "cuda":
        record.update(gpu=torch.cuda.get_device_name(device), capability=list(torch.cuda.get_device_capability(device)))
    return record


def run_check(smoke: bool) -> dict:
    global _smoke
    _smoke = smoke
    device = torch.device("cuda" if torch.cuda.is_available() and not smoke else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    from solrl_core.models.memory import FLUX_DEV_CONFIG
    from solrl_core.quant.backends import resolve_backend

    started = time.perf_counter()
    report = {"smoke": smoke, "environment": environment(device), "auto_backend": resolve_backend("auto", device)}
    if smoke:
        report["layers"] = check_layers(device, dtype, SMOKE_LAYERS, repeats=2)
        tiny = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                    num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
                    axes_dims_rope=(4, 6, 6))
        report["transformer"] = check_transformer(device, dtype, tiny, 2, 16, 8, repeats=1)
        report["iteration"] = check_iteration(dict(num_layers=1, num_single_layers=1), [
            ("pool", 4), ("keep", 2), ("prompts_per_iteration", 1), ("explore.steps", 2), ("regenerate.steps", 2),
            ("train.micro_batch", 2), ("model.device", "cpu")])
    else:
        report["layers"] = check_layers(device, dtype, FLUX_LAYERS, repeats=10)
        report["transformer"] = check_transformer(device, dtype, dict(FLUX_DEV_CONFIG), BATCH, IMAGE_TOKENS, TEXT_TOKENS,
                                                  repeats=3)
        # Mid-size: 1024 wide (16 heads x 64), 4 + 8 blocks, 1024 image tokens; the paper's pool and keep.
        report["iteration"] = check_iteration(
            dict(image_size=128, patch=4, num_layers=4, num_single_layers=8, attention_head_dim=64,
                 num_attention_heads=16, text_dim=256, text_heads=4), [
                ("pool", 96), ("keep", 24), ("prompts_per_iteration", 2), ("explore.chunk", 48),
                ("regenerate.chunk", 24), ("train.micro_batch", 8)])
    report["seconds"] = round(time.perf_counter() - started, 1)
    return report


def default_out() -> Path:
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "gpu_check.json"
    return Path(__file__).resolve().parent.parent / "reports" / "benchmarks" / "gpu_check.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (CI)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = run_check(args.smoke)
    out = args.out or default_out()
    write_json(out, report)
    print(json.dumps({"out": str(out), "seconds": report["seconds"],
                      "transformer_speedup_vs_bf16": report["transformer"]["speedup_vs_bf16"],
                      "iteration_seconds": report["iteration"]["seconds"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
