"""The one prepared GPU check (issues 12, 42): is the explorer faster than BF16, and what does a
real iteration cost? One call on a lent GPU; every section runs isolated and the JSON (default
$OUT/gpu_check.json, else reports/benchmarks/gpu_check.json) is rewritten after each.

Sections (benchmarks/_check_harness.py runs them):
1. layers_flux / layers_sana / layers_sd3: every distinct quantized GEMM shape of FLUX.1-dev, SANA
   1.6B and SD3.5-Large (taken from the models built on the meta device with their presets' quant
   settings) at batch 24 x 1024 tokens: BF16 F.linear; the FP8 GEMM alone (torch._scaled_mm on a
   pre-quantized input, bf16 output, fused bias, fast accumulation); the FP8 layer (compiled
   quantize + the GEMM), per tensor and row-wise; the emulated NVFP4 GPU path (compiled decode,
   bf16 GEMM); each GEMM checked against its CPU emulation, and the kernels one call ran.
2. transformer: FLUX.1-dev (random weights of its real shapes) forward at batch 24, 512 px, BF16
   against the fp8 explorer and emulated NVFP4 (te-nvfp4 where it runs), every variant compiled
   the same way (each transformer block compiled, diffusers' regional compilation), with the
   relative error and peak memory of each.
3. iteration: one whole Sol-RL iteration (solrl_core.stages: quantize, explore, rank, regenerate,
   update, requantize) of a mid-size random FLUX-class model, explore.backend=auto, the seconds
   and peak memory of each stage.

Goals, each printed with a verdict (GOALS below): BF16 linear >= 300 dense TFLOP/s on every FLUX
shape; FP8 GEMM alone and FP8 layer >= 1.5x BF16 on every FLUX shape; emulated NVFP4 layer within
1.3x of BF16; FP8 transformer forward >= 1.5x the equally compiled BF16 one; FP8 relative error
below emulated NVFP4's; peak memory under 90% of the GPU's; all six iteration stages complete.

    python benchmarks/gpu_check.py              # on the GPU machine; fits 8 minutes on one H100
    python benchmarks/gpu_check.py --rehearse   # the same sections and architectures on the CPU, reduced
                                                # only in depth, batch and tokens (CI; no verdicts judged)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler's own chatter off stderr

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _check_harness as harness  # noqa: E402
from solrl_core.quant.gpu_path import compile_toolchain_problem  # noqa: E402
from solrl_core.quant.te_nvfp4 import TE_TOKEN_MULTIPLE  # noqa: E402

# --- the GPU run's architectures, each stated once --------------------------------------------

# SANA 1600M at 1024 px (Efficient-Large-Model/Sana_1600M_1024px_diffusers, transformer/config.json).
SANA_1600M_CONFIG = dict(in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32, num_layers=20,
                         num_cross_attention_heads=20, cross_attention_head_dim=112, cross_attention_dim=2240,
                         caption_channels=2304, mlp_ratio=2.5, sample_size=32, patch_size=1)
# SD3.5-Large (stabilityai/stable-diffusion-3.5-large, transformer/config.json).
SD35_LARGE_CONFIG = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=38, attention_head_dim=64,
                         num_attention_heads=38, joint_attention_dim=4096, caption_projection_dim=2432,
                         pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192, qk_norm="rms_norm")
# The mid-size iteration model: 1024 wide (16 heads x 64), 4 + 8 blocks, 1024 image tokens.
MID_SIZE = dict(image_size=128, patch=4, num_layers=4, num_single_layers=8, attention_head_dim=64,
                num_attention_heads=16, text_dim=256, text_heads=4)
# Each model's diffusers class, its preset (quant settings) and the config keys of its depth.
MODELS = {
    "flux": ("FluxTransformer2DModel", ("num_layers", "num_single_layers")),
    "sana": ("SanaTransformer2DModel", ("num_layers",)),
    "sd3": ("SD3Transformer2DModel", ("num_layers",)),
}


def flux_dev_config() -> dict:
    """FLUX.1-dev's transformer config with its RoPE axes derived from its head dim (the function
    that builds every FLUX-class model here; it must give FLUX.1-dev's own (16, 56, 56))."""
    from solrl_core.models.memory import FLUX_DEV_CONFIG
    from solrl_core.models.shapes_tiny import rope_axes

    return {**FLUX_DEV_CONFIG, "axes_dims_rope": rope_axes(FLUX_DEV_CONFIG["attention_head_dim"])}


