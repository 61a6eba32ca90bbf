"""`solrl check`: would `solrl run` with these arguments start on this machine? Answered in
seconds, with no weights loaded.

Every check runs, whatever the others found, so one pass lists everything that is missing: the
model's files, each reward's files (and the files a reward reads beside them: ImageReward's
tokenizer, PickScore's processor), the device, the explorer backend ``auto`` resolves to, the
modeled memory against the device's and the output directory. Files are looked for by the
resolvers the run itself uses (models.registry.check_model_files, each reward's LocalFiles and
companion), so the preflight and the run cannot disagree on where a file should be; their
messages already name the ``-S`` key and the environment variable that supply it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from solrl_core.command_errors import UserError
from solrl_core.config import Config, ConfigError, train_steps
from solrl_core.local_files import ModelFilesMissing
from solrl_core.models.registry import check_model_files, resolve_device
from solrl_core.output_folder import new_output_directory, writable_or_raise
from solrl_core.quant.backends import AUTO, BackendUnavailable, auto_reason, check_runs_here
from solrl_core.rewards.registry import reward_spec

GIB = 2**30
OK, WARNING, PROBLEM = "ok", "warn", "FAIL"
# Under this share of the device's memory a modeled peak is called tight: the model leaves out the
# CUDA context and the allocator's slack.
TIGHT_SHARE = 0.9


@dataclass(frozen=True)
class Finding:
    status: str  # OK, WARNING (the run starts, but read this) or PROBLEM (it cannot start)
    topic: str
    text: str  # one line: what was found, or what is missing and how to supply it


def preflight(config: Config, out: str | None) -> list[Finding]:
    """Every finding about a run of ``config`` writing to ``out`` (None: not checked)."""
    device = resolve_device(config.model.device)
    explorer, backend = explorer_finding(config, device)
    return [config_finding(config), model_finding(config), *reward_findings(config), device_finding(config, device),
            explorer, memory_finding(config, device, backend), output_finding(out)]


def problems(findings: list[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.status == PROBLEM]


def report(findings: list[Finding]) -> str:
    """The findings, one line each, and the verdict as the last line."""
    lines = [f"  {finding.status:<4}  {finding.topic}: {finding.text}" for finding in findings]
    failed = problems(findings)
    verdict = "ready: the run can start" if not failed else \
        f"not ready: {len(failed)} problem{'s' if len(failed) > 1 else ''} ({PROBLEM} above) stop the run from starting"
    return "\n".join([*lines, verdict]) + "\n"


# ---------------------------------------------------------------------------------------------
# The checks


def config_finding(config: Config) -> Finding:
    """The settings that decide a run's cost and what it trains for; the rest: `solrl config`."""
    weights = ", ".join(f"{name} {weight:g}" for name, weight in config.rewards.items())
    text = (f"preset {config.preset}, family {config.family}; {config.iterations} iterations of "
            f"{config.prompts_per_iteration} prompts x {config.pool} seeds (keep {config.keep}); "
            f"{config.model.resolution} px, sampler {config.sampler.kind} (shift {config.sampler.shift:g}), "
            f"{config.explore.steps} explore / {train_steps(config)} train / {config.eval.steps} eval steps; "
            f"rewards {weights}; eval rewards {', '.join(config.eval.rewards) or 'none'} "
            "(every key: `solrl config` with the same arguments)")
    return Finding(OK, "config", text)


def model_finding(config: Config) -> Finding:
    try:
        return Finding(OK, "model", f"{config.model.loader} from {check_model_files(config.model)}")
    except ModelFilesMissing as missing:
        return Finding(PROBLEM, "model", str(missing))


def reward_findings(config: Config) -> list[Finding]:
    """One finding per reward model's files (and per companion), analytic rewards left out."""
    findings = []
    for name in dict.fromkeys([*config.rewards, *config.eval.rewards]):
        spec = reward_spec(name)
        if spec.files is None:
            continue
        topic = f"reward {name} ({_roles(config, name)})"
        folder, finding = _located(name, topic, lambda: spec.files.resolve(config.reward_paths.get(name, "")))
        findings.append(finding)
        if spec.companion is not None:
            what, find = spec.companion
            findings.append(_located(name, f"{topic} {what}", lambda: find(folder))[1])
    return findings


def _roles(config: Config, name: str) -> str:
    uses = (("trained", config.rewards), ("evaluation", config.eval.rewards))
    return ", ".join(role for role, names in uses if name in names)


def _located(name: str, topic: str, resolve) -> tuple[Path | None, Finding]:
    try:
        folder = resolve()
    except ModelFilesMissing as missing:  # the topic names the reward already
        return None, Finding(PROBLEM, topic, str(missing).removeprefix(f"reward '{name}': "))
    return folder, Finding(OK, topic, str(folder))


