"""The explorer backends, each declared once, and how ``auto`` picks one for a device.

A backend record says everything the rest of the code needs: its implementation (the explorer
builds it, solrl_core.quant.implementations), the precision the cost model charges its quantized
layers at (solrl_core.accounting), how its cache is stored (the memory model,
solrl_core.models.memory), and what a device must have to run it. Lists of names, validation,
``auto`` and the error for a backend a device cannot run all read these records; an unknown name
is an error everywhere, never a silent default. Adding a backend is one record here (and its
implementation in quant/implementations.py, its kernels in their own module).

``auto`` (the real presets' default) takes the cheapest precision the device has tensor cores
for: ``te-nvfp4`` on Blackwell (sm_100+) when Transformer Engine is importable, ``fp8`` on
Ada / Hopper (sm_89+), ``emulated-nvfp4`` anywhere else (CPUs included).

This module imports torch and the implementations (torch-only); it must stay cheap, since config
validation reads it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch

from solrl_core.quant.implementations import FP8, EmulatedNVFP4, FP8RowWise, TransformerEngine

AUTO = "auto"
Capability = tuple[int, int]


@dataclass(frozen=True)
class ExplorerStorage:
    """Bytes the explorer caches per quantized layer: per weight element (0: packed NVFP4, counted
    by solrl_core.models.memory.nvfp4_weight_bytes, times ``nvfp4_copies``), per bias element
    (None: the model's dtype), per tensor and per output row."""

    name: str
    weight: float
    bias: float | None
    per_tensor: float
    per_row: float = 0
    nvfp4_copies: int = 1


@dataclass(frozen=True)
class BackendSpec:
    name: str
    # What the cost model charges the quantized layers at: "bf16", "fp8" or "fp4".
    precision: str
    # How the cache holds one layer (the memory model, solrl_core.models.memory).
    storage: ExplorerStorage
    # Smallest CUDA capability that runs it at all (None: any device, CPUs included).
    requires_capability: Capability | None
    # Python package it needs beyond torch (None: torch alone).
    requires_package: str | None
    description: str
    # Builds the implementation, given stand-ins for ``requires_package`` or None (the real one);
    # None: nothing is quantized, the explorer is the policy.
    implementation: Callable[..., object] | None
    # Whether a draft is independent of the samples sharing its batch (explore chunk, rank): every
    # activation scale lies within one sample (quant/activation_scale.py). The run log says so
    # where it is not.
    batch_independent: bool = True


BACKEND_SPECS: dict[str, BackendSpec] = {spec.name: spec for spec in (
    BackendSpec("none", "bf16", ExplorerStorage("none", weight=0, bias=0, per_tensor=0, nvfp4_copies=0), None, None,
                "no quantization: the explorer is the full-precision policy", None),
    # Packed codes + E4M3 block scales, fp32 tensor scale, bias in the model's dtype.
    BackendSpec("emulated-nvfp4", "fp4", ExplorerStorage("nvfp4-packed", weight=0, bias=None, per_tensor=4), None, None,
                "W4A4 NVFP4 numerics, exact; bf16 tensor-core GEMMs on a GPU, fp32 on a CPU", EmulatedNVFP4),
    # E4M3 + an fp32 scale per tensor, or per output row.
    BackendSpec("fp8", "fp8", ExplorerStorage("fp8-tensor", weight=1, bias=None, per_tensor=4, nvfp4_copies=0),
                None, None,
                "FP8 E4M3 current scaling, one scale per weight and per sample; FP8 GEMMs on sm_89+, emulated elsewhere",
                FP8),
    BackendSpec("fp8-rowwise", "fp8",
                ExplorerStorage("fp8-row", weight=1, bias=None, per_tensor=0, per_row=4, nvfp4_copies=0), None, None,
                "FP8 E4M3, one scale per activation row and per weight row; FP8 GEMMs on sm_90+", FP8RowWise),
    # Quantized parameters only (quantized_model_init); an upper bound that counts the row-wise and
    # the column-wise NVFP4 copy a TE weight may keep for a backward pass, not verified on a GPU.
    # bf16 bias, fp32 amax. TE scales each GEMM's whole input by one amax: the batch's.
    BackendSpec("te-nvfp4", "fp4", ExplorerStorage("te-nvfp4", weight=0, bias=2, per_tensor=4, nvfp4_copies=2),
                (10, 0), "transformer_engine",
                "NVFP4 GEMMs through Transformer Engine (1x16 blocks), Blackwell only", TransformerEngine,
                batch_independent=False),
)}
BACKENDS = (AUTO, *BACKEND_SPECS)

# Where each cheap precision has tensor cores.
FP8_CAPABILITY: Capability = (8, 9)
FP4_CAPABILITY: Capability = (10, 0)


class BackendUnavailable(RuntimeError):
    """An explorer backend this device cannot run; the message is one actionable line."""


def spec(backend: str) -> BackendSpec:
    if backend not in BACKEND_SPECS:
        raise ValueError(f"unknown explorer backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    return BACKEND_SPECS[backend]


def auto_choice(capability: Capability | None, transformer_engine: bool) -> str:
    """What ``auto`` runs on a device of this CUDA capability (None: no CUDA device)."""
    if capability is not None and capability >= FP4_CAPABILITY and transformer_engine:
        return "te-nvfp4"
    if capability is not None and capability >= FP8_CAPABILITY:
        return "fp8"
    return "emulated-nvfp4"


def auto_reason(device: torch.device) -> str:
    """Why ``auto`` picks what :func:`auto_choice` picks on ``device``, in words (the preflight's
    line); kept beside the rule so the two cannot drift apart."""
    capability, transformer_engine = device_capability(device), transformer_engine_importable()
    found = _device_words(device, capability)
    choice = auto_choice(capability, transformer_engine)
    if choice == "te-nvfp4":
        return f"{found} is sm_100+ and Transformer Engine is installed"
    if choice == "fp8" and capability >= FP4_CAPABILITY:
        return f"{found} is Blackwell, but te-nvfp4 needs Transformer Engine (pip install -e '.[gpu]')"
    if choice == "fp8":
        return f"{found} has FP8 tensor cores (sm_89+), not FP4 ones (sm_100+)"
    return f"{found}: no FP8 or FP4 tensor cores (fp8 needs sm_89+, te-nvfp4 sm_100+ with Transformer Engine)"


def transformer_engine_importable() -> bool:
    # find_spec, not an import: importing TE initialises CUDA and takes seconds.
    return importlib.util.find_spec("transformer_engine") is not None


def device_capability(device: torch.device) -> Capability | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(device))


def _device_words(device: torch.device, capability: Capability | None) -> str:
    if capability is None:
        return f"device {device}" if device.type != "cuda" else "no CUDA GPU"
    return f"{torch.cuda.get_device_name(device)} (sm_{capability[0]}{capability[1]})"


def unavailable_reason(backend: str, device: torch.device) -> str | None:
    """Why ``backend`` cannot run on ``device``, in one line, or None when it can."""
    record = spec(backend)
    missing = []
    if record.requires_package and importlib.util.find_spec(record.requires_package) is None:
        missing.append(f"the {record.requires_package} package")
    capability = device_capability(device)
    if record.requires_capability is not None and (capability is None or capability < record.requires_capability):
        major, minor = record.requires_capability
        missing.append(f"a GPU of sm_{major}{minor}+ (found {_device_words(device, capability)})")
    if not missing:
        return None
    return (f"explore.backend {backend} cannot run here: {record.description}; missing: {', '.join(missing)}. "
            "Install the gpu extra (pip install -e '.[gpu]') on a Blackwell machine, or use explore.backend=auto "
            "(fp8 on sm_89+, emulated-nvfp4 elsewhere)")


def resolve_backend(backend: str, device: torch.device) -> str:
    """The backend a run on ``device`` uses: ``auto`` resolved, an explicit one checked.

    Raises BackendUnavailable (one line) for an explicit backend this device cannot run, before
    anything is loaded."""
    if backend == AUTO:
        return auto_choice(device_capability(device), transformer_engine_importable())
    reason = unavailable_reason(backend, device)
    if reason is not None:
        raise BackendUnavailable(reason)
    return backend


def precision_on_profile(backend: str, profile_capability: Capability) -> str:
    """The precision the cost model charges ``backend`` at on a modeled device: ``auto`` as it
    would resolve there (Transformer Engine assumed installed on a Blackwell profile)."""
    if backend == AUTO:
        backend = auto_choice(profile_capability, transformer_engine=True)
    return spec(backend).precision


def run_device(model_device: str) -> torch.device:
    """The device a run's model.device names ("auto": the GPU when there is one)."""
    if model_device == AUTO:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(model_device)


def check_runs_here(backend: str, model_device: str) -> str:
    """The backend a run with these settings uses on this machine; BackendUnavailable first if
    it cannot run here. Cheap: nothing is loaded, Transformer Engine is not imported."""
    return resolve_backend(backend, run_device(model_device))
