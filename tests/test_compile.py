"""model.compile: the policy transformer compiled by repeated block samples as eager does, with a
bounded number of graphs across the explorer's layer swap and the adapter switches.

One compiled model serves the module's tests (compiling is most of their cost): the embedded
world's transformer with the fp8 explorer on its GPU path (torch._scaled_mm and the compiled
quantizer, run on the CPU), sampled eager first, then with model.compile=blocks.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

from solrl_core import stages
from solrl_core.config import apply_mapping
from solrl_core.models.adapters import EMA, OLD, TRAINED, blend_adapters
from solrl_core.models.compilation import RECOMPILE_LIMIT, blocks_of, compile_transformer, uncompile_transformer
from solrl_core.models.registry import MODELS
from solrl_core.presets import resolve_config
from solrl_core.quant import gpu_path as gpu_path_module
from tests._gpu_path import gpu_path

TINY_BLOCKS = MODELS["shapes-tiny"].repeated_blocks
SAMPLES, CHUNK, STEPS = 6, 4, 2  # two chunk sizes (4 and 2): a batch size that changes mid-run
# Where each sampling stage runs: (adapter, with the explorer)
STAGES = {"explore": (OLD, True), "regenerate": (OLD, False), "evaluate": (EMA, False), "base": (None, False)}
# Full precision, compiled against eager: fp32 roundoff through the sampler (measured 3.4e-6 on
# latents of magnitude ~1.3).
FULL_PRECISION_TOLERANCE = 1e-4
GRADIENT_TOLERANCE = 1e-4  # relative, per adapter tensor (fp32 roundoff: about 2e-7 at 1 and 2 threads)


def tiny_state(**settings) -> stages.RunState:
    config = resolve_config("shapes-tiny", "sol_rl")
    apply_mapping(config, {"explore": {"backend": "fp8"}, "progress": False, **settings})
    state = stages.initial_state(config)
    # Distinct adapters (LoRA B starts at zero: every adapter would equal the base model).
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in state.policy.transformer.named_parameters():
            if ".lora_B." in name:
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return state


def sample_stages(state: stages.RunState) -> dict[str, torch.Tensor]:
    prompts = [state.train_prompts[i] for i in range(SAMPLES)]
    seeds = list(range(100, 100 + SAMPLES))
    return {stage: stages._sample_seeds(state, prompts, seeds, STEPS, CHUNK, adapter=adapter,
                                        explorer=state.explorer if explored else None, label=stage)[0]
            for stage, (adapter, explored) in STAGES.items()}


def loss_and_gradients(state: stages.RunState) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One micro-batch of the update (its old-policy and reference forwards, then the trained
    forward and backward), with its LoRA gradients."""
    generator = torch.Generator().manual_seed(2)
    latents = torch.randn(SAMPLES, *state.policy.latent_shape, generator=generator)
    items = [stages._TrainItem(i % SAMPLES, 0.3 + 0.1 * (i % 5), 1000 + i) for i in range(5)]
    state.optimizer.zero_grad(set_to_none=True)
    weights = torch.rand(SAMPLES, generator=generator)
    result = stages._micro_batch_loss(state, items, latents, state.train_prompts[:SAMPLES], weights)
    result.loss.backward()
    gradients = {name: p.grad.clone() for name, p in state.policy.transformer.named_parameters() if p.grad is not None}
    state.optimizer.zero_grad(set_to_none=True)
    return result.loss.detach(), gradients


def graphs_per_block_class(state: stages.RunState) -> dict[str, int]:
    """Dynamo's compiled graphs of each block class's forward (shared by all its instances)."""
    classes = {type(block) for block in blocks_of(state.policy.transformer, TINY_BLOCKS)}
    return {cls.__name__: len(_debug_get_cache_entry_list(cls.forward)) for cls in classes}


def rms(x: torch.Tensor) -> torch.Tensor:
    return x.pow(2).mean(dim=(1, 2)).sqrt()


@pytest.fixture(scope="module")
def runs():
    """Eager, then compiled by block: every sampling stage twice (the second after an update of
    the adapters, a requantize and a new explorer swap), and the update's micro-batch."""
    with gpu_path("cpu"):
        counters.clear()
        state = tiny_state()
        stages.quantize(state)
        eager = sample_stages(state)
        eager_loss, eager_gradients = loss_and_gradients(state)
        compiled_modules = compile_transformer(state.policy.transformer, "blocks", TINY_BLOCKS, state.policy.device)
        compiled = sample_stages(state)
        graphs_first = counters["stats"]["unique_graphs"]
        loss, gradients = loss_and_gradients(state)
        graphs_after_update = counters["stats"]["unique_graphs"]
        blend_adapters(state.policy.transformer, source=TRAINED, target=OLD, keep=0.5)
        blend_adapters(state.policy.transformer, source=TRAINED, target=EMA, keep=0.9)
        stages.requantize(state)
        sample_stages(state)
        yield {"eager": eager, "compiled": compiled, "compiled_modules": compiled_modules,
               "eager_update": (eager_loss, eager_gradients), "update": (loss, gradients),
               "graphs_first": graphs_first, "graphs_after_update": graphs_after_update,
               "graphs_second": counters["stats"]["unique_graphs"],
               "graph_breaks": sum(counters["graph_break"].values()), "per_class": graphs_per_block_class(state)}
        uncompile_transformer(state.policy.transformer)


