"""Scale-out on torchrun (gloo on the CPU), against one process with the same config.

* 2 ranks and 1 process, 3 iterations: the same seeds, selections and dealing of kept samples to
  optimizer steps; ledger rewards, adapter
  weights and evaluations equal within TOLERANCE.
* bad scale-out input: one line, exit code 2, nothing written.
* a rank killed in the middle of an update: the run ends (exit 1) well within --rank-timeout,
  with one line naming the last good checkpoint; resuming it on 2 ranks gives the uninterrupted
  2-rank result exactly.
* a rank that hangs (alive, asleep): the run ends after --rank-timeout, exit 1, one line.
* two torchrun "nodes" on this machine (--nnodes 2, c10d rendezvous on 127.0.0.1): one job, the
  same result.

Why a tolerance and not equality: a rank's micro-batches and evaluation batches hold other samples
than one process's, and the loss shares are summed in another order, so float32 kernels may round
differently (≈1e-7 relative per operation). The explorer's chunk of 96 holds both prompt groups
in one process and one group on each rank: its activation scales are per sample, so the drafts
are the same on either layout, and on this machine the runs come out bit-identical; 1e-5 absolute
on rewards in [0, 1] and LoRA weights of order 0.5 leaves room for other kernels' rounding while
any real difference (another seed, sample or step) moves them by 1e-3 or more.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import torch
from safetensors.torch import load_file

from tests._services import BIN, ROOT, free_port

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5
ITERATIONS = 3
TINY = ["prompts_per_iteration=2", "pool=8", "keep=4", "eval.prompts=2", "eval.seeds_per_prompt=2", "eval.steps=4",
        "explore.steps=3", "explore.chunk=96", "regenerate.steps=4", "train.micro_batch=64", "progress=false",
        f"iterations={ITERATIONS}"]
RANK_TIMEOUT = 60


def _settings(*extra: str) -> list[str]:
    return [part for override in (*TINY, *extra) for part in ("-S", override)]


def _environment(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **extra}


def solrl(*arguments: str, log: Path, timeout: float = 600, **environment: str) -> subprocess.CompletedProcess:
    """`solrl run ...` in its own process group (torchrun, its ranks and Prefect's ephemeral server
    are all stopped with it), its output in files."""
    stdout, stderr = log.with_suffix(".out"), log.with_suffix(".err")
    with stdout.open("w") as out, stderr.open("w") as err:
        process = subprocess.Popen([str(BIN / "solrl"), "run", *arguments], env=_environment(**environment),
                                   cwd=ROOT, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            process.wait(timeout=timeout)
        finally:
            _stop_group(process)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout.read_text(), stderr.read_text())


def _stop_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def outputs(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    return {"ledger": pl.read_parquet(out / "ledger.parquet"), "lora": load_file(str(out / "lora.safetensors")),
            "evaluations": summary["evaluations"],
            "metrics": [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]}


def assert_equivalent(ranks: dict, one: dict) -> None:
    """Same seeds and selections; rewards, advantages, weights and evaluations within TOLERANCE."""
    left, right = ranks["ledger"], one["ledger"]
    assert left.columns == right.columns and left.height == right.height
    for column in ("iteration", "prompt_id", "seed", "selected", "update_step"):
        assert left[column].equals(right[column]), column
    for column in (name for name in left.columns if left[name].dtype == pl.Float64):
        assert left[column].is_null().equals(right[column].is_null()), column
        difference = (left[column] - right[column]).abs().max()
        assert difference is None or difference <= TOLERANCE, (column, difference)
    assert ranks["lora"].keys() == one["lora"].keys()
    for key in one["lora"]:
        assert torch.allclose(ranks["lora"][key], one["lora"][key], rtol=0, atol=TOLERANCE), key
    for mine, theirs in zip(ranks["evaluations"], one["evaluations"], strict=True):
        assert mine.keys() == theirs.keys()
        assert all(abs(mine[k] - theirs[k]) <= TOLERANCE for k in mine if k != "iteration")
    # Every rank's FLOPs are in the modeled GPU-hours: the same count as one process's.
    assert [m["flops"] for m in ranks["metrics"]] == [m["flops"] for m in one["metrics"]]


def assert_identical(resumed: dict, reference: dict) -> None:
    assert resumed["ledger"].equals(reference["ledger"], null_equal=True)
    assert resumed["evaluations"] == reference["evaluations"]
    assert all(torch.equal(resumed["lora"][k], reference["lora"][k]) for k in reference["lora"])


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one") / "run"
    command = [sys.executable, str(ROOT / "tests" / "_run_process.py"), str(out), *TINY]
    subprocess.run(command, env=_environment(), cwd=ROOT, check=True, capture_output=True, timeout=600)
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, one_process) -> tuple[Path, float]:
    folder = tmp_path_factory.mktemp("two")
    started = time.monotonic()
    result = solrl(*_settings(), "--no-tracking", "--nproc-per-node", "2", "--out", str(folder / "run"),
                   log=folder / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "run", time.monotonic() - started


def test_two_ranks_equal_one_process(two_ranks, one_process, record_property):
    out, seconds = two_ranks
    record_property("two_rank_run_s", round(seconds, 1))
    assert_equivalent(outputs(out), outputs(one_process))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iterations"] == ITERATIONS


def test_torchrun_itself_runs_the_cli(tmp_path, one_process):
    """`torchrun --nproc-per-node 2 -m flows.cli run ...`: the CLI reads torchrun's environment."""
    command = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", "-m", "flows.cli", "run",
               *_settings("iterations=1"), "--no-tracking", "--out", str(tmp_path / "run")]
    result = subprocess.run(command, env=_environment(), cwd=ROOT, capture_output=True, text=True, timeout=600,
                            start_new_session=True)
    assert result.returncode == 0, result.stderr[-3000:]
    ledger = pl.read_parquet(tmp_path / "run" / "ledger.parquet")
    reference = pl.read_parquet(one_process / "ledger.parquet").filter(pl.col("iteration") == 0)
    assert ledger["seed"].equals(reference["seed"]) and ledger["selected"].equals(reference["selected"])


