"""``model.compile``: the policy transformer's sampling forwards compiled, by repeated block or whole.

``blocks`` is regional compilation (diffusers' ``compile_repeated_blocks``): every module of the
model record's repeated block classes (``ModelSpec.repeated_blocks``) is compiled in place, and
one graph per block class serves all of its instances. ``whole`` compiles the transformer in
place. Either way, module names, parameters and the explorer's layers stay as they are, so the
adapters, the checkpoints and the explorer's layer swap (``Explorer.active``) work as in eager:
attention, norms, activations and the explorer's activation quantizers fuse around the GEMMs,
and the full-precision policy and the explorer run the same compiled blocks, so their speeds
compare fairly.

Only forwards without gradients run compiled: exploration, regeneration, evaluation and the
update's old-policy and reference forwards. The trained forward and its backward run eager:
through compiled blocks they give the same loss and LoRA gradients (measured on the embedded
world: equal loss, gradients within 1.3e-6 relative), but compiling the backward doubles the
first iteration's compilation, and its memory on a 12B model has not been measured on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from solrl_core.quant.gpu_path import QUANTIZER_COMPILE_OPTIONS, compile_toolchain_problem

# Graphs one compiled block class meets in a run, each compiled once: the active adapter
# (trained, old, EMA, none) x the explorer swapped in or not x two input layouts (FLUX's first
# single block reads a contiguous tensor, the others views of one) x the first batch size, which
# is compiled static until a second size makes dynamo compile the batch dimension dynamic.
# Dynamo's default of 8 per function is reached by the embedded world's run itself, after which
# the other variants would run eager, so the compiled blocks allow this many.
RECOMPILE_LIMIT = 4 * 2 * 2 * 2


def compile_transformer(transformer: torch.nn.Module, mode: str, repeated_blocks: Sequence[str],
                        device: torch.device) -> int:
    """Compile ``transformer``'s forwards without gradients in place: ``blocks`` (each module whose
    class is named in ``repeated_blocks``), ``whole``, or ``none``. Returns how many modules were
    compiled; 0 where torch.compile cannot build kernels for ``device`` (then everything runs
    eager, with the one warning of compile_toolchain_problem)."""
    if mode == "none" or compile_toolchain_problem(device.type) is not None:
        return 0
    modules = [transformer] if mode == "whole" else blocks_of(transformer, repeated_blocks)
    if not modules:
        raise ValueError(f"model.compile=blocks: {type(transformer).__name__} has no module of the classes "
                         f"{list(repeated_blocks)} its model record names")
    for module in modules:
        module._compiled_call_impl = _compiled_without_grad(module)
    return len(modules)


def blocks_of(transformer: torch.nn.Module, class_names: Sequence[str]) -> list[torch.nn.Module]:
    """The modules of ``transformer`` whose class is named in ``class_names``, in model order."""
    return [module for module in transformer.modules() if type(module).__name__ in class_names]


def uncompile_transformer(transformer: torch.nn.Module) -> None:
    """Every module of ``transformer`` eager again; its compiled graphs stay in dynamo's cache."""
    for module in transformer.modules():
        # nn.Module keeps its compiled call in _compiled_call_impl (nn.Module.compile); None is eager.
        module._compiled_call_impl = None


def _compiled_without_grad(module: torch.nn.Module) -> Callable:
    """The module's call: compiled while gradients are off, eager while they are on.

    Dynamic shapes are left to dynamo (a batch size first compiles static; a second one makes the
    batch dimension dynamic), since chunks, their remainders and micro-batches differ in size. The
    division options are the explorer quantizers' own (quant/gpu_path.py): traced into a block,
    the quantizers divide as eager does (an approximate division would move codes on rounding
    ties)."""
    eager = module._call_impl
    compiled = torch.compile(eager, options=dict(QUANTIZER_COMPILE_OPTIONS), recompile_limit=RECOMPILE_LIMIT)

    def call(*args, **kwargs):
        return eager(*args, **kwargs) if torch.is_grad_enabled() else compiled(*args, **kwargs)

    return call
