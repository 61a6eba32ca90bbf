"""MLflow tracking of a short run, read back through a real `mlflow server` over HTTP on 127.0.0.1:
one experiment per preset, params from the resolved config, git and DVC-hash tags, per-step
rewards logged at the same steps as the cumulative GPU-hours (the UI's x-axis), the
reward-vs-GPU-hours figure, and a sample grid per evaluation."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pytest

from solrl_core.presets import resolve_config
from solrl_core.tracking import MlflowObserver, file_md5
from solrl_core.training import run_training
from tests._services import BIN, environment, free_port, service, wait_for_http

pytestmark = pytest.mark.slow

SHORT = [("prompts_per_iteration", 2), ("pool", 8), ("keep", 4), ("eval.prompts", 2), ("eval.steps", 4),
         ("eval.every", 1), ("explore.steps", 3), ("regenerate.steps", 4), ("train.micro_batch", 64),
         ("iterations", 2), ("progress", False),
         ("explore.backend", "none")]  # tracking, not quantization, is under test here


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tracking")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    observer = MlflowObserver(uri, run_name="short", tags={"test": "yes"}, log=lambda line: None)
    summary = run_training(resolve_config("shapes-tiny", "sol_rl", SHORT), root / "run", log=lambda line: None,
                           observers=[observer])
    return root, observer, summary


@pytest.fixture(scope="module")
def server(logged_run):
    root, _, _ = logged_run
    port = free_port()
    with service([str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                  "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                 root / "mlflow-server.log", environment(), root) as process:
        wait_for_http(f"http://127.0.0.1:{port}/health", 180, process, root / "mlflow-server.log")
        yield f"http://127.0.0.1:{port}"


def get(server: str, route: str, **query) -> bytes:
    with urllib.request.urlopen(f"{server}{route}?{urllib.parse.urlencode(query)}", timeout=30) as response:
        assert response.status == 200
        return response.read()


def get_json(server: str, route: str, **query) -> dict:
    return json.loads(get(server, route, **query))


def test_run_is_in_the_preset_experiment_with_config_params_and_version_tags(logged_run, server):
    root, observer, summary = logged_run
    experiment = get_json(server, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="shapes-tiny")
    run = get_json(server, "/api/2.0/mlflow/runs/get", run_id=observer.run_id)["run"]
    assert run["info"]["experiment_id"] == experiment["experiment"]["experiment_id"]
    assert run["info"]["status"] == "FINISHED"
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["pool"] == "8" and params["explore.steps"] == "3" and params["family"] == "sol_rl"
    assert params["train.lora.rank"] == str(summary["config"]["train"]["lora"]["rank"])
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert len(tags["mlflow.source.git.commit"]) == 40
    # The tags carry the hashes DVC records for these files (md5 of the bytes).
    assert tags["dvc.md5.ledger.parquet"] == file_md5(root / "run" / "ledger.parquet")
    assert tags["dvc.md5.lora.safetensors"] == file_md5(root / "run" / "lora.safetensors")
    assert len(tags["dvc.md5.base_checkpoint"]) == 32


def test_the_experiment_opens_in_the_ui_s_model_training_view(logged_run, server):
    """Was: MLflow 3 opened the experiment as a GenAI one ("Evaluation runs"), hiding the charts
    the README's reward-vs-GPU-hours steps use. The experiment carries the kind tag MLflow defines
    for training, and the link the run prints opens the model-training view (checked by hand in
    headless Chromium against `mlflow ui` 3.17.2: the tag alone still opens the GenAI view)."""
    experiment = get_json(server, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="shapes-tiny")
    tags = {t["key"]: t["value"] for t in experiment["experiment"].get("tags", [])}
    assert tags.get("mlflow.experimentKind") == "custom_model_development", tags
    # MLflow 3.17's UI picks its view by its own switch (GenAI at first) unless the URL names it:
    # the page the run points to is the experiment's in the model-training view.
    _, observer, summary = logged_run
    page = f"/#/experiments/{experiment['experiment']['experiment_id']}?workflowType=machine_learning"
    assert observer.ui.endswith(f"then open http://127.0.0.1:5000{page}"), observer.ui
    assert "--host 127.0.0.1" in observer.ui


def test_an_experiment_made_before_the_kind_tag_gets_it(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    created = client.create_experiment("shapes-tiny")  # as an earlier version made it: no kind
    assert "mlflow.experimentKind" not in client.get_experiment(created).tags
    observer = MlflowObserver(uri, log=lambda line: None)
    observer.client = client
    assert observer._experiment("shapes-tiny") == created
    assert client.get_experiment(created).tags["mlflow.experimentKind"] == "custom_model_development"


def test_rewards_and_gpu_hours_share_steps_so_the_ui_can_plot_one_against_the_other(logged_run, server):
    _, observer, summary = logged_run

    def history(key):
        points = get_json(server, "/api/2.0/mlflow/metrics/get-history", run_id=observer.run_id, metric_key=key)
        return {p["step"]: p["value"] for p in points["metrics"]}

    hours = history("modeled_gpu_hours_cumulative")
    evaluation = history("eval/shapes-compliance")
    assert sorted(hours) == sorted(evaluation) == [0, 1, 2]  # base model, then each iteration
    assert hours[0] == 0.0 < hours[1] < hours[2]
    assert evaluation[2] == pytest.approx(summary["eval_reward_final"]["shapes-compliance"])
    assert sorted(history("explore_reward_mean")) == [1, 2]
    assert sorted(history("seconds/explore")) == [1, 2]
    assert observer.x_axis == "modeled_gpu_hours_cumulative"


def test_figure_and_evaluation_grids_are_served(logged_run, server):
    _, observer, _ = logged_run
    figure = get(server, "/get-artifact", path="plots/reward_vs_gpu_hours.png", run_uuid=observer.run_id)
    assert figure.startswith(b"\x89PNG")
    images = get_json(server, "/api/2.0/mlflow/artifacts/list", run_id=observer.run_id, path="images")
    grids = [f["path"] for f in images["files"] if f["path"].endswith(".png") and "eval_samples" in f["path"]]
    assert len(grids) == 3  # steps 0, 1, 2
    assert get(server, "/get-artifact", path=grids[0], run_uuid=observer.run_id).startswith(b"\x89PNG")
    summary = json.loads(get(server, "/get-artifact", path="run/summary.json", run_uuid=observer.run_id))
    assert summary["config"]["pool"] == 8


def test_a_resumed_run_continues_its_mlflow_run_with_one_point_per_step(tmp_path, monkeypatch):
    """A run that failed in iteration 1 and was resumed is one MLflow run: every step logged once
    per metric with the values of an untroubled run, the run FINISHED."""
    from mlflow import MlflowClient

    from solrl_core import faults

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = resolve_config("shapes-tiny", "sol_rl", [*SHORT, ("iterations", 3)])
    monkeypatch.setenv(faults.ENVIRONMENT, "raise@update:1")
    faults.reset()
    first = MlflowObserver(uri, run_name="interrupted", log=lambda line: None)
    with pytest.raises(faults.InjectedFault):
        run_training(config, tmp_path / "run", log=lambda line: None, observers=[first])
    first.finish("FAILED")
    monkeypatch.delenv(faults.ENVIRONMENT)
    faults.reset()
    second = MlflowObserver(uri, run_name="resumed", log=lambda line: None)
    run_training(config, tmp_path / "run", log=lambda line: None, observers=[second], resume=True)
    assert second.run_id == first.run_id
    client = MlflowClient(uri)
    run = client.get_run(first.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["solrl.resumed_at_iteration"] == "1"
    for key in ("modeled_gpu_hours_cumulative", "eval/shapes-compliance", "kept_reward_mean"):
        steps = [m.step for m in client.get_metric_history(first.run_id, key)]
        assert len(steps) == len(set(steps)), f"{key} logged twice at a step: {steps}"
    hours = {m.step: m.value for m in client.get_metric_history(first.run_id, "modeled_gpu_hours_cumulative")}
    assert sorted(hours) == [0, 1, 2, 3] and hours[3] > hours[2] > hours[1] > 0
