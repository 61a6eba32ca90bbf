"""A run folder knows which code made it: its checkpoint records the package version and the
numerics fingerprint, and `solrl run --resume` under other numerics (a folder written before
fingerprints, or under another explorer) stops in one line naming both, before anything runs,
unless the user accepts the change, which the checkpoint then records."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import save_file

from _cli_checks import assert_user_error
from solrl_core import cli
from solrl_core.checkpoint import CHECKPOINT, DIGEST_KEY, load_verified, read_metadata, resumed_run, tensors_digest
from solrl_core.config import from_dict
from solrl_core.presets import validate
from solrl_core.provenance import NUMERICS_VERSION, describe, numerics_fingerprint, package_version
from solrl_core.training import run_training

OLD = "old folder"
OTHER = "other explorer"


def rewrite_metadata(run_dir, change) -> None:
    """The checkpoint as another version of the code would have written it: ``change`` edits its
    metadata, and the digest is recomputed as that code would have."""
    path = run_dir / CHECKPOINT
    tensors, metadata = load_verified(path)
    record = json.loads(metadata["solrl"])
    change(record)
    text = json.dumps(record)
    save_file(tensors, str(path), metadata={"solrl": text, DIGEST_KEY: tensors_digest(tensors, text)})


def before_fingerprints(record: dict) -> None:
    for key in ("numerics", "solrl_version", "numerics_history"):
        record.pop(key, None)


def under_fp8(record: dict) -> None:
    record["numerics"] = {**record["numerics"], "explorer": "fp8"}


def copy_of(finished_run, tmp_path, kind: str):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    rewrite_metadata(run_dir, before_fingerprints if kind == OLD else under_fp8)
    return run_dir


def run_config(run_dir):
    return validate(from_dict(read_metadata(run_dir)["config"]))


def test_the_checkpoint_records_the_package_version_and_the_numerics(finished_run):
    metadata = read_metadata(finished_run)
    assert metadata["solrl_version"] == package_version() != "unknown"
    assert metadata["numerics"] == numerics_fingerprint(run_config(finished_run))
    assert metadata["numerics"]["version"] == NUMERICS_VERSION
    assert set(metadata["numerics"]) == {"version", "explorer", "activation_scale", "solver", "dtype"}


@pytest.mark.parametrize("kind", [OLD, OTHER])
def test_a_resume_under_other_numerics_is_refused_in_one_line_naming_both(capsys, finished_run, tmp_path, kind):
    run_dir = copy_of(finished_run, tmp_path, kind)
    before = (run_dir / CHECKPOINT).read_bytes()
    code = cli.main(["run", "--resume", str(run_dir), "--iterations", "2"])
    out, err = capsys.readouterr()
    assert_user_error(code, out, err)
    print(err.strip())
    current = describe(numerics_fingerprint(run_config(run_dir)))
    recorded = "numerics 1 (written before runs recorded their numerics)" if kind == OLD else \
        describe({**numerics_fingerprint(run_config(run_dir)), "explorer": "fp8"})
    assert recorded in err and current in err and recorded != current
    assert f"solrl run --resume {run_dir} --accept-numerics-change" in err
    assert (run_dir / CHECKPOINT).read_bytes() == before  # nothing written


def test_accepting_the_change_records_it_and_the_run_continues(capsys, finished_run, tmp_path):
    run_dir = copy_of(finished_run, tmp_path, OLD)
    started = []

    def run_locally(resume, preset, family, iterations, overrides, tracking, tracking_uri):
        """What the Prefect flow does with a resume (flows/solrl.py), without the flow."""
        config, out_dir = resumed_run(resume, preset, family, iterations, overrides)
        started.append(out_dir)
        return run_training(config, out_dir, log=lambda line: None, resume=True)

    runners = cli.FlowRunners(run_locally=run_locally, train_in_flow_context=None)
    code = cli.main(["run", "--resume", str(run_dir), "--iterations", "2", "--accept-numerics-change",
                     "--no-tracking"], runners)
    capsys.readouterr()
    assert code == 0 and started == [run_dir]
    metadata = read_metadata(run_dir)
    assert metadata["next_iteration"] == 2
    assert metadata["numerics"] == numerics_fingerprint(run_config(run_dir))
    assert metadata["numerics_history"] == [{"before_iteration": 1, "numerics": {"version": 1},
                                             "solrl_version": "unknown"}]


def test_the_flag_is_for_resumes_only(capsys, tmp_path):
    code = cli.main(["run", "--out", str(tmp_path / "new"), "--accept-numerics-change"])
    out, err = capsys.readouterr()
    assert_user_error(code, out, err)
    assert not (tmp_path / "new").exists()
