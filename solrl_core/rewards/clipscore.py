"""CLIPScore: CLIP ViT-L/14's image-text logit divided by 100 (SPEC section 7), in FP32.

The logit is logit_scale.exp() * cos(image, text); CLIP's logit scale is 100, so the score is the
cosine similarity. PickScore (pickscore.py) is the same computation with another model and divisor,
so both use :class:`ClipSimilarity`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from solrl_core.rewards._local import LocalFiles, check_tokenizer, reward_device, to_pil
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
        from transformers import CLIPModel, CLIPProcessor

        self.model = CLIPModel.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
        self.model.eval().requires_grad_(False)
        self.residency = Residency(self.model, reward_device(), offload)
        self.device = self.residency.device
        self.processor = CLIPProcessor.from_pretrained(str(processor_dir), local_files_only=True)
        check_tokenizer(label, self.processor.tokenizer, self.model.config.text_config.vocab_size, processor_dir)
        self.divisor = divisor
        self.max_length = self.model.config.text_config.max_position_embeddings

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        with self.residency.on_device():
            scores = [self._score(images[i:i + BATCH], prompts[i:i + BATCH]) for i in range(0, len(prompts), BATCH)]
        return torch.cat(scores)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        inputs = self.processor(text=prompts, images=to_pil(images), padding=True, truncation=True,
                                max_length=self.max_length, return_tensors="pt").to(self.device)
        logits = self.model(**inputs).logits_per_image  # [images, prompts]
        return logits.diagonal().float().cpu() / self.divisor


def load_clipscore(path: str = "", offload: bool = False) -> ClipSimilarity:
    folder = CLIPSCORE.resolve(path)
    return ClipSimilarity(folder, folder, divisor=100.0, label="clipscore", offload=offload)
