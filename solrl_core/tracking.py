"""MLflow tracking of a run, as an observer of the training loop (no MLflow in the loop itself).

One experiment per preset, one MLflow run per training run (per Prefect flow run). Params are the
resolved config; tags are the code's git commit and the DVC (md5) hashes of the seed ledger and
the checkpoints; metrics are logged per iteration at ``step = iteration + 1`` (the base model's
evaluation at step 0), together with the cumulative GPU-hours of that step, so that the MLflow UI
can plot any reward with a GPU-hours metric as its x-axis. Each evaluation logs a sample grid
(fixed prompts and seeds) as a stepped image; the end of the run logs the reward-vs-GPU-hours
figure, the summary and the metrics file. A resumed run continues the same MLflow run (its id is
kept in ``mlflow_run.json`` in the output directory) when it logs to the same store.

Default store: ``sqlite:///<cwd>/mlflow.db`` with artifacts in ``<cwd>/mlruns`` (no server needed);
``MLFLOW_TRACKING_URI`` or an explicit URI overrides it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torchvision.utils import make_grid

from solrl_core.config import Config, to_dict
from solrl_core.ledger import write_json
from solrl_core.training import RunObserver
from solrl_core.world import SHAPES_TINY_CHECKPOINT

STORE_FILE, ARTIFACT_DIR = "mlflow.db", "mlruns"
# Cumulative metrics that can serve as the x-axis of a reward chart in the MLflow UI, best first:
# measured GPU-hours (CUDA runs only), modeled GPU-hours (SPEC section 9; both written by the
# accounting into metrics.jsonl), then the measured wall-clock hours of the training stages.
GPU_HOUR_AXES = ("gpu_hours_cumulative", "modeled_gpu_hours_cumulative", "wall_clock_hours_cumulative")
FIGURE = "plots/reward_vs_gpu_hours.png"
RUN_RECORD = "mlflow_run.json"  # in the run's output directory: which MLflow run it logs to
# The experiment tag MLflow's UI reads to choose its view: without it MLflow 3 opens an experiment
# as a GenAI one ("Evaluation runs"); a training run belongs in the model-training view, where the
# charts and the x-axis setting the README describes are.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# MLflow's HTTP client retries a failed request 7 times with exponential backoff (about 4 minutes)
# and waits 120 s for an answer: a tracking server that went away would stall every log call of
# the run that long. The observer's calls get these bounds instead (unless the environment sets
# its own): a refused connection fails in about 2 s, a server that hangs in about 30 s.
BOUNDED_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@contextlib.contextmanager
def bounded_http(tracking_uri: str) -> Iterator[None]:
    """MLflow's HTTP retries and timeout bounded (BOUNDED_HTTP) for the duration, for a server URI."""
    if not tracking_uri.startswith(("http://", "https://")):
        yield
        return
    added = {key: value for key, value in BOUNDED_HTTP.items() if key not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _tracking_errors() -> tuple[type[BaseException], ...]:
    """What a store that stopped answering raises: MLflow's own error (a REST call past its
    retries, a database error), or a connection/file error from below it."""
    # deferred: mlflow at import time (as in on_start)
    import requests
    from mlflow.exceptions import MlflowException

    return (MlflowException, requests.RequestException, OSError)


def _tracked(hook):
    """An observer hook that never fails the run: once the store fails, one warning line, and
    the observer stops calling MLflow for the rest of the run (resume catches it up)."""
    @functools.wraps(hook)
    def guarded(self, *args, **kwargs):
        if self.lost:
            return None
        try:
            with bounded_http(self.tracking_uri):
                return hook(self, *args, **kwargs)
        except _tracking_errors() as error:
            self._lose(hook.__name__, error)
            return None
    return guarded


def default_tracking_uri(root: Path | None = None) -> str:
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{(root or Path.cwd()).resolve() / STORE_FILE}"


def ui_command(tracking_uri: str, experiment_id: str | None = None) -> str:
    """How to see the run: the UI command (for a local store) and, once the experiment is known,
    its page in the model-training view (see ``training_view``)."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri.rstrip('/')}{training_view(experiment_id)}"
    command = f"mlflow ui --backend-store-uri {tracking_uri} --host 127.0.0.1 --port 5000"
    return command if experiment_id is None else f"{command}, then open http://127.0.0.1:5000{training_view(experiment_id)}"


def training_view(experiment_id: str | None) -> str:
    """The experiment's page in the UI's model-training view. MLflow 3.17's UI chooses between its
    GenAI and model-training views by a switch of its own (remembered per browser, GenAI at first)
    and reads this URL parameter before it; the experimentKind tag alone does not switch it."""
    return "/" if experiment_id is None else f"/#/experiments/{experiment_id}?workflowType=machine_learning"


def experiment_name(config: Config) -> str:
    return config.preset


class MlflowObserver(RunObserver):
    """Logs one run to MLflow; ``run_id`` and ``ui`` are set once the run has started."""

    def __init__(self, tracking_uri: str | None = None, run_name: str | None = None,
                 tags: dict[str, str] | None = None, log: Callable[[str], None] = print,
                 experiment: str | None = None):
        self.tracking_uri = tracking_uri or default_tracking_uri()
        self.experiment = experiment  # None: the preset's experiment (experiment_name); a study names its own
        self.client = None  # connected in on_start: a run that fails to load its model writes no store
        self.run_name, self.extra_tags, self.log = run_name, tags or {}, log
        self.run_id: str | None = None
        self.lost = False  # the store failed: nothing more is sent to MLflow in this run
        self.out_dir: Path | None = None
        self._logged: dict[str, set[int]] = {}  # a resumed run's points already in MLflow, per metric
        self.ui = ui_command(self.tracking_uri)
        self._wall_clock_hours = 0.0
        self._seen_axes: list[str] = []
        self._curve: list[dict] = []  # one point per step: GPU-hours and rewards, for the figure

    # -- RunObserver hooks -------------------------------------------------------------------

    @_tracked
    def on_start(self, config: Config, out_dir: Path) -> None:
        self._start(config, out_dir)

    def _start(self, config: Config, out_dir: Path) -> None:
        # deferred: mlflow at import time (start-up of importers of the helpers alone, e.g. flatten_metrics)
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag

        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.config, self.out_dir = config, out_dir
        experiment_id = self._experiment(self.experiment or experiment_name(config))
        self.ui = ui_command(self.tracking_uri, experiment_id)
        tags = {"solrl.preset": config.preset, "solrl.family": config.family, "solrl.out_dir": str(out_dir),
                **code_version_tags(), **self.extra_tags}
        run = self.client.create_run(experiment_id, run_name=self.run_name, tags=tags)
        self.run_id = run.info.run_id
        write_json(out_dir / RUN_RECORD, {"tracking_uri": self.tracking_uri, "run_id": self.run_id})
        params = [Param(key, value) for key, value in flatten_params(to_dict(config)).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])
        self.client.log_batch(self.run_id, tags=[RunTag("mlflow.note.content", _note(config))])

    @_tracked
    def on_resume(self, config: Config, out_dir: Path, base_eval: dict[str, float], history: list[dict]) -> None:
        """Reopen the run's MLflow run when this store has it; otherwise start a new run. Either
        way, every point of the run folder's history that the MLflow run lacks is logged (a run
        killed, or a store lost mid-run, left the rest out), each point once."""
        # deferred: mlflow at import time (as in on_start)
        from mlflow import MlflowClient
        from mlflow.entities import RunTag

        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.config, self.out_dir = config, out_dir
        previous = self._previous_run(out_dir)
        if previous is None:
            self._start(config, out_dir)
        else:
            self.run_id = previous
            run = self.client.get_run(previous)
            self.ui = ui_command(self.tracking_uri, run.info.experiment_id)
            self._logged = {key: {point.step for point in self.client.get_metric_history(previous, key)}
                            for key in run.data.metrics}
            self.client.update_run(self.run_id, status="RUNNING")
        self._log_metrics({f"eval/{name}": value for name, value in base_eval.items()}, 0)
        self._curve.append({"step": 0, **{axis: 0.0 for axis in GPU_HOUR_AXES},
                            **{f"eval/{k}": v for k, v in base_eval.items()}})
        for record in history:
            self._record_iteration(record, replay=True)
        resumed_at = history[-1]["iteration"] + 1 if history else 0
        self.client.log_batch(self.run_id, tags=[RunTag("solrl.resumed_at_iteration", str(resumed_at))])

    def _previous_run(self, out_dir: Path) -> str | None:
        # deferred: mlflow at import time (as in on_start)
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode

        path = out_dir / RUN_RECORD
        if not path.is_file():
            return None
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("tracking_uri") != self.tracking_uri:
            return None
        try:
            self.client.get_run(record["run_id"])
        except MlflowException as error:  # a run this store does not have: start a new one
            if error.error_code != ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
                raise  # a store that does not answer: no new run in its place
            return None
        return record["run_id"]

    @_tracked
    def on_evaluation(self, iteration: int, rewards: dict[str, float], images: torch.Tensor) -> None:
        step = iteration + 1
        values = {f"eval/{name}": value for name, value in rewards.items()}
        if step == 0:  # the base model: every curve starts at zero hours
            self._curve.append({"step": 0, **{axis: 0.0 for axis in GPU_HOUR_AXES}, **values})
        if all(step in self._logged.get(key, ()) for key in values):
            return  # a resumed run redoing an evaluation MLflow has (its grid too)
        self._log_metrics(values, step)
        self.client.log_image(self.run_id, eval_image_grid(images, self.config), key="eval_samples", step=step)

    @_tracked
    def on_iteration(self, metrics: dict) -> None:
        self._record_iteration(metrics)

    def _record_iteration(self, metrics: dict, replay: bool = False) -> None:
        step = metrics["iteration"] + 1
        self._wall_clock_hours += metrics.get("seconds", {}).get("total", 0.0) / 3600
        # Evaluation rewards were logged by on_evaluation at this step; they join the figure's curve here.
        values = {**flatten_metrics({k: v for k, v in metrics.items() if k != "eval"}),
                  "wall_clock_hours_cumulative": self._wall_clock_hours}
        axes = [axis for axis in GPU_HOUR_AXES if axis in values]
        if not self._seen_axes:  # the x-axis metrics also need the base evaluation's point, 0 at step 0
            self._seen_axes = axes
            self._log_metrics({axis: 0.0 for axis in axes}, 0)
        self._log_metrics(values, step)
        if replay and "eval" in metrics:  # a live run logged them in on_evaluation
            self._log_metrics({f"eval/{name}": value for name, value in metrics["eval"].items()}, step)
        self._curve.append({"step": step, **values, **{f"eval/{k}": v for k, v in metrics.get("eval", {}).items()}})

    @_tracked
    def on_end(self, summary: dict) -> None:
        from mlflow.entities import Param, RunTag  # deferred: mlflow at import time (as in on_start)

        if "explore_backend" in summary:  # explore.backend=auto as this machine resolved it
            self.client.log_batch(self.run_id, params=[Param("explore.backend_resolved", summary["explore_backend"])])
        outputs = {name: Path(path) for name, path in summary.get("outputs", {}).items()}
        tags = dvc_hash_tags({**outputs, "base_checkpoint": base_checkpoint(self.config)})
        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        self.client.log_figure(self.run_id, reward_figure(self._curve, self.x_axis), FIGURE)
        for name in ("summary.json", "metrics.jsonl"):
            if (self.out_dir / name).exists():
                self.client.log_artifact(self.run_id, str(self.out_dir / name), artifact_path="run")
        self.finish("FINISHED")
        self.log(f"MLflow run {self.run_id} (experiment '{self.experiment or experiment_name(self.config)}'); x-axis for "
                 f"reward vs GPU-hours: {self.x_axis}; browse: {self.ui}")

    @_tracked
    def finish(self, status: str) -> None:
        """Close the run ("FINISHED", "FAILED", "KILLED"); the flow calls it when the run fails."""
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status)

    def _lose(self, hook: str, error: BaseException) -> None:
        """The one warning of a store that failed; from now on the run folder alone keeps the record."""
        self.lost = True
        cause = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        run = f"MLflow run {self.run_id}" if self.run_id else "a new MLflow run"
        where = str(self.out_dir) if self.out_dir is not None else "the run folder"
        print(f"solrl: warning: MLflow tracking at {self.tracking_uri} failed in {hook} ({cause}); the run goes "
              f"on untracked and {where} keeps its whole record; once the store answers again, "
              f"`solrl run --resume {where}` logs what {run} is missing", file=sys.stderr, flush=True)

    # -- helpers -------------------------------------------------------------------------------

    @property
    def x_axis(self) -> str:
        """The best hours metric this run has (measured GPU > modeled GPU > wall clock)."""
        return (self._seen_axes or ["wall_clock_hours_cumulative"])[0]

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            for key, value in EXPERIMENT_KIND.items():  # an experiment made before the tag was set
                if key not in found.tags:
                    self.client.set_experiment_tag(found.experiment_id, key, value)
            return found.experiment_id
        location = None
        if self.tracking_uri.startswith("sqlite:///"):
            # Artifacts beside the SQLite store, so the project folder holds the whole record.
            store = Path(self.tracking_uri.removeprefix("sqlite:///"))
            location = (store.parent / ARTIFACT_DIR).resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_KIND)

    def _log_metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric  # deferred: mlflow at import time (as in on_start)

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, step) for key, value in values.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                   and step not in self._logged.get(key, ())]  # a resumed run: each point once
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)


def flatten_metrics(metrics: dict, prefix: str = "") -> dict[str, float]:
    """Scalar metrics with nested dicts as ``a/b``; lists and non-numbers are left to metrics.jsonl."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if key == "iteration":
            continue  # the step itself
        if isinstance(value, dict):
            flat.update(flatten_metrics(value, f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = float(value)
    return flat


def flatten_params(mapping: dict, prefix: str = "") -> dict[str, str]:
    """The resolved config as dotted keys (``train.lora.rank``, ``rewards.shapes-compliance``)."""
    flat: dict[str, str] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            flat.update(flatten_params(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)[:6000]  # MLflow's limit for a param value
    return flat


def _note(config: Config) -> str:
    return (f"Sol-RL `{config.family}` on `{config.preset}`: pool {config.pool}, keep {config.keep}, "
            f"explore {config.explore.backend} x {config.explore.steps} steps, regenerate {config.regenerate.steps} steps. "
            "Plot any reward against GPU-hours: in a chart's settings choose the metric "
            "`modeled_gpu_hours_cumulative` (or `gpu_hours_cumulative` on a GPU) as its x-axis.")


# ---------------------------------------------------------------------------------------------
# Versions: git commit of the code, DVC hashes of outputs


def code_version_tags() -> dict[str, str]:
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"mlflow.source.git.commit": commit, "git.commit": commit, "git.dirty": str(bool(dirty)).lower()}


def file_md5(path: Path) -> str:
    """The hash DVC 3 records for a file output (md5 of its bytes), so a tag matches dvc.lock."""
    digest = hashlib.md5()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dvc_hash_tags(paths: dict[str, Path | None]) -> dict[str, str]:
    return {f"dvc.md5.{name}": file_md5(path) for name, path in paths.items() if path is not None and path.is_file()}


def base_checkpoint(config: Config) -> Path | None:
    if config.model.loader == "shapes-tiny":
        return Path(config.model.path) if config.model.path else SHAPES_TINY_CHECKPOINT
    return Path(config.model.path) if config.model.path else None


# ---------------------------------------------------------------------------------------------
# Pictures


def eval_image_grid(images: torch.Tensor, config: Config, max_width: int = 1600):
    """The evaluation images as one uint8 HxWx3 array, laid out as ``samples_*.png``, enlarged
    (nearest neighbour) so small images stay visible in the UI."""
    columns = min(images.shape[0], config.eval.seeds_per_prompt * 8)
    grid = make_grid(images.float().clamp(0, 1), nrow=columns, padding=1, pad_value=1.0)
    scale = max(1, min(8, max_width // grid.shape[-1]))
    if scale > 1:
        grid = torch.nn.functional.interpolate(grid[None], scale_factor=scale, mode="nearest")[0]
    return (grid.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()


def reward_figure(curve: list[dict], x_axis: str):
    """Evaluation rewards (solid, markers) and training rewards (dashed) against GPU-hours."""
    # deferred: matplotlib at import time (start-up of every tracked run, which draws this figure at its end)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib at import time (after the backend is chosen)

    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=110)
    names = sorted({key for point in curve for key in point if key.startswith("eval/")})
    for name in names:
        points = [(p[x_axis], p[name]) for p in curve if name in p and x_axis in p]
        axes.plot(*zip(*points), marker="o", label=name.removeprefix("eval/") + " (eval)")
    for name in ("explore_reward_mean", "kept_reward_mean"):
        points = [(p[x_axis], p[name]) for p in curve if name in p and x_axis in p]
        if points:
            axes.plot(*zip(*points), linestyle="--", alpha=0.7, label=name.replace("_", " "))
    label = {"gpu_hours_cumulative": "GPU-hours (measured)",
             "modeled_gpu_hours_cumulative": "GPU-hours (modeled from FLOPs, SPEC section 9)",
             "wall_clock_hours_cumulative": "wall-clock hours of the training stages (measured)"}[x_axis]
    axes.set_xlabel(label)
    axes.set_ylabel("reward")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    return figure
