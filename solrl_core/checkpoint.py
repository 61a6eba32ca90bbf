"""Checkpoints that let a run resume exactly where it stopped.

One file, ``checkpoint.safetensors`` in the run's output directory, holds everything the next
iteration depends on: the three LoRA adapters ("default", "old", "ema"), the AdamW state, the
optimizer-step counter, the torch RNG states, the accumulated GPU-hours and, as JSON metadata, the
next iteration, the resolved config, the base evaluation, and how many ledger rows and metrics lines
belong to it with a digest of each iteration's rows and of each line, so that an edit which keeps
the row count is caught too. It is written to a temporary file, flushed to disk and renamed into place, so a crash
at any moment leaves either the previous checkpoint or the new one, never half of one.

The ledger and metrics are appended before the checkpoint of their iteration is written; a run
killed in between leaves rows of an iteration the checkpoint does not cover. Resuming drops them
(the resumed run writes them again, identically) and checks that what remains is exactly what the
checkpoint recorded: the counts, then the digests, naming the file and the first iteration that
differs. A metrics line too damaged to read is dropped the same way when the checkpoint does not
cover it, and refused, by file and line, when it does.

The checkpoint also records a sha256 of its own tensors and metadata (:data:`DIGEST_KEY`), as the
final adapter file does of its tensors: a safetensors file checks only its header, so bytes
flipped in the tensor data would otherwise be trained on (or sampled from) silently. Every reader
verifies it (:func:`load_checkpoint`, :func:`load_verified`).

The checkpoint also records which code made it (solrl_core.provenance): the package version and
the numerics fingerprint. A resume under another fingerprint is refused in one line naming both
(:func:`require_same_numerics`) unless the user accepts the change, which the checkpoint then
records in its ``numerics_history`` (:func:`accept_numerics`): one ledger never mixes two numerics
unknowingly.

Everything else a run needs is a pure function of the config and these tensors: seeds, prompts,
noises and training timesteps derive from hashed seeds, and the explorer is requantized from the
"old" adapter on load.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from safetensors import safe_open
from safetensors.torch import load_file, save_file
import torch

from solrl_core import faults
from solrl_core.config import Config, ConfigError, from_dict, parse_override, set_key, to_dict
from solrl_core.distributed import current as current_world, require_same_world
from solrl_core.ledger import LEDGER_FILE, METRICS_FILE, RUN_OUTPUTS, atomic_write, metrics_lines
from solrl_core.mappings import changed_settings
from solrl_core.presets import validate
from solrl_core.provenance import UNRECORDED, describe, numerics_fingerprint, package_version
from solrl_core.run_lock import LOCK_FILE

CHECKPOINT = "checkpoint.safetensors"
FORMAT = 1
_ADAPTERS, _OPTIMIZER, _RNG = "adapters/", "optimizer/", "rng/"
# What a run writes before its first checkpoint (the base evaluation's grid, the MLflow run record,
# temporary files of a checkpoint that was being written): the marks of a run killed that early.
_EARLY_OUTPUTS = ("samples_base.png", "mlflow_run.json", f".{CHECKPOINT}.", ".solrl-write-probe")
# Keys a resumed run may change: how long it runs and whether it draws progress bars.
RESUMABLE_CHANGES = ("iterations", "progress")
# safetensors metadata key of a file's content digest (files written before it have none, and are read unverified).
DIGEST_KEY = "sha256"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message says why and what to do."""


class NonFiniteState(RuntimeError):
    """A non-finite value in the weights or optimizer state: never written to a checkpoint."""


@dataclass
class Checkpoint:
    next_iteration: int
    optimizer_steps: int
    config: dict
    base_eval: dict[str, float]
    gpu_hours: dict[str, float | None]
    # How many ledger rows and metrics lines the checkpoint covers (metadata keys ledger_rows, metrics_lines).
    ledger_row_count: int
    metrics_line_count: int
    tensors: dict[str, torch.Tensor]
    # sha256 of each covered iteration's ledger rows and metrics line; None in checkpoints written
    # before digests were recorded (their counts are still checked).
    digests: dict[str, list[str]] | None = None


