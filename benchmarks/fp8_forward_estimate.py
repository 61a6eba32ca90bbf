"""An estimate, not a measurement: the FP8 explorer's FLUX.1-dev forward against the equally
compiled BF16 forward on an H100, at 512 px (1024 image + 512 text tokens), batch 24.

A roofline sum over the forward's parts, each at a stated fraction of its H100 peak:
- the explorer's quantized GEMMs (418 layers: every attention, feed-forward and single-block
  projection; the preset's quant.skip keeps the embedders, AdaLN linears and head in BF16): BF16
  989 TFLOP/s, FP8 1979 TFLOP/s dense;
- the other GEMMs (those kept in BF16) and joint attention, BF16 in both forwards;
- the memory-bound passes a compiled block still makes (norms with their AdaLN modulation, q/k
  RMSNorm with RoPE, GELU, gated residuals, the single block's concatenation), the same in both;
- the FP8 forward's activation quantization with a per-tensor scale: one amax over each distinct
  quantized input, then a scale-and-cast to E4M3. Fused into its producer (inductor recomputes the
  producer in both passes and never writes the BF16 tensor) it adds ~1 byte per element; as two
  passes of its own (read for the amax, read and write the FP8 copy) it adds 5.

The GEMM FLOPs are counted from FLUX.1-dev's real layer selection (the preset's quant settings on
the meta-device model); the rest from its dimensions. Writes reports/benchmarks/fp8_forward_estimate.json.

    .venv/bin/python benchmarks/fp8_forward_estimate.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from solrl_core.accounting import DEVICE_PROFILES  # noqa: E402
from solrl_core.models.memory import FLUX_DEV_CONFIG  # noqa: E402
from solrl_core.models.registry import MODELS  # noqa: E402
from solrl_core.quant.explorer import layer_features, quantizable_layers, select_quantized_layers  # noqa: E402

BATCH, IMAGE_TOKENS, TEXT_TOKENS = 24, (512 // 16) ** 2, 512
BF16_BYTES = 2
H100_BANDWIDTH = 3.35e12  # bytes/s, H100 SXM HBM3
# The assumed shares of each peak a compiled forward sustains: large BF16 and FP8 GEMMs, BF16
# flash attention, streaming passes. "peak": every part at its peak; "fp8_gemm_1.6x": FP8 GEMMs
# sustaining 1.6x the BF16 ones instead of the peaks' 2x.
SUSTAINED = {"sustained": {"gemm": 0.7, "fp8_gemm": 0.7, "attention": 0.4, "memory": 0.8},
             "peak": {"gemm": 1.0, "fp8_gemm": 1.0, "attention": 1.0, "memory": 1.0},
             "fp8_gemm_1.6x": {"gemm": 0.7, "fp8_gemm": 0.56, "attention": 0.4, "memory": 0.8}}
QUANTIZE_BYTES = {"fused": 1, "unfused": 5}  # extra bytes per quantized input element
OUT = ROOT / "reports" / "benchmarks" / "fp8_forward_estimate.json"


def stream_tokens(name: str) -> int:
    """Tokens a FLUX layer multiplies per sample: a dual block's image-stream layers see the image
    tokens, its context-stream layers (add_*_proj, to_add_out, ff_context) the text tokens, a
    single block's layers both."""
    if name.startswith("single_transformer_blocks."):
        return IMAGE_TOKENS + TEXT_TOKENS
    context = any(part in name for part in (".add_q_proj", ".add_k_proj", ".add_v_proj", ".to_add_out", ".ff_context."))
    return TEXT_TOKENS if context else IMAGE_TOKENS


def rows_of(name: str) -> int:
    """Rows a FLUX Linear multiplies per sample: one for the conditioning MLPs and the AdaLN
    modulations (norm*.linear), which act on the per-sample vector; tokens for the rest."""
    if name.startswith(("time_text_embed.", "norm_out.")) or ".norm" in name:
        return 1
    if name in ("x_embedder", "proj_out"):
        return IMAGE_TOKENS
    if name == "context_embedder":
        return TEXT_TOKENS
    return stream_tokens(name)


def gemm_flops() -> dict:
    """Per-sample FLOPs of the quantized GEMMs and of the token GEMMs left in BF16 (the AdaLN
    linears act once per sample on the conditioning vector: their FLOPs are per sample)."""
    from diffusers import FluxTransformer2DModel

    quant = MODELS["flux"].preset.settings["quant"]
    with torch.device("meta"):
        model = FluxTransformer2DModel(**FLUX_DEV_CONFIG)
    selected = set(select_quantized_layers(model, quant["skip"], quant["min_dim"]))
    quantized = other = 0
    for name, layer in quantizable_layers(model):
        in_features, out_features = layer_features(layer)
        flops = 2 * rows_of(name) * in_features * out_features
        if name in selected:
            quantized += flops
        else:
            other += flops
    return {"quantized_layers": len(selected), "quantized": quantized, "other": other}


def attention_flops() -> int:
    """QK^T and PV of the joint attention over all tokens, in every block."""
    tokens = IMAGE_TOKENS + TEXT_TOKENS
    width = FLUX_DEV_CONFIG["num_attention_heads"] * FLUX_DEV_CONFIG["attention_head_dim"]
    blocks = FLUX_DEV_CONFIG["num_layers"] + FLUX_DEV_CONFIG["num_single_layers"]
    return blocks * 2 * (2 * tokens * tokens * width)


