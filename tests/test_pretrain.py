"""The embedded world's base model: deterministic pretraining and the committed checkpoint."""

from __future__ import annotations

from dataclasses import replace

import torch
from diffusers import FluxTransformer2DModel
from safetensors.torch import load_file

from solrl_core.models.shapes_tiny import CHECKPOINT, read_checkpoint
from solrl_core.world.pretrain import PretrainSettings, pretrain

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
