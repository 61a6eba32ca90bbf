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

from flows import api_watch
from flows.api_watch import ApiWatch
from flows.deployment_advice import advice_for_this_run
from solrl_core.checkpoint import resumed_run
from solrl_core.config import Config, ConfigError, parse_override
from solrl_core.distributed import DEFAULT_TIMEOUT_S, under_torchrun
from solrl_core.launch import Launch, checked
from solrl_core.presets import resolve_config
from solrl_core.recipes import merged
from solrl_core.run_lock import LOCK_FILE
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
    # A lock file a killed run left behind is no output (its lock died with it).
    if path.exists() and (not path.is_dir() or any(entry.name != LOCK_FILE for entry in path.iterdir())):
        raise ValueError(f"output directory {path} is not a new or empty directory; choose a new out")
    return path


@flow(name="solrl", persist_result=False, log_prints=False, validate_parameters=True)
def solrl(preset: str | None = None, family: str | None = None, iterations: int | None = None,
          overrides: list[str] | None = None, out: str | None = None, tracking: bool = True,
          tracking_uri: str | None = None, resume: str | None = None, nproc_per_node: int = 1,
          nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
          rank_timeout: float = DEFAULT_TIMEOUT_S, keep_eval_images: bool = False,
          config_file: str | None = None) -> dict:
    """Train one family on one preset (default ``shapes-tiny`` / ``sol_rl``).

    ``overrides`` are ``key=value`` strings exactly as ``solrl run -S`` takes them (YAML values).
    ``tracking`` logs the run to MLflow (``tracking_uri``, default ``sqlite:///mlflow.db`` in the
    working directory). ``resume``: the output directory of an interrupted run, continued from its
    checkpoint (``out`` is then not used).

    ``nproc_per_node`` > 1 (or ``nnodes`` > 1) starts torchrun from this flow run: rank 0 runs every
    stage as a task run of this flow run, the other ranks the same loop unreported (see
    solrl_core/distributed.py; the multi-node settings are those of `solrl run`).

    ``config_file``: a YAML config as `solrl run --config` takes it (relative to the flow run's
    working folder), merged after the preset and family and before ``overrides``.

    ``keep_eval_images`` also writes the base and latest evaluation images as `solrl compare`
    does, so that a comparison reuses the run (a sweep's point, flows/sweep.py; one rank only).
    """
    from solrl_core.models.loading import ModelFilesMissing

    if config_file and resume:
        raise ConfigError("config_file: a resumed run continues with its own config; leave config_file out")
    # The file becomes overrides ahead of the given ones, as on the command line: every later
    # step (torchrun's ranks included) resolves the same config from plain key=value settings.
    preset, family, overrides = merged(config_file or None, preset, family, overrides or [], iterations)
    launch = checked(Launch(nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                            rdzv_endpoint=rdzv_endpoint, rank_timeout=rank_timeout))
    trainer = train
    if keep_eval_images:
        if launch.needs_torchrun:
            raise ConfigError("keep_eval_images is for one-rank runs (a sweep's points); leave nproc_per_node at 1")

        def trainer(config, out_dir, tracking, tracking_uri, resume=False):
            return train(config, out_dir, tracking, tracking_uri, [evaluation_images(out_dir, resume)], resume=resume)
    if launch.needs_torchrun and not under_torchrun():
        def trainer(config, out_dir, tracking, tracking_uri, resume=False):  # torchrun's ranks train
            return train_on_ranks(launch, config, out_dir, overrides or [], tracking, tracking_uri, resume)

    try:
        if resume:
            config, out_dir = resumed_run(resume, preset, family, iterations, overrides)
            return trainer(config, out_dir, tracking, tracking_uri, resume=True)
        config = resolve(preset or "shapes-tiny", family or "sol_rl", iterations, overrides)
        return trainer(config, output_directory(out, config), tracking, tracking_uri)
    except ModelFilesMissing as missing:  # a deployment's flow run: advice in its parameters' terms
        raise advice_for_this_run(missing) from None


def evaluation_images(out_dir: Path, resume: bool):
    """The observer `solrl compare` trains with, keeping the images its report reads."""
    from safetensors.torch import load_file

    from solrl_core.compare import EVAL_IMAGES, _EvaluationImages  # compare's own format, one writer

    kept = load_file(str(out_dir / EVAL_IMAGES)) if resume and (out_dir / EVAL_IMAGES).is_file() else None
    return _EvaluationImages(out_dir, kept)


