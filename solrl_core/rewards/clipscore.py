"""CLIPScore: CLIP ViT-L/14's image-text logit divided by 100 (SPEC section 7), in FP32.

The logit is logit_scale.exp() * cos(image, text); CLIP's logit scale is 100, so the score is the
cosine similarity. PickScore (pickscore.py) is the same computation with another model and divisor,
so both use :class:`ClipSimilarity`.

Images are preprocessed as the official scorers' CLIP processor did, with PIL (8-bit images,
Pillow's bicubic resize, center crop, rescale, normalise), but on tensors on the reward's device
(:func:`clip_pixels`, bit-exact against the PIL processor), not with transformers 5's default
torchvision processor, whose resize differs from Pillow's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from solrl_core.rewards._local import LocalFiles, ModelFilesMissing, check_tokenizer, reward_device
from solrl_core.rewards.pil_resize import resize_8bit
from solrl_core.rewards.residency import Residency

# Hub folders hold preprocessor_config.json; transformers 5 saves processor_config.json.
PROCESSOR_FILE = "preprocessor_config.json|processor_config.json"
CLIP_FILES = ("config.json", PROCESSOR_FILE, "tokenizer_config.json")
CLIPSCORE = LocalFiles(reward="clipscore", env_var="SOLRL_CLIPSCORE_PATH", hub_repo="openai/clip-vit-large-patch14",
                       required=CLIP_FILES)
BATCH = 32  # images per forward


class ClipSimilarity:
    """score_i = logit_scale.exp() * cos(image_i, prompt_i) / divisor, through CLIP's own processor."""

    def __init__(self, model_dir: Path, processor_dir: Path, divisor: float, label: str, offload: bool = False):
        # deferred: transformers at import time (start-up of every solrl command: validation reads the reward registry)
        from transformers import CLIPModel, CLIPProcessor

        self.model = CLIPModel.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
        self.model.eval().requires_grad_(False)
        self.residency = Residency(self.model, reward_device(), offload)
        self.device = self.residency.device
        self.processor = CLIPProcessor.from_pretrained(str(processor_dir), local_files_only=True)
        check_tokenizer(label, self.processor.tokenizer, self.model.config.text_config.vocab_size, processor_dir)
        check_image_processor(label, self.processor.image_processor, processor_dir)
        self.divisor = divisor
        self.max_length = self.model.config.text_config.max_position_embeddings

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return self.residency.score_in_batches(self._score, images, prompts, BATCH)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        text = self.processor.tokenizer(prompts, padding=True, truncation=True, max_length=self.max_length,
                                        return_tensors="pt").to(self.device)
        pixels = clip_pixels(images.to(self.device), self.processor.image_processor)
        logits = self.model(**text, pixel_values=pixels).logits_per_image  # [images, prompts]
        return logits.diagonal().float().cpu() / self.divisor


BICUBIC = 3  # PIL.Image.Resampling.BICUBIC


def check_image_processor(label: str, processor, where: Path) -> None:
    """clip_pixels computes what a CLIP image processor does: refuse one configured otherwise."""
    size, crop = processor.size, processor.crop_size
    expected = (processor.do_resize and size.shortest_edge and int(processor.resample) == BICUBIC
                and processor.do_center_crop and crop.height <= size.shortest_edge and crop.width <= size.shortest_edge
                and processor.do_rescale and processor.do_normalize and not getattr(processor, "do_pad", False))
    if not expected:
        raise ModelFilesMissing(f"{label}: the image processor in {where} is not configured as CLIP's (bicubic resize "
                                f"of the shorter side, center crop, rescale, normalise); its files belong to another "
                                f"model")


def clip_pixels(images: torch.Tensor, processor) -> torch.Tensor:
    """[B, 3, H, W] in [0, 1] -> the CLIP processor's pixel_values as its PIL backend makes them
    from the saved 8-bit images, on the images' device."""
    pixels = (images.float().clamp(0, 1) * 255).round()  # the 8 bits a saved image (to_pil) keeps
    height, width = pixels.shape[-2:]
    side = processor.size.shortest_edge
    # transformers' rule for the shorter side: the longer one is truncated, not rounded.
    if height <= width:
        height, width = side, int(side * width / height)
    else:
        height, width = int(side * height / width), side
    pixels = resize_8bit(pixels, height, width)
    crop_height, crop_width = processor.crop_size.height, processor.crop_size.width
    top, left = (height - crop_height) // 2, (width - crop_width) // 2
    pixels = pixels[..., top:top + crop_height, left:left + crop_width]
    # As the PIL processor: rescaled in float64, cast to float32, normalised in float32.
    scaled = (pixels * processor.rescale_factor).float()
    mean = torch.tensor(processor.image_mean, dtype=torch.float32, device=scaled.device).view(-1, 1, 1)
    std = torch.tensor(processor.image_std, dtype=torch.float32, device=scaled.device).view(-1, 1, 1)
    return (scaled - mean) / std


def load_clipscore(path: str = "", offload: bool = False) -> ClipSimilarity:
    folder = CLIPSCORE.resolve(path)
    return ClipSimilarity(folder, folder, divisor=100.0, label="clipscore", offload=offload)
