"""Which device takes the explorer's GPU path, and how that path compiles its quantizers.

Each quantized backend has one GPU path (compiled activation quantizers, ``torch._scaled_mm`` for
FP8, bf16 GEMMs on decoded NVFP4) and one CPU path (the fp32 emulation). torch runs the GPU
path's operations on the CPU as well, only slower: inductor compiles CPU kernels and
``torch._scaled_mm`` takes float8 CPU tensors. So the tests and the GPU check's rehearsal run the
GPU path itself on the CPU inside :func:`gpu_path_on_cpu`, and every backend asks
:func:`takes_gpu_path` where it branches: there is no second, test-only copy of the GPU code.
Runs never enter it: on a CPU the emulation is the faster path.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_CPU_TAKES_GPU_PATH = False

# Inductor's Triton code divides fp32 by fp32 with div.full (an approximate division, off by up to
# 2 ulp) unless asked for IEEE division; eager divides exactly. The quantizers divide (FP8's
# x / scale; NVFP4's S_enc = 2688 / amax and the recipe's two reciprocals, which inductor lowers to
# divisions too), and a quotient off by an ulp moves a value that sits on an E2M1 or E4M3 rounding
# tie (common with bf16 inputs: ~2e-4 of NVFP4 codes and ~6e-4 of FP8 codes of Gaussian bf16
# activations when emulated with an approximate reciprocal), so the compiled quantizers divide as
# eager does. On the CPU inductor divides exactly anyway; an unknown option name raises in
# torch.compile, so the CPU tests also keep this name honest.
QUANTIZER_COMPILE_OPTIONS = {"eager_numerics.division_rounding": True}


def takes_gpu_path(x: torch.Tensor) -> bool:
    """True where ``x`` runs the GPU path: on CUDA, and on the CPU inside gpu_path_on_cpu()."""
    return x.is_cuda or (_CPU_TAKES_GPU_PATH and x.device.type == "cpu")


@contextmanager
def gpu_path_on_cpu() -> Iterator[None]:
    """Inside, CPU tensors take the GPU path (the capability checks of real GPUs still apply to
    CUDA tensors). For tests and the GPU check's rehearsal; not thread-local."""
    global _CPU_TAKES_GPU_PATH
    previous, _CPU_TAKES_GPU_PATH = _CPU_TAKES_GPU_PATH, True
    try:
        yield
    finally:
        _CPU_TAKES_GPU_PATH = previous


def compile_quantizer(function, **kwargs):
    """``function`` compiled for the GPU path, dividing as eager does (dynamic shapes: one graph
    serves every layer). Where torch.compile cannot build kernels for the input's device (no
    Triton, no C compiler, a toolchain that fails), ``function`` itself runs: the same numbers
    (the compiled quantizers divide as eager does), more kernels, with one warning."""
    compiled = torch.compile(function, dynamic=True, options=dict(QUANTIZER_COMPILE_OPTIONS), **kwargs)

    @functools.wraps(function)
    def quantizer(x: torch.Tensor, *args, **more):
        if torch.compiler.is_compiling():
            # Inside a compiled block (model.compile): traced into the block's graph, so the
            # quantizer fuses with its neighbours; dynamo would also trace through the cached
            # toolchain probe below as if uncached, and break the graph on its file checks.
            return function(x, *args, **more)
        problem = compile_toolchain_problem(x.device.type)
        return (function if problem else compiled)(x, *args, **more)

    return quantizer


@functools.cache
def compile_toolchain_problem(device_type: str) -> str | None:
    """Why torch.compile cannot build kernels for this device type, or None when a tiny function
    compiles and runs. Asked once per process and device type, before the first real kernel, so a
    missing toolchain costs one warning line instead of a failed run."""
    problem = toolchain_problem(torch.device(device_type))
    if problem is not None:
        print(f"warning: torch.compile unavailable on {device_type} ({problem}): the explorer's quantizers "
              f"and model.compile run eager, with the same numbers but slower", file=sys.stderr)
    return problem


def toolchain_problem(device: torch.device) -> str | None:
    """compile_toolchain_problem's check itself, asked anew each call (the GPU check reports it)."""
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    if shutil.which("cc") is None and shutil.which("gcc") is None and shutil.which("clang") is None:
        return "no C compiler (cc, gcc or clang) on PATH"
    try:
        probe = torch.compile(lambda x: (x.abs().amax() / 448.0).float(), dynamic=True, fullgraph=True)
        probe(torch.ones(32, 16, device=device))
    except Exception as error:  # noqa: BLE001 - any failure of the toolchain means: run eager
        first_line = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        return f"torch.compile failed: {type(error).__name__}: {first_line}"
    return None
