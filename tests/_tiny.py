"""Tiny, randomly initialised instances of the real models' classes, saved in their real layouts.

Used by test_real_models.py and test_real_rewards.py: each builder writes what the real download
would hold (a diffusers pipeline folder, a CLIP folder, an HPS checkpoint, an ImageReward folder),
only small, with tokenizers built offline from vocabularies written here.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch

SMALL_WORDS = ["a", "an", "the", "of", "on", "in", "with", "and", "at", "red", "blue", "fox", "cat", "dog", "sky"]


# --- tokenizers ------------------------------------------------------------------------------


def _byte_characters() -> list[str]:
    """GPT-2 / CLIP byte-to-unicode table: 256 printable characters, one per byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes, extra = printable[:], 0
    for byte in range(256):
        if byte not in printable:
            codes.append(256 + extra)
            extra += 1
    return [chr(code) for code in codes]


def clip_tokenizer():
    """A byte-level CLIP BPE tokenizer with no merges: 256 bytes, each also as a word end, + 2 specials."""
    from transformers import CLIPTokenizer

    vocab: dict[str, int] = {}
    for suffix in ("", "</w>"):
        for character in _byte_characters():
            vocab[character + suffix] = len(vocab)
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def t5_tokenizer():
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [(c, -3.0) for c in string.ascii_lowercase] + [("▁" + c, -2.5) for c in string.ascii_lowercase]
    pieces += [("▁" + w, -1.0) for w in SMALL_WORDS]
    return T5Tokenizer(vocab=pieces, extra_ids=8)


def gemma_tokenizer():
    from transformers import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "▁": 5}
    for piece in list(string.ascii_letters + string.digits + string.punctuation) + ["▁" + c for c in string.ascii_lowercase]:
        vocab.setdefault(piece, len(vocab))
    return GemmaTokenizer(vocab=vocab, merges=[])


def write_bert_vocab(folder: Path) -> int:
    """BERT's vocab.txt format; returns the vocabulary size."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(string.ascii_lowercase)
    tokens += ["##" + c for c in string.ascii_lowercase] + [w for w in SMALL_WORDS if w not in tokens]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n")
    return len(tokens)


# --- text encoders ---------------------------------------------------------------------------


def clip_text_encoder(tokenizer, hidden: int, with_projection: bool = False):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                            num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=77,
                            projection_dim=hidden, bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(config)


def t5_encoder(tokenizer, d_model: int):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=len(tokenizer) + 4, d_model=d_model, d_kv=8, d_ff=2 * d_model, num_layers=1,
                      num_heads=2, relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1,
                      decoder_start_token_id=0)
    return T5EncoderModel(config)


def gemma_encoder(tokenizer, hidden: int):
    from transformers import Gemma2Config, Gemma2Model

    config = Gemma2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                          pad_token_id=0, eos_token_id=1, bos_token_id=2)
    return Gemma2Model(config)


# --- autoencoders ----------------------------------------------------------------------------


def kl_vae(latent_channels: int, scaling: float, shift: float | None):
    """AutoencoderKL with two blocks: 2x downsampling."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
                         latent_channels=latent_channels, norm_num_groups=4, sample_size=16,
                         scaling_factor=scaling, shift_factor=shift)


def dc_vae(latent_channels: int):
    """AutoencoderDC (SANA's deep-compression autoencoder) with two stages: 2x downsampling."""
    from diffusers import AutoencoderDC

    return AutoencoderDC(in_channels=3, latent_channels=latent_channels, attention_head_dim=4,
                         encoder_block_types=("ResBlock", "EfficientViTBlock"),
                         decoder_block_types=("ResBlock", "EfficientViTBlock"),
                         encoder_block_out_channels=(8, 16), decoder_block_out_channels=(8, 16),
                         encoder_layers_per_block=(1, 1), decoder_layers_per_block=(1, 1),
                         encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
                         scaling_factor=0.41)


# --- pipelines -------------------------------------------------------------------------------


def save_flux(folder: Path) -> Path:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(0)
    clip, t5 = clip_tokenizer(), t5_tokenizer()
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                         attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16,
                                         pooled_projection_dim=16, guidance_embeds=True, axes_dims_rope=(2, 2, 4))
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=kl_vae(4, 0.3611, 0.1159),
                        text_encoder=clip_text_encoder(clip, 16), tokenizer=clip,
                        text_encoder_2=t5_encoder(t5, 16), tokenizer_2=t5, transformer=transformer)
    pipe.save_pretrained(str(folder))
    return folder


def save_sd3(folder: Path) -> Path:
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    torch.manual_seed(0)
    clip_1, clip_2, t5 = clip_tokenizer(), clip_tokenizer(), t5_tokenizer()
    transformer = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8,
                                        num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16,
                                        pooled_projection_dim=32, out_channels=4, pos_embed_max_size=8)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=kl_vae(4, 1.5305, 0.0609),
        text_encoder=clip_text_encoder(clip_1, 16, with_projection=True), tokenizer=clip_1,
        text_encoder_2=clip_text_encoder(clip_2, 16, with_projection=True), tokenizer_2=clip_2,
        text_encoder_3=t5_encoder(t5, 32), tokenizer_3=t5)
    pipe.save_pretrained(str(folder))
    return folder


