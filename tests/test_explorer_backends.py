"""Explorer backends (issue 12): `auto` per device capability (mocked), one-line refusals, the
exact NVFP4 emulation on bf16 operands with a packed cache, one quantized activation shared by
q/k/v, 1x1 convolutions as Linears, and the Transformer Engine recipe (with a stand-in module)."""

from __future__ import annotations

import importlib.util
import warnings
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _gpu_path import gpu_path, ops_run, ran_compiled_code

from solrl_core.accounting import backend_precision, profile_problem
from flows.cli import main
from solrl_core.quant import backends
from solrl_core.quant.backends import BackendUnavailable, auto_choice, resolve_backend
from solrl_core.quant.explorer import Explorer, build_explorer
from solrl_core.quant.nvfp4 import E2M1_MAGNITUDES, fake_quantize_nvfp4, quantize_nvfp4
from solrl_core.quant.nvfp4_linear import (decode_scaled_codes, factored_linear, pack_weight,
                                           quantize_activation_scaled)
from solrl_core.quant.te_nvfp4 import RECIPE_SETTINGS, TransformerEngineNVFP4


def gaussian(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- auto --------------------------------------------------------------------------------------


@pytest.fixture
def gpu(monkeypatch):
    """A mocked CUDA device: set its capability and whether Transformer Engine is installed."""
    state = {"capability": (9, 0), "te": False}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: state["capability"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Mock")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if state["te"] else None) if name == "transformer_engine"
                        else real_find_spec(name, *a))
    return state


@pytest.mark.parametrize("capability, te, expected", [
    ((10, 0), True, "te-nvfp4"), ((10, 0), False, "fp8"), ((12, 0), True, "te-nvfp4"),
    ((9, 0), True, "fp8"), ((8, 9), False, "fp8"), ((8, 6), False, "emulated-nvfp4"), ((8, 0), True, "emulated-nvfp4"),
])
def test_auto_takes_the_cheapest_precision_the_gpu_has_tensor_cores_for(gpu, capability, te, expected):
    gpu.update(capability=capability, te=te)
    assert resolve_backend("auto", torch.device("cuda")) == expected


def test_auto_on_a_cpu_is_the_emulation():
    assert resolve_backend("auto", torch.device("cpu")) == "emulated-nvfp4"
    assert auto_choice(None, transformer_engine=True) == "emulated-nvfp4"


def test_an_explicit_backend_the_device_cannot_run_is_one_line(gpu):
    gpu.update(capability=(9, 0), te=True)
    with pytest.raises(BackendUnavailable) as error:
        resolve_backend("te-nvfp4", torch.device("cuda"))
    message = str(error.value)
    assert "\n" not in message and "sm_100" in message and "NVIDIA Mock (sm_90)" in message
    assert resolve_backend("fp8", torch.device("cuda")) == "fp8"  # the emulation runs anywhere
    assert resolve_backend("fp8", torch.device("cpu")) == "fp8"


def test_cli_refuses_te_nvfp4_here_before_loading_anything(tmp_path, capsys):
    if backends.unavailable_reason("te-nvfp4", backends.run_device("auto")) is None:
        pytest.skip("this machine can run te-nvfp4")
    out = tmp_path / "run"
    code = main(["run", "--preset", "shapes-tiny", "--out", str(out), "-S", "explore.backend=te-nvfp4"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "te-nvfp4 cannot run here" in err
    assert not out.exists()


def test_cost_model_charges_auto_as_it_resolves_on_the_modeled_device():
    assert backend_precision("auto", "H200") == "fp8" and backend_precision("auto", "B200") == "fp4"
    assert backend_precision("fp8-rowwise", "H100") == "fp8" and backend_precision("none", "B200") == "bf16"
    assert profile_problem("H100", "auto") is None
    assert "unknown explorer backend 'int3'" in profile_problem("B200", "int3")  # never a silent bf16
    with pytest.raises(ValueError, match="unknown explorer backend"):
        backend_precision("int3")


def test_real_presets_default_to_auto():
    from solrl_core.presets import PRESETS, resolve_config

    for name in ("flux-imagereward", "sana-hpsv2", "sd35l-pickscore"):
        assert PRESETS[name]["settings"]["explore"]["backend"] == "auto"
        assert resolve_config(name, "sol_rl").model.offload_encoders


# --- NVFP4 on bf16 operands -------------------------------------------------------------------


def test_every_code_times_every_block_scale_is_exact_in_bf16():
    codes = torch.tensor(E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES))
    scales = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    scales = scales[torch.isfinite(scales)]
    products = codes[:, None] * scales[None, :]  # exact in fp32: at most 6 significant bits
    assert torch.equal(products.bfloat16().float(), products)


def test_decoded_weight_is_the_fake_quantized_weight_without_its_tensor_scale():
    weight = gaussian(48, 80)
    packed = quantize_nvfp4(weight)
    values = decode_scaled_codes(packed.codes, packed.block_scales)
    assert values.dtype == torch.bfloat16
    assert torch.equal(values.float()[:, :80] * packed.tensor_scale, fake_quantize_nvfp4(weight))
    x_values, x_scale = quantize_activation_scaled(gaussian(7, 80, seed=1))
    assert x_values.dtype == torch.bfloat16
    torch.testing.assert_close(x_values.float()[:, :80] * x_scale, fake_quantize_nvfp4(gaussian(7, 80, seed=1)),
                               rtol=2**-23, atol=0)


@pytest.mark.parametrize("in_features", [256, 200])
def test_bf16_gemm_on_codes_times_block_scales_reproduces_the_fp32_emulation(in_features):
    x, weight, bias = gaussian(33, in_features), gaussian(64, in_features, seed=1) / 8, gaussian(64, seed=2)
    reference = F.linear(fake_quantize_nvfp4(x), fake_quantize_nvfp4(weight), bias)
    packed = pack_weight(weight, bias, torch.float32)
    w_values = decode_scaled_codes(packed.codes, packed.block_scales)
    x_values, x_scale = quantize_activation_scaled(F.pad(x, (0, (-in_features) % 16)))
    # fp32 accumulation of the exact bf16 operands (what a tensor-core GEMM with an fp32 output does):
    fp32 = factored_linear(x_values, x_scale, w_values, packed.tensor_scale, bias,
                           gemm=lambda a, b: a.float() @ b.float())
    scale = (fake_quantize_nvfp4(x).abs() @ fake_quantize_nvfp4(weight).abs().t()).max()
    assert ((fp32 - reference).abs().max() / scale).item() < 1e-5  # only the order of fp32 sums differs
    # (The CPU's own bf16 GEMM is no stand-in for a tensor core's: it rounds partial sums to bf16.)


def tiny_flux(lora: bool = True):
    from diffusers import FluxTransformer2DModel
    from peft import LoraConfig

    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=48, num_layers=1, num_single_layers=1,
                                   attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32,
                                   pooled_projection_dim=32, axes_dims_rope=(4, 6, 6))
    if lora:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.add_adapter(LoraConfig(r=4, lora_alpha=8, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                                         init_lora_weights=False), adapter_name="old")
    return model.eval()


def run(model, seed=0, batch=2, tokens=16, text=8):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        return model(hidden_states=torch.randn(batch, tokens, 48, generator=g),
                     encoder_hidden_states=torch.randn(batch, text, 32, generator=g),
                     pooled_projections=torch.randn(batch, 32, generator=g), timestep=torch.rand(batch, generator=g),
                     img_ids=torch.zeros(tokens, 3), txt_ids=torch.zeros(text, 3), return_dict=False)[0]


def test_nvfp4_cache_is_packed_codes_and_scales_not_fp32_weights():
    model = tiny_flux()
    explorer = build_explorer(model, "emulated-nvfp4", ["x_embedder"], 63)
    explorer.requantize(model, "old")
    for name, entry in explorer._cached_weights.items():
        assert entry.codes.dtype == torch.uint8 and entry.block_scales.dtype == torch.float8_e4m3fn, name
        assert not [t for t in entry if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel() > 64 * 16]


def test_requantize_drops_each_old_entry_before_building_its_new_one_and_fails_clean():
    model = tiny_flux()
    explorer = build_explorer(model, "fp8", [], 63)
    explorer.requantize(model, "old")
    impl, seen = explorer._backend_impl, []
    build = impl.quantize_weight

    def recording(weight, bias, dtype, previous=None):
        seen.append(len(explorer._cached_weights))
        return build(weight, bias, dtype, previous)

    impl.quantize_weight = recording
    explorer.requantize(model, "old")
    layers = len(explorer.layer_names)
    assert seen == [layers - 1] * layers  # never two entries of one layer at once

    def failing(weight, bias, dtype, previous=None):
        if len(seen) > layers + 2:
            raise RuntimeError("out of memory")
        return recording(weight, bias, dtype, previous)

    impl.quantize_weight = failing
    with pytest.raises(RuntimeError, match="out of memory"):
        explorer.requantize(model, "old")
    assert explorer._cached_weights == {}  # no mix of old and new weights
    with pytest.raises(RuntimeError, match="requantize"):
        with explorer.active(model):
            pass


@pytest.mark.parametrize("path", ["cpu", "gpu"], ids=["cpu-path", "gpu-path-on-cpu"])
@pytest.mark.parametrize("backend", ["fp8", "fp8-rowwise", "emulated-nvfp4"])
def test_q_k_and_v_share_one_quantized_activation(backend, path):
    # Also on the GPU path (compiled quantizers, _scaled_mm), whose activations are other objects.
    with gpu_path() if path == "gpu" else nullcontext():
        check_q_k_and_v_share_one_quantized_activation(backend)


def check_q_k_and_v_share_one_quantized_activation(backend):
    model = tiny_flux()
    explorer = build_explorer(model, backend, ["x_embedder", "context_embedder", "proj_out"], 63)
    explorer.requantize(model, "old")
    impl, activations = explorer._backend_impl, []
    quantize = impl.quantize_activation
    impl.quantize_activation = lambda x: activations.append(quantize(x)) or activations[-1]
    used: dict[str, object] = {}
    matmul = impl.matmul
    for name in explorer.layer_names:
        explorer._cached_weights[name] = (name, explorer._cached_weights[name])
    impl.matmul = lambda activation, cached, x: (used.__setitem__(cached[0], id(activation)),
                                                 matmul(activation, cached[1], x))[1]
    with explorer.active(model):
        shared = run(model)
    block = "transformer_blocks.0.attn."
    assert used[block + "to_q"] == used[block + "to_k"] == used[block + "to_v"]
    assert used[block + "add_q_proj"] == used[block + "add_k_proj"] != used[block + "to_q"]
    assert len(activations) < len(used)
    # Sharing changes nothing: each layer gets the quantization of its own input.
    explorer._shared.get = lambda x, quantize: quantize(x)
    with explorer.active(model):
        assert torch.equal(run(model), shared)


@pytest.mark.parametrize("backend", ["fp8", "fp8-rowwise", "emulated-nvfp4"])
def test_the_explorers_gpu_path_gives_the_cpu_emulations_numbers(backend):
    """The whole explorer on the GPU path (what a GPU runs, here on the CPU) against its CPU path,
    on a FLUX block: the same quantized operands, so only fp32 rounding differs (the order of the
    GEMM's sum; NVFP4's tensor scales applied after it): ~1e-7 relative, where the quantization
    itself moves the output by ~1e-2. (For FP8 the CPU's _scaled_mm gives the emulation's bits
    from 4 tokens up; the 2-token embedding GEMMs here sum in another order.)"""
    model = tiny_flux()
    explorer = build_explorer(model, backend, ["x_embedder", "context_embedder", "proj_out"], 63)
    explorer.requantize(model, "old")
    with explorer.active(model):
        emulated = run(model)
        with gpu_path():
            ops, on_gpu_path = ops_run(lambda: run(model))
    assert ran_compiled_code(ops) and ("aten::_scaled_mm" in ops) == backend.startswith("fp8")
    assert ((on_gpu_path - emulated).norm() / emulated.norm()).item() < 1e-6


def test_fp8_rowwise_scales_each_token_and_each_output_channel():
    model = tiny_flux(lora=False)
    skip = ["x_embedder", "context_embedder", "time_text_embed.*", "*norm*.linear", "norm_out.*", "proj_out"]
    explorer = build_explorer(model, "fp8-rowwise", skip, 63)
    explorer.requantize(model, None)
    entry = explorer._cached_weights["transformer_blocks.0.ff.net.2"]
    assert entry.scale.shape == (entry.data.shape[0], 1)
    reference = run(model)
    with explorer.active(model):
        error = ((run(model) - reference).norm() / reference.norm()).item()
    assert 1e-5 < error < 0.015  # fp8's per-tensor bound on this model (tests/test_explorer.py)


# --- 1x1 convolutions -------------------------------------------------------------------------


class PointwiseFeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.inverted = nn.Conv2d(32, 96, 1)
        self.depth = nn.Conv2d(96, 96, 3, padding=1, groups=96)
        self.point = nn.Conv2d(96, 32, 1, bias=False)

    def forward(self, x):
        return self.point(F.silu(self.depth(self.inverted(x))))


def test_a_1x1_convolution_is_quantized_as_a_linear_over_its_channels():
    model = PointwiseFeedForward()
    explorer = build_explorer(model, "emulated-nvfp4", [], 0)
    assert explorer.layer_names == ["inverted", "point"]  # the depthwise 3x3 is no GEMM
    explorer.requantize(model, None)
    x = gaussian(2, 32, 5, 6).to(memory_format=torch.channels_last)
    tokens = x.permute(0, 2, 3, 1)
    weight = model.inverted.weight.detach().reshape(96, 32)
    expected = F.linear(fake_quantize_nvfp4(tokens, per_sample=True), fake_quantize_nvfp4(weight), model.inverted.bias).permute(0, 3, 1, 2)
    with explorer.active(model), torch.no_grad():
        assert torch.equal(model.inverted(x), expected)
        assert model(x).shape == (2, 32, 5, 6)


def sana_1600m_on_meta():
    from diffusers import SanaTransformer2DModel

    with torch.device("meta"):  # SANA 1600M 1024px's transformer config, no memory
        return SanaTransformer2DModel(in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32,
                                      num_layers=20, num_cross_attention_heads=20, cross_attention_head_dim=112,
                                      cross_attention_dim=2240, caption_channels=2304, mlp_ratio=2.5,
                                      sample_size=32, patch_size=1)


def test_sana_quantizes_what_the_reference_quantizes():
    """The reference (NVlabs/Sana sol_rl, min_dim 2240, attn.qkv skipped) quantizes the fused
    cross-attention kv_linear (2240 -> 4480) and the feed-forward; here: attn2's k and v as a
    fused pair and GLUMBConv's two 1x1 convolutions, in each of the 20 blocks."""
    from solrl_core.presets import MODEL_PRESETS

    model = sana_1600m_on_meta()
    quant = MODEL_PRESETS["sana-1.6b"]["settings"]["quant"]
    explorer = build_explorer(model, "emulated-nvfp4", quant["skip"], quant["min_dim"], quant["fused"])
    per_block = {name.split(".", 2)[2] for name in explorer.layer_names}
    assert per_block == {"attn2.to_k", "attn2.to_v", "ff.conv_inverted", "ff.conv_point"}
    assert len(explorer.layer_names) == 80
    described = explorer.describe(model)
    assert described["quantized_layers"] == 80 and 0.5 < described["quantized_share"] < 0.7
    # Without the fused pair the 2240 x 2240 k and v would stay BF16, as the issue found.
    alone = build_explorer(model, "emulated-nvfp4", quant["skip"], quant["min_dim"])
    assert len(alone.layer_names) == 40


# --- Transformer Engine, with a stand-in module ----------------------------------------------


class FakeTE:
    """Records what the te-nvfp4 backend asks of Transformer Engine."""

    def __init__(self):
        self.recipes, self.layers_built_in_quantized_init, self.autocasts, self.copies = [], [], 0, 0
        self.in_init = False
        self.rows = []
        fake = self

        class Recipe:
            def __init__(self, **kwargs):
                fake.recipes.append(kwargs)

        class Weight(nn.Parameter):
            def copy_(self, source):
                fake.copies += 1
                return super().copy_(source)

        class Linear(nn.Module):
            def __init__(self, in_features, out_features, bias, params_dtype, device):
                super().__init__()
                fake.layers_built_in_quantized_init.append(fake.in_init)
                self.weight = Weight(torch.zeros(out_features, in_features, dtype=params_dtype, device=device))
                self.bias = nn.Parameter(torch.zeros(out_features, dtype=params_dtype)) if bias else None

            def forward(self, x):
                assert fake.active, "te.Linear called outside the recipe's autocast"
                # TE's NVFP4 GEMM takes [rows, features] with rows divisible by 16
                assert x.dim() == 2 and x.shape[0] % 16 == 0, f"TE cannot take rows {tuple(x.shape)}"
                fake.rows.append(x.shape[0])
                return F.linear(x, self.weight, self.bias)

        self.Linear = Linear
        self.recipe_module = type("recipe", (), {"NVFP4BlockScaling": Recipe})
        self.active = False

    def quantized_model_init(self, enabled, recipe):
        from contextlib import contextmanager

        @contextmanager
        def context():
            self.in_init = True
            yield
            self.in_init = False

        return context()

    def autocast(self, enabled, recipe):
        from contextlib import contextmanager

        @contextmanager
        def context():
            self.autocasts += 1
            self.active = True
            yield
            self.active = False

        return context()


def test_te_nvfp4_builds_spec_s_recipe_quantizes_weights_once_and_enters_autocast_once():
    fake = FakeTE()
    model = tiny_flux()
    names = [n for n in build_explorer(model, "fp8", ["x_embedder", "context_embedder", "proj_out"], 63).layer_names]
    explorer = Explorer("te-nvfp4", names, te_modules=(fake, fake.recipe_module))
    assert fake.recipes == [{"disable_2d_quantization": True, "disable_rht": True, "disable_stochastic_rounding": True}]
    assert RECIPE_SETTINGS["disable_2d_quantization"] is True  # 1x16 weight blocks, SPEC section 3
    explorer.requantize(model, "old")
    te_layers = [n for n, e in explorer._cached_weights.items() if isinstance(e, nn.Module)]
    assert te_layers and all(fake.layers_built_in_quantized_init)  # quantized weights only, no bf16 copy
    assert fake.copies == len(te_layers)  # one quantization per layer per requantize
    modules = {n: explorer._cached_weights[n] for n in te_layers}
    explorer.requantize(model, "old")
    assert fake.copies == 2 * len(te_layers) and all(explorer._cached_weights[n] is m for n, m in modules.items())
    assert len(fake.layers_built_in_quantized_init) == len(te_layers)  # layers reused, not rebuilt
    with explorer.active(model):
        run(model)
        run(model)
    assert fake.autocasts == 1  # once around all forwards, not once per layer


def test_te_nvfp4_pads_rows_to_tes_multiple_and_returns_only_the_real_rows():
    """SANA's caption stream has 300 tokens a sample: batch x 300 rows are not a multiple of 16 at
    most batch sizes, and TE's NVFP4 GEMM refuses them. The rows are zero-padded and cut off again."""
    fake = FakeTE()
    backend = TransformerEngineNVFP4((fake, fake.recipe_module))
    weight, bias = torch.randn(64, 32), torch.randn(64)
    layer = backend.quantize_weight(weight, bias, torch.float32)
    x = torch.randn(3, 300, 32)  # 900 rows: 12 short of 912
    with backend.session():
        y = backend.forward(layer, x)
    assert fake.rows == [912] and y.shape == (3, 300, 64) and y.dtype == x.dtype
    expected = F.linear(x.to(torch.bfloat16), weight.to(torch.bfloat16), bias.to(torch.bfloat16)).float()
    assert torch.equal(y, expected)
