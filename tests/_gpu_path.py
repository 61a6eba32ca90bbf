"""What the tests of the explorer's GPU path share: the devices it runs on here (the CPU always, a
CUDA GPU when there is one that can run it), entering that path on either, and which ops a call ran."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch.profiler import ProfilerActivity, profile

from solrl_core.quant.gpu_path import gpu_path_on_cpu


def gpu_path_devices(minimum_capability: tuple[int, int] | None = None) -> list[str]:
    """"cpu", and "cuda" where a GPU (of at least that capability) is present."""
    has_gpu = torch.cuda.is_available() and (
        minimum_capability is None or torch.cuda.get_device_capability() >= minimum_capability)
    return ["cpu", "cuda"] if has_gpu else ["cpu"]


@contextmanager
def gpu_path(device: str = "cpu") -> Iterator[None]:
    """The GPU path on ``device`` (CUDA takes it anyway, the CPU inside gpu_path_on_cpu()), with
    dynamo's compile caches emptied before and after. Dynamo compiles at most 8 variants of one
    function (one per input dtype, grad mode, scale mode, ...) and then refuses (fullgraph) or runs
    it eager: a run meets a few, a test session would meet them all and fail a later test."""
    torch._dynamo.reset()
    try:
        with gpu_path_on_cpu() if device == "cpu" else nullcontext():
            yield
    finally:
        torch._dynamo.reset()


def ops_run(function) -> tuple[set[str], object]:
    """The names of the ops (and compiled regions) one call of ``function`` ran, and its output."""
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        output = function()
    return {event.key for event in profiler.key_averages()}, output


def ran_compiled_code(ops: set[str]) -> bool:
    return any(name.startswith("Torch-Compiled Region") for name in ops)
