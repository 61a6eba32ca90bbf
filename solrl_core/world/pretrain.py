"""Pretraining of the embedded world's base model: rectified-flow matching on rendered scenes.

Deterministic for a given seed and thread count. Held-out evaluation scenes are never shown, so
evaluation measures generalisation. The checkpoint holds an exponential moving average of the
weights (what diffusion models are sampled from), and a long run saves its whole state (weights,
their average, the optimizer, the random generator) every ``state_every`` steps beside the output,
so a stopped run resumes to exactly the weights an uninterrupted one would have reached.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from solrl_core.models.flux import make_flux_forward
from solrl_core.models.shapes_tiny import (
    ShapesTextEncoder,
    TinyArchitecture,
    build_transformer,
    images_to_latents,
    save_checkpoint,
)
from solrl_core.progress import progress
from solrl_core.world import SHAPES_TINY_CHECKPOINT
from solrl_core.world.captions import VOCAB, caption, is_held_out, tokenize
from solrl_core.world.scenes import render, sample_scene

# The committed checkpoint must stay small enough for the repository (issue: <= 20 MB).
CHECKPOINT_LIMIT_BYTES = 20 * 1024 * 1024
HEAD_DIM = TinyArchitecture().attention_head_dim


class PretrainError(ValueError):
    """A pretraining request that cannot be carried out; the message is one actionable line."""


@dataclass(frozen=True)
class PretrainSettings:
    steps: int = 4000
    batch: int = 64
    lr: float = 1e-3
    warmup: int = 200
    dataset_size: int = 32768
    seed: int = 0
    heads: int = 4  # transformer width = heads x 16
    ema_decay: float = 0.999
    state_every: int = 250


@dataclass
class Dataset:
    latents: torch.Tensor  # [D, L, C]
    token_ids: torch.Tensor  # [D, T]


def architecture(settings: PretrainSettings) -> TinyArchitecture:
    return TinyArchitecture(vocab_size=max(64, len(VOCAB)), num_attention_heads=settings.heads)


def check_settings(settings: PretrainSettings) -> TinyArchitecture:
    """Refuse, before anything is rendered, settings that cannot train or whose checkpoint would
    not fit the repository."""
    for name in ("steps", "batch", "dataset_size", "heads", "state_every"):
        if getattr(settings, name) < 1:
            raise PretrainError(f"pretraining {name} ({getattr(settings, name)}) must be >= 1")
    if not 0.0 <= settings.ema_decay < 1.0 or not settings.lr > 0:
        raise PretrainError(f"pretraining needs 0 <= ema_decay < 1 and lr > 0 (got {settings.ema_decay}, "
                            f"{settings.lr})")
    arch = architecture(settings)
    parameters = sum(p.numel() for p in build_transformer(arch).parameters()) + \
        sum(p.numel() for p in ShapesTextEncoder(arch).parameters())
    size = 4 * parameters
    if size > CHECKPOINT_LIMIT_BYTES:
        raise PretrainError(
            f"a {settings.heads}-head model has {parameters:,} parameters ({size / 2**20:.1f} MiB in fp32), over "
            f"the {CHECKPOINT_LIMIT_BYTES / 2**20:.0f} MiB checkpoint limit; choose fewer heads")
    return arch


def build_dataset(arch: TinyArchitecture, size: int, seed: int) -> Dataset:
    """Rendered training scenes and their captions (varied wording), held-out scenes excluded."""
    rng = random.Random(f"shapes-pretrain|{seed}")
    images, captions = [], []
    while len(images) < size:
        scene = sample_scene(rng)
        if is_held_out(scene):
            continue
        images.append(render(scene, arch.image_size))
        captions.append(caption(scene, rng))
    return Dataset(latents=images_to_latents(torch.stack(images), arch), token_ids=tokenize(captions, arch.max_tokens))


def learning_rate(step: int, settings: PretrainSettings) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress_fraction = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress_fraction)))


def ema_decay(step: int, settings: PretrainSettings) -> float:
    """The average follows the weights closely at first (it starts from random weights), then
    settles at the configured decay."""
    return min(settings.ema_decay, (1 + step) / (10 + step))


def flow_matching_loss(transformer, text_encoder, forward, latents, token_ids, generator) -> torch.Tensor:
    noise = torch.randn(latents.shape, generator=generator)
    # Logit-normal noise levels concentrate training on the middle of the trajectory (SD3's choice).
    sigma = torch.sigmoid(torch.randn(latents.shape[0], generator=generator))
    sigma_b = sigma.view(-1, 1, 1)
    noisy = (1 - sigma_b) * latents + sigma_b * noise
    states, pooled = text_encoder(token_ids)
    predicted = forward(transformer, noisy, sigma, {"prompt_embeds": states, "pooled_prompt_embeds": pooled})
    return ((predicted - (noise - latents)) ** 2).mean()


class Trainee:
    """What pretraining changes: the two networks, their moving average, the optimizer, the
    generator, and the record of how far it got. Saved and restored as one file."""

    def __init__(self, arch: TinyArchitecture, settings: PretrainSettings):
        torch.manual_seed(settings.seed)
        self.transformer, self.text_encoder = build_transformer(arch), ShapesTextEncoder(arch)
        self.named = {**{f"transformer.{k}": p for k, p in self.transformer.named_parameters()},
                      **{f"text_encoder.{k}": p for k, p in self.text_encoder.named_parameters()}}
        self.average = {name: p.detach().clone() for name, p in self.named.items()}
        self.optimizer = torch.optim.AdamW(list(self.named.values()), lr=settings.lr, weight_decay=0.01)
        self.generator = torch.Generator().manual_seed(settings.seed)
        self.step, self.running_loss, self.seconds, self.losses = 0, None, 0.0, []

    @torch.no_grad()
    def update_average(self, decay: float) -> None:
        for name, parameter in self.named.items():
            self.average[name].lerp_(parameter.detach(), 1.0 - decay)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        tensors = {f"weights.{k}": p.detach().contiguous() for k, p in self.named.items()}
        tensors.update({f"average.{k}": v.contiguous() for k, v in self.average.items()})
        for index, slots in self.optimizer.state_dict()["state"].items():
            tensors.update({f"optimizer.{index}.{slot}": value.contiguous() for slot, value in slots.items()})
        tensors["generator"] = self.generator.get_state()
        return tensors

    def save_state(self, path: Path, settings: PretrainSettings) -> None:
        metadata = {"settings": json.dumps(asdict(settings)), "step": str(self.step),
                    "running_loss": json.dumps(self.running_loss), "seconds": json.dumps(self.seconds),
                    "losses": json.dumps(self.losses), "threads": str(torch.get_num_threads())}
        temporary = path.with_name(path.name + ".tmp")
        save_file(self.state_tensors(), str(temporary), metadata=metadata)
        temporary.replace(path)

    @torch.no_grad()
    def load_state(self, path: Path, settings: PretrainSettings, log) -> None:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        if json.loads(metadata.get("settings", "null")) != json.loads(json.dumps(asdict(settings))):
            raise PretrainError(f"{path} is the saved state of a pretraining with other settings; delete it to "
                                "start afresh, or pretrain with the settings it records")
        tensors = load_file(str(path))
        for name, parameter in self.named.items():
            parameter.copy_(tensors[f"weights.{name}"])
            self.average[name].copy_(tensors[f"average.{name}"])
        optimizer_state = self.optimizer.state_dict()
        for index in range(len(self.named)):
            slots = {key.rsplit(".", 1)[1]: value for key, value in tensors.items()
                     if key.startswith(f"optimizer.{index}.")}
            if slots:
                optimizer_state["state"][index] = slots
        self.optimizer.load_state_dict(optimizer_state)
        self.generator.set_state(tensors["generator"])
        self.step, self.seconds = int(metadata["step"]), json.loads(metadata["seconds"])
        self.running_loss, self.losses = json.loads(metadata["running_loss"]), json.loads(metadata["losses"])
        if int(metadata.get("threads", torch.get_num_threads())) != torch.get_num_threads():
            log(f"pretrain: the state was written with {metadata['threads']} threads, this run has "
                f"{torch.get_num_threads()}: float rounding (not the recipe) may differ from an uninterrupted run")
        log(f"pretrain: resumed from {path} at step {self.step}")

    def averaged_networks(self, arch: TinyArchitecture) -> tuple[torch.nn.Module, torch.nn.Module]:
        transformer, text_encoder = build_transformer(arch), ShapesTextEncoder(arch)
        # Strict: every parameter is averaged and neither network has buffers, so nothing may be left out.
        transformer.load_state_dict({k[len("transformer."):]: v for k, v in self.average.items()
                                     if k.startswith("transformer.")})
        text_encoder.load_state_dict({k[len("text_encoder."):]: v for k, v in self.average.items()
                                      if k.startswith("text_encoder.")})
        return transformer, text_encoder


def state_path(out: Path) -> Path:
    """Where a pretraining writing ``out`` keeps its resumable state (removed when it finishes)."""
    return out.with_name(out.name + ".pretrain-state")


def pretrain(out: Path = SHAPES_TINY_CHECKPOINT, settings: PretrainSettings = PretrainSettings(), show_progress: bool = True,
             log=print, stop_after: int | None = None) -> dict:
    """Train (or resume) and write the averaged weights to ``out``; ``stop_after`` ends the run
    after that many steps with only its state saved, as a stopped machine would."""
    arch = check_settings(settings)
    started = time.perf_counter()
    dataset = build_dataset(arch, settings.dataset_size, settings.seed)
    log(f"pretrain: rendered {settings.dataset_size} scenes in {time.perf_counter() - started:.1f}s")
    trainee = Trainee(arch, settings)
    saved = state_path(out)
    if saved.is_file():
        trainee.load_state(saved, settings, log)
    forward = make_flux_forward(arch.grid, arch.grid, guidance=None)
    parameters = list(trainee.named.values())
    segment_start, segment_seconds = time.perf_counter(), trainee.seconds
    for step in progress(range(trainee.step, settings.steps), "pretrain", enabled=show_progress):
        for group in trainee.optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        index = torch.randint(0, settings.dataset_size, (settings.batch,), generator=trainee.generator)
        loss = flow_matching_loss(trainee.transformer, trainee.text_encoder, forward, dataset.latents[index],
                                  dataset.token_ids[index], trainee.generator)
        trainee.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        trainee.optimizer.step()
        trainee.update_average(ema_decay(step, settings))
        value = float(loss.detach())
        trainee.running_loss = value if trainee.running_loss is None else 0.98 * trainee.running_loss + 0.02 * value
        trainee.step = step + 1
        trainee.seconds = segment_seconds + time.perf_counter() - segment_start
        if trainee.step % 200 == 0:
            trainee.losses.append([trainee.step, round(trainee.running_loss, 5)])
            log(f"pretrain: step {trainee.step}/{settings.steps} loss {trainee.running_loss:.4f} "
                f"({trainee.seconds:.0f}s)")
        if trainee.step % settings.state_every == 0 and trainee.step < settings.steps:
            trainee.save_state(saved, settings)
        if stop_after is not None and trainee.step >= stop_after and trainee.step < settings.steps:
            trainee.save_state(saved, settings)
            return {"stopped_at": trainee.step}
    transformer, text_encoder = trainee.averaged_networks(arch)
    record = {**asdict(settings), "final_loss": trainee.running_loss, "seconds": round(trainee.seconds, 1),
              "loss_curve": trainee.losses, "weights": "exponential moving average",
              "parameters": sum(p.numel() for p in transformer.parameters()), "threads": torch.get_num_threads()}
    save_checkpoint(out, arch, transformer, text_encoder, record)
    saved.unlink(missing_ok=True)
    return record
