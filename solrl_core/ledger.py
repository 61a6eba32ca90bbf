"""The seed ledger (one Parquet row per explored seed) and atomic writes of run outputs.

A non-finite reward (a reward model that failed on an image) is stored as null, never as NaN: a
null is visibly missing, a NaN silently poisons every mean computed over the column.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from collections.abc import Callable
from typing import Any

import math

import polars as pl
import torch

from solrl_core import faults

LEDGER_FILE, METRICS_FILE, SUMMARY_FILE = "ledger.parquet", "metrics.jsonl", "summary.json"
LORA_FILE = "lora.safetensors"  # the final LoRA adapters (trained, old, EMA): a DVC-tracked output
RUN_OUTPUTS = (LEDGER_FILE, METRICS_FILE, SUMMARY_FILE, LORA_FILE)


def ledger_frame(iteration: int, prompts: list[str], prompt_ids: list[int], seeds: torch.Tensor,
                 explore_scores: dict[str, torch.Tensor], explore_combined: torch.Tensor, selection: torch.Tensor,
                 fp_scores: dict[str, torch.Tensor] | None, fp_combined: torch.Tensor | None,
                 advantages: torch.Tensor, update_steps: torch.Tensor | None = None) -> pl.DataFrame:
    """Rows for one iteration: every seed of every group; kept seeds carry full-precision rewards
    (when they have them), their advantage and the optimizer step of the iteration they trained in
    (``update_step``, 0-based; null for a seed not kept or not trained on), the rest nulls."""
    groups, pool = seeds.shape
    selected = torch.zeros(groups, pool, dtype=torch.bool)
    selected.scatter_(1, selection, True)
    columns: dict[str, Any] = {
        "iteration": [iteration] * (groups * pool),
        "prompt_id": [pid for pid in prompt_ids for _ in range(pool)],
        "prompt": [p for p in prompts for _ in range(pool)],
        "seed": seeds.flatten().tolist(),
        "explore_reward": _finite_or_null(explore_combined.flatten().double().tolist()),
    }
    for name, values in explore_scores.items():
        columns[f"explore_{name}"] = _finite_or_null(values.flatten().double().tolist())
    columns["selected"] = selected.flatten().tolist()
    columns["fp_reward"] = _scatter_kept(fp_combined, selection, pool)
    for name in explore_scores:
        columns[f"fp_{name}"] = _scatter_kept(fp_scores.get(name) if fp_scores else None, selection, pool)
    columns["advantage"] = _scatter_kept(advantages, selection, pool)
    columns["update_step"] = _scatter_kept(update_steps, selection, pool, _step_or_null)
    float_columns = [name for name in columns if name.startswith(("explore_", "fp_")) or name == "advantage"]
    schema = {**{name: pl.Float64 for name in float_columns}, "iteration": pl.Int32, "prompt_id": pl.Int32, "prompt": pl.String, "seed": pl.Int64, "selected": pl.Boolean,
              "update_step": pl.Int32}
    return pl.DataFrame(columns, schema_overrides=schema)


def _scatter_kept(values: torch.Tensor | None, selection: torch.Tensor, pool: int,
                  convert: Callable[[Any], Any] | None = None) -> list:
    """A column of every seed's row: the kept seeds' ``values`` ([P, K], in selection order)
    through ``convert`` (a finite float or null by default), nulls elsewhere."""
    convert = convert or _finite_float
    groups = selection.shape[0]
    rows: list = [None] * (groups * pool)
    if values is None or values.numel() == 0:
        return rows
    kept = values.reshape(groups, -1)
    for g in range(groups):
        for k, index in enumerate(selection[g].tolist()):
            rows[g * pool + index] = convert(kept[g, k])
    return rows


def _finite_float(value: torch.Tensor) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def _step_or_null(value: torch.Tensor) -> int | None:
    step = int(value)
    return step if step >= 0 else None  # -1: kept but trained in no step (its reward was not finite)


def _finite_or_null(values: list[float]) -> list[float | None]:
    return [value if math.isfinite(value) else None for value in values]


def append_ledger(path: Path, frame: pl.DataFrame) -> None:
    """Append by rewriting to a temporary file and renaming: the ledger is never half-written."""
    combined = pl.concat([pl.read_parquet(path), frame], how="vertical_relaxed") if path.exists() else frame
    atomic_write(path, lambda temporary: combined.write_parquet(temporary))


def write_json(path: Path, payload: Any) -> None:
    text = json.dumps(payload, indent=2, sort_keys=False, default=_json_default) + "\n"
    atomic_write(path, lambda temporary: Path(temporary).write_text(text, encoding="utf-8"))


def append_jsonl(path: Path, record: dict) -> None:
    previous = path.read_text(encoding="utf-8") if path.exists() else ""
    text = previous + json.dumps(record, default=_json_default) + "\n"
    atomic_write(path, lambda temporary: Path(temporary).write_text(text, encoding="utf-8"))


def metrics_lines(path: Path) -> list[str]:
    """The lines of a metrics.jsonl (one JSON record per iteration); none when there is no file."""
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in metrics_lines(path)]


def atomic_write(path: Path, write) -> None:
    """``write(temporary_path)``, flush it to disk, then rename it over ``path``.

    A crash at any point leaves the previous file (or none) in place, never a partial one; the
    temporary file is removed when ``write`` fails.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(descriptor)
    try:
        _write_naming_a_full_disk(write, temporary, path)
        faults.point(f"write:{path.name}")
        _fsync(temporary)
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno is not None and error.filename is None:
            error.filename = str(path)  # the output that could not be written, for the one-line error
        raise
    fsync_directory(path.parent)


def _write_naming_a_full_disk(write, temporary: str, path: Path) -> None:
    """``write(temporary)``; a full disk, which safetensors and polars report as errors of their own
    ("... No space left on device (os error 28)"), raised as the OSError it is, naming ``path``:
    the CLI's one line for a full disk, whichever library was writing."""
    try:
        write(temporary)
    except OSError:
        raise
    except Exception as error:
        if not _says_disk_full(str(error)):
            raise
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from error


def _says_disk_full(message: str) -> bool:
    return f"os error {errno.ENOSPC})" in message or os.strerror(errno.ENOSPC) in message


def _fsync(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_directory(directory: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _json_default(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
