"""The embedded world's base model: deterministic pretraining and the committed checkpoint."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from diffusers import FluxTransformer2DModel
from safetensors.torch import load_file

from flows.cli import main
from solrl_core.models.shapes_tiny import read_checkpoint
from solrl_core.world import SHAPES_TINY_CHECKPOINT as CHECKPOINT
from solrl_core.world.pretrain import PretrainError, PretrainSettings, pretrain, state_path

TINY = replace(PretrainSettings(), steps=3, dataset_size=64, batch=8, warmup=2)


def test_pretraining_is_deterministic(tmp_path):
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    pretrain(first, TINY, show_progress=False, log=lambda _: None)
    pretrain(second, TINY, show_progress=False, log=lambda _: None)
    a, b = load_file(str(first)), load_file(str(second))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_pretraining_seed_changes_the_weights(tmp_path):
    pretrain(tmp_path / "a.safetensors", TINY, show_progress=False, log=lambda _: None)
    pretrain(tmp_path / "b.safetensors", replace(TINY, seed=1), show_progress=False, log=lambda _: None)
    a, b = load_file(str(tmp_path / "a.safetensors")), load_file(str(tmp_path / "b.safetensors"))
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_committed_checkpoint_is_a_small_flux_transformer_with_its_training_record():
    assert CHECKPOINT.stat().st_size <= 20 * 1024 * 1024
    arch, transformer, text_encoder, training = read_checkpoint(CHECKPOINT)
    assert isinstance(transformer, FluxTransformer2DModel)
    assert sum(p.numel() for p in transformer.parameters()) < 1_000_000
    assert training["steps"] >= 1 and training["seed"] == 0


def test_a_stopped_pretraining_resumes_to_the_uninterrupted_weights(tmp_path):
    """A long pretraining saves its whole state as it goes; stopped and started again, it reaches
    exactly the weights of a run that was never stopped, and leaves no state file behind."""
    settings = replace(TINY, steps=9, state_every=4)
    pretrain(tmp_path / "whole.safetensors", settings, show_progress=False, log=lambda _: None)
    stopped = tmp_path / "stopped.safetensors"
    assert pretrain(stopped, settings, show_progress=False, log=lambda _: None, stop_after=6) == {"stopped_at": 6}
    assert state_path(stopped).is_file() and not stopped.exists()
    pretrain(stopped, settings, show_progress=False, log=lambda _: None)
    a, b = load_file(str(tmp_path / "whole.safetensors")), load_file(str(stopped))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not state_path(stopped).exists()


def test_a_saved_state_of_other_settings_is_refused(tmp_path):
    out = tmp_path / "base.safetensors"
    pretrain(out, replace(TINY, steps=6), show_progress=False, log=lambda _: None, stop_after=2)
    with pytest.raises(PretrainError, match="other settings"):
        pretrain(out, replace(TINY, steps=6, lr=5e-4), show_progress=False, log=lambda _: None)


def test_the_checkpoint_is_the_moving_average_of_the_weights(tmp_path):
    """With decay 0 the average is the last weights; with the default decay it lags behind them."""
    pretrain(tmp_path / "last.safetensors", replace(TINY, ema_decay=0.0), show_progress=False, log=lambda _: None)
    pretrain(tmp_path / "avg.safetensors", TINY, show_progress=False, log=lambda _: None)
    last, averaged = load_file(str(tmp_path / "last.safetensors")), load_file(str(tmp_path / "avg.safetensors"))
    assert any(not torch.equal(last[k], averaged[k]) for k in last)


def solrl(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_pretraining_that_cannot_fit_the_checkpoint_limit_is_one_line(capsys, tmp_path):
    code, err = solrl(capsys, "pretrain", "--heads", "64", "--out", str(tmp_path / "big.safetensors"))
    assert code == 2
    assert err.count("\n") == 1 and "checkpoint limit" in err and "fewer heads" in err
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_of_another_architecture_is_one_line(capsys, tmp_path):
    """A safetensors file whose tensors do not match the architecture it declares (here: the
    committed weights with a wider architecture written in the metadata)."""
    from safetensors.torch import save_file
    import json
    from dataclasses import asdict

    arch, *_ = read_checkpoint(CHECKPOINT)
    other = tmp_path / "other.safetensors"
    save_file(load_file(str(CHECKPOINT)), str(other),
              metadata={"architecture": json.dumps({**asdict(arch), "num_attention_heads": 8}), "training": "{}"})
    code, err = solrl(capsys, "run", "--out", str(tmp_path / "run"), "--no-tracking", "-S", f"model.path={other}",
                      "-S", "iterations=1", "-S", "pool=4", "-S", "keep=2", "-S", "prompts_per_iteration=1")
    assert code == 2, err[-500:]
    assert err.count("\n") == 1 and "not a shapes-tiny checkpoint" in err
    assert not (tmp_path / "run").exists()
