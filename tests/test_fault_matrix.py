"""The fault matrix: the faults a run meets from outside (another writer, a signal, a damaged
file, a full disk, a lost server), each inflicted on a tiny run, and the outcome a user relies on.

FAULTS is the table: what happens, how the test inflicts it, the exit code, the one line on
stderr, and what holds afterwards. ``test_a_fault_ends_as_its_row_says`` drives each row and checks
the outcome against it; docs/reliability.md's section "Fault matrix" is FAULTS rendered by
``markdown_table`` (``test_the_reliability_page_shows_the_matrix``). A row whose test lives in
another module names it there.

The line's template: OUT is the run folder, HOST this machine, N and M numbers, … any text.
Each row's seconds from the fault to the exit are recorded as the property ``exit_s`` (no limit
asserted: they are figures, measured on whatever machine runs the suite). The full disk's fault is
there from the start (a small file system), so its ``exit_s`` is the whole run's.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from flows.cli import main
from solrl_core.checkpoint import CHECKPOINT, load_checkpoint, read_metadata
from tests._services import environment
from tests.test_faults import ITERATIONS as DISK_ITERATIONS
from tests.test_faults import SMALL as DISK_SMALL
from tests.test_faults import finite_lora
from tests.test_interrupt import (a_tracking_store, alive, assert_stopped_in_one_line, assert_the_server_was_running,
                                  interrupt, kill_group, mlflow_status, process_tree, resume_to_the_end, solrl_run,
                                  wait_until_gone)
from tests.test_interrupt import ITERATIONS as SIGNAL_ITERATIONS
from tests.test_readme_promises import defined_tests, sections

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
HERE = "tests/test_fault_matrix.py"
PAGE, SECTION = ROOT / "docs" / "reliability.md", "Fault matrix"

# What may hold after a fault: key -> the words the page shows.
AFTERWARDS = {
    "as it was": "the folder as it was",
    "resumes": "`--resume` runs it to its end",
    "first run whole": "the first run ends (exit 0), its records alone",
    "nothing left": "no process of the run left",
    "finishes": "the run finishes (exit 0): every iteration, its summary, its checkpoint intact",
}


@dataclass(frozen=True)
class Fault:
    id: str
    fault: str  # what happens to the run
    inflicted: str  # how the test does it
    exit_code: int
    line: str  # the one line on stderr (see the module's docstring for OUT, HOST, N, M, …)
    afterwards: tuple[str, ...]  # keys of AFTERWARDS
    test: str = f"{HERE}::test_a_fault_ends_as_its_row_says"  # where the row is driven


FAULTS = [
    Fault("second-writer", "a second run into a folder a run is writing",
          "the same tiny run started twice at once, one `--out`", 2,
          "solrl: error: run folder OUT is in use by another run (pid N on HOST, since …); wait for it to end, "
          "stop it, or choose another folder", ("first run whole", "nothing left")),
    Fault("sigint-to-the-group", "Ctrl-C", "SIGINT to the run's process group after its second checkpoint", 130,
          "solrl: interrupted after N of M iterations (checkpoint in OUT); resume with `solrl run --resume OUT`",
          ("resumes", "nothing left")),
    Fault("sigterm-to-the-main-process", "a supervisor's `kill PID`, the run tracked",
          "SIGTERM to the main process alone after its second checkpoint; MLflow run KILLED, then FINISHED by the resume",
          143, "solrl: interrupted after N of M iterations (checkpoint in OUT); resume with `solrl run --resume OUT`",
          ("resumes", "nothing left")),
    Fault("flipped-checkpoint-bytes", "a damaged checkpoint", "4 bytes of tensor data flipped, the header intact", 2,
          "solrl: error: cannot resume: OUT/checkpoint.safetensors is damaged: its contents differ from the digest "
          "it recorded when written; restore it from a copy, or start a new run", ("as it was",)),
    Fault("truncated-metrics", "a metrics file cut short", "`metrics.jsonl` cut mid-line, a line the checkpoint covers",
          2, "solrl: error: cannot resume: line 1 of OUT/metrics.jsonl is damaged (not a complete metrics record) "
          "and the checkpoint covers it; restore the file from a copy, or start a new run", ("as it was",)),
    Fault("full-disk", "the disk fills up", "`--out` on a 600 KiB tmpfs (`unshare -rm`), resumed from a copy", 1,
          "solrl: error: run failed: could not write OUT/…: No space left on device; the last good checkpoint "
          "(N iterations done) is in OUT: resume with `solrl run --resume OUT`", ("resumes", "nothing left")),
    # Driven where the servers are started (tests/test_lost_services.py), shown here with the rest.
    Fault("lost-mlflow-server", "the MLflow server dies mid-run",
          "SIGKILL to the tracking server's process group before iteration 2; restarted on its store, `--resume` logs "
          "every missed step once",
          0, "solrl: warning: MLflow tracking at URI failed in … (…); the run goes on untracked and OUT keeps its "
          "whole record; once the store answers again, `solrl run --resume OUT` logs what … is missing",
          ("finishes",),
          test="tests/test_lost_services.py::test_a_lost_mlflow_server_warns_once_and_resume_logs_every_step_once"),
    Fault("lost-prefect-server", "the Prefect server dies mid-run",
          "SIGKILL to the ephemeral server, or to the server of `PREFECT_API_URL`, before iteration 2", 0,
          "solrl: warning: lost the Prefect API at URI … (…); the run goes on without orchestration…, and OUT keeps "
          "its whole record", ("finishes",),
          test="tests/test_lost_services.py::test_a_lost_ephemeral_prefect_server_lets_the_run_finish"),
]


@dataclass
class Outcome:
    """What a fault left: the exit, and what the afterwards checks need."""
    code: int
    stderr: str
    exit_s: float
    out: Path  # the run folder the line names
    before: dict[str, bytes] | None = None  # the folder's files before the fault ("as it was")
    running: dict = field(default_factory=dict)  # the run's processes while it ran ("nothing left")
    resume: Callable[[], None] | None = None  # continues the run to its end, checking it did ("resumes")
    first_code: int | None = None  # the run that held the folder ("first run whole")


def line_pattern(template: str, out: Path) -> str:
    """The regular expression of a row's line for the run folder ``out``."""
    tokens = {"OUT": re.escape(str(out)), "HOST": re.escape(socket.gethostname()), "N": r"\d+", "M": r"\d+",
              "…": ".*"}
    parts = re.split(r"\b(OUT|HOST|N|M)\b|(…)", template)
    return "".join(tokens[part] if part in tokens else re.escape(part) for part in parts if part)