# ---------------------------------------------------------------------------------------------
# Writing


def save_checkpoint(out_dir: Path, state, next_iteration: int, base_eval: dict[str, float]) -> Path:
    """Write the checkpoint after ``next_iteration - 1`` (0: after the base evaluation)."""
    # deferred: peft at import time (start-up of every solrl command, which reads checkpoints' metadata)
    from solrl_core.models.adapters import adapter_state

    tensors = {f"{_ADAPTERS}{k}": v for k, v in adapter_state(state.policy.transformer).items()}
    optimizer_tensors, param_groups = _optimizer_tensors(state.optimizer)
    tensors.update(optimizer_tensors)
    tensors.update(_rng_tensors())
    require_finite(tensors)
    accountant = state.accountant
    metadata = {
        "format": FORMAT, "next_iteration": next_iteration, "optimizer_steps": state.optimizer_steps,
        "config": to_dict(state.config), "base_eval": base_eval, "param_groups": param_groups,
        "gpu_hours": {"modeled_cumulative": accountant.modeled_cumulative,
                      "measured_cumulative": accountant.measured_cumulative},
        "world_size": current_world().size,  # resume needs as many ranks (require_resumable_world)
        # which code made it: a resume under other numerics is refused (require_same_numerics)
        "solrl_version": package_version(), "numerics": numerics_fingerprint(state.config),
        "numerics_history": _previous_metadata(out_dir).get("numerics_history", []),
        **_covered_outputs(out_dir),
    }
    path = out_dir / CHECKPOINT

    text = json.dumps(metadata)

    def write(temporary: str) -> None:
        save_file(tensors, temporary, metadata={"solrl": text, DIGEST_KEY: tensors_digest(tensors, text)})
        faults.point("checkpoint")  # written in full, not yet in place

    atomic_write(path, write)
    return path


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list]:
    state_dict = optimizer.state_dict()
    tensors = {}
    for index, per_parameter in state_dict["state"].items():
        for name, value in per_parameter.items():
            if not torch.is_tensor(value):
                raise CheckpointError(f"optimizer state '{name}' is not a tensor; only tensor state is checkpointed")
            tensors[f"{_OPTIMIZER}{index}/{name}"] = value.detach().cpu().contiguous()
    return tensors, state_dict["param_groups"]