def model_config(model: str) -> dict:
    return {"flux": flux_dev_config, "sana": lambda: dict(SANA_1600M_CONFIG), "sd3": lambda: dict(SD35_LARGE_CONFIG)}[model]()


def with_depth(model: str, config: dict, depth: int | None) -> dict:
    """``config`` with every block stack cut to ``depth`` blocks (None: as it is)."""
    return config if depth is None else {**config, **{key: depth for key in MODELS[model][1]}}


@dataclass(frozen=True)
class Scale:
    """What a run reduces: depth, batch and tokens, never a width."""

    name: str
    layer_tokens: int  # M of the layer GEMMs
    repeats: int  # timed calls (layers: 0 times the one profiled call)
    warmup: int
    depth: int | None  # blocks per stack of the FLUX.1-dev transformer (None: its real 19 + 38)
    batch: int
    image_side: int  # latent tokens per side: 32 at 512 px
    text_tokens: int
    # Explorer backends the transformer section compares with BF16 (one it cannot run is reported so).
    transformer_backends: tuple[str, ...]
    iteration_architecture: dict
    iteration_settings: tuple[tuple[str, object], ...]


GPU = Scale("gpu", layer_tokens=24 * 1024, repeats=10, warmup=2, depth=None, batch=24, image_side=32, text_tokens=512,
            transformer_backends=("fp8", "emulated-nvfp4", "te-nvfp4"), iteration_architecture=MID_SIZE,
            iteration_settings=(("pool", 96), ("keep", 24), ("prompts_per_iteration", 2), ("explore.chunk", 48),
                                ("regenerate.chunk", 24), ("train.micro_batch", 8)))
# Token counts stay multiples of 16 (TE's NVFP4 rule, and _scaled_mm's alignment). On a CPU the
# emulated-NVFP4 explorer takes its fp32 CPU branch, not the GPU's (whose kernels layers_* run), and
# costs a minute at FLUX.1-dev's widths, so the rehearsal's transformer compares fp8 (the GPU's
# _scaled_mm branch) only; a rehearsal runs each timed call once, without warm-up.
REHEARSAL = Scale("rehearsal", layer_tokens=16, repeats=0, warmup=0, depth=1, batch=1, image_side=4, text_tokens=8,
                  transformer_backends=("fp8", "te-nvfp4"),
                  iteration_architecture={**MID_SIZE, "image_size": 32, "num_layers": 1, "num_single_layers": 1},
                  iteration_settings=(("pool", 4), ("keep", 2), ("prompts_per_iteration", 1), ("explore.steps", 2),
                                      ("regenerate.steps", 2), ("train.micro_batch", 2), ("model.device", "cpu"),
                                      ("model.dtype", "bfloat16")))


# --- timing ------------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(function, device: torch.device, repeats: int, warmup: int = 2) -> tuple[float, object]:
    """Median wall time of one call, ms (the GPU synchronised around each), and the last output."""
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        output = function()
        synchronize(device)
        times.append((time.perf_counter() - started) * 1e3)
    return round(statistics.median(times), 4), output


def milliseconds(function, device: torch.device, repeats: int, warmup: int = 2) -> float:
    return timed(function, device, repeats, warmup)[0]


def kernels_of(function, device: torch.device, limit: int = 8) -> tuple[list[str], object]:
    """Names of the kernels (CUDA) or ops (CPU) one call runs, by time spent, and its output."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        output = function()
        synchronize(device)
    events = [e for e in profiler.key_averages()
              if (e.device_type.name == "CUDA") == (device.type == "cuda") and not e.key.startswith("ProfilerStep")]
    attribute = "device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events.sort(key=lambda e: getattr(e, attribute, 0), reverse=True)
    return [e.key[:120] for e in events[:limit]], output


def peak_gib(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    reference = reference.float()
    return round(((out.float() - reference).norm() / reference.norm().clamp_min(1e-30)).item(), 6)


# --- 1. layers ---------------------------------------------------------------------------------


def meta_model(model: str, depth: int | None):
    """The model's transformer on the meta device (no memory)."""
    import diffusers

    class_name, _ = MODELS[model]
    with torch.device("meta"):
        return getattr(diffusers, class_name)(**with_depth(model, model_config(model), depth))


