"""The models, each declared once as a record: its loader, its files check and its preset data.

A preset names its model in ``model.loader``. Every loader takes ``(model config, device, dtype)``
and returns a FlowPolicy, or raises :class:`~solrl_core.models.loading.ModelFilesMissing` with one
line naming the missing files; the files check says the same before anything is loaded. A real
model's preset data (SPEC section 8: resolution, sampler, quantization skip list, LoRA targets,
evaluation steps) and the run presets it is trained in are part of its record; solrl_core.presets
builds ``MODEL_PRESETS`` and the run presets from them, validation lists the names, and the memory
model reads the settings. Adding a model is its module plus one record here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from solrl_core.config import Config, ModelConfig
from solrl_core.local_files import local_path, path_kind
from solrl_core.models.flux_dev import FLUX_DEV, load_flux
from solrl_core.models.loading import ModelFilesMissing, PipelineModel, resolve_model_dir
from solrl_core.models.policy import FlowPolicy
from solrl_core.models.sana import SANA_1600M, load_sana
from solrl_core.models.sd3 import SD35_LARGE, load_sd3
from solrl_core.world import SHAPES_TINY_CHECKPOINT

__all__ = ["MODELS", "LoraFormat", "ModelFilesMissing", "ModelPreset", "ModelSpec", "SHAPES_TINY_CHECKPOINT",
           "check_model_files", "load_policy", "model_spec", "resolve_device", "resolve_dtype"]


@dataclass(frozen=True)
class ModelPreset:
    """A real model's settings as a preset, applied over the paper's defaults (presets.PAPER_DEFAULTS)."""

    name: str  # "flux.1-dev": its key in presets.MODEL_PRESETS, a run preset's ``model_preset``
    description: str
    settings: dict[str, Any]
    # Run presets (Prefect deployments solrl/<name>): name -> the reward weights it trains against.
    runs: dict[str, dict[str, float]]
    # Settings that follow others unless set themselves: key -> rule of the config.
    derived: dict[str, Callable[[Config], Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class LoraFormat:
    """Whose LoRA format a run's adapter exports to (`solrl export`, solrl_core.models.lora_formats)."""

    pipeline: str  # the diffusers pipeline class whose save_lora_weights / load_lora_weights define the file
    transformer: str  # the diffusers class of the transformer the adapter sits on
    base_model: str | None  # the base's Hugging Face repo (model card, PEFT config); None: the embedded world


@dataclass(frozen=True)
class ModelSpec:
    loader: str  # the name ``model.loader`` holds
    load: Callable[[ModelConfig, torch.device, torch.dtype], FlowPolicy]
    # The file or folder the model loads from; raises ModelFilesMissing (one line) when the files are
    # missing or of the wrong kind; loads nothing heavy.
    check_files: Callable[[ModelConfig], Path]
    # None: the embedded world, whose run preset is presets.PRESETS["shapes-tiny"].
    preset: ModelPreset | None = None
    # Class names of the transformer's repeated blocks, each compiled in place by model.compile=blocks
    # (solrl_core.models.compilation); diffusers' _repeated_blocks where the class declares them.
    repeated_blocks: tuple[str, ...] = ()
    lora_format: LoraFormat | None = None  # None: `solrl export` cannot write this model's adapters


def _load_shapes_tiny(model: ModelConfig, device: torch.device, dtype: torch.dtype) -> FlowPolicy:
    # deferred: diffusers at import time (start-up of validation, which never needs it; shapes_tiny imports it)
    from solrl_core.models.shapes_tiny import load_shapes_tiny

    return load_shapes_tiny(model.path, device, dtype)


def _check_tiny_files(model: ModelConfig) -> Path:
    return check_tiny_checkpoint(model.path)


def _folder_check(pipeline: PipelineModel) -> Callable[[ModelConfig], Path]:
    """A real model's files check: headers and file layout only (no import of diffusers)."""
    def check(model: ModelConfig) -> Path:
        return resolve_model_dir(pipeline, model.path)

    return check