@pytest.mark.parametrize("arguments, message", [
    (["-S", "prompts_per_iteration=3", "--nproc-per-node", "2"], "not divisible by the world size"),
    (["--nproc-per-node", "0"], "--nproc-per-node (0) must be >= 1"),
    # one rank per GPU: this machine shows none, so two CUDA ranks cannot start
    (["-S", "model.device=cuda", "--nproc-per-node", "2"], "needs one GPU per rank, but this machine shows 0"),
    (["--nproc-per-node", "2", "--nnodes", "2"], "needs --rdzv-endpoint"),
    (["--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:1",
      "--rank-timeout", "3"], "nothing answered"),
    (["--nproc-per-node", "1", "--nnodes", "2", "--rdzv-endpoint", "no-such-host.invalid:29400"], "cannot resolve"),
])
def test_bad_scale_out_input_is_one_line(tmp_path, arguments, message):
    out = tmp_path / "run"
    result = solrl(*_settings(), *arguments, "--no-tracking", "--out", str(out), log=tmp_path / "cli", timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr[-2000:]
    assert not out.exists()


def test_resume_on_another_world_size_is_one_line(tmp_path, one_process):
    before = {path.name: path.stat().st_mtime_ns for path in one_process.iterdir()}
    result = solrl("--resume", str(one_process), "--nproc-per-node", "2", "-S", f"iterations={ITERATIONS + 1}",
                   log=tmp_path / "cli", timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "it ran on 1" in lines[0], result.stderr
    assert {path.name: path.stat().st_mtime_ns for path in one_process.iterdir()} == before


def test_a_killed_rank_ends_the_run_and_resume_continues_it(tmp_path, two_ranks, record_property):
    out = tmp_path / "run"
    started = time.monotonic()
    # Rank 1 dies between the two optimizer steps of iteration 1; rank 0 waits in the gradient sum.
    result = solrl(*_settings(), "--no-tracking", "--nproc-per-node", "2", "--rank-timeout", str(RANK_TIMEOUT),
                   "--out", str(out), log=tmp_path / "killed", timeout=RANK_TIMEOUT + 300,
                   SOLRL_FAULT="kill@update:1", SOLRL_FAULT_RANK="1")
    record_property("failed_run_s", round(time.monotonic() - started, 1))
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert "last good checkpoint (1 iterations done)" in lines[0] and str(out) in lines[0], lines[0]

    resumed = solrl("--resume", str(out), "--no-tracking", "--nproc-per-node", "2", log=tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_identical(outputs(out), outputs(two_ranks[0]))


def test_a_hung_rank_ends_the_run_within_the_rank_timeout(tmp_path, record_property):
    """Rank 1 stays alive but never reaches its next collective (asleep in iteration 1's explore):
    rank 0 times out in the rewards' all-gather after --rank-timeout, torchrun stops rank 1, and
    the run ends with exit 1 and one line. Without the timeout this would wait for ever (the
    process wait below fails the test); the seconds it took are recorded, not asserted."""
    out = tmp_path / "run"
    timeout = 20
    started = time.monotonic()
    result = solrl(*_settings("iterations=2"), "--no-tracking", "--nproc-per-node", "2", "--rank-timeout",
                   str(timeout), "--out", str(out), log=tmp_path / "hung", timeout=timeout + 300,
                   SOLRL_FAULT="hang@explore:1", SOLRL_FAULT_RANK="1")
    record_property("hung_run_s", round(time.monotonic() - started, 1))
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert "last good checkpoint (1 iterations done)" in lines[0] and str(out) in lines[0], lines[0]
    assert lines[0].count("last good checkpoint") == 1 and "Timed out" in lines[0], lines[0]
    assert f"--resume {out}` on 2 ranks" in lines[0], lines[0]


def test_a_stage_failing_on_one_rank_is_not_retried_there(tmp_path):
    """explore retries once in one process (a transient failure); under torchrun a retry on rank 0
    alone would pair its collectives with the other rank's next ones, so the stage fails the run
    instead: exit 1, one line naming the fault and the checkpoint, no hang. The fault strikes once
    only, so a retry would have succeeded: the failure itself shows that none was made."""
    out = tmp_path / "run"
    result = solrl(*_settings("iterations=1"), "--no-tracking", "--nproc-per-node", "2", "--rank-timeout", "60",
                   "--out", str(out), log=tmp_path / "failed", timeout=400,
                   SOLRL_FAULT="raise-once@explore:0", SOLRL_FAULT_RANK="0")
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "InjectedFault" in lines[0], result.stderr[-3000:]
    assert "last good checkpoint (0 iterations done)" in lines[0], lines[0]


def test_two_nodes_on_one_machine_run_one_job(tmp_path, one_process, record_property):
    """Two `solrl run --nnodes 2` launchers (one rank each) meet at a c10d rendezvous on 127.0.0.1."""
    endpoint = f"127.0.0.1:{free_port()}"
    out = tmp_path / "run"
    started = time.monotonic()
    nodes = []
    for node_rank in (0, 1):
        log = tmp_path / f"node{node_rank}"
        command = [str(BIN / "solrl"), "run", *_settings(), "--no-tracking", "--nproc-per-node", "1", "--nnodes", "2",
                   "--node-rank", str(node_rank), "--rdzv-endpoint", endpoint, "--rank-timeout", "120",
                   "--out", str(out)]
        nodes.append((subprocess.Popen(command, env=_environment(), cwd=ROOT, stdout=log.with_suffix(".out").open("w"),
                                       stderr=log.with_suffix(".err").open("w"), stdin=subprocess.DEVNULL,
                                       start_new_session=True), log))
    try:
        for process, log in nodes:
            process.wait(timeout=600)
            assert process.returncode == 0, log.with_suffix(".err").read_text()[-3000:]
    finally:
        for process, _ in nodes:
            _stop_group(process)
    record_property("two_node_run_s", round(time.monotonic() - started, 1))
    assert_equivalent(outputs(out), outputs(one_process))


def test_ranks_on_gpus_never_outnumber_the_gpus_a_node_shows():
    from solrl_core.distributed import DistributedError
    from solrl_core.launch import Launch, check_local_gpus

    check_local_gpus(Launch(nproc_per_node=8), "cuda", visible=8)
    check_local_gpus(Launch(nproc_per_node=4), "cpu", visible=0)  # gloo ranks share the cores
    with pytest.raises(DistributedError, match=r"machine shows 2.*--nproc-per-node 2 or fewer"):
        check_local_gpus(Launch(nproc_per_node=4, nnodes=2, rdzv_endpoint="h:1"), "cuda", visible=2)
