"""The embedded world's model: a tiny FluxTransformer2DModel in pixel space and a word-level text
encoder, stored together in one committed safetensors file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from diffusers import FluxTransformer2DModel
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from solrl_core.models.flux import make_flux_forward, pack_patches, unpack_patches
from solrl_core.models.loading import ModelFilesMissing  # noqa: F401 - re-exported for old imports
from solrl_core.models.policy import FlowPolicy
from solrl_core.world import SHAPES_TINY_CHECKPOINT
from solrl_core.world.captions import tokenize


@dataclass(frozen=True)
class TinyArchitecture:
    image_size: int = 32
    channels: int = 3
    patch: int = 4
    num_layers: int = 2
    num_single_layers: int = 4
    attention_head_dim: int = 16
    num_attention_heads: int = 4
    text_dim: int = 32
    text_heads: int = 4
    text_layers: int = 1
    vocab_size: int = 64
    max_tokens: int = 24

    @property
    def grid(self) -> int:
        return self.image_size // self.patch

    @property
    def token_channels(self) -> int:
        return self.channels * self.patch * self.patch


class TextBlock(torch.nn.Module):
    """Pre-norm self-attention + MLP; small enough to learn which colour goes with which shape."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attention_norm = torch.nn.LayerNorm(dim)
        self.attention = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp_norm = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, states: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        normed = self.attention_norm(states)
        attended, _ = self.attention(normed, normed, normed, key_padding_mask=padding, need_weights=False)
        states = states + attended
        return states + self.mlp(self.mlp_norm(states))


