"""A draft is a function of its own seed, prompt and weights: the explorer's activation scales are
taken per sample (solrl_core/quant/activation_scale.py), so the samples that share a batch (an
explore chunk, a rank's share of the pool) never change a sample's quantized numbers.

* a sample's quantized activation is bit for bit the same alone and among very different samples
  (a thousand times larger, smaller, all zero), for emulated NVFP4 and FP8, on the CPU path and
  on the GPU path run on the CPU;
* so is a sample's explorer output through a FLUX block, in any batch composition (batches of 4
  rows and more: with 1 to 3 rows this CPU's float32 GEMMs sum in another order, also at full
  precision, so "alone" is compared at the quantizer, not through the model);
* a tiny run gives the same ledger and adapter, bit for bit, with ``explore.chunk`` 8 (one prompt
  group per chunk) and 96 (both groups in one chunk).
"""

from __future__ import annotations

from contextlib import nullcontext

import polars as pl
import pytest
import torch
from _gpu_path import gpu_path
from safetensors.torch import load_file
from test_explorer_backends import tiny_flux

from solrl_core.quant.activation_scale import _per_tensor_scales
from solrl_core.quant.backends import spec
from solrl_core.quant.explorer import build_explorer
from solrl_core.quant.fp8 import FP8Tensor, row_scales
from tests._run_process import run_process

TOKENS, FEATURES = 16, 64
# Per-sample magnitudes far apart: one scale over all four would flush the small ones to zero.
SAMPLE_SCALES = (1.0, 1000.0, 1e-3, 0.0)
PATHS = {"cpu-path": nullcontext, "gpu-path-on-cpu": gpu_path}


def very_different_samples() -> torch.Tensor:
    x = torch.randn(len(SAMPLE_SCALES), TOKENS, FEATURES, generator=torch.Generator().manual_seed(0))
    return (x * torch.tensor(SAMPLE_SCALES).view(-1, 1, 1)).to(torch.bfloat16)


def sample_parts(activation, sample: int) -> list[torch.Tensor]:
    """The tensors of one sample's quantized activation, whatever form the backend's path gives:
    FP8 codes and per-row scales; NVFP4 code x block scale and per-row tensor scale (GPU path), or
    the fake-quantized activation itself (CPU path)."""
    rows = slice(sample * TOKENS, (sample + 1) * TOKENS)
    if isinstance(activation, FP8Tensor):
        return [activation.data[rows], row_scales(activation)[rows]]
    if isinstance(activation, tuple):
        values, tensor_scale = activation
        return [values[rows], tensor_scale[rows]]
    return [activation[sample]]


def same_bits(left: list[torch.Tensor], right: list[torch.Tensor]) -> bool:
    return all(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
               for a, b in zip(left, right, strict=True))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("backend", ["emulated-nvfp4", "fp8"])
def test_a_samples_quantized_activation_is_the_same_alone_and_among_very_different_samples(backend, path):
    quantize = spec(backend).implementation(None).quantize_activation
    x = very_different_samples()
    with PATHS[path]():
        together = quantize(x)
        for sample in range(len(SAMPLE_SCALES)):
            alone = quantize(x[sample:sample + 1])
            assert same_bits(sample_parts(together, sample), sample_parts(alone, 0)), sample


def flux_inputs(magnitudes: list[float]) -> dict:
    """FLUX block inputs, one sample per magnitude (image and text tokens scaled by it)."""
    generator, batch = torch.Generator().manual_seed(1), len(magnitudes)
    scale = torch.tensor(magnitudes).view(-1, 1, 1)
    return {"hidden_states": torch.randn(batch, 16, 48, generator=generator) * scale,
            "encoder_hidden_states": torch.randn(batch, 8, 32, generator=generator) * scale,
            "pooled_projections": torch.randn(batch, 32, generator=generator),
            "timestep": torch.rand(batch, generator=generator)}


def explorer_output(model, inputs: dict, samples: list[int]) -> torch.Tensor:
    """The explorer's output for a batch of these samples of ``inputs``."""
    with torch.no_grad():
        return model(**{key: value[samples] for key, value in inputs.items()}, img_ids=torch.zeros(16, 3),
                     txt_ids=torch.zeros(8, 3), return_dict=False)[0]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("backend", ["emulated-nvfp4", "fp8", "fp8-rowwise"])
def test_a_samples_explorer_output_does_not_depend_on_its_batch_mates(backend, path):
    model = tiny_flux()
    explorer = build_explorer(model, backend, ["x_embedder", "context_embedder", "proj_out"], 63)
    explorer.requantize(model, "old")
    inputs = flux_inputs([1.0, 300.0, 0.01, 5.0, 1e-4, 40.0, 1.0, 2.0])
    compositions = [[0, 1, 2, 3], [4, 5, 6, 7], [5, 2, 7, 0]]
    with PATHS[path](), explorer.active(model):
        whole = explorer_output(model, inputs, list(range(8)))
        for samples in compositions:
            assert torch.equal(explorer_output(model, inputs, samples), whole[samples]), samples
        if backend != "fp8-rowwise":  # its scales are per token: no batch-wide scale to compare with
            with _per_tensor_scales():  # what the spec rules out: one scale over the whole batch
                whole = explorer_output(model, inputs, list(range(8)))
                assert not torch.equal(explorer_output(model, inputs, compositions[0]), whole[compositions[0]])


def ledger_and_adapter(out) -> tuple[pl.DataFrame, dict[str, torch.Tensor]]:
    return pl.read_parquet(out / "ledger.parquet"), load_file(str(out / "lora.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["emulated-nvfp4", "fp8"])
def test_the_explore_chunk_changes_no_ledger_even_when_a_chunk_mixes_prompt_groups(tmp_path, backend):
    """2 prompt groups of 8 seeds, 2 iterations: chunks of 8 hold one group each, a chunk of 96
    holds both. The same seeds, drafts, selections, rewards and adapter, bit for bit."""
    runs = {}
    for chunk in (8, 96):
        out = tmp_path / f"chunk{chunk}"
        assert run_process(out, "iterations=2", f"explore.chunk={chunk}", f"explore.backend={backend}") == 0
        runs[chunk] = ledger_and_adapter(out)
    (ledger, adapter), (ledger_96, adapter_96) = runs[8], runs[96]
    assert ledger.height == 2 * 2 * 8
    assert ledger.equals(ledger_96, null_equal=True)
    assert adapter.keys() == adapter_96.keys() and all(torch.equal(adapter[k], adapter_96[k]) for k in adapter)
