"""The paper's reward models (ImageReward, HPS v2.1, PickScore, CLIPScore) on tiny random instances
saved in their real file layouts, scored through each adapter's own preprocessing and scoring path
and checked against an independent computation; plus the offline / missing-files behaviour."""

from __future__ import annotations

import shutil

import pytest
import torch

import _tiny
from solrl_core.models.loading import ModelFilesMissing
from solrl_core.rewards._local import to_pil
from solrl_core.rewards.registry import REWARDS, RewardSet, check_reward_files

ENV_VARS = {"imagereward": "SOLRL_IMAGEREWARD_PATH", "hpsv2": "SOLRL_HPSV2_PATH", "pickscore": "SOLRL_PICKSCORE_PATH",
            "clipscore": "SOLRL_CLIPSCORE_PATH"}
PROMPTS = ["a red fox on the snow", "a blue sky", "a cat", "the dog"]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    import huggingface_hub.constants

    for name in [*ENV_VARS.values(), "SOLRL_PICKSCORE_PROCESSOR_PATH", "SOLRL_IMAGEREWARD_TOKENIZER_PATH"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))


@pytest.fixture(scope="module")
def folders(tiny_reward_folders):
    return tiny_reward_folders


@pytest.fixture(scope="module")
def images():
    generator = torch.Generator().manual_seed(3)
    return torch.rand(len(PROMPTS), 3, 40, 48, generator=generator)  # not square: exercises resize + crop


@pytest.fixture(scope="module")
def scorers(folders):
    return {name: REWARDS[name](str(folder)) for name, folder in folders.items()}


@pytest.mark.parametrize("name", ["imagereward", "hpsv2", "pickscore", "clipscore"])
def test_reward_scores_one_finite_float32_per_image_and_depends_on_the_prompt(name, scorers, images):
    scores = scorers[name](images, PROMPTS)
    assert scores.shape == (len(PROMPTS),) and scores.dtype == torch.float32 and torch.isfinite(scores).all()
    assert not torch.equal(scores, scorers[name](images, PROMPTS[::-1]))
    # Batching never changes a score.
    assert torch.allclose(torch.cat([scorers[name](images[i:i + 1], PROMPTS[i:i + 1]) for i in range(len(PROMPTS))]),
                          scores, atol=1e-5)


def clip_reference(folder, images, prompts, divisor):
    """logit_scale.exp() * cos(image, text) / divisor from the CLIP model's embeddings, by hand,
    with the official scorers' preprocessing: the PIL image processor (transformers 5 defaults to
    a torchvision one, whose resize differs from Pillow's)."""
    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(str(folder), local_files_only=True).eval()
    processor = CLIPProcessor.from_pretrained(str(folder), local_files_only=True, backend="pil")
    inputs = processor(text=prompts, images=to_pil(images), padding=True, return_tensors="pt")
    with torch.no_grad():
        output = model(**inputs)
    cosine = torch.nn.functional.cosine_similarity(output.image_embeds, output.text_embeds, dim=-1)
    return model.logit_scale.exp() * cosine / divisor


def test_clipscore_is_the_clip_logit_over_100(folders, scorers, images):
    expected = clip_reference(folders["clipscore"], images, PROMPTS, 100.0)
    assert torch.allclose(scorers["clipscore"](images, PROMPTS), expected, atol=1e-5)


def test_pickscore_is_logit_scale_times_cosine_over_26(folders, scorers, images):
    expected = clip_reference(folders["pickscore"], images, PROMPTS, 26.0)
    assert torch.allclose(scorers["pickscore"](images, PROMPTS), expected, atol=1e-5)


def test_pickscore_takes_its_processor_from_a_separate_folder(folders, tmp_path, monkeypatch, images, scorers):
    """PickScore_v1 ships the model; the processor is CLIP ViT-H/14's, possibly in another folder."""
    model_only, processor = tmp_path / "model", tmp_path / "processor"
    model_only.mkdir()
    for file in folders["pickscore"].iterdir():
        shutil.copy(file, (model_only if file.name in ("config.json", "model.safetensors") else tmp_path))
    with pytest.raises(ModelFilesMissing, match="SOLRL_PICKSCORE_PROCESSOR_PATH"):
        REWARDS["pickscore"](str(model_only))
    shutil.copytree(folders["pickscore"], processor)
    monkeypatch.setenv("SOLRL_PICKSCORE_PROCESSOR_PATH", str(processor))
    assert torch.allclose(REWARDS["pickscore"](str(model_only))(images, PROMPTS), scorers["pickscore"](images, PROMPTS))


