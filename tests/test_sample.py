"""`solrl sample`, as a user relies on it: images and a captioned grid from a run's adapters for the
prompts and seeds asked for, the same image for the same seed, EMA not the base, from a finished
run or one still running (its checkpoint), and bad input refused in one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from _cli_checks import assert_user_error
from solrl_core import cli
from solrl_core.config import parse_override
from solrl_core.presets import resolve_config
from solrl_core.training import run_training
from test_end_to_end import SMALL

PROMPTS = ["a large red circle at the top left on a white background",
           "a small blue square at the bottom right on a black background"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """What `solrl run --preset shapes-tiny --family sol_rl --iterations 1 <SMALL>` writes, made by
    the loop that command's Prefect flow runs (called directly: no flow server to start)."""
    out = tmp_path_factory.mktemp("run")
    overrides = [parse_override(text) for text in SMALL[1::2]] + [("iterations", 1)]
    run_training(resolve_config("shapes-tiny", "sol_rl", overrides), out, log=lambda line: None)
    return out


def sample(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["sample", *map(str, argv)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def test_writes_one_image_per_prompt_and_seed_and_a_captioned_grid(capsys, finished_run, tmp_path):
    code, out, _ = sample(capsys, finished_run, "--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--seeds", "3,7,9",
                          "--out", tmp_path)
    assert code == 0 and "ema adapter" in out
    index = json.loads((tmp_path / "samples-ema.json").read_text())
    assert [(image["prompt"], image["seed"]) for image in index["images"]] == \
        [(prompt, seed) for prompt in PROMPTS for seed in (3, 7, 9)]
    assert index["steps"] == 4 and index["sampler"] == "dpm2"  # the run's own eval.steps and sampler
    for image in index["images"]:
        assert pixels(tmp_path / image["file"]).shape == (32, 32, 3)
    grid = pixels(tmp_path / "grid-ema.png")
    assert grid.shape[0] > 2 * 32 and grid.shape[1] > 3 * 32  # two rows, three columns, captions beside


def test_a_seed_draws_the_same_image_whatever_else_is_asked(capsys, finished_run, tmp_path):
    sample(capsys, finished_run, "--prompt", PROMPTS[0], "--seeds", "5", "--out", tmp_path / "one")
    sample(capsys, finished_run, "--prompt", PROMPTS[1], "--prompt", PROMPTS[0], "--seeds", "4,5",
           "--out", tmp_path / "two")
    alone, among = pixels(tmp_path / "one" / "ema-p000-s5.png"), pixels(tmp_path / "two" / "ema-p001-s5.png")
    assert np.array_equal(alone, among)
    assert not np.array_equal(among, pixels(tmp_path / "two" / "ema-p001-s4.png"))  # another seed, another image


def test_ema_is_not_the_base_model(capsys, finished_run, tmp_path):
    drawn = {}
    for adapter in ("ema", "base"):
        code, _, _ = sample(capsys, finished_run, "--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--seeds", "0,1",
                            "--adapter", adapter, "--out", tmp_path)
        assert code == 0
        drawn[adapter] = [pixels(tmp_path / f"{adapter}-p{p:03d}-s{s}.png") for p in (0, 1) for s in (0, 1)]
    assert any(not np.array_equal(ema, base) for ema, base in zip(drawn["ema"], drawn["base"]))


def test_a_running_run_is_sampled_from_its_checkpoint(capsys, finished_run, tmp_path):
    running = tmp_path / "running"
    shutil.copytree(finished_run, running)
    for name in ("lora.safetensors", "summary.json"):  # written only once the run finishes
        (running / name).unlink()
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text(f"{PROMPTS[0]}\n\n")
    code, out, _ = sample(capsys, running, "--prompt-file", prompt_file, "--seeds", "0", "--out", tmp_path / "a")
    assert code == 0 and "checkpoint.safetensors" in out
    sample(capsys, finished_run, "--prompt", PROMPTS[0], "--seeds", "0", "--out", tmp_path / "b")
    assert np.array_equal(pixels(tmp_path / "a" / "ema-p000-s0.png"), pixels(tmp_path / "b" / "ema-p000-s0.png"))


@pytest.mark.parametrize("case", ["no folder", "not a run", "damaged adapters", "no prompts", "bad seeds",
                                  "empty prompt", "missing prompt file"])
def test_bad_input_is_one_line(capsys, finished_run, tmp_path, case):
    run, extra = finished_run, ["--prompt", PROMPTS[0]]
    if case == "no folder":
        run = tmp_path / "nowhere"
    elif case == "not a run":
        run = tmp_path / "empty"
        run.mkdir()
    elif case == "damaged adapters":
        run = tmp_path / "damaged"
        shutil.copytree(finished_run, run)
        (run / "lora.safetensors").write_bytes((run / "lora.safetensors").read_bytes()[:1000])
    elif case == "no prompts":
        extra = []
    elif case == "bad seeds":
        extra += ["--seeds", "1,x"]
    elif case == "empty prompt":
        extra = ["--prompt", " "]
    else:
        extra = ["--prompt-file", tmp_path / "absent.txt"]
    code, out, err = sample(capsys, run, *extra, "--out", tmp_path / "out")
    assert_user_error(code, out, err)
    assert not (tmp_path / "out").exists()  # refused before anything is written
