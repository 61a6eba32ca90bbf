"""The explorer on a tiny FLUX with LoRA adapters "default" (trained) and "old" (sampling)."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from diffusers import FluxTransformer2DModel
from peft import LoraConfig

from solrl_core.quant.explorer import BACKENDS, build_explorer, select_quantized_layers
from solrl_core.quant.fp8 import fp8_linear, quantize_fp8
from solrl_core.quant.nvfp4 import fake_quantize_nvfp4

LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
# The paper's kind of skip list: embedders, the modulation ("norm") linears and the final layer.
FLUX_LIKE_SKIP = [
    "x_embedder",
    "context_embedder",
    "time_text_embed.*",
    "*.norm1.linear",
    "*.norm1_context.linear",
    "*.norm.linear",
    "norm_out.*",
    "proj_out",
]
# Every Linear of the tiny model has max(in, out) >= 64; 63 keeps all of them by size.
MIN_DIM = 63
SELECTED_WITH_FLUX_LIKE_SKIP = [
    "transformer_blocks.0.attn.to_q",
    "transformer_blocks.0.attn.to_k",
    "transformer_blocks.0.attn.to_v",
    "transformer_blocks.0.attn.to_out.0",
    "transformer_blocks.0.attn.add_q_proj",
    "transformer_blocks.0.attn.add_k_proj",
    "transformer_blocks.0.attn.add_v_proj",
    "transformer_blocks.0.attn.to_add_out",
    "transformer_blocks.0.ff.net.0.proj",
    "transformer_blocks.0.ff.net.2",
    "transformer_blocks.0.ff_context.net.0.proj",
    "transformer_blocks.0.ff_context.net.2",
    "single_transformer_blocks.0.proj_mlp",
    "single_transformer_blocks.0.proj_out",
    "single_transformer_blocks.0.attn.to_q",
    "single_transformer_blocks.0.attn.to_k",
    "single_transformer_blocks.0.attn.to_v",
]
LORA_LAYER = "transformer_blocks.0.attn.to_q"


@pytest.fixture
def model():
    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=48, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=32, pooled_projection_dim=32,
        axes_dims_rope=(4, 6, 6),
    )
    with warnings.catch_warnings():  # peft warns that a second adapter is being added
        warnings.simplefilter("ignore")
        for name in ("default", "old"):
            # init_lora_weights=False: random lora_B, so each adapter really changes the layer
            config = LoraConfig(
                r=4, lora_alpha=8, target_modules=LORA_TARGETS, init_lora_weights=False
            )
            transformer.add_adapter(config, adapter_name=name)
    transformer.set_adapter("default")
    return transformer.eval()


def quantized_explorer(model, backend, skip, min_dim, adapter="old"):
    explorer = build_explorer(model, backend, skip, min_dim)
    explorer.requantize(model, adapter)
    return explorer


def model_inputs(seed=0, batch=2, image_tokens=64, text_tokens=8):
    generator = torch.Generator().manual_seed(seed)
    return dict(
        hidden_states=torch.randn(batch, image_tokens, 48, generator=generator),
        encoder_hidden_states=torch.randn(batch, text_tokens, 32, generator=generator),
        pooled_projections=torch.randn(batch, 32, generator=generator),
        timestep=torch.rand(batch, generator=generator),
        img_ids=torch.zeros(image_tokens, 3),
        txt_ids=torch.zeros(text_tokens, 3),
        return_dict=False,
    )


@torch.no_grad()
def run(model, seed=0):
    return model(**model_inputs(seed))[0]


def relative_error(approx, exact):
    return ((approx - exact).norm() / exact.norm()).item()


def merged_weight_by_hand(model, name, adapter):
    layer = model.get_submodule(name)
    delta = layer.scaling[adapter] * (layer.lora_B[adapter].weight @ layer.lora_A[adapter].weight)
    return (layer.base_layer.weight + delta).detach(), layer.base_layer.bias.detach()


def patched_layers(model):
    return [name for name, module in model.named_modules() if "forward" in module.__dict__]


# --- selection -------------------------------------------------------------------------------


def test_skip_globs_and_min_dim_select_the_expected_layers(model):
    assert select_quantized_layers(model, FLUX_LIKE_SKIP, MIN_DIM) == SELECTED_WITH_FLUX_LIKE_SKIP


def test_min_dim_is_a_strict_lower_bound_on_max_in_out(model):
    # At 64 the 64x64 attention projections drop out; layers touching a 256/320 dim stay.
    assert select_quantized_layers(model, FLUX_LIKE_SKIP, 64) == [
        "transformer_blocks.0.ff.net.0.proj",
        "transformer_blocks.0.ff.net.2",
        "transformer_blocks.0.ff_context.net.0.proj",
        "transformer_blocks.0.ff_context.net.2",
        "single_transformer_blocks.0.proj_mlp",
        "single_transformer_blocks.0.proj_out",
    ]
    assert select_quantized_layers(model, [], 383) == [
        "transformer_blocks.0.norm1.linear",
        "transformer_blocks.0.norm1_context.linear",
    ]  # 64 -> 384
    assert select_quantized_layers(model, [], 384) == []


def test_lora_wrapped_linears_are_one_unit_and_their_children_never_selected(model):
    everything = select_quantized_layers(model, [], -1)
    assert len(everything) == 28  # every Linear of the tiny FLUX, LoRA-wrapped ones once
    assert LORA_LAYER in everything and "x_embedder" in everything
    assert not [name for name in everything if ".lora_" in name or "base_layer" in name]


# --- patching --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["emulated-nvfp4", "fp8"])
def test_active_patches_selected_layers_and_restores_them_on_exit(model, backend):
    explorer = quantized_explorer(model, backend, FLUX_LIKE_SKIP, MIN_DIM)
    with explorer.active(model):
        assert patched_layers(model) == SELECTED_WITH_FLUX_LIKE_SKIP
    assert patched_layers(model) == []


def test_active_restores_forwards_after_an_exception(model):
    explorer = quantized_explorer(model, "emulated-nvfp4", FLUX_LIKE_SKIP, MIN_DIM)
    with pytest.raises(KeyError, match="boom"):
        with explorer.active(model):
            raise KeyError("boom")
    assert patched_layers(model) == []
    with explorer.active(model):  # and it is usable again
        run(model)


def test_backend_none_patches_nothing_and_output_is_identical(model):
    reference = run(model)
    explorer = quantized_explorer(model, "none", FLUX_LIKE_SKIP, MIN_DIM)
    assert explorer.layer_names == []
    with explorer.active(model):
        assert patched_layers(model) == []
        assert torch.equal(run(model), reference)


def test_active_before_requantize_is_an_error(model):
    explorer = build_explorer(model, "fp8", FLUX_LIKE_SKIP, MIN_DIM)
    with pytest.raises(RuntimeError, match="requantize"):
        with explorer.active(model):
            pass


# --- numerics --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [LORA_LAYER, "transformer_blocks.0.ff.net.2"])
def test_nvfp4_layer_is_w4a4_on_the_merged_old_weights(model, name):
    explorer = quantized_explorer(model, "emulated-nvfp4", FLUX_LIKE_SKIP, MIN_DIM)
    layer = model.get_submodule(name)
    x = torch.randn(3, 5, layer.in_features)
    if name == LORA_LAYER:
        weight, bias = merged_weight_by_hand(model, name, "old")
    else:  # no LoRA on this layer: its own weight
        weight, bias = layer.weight.detach(), layer.bias.detach()
    expected = F.linear(fake_quantize_nvfp4(x, per_sample=True), fake_quantize_nvfp4(weight), bias)
    with explorer.active(model), torch.no_grad():
        assert torch.equal(layer(x), expected)


def test_fp8_layer_quantizes_the_merged_old_weights(model):
    explorer = quantized_explorer(model, "fp8", FLUX_LIKE_SKIP, MIN_DIM)
    weight, bias = merged_weight_by_hand(model, LORA_LAYER, "old")
    x = torch.randn(3, 5, 64)
    expected = fp8_linear(x, *quantize_fp8(weight), bias, torch.float32)
    with explorer.active(model), torch.no_grad():
        assert torch.equal(model.get_submodule(LORA_LAYER)(x), expected)


def test_output_dtype_follows_the_input(model):
    explorer = quantized_explorer(model, "emulated-nvfp4", FLUX_LIKE_SKIP, MIN_DIM)
    x = torch.randn(2, 64).to(torch.bfloat16)
    with explorer.active(model), torch.no_grad():
        assert model.get_submodule(LORA_LAYER)(x).dtype == torch.bfloat16


# Whole-model closeness. On Gaussian data one NVFP4 W4A4 layer has ~13% relative error (each
# operand ~9.5%); through the tiny FLUX, whose skipped embedders, modulation linears and final
# layer stay exact and whose residual stream carries the input, the output moves by ~1.3%
# (0.0126 .. 0.0130 over five input seeds), FP8 by ~0.3%. The bounds are ~4x those measurements,
# and well below what quantizing every layer costs (~20% for NVFP4 without the skip list).
EXPLORER_ERROR_BOUNDS = {"emulated-nvfp4": (1e-3, 0.05), "fp8": (1e-4, 0.015)}


@pytest.mark.parametrize("backend", ["emulated-nvfp4", "fp8"])
@pytest.mark.parametrize("seed", range(3))
def test_explorer_differs_from_the_old_policy_but_stays_close(model, backend, seed):
    model.set_adapter("old")  # the policy the explorer stands in for
    reference = run(model, seed)
    model.set_adapter("default")
    explorer = quantized_explorer(model, backend, FLUX_LIKE_SKIP, MIN_DIM)
    model.set_adapter("old")  # skipped layers of the explorer run full precision with "old"
    with explorer.active(model):
        error = relative_error(run(model, seed), reference)
    low, high = EXPLORER_ERROR_BOUNDS[backend]
    assert low < error < high


def test_quantizing_every_layer_is_far_worse_than_with_the_skip_list(model):
    model.set_adapter("old")
    reference = run(model)
    with_skip = quantized_explorer(model, "emulated-nvfp4", FLUX_LIKE_SKIP, MIN_DIM)
    everything = quantized_explorer(model, "emulated-nvfp4", [], -1)
    with with_skip.active(model):
        error_with_skip = relative_error(run(model), reference)
    with everything.active(model):
        error_everything = relative_error(run(model), reference)
    assert error_everything > 5 * error_with_skip


def test_layers_not_selected_run_with_the_callers_active_adapter(model):
    # Leave the LoRA layer out of the explorer: it must behave exactly as without the explorer.
    skip = FLUX_LIKE_SKIP + [LORA_LAYER]
    explorer = quantized_explorer(model, "emulated-nvfp4", skip, MIN_DIM)
    layer = model.get_submodule(LORA_LAYER)
    x = torch.randn(2, 64)
    with torch.no_grad():
        for adapter in ("default", "old"):
            model.set_adapter(adapter)
            expected = layer(x)
            with explorer.active(model):
                assert torch.equal(layer(x), expected)


# --- requantize ------------------------------------------------------------------------------


def test_requantize_picks_up_changed_old_adapter_weights(model):
    explorer = quantized_explorer(model, "emulated-nvfp4", FLUX_LIKE_SKIP, MIN_DIM)
    with explorer.active(model):
        before = run(model)
    with torch.no_grad():
        model.get_submodule(LORA_LAYER).lora_B["old"].weight.mul_(-3.0)
    with explorer.active(model):
        assert torch.equal(run(model), before)  # cached: nothing re-quantized per forward
    explorer.requantize(model)
    with explorer.active(model):
        after = run(model)
    assert relative_error(after, before) > 1e-3
    weight, bias = merged_weight_by_hand(model, LORA_LAYER, "old")
    x = torch.randn(4, 64)
    with explorer.active(model), torch.no_grad():
        expected = F.linear(fake_quantize_nvfp4(x, per_sample=True), fake_quantize_nvfp4(weight), bias)
        assert torch.equal(model.get_submodule(LORA_LAYER)(x), expected)


def test_requantize_merges_the_adapter_it_is_given(model):
    explorer = quantized_explorer(model, "emulated-nvfp4", FLUX_LIKE_SKIP, MIN_DIM)
    layer = model.get_submodule(LORA_LAYER)
    x = torch.randn(4, 64)
    weights = {
        "default": merged_weight_by_hand(model, LORA_LAYER, "default")[0],
        None: layer.base_layer.weight.detach(),
    }
    for adapter, weight in weights.items():
        explorer.requantize(model, adapter=adapter)
        bias = layer.base_layer.bias
        expected = F.linear(fake_quantize_nvfp4(x, per_sample=True), fake_quantize_nvfp4(weight), bias)
        with explorer.active(model), torch.no_grad():
            assert torch.equal(layer(x), expected)


@pytest.mark.parametrize("backend", ["emulated-nvfp4", "fp8"])
def test_requantize_leaves_the_model_parameters_untouched(model, backend):
    before = {name: (p.detach().clone(), p.data_ptr()) for name, p in model.named_parameters()}
    explorer = quantized_explorer(model, backend, FLUX_LIKE_SKIP, MIN_DIM)
    explorer.requantize(model, adapter="old")
    explorer.requantize(model, adapter=None)
    with explorer.active(model):
        run(model)
    for name, parameter in model.named_parameters():
        value, pointer = before[name]
        assert parameter.data_ptr() == pointer and torch.equal(parameter, value), name


# --- backends --------------------------------------------------------------------------------


def test_unknown_backend_is_a_clear_error_naming_the_allowed_ones(model):
    # auto and fp8-rowwise joined the list with issue 12 (auto: the real presets' default).
    with pytest.raises(ValueError, match="allowed: auto, none, emulated-nvfp4, fp8, fp8-rowwise, te-nvfp4"):
        build_explorer(model, "nvfp4", FLUX_LIKE_SKIP, MIN_DIM)
    assert BACKENDS == ("auto", "none", "emulated-nvfp4", "fp8", "fp8-rowwise", "te-nvfp4")


def _has_blackwell_and_transformer_engine():
    try:
        import transformer_engine.pytorch  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (10, 0)


@pytest.mark.skipif(_has_blackwell_and_transformer_engine(), reason="te-nvfp4 can run here")
def test_te_nvfp4_without_blackwell_and_transformer_engine_says_what_is_missing(model):
    with pytest.raises(RuntimeError) as error:
        build_explorer(model, "te-nvfp4", FLUX_LIKE_SKIP, MIN_DIM)
    message = str(error.value)
    assert "Transformer Engine" in message and "sm_100" in message
    assert "gpu extra" in message and "emulated-nvfp4" in message and "fp8" in message
    assert "missing:" in message
