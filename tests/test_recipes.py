"""Recipes and listings: `--config FILE` (what `solrl config` prints, fed back), `solrl presets` /
`solrl families`, and `solrl pretrain` keeping the packaged base checkpoint unless told."""

from __future__ import annotations

import ast
import hashlib
import os
from pathlib import Path

import pytest
import yaml

from solrl_core import cli
from solrl_core.families import FAMILIES
from solrl_core.presets import PRESETS
from solrl_core.recipes import merged
from solrl_core.world import SHAPES_TINY_CHECKPOINT

ROOT = Path(__file__).resolve().parents[1]


def solrl(capsys, *argv, runners=None):
    code = cli.main(list(argv), runners)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(code, err, *needles):
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


def printed(capsys, *argv) -> str:
    code, out, err = solrl(capsys, "config", *argv)
    assert code == 0, err
    return out


def recipe(tmp_path, capsys, *argv) -> Path:
    """What `solrl config ARGV` prints, written to a file as a user would keep it."""
    path = tmp_path / "recipe.yaml"
    path.write_text(printed(capsys, *argv), encoding="utf-8")
    return path


def written(tmp_path, content) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


@pytest.mark.parametrize("argv", [
    [],
    ["--preset", "shapes-tiny", "--family", "naive_quant", "-S", "pool=48", "-S", "train.lr=5e-4"],
    ["--preset", "flux-imagereward", "-S", "model.resolution=768", "-S", "model.path=/weights/flux dev",
     "-S", "eval.rewards=[imagereward]", "-S", "quant.skip=['*proj_out*', x]"],
])
def test_what_config_prints_is_accepted_back_and_resolves_the_same(capsys, tmp_path, argv):
    path = recipe(tmp_path, capsys, *argv)
    assert printed(capsys, "--config", str(path)) == path.read_text(encoding="utf-8")


def test_a_flag_that_agrees_with_the_file_is_accepted(capsys, tmp_path):
    path = recipe(tmp_path, capsys, "--preset", "sana-hpsv2", "--family", "diffusionnft")
    again = printed(capsys, "--config", str(path), "--preset", "sana-hpsv2", "--family", "diffusionnft")
    assert again == path.read_text(encoding="utf-8")


def test_set_wins_over_the_file(capsys, tmp_path):
    path = recipe(tmp_path, capsys, "-S", "pool=48", "-S", "keep=12")
    config = yaml.safe_load(printed(capsys, "--config", str(path), "-S", "pool=32"))
    assert (config["pool"], config["keep"]) == (32, 12)


def test_a_printed_file_does_not_pin_what_the_preset_derives(capsys, tmp_path):
    """FLUX's timestep shift follows model.resolution; the printed file restates the shift, and
    -S model.resolution on top of it must move the shift as it does without the file."""
    path = recipe(tmp_path, capsys, "--preset", "flux-imagereward")
    with_file = yaml.safe_load(printed(capsys, "--config", str(path), "-S", "model.resolution=1024"))
    without = yaml.safe_load(printed(capsys, "--preset", "flux-imagereward", "-S", "model.resolution=1024"))
    assert with_file == without


def test_a_short_file_sets_what_it_names(capsys, tmp_path):
    path = tmp_path / "short.yaml"
    path.write_text("preset: shapes-tiny\nfamily: diffusionnft\ntrain:\n  lr: 1e-4\nexplore.steps: 4\n")
    config = yaml.safe_load(printed(capsys, "--config", str(path)))
    assert (config["family"], config["train"]["lr"], config["explore"]["steps"]) == ("diffusionnft", 1e-4, 4)


@pytest.mark.parametrize("flag, value", [("--preset", "flux-imagereward"), ("--family", "diffusionnft")])
def test_a_flag_against_the_files_name_is_one_line(capsys, tmp_path, flag, value):
    path = recipe(tmp_path, capsys)  # shapes-tiny, sol_rl
    code, out, err = solrl(capsys, "config", "--config", str(path), flag, value)
    one_line_error(code, err, str(path), value, "disagree")
    assert out == ""


