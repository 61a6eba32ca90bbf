"""Kill a run with SIGKILL at several points of an iteration, resume it, and get exactly what a run
that was never interrupted writes: the same ledger rows, metrics and adapter weights, bit for bit.

Each run is a process of its own (tests/_run_process.py, or the `solrl` CLI with its Prefect flow);
SOLRL_FAULT makes it kill itself at the named point (solrl_core/faults.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
from safetensors.torch import load_file

from solrl_core.checkpoint import CHECKPOINT, read_metadata
from solrl_core.run_lock import LOCK_FILE
from tests._run_process import ITERATIONS, SMALL, run_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
# Keys of a metrics record that are wall-clock measurements, not results.
TIMING = ("seconds",)


def run_cli(*arguments: str, log: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    """`solrl run` in its own process group, its output in files: a SIGKILLed CLI leaves Prefect's
    ephemeral server process behind (holding any pipe open), which the group kill then stops."""
    environment = {**os.environ, "SOLRL_FAULT": fault or ""}
    stdout, stderr = log.with_suffix(".out"), log.with_suffix(".err")
    with stdout.open("w") as out, stderr.open("w") as err:
        process = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", *arguments], env=environment,
                                   cwd=ROOT, stdout=out, stderr=err, start_new_session=True)
        try:
            process.wait(timeout=900)
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return subprocess.CompletedProcess(process.args, process.returncode, stdout.read_text(), stderr.read_text())


def outputs(out: Path) -> dict:
    metrics = [{k: v for k, v in json.loads(line).items() if k not in TIMING}
               for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    return {"ledger": pl.read_parquet(out / "ledger.parquet"), "metrics": metrics,
            "lora": load_file(str(out / "lora.safetensors")), "checkpoint": load_file(str(out / CHECKPOINT)),
            "evaluations": summary["evaluations"], "final": summary["eval_reward_final"]}


def assert_identical(resumed: dict, reference: dict) -> None:
    assert resumed["ledger"].equals(reference["ledger"], null_equal=True)
    assert resumed["metrics"] == reference["metrics"]
    assert resumed["evaluations"] == reference["evaluations"] and resumed["final"] == reference["final"]
    for name in ("lora", "checkpoint"):
        assert resumed[name].keys() == reference[name].keys()
        different = [key for key in reference[name] if not torch.equal(resumed[name][key], reference[name][key])]
        assert not different, f"{name}: {different[:3]}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    assert run_process(out) == 0
    return outputs(out)


# (fault point, iteration): where in the run the process is killed.
KILL_POINTS = [
    ("explore", 1),  # mid-explore: the pool is sampled, not yet scored
    ("update", 2),  # mid-update: between the iteration's two optimizer steps
    ("ledger", 1),  # the iteration's ledger rows are written, its metrics and checkpoint are not
    ("write:metrics.jsonl", 3),  # the metrics file's temporary copy is half done (last iteration)
    ("checkpoint", 2),  # the checkpoint's temporary file is written in full, not yet renamed
]


@pytest.mark.parametrize(("point", "iteration"), KILL_POINTS, ids=[f"{p}@{i}" for p, i in KILL_POINTS])
def test_killed_run_resumes_bit_identical(reference, tmp_path, point, iteration):
    out = tmp_path / "run"
    assert run_process(out, fault=f"kill@{point}:{iteration}") == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    # The checkpoint on disk is the last complete one: never past the iteration the kill struck in.
    assert read_metadata(out)["next_iteration"] <= iteration
    assert (out / LOCK_FILE).exists(), "the killed run held the folder; its lock died with it"
    assert run_process(out, resume=True) == 0  # at once: no lock to wait for or remove
    assert_identical(outputs(out), reference)
    assert not list(out.glob(".*")), "the resumed run leaves no temporary files behind"


def test_killed_before_the_first_checkpoint_has_nothing_to_resume(tmp_path, capsys):
    from flows.cli import main

    out = tmp_path / "run"
    assert run_process(out, fault="kill@write:checkpoint.safetensors:-1") == -signal.SIGKILL
    code = main(["run", "--resume", str(out), "--no-tracking"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert "no checkpoint.safetensors" in err and "start a new run" in err
    # The line says what to do: nothing was trained; a new --out, or empty this one and reuse it.
    assert "stopped before its first checkpoint" in err and "nothing was trained" in err
    assert "samples_base.png" in err and f"reuse --out {out}" in err
    # Doing what it says works: with the listed files deleted, the same --out starts afresh.
    for leftover in out.iterdir():
        if leftover.name == LOCK_FILE:  # the killed run's lock died with it; the file is no output
            continue
        assert leftover.name == "samples_base.png" or leftover.name.startswith(".checkpoint.safetensors.")
        leftover.unlink()
    assert run_process(out, "iterations=1") == 0 and read_metadata(out)["next_iteration"] == 1


def test_resume_of_a_folder_that_is_no_run_says_so(tmp_path, capsys):
    from flows.cli import main

    (tmp_path / "notes.txt").write_text("not a run")
    assert main(["run", "--resume", str(tmp_path), "--no-tracking"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not a Sol-RL run's output directory" in err


def test_cli_run_killed_mid_explore_resumes_through_the_prefect_flow(reference, tmp_path):
    """The user's path: `solrl run` (the Prefect flow) killed, then `solrl run --resume DIR`; the
    result equals the uninterrupted run of the plain loop, so the flow adds nothing to the numbers."""
    out = tmp_path / "run"
    arguments = ["--preset", "shapes-tiny", "--family", "sol_rl", "--no-tracking", *[f"-S{o}" for o in SMALL]]
    killed = run_cli("--out", str(out), *arguments, log=tmp_path / "killed", fault="kill@explore:2")
    assert killed.returncode == -signal.SIGKILL
    assert read_metadata(out)["next_iteration"] == 2
    resumed = run_cli("--resume", str(out), "--no-tracking", log=tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    assert_identical(outputs(out), reference)


def test_a_finished_run_extends_like_a_longer_run(reference, tmp_path):
    """-S iterations=N on --resume continues a finished run; its first iterations are the shorter
    run's, so a longer budget never means starting over."""
    out = tmp_path / "run"
    assert run_process(out, f"iterations={ITERATIONS - 2}") == 0
    assert run_process(out, resume=True) == 0  # the SMALL overrides carry iterations=4
    extended = outputs(out)
    assert extended["ledger"].equals(reference["ledger"], null_equal=True)
    assert extended["metrics"][-1] == reference["metrics"][-1]
    assert all(torch.equal(extended["lora"][key], value) for key, value in reference["lora"].items())


