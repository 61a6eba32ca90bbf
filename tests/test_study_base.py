"""The DVC study's base stage (`solrl study base`, solrl_core/study_base.py) for a real model, on a
tiny random FLUX pipeline folder and a tiny ImageReward: the committed FLUX study (params-flux.yaml)
pointed at them writes a manifest of the model's files; the same model in another folder gives the
same manifest byte for byte (moving it reruns nothing), a changed file a different one; missing
model or reward files are one line naming them, exit 2, and no manifest. For the embedded world the
base is its checkpoint, which the stage pretrains only when asked to rebuild the packaged one.
dvc.yaml on the FLUX study: every stage is there, the run stages depend on the manifest."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import _tiny
from flows.cli import main as solrl
from solrl_core import study_base
from tests._services import BIN, ROOT, environment


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No model or reward env var from the machine, and an empty Hugging Face cache."""
    import huggingface_hub.constants

    for name in ("SOLRL_FLUX_PATH", "SOLRL_IMAGEREWARD_PATH", "SOLRL_IMAGEREWARD_TOKENIZER_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-real")
    return {"model": _tiny.save_flux(root / "flux"), "reward": _tiny.save_imagereward(root / "imagereward")}


def flux_study(tmp_path: Path, model: Path, reward: Path, name: str = "params.yaml") -> Path:
    """params-flux.yaml as committed, its model and reward paths pointed at ``model`` and ``reward``."""
    params = yaml.safe_load((ROOT / "params-flux.yaml").read_text())
    params["settings"]["model"]["path"] = str(model)
    params["settings"]["reward_paths"] = {"imagereward": str(reward)}
    params["base"] = str(tmp_path / "pipeline" / "base.json")
    path = tmp_path / name
    path.write_text(yaml.safe_dump(params))
    return path


