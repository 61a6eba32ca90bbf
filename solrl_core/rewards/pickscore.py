"""PickScore: PickScore_v1 (a fine-tuned CLIP ViT-H/14) scored as logit_scale * cos / 26, in FP32.

PickScore_v1 is used with the processor of the CLIP ViT-H/14 it was fine-tuned from. When the
model folder holds the processor files too, they are used; otherwise the processor comes from its
own folder ($SOLRL_PICKSCORE_PROCESSOR_PATH or the local Hugging Face cache).
"""

from __future__ import annotations

from pathlib import Path

from solrl_core.rewards._local import LocalFiles, has_file
from solrl_core.rewards.clipscore import PROCESSOR_FILE, ClipSimilarity

PICKSCORE = LocalFiles(reward="pickscore", env_var="SOLRL_PICKSCORE_PATH", hub_repo="yuvalkirstain/PickScore_v1",
                       required=("config.json",))
PICKSCORE_PROCESSOR = LocalFiles(reward="pickscore", env_var="SOLRL_PICKSCORE_PROCESSOR_PATH",
                                 hub_repo="laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
                                 required=(PROCESSOR_FILE, "tokenizer_config.json"),
                                 how="put the processor files of CLIP ViT-H/14 in the PickScore folder, or give "
                                     "their folder with SOLRL_PICKSCORE_PROCESSOR_PATH=DIR, or pre-fill the Hugging "
                                     "Face cache with laion/CLIP-ViT-H-14-laion2B-s32B-b79K")
# Brings PickScore's logits (about 20-23 for matching pairs) near 1, as the reference trainer does.
DIVISOR = 26.0


def processor_folder(model_dir: Path | None) -> Path:
    """The processor's folder: the model folder when it holds the processor files, else its own
    (ModelFilesMissing when neither). ``model_dir`` None: the model folder itself is missing."""
    if model_dir is not None and all(has_file(model_dir, name) for name in PICKSCORE_PROCESSOR.required):
        return model_dir
    return PICKSCORE_PROCESSOR.resolve()


def load_pickscore(path: str = "", offload: bool = False) -> ClipSimilarity:
    model_dir = PICKSCORE.resolve(path)
    processor_dir = processor_folder(model_dir)
    return ClipSimilarity(model_dir, processor_dir, divisor=DIVISOR, label="pickscore", offload=offload)