def _rng_tensors() -> dict[str, torch.Tensor]:
    tensors = {f"{_RNG}cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for device, rng in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"{_RNG}cuda/{device}"] = rng
    return tensors


def require_finite(tensors: dict[str, torch.Tensor]) -> None:
    for key, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise NonFiniteState(f"{key} holds a non-finite value; the last good checkpoint is kept")


def _covered_outputs(out_dir: Path) -> dict:
    """How many ledger rows and metrics lines the checkpoint covers, and their digests. Only the
    iterations the previous checkpoint did not cover are read and hashed: the earlier digests
    cannot have changed while this process was writing the run."""
    ledger_path, lines = out_dir / LEDGER_FILE, metrics_lines(out_dir / METRICS_FILE)
    previous = _previous_digests(out_dir)
    rows, ledger_digests = 0, list(previous)
    if ledger_path.exists():
        rows = pl.scan_parquet(ledger_path).select(pl.len()).collect().item()
        new = pl.scan_parquet(ledger_path).filter(pl.col("iteration") >= len(previous)).collect()
        ledger_digests += iteration_digests(new, first=len(previous))
    return {"ledger_rows": rows, "metrics_lines": len(lines),
            "digests": {LEDGER_FILE: ledger_digests, METRICS_FILE: [line_digest(line) for line in lines]}}


def _previous_digests(out_dir: Path) -> list[str]:
    return _previous_metadata(out_dir).get("digests", {}).get(LEDGER_FILE, [])


def _previous_metadata(out_dir: Path) -> dict:
    try:
        return read_metadata(out_dir)
    except CheckpointError:  # none yet (the base evaluation's checkpoint)
        return {}


def iteration_digests(ledger: pl.DataFrame, first: int = 0) -> list[str]:
    """sha256 of each iteration's rows, iterations ``first``, ``first + 1``, ... in order: the
    column names and every value as JSON (floats in Python's round-trip form, nulls as null), so
    the digest depends on what the rows hold, not on how Parquet or polars lay them out."""
    if ledger.height == 0:
        return []
    by_iteration = ledger.partition_by("iteration", as_dict=True, maintain_order=True)
    empty = ledger.clear()  # an iteration without rows still gets a digest (of no rows)
    digests = []
    for iteration in range(first, int(ledger["iteration"].max()) + 1):
        rows = by_iteration.get((iteration,), empty)
        text = json.dumps(rows.to_dict(as_series=False), separators=(",", ":"))
        digests.append(hashlib.sha256(text.encode("utf-8")).hexdigest())
    return digests


def line_digest(line: str) -> str:
    return hashlib.sha256(line.encode("utf-8")).hexdigest()


def tensors_digest(tensors: dict[str, torch.Tensor], text: str = "") -> str:
    """sha256 of every tensor's name, dtype, shape and bytes (in name order), then ``text``: what
    a file holds, whatever order safetensors lays it out in."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode("utf-8"))
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    digest.update(text.encode("utf-8"))
    return digest.hexdigest()


def load_verified(path: Path, what: str = "file") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A safetensors file's tensors and metadata, refused in one line (a :class:`CheckpointError`
    naming it) when unreadable or when its content differs from the digest it recorded."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(path))
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise CheckpointError(f"{path} is not a readable {what} ({one_line_error(error)})") from None
    recorded = metadata.get(DIGEST_KEY)
    if recorded is not None and recorded != tensors_digest(tensors, metadata.get("solrl", "")):
        raise CheckpointError(f"{path} is damaged: its contents differ from the digest it recorded when written; "
                              f"restore it from a copy, or start a new run")
    return tensors, metadata


def one_line_error(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


# ---------------------------------------------------------------------------------------------
# Reading and resuming


def read_metadata(out_dir: Path) -> dict:
    """The checkpoint's metadata (cheap: the tensors are not read)."""
    path = out_dir / CHECKPOINT
    if not out_dir.is_dir():
        raise CheckpointError(f"cannot resume: {out_dir} is not a directory")
    if not path.is_file():
        raise CheckpointError(_no_checkpoint(out_dir))
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = json.loads((handle.metadata() or {})["solrl"])
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise CheckpointError(f"cannot resume: {path} is not a readable Sol-RL checkpoint ({error})") from None
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"cannot resume: {path} has format {metadata.get('format')}, this version reads {FORMAT}")
    return metadata


def _no_checkpoint(out_dir: Path) -> str:
    """What to do with a directory that has no checkpoint: a run killed before its first one (it
    writes it after the base evaluation) trained nothing, so it is started again, not resumed."""
    # A lock file a killed run left behind is no output: its lock died with the run.
    names = sorted(entry.name for entry in out_dir.iterdir() if entry.name != LOCK_FILE)
    if not names:
        return f"cannot resume: {out_dir} is empty (no {CHECKPOINT}); start a new run with --out {out_dir}"
    if not any(name.startswith(_EARLY_OUTPUTS) for name in names):
        return (f"cannot resume: {out_dir} has no {CHECKPOINT} and is not a Sol-RL run's output directory; "
                "give the --out of the run to continue, or start a new run")
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return (f"cannot resume: {out_dir} has no {CHECKPOINT}: its run stopped before its first checkpoint (written "
            f"after the base evaluation), so nothing was trained; start a new run: the same command with a new "
            f"--out, or delete what it holds ({shown}) and reuse --out {out_dir}")