def save_sana(folder: Path) -> Path:
    from diffusers import DPMSolverMultistepScheduler, SanaPipeline, SanaTransformer2DModel

    torch.manual_seed(0)
    gemma = gemma_tokenizer()
    transformer = SanaTransformer2DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
                                         num_layers=1, num_cross_attention_heads=2, cross_attention_head_dim=8,
                                         cross_attention_dim=16, caption_channels=16, sample_size=8, patch_size=1)
    scheduler = DPMSolverMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    pipe = SanaPipeline(tokenizer=gemma, text_encoder=gemma_encoder(gemma, 16), vae=dc_vae(4),
                        transformer=transformer, scheduler=scheduler)
    pipe.save_pretrained(str(folder))
    return folder


# --- reward models ---------------------------------------------------------------------------


def save_clip(folder: Path, logit_scale: float | None = None) -> Path:
    """A CLIPModel + CLIPProcessor folder, as openai/clip-vit-large-patch14 or PickScore_v1 holds."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    torch.manual_seed(0)
    tokenizer = clip_tokenizer()
    config = CLIPConfig(
        text_config={"vocab_size": len(tokenizer), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 77, "bos_token_id": tokenizer.bos_token_id,
                     "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        projection_dim=8)
    model = CLIPModel(config)
    if logit_scale is not None:
        model.logit_scale.data.fill_(logit_scale)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    model.save_pretrained(str(folder))
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(str(folder))
    return folder


HPS_TINY_CONFIG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 224, "layers": 1, "width": 32, "head_width": 16, "patch_size": 32},
    # HPS's tokenizer is open_clip's BPE: the text tower keeps its 49408-token vocabulary.
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def save_hps(folder: Path) -> Path:
    """HPS_v2.1_compressed.pt ({"state_dict": ...}) of a tiny open_clip model + its config."""
    from solrl_core.rewards.hpsv2 import CHECKPOINT, vendored_open_clip

    open_clip = vendored_open_clip()
    torch.manual_seed(0)
    open_clip.factory._MODEL_CONFIGS["tests-hps-tiny"] = HPS_TINY_CONFIG
    model = open_clip.create_model("tests-hps-tiny", None, precision="fp32", device="cpu", output_dict=True)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": model.state_dict()}, folder / CHECKPOINT)
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": HPS_TINY_CONFIG}))
    return folder


def save_imagereward(folder: Path) -> Path:
    """ImageReward.pt + med_config.json (+ BLIP's BERT vocabulary in tokenizer/), tiny ViT and BERT."""
    from solrl_core.rewards.imagereward import image_reward_modules

    image_reward, _, vit = image_reward_modules()
    from ImageReward.models.BLIP.med import BertConfig, BertModel

    torch.manual_seed(0)
    vocab_size = write_bert_vocab(folder / "tokenizer") + 2  # + BLIP's [DEC] and [ENC]
    # ImageReward's MLP head reads 768 features (hard-coded), so the tiny BERT keeps width 768.
    med_config = {"architectures": ["BertModel"], "hidden_size": 768, "intermediate_size": 64, "num_hidden_layers": 1,
                  "num_attention_heads": 12, "max_position_embeddings": 40, "vocab_size": vocab_size,
                  "type_vocab_size": 2, "pad_token_id": 0, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
                  "encoder_width": 64, "add_cross_attention": True, "model_type": "bert"}
    (folder / "med_config.json").write_text(json.dumps(med_config))
    config = BertConfig(**med_config)
    state = {}
    visual = vit.VisionTransformer(img_size=224, patch_size=32, embed_dim=64, depth=1, num_heads=1)
    text = BertModel(config, add_pooling_layer=False)
    mlp = image_reward.MLP(768)
    for layer in mlp.layers:  # the package's init (std 1/769, no activations) makes every score ~0
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.normal_(layer.weight, std=layer.in_features ** -0.5)
    for prefix, module in (("blip.visual_encoder.", visual), ("blip.text_encoder.", text), ("mlp.", mlp),
                           ("blip.vision_proj.", torch.nn.Linear(64, 256)), ("blip.text_proj.", torch.nn.Linear(768, 256))):
        state.update({prefix + k: v for k, v in module.state_dict().items()})
    torch.save(state, folder / "ImageReward.pt")
    return folder


def save_reward_models(root: Path) -> dict[str, Path]:
    """A tiny random instance of each real reward model, saved in its own folder under ``root``."""
    return {"clipscore": save_clip(root / "clipscore"),
            "pickscore": save_clip(root / "pickscore", logit_scale=4.0),
            "hpsv2": save_hps(root / "hpsv2"),
            "imagereward": save_imagereward(root / "imagereward")}
