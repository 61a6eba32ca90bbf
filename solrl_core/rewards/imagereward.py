"""ImageReward v1.0 through the image-reward package (1.5), offline and in FP32.

The package's own classes do the work: ``ImageReward`` (BLIP ViT + cross-attention BERT + MLP
head, its preprocessing, its normalisation constants) and its ``score_gard`` scoring path. Three
things are changed around it, all at construction:

- transformers-5 shims: ``med.py`` imports helpers that transformers 5 moved or removed
  (``apply_chunking_to_forward``, ``prune_linear_layer``, ``find_pruneable_heads_and_indices``) and
  relies on ``PreTrainedModel`` methods it no longer has (``invert_attention_mask``,
  ``get_head_mask``, an ``init_weights`` that works before ``post_init``); fairscale, imported for
  gradient checkpointing only, is stubbed when absent;
- no network: BLIP's tokenizer (``bert-base-uncased``) comes from a local folder, checked against
  the model's vocabulary;
- the vision tower's size is read from the checkpoint (ViT-L/16 at 224 px for ImageReward v1.0), so
  a tiny checkpoint builds a tiny model through the same path.

The package's ``__init__`` (which imports its training code, ReFL, and the hub download helpers) is
never run: its modules are imported under a package object registered without executing it.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import torch

from solrl_core.rewards._local import (LocalFiles, ModelFilesMissing, check_tokenizer, register_package,
                                      reward_device, timm_quietly, to_pil)
from solrl_core.rewards.residency import Residency

CHECKPOINT, MED_CONFIG = "ImageReward.pt", "med_config.json"
IMAGEREWARD = LocalFiles(reward="imagereward", env_var="SOLRL_IMAGEREWARD_PATH", hub_repo="THUDM/ImageReward",
                         required=(CHECKPOINT, MED_CONFIG))
# BLIP's text tokenizer; a "tokenizer/" folder inside the ImageReward folder is used first.
BERT_TOKENIZER = LocalFiles(reward="imagereward", env_var="SOLRL_IMAGEREWARD_TOKENIZER_PATH",
                            hub_repo="bert-base-uncased", required=("vocab.txt",),
                            how="put BERT's vocab.txt in a tokenizer/ folder inside the ImageReward folder, or give "
                                "its folder with SOLRL_IMAGEREWARD_TOKENIZER_PATH=DIR, or pre-fill the Hugging Face "
                                "cache with bert-base-uncased")
MAX_PROMPT_TOKENS = 35  # ImageReward.score's tokenizer call
BATCH = 32
VIT_HEAD_WIDTH = 64  # BLIP's ViT-B (768 / 12) and ViT-L (1024 / 16)


# ---------------------------------------------------------------------------------------------
# Importing the package's model code


def _stub_fairscale() -> None:
    try:
        # deferred: optional package fairscale (stubbed below when it is missing)
        import fairscale.nn.checkpoint.checkpoint_activations  # noqa: F401
    except ImportError:
        names = ["fairscale", "fairscale.nn", "fairscale.nn.checkpoint", "fairscale.nn.checkpoint.checkpoint_activations"]
        for name in names:
            sys.modules.setdefault(name, types.ModuleType(name))
        # Only BLIP's gradient checkpointing uses it; scoring never does.
        sys.modules[names[-1]].checkpoint_wrapper = lambda module, **_: module


def _find_pruneable_heads_and_indices(heads, n_heads, head_size, already_pruned_heads):
    """transformers 4's helper (removed in 5), used only by BLIP's head pruning."""
    mask = torch.ones(n_heads, head_size)
    heads = set(heads) - already_pruned_heads
    for head in heads:
        head -= sum(1 if h < head else 0 for h in already_pruned_heads)
        mask[head] = 0
    mask = mask.view(-1).contiguous().eq(1)
    return heads, torch.arange(len(mask))[mask].long()


def _patch_transformers_helpers() -> None:
    # deferred: transformers at import time (start-up of every solrl command: validation reads the reward registry)
    import transformers.modeling_utils as modeling_utils
    import transformers.pytorch_utils as pytorch_utils

    for name in ("apply_chunking_to_forward", "prune_linear_layer"):
        if not hasattr(modeling_utils, name):
            setattr(modeling_utils, name, getattr(pytorch_utils, name))
    if not hasattr(modeling_utils, "find_pruneable_heads_and_indices"):
        modeling_utils.find_pruneable_heads_and_indices = _find_pruneable_heads_and_indices


def _patch_bert_model(med) -> None:
    """Give BLIP's BertPreTrainedModel what transformers 5's PreTrainedModel dropped."""
    from transformers.modeling_utils import PreTrainedModel  # deferred: transformers at import time (as above)

    base = med.BertPreTrainedModel

    def init_weights(self):
        # transformers 5 computes the tied-weight map in post_init, which BLIP never calls.
        if not hasattr(self, "all_tied_weights_keys"):
            self.all_tied_weights_keys = self.get_expanded_tied_weights_keys(all_submodels=False)
        PreTrainedModel.init_weights(self)

    def invert_attention_mask(self, mask):
        extended = mask[:, None, :, :] if mask.dim() == 3 else mask[:, None, None, :]
        extended = extended.to(dtype=self.dtype)
        return (1.0 - extended) * torch.finfo(self.dtype).min

    def get_head_mask(self, head_mask, num_hidden_layers, is_attention_chunked=False):
        if head_mask is not None:
            raise NotImplementedError("head masks are not used by ImageReward scoring")
        return [None] * num_hidden_layers

    base.init_weights = init_weights
    if not hasattr(base, "invert_attention_mask"):
        base.invert_attention_mask = invert_attention_mask
    if not hasattr(base, "get_head_mask"):
        base.get_head_mask = get_head_mask


def image_reward_modules():
    """(ImageReward.ImageReward, ImageReward.models.BLIP.blip_pretrain, ...vit) with the shims applied."""
    spec = importlib.util.find_spec("ImageReward")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFilesMissing("reward 'imagereward': the image-reward package is not installed; "
                                "run `pip install --no-deps image-reward==1.5` (make install does)")
    root = list(spec.submodule_search_locations)[0]
    register_package("ImageReward", root)
    register_package("ImageReward.models", os.path.join(root, "models"))
    _stub_fairscale()
    _patch_transformers_helpers()
    with timm_quietly():
        # deferred: optional package ImageReward (image-reward, installed with --no-deps; checked above)
        from ImageReward.models.BLIP import blip_pretrain, med, vit

        _patch_bert_model(med)
        import ImageReward.ImageReward as image_reward  # deferred: optional package ImageReward

    return image_reward, blip_pretrain, vit


# ---------------------------------------------------------------------------------------------
# Building the model


def vision_architecture(state: dict[str, torch.Tensor]) -> dict[str, int]:
    """ViT size from the checkpoint: width and token count from pos_embed, patch from the stem."""
    prefix = "blip.visual_encoder."
    width, tokens = state[prefix + "pos_embed"].shape[-1], state[prefix + "pos_embed"].shape[1] - 1
    patch = state[prefix + "patch_embed.proj.weight"].shape[-1]
    depth = 1 + max(int(key[len(prefix):].split(".")[1]) for key in state if key.startswith(prefix + "blocks."))
    return {"img_size": patch * math.isqrt(tokens), "patch_size": patch, "embed_dim": width, "depth": depth,
            "num_heads": max(1, width // VIT_HEAD_WIDTH)}


def tokenizer_folder(folder: Path | None) -> Path:
    """Where BLIP's tokenizer is read from: a tokenizer/ folder inside the ImageReward folder, else
    its own folder (SOLRL_IMAGEREWARD_TOKENIZER_PATH or the cache); ModelFilesMissing when neither.
    ``folder`` None: the ImageReward folder itself is missing (the preflight still asks for both)."""
    local = folder / "tokenizer" if folder is not None else None
    return local if local is not None and (local / "vocab.txt").is_file() else BERT_TOKENIZER.resolve()


def load_tokenizer(folder: Path):
    """BLIP's init_tokenizer, from local files: BERT uncased plus [DEC] (bos) and [ENC]."""
    from transformers import BertTokenizer  # deferred: transformers at import time (as above)

    tokenizer_dir = tokenizer_folder(folder)
    tokenizer = BertTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    tokenizer.enc_token_id = tokenizer.convert_tokens_to_ids("[ENC]")
    return tokenizer, tokenizer_dir


