"""fp32 LoRA over a bf16 base (issue 12): weights, gradients and AdamW state of the adapters are
fp32, the base stays bf16 and the layer still returns bf16."""

import warnings

import torch
from diffusers import FluxTransformer2DModel

from solrl_core.models.adapters import ADAPTERS, TRAINED, adapter_parameters, attach_adapters, blend_adapters


def tiny_bf16_flux():
    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16,
                                   pooled_projection_dim=16, axes_dims_rope=(4, 6, 6)).to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attach_adapters(model, rank=4, alpha=8, targets=["to_q", "to_k", "to_v", "to_out.0"], seed=0)
    return model


def inputs(batch=2, tokens=16, text=4):
    generator = torch.Generator().manual_seed(1)
    return dict(hidden_states=torch.randn(batch, tokens, 16, generator=generator).bfloat16(),
                encoder_hidden_states=torch.randn(batch, text, 16, generator=generator).bfloat16(),
                pooled_projections=torch.randn(batch, 16, generator=generator).bfloat16(),
                timestep=torch.full((batch,), 0.5, dtype=torch.bfloat16),
                img_ids=torch.zeros(tokens, 3), txt_ids=torch.zeros(text, 3), return_dict=False)


def test_adapters_weights_grads_and_adamw_state_are_fp32_over_a_bf16_base():
    model = tiny_bf16_flux()
    for adapter in ADAPTERS:
        assert {p.dtype for p in adapter_parameters(model, adapter).values()} == {torch.float32}, adapter
    base = [p for name, p in model.named_parameters() if ".lora_" not in name]
    assert {p.dtype for p in base} == {torch.bfloat16}

    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and {p.dtype for p in trainable} == {torch.float32}
    optimizer = torch.optim.AdamW(trainable, lr=3e-4, weight_decay=1e-4)
    out = model(**inputs())[0]
    assert out.dtype == torch.bfloat16
    out.float().square().mean().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in trainable)
    assert any(p.grad.abs().sum() > 0 for p in trainable)
    optimizer.step()
    states = [optimizer.state[p] for p in trainable]
    assert {s["exp_avg"].dtype for s in states} == {torch.float32}
    assert {s["exp_avg_sq"].dtype for s in states} == {torch.float32}


def test_a_small_update_survives_in_fp32_where_bf16_would_round_it_away():
    model = tiny_bf16_flux()
    parameter = next(iter(adapter_parameters(model, TRAINED).values()))
    with torch.no_grad():
        parameter.fill_(0.03)
        parameter.sub_(3e-5)  # lr x a unit-size Adam step, a tenth of the paper's lr
    assert torch.all(parameter == torch.tensor(0.03) - torch.tensor(3e-5))
    assert torch.tensor(0.03, dtype=torch.bfloat16) - 3e-5 == torch.tensor(0.03, dtype=torch.bfloat16)
    blend_adapters(model, source=TRAINED, target="old", keep=0.5)  # soft updates stay fp32 too
    assert {p.dtype for p in adapter_parameters(model, "old").values()} == {torch.float32}