def require_resumable_world(out_dir: Path, world_size: int) -> None:
    """A run resumes on as many ranks as it ran on (checkpoints before scale-out: one)."""
    require_same_world(int(read_metadata(out_dir).get("world_size", 1)), world_size, out_dir)


def load_checkpoint(out_dir: Path) -> Checkpoint:
    """The checkpoint, its tensors verified against the digest it recorded."""
    metadata = read_metadata(out_dir)
    tensors = require_intact(out_dir)
    return Checkpoint(next_iteration=metadata["next_iteration"], optimizer_steps=metadata["optimizer_steps"],
                      config=metadata["config"], base_eval=metadata["base_eval"], gpu_hours=metadata["gpu_hours"],
                      ledger_row_count=metadata["ledger_rows"], metrics_line_count=metadata["metrics_lines"],
                      digests=metadata.get("digests"), tensors=tensors | {"_param_groups": metadata["param_groups"]})


def require_intact(out_dir: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, refused in one line when they differ from its recorded digest
    (the CLI checks before Prefect starts; the training loop checks what it loads)."""
    try:
        return load_verified(out_dir / CHECKPOINT, "Sol-RL checkpoint")[0]
    except CheckpointError as error:
        raise CheckpointError(f"cannot resume: {error}") from None


def resume_config(out_dir: Path, overrides: list[tuple[str, object]]) -> Config:
    """The checkpointed run's config with the user's overrides, which may only extend or shorten
    the run (``iterations``) or toggle progress bars: anything else would not be a continuation."""
    metadata = read_metadata(out_dir)
    saved = validate(from_dict(metadata["config"]))
    config = copy.deepcopy(saved)
    for key, value in overrides:
        set_key(config, key, value)
    changed = [key for key in changed_settings(to_dict(saved), to_dict(config)) if key not in RESUMABLE_CHANGES]
    if changed:
        raise ConfigError(f"--resume continues the checkpointed config; these overrides would change it: "
                          f"{', '.join(changed)} (only {', '.join(RESUMABLE_CHANGES)} may change)")
    if config.iterations < metadata["next_iteration"]:
        raise ConfigError(f"iterations ({config.iterations}) is below the {metadata['next_iteration']} "
                          f"iterations the checkpoint has already run")
    return validate(config)


def resumed_run(resume: str, preset: str | None, family: str | None, iterations: int | None,
                overrides: list[str] | None, accept_numerics_change: bool = False) -> tuple[Config, Path]:
    """The checkpointed run in ``resume`` and its config; ``preset``/``family``, when given, must
    be the run's own, ``overrides`` (``key=value`` texts) may only change ``iterations``, and the
    numerics must be the checkpoint's unless ``accept_numerics_change``."""
    out_dir = Path(resume).expanduser().resolve()
    pairs = [parse_override(text) for text in overrides or []]
    if iterations is not None:
        pairs.append(("iterations", iterations))
    config = resume_config(out_dir, pairs)
    for name, given in (("preset", preset), ("family", family)):
        if given is not None and given != getattr(config, name):
            raise ConfigError(f"--resume: the run in {out_dir} is {name} '{getattr(config, name)}', not '{given}'")
    if not accept_numerics_change:
        require_same_numerics(out_dir, config)
    return config, out_dir


def numerics_change(out_dir: Path, config: Config) -> tuple[dict, dict] | None:
    """(recorded, current) numerics fingerprints when a resume of ``config`` would change them."""
    recorded = read_metadata(out_dir).get("numerics") or UNRECORDED
    current = numerics_fingerprint(config)
    return None if recorded == current else (recorded, current)


def require_same_numerics(out_dir: Path, config: Config) -> None:
    change = numerics_change(out_dir, config)
    if change is None:
        return
    version = read_metadata(out_dir).get("solrl_version")
    raise CheckpointError(
        f"cannot resume: {out_dir} was written under {describe(change[0])} by "
        f"{f'solrl {version}' if version else 'an earlier solrl'}, this code (solrl {package_version()}) runs "
        f"{describe(change[1])}; resuming would mix the two in one ledger: start a new run, or continue it knowingly "
        f"with `solrl run --resume {out_dir} --accept-numerics-change`")


def accept_numerics(out_dir: Path, config: Config) -> bool:
    """Record in the checkpoint that the run continues under this code's numerics: the fingerprint
    becomes the current one and the one it replaces joins ``numerics_history`` with the iteration
    it ended before. False (nothing written) when the numerics did not change."""
    change = numerics_change(out_dir, config)
    if change is None:
        return False
    metadata, tensors = read_metadata(out_dir), require_intact(out_dir)
    history = [*metadata.get("numerics_history", []),
               {"before_iteration": metadata["next_iteration"], "numerics": change[0],
                "solrl_version": metadata.get("solrl_version", "unknown")}]
    text = json.dumps({**metadata, "numerics": change[1], "solrl_version": package_version(),
                       "numerics_history": history})
    atomic_write(out_dir / CHECKPOINT, lambda temporary: save_file(
        tensors, temporary, metadata={"solrl": text, DIGEST_KEY: tensors_digest(tensors, text)}))
    return True


def restore(state, checkpoint: Checkpoint) -> None:
    """Put the checkpointed adapters, optimizer state, counters and RNG states into a fresh run state."""
    # deferred: peft at import time (start-up of every solrl command, as above)
    from solrl_core.models.adapters import load_adapter_state

    tensors = checkpoint.tensors
    load_adapter_state(state.policy.transformer,
                       {k.removeprefix(_ADAPTERS): v for k, v in tensors.items() if k.startswith(_ADAPTERS)})
    optimizer_state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith(_OPTIMIZER):
            index, name = key.removeprefix(_OPTIMIZER).split("/", 1)
            optimizer_state.setdefault(int(index), {})[name] = value
    state.optimizer.load_state_dict({"state": optimizer_state, "param_groups": tensors["_param_groups"]})
    state.optimizer_steps = checkpoint.optimizer_steps
    torch.set_rng_state(tensors[f"{_RNG}cpu"])
    cuda_states = sorted(k for k in tensors if k.startswith(f"{_RNG}cuda/"))
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda_states])
    accountant = state.accountant
    accountant.modeled_cumulative = checkpoint.gpu_hours["modeled_cumulative"]
    accountant.measured_cumulative = checkpoint.gpu_hours["measured_cumulative"]


