"""FLUX.1-dev through diffusers' FluxPipeline: packed 2x2 VAE latents, CLIP + T5 text encoding,
guidance embedding (1.0: no classifier-free guidance). The transformer forward is the one the
embedded world uses (solrl_core.models.flux)."""

from __future__ import annotations

import torch

from solrl_core.config import ModelConfig
from solrl_core.models.flux import make_flux_forward, unpack_patches
from solrl_core.models.loading import PipelineModel, load_pipeline, pipeline_policy, resolve_model_dir
from solrl_core.models.policy import FlowPolicy

FLUX_DEV = PipelineModel(
    name="flux.1-dev",
    pipeline="FluxPipeline",
    hub_repo="black-forest-labs/FLUX.1-dev",
    env_var="SOLRL_FLUX_PATH",
    components=("transformer", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "scheduler"),
    tokenizers=(("tokenizer", "text_encoder"), ("tokenizer_2", "text_encoder_2")),
    text_encoders=("text_encoder", "text_encoder_2"),
    max_sequence_length=512,
)


def vae_scale_factor(vae) -> int:
    return 2 ** (len(vae.config.block_out_channels) - 1)


def packed_grid(resolution: int, vae) -> int:
    """Side of the packed token grid: VAE downsampling, then 2x2 packing."""
    factor = vae_scale_factor(vae) * 2
    if resolution % factor:
        raise ValueError(f"model.resolution ({resolution}) must be a multiple of {factor} for FLUX")
    return resolution // factor


def load_flux(model_config: ModelConfig, device: torch.device, dtype: torch.dtype,
              spec: PipelineModel = FLUX_DEV) -> FlowPolicy:
    pipe = load_pipeline(spec, resolve_model_dir(spec, model_config.path), dtype)
    grid = packed_grid(model_config.resolution, pipe.vae)
    channels = pipe.transformer.config.in_channels  # 64 = 16 VAE channels x 2 x 2
    guidance = model_config.guidance if pipe.transformer.config.guidance_embeds else None

    def encode_batch(prompts: list[str]) -> dict[str, torch.Tensor]:
        prompt_embeds, pooled, _ = pipe.encode_prompt(prompt=prompts, prompt_2=None, device=device,
                                                      max_sequence_length=spec.max_sequence_length)
        return {"prompt_embeds": prompt_embeds, "pooled_prompt_embeds": pooled}

    def decode_latents(tokens: torch.Tensor) -> torch.Tensor:
        latents = unpack_patches(tokens, channels // 4, 2 * grid, 2 * grid, patch=2)
        latents = latents / pipe.vae.config.scaling_factor + (pipe.vae.config.shift_factor or 0.0)
        return pipe.vae.decode(latents, return_dict=False)[0]

    return pipeline_policy(spec, pipe, make_flux_forward(grid, grid, guidance), encode_batch, decode_latents,
                           (grid * grid, channels), device, dtype, model_config.offload_encoders)