def memory_passes() -> dict:
    """Elements per sample of the passes a compiled block makes in both forwards, and of the
    distinct quantized inputs (one amax each: q, k and v share one input)."""
    d = FLUX_DEV_CONFIG["num_attention_heads"] * FLUX_DEV_CONFIG["attention_head_dim"]
    m = 4 * d  # FLUX's MLP width
    # Dual block, per stream and token: norm1+modulate 2d, q/k RMSNorm+RoPE 4d, gated residual 3d,
    # norm2+modulate 2d, GELU 2m, gated residual 3d (reads plus writes).
    dual = 14 * d + 2 * m
    # Single block, per token: norm+modulate 2d, q/k RMSNorm+RoPE 4d, GELU 2m (written into the
    # concatenation), attention output copied into it 2d, gated residual 3d.
    single = 11 * d + 2 * m
    tokens = IMAGE_TOKENS + TEXT_TOKENS
    dual_blocks, single_blocks = FLUX_DEV_CONFIG["num_layers"], FLUX_DEV_CONFIG["num_single_layers"]
    # Quantized inputs per token: dual (per stream) norm1 out (q, k, v), attention out, norm2 out,
    # GELU out; single: norm out (q, k, v, proj_mlp), the concatenation (proj_out).
    return {"elementwise": tokens * (dual_blocks * dual + single_blocks * single),
            "quantized_inputs": tokens * (dual_blocks * (3 * d + m) + single_blocks * (2 * d + m))}


def seconds(flops: dict, passes: dict, sustained: dict, quantize_bytes: int | None) -> dict:
    """Seconds of each part of one batch's forward; quantize_bytes None: the BF16 forward."""
    peaks = DEVICE_PROFILES["H100"]
    gemm_rate = peaks["bf16"] * 1e12 * sustained["gemm"] if quantize_bytes is None else \
        peaks["fp8"] * 1e12 * sustained["fp8_gemm"]
    bandwidth = H100_BANDWIDTH * sustained["memory"]
    parts = {
        "quantized_gemms": BATCH * flops["quantized"] / gemm_rate,
        "other_gemms": BATCH * flops["other"] / (peaks["bf16"] * 1e12 * sustained["gemm"]),
        "attention": BATCH * flops["attention"] / (peaks["bf16"] * 1e12 * sustained["attention"]),
        "elementwise": BATCH * passes["elementwise"] * BF16_BYTES / bandwidth,
        "quantization": BATCH * passes["quantized_inputs"] * (quantize_bytes or 0) / bandwidth,
    }
    return {**{k: round(v, 4) for k, v in parts.items()}, "total": round(sum(parts.values()), 4)}


def estimate() -> dict:
    flops = {**gemm_flops(), "attention": attention_flops()}
    passes = memory_passes()
    cases = {}
    for name, sustained in SUSTAINED.items():
        bf16 = seconds(flops, passes, sustained, None)
        case = {"assumed_share_of_peak": sustained, "bf16_seconds": bf16}
        for fusion, extra in QUANTIZE_BYTES.items():
            fp8 = seconds(flops, passes, sustained, extra)
            case[f"fp8_{fusion}_seconds"] = fp8
            case[f"speedup_{fusion}"] = round(bf16["total"] / fp8["total"], 3)
        no_quantization = seconds(flops, passes, sustained, 0)
        case["speedup_ceiling"] = round(bf16["total"] / no_quantization["total"], 3)
        cases[name] = case
    gemm_share = flops["quantized"] / (flops["quantized"] + flops["other"] + flops["attention"])
    return {"kind": "estimate (arithmetic, not measured)", "model": "FLUX.1-dev transformer", "batch": BATCH,
            "tokens": {"image": IMAGE_TOKENS, "text": TEXT_TOKENS}, "h100_peaks_tflops": DEVICE_PROFILES["H100"],
            "h100_bandwidth_bytes_per_s": H100_BANDWIDTH, "flops_per_sample": flops,
            "quantized_gemm_share_of_flops": round(gemm_share, 4), "elements_per_sample": passes,
            "quantize_extra_bytes_per_element": QUANTIZE_BYTES, "cases": cases}


def main() -> int:
    record = estimate()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    temporary = OUT.with_suffix(".tmp")
    temporary.write_text(json.dumps(record, indent=2) + "\n")
    temporary.replace(OUT)
    flops = record["flops_per_sample"]
    print(f"per sample: quantized GEMMs {flops['quantized'] / 1e12:.2f} TFLOP ({flops['quantized_layers']} layers), "
          f"other GEMMs {flops['other'] / 1e12:.3f}, attention {flops['attention'] / 1e12:.2f}; "
          f"GEMM share of FLOPs {record['quantized_gemm_share_of_flops']:.1%}")
    for name, case in record["cases"].items():
        print(f"{name}: BF16 {case['bf16_seconds']['total']} s, FP8 {case['fp8_unfused_seconds']['total']} s "
              f"(quantization unfused) to {case['fp8_fused_seconds']['total']} s (fused): speed-up "
              f"{case['speedup_unfused']} to {case['speedup_fused']}, ceiling {case['speedup_ceiling']}")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
