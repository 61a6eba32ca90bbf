"""The width study (benchmarks/width_fidelity.py): what it claims about the preset's explorer, and
that widths measured by separate processes end up in one report."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.width_fidelity import merge_entry, parse_checkpoint, preset_rule_variant  # noqa: E402


def entry(width: int, note: str) -> dict:
    return {"width": width, "note": note}


def test_entries_of_separate_runs_merge_sorted_by_width_and_a_repeat_replaces_its_width(tmp_path):
    out = tmp_path / "reports" / "width.json"
    merge_entry(out, entry(128, "first"))
    merge_entry(out, entry(32, "first"))
    merged = merge_entry(out, entry(128, "again"))
    assert [(w["width"], w["note"]) for w in merged["widths"]] == [(32, "first"), (128, "again")]
    assert json.loads(out.read_text()) == merged
    assert sorted(p.name for p in out.parent.iterdir()) == ["width.json"]  # no lock or temporary left beside it


def test_a_checkpoint_argument_names_its_width_and_an_existing_file(tmp_path):
    assert parse_checkpoint("64=") == (64, "")
    checkpoint = tmp_path / "w128.safetensors"
    checkpoint.write_bytes(b"")
    assert parse_checkpoint(f"128={checkpoint}") == (128, str(checkpoint))
    with pytest.raises(argparse.ArgumentTypeError, match="WIDTH=PATH"):
        parse_checkpoint(str(checkpoint))
    with pytest.raises(argparse.ArgumentTypeError, match="--heads 8"):
        parse_checkpoint(f"128={tmp_path / 'missing.safetensors'}")


def test_a_checkpoint_of_another_width_stops_with_one_line_before_any_sampling(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/width_fidelity.py", "--checkpoint", "128=",
                           "--out", str(tmp_path / "w.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "width-64 model" in done.stderr and "64=" in done.stderr
    assert not (tmp_path / "w.json").exists()


def test_the_presets_size_rule_quantizes_only_the_mlps_of_the_committed_width_64_model():
    rule = preset_rule_variant("")
    assert rule["min_dim"] == 64
    assert rule["same_layers_as"] == ["MLPs only W4A4"]