def test_hpsv2_is_the_cosine_of_open_clip_features(folders, scorers, images):
    from solrl_core.rewards.hpsv2 import CHECKPOINT, vendored_open_clip

    open_clip = vendored_open_clip()
    # HPS's evaluation transform: light_augmentation=True resizes the longer side and pads (no crop).
    model, _, preprocess = open_clip.create_model_and_transforms("tests-hps-tiny", None, output_dict=True,
                                                                 light_augmentation=True)
    model.load_state_dict(torch.load(folders["hpsv2"] / CHECKPOINT, weights_only=True)["state_dict"])
    pixels = torch.stack([preprocess(image) for image in to_pil(images)])
    with torch.no_grad():
        output = model.eval()(pixels, open_clip.get_tokenizer("tests-hps-tiny")(PROMPTS))
    expected = torch.diagonal(output["image_features"] @ output["text_features"].T)
    assert torch.allclose(scorers["hpsv2"](images, PROMPTS), expected, atol=1e-5)
    assert len(open_clip.tokenizer._tokenizer.encoder) == 49408  # hpsv2x ships the BPE vocabulary


def test_imagereward_batched_score_equals_the_packages_own_ranking_path(scorers, images):
    """ImageReward.inference_rank scores a list of images one by one for one prompt."""
    model = scorers["imagereward"].model
    prompt = PROMPTS[0]
    with torch.no_grad():
        _, expected = model.inference_rank(prompt, to_pil(images))
    assert torch.allclose(scorers["imagereward"](images, [prompt] * len(PROMPTS)), torch.tensor(expected), atol=1e-5)


def test_imagereward_reads_its_vision_tower_from_the_checkpoint(scorers):
    model = scorers["imagereward"].model
    assert model.blip.visual_encoder.patch_embed.proj.kernel_size == (32, 32)
    assert len(model.blip.visual_encoder.blocks) == 1
    assert model.blip.tokenizer.convert_tokens_to_ids("[ENC]") == model.blip.tokenizer.enc_token_id


def test_weighted_reward_set_combines_real_rewards(folders, images):
    reward_set = RewardSet({"clipscore": 0.7, "pickscore": 0.3}, extra=["hpsv2"],
                           paths={name: str(folders[name]) for name in ("clipscore", "pickscore", "hpsv2")})
    scores = reward_set.score(images, PROMPTS)
    expected = 0.7 * scores.per_reward["clipscore"] + 0.3 * scores.per_reward["pickscore"]
    assert torch.allclose(scores.combined, expected)
    assert set(reward_set.score(images, PROMPTS, names=reward_set.names).per_reward) == {"clipscore", "pickscore", "hpsv2"}


# ---------------------------------------------------------------------------------------------
# Missing files


@pytest.mark.parametrize("name, needed", [("imagereward", "ImageReward.pt, med_config.json"),
                                          ("hpsv2", "HPS_v2.1_compressed.pt"), ("pickscore", "config.json"),
                                          ("clipscore", "config.json")])
def test_missing_reward_files_are_named_in_one_line(name, needed, tmp_path):
    with pytest.raises(ModelFilesMissing) as error:
        REWARDS[name](str(tmp_path))
    message = str(error.value)
    assert "\n" not in message and needed in message and ENV_VARS[name] in message
    assert f"reward_paths={{{name}: DIR}}" in message
    with pytest.raises(ModelFilesMissing):
        check_reward_files([name], {name: str(tmp_path)})


def test_default_location_is_the_local_hub_cache_only(monkeypatch):
    with pytest.raises(ModelFilesMissing, match="not found in THUDM/ImageReward"):
        REWARDS["imagereward"]()


def test_a_clip_tokenizer_without_its_files_is_refused(folders, tmp_path):
    broken = tmp_path / "clip"
    shutil.copytree(folders["clipscore"], broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(ModelFilesMissing, match="clipscore.*tokens but the model's embedding table has 514"):
        REWARDS["clipscore"](str(broken))


def test_imagereward_tokenizer_must_match_the_model_vocabulary(folders, tmp_path):
    broken = tmp_path / "imagereward"
    shutil.copytree(folders["imagereward"], broken)
    (broken / "tokenizer" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    with pytest.raises(ModelFilesMissing, match="imagereward.*tokens but the model's embedding table"):
        REWARDS["imagereward"](str(broken))
    shutil.rmtree(broken / "tokenizer")
    with pytest.raises(ModelFilesMissing, match="vocab.txt not found in bert-base-uncased"):
        REWARDS["imagereward"](str(broken))


def test_reward_set_raises_the_error_the_cli_reports(tmp_path):
    """`solrl run` turns ModelFilesMissing into one line and exit code 2 (see test_real_models)."""
    from solrl_core.models.registry import ModelFilesMissing as CaughtByTheCli

    with pytest.raises(CaughtByTheCli, match=r"^reward 'clipscore': .* not found in"):
        RewardSet({"shapes-compliance": 1.0}, extra=["clipscore"], paths={"clipscore": str(tmp_path / "none")})
