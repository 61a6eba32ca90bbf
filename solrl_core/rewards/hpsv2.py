"""HPS v2.1: an open_clip ViT-H/14 fine-tuned on human preferences; score = cos(image, prompt), FP32.

Built as HPS's own scorer builds it (hpsv2x's bundled open_clip, its evaluation transform and BPE
tokenizer), except that nothing is downloaded: the architecture is created without pretrained
weights and the HPS v2.1 checkpoint, which holds the whole model, is loaded on top.

A folder may carry ``open_clip_config.json`` (open_clip's hub layout, ``{"model_cfg": {...}}``)
to name another architecture; the tests use it for a tiny model.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import torch

from solrl_core.rewards._local import (LocalFiles, ModelFilesMissing, check_tokenizer, register_package,
                                      reward_device, timm_quietly, to_pil)
from solrl_core.rewards.residency import Residency

CHECKPOINT = "HPS_v2.1_compressed.pt"
HPSV2 = LocalFiles(reward="hpsv2", env_var="SOLRL_HPSV2_PATH", hub_repo="xswu/HPSv2", required=(CHECKPOINT,))
ARCHITECTURE = "ViT-H-14"
LOCAL_CONFIG = "open_clip_config.json"
BATCH = 32


def vendored_open_clip():
    """hpsv2x's open_clip, imported without running ``hpsv2/__init__.py``: that file pulls in the
    benchmark's download helpers (clint, requests, the hub), none of which scoring needs."""
    spec = importlib.util.find_spec("hpsv2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFilesMissing("reward 'hpsv2': the hpsv2x package is not installed; "
                                "run `pip install --no-deps hpsv2x==1.2.0` (make install does)")
    register_package("hpsv2", list(spec.submodule_search_locations)[0])
    with timm_quietly():
        # deferred: optional package hpsv2 (hpsv2x, installed with --no-deps; checked just above)
        from hpsv2.src import open_clip

    return open_clip


def _architecture(open_clip, folder: Path) -> str:
    config_file = folder / LOCAL_CONFIG
    if not config_file.is_file():
        return ARCHITECTURE
    model_cfg = json.loads(config_file.read_text())["model_cfg"]
    name = "solrl-local-" + hashlib.sha1(json.dumps(model_cfg, sort_keys=True).encode()).hexdigest()[:12]
    open_clip.factory._MODEL_CONFIGS[name] = model_cfg  # open_clip's registry of architectures
    return name


class HPSv2:
    def __init__(self, folder: Path, offload: bool = False):
        open_clip = vendored_open_clip()
        architecture = _architecture(open_clip, folder)
        # The arguments of HPS's img_score.initialize_model, minus the pretrained download and AMP;
        # built on the CPU, where the checkpoint loads, and placed after.
        self.model, _, self.preprocess = open_clip.create_model_and_transforms(
            architecture, None, precision="fp32", device="cpu", jit=False, force_quick_gelu=False,
            force_custom_text=False, force_patch_dropout=False, force_image_size=None, pretrained_image=False,
            image_mean=None, image_std=None, light_augmentation=True, aug_cfg={}, output_dict=True,
            with_score_predictor=False, with_region_predictor=False)
        checkpoint = torch.load(folder / CHECKPOINT, map_location="cpu", weights_only=True)
        self.model.load_state_dict(checkpoint["state_dict"])
        self.model.eval().requires_grad_(False)
        self.residency = Residency(self.model, reward_device(), offload)
        self.device = self.residency.device
        self.tokenizer = open_clip.get_tokenizer(architecture)
        check_tokenizer("hpsv2", open_clip.tokenizer._tokenizer.encoder, self.model.token_embedding.num_embeddings,
                        "hpsv2x's bpe_simple_vocab_16e6.txt.gz")

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return self.residency.score_in_batches(self._score, images, prompts, BATCH)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        pixels = torch.stack([self.preprocess(image) for image in to_pil(images)]).to(self.device)
        outputs = self.model(pixels, self.tokenizer(prompts).to(self.device))
        # HPS: the diagonal of image_features @ text_features.T (both L2-normalised).
        return (outputs["image_features"] * outputs["text_features"]).sum(-1).float().cpu()


def load_hpsv2(path: str = "", offload: bool = False) -> HPSv2:
    return HPSv2(HPSV2.resolve(path), offload)