def require_resumable(out_dir: Path) -> None:
    """What a resume will read, checked before Prefect starts: the checkpoint's tensors against
    their digest, then the ledger and metrics it covers (damaged or edited: one line now, not
    after the orchestration has started; what lies past the checkpoint is dropped, as the run
    itself would, so its own check finds nothing left to do)."""
    checkpoint = load_checkpoint(out_dir)
    discard_temporaries(out_dir)
    rewind_outputs(out_dir, checkpoint)


def rewind_outputs(out_dir: Path, checkpoint: Checkpoint) -> list[dict]:
    """Drop ledger rows and metrics lines of iterations after the checkpoint; return the metrics
    records that remain. Raises when what remains is not what the checkpoint recorded."""
    ledger_path, metrics_path = out_dir / LEDGER_FILE, out_dir / METRICS_FILE
    kept = pl.DataFrame()
    ledger = _readable_ledger(ledger_path, checkpoint)
    if ledger is not None:
        kept = ledger.filter(pl.col("iteration") < checkpoint.next_iteration)
        if kept.height != ledger.height:
            atomic_write(ledger_path, lambda temporary: kept.write_parquet(temporary))
    rows = kept.height
    lines = metrics_lines(metrics_path)
    covered = [(line, record) for line, record in _readable_records(metrics_path, lines, checkpoint)
               if record["iteration"] < checkpoint.next_iteration]
    records = [record for _, record in covered]
    if rows != checkpoint.ledger_row_count or len(records) != checkpoint.metrics_line_count:
        raise CheckpointError(
            f"cannot resume: {out_dir} has {rows} ledger rows and {len(records)} metrics lines up to iteration "
            f"{checkpoint.next_iteration - 1}, the checkpoint recorded {checkpoint.ledger_row_count} and "
            f"{checkpoint.metrics_line_count}: the outputs were changed outside the run")
    if checkpoint.digests is not None:
        _require_recorded(ledger_path, iteration_digests(kept), checkpoint.digests[LEDGER_FILE], "rows", "differ")
        _require_recorded(metrics_path, [line_digest(line) for line, _ in covered], checkpoint.digests[METRICS_FILE],
                          "line", "differs", iterations=[record["iteration"] for record in records])
    if len(covered) != len(lines):
        text = "".join(line + "\n" for line, _ in covered)
        atomic_write(metrics_path, lambda temporary: Path(temporary).write_text(text, encoding="utf-8"))
    return records


