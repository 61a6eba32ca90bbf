"""The layering contributors rely on: solrl_core's imports form no cycle and never reach the
orchestrator (flows/, tasks/); config.py is the bottom layer; a family is one record."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
