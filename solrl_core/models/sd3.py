"""Stable Diffusion 3.5 Large through diffusers' StableDiffusion3Pipeline: 16-channel VAE latents
(the transformer patches them itself), two CLIP encoders + T5, no classifier-free guidance."""

from __future__ import annotations

import torch

from solrl_core.config import ModelConfig
from solrl_core.models.loading import PipelineModel, load_pipeline, pipeline_policy, resolve_model_dir
from solrl_core.models.policy import FlowPolicy, ForwardFn

SD35_LARGE = PipelineModel(
    name="sd3.5-large",
    pipeline="StableDiffusion3Pipeline",
    hub_repo="stabilityai/stable-diffusion-3.5-large",
    env_var="SOLRL_SD35_PATH",
    components=("transformer", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2",
                "text_encoder_3", "tokenizer_3", "scheduler"),
    tokenizers=(("tokenizer", "text_encoder"), ("tokenizer_2", "text_encoder_2"), ("tokenizer_3", "text_encoder_3")),
    text_encoders=("text_encoder", "text_encoder_2", "text_encoder_3"),
    max_sequence_length=256,
)


def latent_side(resolution: int, vae, patch: int) -> int:
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    if resolution % (factor * patch):
        raise ValueError(f"model.resolution ({resolution}) must be a multiple of {factor * patch}")
    return resolution // factor


def sd3_forward(transformer: torch.nn.Module, latents: torch.Tensor, sigma: torch.Tensor,
                conditioning: dict[str, torch.Tensor]) -> torch.Tensor:
    # The SD3 pipeline feeds the scheduler's timestep, sigma * 1000; in fp32, as the sinusoidal
    # embedding casts to the model's dtype only after it (bf16 would round it to steps of 4).
    return transformer(hidden_states=latents, timestep=sigma.float() * 1000,
                       encoder_hidden_states=conditioning["prompt_embeds"],
                       pooled_projections=conditioning["pooled_prompt_embeds"], return_dict=False)[0]


def load_sd3(model_config: ModelConfig, device: torch.device, dtype: torch.dtype,
             spec: PipelineModel = SD35_LARGE) -> FlowPolicy:
    pipe = load_pipeline(spec, resolve_model_dir(spec, model_config.path), dtype)
    side = latent_side(model_config.resolution, pipe.vae, pipe.transformer.config.patch_size)

    def encode_batch(prompts: list[str]) -> dict[str, torch.Tensor]:
        prompt_embeds, _, pooled, _ = pipe.encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, device=device, do_classifier_free_guidance=False,
            max_sequence_length=spec.max_sequence_length)
        return {"prompt_embeds": prompt_embeds, "pooled_prompt_embeds": pooled}

    def decode_latents(latents: torch.Tensor) -> torch.Tensor:
        latents = latents / pipe.vae.config.scaling_factor + (pipe.vae.config.shift_factor or 0.0)
        return pipe.vae.decode(latents, return_dict=False)[0]

    forward: ForwardFn = sd3_forward
    return pipeline_policy(spec, pipe, forward, encode_batch, decode_latents,
                           (pipe.transformer.config.in_channels, side, side), device, dtype,
                           model_config.offload_encoders)
