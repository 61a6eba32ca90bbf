"""The searched NVFP4 weight rounding of benchmarks/fidelity_anatomy.py: what its rows rest on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fidelity_anatomy import fake_quantize_searched  # noqa: E402
from solrl_core.quant.nvfp4 import E2M1_MAGNITUDES, fake_quantize_nvfp4, nvfp4_tensor_scale  # noqa: E402


def _weights(rows: int = 24, cols: int = 80) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    # Heavy-tailed rows, as trained weights are: an outlier per block is where amax scaling wastes codes.
    return torch.randn(rows, cols, generator=generator) * torch.rand(rows, 1, generator=generator).exp()


def test_with_only_the_amax_rule_it_is_the_project_s_nvfp4():
    weights = _weights()
    assert torch.equal(fake_quantize_searched(weights, (1.0,)), fake_quantize_nvfp4(weights))


def test_no_block_rounds_worse_than_with_the_amax_rule():
    weights = _weights()
    searched = (fake_quantize_searched(weights) - weights).square().reshape(24, -1, 16).sum(-1)
    amax_rule = (fake_quantize_nvfp4(weights) - weights).square().reshape(24, -1, 16).sum(-1)
    assert bool((searched <= amax_rule).all())
    assert float(searched.sum()) < 0.95 * float(amax_rule.sum())  # the search finds better scales


@pytest.mark.parametrize("cols", [80, 70])
def test_the_result_is_a_valid_nvfp4_tensor(cols):
    """Each 16-value block decodes as E2M1 values x one E4M3 block scale x the tensor scale,
    so a GPU's NVFP4 kernel can run the searched weights unchanged."""
    weights = _weights(cols=cols)
    values = fake_quantize_searched(weights)
    tensor_scale = nvfp4_tensor_scale(weights)
    padded = torch.nn.functional.pad(values, (0, (-cols) % 16)).reshape(24, -1, 16) / tensor_scale
    grid = torch.tensor(E2M1_MAGNITUDES)
    for block in padded.reshape(-1, 16):
        if not bool(block.any()):
            continue
        # The block scale is the one that maps the block's largest value to an E2M1 magnitude.
        candidates = [float(block.abs().max()) / m for m in E2M1_MAGNITUDES[1:]]
        fits = [s for s in candidates
                if float(torch.tensor(s).to(torch.float8_e4m3fn).float()) == pytest.approx(s, rel=1e-6)
                and bool(torch.isclose((block.abs() / s)[:, None], grid[None, :], rtol=1e-5, atol=1e-6)
                         .any(-1).all())]
        assert fits, f"block {block.tolist()} is no E4M3 scale times E2M1 values"
