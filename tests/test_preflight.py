"""`solrl check`, as a user relies on it: on the embedded world it passes; on a real preset with no
weights it lists every missing file at once, each with the -S key or variable that supplies it, in
one block with exit code 2; it finds files by the run's own rules and loads none of them."""

from __future__ import annotations

import dataclasses
import time

import pytest

from solrl_core import cli, local_files
from solrl_core.models import registry
from solrl_core.models.flux_dev import FLUX_DEV
from solrl_core.rewards import registry as rewards
from solrl_core.rewards.imagereward import BERT_TOKENIZER
from solrl_core.rewards.pickscore import PICKSCORE_PROCESSOR

# What a user sets to supply each file of flux-imagereward (its four evaluation rewards included).
SUPPLIERS = ["-S model.path=DIR", "SOLRL_FLUX_PATH", "SOLRL_IMAGEREWARD_PATH", "SOLRL_IMAGEREWARD_TOKENIZER_PATH",
             "SOLRL_CLIPSCORE_PATH", "SOLRL_PICKSCORE_PATH", "SOLRL_PICKSCORE_PROCESSOR_PATH", "SOLRL_HPSV2_PATH",
             "reward_paths={imagereward: DIR}", "reward_paths={hpsv2: DIR}"]
ENV_VARS = [name for name in SUPPLIERS if name.startswith("SOLRL_")]
FILE_TOPICS = ("model:", "reward ")


class Loaded(BaseException):
    """Raised by the stubbed loaders: the preflight loaded a model. Not an Exception, so nothing
    on the way can turn it into a finding."""


def _refuse(*args, **kwargs):
    raise Loaded("the preflight loaded weights")


@pytest.fixture
def nothing_loads(monkeypatch, tmp_path):
    """No model or reward loader may run; no variable, cache or working directory supplies files."""
    monkeypatch.setattr(registry, "load_policy", _refuse)
    for name, spec in rewards.REWARDS.items():
        monkeypatch.setitem(rewards.REWARDS, name, dataclasses.replace(spec, load=_refuse))
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(local_files, "cached_snapshot", lambda repo_id: None)  # an empty Hugging Face cache
    monkeypatch.chdir(tmp_path)  # a repo id is also tried as a path relative to here


def check(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = cli.main(["check", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out.splitlines(), err


def failed(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("  FAIL")]


def test_check_passes_on_the_embedded_world(capsys, tmp_path):
    out = tmp_path / "new" / "run"
    code, lines, _ = check(capsys, "--preset", "shapes-tiny", "--family", "sol_rl", "--out", str(out))
    assert code == 0, lines
    assert failed(lines) == []
    assert lines[-1] == "ready: the run can start"
    for topic in ("config", "model", "device", "explorer", "memory", "output"):
        assert any(line.startswith(f"  ok    {topic}:") for line in lines), (topic, lines)
    assert not (tmp_path / "new").exists()  # the writability probe leaves no folder behind


def test_check_on_a_real_preset_lists_every_missing_file_at_once(capsys, nothing_loads):
    started = time.perf_counter()
    code, lines, _ = check(capsys, "--preset", "flux-imagereward")
    assert time.perf_counter() - started < 60  # no weights read; the FLUX memory model imports diffusers
    assert code == 2
    assert lines[-1].startswith("not ready:") and all(line.startswith("  ") for line in lines[:-1])  # one block
    missing = [line for line in failed(lines) if line.startswith(FILE_TOPICS, len("  FAIL  "))]
    # FLUX.1-dev, the four reward models, ImageReward's tokenizer and PickScore's processor.
    assert len(missing) == 7, "\n".join(missing)
    text = "\n".join(missing)
    for supplier in SUPPLIERS:
        assert supplier in text, supplier


def test_check_reads_no_weights_it_finds_the_files_by_the_runs_rules(capsys, nothing_loads, tmp_path, monkeypatch):
    """Placeholder files (empty, so unloadable) in the layouts the run expects satisfy every file
    check: the preflight looks at names and layout, as the run's own checks do."""
    model = tmp_path / "flux"
    for component in FLUX_DEV.components:
        (model / component).mkdir(parents=True)
    (model / "model_index.json").touch()
    monkeypatch.setenv(FLUX_DEV.env_var, str(model))
    for name in ("imagereward", "clipscore", "pickscore", "hpsv2"):
        files = rewards.REWARDS[name].files
        _placeholders(tmp_path / name, files.required)
        monkeypatch.setenv(files.env_var, str(tmp_path / name))
    _placeholders(tmp_path / "imagereward" / "tokenizer", BERT_TOKENIZER.required)
    _placeholders(tmp_path / "pickscore", PICKSCORE_PROCESSOR.required)

    code, lines, _ = check(capsys, "--preset", "flux-imagereward")
    file_lines = [line for line in lines if line[len("  FAIL  "):].startswith(FILE_TOPICS)]
    assert len(file_lines) == 7 and failed(file_lines) == [], "\n".join(file_lines)
    assert any(str(tmp_path / "imagereward" / "tokenizer") in line for line in file_lines)
    # Only what this machine lacks may remain (a CPU's memory for FLUX.1-dev).
    assert {line.split(":")[0].split()[-1] for line in failed(lines)} <= {"memory", "device"}
    assert code == (2 if failed(lines) else 0)


def _placeholders(folder, required) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for requirement in required:
        (folder / requirement.split("|")[0]).touch()


def test_check_refuses_an_output_directory_a_run_would_refuse(capsys, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("someone's files")
    code, lines, _ = check(capsys, "--out", str(taken))
    assert code == 2
    assert [line for line in failed(lines)] == [f"  FAIL  output: output directory {taken} is not empty; "
                                                "choose a new --out (or --resume it)"]


def test_check_says_why_an_explicit_backend_cannot_run(capsys):
    code, lines, _ = check(capsys, "-S", "explore.backend=te-nvfp4")
    if not failed(lines):
        pytest.skip("this machine runs te-nvfp4")
    assert code == 2
    assert [line.split(":")[0] for line in failed(lines)] == ["  FAIL  explorer"]
    assert "te-nvfp4" in failed(lines)[0]


def test_a_bad_config_is_one_line(capsys):
    code, lines, err = check(capsys, "--preset", "no-such-preset")
    assert code == 2 and lines == []
    assert err.startswith("solrl: error: unknown preset") and err.count("\n") == 1
