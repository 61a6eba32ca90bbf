"""The machinery of the one-try GPU check (benchmarks/gpu_check.py), kept apart from what it
measures: the package report and refusal, sections that run isolated and are saved one by one,
and the routing that lets a CPU rehearsal take the explorer's GPU path. The compile-toolchain
probe and its eager fallback are solrl_core's own (solrl_core.quant.gpu_path).

A lent GPU gives one try of a few minutes, so nothing here may take the whole check down: a
section that raises is recorded (with its traceback) and the next one runs, and the JSON is
rewritten after every section, so a check killed by its time limit still leaves what it measured.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

# Distribution name -> import name. Required: the check cannot run a section without them.
REQUIRED_PACKAGES = {"torch": "torch", "diffusers": "diffusers", "peft": "peft", "safetensors": "safetensors"}
# Reported, never required: Transformer Engine only runs te-nvfp4 (Blackwell); Triton is what
# inductor compiles CUDA kernels with (CPU kernels need a C compiler instead).
OPTIONAL_PACKAGES = {"triton": "triton", "transformer-engine": "transformer_engine"}


def _version(distribution: str, module: str) -> str | None:
    """The installed version, or None when the package cannot be imported. find_spec, not an
    import: importing Transformer Engine initialises CUDA and takes seconds."""
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        # transformer-engine ships as transformer_engine (+ _torch) distributions, depending on the wheel.
        for alternative in (module, f"{module}_torch", f"{distribution}-torch"):
            try:
                return importlib.metadata.version(alternative)
            except importlib.metadata.PackageNotFoundError:
                continue
        return "installed (version unknown)"


def environment(device: torch.device) -> dict:
    """Versions of the packages the check uses and what the device is."""
    record = {name: _version(name, module) for name, module in {**REQUIRED_PACKAGES, **OPTIONAL_PACKAGES}.items()}
    record["cuda"] = torch.version.cuda
    record["device"] = str(device)
    if device.type == "cuda":
        record["gpu"] = torch.cuda.get_device_name(device)
        record["capability"] = "sm_%d%d" % torch.cuda.get_device_capability(device)
        record["gpu_memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    else:
        record["capability"] = None
    return record


def missing_required(record: dict) -> list[str]:
    return [name for name in REQUIRED_PACKAGES if record.get(name) is None]


def environment_line(record: dict) -> str:
    """One printed line: every package with its version, 'absent' for an optional one missing."""
    words = [f"{name} {record[name] or 'absent'}" for name in (*REQUIRED_PACKAGES, *OPTIONAL_PACKAGES)]
    words.append(f"CUDA {record['cuda'] or 'none'}")
    words.append(f"device {record.get('gpu', record['device'])} capability {record['capability'] or 'none'}")
    return ", ".join(words)


# --- the FP8 GEMM path on a CPU ----------------------------------------------------------------


@contextmanager
def scaled_mm_routing_on_cpu() -> Iterator[None]:
    """Inside, solrl_core's explorer takes the GPU's path on the CPU as well
    (solrl_core.quant.gpu_path): the compiled activation quantizers and, wherever the layer meets
    the GEMM's alignment rule, torch._scaled_mm with the bias fused for a bf16 output and fast
    accumulation. torch runs _scaled_mm on the CPU with float8_e4m3fn inputs, so a rehearsal meets
    the layouts and scale shapes the GPU will meet. The switch is solrl_core's own, not a patch:
    the functions that run are the GPU's."""
    from solrl_core.quant.gpu_path import gpu_path_on_cpu

    with gpu_path_on_cpu():
        yield


# --- sections ----------------------------------------------------------------------------------


def run_section(name: str, function: Callable[[], dict]) -> dict:
    """One section, isolated: its result, or the exception with its traceback."""
    started = time.perf_counter()
    try:
        record = {"status": "ok", "result": function()}
    except Exception as error:  # noqa: BLE001 - one broken section must not cost the others
        record = {"status": "error", "error": f"{type(error).__name__}: {error}"[:2000],
                  "traceback": traceback.format_exc()}
    record["seconds"] = round(time.perf_counter() - started, 2)
    return record


def run_sections(sections: list[tuple[str, Callable[[], dict]]], report: dict, save: Callable[[dict], None],
                 echo: Callable[[str], None] = print) -> None:
    """Run each section in order into ``report["sections"]``; save the report after each."""
    report.setdefault("sections", {})
    for name, function in sections:
        echo(f"section {name} ...")
        record = run_section(name, function)
        report["sections"][name] = record
        save(report)
        last = record.get("error", "").splitlines()[0] if record["status"] == "error" else ""
        echo(f"section {name}: {record['status']} in {record['seconds']} s{' - ' + last if last else ''}")