@pytest.mark.parametrize(("arguments", "expected"), [
    (["-S", "pool=16"], "these overrides would change it: pool"),
    (["-S", "train.lr=1e-2", "-S", "seed=3"], "would change it: seed, train.lr"),
    (["--preset", "flux-imagereward"], "is preset 'shapes-tiny', not 'flux-imagereward'"),
    (["--family", "diffusionnft"], "is family 'sol_rl', not 'diffusionnft'"),
    (["--out", "elsewhere"], "leave out --out"),
], ids=["changed-key", "changed-keys", "other-preset", "other-family", "with-out"])
def test_resume_refuses_a_different_run_in_one_line(finished_run, capsys, arguments, expected):
    from flows.cli import main

    before = sorted(p.name for p in finished_run.iterdir())
    code = main(["run", "--resume", str(finished_run), "--no-tracking", *arguments])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("solrl: error:") and err.count("\n") == 0
    assert expected in err
    assert sorted(p.name for p in finished_run.iterdir()) == before


def test_resume_refuses_a_damaged_checkpoint_or_ledger(finished_run, tmp_path, capsys):
    import shutil

    from flows.cli import main

    damaged = tmp_path / "damaged"
    shutil.copytree(finished_run, damaged)
    data = (damaged / CHECKPOINT).read_bytes()
    (damaged / CHECKPOINT).write_bytes(data[: len(data) // 2])
    assert main(["run", "--resume", str(damaged), "--no-tracking"]) == 2
    assert "not a readable Sol-RL checkpoint" in capsys.readouterr().err

    edited = tmp_path / "edited"
    shutil.copytree(finished_run, edited)
    ledger = pl.read_parquet(edited / "ledger.parquet")
    ledger.head(ledger.height - 1).write_parquet(edited / "ledger.parquet")
    assert main(["run", "--resume", str(edited), "--no-tracking", "-S", "iterations=2"]) == 2
    assert "changed outside the run" in capsys.readouterr().err


def _resume_refusal(run: Path, capsys) -> str:
    from flows.cli import main

    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    code = main(["run", "--resume", str(run), "--no-tracking", "-S", "iterations=2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("solrl: error:") and err.count("\n") == 0, err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before, "a refused resume writes nothing"
    return err


def test_resume_refuses_a_ledger_edited_with_the_same_row_count(finished_run, tmp_path, capsys):
    """The README's "a ledger edited outside the run stops with exit code 2": an edit that keeps
    the row count (every explorer reward raised by 0.5) is caught by the checkpoint's digests and
    named by file and iteration."""
    import shutil

    edited = tmp_path / "edited"
    shutil.copytree(finished_run, edited)
    ledger = pl.read_parquet(edited / "ledger.parquet")
    ledger.with_columns(pl.col("explore_reward") + 0.5).write_parquet(edited / "ledger.parquet")
    err = _resume_refusal(edited, capsys)
    assert f"the rows of iteration 0 in {edited / 'ledger.parquet'} differ" in err
    assert "changed outside the run" in err


def test_resume_refuses_a_metrics_line_edited_in_place(finished_run, tmp_path, capsys):
    import shutil

    edited = tmp_path / "edited"
    shutil.copytree(finished_run, edited)
    [line] = (edited / "metrics.jsonl").read_text().splitlines()
    record = json.loads(line)
    record["kept_gap"] += 0.5
    (edited / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    err = _resume_refusal(edited, capsys)
    assert f"the line of iteration 0 in {edited / 'metrics.jsonl'} differs" in err


def test_an_untouched_run_passes_the_digest_check(finished_run, tmp_path):
    """The digests of what a run wrote match what its checkpoint recorded (the check can pass)."""
    from solrl_core.checkpoint import iteration_digests, line_digest

    metadata = read_metadata(finished_run)
    assert metadata["digests"]["ledger.parquet"] == iteration_digests(pl.read_parquet(finished_run / "ledger.parquet"))
    lines = (finished_run / "metrics.jsonl").read_text().splitlines()
    assert metadata["digests"]["metrics.jsonl"] == [line_digest(line) for line in lines]


def test_the_final_adapters_are_verified_by_their_reader(finished_run, tmp_path):
    from solrl_core.checkpoint import CheckpointError, load_verified

    tensors, _ = load_verified(finished_run / "lora.safetensors", "adapter file")
    assert tensors.keys() == load_file(str(finished_run / "lora.safetensors")).keys()
    data = bytearray((finished_run / "lora.safetensors").read_bytes())
    data[-3] ^= 0x01
    (tmp_path / "lora.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'lora.safetensors'} is damaged"):
        load_verified(tmp_path / "lora.safetensors", "adapter file")


def test_a_damaged_metrics_line_past_the_checkpoint_is_dropped_like_any_uncovered_line(finished_run, tmp_path):
    """A run killed while appending (a file system without atomic rename, a copy cut short)
    leaves a partial line after what its checkpoint covers: resuming drops it and redoes it."""
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(finished_run, cut)
    with (cut / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"iteration": 1, "explore_rew')
    assert run_process(cut, "iterations=2", resume=True) == 0
    assert [json.loads(line)["iteration"] for line in (cut / "metrics.jsonl").read_text().splitlines()] == [0, 1]
