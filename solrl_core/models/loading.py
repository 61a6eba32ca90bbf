"""Loading real diffusers pipelines from local files, generic over the model.

A :class:`PipelineModel` is the data that differs per model (pipeline class, expected folders,
where to look for the files); the per-model modules (flux_dev, sana, sd3) add only their
forward, text encoding and decoding. Nothing here downloads: a folder is found from
``model.path``, the model's environment variable, or the local Hugging Face cache
(``local_files_only``), and where the files are missing :class:`ModelFilesMissing` says, in one
line, what was looked for and how to provide it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from solrl_core.local_files import ModelFilesMissing, check_tokenizer, find_folder, why_not_found
from solrl_core.models.policy import FlowPolicy

__all__ = ["ModelFilesMissing", "PipelineModel", "Placement", "check_tokenizer", "load_pipeline", "pipeline_policy",
           "resolve_model_dir"]

# Latents decoded per VAE call: a 1024 px decode needs a few GB of activations per image.
DECODE_CHUNK = 4


@dataclass(frozen=True)
class PipelineModel:
    """Per-model data of a diffusers text-to-image pipeline."""

    name: str  # "flux.1-dev"
    pipeline: str  # diffusers class name, e.g. "FluxPipeline"
    hub_repo: str  # resolved in the local Hugging Face cache only
    env_var: str  # e.g. "SOLRL_FLUX_PATH"
    components: tuple[str, ...]  # sub-folders the pipeline needs
    tokenizers: tuple[tuple[str, str], ...]  # (tokenizer, its text encoder) pairs to check
    text_encoders: tuple[str, ...]
    max_sequence_length: int

    def layout(self) -> str:
        return f"a diffusers {self.pipeline} folder (model_index.json, {', '.join(c + '/' for c in self.components)})"


# ---------------------------------------------------------------------------------------------
# Where the files are


def resolve_model_dir(model: PipelineModel, path: str) -> Path:
    """The local pipeline folder: ``path`` (a folder or a cached repo id), else the env var, else
    the model's repo in the local Hugging Face cache; checks the expected layout."""
    source = path or os.environ.get(model.env_var, "") or model.hub_repo
    directory = find_folder(source)
    missing = [] if directory is None else _missing_parts(directory, model.components)
    if directory is None or missing:
        where = f"{source} ({why_not_found(source)})" if directory is None \
            else f"{directory} (missing {', '.join(missing)})"
        raise ModelFilesMissing(
            f"{model.name} weights not found at {where}; expected {model.layout()}: give it with "
            f"-S model.path=DIR or {model.env_var}=DIR, or pre-fill the Hugging Face cache with {model.hub_repo}"
        )
    return directory


def _missing_parts(directory: Path, components: Sequence[str]) -> list[str]:
    missing = [] if (directory / "model_index.json").is_file() else ["model_index.json"]
    return missing + [f"{c}/" for c in components if not (directory / c).is_dir()]


# ---------------------------------------------------------------------------------------------
# Loading


def load_pipeline(model: PipelineModel, directory: Path, dtype: torch.dtype):
    """The pipeline from local files only, every component in ``dtype``; tokenizers checked."""
    # deferred: diffusers at import time (start-up of every solrl command: validation reads the model registry)
    import diffusers

    pipeline_class = getattr(diffusers, model.pipeline)
    pipe = pipeline_class.from_pretrained(str(directory), dtype=dtype, local_files_only=True)
    for tokenizer_name, encoder_name in model.tokenizers:
        check_tokenizer(f"{model.name} {tokenizer_name}", getattr(pipe, tokenizer_name),
                        getattr(pipe, encoder_name).config.vocab_size, directory / tokenizer_name)
    return pipe


@dataclass
class Placement:
    """Where the text encoders and the VAE live: on the device, or on the CPU between uses.

    With ``offload`` they sit on the CPU and visit the device only to encode new prompts or decode
    latents, so the update (which needs neither: prompt embeddings are cached) has the device's
    memory for the transformer, its adapters and activations.
    """

    device: torch.device
    offload: bool

    def home(self) -> torch.device:
        return torch.device("cpu") if self.offload else self.device

    @contextmanager
    def on_device(self, modules: Sequence[torch.nn.Module]) -> Iterator[None]:
        if self.offload:
            for module in modules:
                module.to(self.device)
        try:
            yield
        finally:
            if self.offload:
                for module in modules:
                    module.to("cpu")


def pipeline_policy(model: PipelineModel, pipe, forward, encode_batch: Callable[[list[str]], dict[str, torch.Tensor]],
                    decode_latents: Callable[[torch.Tensor], torch.Tensor], latent_shape: tuple[int, ...],
                    device: torch.device, dtype: torch.dtype, offload: bool) -> FlowPolicy:
    """Place the components and wrap the per-model functions into a FlowPolicy."""
    placement = Placement(device, offload)
    encoders = [getattr(pipe, name) for name in model.text_encoders]
    for module in encoders + [pipe.vae]:
        module.to(placement.home()).eval().requires_grad_(False)
    pipe.transformer.to(device).eval()

    def encode(prompts: list[str]) -> dict[str, torch.Tensor]:
        with placement.on_device(encoders):
            return {k: v.to(device) for k, v in encode_batch(prompts).items()}

    def decode(latents: torch.Tensor) -> torch.Tensor:
        """Latents -> CPU images in [0, 1], a few at a time: a stage decodes its whole pool at once."""
        images = []
        with torch.no_grad(), placement.on_device([pipe.vae]):
            for chunk in latents.split(DECODE_CHUNK):
                decoded = decode_latents(chunk.to(device, pipe.vae.dtype))
                # The pipelines' postprocess: [-1, 1] -> [0, 1].
                images.append((decoded.float() / 2 + 0.5).clamp(0, 1).cpu())
        return torch.cat(images)

    return FlowPolicy(transformer=pipe.transformer, forward=forward, encode=encode, decode=decode,
                      latent_shape=latent_shape, device=device, dtype=dtype, name=model.name)
