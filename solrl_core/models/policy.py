"""The policy as the pipeline sees it: a flow transformer plus the data that differs per model.

A loader (solrl_core.models.registry) builds a FlowPolicy; everything downstream (sampling,
exploration, the update) is generic over it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# (transformer, latents [B, ...], sigma [B], conditioning) -> velocity [B, ...]
ForwardFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]
EncodeFn = Callable[[list[str]], dict[str, torch.Tensor]]  # prompts -> per-prompt tensors [B, ...]
DecodeFn = Callable[[torch.Tensor], torch.Tensor]  # latents -> images [B, 3, H, W] in [0, 1]


@dataclass
class FlowPolicy:
    transformer: torch.nn.Module
    forward: ForwardFn
    encode: EncodeFn
    decode: DecodeFn
    latent_shape: tuple[int, ...]  # one sample's latent shape
    device: torch.device
    dtype: torch.dtype
    name: str = ""
    _prompt_cache: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict, repr=False)

    def conditioning(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """Batched conditioning; each prompt's text embedding is computed once and reused."""
        missing = sorted({p for p in prompts if p not in self._prompt_cache})
        if missing:
            with torch.no_grad():
                encoded = self.encode(missing)
            for index, prompt in enumerate(missing):
                self._prompt_cache[prompt] = {k: v[index].to(self.device, self.dtype) for k, v in encoded.items()}
        keys = self._prompt_cache[prompts[0]].keys()
        return {k: torch.stack([self._prompt_cache[p][k] for p in prompts]) for k in keys}

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, conditioning: dict[str, torch.Tensor]) -> torch.Tensor:
        # Samplers keep their state in float32; only the network runs in the policy's dtype.
        return self.forward(self.transformer, latents.to(self.dtype), sigma.to(self.device), conditioning).float()
