"""The ``solrl`` training flow: ``solrl_core.training.run_training`` with every stage run as a
Prefect task and an MLflow observer. The loop itself lives in solrl_core; this only wires it.

Run it with ``solrl run`` (Prefect's ephemeral mode, no server to set up) or as a deployment
(``prefect deployment run solrl/shapes-tiny``, see prefect.yaml).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.runtime import deployment, flow_run

from solrl_core.checkpoint import resume_config
from solrl_core.config import Config, ConfigError, parse_override
from solrl_core.presets import resolve_config
from solrl_core.training import run_training
from tasks.runner import PrefectStageRunner, quiet_task_logs


def resolve(preset: str, family: str, iterations: int | None, overrides: list[str] | None) -> Config:
    """The same resolution as ``solrl run``: defaults -> preset -> family -> ``key=value`` overrides."""
    pairs = [parse_override(text) for text in overrides or []]
    if iterations is not None:
        pairs.append(("iterations", iterations))
    return resolve_config(preset, family, pairs)


def output_directory(out: str | None, config: Config) -> Path:
    """``out``, or ``runs/<preset>/<family>/<flow run name>``; it must be new or empty."""
    path = Path(out or f"runs/{config.preset}/{config.family}/{flow_run.get_name() or 'local'}").expanduser().resolve()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"output directory {path} is not a new or empty directory; choose a new out")
    return path


def resumed(resume: str, preset: str | None, family: str | None, iterations: int | None,
            overrides: list[str] | None) -> tuple[Config, Path]:
    """The checkpointed run in ``resume`` and its config; ``preset``/``family``, when given, must
    be the run's own, and ``overrides`` may only change ``iterations`` (see solrl_core.checkpoint)."""
    out_dir = Path(resume).expanduser().resolve()
    pairs = [parse_override(text) for text in overrides or []]
    if iterations is not None:
        pairs.append(("iterations", iterations))
    config = resume_config(out_dir, pairs)
    for name, given in (("preset", preset), ("family", family)):
        if given is not None and given != getattr(config, name):
            raise ConfigError(f"--resume: the run in {out_dir} is {name} '{getattr(config, name)}', not '{given}'")
    return config, out_dir


@flow(name="solrl", persist_result=False, log_prints=False, validate_parameters=True)
def solrl(preset: str | None = None, family: str | None = None, iterations: int | None = None,
          overrides: list[str] | None = None, out: str | None = None, tracking: bool = True,
          tracking_uri: str | None = None, resume: str | None = None) -> dict:
    """Train one family on one preset (default ``shapes-tiny`` / ``sol_rl``).

    ``overrides`` are ``key=value`` strings exactly as ``solrl run -S`` takes them (YAML values).
    ``tracking`` logs the run to MLflow (``tracking_uri``, default ``sqlite:///mlflow.db`` in the
    working directory). ``resume``: the output directory of an interrupted run, continued from its
    checkpoint (``out`` is then not used).
    """
    if resume:
        config, out_dir = resumed(resume, preset, family, iterations, overrides)
        return train(config, out_dir, tracking, tracking_uri, resume=True)
    config = resolve(preset or "shapes-tiny", family or "sol_rl", iterations, overrides)
    return train(config, output_directory(out, config), tracking, tracking_uri)


def train(config: Config, out_dir: Path, tracking: bool = True, tracking_uri: str | None = None,
          observers: list | tuple = (), resume: bool = False) -> dict:
    """The body of a training flow run: every stage as a task, MLflow (when ``tracking``) and any
    further ``observers`` watching. Call it inside a flow run."""
    logger = get_run_logger()
    quiet_task_logs()
    mlflow = None
    if tracking:
        from solrl_core.tracking import MlflowObserver

        tags = {"prefect.flow_run_id": str(flow_run.get_id() or ""), "prefect.flow_run_name": flow_run.get_name() or "",
                "prefect.deployment": deployment.get_name() or ""}
        mlflow = MlflowObserver(tracking_uri, run_name=flow_run.get_name(), tags={k: v for k, v in tags.items() if v},
                                log=logger.info)
    watching = [mlflow, *observers] if mlflow else list(observers)
    try:
        summary = run_training(config, out_dir, log=logger.info, runner=PrefectStageRunner(logger.info),
                               observers=watching, resume=resume)
    except BaseException:
        if mlflow:
            mlflow.finish("FAILED")
        raise
    if mlflow:
        summary["mlflow"] = {"run_id": mlflow.run_id, "tracking_uri": mlflow.tracking_uri, "ui": mlflow.ui,
                             "x_axis": mlflow.x_axis}
    logger.info(f"wrote {out_dir}")
    return summary


def run_locally(**parameters) -> dict:
    """The flow in this process, as ``solrl run`` uses it: Prefect's ephemeral server when no
    ``PREFECT_API_URL`` is set. Run logs go to stdout like the rest of the run's output, so stderr
    keeps only errors; a missing model file is reported by the caller in one line, not as
    Prefect's traceback."""
    _console_to(_CurrentStdout())
    return solrl(**parameters)


class _CurrentStdout:
    """Whatever ``sys.stdout`` is at each write (a test's capture, a redirected stream)."""

    def __getattr__(self, name):
        return getattr(sys.stdout, name)


class _DropUserErrorTracebacks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        from solrl_core.models.loading import ModelFilesMissing

        from solrl_core.checkpoint import CheckpointError
        from solrl_core.config import ConfigError

        # User errors get one line from the CLI; Prefect's copy of their traceback is noise.
        return not (record.exc_info and isinstance(record.exc_info[1], (ModelFilesMissing, CheckpointError,
                                                                        ConfigError)))


def _console_to(stream) -> None:
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [logger for logger in logging.root.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    for logger in loggers:  # every console handler Prefect set up, wherever it hangs
        for handler in logger.handlers:
            if isinstance(handler, PrefectConsoleHandler):
                with handler.lock:  # not setStream: it flushes the old stream, which may be closed
                    handler.stream = stream
                handler.console.file = stream
                if not any(isinstance(f, _DropUserErrorTracebacks) for f in handler.filters):
                    handler.addFilter(_DropUserErrorTracebacks())
