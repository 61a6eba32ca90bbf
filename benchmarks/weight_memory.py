"""Weight memory: one base weight set (+ LoRA adapters + the explorer's quantized copy) against the
reference code's three full copies. Measured on a tiny FLUX instance (the tensors the run actually
holds, and the process's peak RSS), modeled for FLUX.1-dev. Then a real flux-* run's peak on the
GPU (FLUX.1-dev, 512 px, fp8 explorer), stage by stage, against an 80 GB card: modeled weights and
activations (solrl_core.models.memory.flux_dev_run_peak), with the training-activation
coefficient measured again on tiny instances beside the modeled one. Writes JSON to stdout (and
to $OUT/weight_memory.json when $OUT is set). CPU only, some seconds.

    python benchmarks/weight_memory.py
"""

from __future__ import annotations

import json
import os
import resource
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from solrl_core.models.adapters import OLD, attach_adapters  # noqa: E402
from solrl_core.models.memory import (GIB, TRAIN_SAVED, flux_dev_run_peak, flux_dev_weight_memory,  # noqa: E402
                                      tiny_flux_train_coefficient, weight_memory)
from solrl_core.presets import MODEL_PRESETS  # noqa: E402
from solrl_core.quant.explorer import build_explorer  # noqa: E402

SKIP = MODEL_PRESETS["flux.1-dev"]["settings"]["quant"]["skip"]
TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def measured_tiny(backend: str, rank: int = 8) -> dict:
    """A 2-double + 4-single-block FLUX transformer (fp32 on the CPU) with the three adapters."""
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=2, num_single_layers=4,
                                   attention_head_dim=32, num_attention_heads=4, joint_attention_dim=64,
                                   pooled_projection_dim=32, axes_dims_rope=(8, 12, 12))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attach_adapters(model, rank, 2 * rank, TARGETS, seed=0)
    explorer = build_explorer(model, backend, SKIP, 0)
    explorer.requantize(model, adapter=OLD)
    measured = {
        "base": tensor_bytes(p for n, p in model.named_parameters() if ".lora_" not in n),
        "lora": tensor_bytes(p for n, p in model.named_parameters() if ".lora_" in n),
        "explorer": tensor_bytes(t for entry in explorer._cached_weights.values() for t in entry),
    }
    measured["total"] = sum(measured.values())
    measured["three_copies"] = 3 * measured["base"]
    modeled = weight_memory(model, targets=TARGETS, rank=rank, skip=SKIP, min_dim=0, storage=backend,
                            base_bytes=4, lora_bytes=4)
    return {"backend": backend, "measured_bytes": measured,
            "modeled_bytes": {"base": modeled.base, "lora": modeled.lora, "explorer": modeled.explorer,
                              "total": modeled.total, "three_copies": modeled.three_copies}}


# The backends whose cache is a plain tuple of tensors, measurable on this CPU.
MEASURED_BACKENDS = ("emulated-nvfp4", "fp8", "fp8-rowwise")
MODELED_BACKENDS = ("emulated-nvfp4", "fp8", "fp8-rowwise", "te-nvfp4")


CARD_BYTES = 80e9  # an 80 GB H100 / A100


def _gib(value: int) -> float:
    return round(value / GIB, 2)


def run_peak(offload: bool) -> dict:
    """flux-imagereward's stages with the fp8 explorer, in GiB, and the peak against 80 GB."""
    peak = flux_dev_run_peak("fp8", offload_rewards=offload, offload_encoders=offload)
    return {"offload_rewards_and_encoders": offload, "tokens": peak["tokens"],
            "resident_gib": {name: _gib(value) for name, value in peak["resident"].items()},
            "stages_gib": {name: {"total": _gib(stage["bytes"]), **{k: _gib(v) for k, v in stage["parts"].items()}}
                           for name, stage in peak["stages"].items()},
            "peak_stage": peak["peak_stage"], "peak_gib": _gib(peak["peak_bytes"]),
            "peak_gb": round(peak["peak_bytes"] / 1e9, 2), "card_gb": CARD_BYTES / 1e9,
            "fits": peak["peak_bytes"] < CARD_BYTES}


def main() -> dict:
    shapes = [(4, 32, 64, 32), (4, 32, 128, 64), (8, 32, 64, 32), (6, 64, 96, 32)]  # heads, head dim, tokens
    report = {"tiny_flux_fp32": [measured_tiny(backend) for backend in MEASURED_BACKENDS],
              "flux_dev_bf16_gib": {backend: flux_dev_weight_memory(backend).gib() for backend in MODELED_BACKENDS},
              "train_saved_coefficient": {"modeled": TRAIN_SAVED, "measured_tiny": [
                  {"heads": h, "head_dim": d, "image_tokens": i, "text_tokens": t,
                   "elements_per_token_width_block": round(tiny_flux_train_coefficient(h, d, i, t), 3)}
                  for h, d, i, t in shapes]},
              "flux_dev_512px_fp8_run": [run_peak(offload=True), run_peak(offload=False)],
              "modeled": ["transformer, adapters, AdamW state, explorer cache (parameter counts of the "
                          "meta-device model)", "reward, encoder and VAE weights (parameter counts)",
                          "inference activations (22 elements per token and hidden unit, one block)",
                          "training activations (TRAIN_SAVED, every block: no gradient checkpointing)"],
              "measured": ["tiny-instance cache and adapter tensors against the weight model",
                           "the training-activation coefficient on tiny instances (saved-tensor hooks)"],
              "not_modeled": ["CUDA context and allocator slack", "torch.compile workspaces"],
              "process_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    return report


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    text = json.dumps(main(), indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "weight_memory.json").write_text(text + "\n")
