"""`solrl compare --restate` (a committed comparison's statistics recomputed from its own per-seed
curves) and `solrl study power` (what a planned study can resolve, from a pilot's spreads)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from flows.cli import main

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "reports" / "compare.json"


def test_restate_rewrites_the_statistics_and_the_page_from_the_report_alone(tmp_path, capsys):
    shutil.copy(STUDY, tmp_path / "compare.json")
    recorded = json.loads(STUDY.read_text())
    assert main(["compare", "--restate", "--out", str(tmp_path)]) == 0
    restated = json.loads((tmp_path / "compare.json").read_text())
    # The committed report is already restated: doing it again changes no interval or verdict.
    for pair, entry in recorded["seed_statistics"]["final_differences"].items():
        again = restated["seed_statistics"]["final_differences"][pair]
        assert again["ci"] == entry["ci"] and again["verdict"] == entry["verdict"]
    table = (tmp_path / "compare.md").read_text()
    assert "### Claims" in table and "| random_pool - diffusionnft |" in table and "not resolved" in table
    assert (tmp_path / "README.md").is_file()
    # Another declared share gives another speed-up target, and says so.
    assert main(["compare", "--restate", "--speedup-fraction", "0.25", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "compare.json").read_text())["speedup_fraction"] == 0.25


def test_restate_without_a_report_or_with_a_bad_share_is_one_line(tmp_path, capsys):
    assert main(["compare", "--restate", "--out", str(tmp_path)]) == 2
    assert "holds no compare.json" in capsys.readouterr().err
    assert main(["compare", "--restate", "--speedup-fraction", "1.5", "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--speedup-fraction" in error
    (tmp_path / "compare.json").write_text(json.dumps({"families": {}}))
    assert main(["compare", "--restate", "--out", str(tmp_path)]) == 2
    assert "cannot be restated" in capsys.readouterr().err


def test_power_of_the_planned_study_from_a_pilot(capsys):
    assert main(["study", "power", "--params", str(ROOT / "params.yaml"), "--pilot", str(STUDY)]) == 0
    out = capsys.readouterr().out
    assert "3 seeds a family" in out and "| sol_rl - diffusionnft |" in out
    row = next(line for line in out.splitlines() if line.startswith("| sol_rl - diffusionnft |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    # More seeds for a smaller difference, and more again under the correction.
    assert int(cells[4]) > int(cells[5]) and int(cells[6]) >= int(cells[4])


def test_power_refuses_a_file_that_is_not_a_comparison(tmp_path, capsys):
    not_json = tmp_path / "pilot.json"
    not_json.write_text("no")
    assert main(["study", "power", "--params", str(ROOT / "params.yaml"), "--pilot", str(not_json)]) == 2
    assert "not JSON" in capsys.readouterr().err
    not_report = tmp_path / "other.json"
    not_report.write_text(json.dumps({"a": 1}))
    assert main(["study", "power", "--params", str(ROOT / "params.yaml"), "--pilot", str(not_report)]) == 2
    assert "not a comparison report" in capsys.readouterr().err