@contextmanager
def _replaced(module, **attributes):
    previous = {name: getattr(module, name) for name in attributes}
    for name, value in attributes.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            setattr(module, name, value)


class ImageRewardScorer:
    def __init__(self, folder: Path, offload: bool = False):
        image_reward, blip_pretrain, vit = image_reward_modules()
        self.device = reward_device()
        state = torch.load(folder / CHECKPOINT, map_location="cpu", weights_only=True)
        architecture = vision_architecture(state)
        tokenizer, tokenizer_dir = load_tokenizer(folder)

        def create_vit(_name, image_size, use_grad_checkpointing=False, ckpt_layer=0, drop_path_rate=0):
            encoder = vit.VisionTransformer(**architecture, use_grad_checkpointing=use_grad_checkpointing,
                                            ckpt_layer=ckpt_layer, drop_path_rate=drop_path_rate)
            return encoder, architecture["embed_dim"]

        with _replaced(blip_pretrain, create_vit=create_vit, init_tokenizer=lambda: tokenizer):
            model = image_reward.ImageReward(med_config=str(folder / MED_CONFIG), device=self.device)
        if architecture["img_size"] != 224:  # ImageReward's preprocessing is fixed at 224 px
            model.preprocess = image_reward._transform(architecture["img_size"])
        _load_state(model, state)
        check_tokenizer("imagereward", tokenizer, model.blip.text_encoder.config.vocab_size, tokenizer_dir)
        self.model = model.to(torch.float32).eval().requires_grad_(False)
        self.residency = Residency(self.model, self.device, offload)  # inputs go to model.device

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return self.residency.score_in_batches(self._score, images, prompts, BATCH)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        text = self.model.blip.tokenizer(prompts, padding="max_length", truncation=True, max_length=MAX_PROMPT_TOKENS,
                                         return_tensors="pt").to(self.device)
        pixels = torch.stack([self.model.preprocess(image) for image in to_pil(images)]).to(self.device)
        rewards = self.model.score_gard(text.input_ids, text.attention_mask, pixels)  # [B, 1], normalised
        return rewards.squeeze(-1).float().cpu()


def _load_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Non-strict, as the package loads it, but a checkpoint that leaves weights unset is refused."""
    result = model.load_state_dict(state, strict=False)
    # BERT's position_ids buffer may or may not be in a checkpoint; anything else missing is a wrong file.
    missing = [key for key in result.missing_keys if not key.endswith("position_ids")]
    if missing:
        raise ValueError(f"{CHECKPOINT} does not match ImageReward: {len(missing)} weights missing, e.g. {missing[:3]}")


def load_imagereward(path: str = "", offload: bool = False) -> ImageRewardScorer:
    return ImageRewardScorer(IMAGEREWARD.resolve(path), offload)