def files_of(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}


# --- watching processes ------------------------------------------------------------------------


def watch_until_they_end(processes: list[subprocess.Popen], timeout: float = 900) -> tuple[list[float], dict]:
    """Seconds until each process ended (timed as it ends), and every process seen in their trees
    meanwhile (a Prefect server, its watchdog) for the "nothing left" check."""
    started, ended, seen = time.monotonic(), {}, {}
    while len(ended) < len(processes) and time.monotonic() - started < timeout:
        for index, process in enumerate(processes):
            if index in ended:
                continue
            seen.update(process_tree(process.pid))
            if process.poll() is not None:
                ended[index] = time.monotonic() - started
        time.sleep(0.5)
    assert len(ended) == len(processes), f"still running after {timeout} s"
    return [ended[index] for index in range(len(processes))], seen


# --- inflicting each fault ---------------------------------------------------------------------


def second_writer(tmp_path: Path, request) -> Outcome:
    out = tmp_path / "run"
    command = [sys.executable, "-m", "flows.cli", "run", "--preset", "shapes-tiny", "--family", "sol_rl",
               "--iterations", "2", "--out", str(out), "--no-tracking", "-S", "prompts_per_iteration=2",
               "-S", "pool=8", "-S", "keep=4", "-S", "eval.prompts=2", "-S", "eval.steps=4", "-S", "explore.steps=3",
               "-S", "regenerate.steps=4", "-S", "progress=false"]
    processes = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True) for _ in range(2)]
    try:
        seconds, seen = watch_until_they_end(processes)
        errors = [process.stderr.read() for process in processes]
    finally:
        for process in processes:
            kill_group(process)  # Prefect's server of a run that failed a check
    codes = [process.returncode for process in processes]
    assert sorted(codes) == [0, 2], list(zip(codes, [error[-2000:] for error in errors]))
    refused, first = (0, 1) if codes[0] == 2 else (1, 0)
    return Outcome(codes[refused], errors[refused], seconds[refused], out, running=seen, first_code=codes[first])


