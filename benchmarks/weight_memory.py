"""Weight memory: one base weight set (+ LoRA adapters + the explorer's quantized copy) against the
reference code's three full copies. Measured on a tiny FLUX instance (the tensors the run actually
holds, and the process's peak RSS), modeled for FLUX.1-dev. Writes JSON to stdout (and to
$OUT/weight_memory.json when $OUT is set). CPU only, a few seconds.

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
from solrl_core.models.memory import flux_dev_weight_memory, weight_memory  # noqa: E402
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


def main() -> dict:
    report = {"tiny_flux_fp32": [measured_tiny(backend) for backend in MEASURED_BACKENDS],
              "flux_dev_bf16_gib": {backend: flux_dev_weight_memory(backend).gib() for backend in MODELED_BACKENDS},
              "process_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    return report


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    text = json.dumps(main(), indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "weight_memory.json").write_text(text + "\n")