def device_finding(config: Config, device: torch.device) -> Finding:
    if device.type == "cuda" and not _cuda_device_exists(device):
        return Finding(PROBLEM, "device", f"model.device is {config.model.device} but torch {torch.__version__} "
                                          f"sees {torch.cuda.device_count()} CUDA GPU(s) (CUDA build "
                                          f"{torch.version.cuda or 'none'}); set -S model.device=auto or install "
                                          "the CUDA build of torch")
    capacity, words = device_memory(device)
    text = f"{_device_name(device)}, {capacity / GIB:.1f} GiB of {words} (model.device {config.model.device})"
    if device.type == "cpu" and config.model.loader != "shapes-tiny":
        return Finding(WARNING, "device", f"{text}: no CUDA GPU, so the real model would run on the CPU; "
                                          "its presets are meant for a GPU")
    return Finding(OK, "device", text)


def _cuda_device_exists(device: torch.device) -> bool:
    index = device.index if device.index is not None else 0
    return torch.cuda.is_available() and index < torch.cuda.device_count()


def device_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, what they are): a GPU's memory, or the machine's RAM for the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory, "GPU memory"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "RAM"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        return f"{device}: {properties.name} (sm_{properties.major}{properties.minor})"
    threads = torch.get_num_threads()
    return f"{device} ({threads} thread{'s' if threads > 1 else ''})"


def explorer_finding(config: Config, device: torch.device) -> tuple[Finding, str | None]:
    """(finding, the backend the run will use or None when it cannot run here)."""
    requested = config.explore.backend
    try:
        backend = check_runs_here(requested, config.model.device)
    except BackendUnavailable as error:
        return Finding(PROBLEM, "explorer", str(error)), None
    why = f"what explore.backend auto picks here: {auto_reason(device)}" if requested == AUTO \
        else f"explore.backend {requested}, which runs here"
    return Finding(OK, "explorer", f"{backend}, {why}"), backend


def memory_finding(config: Config, device: torch.device, backend: str | None) -> Finding:
    """The modeled peak of the run's stages against the device's memory (FLUX.1-dev is modeled)."""
    if config.model.loader != "flux":
        what = "the embedded world's 0.6M-parameter model" if config.model.loader == "shapes-tiny" \
            else f"{config.model.loader} (only FLUX.1-dev has a memory model: solrl_core/models/memory.py)"
        return Finding(OK, "memory", f"not modeled for {what}")
    if backend is None:
        return Finding(WARNING, "memory", "not modeled: the explorer backend cannot run here (see explorer)")
    peak = _flux_peak(config, backend)
    capacity, words = device_memory(device)
    text = (f"modeled peak {peak['peak_bytes'] / GIB:.1f} GiB ({peak['peak_stage']} stage: weights, adapters, "
            f"AdamW state, activations; no CUDA context) against {capacity / GIB:.1f} GiB of {words}")
    if device.type == "cpu":
        text += " (modeled for bf16 weights on a GPU; a CPU run holds float32, twice as much)"
    if peak["peak_bytes"] > capacity and device.type == "cpu":
        return Finding(PROBLEM, "memory", f"{text}: does not fit; run it on a GPU")
    if peak["peak_bytes"] > capacity:
        return Finding(PROBLEM, "memory", f"{text}: does not fit; lower train.micro_batch, explore.chunk or "
                                          "eval.chunk, keep model.offload_* on, or use a larger GPU")
    if peak["peak_bytes"] > TIGHT_SHARE * capacity:
        return Finding(WARNING, "memory", f"{text}: tight")
    return Finding(OK, "memory", text)


def _flux_peak(config: Config, backend: str) -> dict:
    # deferred: diffusers at import time (start-up of solrl check; only the FLUX memory model needs it)
    from solrl_core.models.memory import flux_dev_run_peak

    return flux_dev_run_peak(backend, config.model.resolution, explore_chunk=config.explore.chunk,
                             micro_batch=config.train.micro_batch, eval_chunk=config.eval.chunk,
                             rewards=tuple(config.rewards), eval_rewards=tuple(config.eval.rewards),
                             offload_rewards=config.model.offload_rewards,
                             offload_encoders=config.model.offload_encoders)


def output_finding(out: str | None) -> Finding:
    """``--out`` as `solrl run` checks it (a new or empty, writable directory), leaving no trace."""
    if out is None:
        return Finding(OK, "output", "not checked: give --out DIR as to `solrl run`")
    try:
        directory = new_output_directory(out)
        created = [path for path in (directory, *directory.parents) if not path.exists()]
        writable_or_raise(directory)
    except (UserError, ConfigError) as error:
        return Finding(PROBLEM, "output", str(error))
    for path in created:  # deepest first: the preflight leaves the folders it probed as they were
        path.rmdir()
    return Finding(OK, "output", f"{directory} is new and writable")