class ShapesTextEncoder(torch.nn.Module):
    """Token ids [B, T] -> (token states [B, T, D], pooled [B, D]); pad id 0."""

    def __init__(self, arch: TinyArchitecture):
        super().__init__()
        self.token_embedding = torch.nn.Embedding(arch.vocab_size, arch.text_dim)
        self.position_embedding = torch.nn.Parameter(torch.zeros(arch.max_tokens, arch.text_dim))
        self.blocks = torch.nn.ModuleList(TextBlock(arch.text_dim, arch.text_heads) for _ in range(arch.text_layers))
        self.final_norm = torch.nn.LayerNorm(arch.text_dim)

    def forward(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        padding = token_ids == 0
        states = self.token_embedding(token_ids) + self.position_embedding[: token_ids.shape[1]]
        for block in self.blocks:
            states = block(states, padding)
        states = self.final_norm(states)
        keep = (~padding).unsqueeze(-1).to(states.dtype)
        pooled = (states * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        return states, pooled


# FLUX.1 gives the index axis of its position ids (0 for every token of one image or caption) 16 of
# its 128 rotary dims and splits the rest evenly between rows and columns: (16, 56, 56).
FLUX_INDEX_AXIS_DIMS = 16


def rope_axes(head_dim: int) -> tuple[int, int, int]:
    """The rotary dims of (index, row, column) for a head of ``head_dim``: FLUX.1's split, the index
    axis capped at a quarter of a small head (head dim 16 gives (4, 6, 6), the committed checkpoint's).
    The three must sum to the head dim, each even (rotary dims come in pairs), or the first forward
    fails on a size mismatch."""
    index = min(FLUX_INDEX_AXIS_DIMS, head_dim // 4)
    side, remainder = divmod(head_dim - index, 2)
    if remainder or index % 2 or side % 2:
        raise ValueError(f"attention_head_dim {head_dim} does not split into even rotary axes; use a multiple of 16")
    return index, side, side


def build_transformer(arch: TinyArchitecture) -> FluxTransformer2DModel:
    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=arch.token_channels,
        num_layers=arch.num_layers,
        num_single_layers=arch.num_single_layers,
        attention_head_dim=arch.attention_head_dim,
        num_attention_heads=arch.num_attention_heads,
        joint_attention_dim=arch.text_dim,
        pooled_projection_dim=arch.text_dim,
        guidance_embeds=False,
        axes_dims_rope=rope_axes(arch.attention_head_dim),
    )


def images_to_latents(images: torch.Tensor, arch: TinyArchitecture) -> torch.Tensor:
    """Images in [0, 1] -> packed pixel latents in [-1, 1]."""
    return pack_patches(images * 2 - 1, arch.patch)


def latents_to_images(latents: torch.Tensor, arch: TinyArchitecture) -> torch.Tensor:
    pixels = unpack_patches(latents.float(), arch.channels, arch.image_size, arch.image_size, arch.patch)
    return ((pixels + 1) / 2).clamp(0, 1)


def save_checkpoint(path: Path, arch: TinyArchitecture, transformer: torch.nn.Module,
                    text_encoder: torch.nn.Module, training: dict) -> None:
    """One safetensors file; the architecture and the training record ride in its metadata."""
    tensors = {f"transformer.{k}": v.detach().cpu().contiguous() for k, v in transformer.state_dict().items()}
    tensors.update({f"text_encoder.{k}": v.detach().cpu().contiguous() for k, v in text_encoder.state_dict().items()})
    metadata = {"architecture": json.dumps(asdict(arch)), "training": json.dumps(training)}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    save_file(tensors, str(temporary), metadata=metadata)
    temporary.replace(path)


def read_checkpoint(path: Path) -> tuple[TinyArchitecture, FluxTransformer2DModel, ShapesTextEncoder, dict]:
    if not path.is_file():
        raise ModelFilesMissing(
            f"shapes-tiny checkpoint not found at {path}; it ships with the repository "
            f"(restore it with `git checkout -- {path}`) or rebuild it with `solrl pretrain --overwrite-packaged`"
        )
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    how = "give a checkpoint written by `solrl pretrain` (-S model.path=FILE; empty: the committed one)"
    try:
        arch = TinyArchitecture(**json.loads(metadata["architecture"]))
        tensors = load_file(str(path))
        transformer = build_transformer(arch)
        text_encoder = ShapesTextEncoder(arch)
        transformer.load_state_dict(_strip(tensors, "transformer."))
        text_encoder.load_state_dict(_strip(tensors, "text_encoder."))
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        # A checkpoint of another model (or another shapes-tiny architecture than its metadata says).
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelFilesMissing(f"{path} is not a shapes-tiny checkpoint of the architecture it declares "
                                f"({first[:160]}); {how}") from None
    return arch, transformer, text_encoder, json.loads(metadata.get("training", "{}"))


def _strip(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def shapes_policy(arch: TinyArchitecture, transformer: torch.nn.Module, text_encoder: ShapesTextEncoder,
                  device: torch.device, dtype: torch.dtype) -> FlowPolicy:
    # Cast only when needed: diffusers warns on every dtype cast through `to()`.
    if next(transformer.parameters()).dtype != dtype:
        transformer.to(dtype=dtype)
        text_encoder.to(dtype=dtype)
    transformer.to(device=device).eval()
    text_encoder.to(device=device).eval().requires_grad_(False)

    def encode(prompts: list[str]) -> dict[str, torch.Tensor]:
        token_ids = tokenize(prompts, arch.max_tokens).to(device)
        states, pooled = text_encoder(token_ids)
        return {"prompt_embeds": states, "pooled_prompt_embeds": pooled}

    return FlowPolicy(
        transformer=transformer,
        forward=make_flux_forward(arch.grid, arch.grid, guidance=None),
        encode=encode,
        decode=lambda latents: latents_to_images(latents, arch),
        latent_shape=(arch.grid * arch.grid, arch.token_channels),
        device=device,
        dtype=dtype,
        name="shapes-tiny",
    )


def load_shapes_tiny(path: str, device: torch.device, dtype: torch.dtype) -> FlowPolicy:
    arch, transformer, text_encoder, _ = read_checkpoint(Path(path) if path else SHAPES_TINY_CHECKPOINT)
    return shapes_policy(arch, transformer, text_encoder, device, dtype)
