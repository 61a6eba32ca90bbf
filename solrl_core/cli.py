"""The `solrl` command: run, check, config, presets, families, pretrain, sample, export, fidelity, compare,
study (the DVC study's stages), sweep.

User errors (bad config, unknown names, missing model files, an unwritable output directory, a
checkpoint that cannot be resumed) end with exit code 2 and one line on stderr, before anything is
written. A run that fails after it started (a stage failing past its retries, a full disk, a
non-finite weight) ends with exit code 1 and one line saying where its last good checkpoint is.
Ctrl-C and SIGTERM stop it within seconds with exit code 130 / 143 and one line saying how far its
checkpoint got and how to resume (solrl_core.interrupts).

`--config FILE` (run, check, config) is a recipe (solrl_core.recipes): what `solrl config` prints,
merged after the preset and family and before `-S`, so `-S` wins.

A flag that is short for a setting (`--iterations N` for `-S iterations=N`, `solrl compare --device D`
for `-S accounting.device=D`) may be given beside that setting only with the same value: a conflict
is a user error, not one of them silently winning.

`solrl run` trains through the Prefect flow and `solrl sweep` runs the sweep flow, which this
library does not import: the console script (flows/cli.py) passes their entry points in as
:class:`FlowRunners`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from solrl_core import distributed, interrupts
from solrl_core import launch as launching
from solrl_core import recipes, run_lock
from solrl_core.checkpoint import (CheckpointError, accept_numerics, read_metadata, require_intact,
                                   require_resumable, require_resumable_world, resumed_run)
from solrl_core.cli_studies import STUDY_COMMANDS, add_study_commands, one_value_each, output_path, with_flag
from solrl_core.command_errors import RUN_FAILED, USER_ERROR, RunFailed, UserError
from solrl_core.config import ConfigError, config_keys, one_line, parse_override, to_yaml
from solrl_core.export import add_arguments as add_export_arguments
from solrl_core.export import command_export
from solrl_core.interrupts import RunInterrupted
from solrl_core.launch import PREFECT_CONTEXT_VARIABLE, from_arguments
from solrl_core.launch import add_arguments as add_scale_out_arguments
from solrl_core.output_folder import new_output_directory, writable_or_raise
from solrl_core.models.loading import ModelFilesMissing  # model and reward-model files alike
from solrl_core.models.registry import check_model_files, resolve_device
from solrl_core.numerics import flush_denormals
from solrl_core.preflight import preflight, problems, report
from solrl_core.presets import FAMILIES, PRESETS, resolve_config
from solrl_core.quant.backends import BackendUnavailable, check_runs_here
from solrl_core.report import print_summary
from solrl_core.rewards.registry import check_reward_files
from solrl_core.sample import add_arguments as add_sample_arguments
from solrl_core.sample import command_sample
from solrl_core.world import SHAPES_TINY_CHECKPOINT

__all__ = ["FlowRunners", "RUN_FAILED", "USER_ERROR", "RunFailed", "UserError", "main"]
# Set before Prefect or MLflow is imported: no telemetry (nothing outside this machine is
# reachable), no hub downloads, and time for Prefect's ephemeral server to start on a busy machine.
QUIET_ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                     "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1",
                     "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"}
# Bounded retries of a Prefect API call (2 s, then 4 s; Prefect's default 5 retries wait a minute):
# a run whose server was lost finishes without it (flows/api_watch.py), and the flow run's closing
# report to that server is then the one call left to fail.
BOUNDED_RETRIES = {"PREFECT_CLIENT_MAX_RETRIES": "2"}


@dataclass(frozen=True)
class FlowRunners:
    """The orchestration side of `solrl run`, passed in by flows/cli.py (the console script):
    ``run_locally(**parameters) -> summary`` runs the Prefect flow in this process (Prefect's
    ephemeral server unless PREFECT_API_URL is set); ``train_in_flow_context(context_file, config,
    out_dir, tracking=, tracking_uri=, resume=)`` runs rank 0 of a torchrun job started by a
    deployment's flow run, reporting into that flow run; ``sweep(**parameters) -> result`` runs
    the sweep flow (flows/sweep.py)."""

    run_locally: Callable[..., dict]
    train_in_flow_context: Callable[..., None]
    sweep: Callable[..., dict] | None = None


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise UserError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="solrl", description="Sol-RL: quantized exploration, full-precision training.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    run = commands.add_parser("run", help="train with one family on one preset")
    _add_config_arguments(run)
    run.add_argument("--iterations", type=int,
                     help="iterations to run (short for -S iterations=N; giving both, they must agree)")
    run.add_argument("--out", help="new output directory (ledger.parquet, metrics.jsonl, summary.json, checkpoint)")
    run.add_argument("--resume", metavar="DIR",
                     help="continue the interrupted run in DIR from its last checkpoint (its own config; "
                          "-S iterations=N may extend it)")
    run.add_argument("--accept-numerics-change", action="store_true",
                     help="with --resume: continue a run whose checkpoint records other numerics than this code "
                          "runs (the checkpoint then records the change); refused without it")
    run.add_argument("--no-tracking", action="store_true", help="do not log the run to MLflow")
    run.add_argument("--tracking-uri", default=None,
                     help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    add_scale_out_arguments(run)

    config = commands.add_parser("config", help="print the resolved configuration as YAML")
    _add_config_arguments(config)
    config.add_argument("--keys", action="store_true", help="list every key -S accepts")

    pretrain = commands.add_parser("pretrain", help="pretrain the embedded world's base model")
    pretrain.add_argument("--preset", default="shapes-tiny", choices=["shapes-tiny"])
    pretrain.add_argument("--steps", type=int, default=None, help="optimizer steps (default 4000)")
    pretrain.add_argument("--heads", type=int, default=None, help="attention heads of 16 channels (default 4: width 64)")
    pretrain.add_argument("--seed", type=int, default=None, help="seed of the scenes, the weights and the noise (default 0)")
    pretrain.add_argument("--out", default=None,
                          help="checkpoint file to write (required unless --overwrite-packaged)")
    pretrain.add_argument("--overwrite-packaged", action="store_true",
                          help=f"allow writing the packaged base {_packaged_name()} (the default --out then); "
                               "every run of the embedded world starts from it")
    add_study_commands(commands)  # fidelity, compare

    check = commands.add_parser("check", help="preflight of `solrl run` with the same arguments (loads no weights)")
    _add_config_arguments(check)
    check.add_argument("--iterations", type=int, help="as for `solrl run`")
    check.add_argument("--out", help="the output directory `solrl run` would get: checked to be new and writable")

    add_sample_arguments(commands.add_parser("sample", help="draw images from a run's adapters"))
    add_export_arguments(commands.add_parser("export", help="write a run's adapter in diffusers' or PEFT's format"))
    commands.add_parser("presets", help="list the presets, each with its description")
    commands.add_parser("families", help="list the method families, each with its description")
    return parser


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default=None,
                        help="preset name (default shapes-tiny; `solrl presets` lists them with descriptions)")
    parser.add_argument("--family", default=None,
                        help="method family (default sol_rl; `solrl families` lists them with descriptions)")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="YAML config, as `solrl config` prints it: applied after the preset and family, "
                             "before -S (so -S wins); its preset/family, if named, must agree with --preset/--family")
    parser.add_argument("-S", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config key, e.g. -S pool=48 -S explore.steps=4")


def _packaged_name() -> str:
    try:
        return str(SHAPES_TINY_CHECKPOINT.relative_to(Path.cwd()))
    except ValueError:  # run from another folder: the whole path
        return str(SHAPES_TINY_CHECKPOINT)


def apply_config_file(args: argparse.Namespace) -> None:
    """``--config FILE`` becomes the preset, family and -S settings it stands for (its settings
    ahead of the user's -S), so every later step, the flow's and torchrun's ranks' included,
    resolves the same config from ordinary arguments."""
    if getattr(args, "config", None) is None:
        return
    if getattr(args, "resume", None):
        raise UserError("--resume DIR continues the run with its own config; leave out --config")
    args.preset, args.family, args.overrides = recipes.merged(args.config, args.preset, args.family,
                                                              args.overrides, getattr(args, "iterations", None))


def overrides_from_args(args: argparse.Namespace) -> list[tuple]:
    """-S settings, then --iterations (which must agree with any -S iterations=)."""
    return with_flag([parse_override(text) for text in args.overrides], "--iterations", "iterations",
                     getattr(args, "iterations", None))


def resolve_from_args(args: argparse.Namespace):
    overrides = overrides_from_args(args)
    # None is "not given"; an empty name is an error resolve_config reports, not the default.
    return resolve_config("shapes-tiny" if args.preset is None else args.preset,
                          "sol_rl" if args.family is None else args.family, overrides)


def check_explorer_backend(config) -> None:
    """An explorer backend this machine cannot run (te-nvfp4 off Blackwell) is one line, exit 2."""
    try:
        check_runs_here(config.explore.backend, config.model.device)
    except BackendUnavailable as error:
        raise UserError(str(error)) from None


def command_run(args: argparse.Namespace, runners: FlowRunners | None = None) -> int:
    launch = from_arguments(args)
    world = distributed.world_from_environment()
    if distributed.under_torchrun() and launch.needs_torchrun:
        raise UserError("this process already runs under torchrun: leave out --nproc-per-node / --nnodes")
    # Only the process that will write checks that --out is new: node 0's launcher, rank 0.
    writer = world.is_main and launch.node_rank == 0
    world_size = world.size if distributed.under_torchrun() else launch.world_size
    if args.resume:
        if args.out:
            raise UserError("--resume DIR continues the run in DIR; leave out --out")
        resume_dir = output_path(args.resume, "--resume", directory=True)  # a path that names no place: one line
        if writer:  # a folder another run is writing: say so, not what its half-written files look like
            run_lock.require_free(resume_dir)
        overrides_from_args(args)  # --iterations against -S iterations=, before the checkpoint is read
        config, out_dir = resumed_run(args.resume, args.preset, args.family, args.iterations, args.overrides,
                                      accept_numerics_change=args.accept_numerics_change)
        require_resumable_world(out_dir, world_size)
        # flipped bytes, a damaged or edited ledger or metrics file: one line now, not after Prefect
        # starts; only the folder's writer drops what lies past the checkpoint
        require_resumable(out_dir) if writer else require_intact(out_dir)
        if writer and args.accept_numerics_change:  # the flow, and torchrun's ranks, then find the numerics agree
            accept_numerics(out_dir, config)
    else:
        if args.accept_numerics_change:
            raise UserError("--accept-numerics-change is for --resume DIR: a new run records this code's numerics")
        if not args.out:
            raise UserError("--out DIR is required (a new directory), or --resume DIR to continue a run")
        config = resolve_from_args(args)
        out_dir = new_output_directory(args.out) if writer else output_path(args.out, "--out", directory=True)
    distributed.require_shardable(config, world_size)
    try:
        if launch.needs_torchrun:
            return _start_torchrun(args, launch, config, out_dir, writer)
        if distributed.under_torchrun():
            return _run_as_rank(args, world, config, out_dir, runners)
        return _run_one_process(args, config, out_dir, runners)
    except BaseException:
        signum = interrupts.received()
        if signum is None:
            raise
        # Whatever surfaced (KeyboardInterrupt, or under torchrun a peer's collective that broke
        # off as the peer stopped), a stop signal ended the run: say so, and how to go on.
        nodes = launch.nnodes if launch.needs_torchrun else _nodes_of(world)
        raise RunInterrupted(_interrupted_line(out_dir, nodes), signum) from None


def _nodes_of(world) -> int:
    """How many nodes a torchrun job spans, from torchrun's environment (1: one process)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world.size) or world.size)
    return max(1, world.size // max(1, local))


def _interrupted_line(out_dir: Path, nodes: int) -> str:
    """The one line of a run stopped by Ctrl-C or SIGTERM: how far its checkpoint got and the
    command that continues it, or, with no checkpoint yet, that there is nothing to continue."""
    try:
        metadata = read_metadata(out_dir)
    except CheckpointError:
        if out_dir.is_dir():
            return (f"interrupted before the first checkpoint, so nothing was saved: remove {out_dir} and run the "
                    f"same command again")
        return "interrupted before the run started; nothing was written"
    done, total = metadata["next_iteration"], metadata["config"]["iterations"]
    return (f"interrupted after {done} of {total} iterations (checkpoint in {out_dir}); resume with "
            f"{_resume_command(out_dir, int(metadata.get('world_size', 1)), nodes)}")


def _resume_command(out_dir: Path, ranks: int, nodes: int) -> str:
    if ranks == 1:
        return f"`solrl run --resume {out_dir}`"
    if nodes == 1:
        return f"`solrl run --resume {out_dir} --nproc-per-node {ranks}`"
    return (f"`solrl run --resume {out_dir}` on every node, with the same --nproc-per-node / --nnodes / "
            f"--rdzv-endpoint ({ranks} ranks)")


def _flow_runners(runners: FlowRunners | None) -> FlowRunners:
    if runners is None:
        raise UserError("solrl run trains through the Prefect flow, which solrl_core.cli cannot start on its own: "
                        "use the `solrl` command (or python -m flows.cli run ...)")
    return runners


def _run_one_process(args: argparse.Namespace, config, out_dir: Path, runners: FlowRunners | None) -> int:
    """The Prefect flow in this process (also rank 0 of a torchrun job started from the CLI)."""
    resumed_from = read_metadata(out_dir)["next_iteration"] if args.resume else None
    try:
        # Cheap file checks first, so missing weights stop the run before Prefect starts.
        check_model_files(config.model)
        check_explorer_backend(config)
        check_reward_files(list(config.rewards) + list(config.eval.rewards), config.reward_paths)
        writable_or_raise(out_dir)
        # One writer per folder, from before Prefect starts (a second run stops at once) to the end.
        with run_lock.held(out_dir):
            if not args.resume:  # again under the lock: a run started beside this one may have written
                new_output_directory(str(out_dir))
            # The Prefect flow (every stage a task), started only once the config and the output
            # directory are known to be good.
            run_locally = _flow_runners(runners).run_locally
            parameters = dict(iterations=args.iterations, overrides=list(args.overrides),
                              tracking=not args.no_tracking, tracking_uri=args.tracking_uri)
            if args.resume:
                summary = run_locally(resume=str(out_dir), preset=args.preset, family=args.family, **parameters)
            else:
                summary = run_locally(preset=config.preset, family=config.family, out=str(out_dir), **parameters)
    except ModelFilesMissing as missing:
        raise UserError(str(missing)) from None
    except (UserError, ConfigError, CheckpointError):
        raise
    except Exception as failure:  # noqa: BLE001 - a stage failing past its retries, a full disk, a non-finite weight
        if os.environ.get("SOLRL_TRACEBACK"):  # for bug reports: the full story on stderr
            traceback.print_exception(failure)
        raise RunFailed(_failure_line(failure, out_dir, resumed_from)) from None
    print_summary(summary)
    if summary.get("mlflow", {}).get("lost"):  # the warning above said what happened and how to catch up
        print(f"MLflow: not tracked to the end (the store failed); the run folder {out_dir} has the whole record")
    elif "mlflow" in summary:
        print(f"MLflow run {summary['mlflow']['run_id']}; reward vs GPU-hours: {summary['mlflow']['ui']}")
    return 0


def _start_torchrun(args, launch, config, out_dir: Path, writer: bool) -> int:
    """`solrl run --nproc-per-node N`: the checks of a one-process run, then torchrun; a failed run
    ends in one line naming the last good checkpoint (SOLRL_TRACEBACK=1: torchrun's whole report)."""
    try:
        check_model_files(config.model)
        check_explorer_backend(config)
        check_reward_files(list(config.rewards) + list(config.eval.rewards), config.reward_paths)
    except ModelFilesMissing as missing:
        raise UserError(str(missing)) from None
    launching.check_local_gpus(launch, resolve_device(config.model.device).type)
    launching.check_reachable(launch)
    if writer:
        writable_or_raise(out_dir)
    arguments = launching.run_arguments(args.preset, args.family, list(args.overrides), args.iterations,
                                        out=None if args.resume else out_dir,
                                        resume=out_dir if args.resume else None, tracking=not args.no_tracking,
                                        tracking_uri=args.tracking_uri)
    # This launcher holds the folder for the job's whole life; rank 0 writes under its lock.
    with run_lock.held(out_dir) if writer else contextlib.nullcontext():
        outcome = launching.start(launch, arguments, run_lock.environment_for_children(out_dir))
    if outcome.returncode == 0:
        sys.stderr.write(outcome.stderr)
        return 0
    if os.environ.get("SOLRL_TRACEBACK"):
        sys.stderr.write(outcome.stderr)
    line = outcome.rank_error or ""
    if "last good checkpoint" in line or "nothing to resume" in line:  # rank 0 said it all
        raise RunFailed(line)
    cause = line or f"a rank stopped (torchrun exit code {outcome.returncode})"
    raise RunFailed(_failure_line(RankStopped(cause), out_dir))


class RankStopped(RuntimeError):
    """A rank of a torchrun job ended the run (it died, hung past --rank-timeout, or failed)."""


def _run_as_rank(args, world, config, out_dir: Path, runners: FlowRunners | None) -> int:
    """One rank under torchrun: rank 0 runs the Prefect flow (its stages are the task runs, MLflow
    its tracking), the other ranks the same loop unreported; all join the process group."""
    timeout = distributed.timeout_from_environment() if args.rank_timeout is None else args.rank_timeout
    try:
        with distributed.process_group(world, resolve_device(config.model.device).type, timeout):
            if world.is_main:
                return _run_main_rank(args, config, out_dir, runners)
            # deferred: peft and transformers at import time (start-up of every solrl command)
            from solrl_core.training import run_training

            run_training(config, out_dir, log=lambda line: None, resume=bool(args.resume))
            return 0
    except (UserError, ConfigError, CheckpointError, RunFailed):  # RunFailed: rank 0's line, already whole
        raise
    except Exception as failure:  # noqa: BLE001 - a peer that died or hung, a stage that failed
        if os.environ.get("SOLRL_TRACEBACK"):
            traceback.print_exception(failure)
        if world.is_main:
            raise RunFailed(_failure_line(failure, out_dir)) from None
        raise RunFailed(f"rank {world.rank}: {type(failure).__name__}: {failure}".splitlines()[0]) from None


def _run_main_rank(args, config, out_dir: Path, runners: FlowRunners | None) -> int:
    context = os.environ.get(PREFECT_CONTEXT_VARIABLE)
    if context:  # started by a deployment's flow run: report into that flow run
        _flow_runners(runners).train_in_flow_context(Path(context), config, out_dir, tracking=not args.no_tracking,
                              tracking_uri=args.tracking_uri, resume=bool(args.resume))
        return 0
    return _run_one_process(args, config, out_dir, runners)


def _failure_line(failure: BaseException, out_dir: Path, resumed_from: int | None = None) -> str:
    """The one line of a failed run; ``resumed_from``: the checkpoint's iteration when the run
    was itself a resume, whose failure before any progress is not cured by resuming again."""
    what = f"{type(failure).__name__}: {failure}".splitlines()[0]
    if isinstance(failure, OSError) and failure.filename:
        what = f"could not write {failure.filename}: {failure.strerror}"
    try:
        metadata = read_metadata(out_dir)
    except CheckpointError:
        return f"run failed: {what}; nothing to resume (no checkpoint in {out_dir})"
    done, ranks = metadata["next_iteration"], int(metadata.get("world_size", 1))
    if done == resumed_from:
        return (f"run failed: {what}; this resume got no further than its checkpoint ({done} iterations done, "
                f"kept in {out_dir}): resuming again fails the same way until the cause is fixed "
                f"(SOLRL_TRACEBACK=1 shows where it failed)")
    on_ranks = f" on {ranks} ranks (the same --nproc-per-node / --nnodes)" if ranks > 1 else ""
    return (f"run failed: {what}; the last good checkpoint ({done} iterations done) is in {out_dir}: "
            f"resume with `solrl run --resume {out_dir}`{on_ranks}")


def command_config(args: argparse.Namespace) -> int:
    if args.keys:
        print("\n".join(config_keys()))
        return 0
    print(to_yaml(resolve_from_args(args)), end="")
    return 0


def command_pretrain(args: argparse.Namespace) -> int:
    for name in ("steps", "heads"):  # checked before the model stack is imported
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name} ({getattr(args, name)}) must be >= 1")
    out = pretrain_output(args.out, args.overwrite_packaged)
    # deferred: diffusers at import time (start-up of every solrl command)
    from solrl_core.world.pretrain import PretrainError, PretrainSettings, pretrain

    chosen = {name: getattr(args, name) for name in ("steps", "heads", "seed") if getattr(args, name) is not None}
    settings = replace(PretrainSettings(), **chosen)
    try:
        record = pretrain(out, settings)
    except PretrainError as error:
        raise UserError(str(error)) from None
    print(f"pretrained in {record['seconds']}s, final loss {record['final_loss']:.4f}; wrote {out}")
    return 0


def pretrain_output(out: str | None, overwrite_packaged: bool) -> Path:
    """The checkpoint `solrl pretrain` writes. The packaged base is what every embedded-world run,
    test and study starts from, and rebuilding it takes minutes: it is written only on request."""
    if out is None:
        if not overwrite_packaged:
            raise UserError(f"--out FILE is required (a checkpoint to write); to rebuild the packaged base "
                            f"{_packaged_name()}, give --overwrite-packaged")
        return SHAPES_TINY_CHECKPOINT
    path = output_path(out, "--out", directory=False, kind="checkpoint file")
    if _is_packaged(path) and not overwrite_packaged:
        raise UserError(f"--out {out} is the packaged base checkpoint, which every embedded-world run starts from; "
                        f"give another --out, or --overwrite-packaged to rebuild it")
    return path


def _is_packaged(path: Path) -> bool:
    # resolve() follows symbolic links; samefile also catches a hard link to the packaged file.
    if path == SHAPES_TINY_CHECKPOINT.resolve():
        return True
    try:
        return path.exists() and SHAPES_TINY_CHECKPOINT.exists() and path.samefile(SHAPES_TINY_CHECKPOINT)
    except OSError:
        return False


def command_presets(args: argparse.Namespace) -> int:
    _print_described({name: preset["description"] for name, preset in PRESETS.items()})
    return 0


def command_families(args: argparse.Namespace) -> int:
    _print_described({name: family.description for name, family in FAMILIES.items()})
    return 0


def _print_described(descriptions: dict[str, str]) -> None:
    width = max(map(len, descriptions))
    for name, description in descriptions.items():
        print(f"{name:<{width}}  {description}")


def command_check(args: argparse.Namespace) -> int:
    """Every finding on stdout; exit code 2 when any of them stops the run from starting."""
    findings = preflight(resolve_from_args(args), args.out)
    print(report(findings), end="")
    return USER_ERROR if problems(findings) else 0


COMMANDS = {"run": command_run, "config": command_config, "pretrain": command_pretrain, "check": command_check,
            "sample": command_sample, "export": command_export, "presets": command_presets,
            "families": command_families, **STUDY_COMMANDS}


def _is_main_rank() -> bool:
    return os.environ.get("RANK", "0") == "0"


def main(argv: list[str] | None = None, runners: FlowRunners | None = None) -> int:
    """The `solrl` command; ``runners`` (flows/cli.py's) let `run` start the Prefect flow."""
    for key, value in {**QUIET_ENVIRONMENT, **BOUNDED_RETRIES}.items():
        os.environ.setdefault(key, value)
    flush_denormals()  # before any work: every command's threads (a run's, a torchrun rank's) inherit it
    with interrupts.stopping_on_signals():  # SIGTERM unwinds as Ctrl-C does
        return _command(argv, runners)


def _command(argv: list[str] | None, runners: FlowRunners | None) -> int:
    try:
        args = build_parser().parse_args(argv)
        one_value_each(args)
        apply_config_file(args)
        commands = {**COMMANDS, "run": functools.partial(command_run, runners=runners),
                    "sweep": functools.partial(COMMANDS["sweep"], runners=runners)}
        return commands[args.command](args)
    except (UserError, ConfigError, CheckpointError) as error:
        if _is_main_rank():  # every rank finds the same user error: one line, not one per rank
            print(f"solrl: error: {one_line(str(error))}", file=sys.stderr)
        return USER_ERROR
    except RunFailed as failure:
        print(f"solrl: error: {one_line(str(failure))}", file=sys.stderr)
        return RUN_FAILED
    except RunInterrupted as stopped:
        if _is_main_rank():  # every rank was stopped: one line, rank 0's
            print(f"solrl: {stopped}", file=sys.stderr)
        return stopped.exit_code
    except KeyboardInterrupt:  # before a run started, or another command
        if _is_main_rank():
            print("solrl: interrupted", file=sys.stderr)
        return interrupts.exit_code(interrupts.received() or signal.SIGINT)


if __name__ == "__main__":
    sys.exit(main())