def test_compiled_blocks_sample_full_precision_as_eager_does(runs):
    assert runs["compiled_modules"] == 2 + 4  # the tiny model's dual- and single-stream blocks
    for stage in ("regenerate", "evaluate", "base"):
        difference = (runs["compiled"][stage] - runs["eager"][stage]).abs().max()
        assert difference <= FULL_PRECISION_TOLERANCE, (stage, float(difference))


def test_the_compiled_fp8_explorer_drafts_within_its_own_quantization_error(runs):
    """FP8 rounding is discontinuous: compiled norms and attention differ from eager's in the last
    fp32 bits, which re-rounds codes at a rounding boundary, and one per-tensor scale per chunk
    re-rounds all of them when an amax moves. So each compiled draft differs from the eager one
    by less than the explorer's own error against full precision (measured: 0 to 0.53 of it;
    independent re-rounding would give about 1.4), and is still a quantized draft."""
    eager, compiled = runs["eager"], runs["compiled"]
    quantization_error = rms(eager["explore"] - eager["regenerate"])
    assert (rms(compiled["explore"] - eager["explore"]) < quantization_error).all()
    assert (rms(compiled["explore"] - compiled["regenerate"]) > 0.5 * quantization_error).all()


def test_graphs_stay_bounded_across_explorer_swaps_and_adapter_switches(runs):
    """Each (adapter, explorer) variant compiles once per block class and input layout; after
    that, an update of the adapters, a requantize and a new swap of the explorer's layers compile
    nothing, and no compiled block breaks its graph (the quantizers fuse into it)."""
    assert runs["graph_breaks"] == 0
    assert runs["graphs_second"] == runs["graphs_after_update"] == runs["graphs_first"]
    assert all(0 < count < RECOMPILE_LIMIT for count in runs["per_class"].values()), runs["per_class"]


def test_the_update_trains_eager_with_the_same_loss_and_gradients(runs):
    (eager_loss, eager_gradients), (loss, gradients) = runs["eager_update"], runs["update"]
    assert set(gradients) == set(eager_gradients) and gradients
    assert torch.allclose(loss, eager_loss, rtol=1e-5)
    # The old-policy and reference forwards run compiled, so the loss's inputs carry fp32 roundoff
    # of another summation order (it differs with the thread count): each adapter's gradient is
    # compared as a whole, relative to its own norm, not element by element near zero.
    for name, gradient in gradients.items():
        expected = eager_gradients[name]
        relative = (gradient - expected).norm() / expected.norm().clamp_min(1e-30)
        assert relative <= GRADIENT_TOLERANCE, (name, float(relative))


def test_the_config_key_compiles_the_record_s_blocks_and_nothing_else():
    state = stages.initial_state(resolve_config("shapes-tiny", "sol_rl", overrides=[("model.compile", "blocks")]))
    transformer = state.policy.transformer
    blocks = set(map(id, blocks_of(transformer, TINY_BLOCKS)))
    compiled = {id(module) for module in transformer.modules() if module._compiled_call_impl is not None}
    assert compiled == blocks and len(blocks) == 6
    whole = stages.initial_state(resolve_config("shapes-tiny", "sol_rl", overrides=[("model.compile", "whole")]))
    whole_transformer = whole.policy.transformer
    assert [m for m in whole_transformer.modules() if m._compiled_call_impl is not None] == [whole_transformer]
    default = stages.initial_state(resolve_config("shapes-tiny", "sol_rl"))
    assert default.config.model.compile == "none"
    assert all(m._compiled_call_impl is None for m in default.policy.transformer.modules())


def test_every_real_model_record_names_blocks_its_transformer_has():
    from diffusers import FluxTransformer2DModel, SanaTransformer2DModel, SD3Transformer2DModel

    torch.manual_seed(0)
    transformers = {
        "flux": FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                       attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16,
                                       pooled_projection_dim=16, axes_dims_rope=(2, 2, 4)),
        "sana": SanaTransformer2DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
                                       num_layers=2, num_cross_attention_heads=2, cross_attention_head_dim=8,
                                       cross_attention_dim=16, caption_channels=16, sample_size=8, patch_size=1),
        "sd3": SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
                                     num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16,
                                     pooled_projection_dim=32, out_channels=4, pos_embed_max_size=8),
    }
    for loader, transformer in transformers.items():
        names = MODELS[loader].repeated_blocks
        found = {type(block).__name__ for block in blocks_of(transformer, names)}
        assert found == set(names), loader
        assert set(getattr(transformer, "_repeated_blocks", None) or names) == set(names), loader


def test_without_a_compile_toolchain_the_model_runs_eager_with_one_warning(monkeypatch, capsys):
    monkeypatch.setattr(gpu_path_module.shutil, "which", lambda name: None)
    gpu_path_module.compile_toolchain_problem.cache_clear()
    try:
        transformer = MODELS["shapes-tiny"].load(resolve_config("shapes-tiny", "sol_rl").model, torch.device("cpu"),
                                                 torch.float32).transformer
        for mode in ("blocks", "whole"):
            assert compile_transformer(transformer, mode, TINY_BLOCKS, torch.device("cpu")) == 0
        assert all(m._compiled_call_impl is None for m in transformer.modules())
        warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1 and "no C compiler" in warnings[0] and "model.compile run eager" in warnings[0]
    finally:
        gpu_path_module.compile_toolchain_problem.cache_clear()
