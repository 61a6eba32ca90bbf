"""CLIPScore's and PickScore's image preprocessing is the official scorers': the PIL image
processor (Pillow's bicubic resize of 8-bit images), computed on tensors on the reward's device."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

import _tiny
from solrl_core.rewards._local import ModelFilesMissing, to_pil
from solrl_core.rewards.clipscore import clip_pixels
from solrl_core.rewards.pil_resize import resize_8bit
from solrl_core.rewards.registry import REWARDS

PROMPTS = ["a red fox on the snow", "a blue sky", "a cat", "the dog"]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))


@pytest.fixture(scope="module")
def pickscore_folder(tmp_path_factory):
    # logit scale e^4: scores ten times as sensitive to the pixels as a fresh CLIP's
    return _tiny.save_clip(tmp_path_factory.mktemp("tiny-clip") / "pickscore", logit_scale=4.0)


def detailed_images(count: int, height: int, width: int, seed: int) -> torch.Tensor:
    """Pixel noise (Pillow's clipping between passes matters most there) over smooth gradients."""
    generator = torch.Generator().manual_seed(seed)
    smooth = torch.nn.functional.interpolate(torch.rand(count, 3, 4, 4, generator=generator), size=(height, width),
                                             mode="bilinear")
    return (0.7 * smooth + 0.3 * torch.rand(count, 3, height, width, generator=generator)).clamp(0, 1)


@pytest.mark.parametrize("height, width, out_height, out_width", [
    (512, 512, 224, 224),  # a 512 px sample for a 224 px CLIP
    (40, 48, 32, 38),  # downscale, not square
    (20, 24, 33, 39),  # upscale
    (64, 30, 64, 7),  # one pass only
])
def test_resize_is_pillows_bicubic_bit_for_bit(height, width, out_height, out_width):
    pixels = (detailed_images(2, height, width, seed=height) * 255).round().to(torch.uint8)
    pillow = torch.stack([torch.from_numpy(np.array(Image.fromarray(image.permute(1, 2, 0).numpy())
                                                    .resize((out_width, out_height), Image.Resampling.BICUBIC)))
                          .permute(2, 0, 1) for image in pixels])
    assert torch.equal(resize_8bit(pixels.float(), out_height, out_width), pillow.double())


@pytest.mark.parametrize("size, height, width", [(224, 512, 512), (32, 40, 48), (32, 48, 40), (32, 20, 24)])
def test_clip_pixels_are_the_pil_processors(size, height, width):
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    processor = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    images = detailed_images(2, height, width, seed=size + height)
    expected = processor(images=to_pil(images), return_tensors="pt")["pixel_values"]
    ours = clip_pixels(images, processor)
    assert ours.shape == expected.shape and ours.dtype == torch.float32
    assert (ours - expected).abs().max() <= 1e-6


def test_clip_pixels_stay_on_the_images_device():
    from transformers import CLIPImageProcessor

    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    pixels = clip_pixels(torch.rand(2, 3, 40, 48, device="meta"), processor)  # meta: no PIL round trip possible
    assert pixels.device.type == "meta" and pixels.shape == (2, 3, 32, 32)


def test_pickscore_scores_as_with_the_pil_processor(pickscore_folder):
    """Against the official preprocessing (the PIL processor) on a tiny random CLIP the maximum
    score difference is 0 (measured when written; transformers 5's default torchvision processor
    is 4.0e-4 off here)."""
    from transformers import CLIPModel, CLIPProcessor

    images = detailed_images(len(PROMPTS), 72, 56, seed=11)
    model = CLIPModel.from_pretrained(str(pickscore_folder), local_files_only=True).eval()
    processor = CLIPProcessor.from_pretrained(str(pickscore_folder), local_files_only=True, backend="pil")
    inputs = processor(text=PROMPTS, images=to_pil(images), padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model(**inputs).logits_per_image.diagonal() / 26.0
    scores = REWARDS["pickscore"](str(pickscore_folder))(images, PROMPTS)
    assert float((scores - expected).abs().max()) <= 1e-6


def test_an_image_processor_configured_otherwise_is_refused(pickscore_folder, tmp_path):
    broken = tmp_path / "clip"
    shutil.copytree(pickscore_folder, broken)
    config_file = next(broken / name for name in ("preprocessor_config.json", "processor_config.json")
                       if (broken / name).is_file())
    config = json.loads(config_file.read_text())
    processor_config = config.get("image_processor", config)  # processor_config.json nests it
    processor_config["resample"] = 2  # bilinear
    config_file.write_text(json.dumps(config))
    with pytest.raises(ModelFilesMissing, match="clipscore: the image processor in .* is not configured as CLIP's"):
        REWARDS["clipscore"](str(broken))