def _readable_ledger(path: Path, checkpoint: Checkpoint) -> pl.DataFrame | None:
    """The ledger, or None when there is none to keep: absent, or unreadable while the checkpoint
    covers none of its rows (then it is dropped like any uncovered row). Unreadable with rows
    the checkpoint covers, it is refused: those rows cannot be rewritten."""
    if not path.exists():
        return None
    try:
        return pl.read_parquet(path)
    except Exception as error:  # noqa: BLE001 - polars raises several kinds for a damaged file
        if checkpoint.ledger_row_count == 0:
            path.unlink()
            return None
        raise CheckpointError(f"cannot resume: {path} is damaged ({one_line_error(error)}) and holds the "
                              f"{checkpoint.ledger_row_count} rows the checkpoint covers; restore it from a "
                              f"copy, or start a new run") from None


def _readable_records(path: Path, lines: list[str], checkpoint: Checkpoint) -> list[tuple[str, dict]]:
    """(line, record) of each metrics line. A line that is no JSON record (a write cut short) past
    the lines the checkpoint covers is dropped like any uncovered line; inside them it is refused,
    naming the file and the line."""
    readable = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("iteration"), int):
                raise ValueError("not a metrics record")
        except ValueError:
            if number > checkpoint.metrics_line_count:
                continue
            raise CheckpointError(f"cannot resume: line {number} of {path} is damaged (not a complete metrics "
                                  f"record) and the checkpoint covers it; restore the file from a copy, or start "
                                  f"a new run") from None
        readable.append((line, record))
    return readable


def _require_recorded(path: Path, found: list[str], recorded: list[str], what: str, verb: str,
                      iterations: list[int] | None = None) -> None:
    """Raise naming ``path`` and the first iteration whose digest differs from the recorded one."""
    for index, (digest, expected) in enumerate(zip(found, recorded)):
        if digest != expected:
            iteration = iterations[index] if iterations is not None else index
            raise CheckpointError(
                f"cannot resume: the {what} of iteration {iteration} in {path} {verb} from what the checkpoint "
                f"recorded: the outputs were changed outside the run; restore the file or start a new run")
    if len(found) != len(recorded):  # iterations without rows: the counts agreed, the layout did not
        raise CheckpointError(f"cannot resume: {path} holds {len(found)} iterations, the checkpoint recorded "
                              f"{len(recorded)}: the outputs were changed outside the run")


def discard_temporaries(out_dir: Path) -> None:
    """Remove temporary files a killed run left behind (``.<name>.<random>`` beside each output)."""
    for name in (CHECKPOINT, *RUN_OUTPUTS):
        for leftover in out_dir.glob(f".{name}.*"):
            leftover.unlink(missing_ok=True)
