"""Pretraining of the embedded world's base model: rectified-flow matching on rendered scenes.

Deterministic for a given seed and thread count. Held-out evaluation scenes are never shown, so
evaluation measures generalisation, and the short schedule leaves the base visibly imperfect:
room for RL to improve compliance.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from solrl_core.models.shapes_tiny import (
    CHECKPOINT,
    ShapesTextEncoder,
    TinyArchitecture,
    build_transformer,
    images_to_latents,
    save_checkpoint,
)
from solrl_core.progress import progress
from solrl_core.world.captions import VOCAB, caption, is_held_out, tokenize
from solrl_core.world.scenes import render, sample_scene


@dataclass(frozen=True)
class PretrainSettings:
    steps: int = 2000
    batch: int = 64
    lr: float = 1e-3
    warmup: int = 100
    dataset_size: int = 12288
    seed: int = 0


@dataclass
class Dataset:
    latents: torch.Tensor  # [D, L, C]
    token_ids: torch.Tensor  # [D, T]


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


def flow_matching_loss(transformer, text_encoder, forward, latents, token_ids, generator) -> torch.Tensor:
    noise = torch.randn(latents.shape, generator=generator)
    # Logit-normal noise levels concentrate training on the middle of the trajectory (SD3's choice).
    sigma = torch.sigmoid(torch.randn(latents.shape[0], generator=generator))
    sigma_b = sigma.view(-1, 1, 1)
    noisy = (1 - sigma_b) * latents + sigma_b * noise
    states, pooled = text_encoder(token_ids)
    predicted = forward(transformer, noisy, sigma, {"prompt_embeds": states, "pooled_prompt_embeds": pooled})
    return ((predicted - (noise - latents)) ** 2).mean()


def pretrain(out: Path = CHECKPOINT, settings: PretrainSettings = PretrainSettings(), show_progress: bool = True,
             log=print) -> dict:
    from solrl_core.models.flux import make_flux_forward

    arch = TinyArchitecture(vocab_size=max(64, len(VOCAB)))
    torch.manual_seed(settings.seed)
    started = time.perf_counter()
    dataset = build_dataset(arch, settings.dataset_size, settings.seed)
    log(f"pretrain: rendered {settings.dataset_size} scenes in {time.perf_counter() - started:.1f}s")
    transformer, text_encoder = build_transformer(arch), ShapesTextEncoder(arch)
    parameters = list(transformer.parameters()) + list(text_encoder.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=0.01)
    forward = make_flux_forward(arch.grid, arch.grid, guidance=None)
    generator = torch.Generator().manual_seed(settings.seed)
    running = None
    for step in progress(range(settings.steps), "pretrain", enabled=show_progress):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        index = torch.randint(0, settings.dataset_size, (settings.batch,), generator=generator)
        loss = flow_matching_loss(transformer, text_encoder, forward, dataset.latents[index], dataset.token_ids[index],
                                  generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        value = float(loss.detach())
        running = value if running is None else 0.98 * running + 0.02 * value
        if (step + 1) % 200 == 0:
            log(f"pretrain: step {step + 1}/{settings.steps} loss {running:.4f} ({time.perf_counter() - started:.0f}s)")
    record = {**asdict(settings), "final_loss": running, "seconds": round(time.perf_counter() - started, 1),
              "parameters": sum(p.numel() for p in transformer.parameters()), "threads": torch.get_num_threads()}
    save_checkpoint(out, arch, transformer, text_encoder, record)
    return record
