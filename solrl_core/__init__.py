"""Sol-RL as a library: quantized exploration, full-precision regeneration, DiffusionNFT updates."""

import logging

import torch

# Tiny activations underflow to fp32 subnormals in the small transformers of the embedded world;
# x86 CPUs handle subnormals in microcode, which made a training step 25x slower here (measured
# 5.2 s vs 0.22 s). Flushing them to zero is deterministic and changes no value above 1e-38.
torch.set_flush_denormal(True)

# torchao (pulled in by peft) registers enums with torch's pytree, and torch 2.14 logs a
# deprecation warning for each on stderr, in every command: noise before a one-line error.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
# diffusers warns that it cannot import torchao's tensor classes (torchao 0.18 renamed them); they
# only matter for loading torchao-serialized checkpoints, which this project never reads.
logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer").setLevel(logging.ERROR)
