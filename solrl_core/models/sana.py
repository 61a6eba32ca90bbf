"""SANA 1.6B through diffusers' SanaPipeline: a deep-compression autoencoder (32x downsampling,
32 latent channels), a Gemma-2 text encoder with the pipeline's "complex human instruction"
prefix, and an attention mask over the padded prompt tokens."""

from __future__ import annotations

import inspect

import torch

from solrl_core.config import ModelConfig
from solrl_core.models.loading import PipelineModel, load_pipeline, pipeline_policy, resolve_model_dir
from solrl_core.models.policy import FlowPolicy

SANA_1600M = PipelineModel(
    name="sana-1.6b",
    pipeline="SanaPipeline",
    # The BF16 release, as the reference loads it (the default one is fp16/fp32 weights).
    hub_repo="Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers",
    env_var="SOLRL_SANA_PATH",
    components=("transformer", "vae", "text_encoder", "tokenizer", "scheduler"),
    tokenizers=(("tokenizer", "text_encoder"),),
    text_encoders=("text_encoder",),
    max_sequence_length=300,
)


def complex_human_instruction(pipe) -> list[str] | None:
    """The instruction SanaPipeline prepends by default, taken from the installed diffusers."""
    return inspect.signature(type(pipe).__call__).parameters["complex_human_instruction"].default


def latent_side(resolution: int, vae) -> int:
    factor = 2 ** (len(vae.config.encoder_block_out_channels) - 1)
    if resolution % factor:
        raise ValueError(f"model.resolution ({resolution}) must be a multiple of {factor} for SANA")
    return resolution // factor


def sana_forward(transformer: torch.nn.Module, latents: torch.Tensor, sigma: torch.Tensor,
                 conditioning: dict[str, torch.Tensor]) -> torch.Tensor:
    # The pipeline feeds the scheduler's timestep (sigma * 1000) times the model's timestep_scale.
    # In fp32: the sinusoidal embedding casts to the model's dtype only after it; a bf16 timestep
    # would be rounded to steps of 4 near 1000 first.
    timestep = sigma.float() * 1000 * transformer.config.timestep_scale
    return transformer(latents, encoder_hidden_states=conditioning["prompt_embeds"],
                       encoder_attention_mask=conditioning["prompt_attention_mask"],
                       timestep=timestep, return_dict=False)[0]


def load_sana(model_config: ModelConfig, device: torch.device, dtype: torch.dtype,
              spec: PipelineModel = SANA_1600M) -> FlowPolicy:
    pipe = load_pipeline(spec, resolve_model_dir(spec, model_config.path), dtype)
    side = latent_side(model_config.resolution, pipe.vae)
    instruction = complex_human_instruction(pipe)

    def encode_batch(prompts: list[str]) -> dict[str, torch.Tensor]:
        prompt_embeds, mask, _, _ = pipe.encode_prompt(
            prompts, do_classifier_free_guidance=False, device=device,
            max_sequence_length=spec.max_sequence_length, complex_human_instruction=instruction)
        return {"prompt_embeds": prompt_embeds, "prompt_attention_mask": mask}

    def decode_latents(latents: torch.Tensor) -> torch.Tensor:
        return pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]

    return pipeline_policy(spec, pipe, sana_forward, encode_batch, decode_latents,
                           (pipe.transformer.config.in_channels, side, side), device, dtype,
                           model_config.offload_encoders)
