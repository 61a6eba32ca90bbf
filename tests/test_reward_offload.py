"""Reward models off the GPU between uses (model.offload_rewards): an offloaded reward model waits
on the CPU, visits its device only while it scores, and scores exactly as a resident one. There is
no GPU here: the device is faked (recorded moves, the meta device), as for the encoders' offload in
test_real_models.py."""

from __future__ import annotations

import pytest
import torch

import _tiny
from solrl_core.rewards.registry import REWARDS, RewardSet
from solrl_core.rewards.residency import Residency

PROMPTS = ["a red fox on the snow", "a blue sky", "a cat"]
REAL = ("imagereward", "hpsv2", "pickscore", "clipscore")
# The module whose reward_device() places each reward model.
MODULE = {"imagereward": "imagereward", "hpsv2": "hpsv2", "pickscore": "clipscore", "clipscore": "clipscore"}


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))


@pytest.fixture(scope="module")
def folders(tiny_reward_folders):
    return tiny_reward_folders


@pytest.fixture(scope="module")
def images():
    return torch.rand(len(PROMPTS), 3, 40, 48, generator=torch.Generator().manual_seed(5))


class Journal:
    """What happens to one reward model: its moves (the device asked for) and its forwards."""

    def __init__(self, model: torch.nn.Module):
        self.events: list[str] = []
        move = model.to

        def recorded_move(device, *args, **kwargs):
            self.events.append(f"to {torch.device(device)}")
            return move(device, *args, **kwargs)

        model.to = recorded_move  # an instance attribute: Residency's moves go through it
        for module in model.modules():
            module.register_forward_pre_hook(self._forward)

    def _forward(self, *_):
        if not self.events or self.events[-1] != "forward":
            self.events.append("forward")


@pytest.mark.parametrize("name", REAL)
def test_an_offloaded_reward_model_waits_on_the_cpu_and_scores_as_a_resident_one(name, folders, images, monkeypatch):
    resident, offloaded = (REWARDS[name](str(folders[name]), offload) for offload in (False, True))
    journal = Journal(offloaded.model)
    scores = offloaded(images, PROMPTS)
    assert torch.equal(scores, resident(images, PROMPTS))
    device = str(offloaded.residency.device)
    # One trip per call: to the device, every forward there, back to the CPU.
    assert journal.events == [f"to {device}", "forward", "to cpu"]
    assert all(p.device.type == "cpu" for p in offloaded.model.parameters())
    offloaded(images[:1], PROMPTS[:1])
    assert journal.events[3:] == [f"to {device}", "forward", "to cpu"]
    resident_journal = Journal(resident.model)
    resident(images, PROMPTS)
    assert resident_journal.events == ["forward"]  # a resident model never moves


@pytest.mark.parametrize("name", REAL)
def test_nothing_of_an_offloaded_reward_model_is_on_the_device_from_the_start(name, folders, monkeypatch):
    """Built with the device faked as 'meta' (a real device's tensors, without the memory): an
    offloaded model's weights are on the CPU, a resident one's on the device."""
    import importlib

    module = importlib.import_module(f"solrl_core.rewards.{MODULE[name]}")
    monkeypatch.setattr(module, "reward_device", lambda: torch.device("meta"))
    offloaded = REWARDS[name](str(folders[name]), True)
    assert {p.device.type for p in offloaded.model.parameters()} == {"cpu"}
    assert offloaded.residency.device == torch.device("meta")
    resident = REWARDS[name](str(folders[name]), False)
    assert {p.device.type for p in resident.model.parameters()} == {"meta"}


def test_a_stage_keeps_its_reward_models_on_the_device_across_its_chunks(folders, images):
    """RewardSet.on_device: the stage's chunks score with one trip per model, not one per chunk."""
    names = ["clipscore", "hpsv2"]
    rewards = RewardSet({"clipscore": 1.0}, extra=["hpsv2", "shapes-compliance"],
                        paths={name: str(folders[name]) for name in names}, offload=True)
    journals = {name: Journal(rewards.models[name].model) for name in names}
    with rewards.on_device(names + ["shapes-compliance"]):
        for start in range(len(PROMPTS)):
            rewards.score(images[start:start + 1], PROMPTS[start:start + 1], names)
    for name in names:
        device = str(rewards.models[name].residency.device)
        assert journals[name].events == [f"to {device}", "forward", "to cpu"], name
        assert all(p.device.type == "cpu" for p in rewards.models[name].model.parameters())


class RecordingModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.moves: list[str] = []

    def to(self, device):  # records instead of moving: there is no GPU here
        self.moves.append(str(device))
        return self


def test_residency_brings_the_model_back_however_the_block_ends():
    model = RecordingModule()
    residency = Residency(model, torch.device("cuda"), offload=True)
    assert model.moves == ["cpu"]  # placed at home when built
    with pytest.raises(RuntimeError, match="reward failed"):
        with residency.on_device():
            with residency.on_device():  # nested: no second trip
                raise RuntimeError("reward failed")
    assert model.moves == ["cpu", "cuda", "cpu"]
    resident = RecordingModule()
    with Residency(resident, torch.device("cuda"), offload=False).on_device():
        pass
    assert resident.moves == ["cuda"]  # placed on the device once, never moved after


def test_real_presets_offload_their_reward_models_and_the_embedded_world_has_none_to_offload():
    from solrl_core.presets import resolve_config

    for preset in ("flux-imagereward", "flux-clipscore", "sana-hpsv2", "sd35l-pickscore"):
        assert resolve_config(preset, "sol_rl").model.offload_rewards, preset
    assert not resolve_config("shapes-tiny", "sol_rl").model.offload_rewards