def quantized_shapes(model: str) -> list[dict]:
    """Each distinct (in, out) of the layers the model's preset quantizes, with one layer that has
    it. Two blocks per stack suffice: every block of a stack has the same layers."""
    from solrl_core.models.registry import MODELS as PRESETS
    from solrl_core.quant.explorer import layer_features, quantizable_layers, select_quantized_layers

    transformer = meta_model(model, depth=2)
    quant = PRESETS[model].preset.settings["quant"]
    layers = dict(quantizable_layers(transformer))
    shapes: dict[tuple[int, int], str] = {}
    for name in select_quantized_layers(transformer, quant["skip"], quant["min_dim"], quant.get("fused", ())):
        shapes.setdefault(layer_features(layers[name]), name)
    return [{"layer": name, "K": k, "N": n} for (k, n), name in shapes.items()]


def fp8_weight(weight: torch.Tensor, rowwise: bool):
    """``weight`` quantized as the explorer caches it: contiguous E4M3 [out, in] and its scale."""
    from solrl_core.quant.fp8 import FP8Tensor, quantize_fp8

    quantized = quantize_fp8(weight, rowwise)
    return FP8Tensor(quantized.data.contiguous(), quantized.scale)


def random_nvfp4_weight(n: int, k: int, device, generator, dtype):
    """Packed NVFP4 [n, k] of random codes and block scales: valid NVFP4 weights at a fraction of
    the cost of quantizing a dense one (which the transformer and iteration sections do)."""
    from solrl_core.quant.nvfp4 import BLOCK_SIZE
    from solrl_core.quant.nvfp4_linear import NVFP4Weight

    codes = torch.randint(0, 256, (n, k // 2), device=device, dtype=torch.uint8, generator=generator)
    block_scales = (torch.rand(n, k // BLOCK_SIZE, device=device, generator=generator) + 0.5).to(torch.float8_e4m3fn)
    return NVFP4Weight(codes, block_scales, torch.tensor(1.0 / (6 * k**0.5), device=device),
                       torch.zeros(n, device=device, dtype=dtype), k)


def nvfp4_gpu_path(x: torch.Tensor, weight) -> torch.Tensor:
    """The emulated-NVFP4 explorer's CUDA branch (EmulatedNVFP4.matmul): compiled activation
    quantization and weight decode, one bf16 GEMM accumulated in fp32."""
    from solrl_core.quant import nvfp4_linear as kernels

    x_values, x_scale = kernels._compiled(kernels.quantize_activation_scaled)(kernels._pad_to_blocks(x))
    w_values = kernels._compiled(kernels.decode_scaled_codes)(weight.codes, weight.block_scales)
    return kernels.factored_linear(x_values, x_scale, w_values, weight.tensor_scale, weight.bias.float())


def layer_paths(m: int, k: int, n: int, device: torch.device, dtype: torch.dtype) -> tuple[dict, dict]:
    """The callables timed for one shape, and for some of them what their output must agree with
    (the CPU emulation of the same quantized operands).
    The FP8 calls go to torch._scaled_mm itself (the GPU branch of solrl_core.quant.fp8), so a
    CPU rehearsal meets the GEMM's layout, scale-shape and bias rules too."""
    from solrl_core.quant import fp8, nvfp4_linear
    from solrl_core.quant.nvfp4 import fake_quantize_nvfp4

    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, k, device=device, dtype=dtype, generator=generator)
    weight = torch.randn(n, k, device=device, generator=generator) / k**0.5
    w16, w8, w8_rows = weight.to(dtype), fp8_weight(weight, rowwise=False), fp8_weight(weight, rowwise=True)
    del weight
    bias = torch.randn(n, device=device, dtype=dtype, generator=generator) * 0.01
    w4 = random_nvfp4_weight(n, k, device, generator, dtype)
    quantize = fp8._compiled_quantize()  # the compiled quantizer (eager after a failed toolchain probe)
    x8 = quantize(x, False)
    gemm = partial(fp8._scaled_mm, out_dtype=dtype, fast_accum=True)
    paths = {
        "bf16_linear": lambda: F.linear(x, w16, bias),
        "fp8_gemm": lambda: gemm(x8, w8, bias),
        "fp8_layer": lambda: gemm(quantize(x, False), w8, bias),
        "fp8_rowwise_layer": lambda: gemm(quantize(x, True), w8_rows, bias),
        "nvfp4_emulated_layer": lambda: nvfp4_gpu_path(x, w4),
    }
    emulations = {
        "fp8_gemm": lambda: fp8._emulated(x8, w8, bias, torch.float32),
        "fp8_rowwise_layer": lambda: fp8._emulated(quantize(x, True), w8_rows, bias, torch.float32),
        "nvfp4_emulated_layer": lambda: F.linear(fake_quantize_nvfp4(x.float()),
                                                 nvfp4_linear.dequantize_nvfp4(nvfp4_linear._as_packed(w4)), w4.bias.float()),
    }
    return paths, emulations


def check_layers(model: str, scale: Scale, device: torch.device, dtype: torch.dtype) -> dict:
    records = []
    for shape in quantized_shapes(model):
        m, k, n = scale.layer_tokens, shape["K"], shape["N"]
        paths, emulations = layer_paths(m, k, n, device, dtype)
        record = {**shape, "M": m, "ms": {}, "tflops": {}, "kernels": {}, "relative_error_vs_emulation": {}}
        for path, function in paths.items():
            started = time.perf_counter()
            record["kernels"][path], output = kernels_of(function, device)
            profiled_ms = (time.perf_counter() - started) * 1e3
            # A rehearsal (repeats 0) times the profiled call itself: one call per path at real widths.
            record["ms"][path] = milliseconds(function, device, scale.repeats, scale.warmup) if scale.repeats \
                else round(profiled_ms, 4)
            record["tflops"][path] = round(2 * m * k * n / (record["ms"][path] * 1e-3) / 1e12, 3)
            if path in emulations:
                record["relative_error_vs_emulation"][path] = relative_error(output, emulations[path]())
        record["speedup_vs_bf16"] = {p: round(record["ms"]["bf16_linear"] / v, 3) for p, v in record["ms"].items()}
        records.append(record)
        del paths
    return {"model": model, "layers": records}


# --- 2. transformer ----------------------------------------------------------------------------


def random_flux(config: dict, device: torch.device, dtype: torch.dtype):
    """A FLUX transformer of ``config`` with random weights, built without a CPU copy."""
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        model = FluxTransformer2DModel(**config)
    model = model.to_empty(device=device).to(dtype)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02, generator=generator)
    return model.eval().requires_grad_(False)


def flux_inputs(config: dict, scale: Scale, device, dtype) -> dict:
    from solrl_core.models.flux import image_token_ids

    generator = torch.Generator(device=device).manual_seed(1)
    batch, tokens = scale.batch, scale.image_side**2

    def noise(*shape):
        return torch.randn(*shape, device=device, dtype=dtype, generator=generator)

    inputs = dict(hidden_states=noise(batch, tokens, config["in_channels"]),
                  encoder_hidden_states=noise(batch, scale.text_tokens, config["joint_attention_dim"]),
                  pooled_projections=noise(batch, config["pooled_projection_dim"]),
                  timestep=torch.full((batch,), 0.5, device=device, dtype=dtype),
                  img_ids=image_token_ids(scale.image_side, scale.image_side).to(device, dtype),
                  txt_ids=torch.zeros(scale.text_tokens, 3, device=device, dtype=dtype), return_dict=False)
    if config.get("guidance_embeds"):
        inputs["guidance"] = torch.ones(batch, device=device, dtype=dtype)
    return inputs


def compile_blocks(model, compile_problem: str | None) -> bool:
    """Compile each transformer block in place as a run's model.compile=blocks does (one graph per
    block kind, names and explorer layers unchanged), so BF16 and every explorer variant run the
    same compiled blocks and their speeds compare fairly. False: the toolchain cannot compile, all
    run eager."""
    from solrl_core.models.compilation import compile_transformer
    from solrl_core.models.registry import MODELS

    if compile_problem is not None:
        return False
    return compile_transformer(model, "blocks", MODELS["flux"].repeated_blocks, next(model.parameters()).device) > 0


def uncompile_blocks(model) -> None:
    from solrl_core.models.compilation import uncompile_transformer

    uncompile_transformer(model)


def timed_variant(forward, device, scale: Scale, reference: torch.Tensor | None, mode: str) -> tuple[dict, torch.Tensor]:
    reset_peak(device)
    ms, out = timed(forward, device, max(scale.repeats, 1), scale.warmup)
    record = {"ms": ms, "mode": mode, "peak_gib": peak_gib(device)}
    if reference is not None:
        record["relative_error_vs_bf16"] = relative_error(out[0], reference)
    return record, out[0]


def explorer_variant(model, backend: str, forward, device, scale: Scale, reference, mode: str) -> dict:
    from solrl_core.presets import FLUX_QUANT_SKIP
    from solrl_core.quant.explorer import build_explorer

    explorer = build_explorer(model, backend, FLUX_QUANT_SKIP, 1000)
    explorer.requantize(model, adapter=None)
    with explorer.active(model):
        record, _ = timed_variant(forward, device, scale, reference, mode)
    record["quantized"] = explorer.describe(model)
    return record


def check_transformer(scale: Scale, device: torch.device, dtype: torch.dtype, compile_problem: str | None) -> dict:
    """BF16 against each explorer backend, all compiled per block; a variant whose compilation
    fails is measured eager against an eager BF16 forward, and says so."""
    from solrl_core.quant.backends import unavailable_reason

    config = with_depth("flux", flux_dev_config(), scale.depth)
    model = random_flux(config, device, dtype)
    inputs = flux_inputs(config, scale, device, dtype)
    compiled = compile_blocks(model, compile_problem)
    mode = "compiled per block" if compiled else "eager (compile unavailable, slower)"
    report = {"config": {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}, "batch": scale.batch,
              "image_tokens": scale.image_side**2, "text_tokens": scale.text_tokens, "variants": {}, "bf16": {}}
    forward = lambda: model(**inputs)  # noqa: E731
    with torch.no_grad():
        report["bf16"][mode], reference = timed_variant(forward, device, scale, None, mode)
        for backend in scale.transformer_backends:
            reason = unavailable_reason(backend, device)
            if reason is not None:
                report["variants"][backend] = {"skipped": reason}
                continue
            try:
                report["variants"][backend] = explorer_variant(model, backend, forward, device, scale, reference, mode)
            except Exception as error:  # noqa: BLE001 - only a compiled variant gets a second, eager try
                if not compiled:
                    raise
                report["variants"][backend] = eager_retry(model, backend, forward, device, scale, reference, report, error)
    report["speedup_vs_bf16"] = {name: round(report["bf16"][v["mode"]]["ms"] / v["ms"], 3)
                                 for name, v in report["variants"].items() if "ms" in v}
    del model
    reset_peak(device)
    return report


def eager_retry(model, backend, forward, device, scale, reference, report, error) -> dict:
    """``backend`` again with every block eager, against an eager BF16 forward (measured once)."""
    eager = "eager (compile failed, slower)"
    uncompile_blocks(model)
    try:
        if eager not in report["bf16"]:
            report["bf16"][eager], _ = timed_variant(forward, device, scale, None, eager)
        record = explorer_variant(model, backend, forward, device, scale, reference, eager)
    finally:
        compile_blocks(model, None)
    record["compile_error"] = f"{type(error).__name__}: {error}"[:500]
    return record


# --- 3. one Sol-RL iteration -------------------------------------------------------------------


def check_iteration(scale: Scale, backend: str) -> dict:
    from solrl_core import stages
    from solrl_core.models.shapes_tiny import ShapesTextEncoder, TinyArchitecture, build_transformer, save_checkpoint
    from solrl_core.presets import resolve_config

    arch = TinyArchitecture(**scale.iteration_architecture)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder) / "mid-flux.safetensors"
        save_checkpoint(checkpoint, arch, build_transformer(arch), ShapesTextEncoder(arch), {"random": True})
        config = resolve_config("shapes-tiny", "sol_rl", [("model.path", str(checkpoint)), ("explore.backend", backend),
                                                          ("progress", False), *scale.iteration_settings])
        state = stages.initial_state(config)
    device = state.policy.device
    report = {"architecture": asdict(arch), "device": str(device), "dtype": str(state.policy.dtype),
              "parameters": sum(p.numel() for p in state.policy.transformer.parameters()), "seconds": {}, "peak_gib": {}}

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


# --- constraints checked before the first kernel ------------------------------------------------

# Tokens per sample of each model's GEMMs at its preset resolution: (stream, tokens).
MODEL_TOKENS = {"flux": (("image", 1024), ("text", 512)), "sana": (("image", 1024), ("caption", 300)),
                "sd3": (("image", 4096), ("text", 333))}
H100_CAPABILITY = (9, 0)


def te_token_rule(batch: int) -> dict:
    """For each model stream, whether batch x tokens meets TE's rule, and the smallest batch that does."""
    import math

    rule = {}
    for model, streams in MODEL_TOKENS.items():
        for stream, tokens in streams:
            smallest = TE_TOKEN_MULTIPLE // math.gcd(tokens, TE_TOKEN_MULTIPLE)
            rule[f"{model}.{stream}"] = {"tokens": tokens, "ok": batch * tokens % TE_TOKEN_MULTIPLE == 0,
                                         "batch_multiple": smallest}
    return rule


def explorer_target(device: torch.device) -> str:
    """The backend the iteration explores with: auto on the GPU; on a CPU rehearsal, what auto picks
    on an H100 (the GPU path, with _scaled_mm taking the CPU's float8 inputs)."""
    from solrl_core.quant.backends import auto_choice, resolve_backend

    if device.type == "cuda":
        return resolve_backend("auto", device)
    return auto_choice(H100_CAPABILITY, transformer_engine=False)


# --- verdicts ----------------------------------------------------------------------------------


def _section(report: dict, name: str) -> dict | None:
    record = report["sections"].get(name)
    return record["result"] if record and record["status"] == "ok" else None


def _flux_layers(report: dict) -> list[dict] | None:
    result = _section(report, "layers_flux")
    return None if result is None else result["layers"]


def _min_over_layers(key: str, path: str):
    def measure(report):
        layers = _flux_layers(report)
        return None if layers is None else min(layer[key][path] for layer in layers)
    return measure


def _transformer_speedup(backend: str):
    def measure(report):
        result = _section(report, "transformer")
        return None if result is None else result["speedup_vs_bf16"].get(backend)
    return measure


def _error_gap(report):
    result = _section(report, "transformer")
    if result is None:
        return None
    errors = {name: v.get("relative_error_vs_bf16") for name, v in result["variants"].items()}
    return None if errors.get("fp8") is None or errors.get("emulated-nvfp4") is None else \
        round(errors["fp8"] / max(errors["emulated-nvfp4"], 1e-30), 4)


def _peak_share(report):
    result, memory = _section(report, "transformer"), report["environment"].get("gpu_memory_gib")
    variants = [*(result or {}).get("bf16", {}).values(), *(result or {}).get("variants", {}).values()]
    peaks = [v["peak_gib"] for v in variants if v.get("peak_gib") is not None]
    return round(max(peaks) / memory, 3) if peaks and memory else None


def _stages_done(report):
    result = _section(report, "iteration")
    return None if result is None else len(result["seconds"])


# (goal, what is measured, the measurement, the test it must pass)
GOALS = [
    ("bf16 sanity", "min BF16 linear TFLOP/s over FLUX shapes", _min_over_layers("tflops", "bf16_linear"),
     lambda v: v >= 300),
    ("fp8 gemm", "min FP8 GEMM alone speed-up over FLUX shapes", _min_over_layers("speedup_vs_bf16", "fp8_gemm"),
     lambda v: v >= 1.5),
    ("fp8 layer", "min FP8 layer (quantize + GEMM) speed-up over FLUX shapes",
     _min_over_layers("speedup_vs_bf16", "fp8_layer"), lambda v: v >= 1.5),
    ("nvfp4 emulated layer", "min emulated NVFP4 layer speed-up over FLUX shapes",
     _min_over_layers("speedup_vs_bf16", "nvfp4_emulated_layer"), lambda v: v >= 1 / 1.3),
    ("fp8 transformer", "FLUX.1-dev forward speed-up, fp8 explorer vs BF16, compiled alike",
     _transformer_speedup("fp8"), lambda v: v >= 1.5),
    ("fp8 error", "fp8 relative error / emulated NVFP4's (FLUX.1-dev forward)", _error_gap, lambda v: v < 1),
    ("peak memory", "largest transformer peak / GPU memory", _peak_share, lambda v: v < 0.9),
    ("iteration", "Sol-RL stages completed (of 6)", _stages_done, lambda v: v == 6),
]


def verdicts(report: dict, judged: bool) -> list[dict]:
    """One verdict per goal. A rehearsal measures CPU speeds, which say nothing about the GPU, so
    it never passes or fails a goal; a goal whose section failed says so."""
    records = []
    for goal, measured, measure, test in GOALS:
        value = measure(report)
        if value is None:
            verdict = "not measured (its section failed, or this scale does not run it)"
        elif not judged:
            verdict = "rehearsal: not judged"
        else:
            verdict = "pass" if test(value) else "FAIL"
        records.append({"goal": goal, "measured": measured, "value": value, "verdict": verdict})
    return records


# --- the check ---------------------------------------------------------------------------------


def sections(scale: Scale, device: torch.device, dtype: torch.dtype, compile_problem: str | None) -> list:
    """(name, function) of every section, in order; the same list on the GPU and in the rehearsal."""
    return [
        *[(f"layers_{model}", partial(check_layers, model, scale, device, dtype)) for model in MODELS],
        ("transformer", partial(check_transformer, scale, device, dtype, compile_problem)),
        ("iteration", partial(check_iteration, scale, explorer_target(device))),
    ]


def default_out() -> Path:
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "gpu_check.json"
    return Path(__file__).resolve().parent.parent / "reports" / "benchmarks" / "gpu_check.json"


def refuse_if_missing(record: dict) -> str | None:
    missing = harness.missing_required(record)
    if not missing:
        return None
    return (f"gpu_check: cannot start: missing required package(s) {', '.join(missing)}; install them "
            "(pip install -e . from the repository, or the wheels brought for an offline machine)")


def run_check(rehearse: bool, out: Path, echo=print) -> int:
    from solrl_core.ledger import write_json

    device = torch.device("cuda" if torch.cuda.is_available() and not rehearse else "cpu")
    dtype = torch.bfloat16  # the GPU's dtype, also in the rehearsal: torch runs bf16 on the CPU
    scale = REHEARSAL if rehearse else GPU
    environment = harness.environment(device)
    echo(harness.environment_line(environment))
    refusal = refuse_if_missing(environment)
    if refusal:
        echo(refusal)
        return 2
    # solrl_core's own probe, asked once before the first kernel: where it finds a problem, the
    # quantizers and model.compile run eager by themselves (with its one warning line).
    compile_problem = compile_toolchain_problem(device.type)
    started = time.perf_counter()
    report = {"mode": scale.name, "environment": environment, "compile_problem": compile_problem,
              "explorer_target": explorer_target(device), "te_token_rule": te_token_rule(scale.batch),
              "scale": asdict(scale)}
    te_misfits = [f"{stream} ({r['tokens']} tokens: batch a multiple of {r['batch_multiple']})"
                  for stream, r in report["te_token_rule"].items() if not r["ok"]]
    if te_misfits and environment["transformer-engine"]:
        echo(f"te-nvfp4 pads batch x tokens to a multiple of {TE_TOKEN_MULTIPLE}; batch {scale.batch} pads "
             + ", ".join(te_misfits))
    save = partial(write_json, out)
    save(report)
    # On the CPU, solrl_core's FP8 matmul takes the GPU's _scaled_mm branch in the explorer too.
    routing = harness.scaled_mm_routing_on_cpu() if rehearse else _nothing()
    with warnings.catch_warnings(), routing:
        warnings.simplefilter("ignore")
        harness.run_sections(sections(scale, device, dtype, compile_problem), report, save, echo)
    report["verdicts"] = verdicts(report, judged=not rehearse)
    report["seconds"] = round(time.perf_counter() - started, 1)
    save(report)
    for record in report["verdicts"]:
        echo(f"goal {record['goal']}: {record['verdict']} ({record['measured']}: {record['value']})")
    failed = [name for name, record in report["sections"].items() if record["status"] != "ok"]
    echo(json.dumps({"out": str(out), "seconds": report["seconds"], "failed_sections": failed}))
    return 1 if failed else 0


def _nothing():
    from contextlib import nullcontext

    return nullcontext()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rehearse", action="store_true",
                        help="every section on the CPU, the GPU run's architectures reduced in depth, batch and tokens")
    parser.add_argument("--smoke", action="store_true", help="the former name of --rehearse")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write (default: $OUT/gpu_check.json)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run_check(args.rehearse or args.smoke, args.out or default_out())


if __name__ == "__main__":
    sys.exit(main())