def a_signal(signum: int, to_group: bool, tracked: bool) -> Callable[[Path, object], Outcome]:
    """SIGNUM to the run's group or its main process alone, once its second checkpoint is written."""
    def inflict(tmp_path: Path, request) -> Outcome:
        out = tmp_path / "run"
        uri = a_tracking_store(tmp_path) if tracked else None
        tracking = ["--tracking-uri", uri] if uri else ["--no-tracking"]
        measured = {}

        def record(name, value):
            measured[name] = value
            request.getfixturevalue("record_property")(name, value)

        result, running = interrupt(solrl_run("--iterations", str(SIGNAL_ITERATIONS), *tracking, "--out", str(out)),
                                    out, tmp_path / "run", signum, to_group=to_group, record_property=record)
        done = assert_stopped_in_one_line(result, signum, out, f"solrl run --resume {out}")
        assert_the_server_was_running(running)
        if uri:
            assert mlflow_status(uri, out) == "KILLED"

        def resume():
            resume_to_the_end(out, done, tmp_path / "resumed", *tracking)
            if uri:
                assert mlflow_status(uri, out) == "FINISHED", "the resume continues the same MLflow run"

        return Outcome(result.returncode, result.stderr, measured["stop_s"], out, running=running, resume=resume)

    return inflict


def refused_resume(damage: Callable[[Path], None]) -> Callable[[Path, object], Outcome]:
    """A copy of a finished one-iteration run, damaged, then `solrl run --resume` on it."""
    def inflict(tmp_path: Path, request) -> Outcome:
        out = tmp_path / "damaged"
        shutil.copytree(request.getfixturevalue("finished_run"), out)
        damage(out)
        before, capsys = files_of(out), request.getfixturevalue("capsys")
        capsys.readouterr()
        started = time.monotonic()
        code = main(["run", "--resume", str(out), "--no-tracking", "-S", "iterations=2"])
        return Outcome(code, capsys.readouterr().err, time.monotonic() - started, out, before=before)

    return inflict


