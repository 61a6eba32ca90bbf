"""Where a reward model waits between uses: on the device it scores on, or on the CPU.

The real reward models run in FP32 (SPEC section 7) and together weigh 10.6 GiB (ImageReward
1.66, CLIPScore's ViT-L/14 1.59, PickScore's and HPS v2.1's ViT-H/14 3.67 each; their records in
``rewards/registry.py`` count them, ``models/memory.py`` adds them up).
Resident from the start they would hold that memory through every stage. Offloaded
(``model.offload_rewards``, on in the real presets) a model visits the device only while it
scores: the explore stage's sampling, the regeneration and the update have the memory for the
transformer and its activations. Scores do not change: the same FP32 weights run on the same
device either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


class Residency:
    """One reward model's placement. ``on_device()`` brings it to ``device`` for a block and, when
    offloaded, sends it back to the CPU after, however the block ends. Blocks nest: an outer block
    (a stage scoring chunk after chunk) keeps the model on the device through the inner ones (each
    chunk's scoring call), so it crosses the bus once per stage, not once per chunk."""

    def __init__(self, module: torch.nn.Module, device: torch.device, offload: bool):
        self.module, self.device, self.offload = module, torch.device(device), offload
        self._depth = 0  # open on_device() blocks
        module.to(self.home())

    def home(self) -> torch.device:
        """Where the model is between uses."""
        return torch.device("cpu") if self.offload else self.device

    @contextmanager
    def on_device(self) -> Iterator[torch.nn.Module]:
        moves = self.offload and self._depth == 0
        if moves:
            self.module.to(self.device)
        self._depth += 1
        try:
            yield self.module
        finally:
            self._depth -= 1
            if moves:
                self.module.to("cpu")

    def score_in_batches(self, score: Callable[[torch.Tensor, list[str]], torch.Tensor], images: torch.Tensor,
                         prompts: list[str], batch: int) -> torch.Tensor:
        """``score`` on ``batch`` images at a time, concatenated; the model stays on the device
        for all of them (it crosses the bus once per call, not once per batch)."""
        with self.on_device():
            return torch.cat([score(images[i:i + batch], prompts[i:i + batch]) for i in range(0, len(prompts), batch)])