BAD_FILES = {
    "unknown key": ("pool: 8\nexplor:\n  steps: 4\n", ["explor.steps", "explore.steps"]),
    "unknown dotted key": ("train.lrr: 1e-3\n", ["train.lrr"]),
    "wrong type": ("pool: many\n", ["pool", "many"]),
    "out of range": ("keep: 5\n", ["keep"]),
    "section as a value": ("explore: 4\n", ["explore"]),
    "unknown preset": ("preset: flux-schnell\n", ["preset", "flux-schnell"]),
    "preset not a name": ("preset: [a]\n", ["preset"]),
    "not a mapping": ("- pool=8\n", ["mapping"]),
    "empty": ("", ["mapping"]),
    "binary": (b"pool: 8\n\xff\xfe\x00garbage\n", ["line 2", "UTF-8"]),
    "nested too deep": ("a: " + "[" * 200 + "]" * 200 + "\n", ["nested deeper"]),
    "broken yaml": ("pool: [8\n", ["not valid YAML"]),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_bad_file_is_one_line_naming_it(capsys, tmp_path, name):
    content, needles = BAD_FILES[name]
    path = written(tmp_path, content)
    for command in ("config", "check", "run"):
        argv = [command, "--config", str(path)] + (["--out", str(tmp_path / "out")] if command == "run" else [])
        code, _, err = solrl(capsys, *argv)
        one_line_error(code, err, str(path), *needles)
    assert not (tmp_path / "out").exists()


def test_a_missing_file_or_a_folder_is_one_line(capsys, tmp_path):
    for path in (tmp_path / "nope.yaml", tmp_path):
        code, _, err = solrl(capsys, "config", "--config", str(path))
        one_line_error(code, err, str(path))


def test_a_resumed_run_keeps_its_own_config(capsys, tmp_path):
    path = recipe(tmp_path, capsys)
    code, _, err = solrl(capsys, "run", "--resume", str(tmp_path), "--config", str(path))
    one_line_error(code, err, "--config", "--resume")


class RecordingRunners:
    """The flow side of `solrl run`, recording what it was asked to run instead of training."""

    def __init__(self):
        self.parameters = None

    def run_locally(self, **parameters):
        self.parameters = parameters
        return {"family": parameters["family"], "preset": parameters["preset"], "iterations": 1, "seconds": 0,
                "eval_reward_base": {}, "eval_reward_final": {}, "outputs": {"run": parameters["out"]}}

    def runners(self):
        return cli.FlowRunners(run_locally=self.run_locally, train_in_flow_context=None)


def test_run_hands_the_file_to_the_flow_as_settings_ahead_of_set(capsys, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("family: diffusionnft\niterations: 7\npool: 8\nkeep: 8\nprompts_per_iteration: 1\n")
    recorder = RecordingRunners()
    code, _, err = solrl(capsys, "run", "--config", str(path), "--iterations", "2", "-S", "keep=4",
                         "--out", str(tmp_path / "out"), "--no-tracking", runners=recorder.runners())
    assert code == 0, err
    # --iterations is short for -S iterations: it wins over the file, whose own is left out.
    assert recorder.parameters["family"] == "diffusionnft" and recorder.parameters["iterations"] == 2
    assert recorder.parameters["overrides"] == ["pool=8", "keep=8", "prompts_per_iteration=1", "keep=4"]


def test_a_deployment_merges_the_file_as_the_command_line_does(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("preset: shapes-tiny\niterations: 7\npool: 48\n")
    assert merged(str(path), None, None, ["keep=12"], None) == ("shapes-tiny", "sol_rl",
                                                                ["iterations=7", "pool=48", "keep=12"])
    assert merged(str(path), None, None, [], 3)[2] == ["pool=48"]
    assert merged(None, "p", None, ["a=1"], None) == ("p", None, ["a=1"])


def test_the_flow_and_every_deployment_take_config_file():
    tree = ast.parse((ROOT / "flows/solrl.py").read_text(encoding="utf-8"))
    flow = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "solrl")
    arguments = {argument.arg for argument in flow.args.args}
    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text(encoding="utf-8"))["deployments"]
    assert all("config_file" in deployment["parameters"] for deployment in deployments)
    assert all(set(deployment["parameters"]) <= arguments for deployment in deployments)


@pytest.mark.parametrize("command, names", [("presets", {name: p["description"] for name, p in PRESETS.items()}),
                                            ("families", {name: f.description for name, f in FAMILIES.items()})])
def test_presets_and_families_list_each_name_with_its_description(capsys, command, names):
    code, out, err = solrl(capsys, command)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) == len(names)
    for line, (name, description) in zip(lines, names.items()):
        assert line.split(maxsplit=1) == [name, description]


@pytest.mark.parametrize("command", ["run", "check", "config"])
def test_preset_and_family_help_say_how_to_list_them(capsys, command):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "`solrl presets` lists them" in text and "`solrl families` lists them" in text


def fingerprint(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


@pytest.fixture
def packaged_untouched():
    before = fingerprint(SHAPES_TINY_CHECKPOINT)
    yield
    assert fingerprint(SHAPES_TINY_CHECKPOINT) == before


def test_pretrain_needs_a_named_output(capsys, packaged_untouched):
    code, _, err = solrl(capsys, "pretrain")
    one_line_error(code, err, "--out", "--overwrite-packaged")


def test_pretrain_refuses_the_packaged_checkpoint_without_the_flag(capsys, tmp_path, monkeypatch,
                                                                   packaged_untouched):
    link = tmp_path / "base.safetensors"
    link.symlink_to(SHAPES_TINY_CHECKPOINT)
    monkeypatch.chdir(SHAPES_TINY_CHECKPOINT.parent)
    for out in (str(SHAPES_TINY_CHECKPOINT), SHAPES_TINY_CHECKPOINT.name, str(link)):
        code, _, err = solrl(capsys, "pretrain", "--out", out, "--steps", "1")
        one_line_error(code, err, out, "packaged", "--overwrite-packaged")


def test_the_flag_lets_pretrain_write_the_packaged_checkpoint(capsys, monkeypatch, packaged_untouched):
    import solrl_core.world.pretrain as pretraining

    written_to = []
    monkeypatch.setattr(pretraining, "pretrain", lambda out, settings: written_to.append(out) or
                        {"seconds": 0, "final_loss": 0.0})
    for argv in (["--overwrite-packaged"], ["--overwrite-packaged", "--out", os.path.relpath(SHAPES_TINY_CHECKPOINT)]):
        code, _, err = solrl(capsys, "pretrain", *argv)
        assert code == 0, err
    assert [Path(out).resolve() for out in written_to] == [SHAPES_TINY_CHECKPOINT] * 2


def test_the_dvc_base_stage_passes_the_flag_and_its_lock_agrees():
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["base"]
    locked = yaml.safe_load((ROOT / "dvc.lock").read_text(encoding="utf-8"))["stages"]["base"]
    assert "--overwrite-packaged" in stage["cmd"] and locked["cmd"].endswith("--overwrite-packaged")