def flux_shift(resolution: int, base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """FLUX's resolution-dependent timestep shift exp(mu): mu is linear in the packed token count,
    0.5 at 256 tokens and 1.15 at 4096 (the FLUX.1 scheduler config); 512 px -> 1024 tokens."""
    tokens = (resolution // 16) ** 2
    mu = base_shift + (max_shift - base_shift) * (tokens - 256) / (4096 - 256)
    return round(math.exp(mu), 4)


# Modules of a FLUX transformer that stay in full precision whatever their size: the input
# embedders, the conditioning MLPs, the AdaLN modulation linears and the output head.
FLUX_QUANT_SKIP = [
    "x_embedder", "context_embedder", "time_text_embed.*", "*norm1.linear", "*norm1_context.linear",
    "*norm.linear", "norm_out.*", "proj_out",
]
# The reference's rules (NVlabs/Sana train_scripts/sol_rl configs: skip modules and
# nvfp4_min_dim; a layer is kept when max(in, out) > min_dim), restated for diffusers' names.
# SANA: patch embedder, timestep / caption conditioning, the output head, and the self-attention
# q/k/v (the reference skips its fused attn.qkv by name). Its cross-attention k and v are one
# 2240 -> 4480 kv_linear there, quantized, so they are a fused pair here; the feed-forward's 1x1
# convolutions (2240 -> 11200, 5600 -> 2240) are quantized like the reference's linear FFN; the
# depthwise 3x3 convolution is no GEMM and stays as it is.
SANA_QUANT_SKIP = ["patch_embed.*", "time_embed.*", "caption_projection.*", "norm_out.*", "proj_out",
                   "*.attn1.to_q", "*.attn1.to_k", "*.attn1.to_v"]
SANA_QUANT_FUSED = ["attn2.to_k+attn2.to_v"]
# SD3: patch embedder, timestep / pooled-text conditioning, context embedder, AdaLN linears, head,
# and the context stream's feed-forward (the reference skips ff_context). At min_dim 2432, SD3.5-L's
# hidden size, its attention projections (2432 x 2432) stay BF16 in the reference as well.
SD3_QUANT_SKIP = ["pos_embed.*", "time_text_embed.*", "context_embedder", "*norm1.linear", "*norm1_context.linear",
                  "norm_out.*", "proj_out", "*.ff_context.*"]
ATTENTION = ["to_q", "to_k", "to_v", "to_out.0"]
JOINT_ATTENTION = ATTENTION + ["add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
# The repeated blocks of each transformer class: FluxTransformer2DModel's dual- and single-stream
# blocks (its own _repeated_blocks), SanaTransformer2DModel's and SD3Transformer2DModel's blocks
# (those classes declare none).
FLUX_BLOCKS = ("FluxTransformerBlock", "FluxSingleTransformerBlock")
SANA_BLOCKS = ("SanaTransformerBlock",)
SD3_BLOCKS = ("JointTransformerBlock",)

# SPEC section 8, one record per model: the data that differs between models.
MODELS: dict[str, ModelSpec] = {spec.loader: spec for spec in (
    ModelSpec("shapes-tiny", _load_shapes_tiny, _check_tiny_files, repeated_blocks=FLUX_BLOCKS,
              lora_format=LoraFormat("FluxPipeline", "FluxTransformer2DModel", None)),
    ModelSpec("flux", load_flux, _folder_check(FLUX_DEV), ModelPreset(
        "flux.1-dev", "FLUX.1-dev (FluxPipeline), 512 px, DPM-Solver-2, guidance embedding 1.0",
        settings={
            "model": {"loader": "flux", "resolution": 512, "guidance": 1.0},
            "sampler": {"kind": "dpm2", "shift": flux_shift(512)},
            "quant": {"skip": FLUX_QUANT_SKIP, "min_dim": 1000},
            "train": {"timestep_fraction": 0.4, "lora": {"targets": ATTENTION}},
            "eval": {"steps": 28},
        },
        runs={"flux-imagereward": {"imagereward": 1.0}, "flux-clipscore": {"clipscore": 1.0}},
        # FLUX's shift follows its resolution.
        derived={"sampler.shift": lambda config: flux_shift(config.model.resolution)}), FLUX_BLOCKS,
        LoraFormat(FLUX_DEV.pipeline, "FluxTransformer2DModel", FLUX_DEV.hub_repo)),
    ModelSpec("sana", load_sana, _folder_check(SANA_1600M), ModelPreset(
        "sana-1.6b", "SANA 1.6B (SanaPipeline), 1024 px, Euler",
        settings={
            "model": {"loader": "sana", "resolution": 1024},
            "sampler": {"kind": "euler", "shift": 3.0},
            "quant": {"skip": SANA_QUANT_SKIP, "min_dim": 2240, "fused": SANA_QUANT_FUSED},
            # Self-attention (attn1) and cross-attention (attn2) projections share these names.
            "train": {"timestep_fraction": 0.6, "lora": {"targets": ATTENTION}},
            "eval": {"steps": 40},
        },
        runs={"sana-hpsv2": {"hpsv2": 1.0}}), SANA_BLOCKS,
        LoraFormat(SANA_1600M.pipeline, "SanaTransformer2DModel", SANA_1600M.hub_repo)),
    ModelSpec("sd3", load_sd3, _folder_check(SD35_LARGE), ModelPreset(
        "sd3.5-large", "Stable Diffusion 3.5 Large (StableDiffusion3Pipeline), 1024 px, DPM-Solver-2",
        settings={
            "model": {"loader": "sd3", "resolution": 1024},
            "sampler": {"kind": "dpm2", "shift": 3.0},
            "quant": {"skip": SD3_QUANT_SKIP, "min_dim": 2432},
            "train": {"timestep_fraction": 0.6, "lora": {"targets": JOINT_ATTENTION}},
            "eval": {"steps": 40},
        },
        runs={"sd35l-pickscore": {"pickscore": 1.0}}), SD3_BLOCKS,
        LoraFormat(SD35_LARGE.pipeline, "SD3Transformer2DModel", SD35_LARGE.hub_repo)),
)}


def model_spec(loader: str) -> ModelSpec:
    if loader not in MODELS:
        raise ValueError(f"unknown model.loader '{loader}'; allowed: {', '.join(MODELS)}")
    return MODELS[loader]


def check_model_files(model: ModelConfig) -> Path:
    """The file or folder the model will load from (the preflight names it). Raise ModelFilesMissing
    now if the model's files are missing or of the wrong kind, for callers that want to fail before
    starting heavier machinery. Real models: headers and file
    layout only (no import of diffusers, nothing loaded). The embedded world: its 2.4 MB checkpoint
    is loaded into the architecture it declares, which is what catches another model's weights."""
    return model_spec(model.loader).check_files(model)


def check_tiny_checkpoint(path: str) -> Path:
    """The embedded world's checkpoint (``model.path``, else the committed one) must be one
    safetensors file with its architecture in the metadata; only the header is read."""
    file = local_path(path) if path else SHAPES_TINY_CHECKPOINT
    kind = path_kind(file)
    how = "give the safetensors file `solrl pretrain` writes with -S model.path=FILE (empty: the committed one)"
    if kind != "file":
        where = file if file is not None else repr(path)
        what = "is a folder, not a file" if kind == "folder" else "cannot be read" if kind == "unreadable" \
            else "does not exist"
        raise ModelFilesMissing(f"shapes-tiny checkpoint {where} {what}; {how}")
    try:
        with safe_open(str(file), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise ModelFilesMissing(f"shapes-tiny checkpoint {file} is not a safetensors file ({error}); {how}") from None
    if "architecture" not in metadata:
        raise ModelFilesMissing(f"shapes-tiny checkpoint {file} has no architecture in its metadata; {how}")
    # The weights must fit the architecture they declare (a checkpoint of another model otherwise
    # loads only inside the run).
    # deferred: diffusers at import time (start-up of validation, which needs it only here)
    from solrl_core.models.shapes_tiny import read_checkpoint

    read_checkpoint(file)
    return file


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """Full precision: bfloat16 on a GPU, float32 on a CPU (no bf16 units here)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def load_policy(config: Config) -> FlowPolicy:
    device = resolve_device(config.model.device)
    dtype = resolve_dtype(config.model.dtype, device)
    return model_spec(config.model.loader).load(config.model, device, dtype)
