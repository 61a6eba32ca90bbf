"""Sol-RL as a library: quantized exploration, full-precision regeneration, DiffusionNFT updates."""

import logging

# Flush-to-zero, which the project's own processes want, is not set here but where they start
# (solrl_core.numerics.flush_denormals): importing the library leaves torch's numerics as they were.

# torchao (pulled in by peft) registers enums with torch's pytree, and torch 2.14 logs a
# deprecation warning for each on stderr, in every command: noise before a one-line error.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
# diffusers warns that it cannot import torchao's tensor classes (torchao 0.18 renamed them); they
# only matter for loading torchao-serialized checkpoints, which this project never reads.
logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer").setLevel(logging.ERROR)