def base(capsys, params: Path) -> tuple[int, str, str]:
    code = solrl(["study", "base", "--params", str(params)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_real_models_base_is_a_manifest_of_its_files_the_same_wherever_the_folder_is(tmp_path, capsys,
                                                                                       tiny_files):
    code, out, err = base(capsys, flux_study(tmp_path, tiny_files["model"], tiny_files["reward"]))
    assert code == 0, err
    manifest_file = tmp_path / "pipeline" / "base.json"
    assert f"wrote {manifest_file}" in out
    manifest = json.loads(manifest_file.read_text())
    listed = {entry["path"]: entry for entry in manifest["files"]}
    on_disk = {path.relative_to(tiny_files["model"]).as_posix(): path
               for path in tiny_files["model"].rglob("*") if path.is_file()}
    assert set(listed) == set(on_disk) and "model_index.json" in listed
    assert any(name.startswith("transformer/") and name.endswith(".safetensors") for name in listed)
    for name, path in on_disk.items():
        assert listed[name]["bytes"] == path.stat().st_size and len(listed[name]["sha256"]) == 64
    assert manifest["preset"] == "flux-imagereward" and manifest["model_index"]["_class_name"] == "FluxPipeline"
    assert str(tiny_files["model"]) not in manifest_file.read_text()  # no absolute path in it

    # The same model elsewhere, with a download tool's hidden state beside it: the same manifest.
    moved = shutil.copytree(tiny_files["model"], tmp_path / "elsewhere" / "flux")
    (moved / ".cache").mkdir()
    (moved / ".cache" / "download.lock").write_text("written at another time")
    again = tmp_path / "again"
    again.mkdir()
    assert base(capsys, flux_study(again, moved, tiny_files["reward"]))[0] == 0
    assert (again / "pipeline" / "base.json").read_bytes() == manifest_file.read_bytes()

    # A changed file changes the manifest (and so reruns the stages that depend on it).
    scheduler = moved / "scheduler" / "scheduler_config.json"
    scheduler.write_text(scheduler.read_text().replace("}", ', "note": 1}', 1))
    assert base(capsys, flux_study(again, moved, tiny_files["reward"]))[0] == 0
    changed = json.loads((again / "pipeline" / "base.json").read_text())
    differing = [a["path"] for a, b in zip(manifest["files"], changed["files"]) if a != b]
    assert differing == ["scheduler/scheduler_config.json"]


def test_a_large_file_is_digested_by_its_ends(tmp_path):
    """A weight file of tens of GB is not read whole at every repro: its size and both ends."""
    big = tmp_path / "weights.safetensors"
    with big.open("wb") as handle:
        handle.truncate(study_base.WHOLE_FILE_BYTES + 3 * study_base.SAMPLE_BYTES)  # sparse
    first = study_base.file_entry(tmp_path, big)
    assert first["digest_of"] == "first and last 1 MiB" and first["bytes"] == big.stat().st_size
    with big.open("r+b") as handle:
        handle.seek(big.stat().st_size - 1)
        handle.write(b"\x01")
    assert study_base.file_entry(tmp_path, big)["sha256"] != first["sha256"]


def test_missing_model_or_reward_files_are_one_line_and_no_manifest(tmp_path, capsys, tiny_files):
    nowhere = tmp_path / "nowhere"
    code, _, err = base(capsys, flux_study(tmp_path, nowhere, tiny_files["reward"]))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("solrl: error: flux.1-dev weights not found at ") and str(nowhere) in err
    assert "model_index.json" in err and "-S model.path=DIR or SOLRL_FLUX_PATH=DIR" in err
    code, _, err = base(capsys, flux_study(tmp_path, tiny_files["model"], nowhere))
    assert code == 2 and err.count("\n") == 1 and "reward 'imagereward'" in err and str(nowhere) in err, err
    assert not (tmp_path / "pipeline").exists()


def test_the_embedded_worlds_base_is_its_checkpoint_rebuilt_only_on_request(tmp_path, capsys):
    params = yaml.safe_load((ROOT / "params-ci.yaml").read_text())
    params["base"] = str(tmp_path / "base.json")
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(params))
    code, _, err = base(capsys, tmp_path / "other.yaml")
    assert code == 2 and err.count("\n") == 1 and "must be the checkpoint settings.model.path names" in err, err
    code, _, err = base(capsys, ROOT / "params-ci.yaml")  # the packaged base, without --overwrite-packaged
    assert code == 2 and err.count("\n") == 1 and "give --overwrite-packaged" in err, err
    assert not (tmp_path / "base.json").exists()


def test_dvc_yaml_on_the_flux_study_runs_every_stage_from_the_manifest(tmp_path):
    """Every stage of dvc.yaml resolves on the committed FLUX study, and the stages that train or
    sample depend on the base stage's manifest, not on the model folder."""
    from dvc.repo import Repo

    shutil.copy2(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    shutil.copy2(ROOT / "params-flux.yaml", tmp_path / "params.yaml")
    subprocess.run([str(BIN / "dvc"), "init", "--no-scm", "-q"], cwd=tmp_path, env=environment(), check=True)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    with Repo(str(tmp_path)) as repo:
        stages = {stage.name: stage for stage in repo.index.stages}
        files = {name: [str(Path(dep.def_path)) for dep in stage.deps if not hasattr(dep, "params")]
                 for name, stage in stages.items()}
        outs = {name: [str(Path(out.def_path)) for out in stage.outs] for name, stage in stages.items()}
    runs = [f"train@{family}-{seed}" for family in params["families"] for seed in params["seeds"]]
    points = [f"{name}@{point}-{seed}" for name, section in params["ablations"].items()
              for point in section["points"] for seed in section["seeds"]]
    assert {"base", "fidelity", "compare", "report", *runs, *points} <= set(stages)
    assert outs["base"] == [params["base"]]
    for name in ("fidelity", *runs, *points):
        assert files[name] == [params["base"]], (name, files[name])
