"""PickScore: PickScore_v1 (a fine-tuned CLIP ViT-H/14) scored as logit_scale * cos / 26, in FP32.

PickScore_v1 is used with the processor of the CLIP ViT-H/14 it was fine-tuned from. When the
model folder holds the processor files too, they are used; otherwise the processor comes from its
own folder ($SOLRL_PICKSCORE_PROCESSOR_PATH or the local Hugging Face cache).
"""

from __future__ import annotations

from solrl_core.rewards._local import LocalFiles, has_file
from solrl_core.rewards.clipscore import PROCESSOR_FILE, ClipSimilarity

PICKSCORE = LocalFiles(reward="pickscore", env_var="SOLRL_PICKSCORE_PATH", hub_repo="yuvalkirstain/PickScore_v1",
                       required=("config.json",))
PICKSCORE_PROCESSOR = LocalFiles(reward="pickscore", env_var="SOLRL_PICKSCORE_PROCESSOR_PATH",
                                 hub_repo="laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
                                 required=(PROCESSOR_FILE, "tokenizer_config.json"))
# Brings PickScore's logits (about 20-23 for matching pairs) near 1, as the reference trainer does.
DIVISOR = 26.0


def load_pickscore(path: str = "", offload: bool = False) -> ClipSimilarity:
    model_dir = PICKSCORE.resolve(path)
    has_processor = all(has_file(model_dir, name) for name in PICKSCORE_PROCESSOR.required)
    processor_dir = model_dir if has_processor else PICKSCORE_PROCESSOR.resolve()
    return ClipSimilarity(model_dir, processor_dir, divisor=DIVISOR, label="pickscore", offload=offload)