def flip_tensor_bytes(out: Path) -> None:
    """Four bytes in the middle of the tensor data: safetensors loads them without complaint; the
    digest the checkpoint recorded of its tensors does not match."""
    data = bytearray((out / CHECKPOINT).read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    middle = header + (len(data) - header) // 2
    data[middle:middle + 4] = bytes(byte ^ 0xFF for byte in data[middle:middle + 4])
    (out / CHECKPOINT).write_bytes(bytes(data))


def cut_metrics_in_half(out: Path) -> None:
    text = (out / "metrics.jsonl").read_text()
    (out / "metrics.jsonl").write_text(text[: len(text) // 2])


def tiny_filesystem_available() -> bool:
    try:
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                               capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def full_disk(tmp_path: Path, request) -> Outcome:
    """A real file system too small: 600 KiB hold the base evaluation's checkpoint but not the next
    one beside it. The folder is copied off it before the namespace (and its tmpfs) goes."""
    if not tiny_filesystem_available():
        pytest.skip("needs unshare -rm and a tmpfs mount (a mount namespace)")
    mount, copy = tmp_path / "small-disk", tmp_path / "copy"
    mount.mkdir()
    out = mount / "run"
    run = (f"mount -t tmpfs -o size=600k tmpfs {mount} && {sys.executable} -m flows.cli run --preset shapes-tiny "
           f"--family sol_rl --iterations {DISK_ITERATIONS} --out {out} --no-tracking "
           f"{' '.join(DISK_SMALL[:-2])}; code=$?; cp -a {out} {copy}; exit $code")  # [:-2]: no flaky reward
    with (tmp_path / "run.err").open("w") as err:
        process = subprocess.Popen(["unshare", "-rm", "sh", "-c", run], cwd=ROOT, env=environment(),
                                   stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            [seconds], seen = watch_until_they_end([process])
        finally:
            kill_group(process)
    assert not list(copy.glob(".*")), "no temporary file is left behind"
    assert read_metadata(copy)["next_iteration"] >= 0

    def resume():
        assert main(["run", "--resume", str(copy), "--no-tracking"]) == 0
        assert (copy / "summary.json").is_file() and finite_lora(copy)

    return Outcome(process.returncode, (tmp_path / "run.err").read_text(), seconds, out, running=seen, resume=resume)


INFLICT = {
    "second-writer": second_writer,
    "sigint-to-the-group": a_signal(signal.SIGINT, to_group=True, tracked=False),
    "sigterm-to-the-main-process": a_signal(signal.SIGTERM, to_group=False, tracked=True),
    "flipped-checkpoint-bytes": refused_resume(flip_tensor_bytes),
    "truncated-metrics": refused_resume(cut_metrics_in_half),
    "full-disk": full_disk,
}


# --- what holds afterwards ---------------------------------------------------------------------


def the_folder_is_as_it_was(outcome: Outcome) -> None:
    assert files_of(outcome.out) == outcome.before, "a refused run writes nothing"


def it_resumes(outcome: Outcome) -> None:
    outcome.resume()


def the_first_run_is_whole(outcome: Outcome) -> None:
    assert outcome.first_code == 0
    lines = (outcome.out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(text)["iteration"] for text in lines] == [0, 1], "one run's records, not two"
    assert sorted(p.name for p in outcome.out.iterdir() if p.name.startswith(".")) == []


def nothing_is_left(outcome: Outcome) -> None:
    assert outcome.running, "no process was seen to check"
    wait_until_gone(outcome.running)
    assert not alive(outcome.running)


def it_finished(outcome: Outcome) -> None:
    assert outcome.code == 0 and (outcome.out / "summary.json").exists()
    load_checkpoint(outcome.out)


CHECKS = {"as it was": the_folder_is_as_it_was, "resumes": it_resumes, "first run whole": the_first_run_is_whole,
          "nothing left": nothing_is_left, "finishes": it_finished}


# --- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("row", [row for row in FAULTS if row.test.startswith(HERE)], ids=lambda row: row.id)
def test_a_fault_ends_as_its_row_says(row, tmp_path, request, record_property):
    outcome = INFLICT[row.id](tmp_path, request)
    record_property("exit_s", round(outcome.exit_s, 1))
    assert outcome.code == row.exit_code, outcome.stderr[-3000:]
    assert re.fullmatch(line_pattern(row.line, outcome.out), outcome.stderr.strip()), outcome.stderr[-3000:]
    assert "Traceback" not in outcome.stderr
    for check in row.afterwards:
        CHECKS[check](outcome)


def markdown_table() -> str:
    """FAULTS as the reliability page shows them."""
    lines = ["| fault | exit code | what the user sees | afterwards | test |", "|---|---|---|---|---|"]
    for row in FAULTS:
        file, name = row.test.split("::")
        reference = f"`{row.test}[{row.id}]`" if file == HERE else f"`{row.test}`"
        lines.append(f"| {row.fault} ({row.inflicted}) | {row.exit_code} | `` {row.line} `` | "
                     f"{'; '.join(AFTERWARDS[key] for key in row.afterwards)} | {reference} |")
    return "\n".join(lines)


def test_the_reliability_page_shows_the_matrix():
    shown = sections(PAGE.read_text(encoding="utf-8")).get(SECTION, "")
    assert markdown_table() in shown, f"docs/reliability.md's section '{SECTION}' should hold:\n{markdown_table()}"


def test_every_row_names_a_test_that_exists_and_its_outcome_words():
    assert len({row.id for row in FAULTS}) == len(FAULTS) and set(INFLICT) <= {row.id for row in FAULTS}
    for row in FAULTS:
        file, name = row.test.split("::")
        assert name in defined_tests(ROOT / file), f"{row.id}: {row.test} does not exist"
        assert row.id in INFLICT or file != HERE, f"{row.id}: nothing here inflicts it"
        assert set(row.afterwards) <= set(AFTERWARDS) == set(CHECKS), row.id
