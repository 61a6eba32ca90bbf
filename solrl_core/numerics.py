"""The process-wide numeric setting the project's own processes run with, and why it is not set on
import: whoever imports solrl_core (a notebook, a user's evaluation script, another library's
tests) keeps the numerics they had."""

from __future__ import annotations

import torch


def flush_denormals() -> None:
    """Flush fp32 subnormals to zero on the CPU, for this thread and the threads it starts later.

    Tiny activations underflow to fp32 subnormals in the small transformers of the embedded world;
    x86 CPUs handle subnormals in microcode, which made a training step 25x slower here (measured
    5.2 s vs 0.22 s). Flushing them is deterministic and changes no value above 2^-126 (~1.2e-38).
    Called where the project runs its own work: the `solrl` command (every run's process and every
    torchrun rank start there), the training loop (a deployment's flow run starts there), the
    benchmarks (benchmarks/_threads.py) and the tests (tests/conftest.py). Never at import.
    """
    torch.set_flush_denormal(True)
