"""The layering contributors rely on: solrl_core's imports form no cycle and never reach the
orchestrator (flows/, tasks/); config.py is the bottom layer; a family, a reward, a model and an
explorer backend are each one record that every place reading the name dispatches through."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from solrl_core.config import ConfigError
from solrl_core.families import FAMILIES, Family
from solrl_core.presets import resolve_config

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "import_cycles.py"


def _check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, timeout=60)


def test_solrl_core_has_no_import_cycle_and_no_orchestrator_import():
    result = _check(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no import cycles" in result.stdout


def test_the_check_finds_a_function_level_cycle_and_an_orchestrator_import(tmp_path):
    package = tmp_path / "solrl_core"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from solrl_core.sub import b\n")
    # The import that closes the cycle hides inside a function, as the ones this check exists for did.
    (package / "sub" / "b.py").write_text("def late():\n    from .. import a\n    return a\n")
    (package / "c.py").write_text("def start():\n    import flows.solrl\n")
    result = _check(tmp_path)
    assert result.returncode == 1
    assert "solrl_core.a, solrl_core.sub.b" in result.stdout
    assert "solrl_core.c imports flows.solrl" in result.stdout


def test_every_function_level_import_says_why_it_is_deferred(tmp_path):
    package = tmp_path / "solrl_core"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kept.py").write_text(
        "import json\n"  # the top of the module needs no comment
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    def hint():\n"
        "        import diffusers\n"  # never runs
        "def plot():\n"
        "    # deferred: matplotlib at import time (start-up of every command)\n"
        "    import matplotlib\n"
        "    import matplotlib.pyplot as plt\n"  # right below an explained import: the same comment
        "    return plt\n"
        "def extra():\n"
        "    import hpsv2  # deferred: optional package hpsv2\n")
    (package / "bare.py").write_text(
        "import json\n"
        "class Loader:\n"
        "    def load(self):\n"
        "        from safetensors.torch import load_file\n"
        "        return load_file\n"
        "def plot():\n"
        "    # lazy, for speed\n"  # not the fixed form: which package, and what start-up it spares
        "    import matplotlib\n"
        "def helper():\n"
        "    # deferred: polars at import time (start-up of the CLI)\n"
        "    x = 1\n"  # the comment must sit right above the import
        "    from solrl_core import kept\n")
    result = _check(tmp_path)
    assert result.returncode == 1
    assert [line.split(":", 2)[:2] for line in result.stdout.splitlines() if "no '# deferred:'" in line] == [
        ["solrl_core/bare.py", "4"], ["solrl_core/bare.py", "8"], ["solrl_core/bare.py", "12"]]
    (package / "bare.py").unlink()
    result = _check(tmp_path)
    assert result.returncode == 0, result.stdout
    assert "every function-level import says why it is deferred" in result.stdout


def test_config_is_the_bottom_layer():
    source = (ROOT / "solrl_core" / "config.py").read_text(encoding="utf-8")
    assert "solrl_core" not in "".join(line for line in source.splitlines(keepends=True)
                                       if line.lstrip().startswith(("import ", "from ")))


def test_a_new_family_is_one_record(monkeypatch):
    # Registering the record alone makes the name resolvable and valid everywhere names are checked.
    monkeypatch.setitem(FAMILIES, "sol_rl_small_pool", Family("sol_rl_small_pool", {"pool": 48, "keep": 24},
                                                               "sol_rl with half the pool"))
    config = resolve_config("shapes-tiny", "sol_rl_small_pool", [("progress", False)])
    assert (config.family, config.pool, config.keep) == ("sol_rl_small_pool", 48, 24)


def test_a_new_reward_is_one_record(monkeypatch):
    # The record alone: validation, the file check, the scorer and the cost model all find it.
    from solrl_core import accounting
    from solrl_core.rewards import registry

    def brightness(images, prompts):
        return images.mean(dim=(1, 2, 3))

    monkeypatch.setitem(registry.REWARDS, "brightness",
                        registry.RewardSpec("brightness", lambda: brightness, files=None, scoring_flops=5e6, parameters=0))
    config = resolve_config("shapes-tiny", "sol_rl", [("rewards", {"brightness": 1.0})])
    registry.check_reward_files(list(config.rewards))
    images = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    scores = registry.RewardSet(config.rewards).score(images, ["a", "b", "c"])
    assert torch.equal(scores.combined, brightness(images, None))
    assert accounting.scoring_flops(["brightness", "shapes-compliance"]).total == 5_000_000


def test_a_new_model_is_one_record(monkeypatch):
    # model.loader validation, the files check and the loader all dispatch through the record.
    from solrl_core.models import registry

    calls = []
    record = registry.ModelSpec("recorded", load=lambda model, device, dtype: calls.append(("load", dtype)) or "policy",
                                check_files=lambda model: calls.append(("check", model.path)))
    monkeypatch.setitem(registry.MODELS, "recorded", record)
    config = resolve_config("shapes-tiny", "sol_rl", [("model.loader", "recorded"), ("model.device", "cpu"),
                                                       ("model.path", "somewhere")])
    registry.check_model_files(config.model)
    assert registry.load_policy(config) == "policy"
    assert calls == [("check", "somewhere"), ("load", torch.float32)]
    with pytest.raises(ConfigError, match="unknown model.loader 'unrecorded'; allowed: shapes-tiny, flux, sana, sd3, recorded$"):
        resolve_config("shapes-tiny", "sol_rl", [("model.loader", "unrecorded")])


def test_the_explorer_runs_the_implementation_its_backend_record_names(monkeypatch):
    from solrl_core.quant import backends
    from solrl_core.quant.explorer import build_explorer
    from solrl_core.quant.implementations import FP8

    built = []

    class RecordedFP8(FP8):
        def __init__(self, packages=None):
            built.append(packages)

    monkeypatch.setitem(backends.BACKEND_SPECS, "fp8",
                        dataclasses.replace(backends.BACKEND_SPECS["fp8"], implementation=RecordedFP8))
    explorer = build_explorer(torch.nn.Sequential(torch.nn.Linear(32, 32)), "fp8", [], 0)
    assert isinstance(explorer._backend_impl, RecordedFP8) and built == [None]
    assert build_explorer(torch.nn.Sequential(torch.nn.Linear(32, 32)), "none", [], 0)._backend_impl is None