def train_on_ranks(launch: Launch, config: Config, out_dir: Path, overrides: list[str], tracking: bool,
                   tracking_uri: str | None, resume: bool) -> dict:
    """torchrun with ``launch``'s ranks, started from this flow run and reporting into it; returns
    the run's summary.

    Rank 0 gets this flow run's context (``prefect.context.serialize_context``, the context that
    ``with_context`` carries to other processes) as JSON in a file named by SOLRL_PREFECT_CONTEXT,
    and runs ``train`` inside it: its stage tasks are then task runs of this flow run. JSON, not
    pickle: nothing read back can run code. The one object in it that JSON cannot hold, the flow,
    is this module's own ``solrl`` flow, which rank 0 imports."""
    import json
    import tempfile

    from prefect.context import serialize_context
    from pydantic_core import to_jsonable_python

    from solrl_core import launch as launching
    from solrl_core import run_lock
    from solrl_core.checkpoint import require_resumable_world
    from solrl_core.distributed import require_shardable
    from solrl_core.ledger import SUMMARY_FILE

    require_shardable(config, launch.world_size)
    if resume:
        require_resumable_world(out_dir, launch.world_size)
    launching.check_reachable(launch)
    # The ranks resolve the same config: the same preset, family and overrides (resume: its own).
    arguments = launching.run_arguments(config.preset, config.family, [] if resume else overrides,
                                        config.iterations, out=None if resume else out_dir,
                                        resume=out_dir if resume else None, tracking=tracking,
                                        tracking_uri=tracking_uri)
    with tempfile.TemporaryDirectory(prefix="solrl-ranks-") as folder:
        context = Path(folder) / "prefect-context.json"
        serialized = serialize_context()
        serialized.get("flow_run_context", {}).pop("flow", None)
        context.write_text(json.dumps(to_jsonable_python(serialized)), encoding="utf-8")
        # A flow run started by `solrl run` holds the folder already: rank 0 writes under its lock.
        outcome = launching.start(launch, arguments, {launching.PREFECT_CONTEXT_VARIABLE: str(context),
                                                      **run_lock.environment_for_children(out_dir)})
    if outcome.returncode != 0:
        sys.stdout.write(outcome.stderr[-4000:])  # into the flow run's log, for whoever reads it
        raise RuntimeError(outcome.rank_error or f"torchrun exited with code {outcome.returncode}")
    return json.loads((out_dir / SUMMARY_FILE).read_text())


def train_in_flow_context(context_file: Path, config: Config, out_dir: Path, tracking: bool,
                          tracking_uri: str | None, resume: bool) -> dict:
    """Rank 0 of a torchrun job a flow run started: ``train`` inside the context that flow run
    wrote (see ``train_on_ranks``), so every stage is a task run of that flow run. The task runs'
    events and logs reach the server as the rank's process exits (Prefect drains its event and log
    workers at exit; the deployment test checks that they arrive)."""
    import json

    from prefect.context import hydrated_context

    serialized = json.loads(context_file.read_text(encoding="utf-8"))
    if serialized.get("flow_run_context"):
        serialized["flow_run_context"]["flow"] = solrl
    with hydrated_context(serialized):
        return train(config, out_dir, tracking, tracking_uri, resume=resume)


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
    api = ApiWatch.for_this_flow_run(out_dir)  # a server lost mid-run: the stages go on without it
    try:
        summary = run_training(config, out_dir, log=logger.info, runner=PrefectStageRunner(logger.info, api),
                               observers=watching, resume=resume)
    except BaseException as ended:
        if mlflow:  # Ctrl-C or SIGTERM: KILLED, as MLflow names a run stopped from outside
            mlflow.finish("KILLED" if _is_stop_signal(ended) else "FAILED")
        raise
    if mlflow:
        summary["mlflow"] = {"run_id": mlflow.run_id, "tracking_uri": mlflow.tracking_uri, "ui": mlflow.ui,
                             "x_axis": mlflow.x_axis, "lost": mlflow.lost}
    logger.info(f"wrote {out_dir}")
    api.finished(summary)
    return summary


def _is_stop_signal(error: BaseException) -> bool:
    """A stop (solrl_core.interrupts), SIGTERM also as Prefect's engine raises it in a flow run."""
    from prefect.exceptions import TerminationSignal

    from solrl_core import interrupts

    return interrupts.is_stop_signal(error, also=(TerminationSignal,))


def run_locally(**parameters) -> dict:
    """The flow in this process, as ``solrl run`` uses it: Prefect's ephemeral server when no
    ``PREFECT_API_URL`` is set. Run logs go to stdout like the rest of the run's output, so stderr
    keeps only errors; a missing model file is reported by the caller in one line, not as
    Prefect's traceback. The ephemeral server ends with this process, even when it is killed.
    A server lost mid-run does not fail the run: it ends with its summary after one warning line
    (flows/api_watch.py)."""
    from flows.ephemeral_server import end_server_with_this_process

    _console_to(_CurrentStdout())
    end_server_with_this_process()
    try:
        return solrl(**parameters)
    except Exception as error:
        finished = api_watch.finished_flow_run()
        if finished is None:  # the run itself failed
            raise
        # The training is done and written; only the engine's closing report to a lost server failed.
        return finished.closing_report_failed(error)
    finally:
        api_watch.forget()


class _CurrentStdout:
    """Whatever ``sys.stdout`` is at each write (a test's capture, a redirected stream)."""

    def __getattr__(self, name):
        return getattr(sys.stdout, name)


class _DropUserErrorTracebacks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        import errno

        from solrl_core.models.loading import ModelFilesMissing

        from solrl_core.checkpoint import CheckpointError
        from solrl_core.command_errors import UserError
        from solrl_core.config import ConfigError

        # User errors and a full disk get one line from the CLI; Prefect's copy of their traceback
        # is noise (a full disk's is no bug to report: the line names the file and the cause).
        error = record.exc_info[1] if record.exc_info else None
        full_disk = isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
        # After the flow body returned, a failure is the engine's closing report to a lost server:
        # one warning line says so (flows/api_watch.py), not Prefect's traceback.
        report_failed = error is not None and api_watch.finished_flow_run() is not None
        return not (full_disk or report_failed
                    or isinstance(error, (ModelFilesMissing, CheckpointError, ConfigError, UserError)))


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
