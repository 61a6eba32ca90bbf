"""One list syntax in every `solrl` subcommand: a list flag takes one comma-separated value
(``--seeds 0,1,2``); the space-separated form is one line saying the syntax, exit 2, nothing
written."""

from __future__ import annotations

import pytest

from flows.cli import main

SPACED = [
    (["compare", "--budget-gpu-hours", "1e-6", "--seeds", "0", "1", "--out", "{out}"], "--seeds 0,1,2"),
    (["compare", "--budget-gpu-hours", "1e-6", "--families", "sol_rl", "diffusionnft", "--out", "{out}"],
     "--families sol_rl,diffusionnft"),
    (["fidelity", "--explore-steps", "2", "4", "--out", "{out}/f.json"], "--explore-steps 2,4,6,8"),
    (["fidelity", "--backend", "fp8", "emulated-nvfp4", "--out", "{out}/f.json"], "--backend emulated-nvfp4,fp8"),
    (["sweep", "--devices", "2", "--budget-gpu-hours", "1", "--seeds", "0", "1", "--out", "{out}"], "--seeds 0,1,2"),
    (["sweep", "--devices", "2", "--budget-gpu-hours", "1", "--families", "sol_rl", "diffusionnft", "--out", "{out}"],
     "--families sol_rl,diffusionnft"),
    (["sample", "{out}", "--seeds", "0", "1"], "--seeds 0,1,2"),
]


@pytest.mark.parametrize("arguments, syntax", SPACED, ids=[" ".join(a[:1] + [a[-3]]) for a, _ in SPACED])
def test_a_space_separated_list_is_one_line_saying_the_syntax(tmp_path, capsys, arguments, syntax):
    out = tmp_path / "out"
    assert main([part.replace("{out}", str(out)) for part in arguments]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "takes one comma-separated list, e.g. " + syntax in err, err
    assert not out.exists()


def test_a_sweep_takes_the_lists_compare_takes(tmp_path, capsys):
    """The same comma-separated lists, checked the same way before Prefect starts."""
    out = tmp_path / "out"
    for arguments, message in ((["--seeds", "0,0"], "each seed once"), (["--families", "sol_rl,grpo"], "grpo"),
                               (["--devices", "0"], "--devices")):
        code = main(["sweep", "--devices", "2", "--budget-gpu-hours", "1", "--out", str(out), *arguments])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not out.exists()
