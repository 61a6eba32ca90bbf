"""Which code made a run: the package version, and the numerics its drafts and updates ran under.

A checkpoint records both (solrl_core.checkpoint). The numerics fingerprint holds what changes a
draft or a training step when the code does not: the explorer backend a run resolves to and how
it scales activations, the solver, the full-precision dtype, and :data:`NUMERICS_VERSION`, which
a change of the code's numerics bumps. A resume under another fingerprint would mix two numerics
in one ledger, so it is refused unless the user accepts the change (``--accept-numerics-change``).
"""

from __future__ import annotations

from importlib import metadata

from solrl_core.config import Config
from solrl_core.models.registry import resolve_device, resolve_dtype
from solrl_core.quant.backends import BackendUnavailable, resolve_backend, spec

# Bump on any change that alters drafts, rankings or training steps for the same config and seed.
#   1: checkpoints written before fingerprints were recorded (they carry none).
#   2: the emulated NVFP4 quantizer in NVIDIA's recipe's order of operations, and exploration
#      noise keyed by (prompt slot, index within the pool).
NUMERICS_VERSION = 2
# What a checkpoint without a fingerprint stands for: the code before fingerprints existed.
UNRECORDED = {"version": 1}
PACKAGE = "solrl"


def package_version() -> str:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


def numerics_fingerprint(config: Config) -> dict:
    """The numerics a run of ``config`` gets on this machine (nothing is loaded): ``auto``
    settings resolved as the run resolves them."""
    device = resolve_device(config.model.device)
    try:
        backend = resolve_backend(config.explore.backend, device)
    except BackendUnavailable:  # the run itself refuses it in one line; the fingerprint names what was asked
        backend = config.explore.backend
    dtype = str(resolve_dtype(config.model.dtype, device)).removeprefix("torch.")
    return {"version": NUMERICS_VERSION, "explorer": backend, "activation_scale": activation_scale(backend),
            "solver": config.sampler.kind, "dtype": dtype}


def activation_scale(backend: str) -> str:
    """How the backend scales an activation's tensor-level range (solrl_core.quant.activation_scale)."""
    try:
        record = spec(backend)
    except ValueError:  # an unknown name: validation refuses it elsewhere
        return "unknown"
    if record.implementation is None:
        return "none"
    return "per-sample" if record.batch_independent else "per-batch"


def describe(fingerprint: dict | None) -> str:
    """One phrase for a fingerprint, as the refusal names it."""
    if not fingerprint or fingerprint == UNRECORDED:
        return "numerics 1 (written before runs recorded their numerics)"
    return (f"numerics {fingerprint.get('version')} ({fingerprint.get('explorer')} explorer, "
            f"{fingerprint.get('activation_scale')} activation scales, {fingerprint.get('solver')} solver, "
            f"{fingerprint.get('dtype')})")
