"""FLUX-class transformers (diffusers FluxTransformer2DModel): the forward call and token ids.

Shared by the embedded world (a tiny instance) and FLUX.1-dev, so both run the same code path.
"""

from __future__ import annotations

import torch

from solrl_core.models.policy import ForwardFn


def image_token_ids(grid_height: int, grid_width: int) -> torch.Tensor:
    """Rotary position ids [H*W, 3] of a packed latent grid: (0, row, column)."""
    ids = torch.zeros(grid_height, grid_width, 3)
    ids[..., 1] = torch.arange(grid_height)[:, None]
    ids[..., 2] = torch.arange(grid_width)[None, :]
    return ids.reshape(grid_height * grid_width, 3)


def make_flux_forward(grid_height: int, grid_width: int, guidance: float | None) -> ForwardFn:
    """A forward for packed latents [B, H*W, C]; ``guidance`` only for guidance-distilled models."""
    img_ids = image_token_ids(grid_height, grid_width)

    def forward(transformer: torch.nn.Module, latents: torch.Tensor, sigma: torch.Tensor,
                conditioning: dict[str, torch.Tensor]) -> torch.Tensor:
        prompt_embeds = conditioning["prompt_embeds"]
        kwargs = {}
        if guidance is not None:
            kwargs["guidance"] = torch.full((latents.shape[0],), guidance, device=latents.device, dtype=torch.float32)
        # diffusers' FLUX takes timestep in [0, 1] and scales it by 1000 internally.
        return transformer(
            hidden_states=latents,
            encoder_hidden_states=prompt_embeds,
            pooled_projections=conditioning["pooled_prompt_embeds"],
            timestep=sigma.to(latents.dtype),
            img_ids=img_ids.to(latents.device, latents.dtype),
            txt_ids=torch.zeros(prompt_embeds.shape[1], 3, device=latents.device, dtype=latents.dtype),
            return_dict=False,
            **kwargs,
        )[0]

    return forward


def pack_patches(images: torch.Tensor, patch: int) -> torch.Tensor:
    """[B, C, H, W] -> [B, (H/p)*(W/p), C*p*p], FLUX's 2x2 packing generalised to p x p."""
    batch, channels, height, width = images.shape
    grid = images.reshape(batch, channels, height // patch, patch, width // patch, patch)
    return grid.permute(0, 2, 4, 1, 3, 5).reshape(batch, (height // patch) * (width // patch), channels * patch * patch)


def unpack_patches(tokens: torch.Tensor, channels: int, height: int, width: int, patch: int) -> torch.Tensor:
    batch = tokens.shape[0]
    grid = tokens.reshape(batch, height // patch, width // patch, channels, patch, patch)
    return grid.permute(0, 3, 1, 4, 2, 5).reshape(batch, channels, height, width)
