"""The explorer: the policy with its large Linear layers in a cheap precision (SPEC §2-§3).

The explorer is not a second model. It is a set of quantized weights, cached per requantize,
plus a context manager that swaps the forwards of the selected Linear layers of the policy for
quantized ones. Merging the "old" LoRA adapter into those cached weights is what makes the
explorer sample like the sampling policy; layers left in high precision keep running whatever
adapter the caller has active.

Backends:
- "none": no quantization (the explorer is the policy itself).
- "emulated-nvfp4": W4A4 NVFP4 numerics in plain torch (quantize-dequantize), any device.
- "fp8": FP8 E4M3 per-tensor current scaling; real FP8 GEMMs on sm_89+, emulated elsewhere.
- "te-nvfp4": Transformer Engine's NVFP4BlockScaling on Blackwell (sm_100+).
"""

from __future__ import annotations

import fnmatch
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from solrl_core.quant.fp8 import fp8_linear, quantize_fp8
from solrl_core.quant.nvfp4 import fake_quantize_nvfp4

BACKENDS = ("none", "emulated-nvfp4", "fp8", "te-nvfp4")
TE_MIN_CAPABILITY = (10, 0)


# --- which layers ----------------------------------------------------------------------------


def _is_lora_wrapped_linear(module: nn.Module) -> bool:
    # peft is imported here, not at the top: importing this module just for BACKENDS (config
    # validation) must stay cheap and quiet, and peft pulls in torchao, which logs warnings.
    from peft.tuners.lora import Linear as LoraLinear

    return isinstance(module, LoraLinear) and isinstance(module.base_layer, nn.Linear)


def _linear_layers(model: nn.Module) -> Iterator[tuple[str, nn.Linear]]:
    """(qualified name, underlying nn.Linear) of each Linear, a LoRA wrapper counting as one.

    named_modules() visits a wrapper before its children, so the wrapper's prefix is known by
    the time its base_layer and lora_A / lora_B Linears come up, and they are passed over.
    """
    wrapper_prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix) for prefix in wrapper_prefixes):
            continue
        if _is_lora_wrapped_linear(module):
            wrapper_prefixes.append(name + ".")
            yield name, module.base_layer
        elif isinstance(module, nn.Linear):
            yield name, module


def select_quantized_layers(model: nn.Module, skip: Sequence[str], min_dim: int) -> list[str]:
    """Names of the Linear layers the explorer quantizes.

    A layer is skipped when its qualified name matches any glob in `skip` (fnmatch, whole name,
    case-sensitive) or when max(in_features, out_features) <= min_dim: small layers cost little
    in high precision and are the most sensitive to quantization.
    """
    selected = []
    for name, linear in _linear_layers(model):
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in skip):
            continue
        if max(linear.in_features, linear.out_features) > min_dim:
            selected.append(name)
    return selected


# --- effective (merged) weights --------------------------------------------------------------


def _check_plain_lora(module: nn.Module, adapter: str) -> None:
    if module.merged_adapters:
        raise ValueError(
            f"adapters {module.merged_adapters} are merged into the base weights of this layer; "
            "unmerge them before requantizing, or they would be counted twice"
        )
    if adapter in getattr(module, "lora_variant", {}):
        raise NotImplementedError(
            f"adapter {adapter!r} is a LoRA variant (e.g. DoRA); only plain LoRA can be merged"
        )


def effective_linear_weights(
    module: nn.Module, adapter: str | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 (weight [out, in], bias) of a Linear with `adapter`'s LoRA merged in, if it has one.

    Always new tensors (out-of-place adds on fp32 copies): the model is never written.
    """
    wrapped = _is_lora_wrapped_linear(module)
    base = module.base_layer if wrapped else module
    weight = base.weight.detach().float()
    bias = None if base.bias is None else base.bias.detach().float()
    if wrapped and adapter is not None and adapter in module.lora_A:
        _check_plain_lora(module, adapter)
        scaling = module.scaling[adapter]
        lora_a, lora_b = module.lora_A[adapter], module.lora_B[adapter]
        delta = lora_b.weight.detach().float() @ lora_a.weight.detach().float()
        weight = weight + scaling * delta
        if lora_b.bias is not None:
            bias = bias + scaling * lora_b.bias.detach().float()
    return weight.clone(), None if bias is None else bias.clone()


# --- backends --------------------------------------------------------------------------------
# Each backend turns (weight, bias) into a cached state once per requantize, and runs a forward
# from that state and the input.


class _EmulatedNVFP4:
    """W4A4 NVFP4 by quantize-dequantize, matmul in fp32.

    The cache holds the dequantized weight in fp32 (4 bytes per weight): simple and exact. A real
    model would rather keep NVFP4Packed (0.5 bytes) and decode per forward; the decode is cheap
    next to the matmul, so switch if memory gets tight.
    """

    def quantize(self, weight: torch.Tensor, bias: torch.Tensor | None):
        return fake_quantize_nvfp4(weight), bias

    def forward(self, cached, x: torch.Tensor) -> torch.Tensor:
        weight, bias = cached
        # The activation is fake-quantized in fp32, so a bf16 input is not rounded a second time.
        activation = fake_quantize_nvfp4(x.float())
        return F.linear(activation, weight, bias).to(x.dtype)


class _FP8:
    """FP8 E4M3 with per-tensor current scaling: weights per requantize, activations per call."""

    def quantize(self, weight: torch.Tensor, bias: torch.Tensor | None):
        weight_fp8, weight_scale = quantize_fp8(weight)
        return weight_fp8.contiguous(), weight_scale, bias

    def forward(self, cached, x: torch.Tensor) -> torch.Tensor:
        weight_fp8, weight_scale, bias = cached
        return fp8_linear(x, weight_fp8, weight_scale, bias, out_dtype=x.dtype)


class _TransformerEngineNVFP4:
    """NVFP4 GEMMs through Transformer Engine. Untestable on the CPU machines this project is
    developed on (needs TE and an sm_100+ GPU); kept deliberately thin so there is little to get
    wrong. TE quantizes the bf16 weight to NVFP4 inside its forward under the NVFP4 recipe."""

    def __init__(self):
        import transformer_engine.pytorch as te
        from transformer_engine.common.recipe import NVFP4BlockScaling

        self.te = te
        self.recipe = NVFP4BlockScaling()

    def quantize(self, weight: torch.Tensor, bias: torch.Tensor | None):
        out_features, in_features = weight.shape
        layer = self.te.Linear(
            in_features, out_features, bias=bias is not None,
            params_dtype=torch.bfloat16, device=weight.device,
        )
        with torch.no_grad():
            layer.weight.copy_(weight)
            if bias is not None:
                layer.bias.copy_(bias)
        return layer.requires_grad_(False)

    def _autocast(self):
        # Newer TE renamed fp8_autocast(fp8_recipe=) to autocast(recipe=); accept either.
        if hasattr(self.te, "autocast"):
            return self.te.autocast(enabled=True, recipe=self.recipe)
        return self.te.fp8_autocast(enabled=True, fp8_recipe=self.recipe)

    def forward(self, layer, x: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            return layer(x.to(torch.bfloat16)).to(x.dtype)


def _missing_for_transformer_engine() -> list[str]:
    missing = []
    try:
        import transformer_engine.pytorch  # noqa: F401
    except ImportError:
        missing.append("the transformer_engine package")
    if not torch.cuda.is_available():
        missing.append("a CUDA GPU")
    elif torch.cuda.get_device_capability() < TE_MIN_CAPABILITY:
        major, minor = torch.cuda.get_device_capability()
        missing.append(f"a Blackwell GPU (found {torch.cuda.get_device_name()}, sm_{major}{minor})")
    return missing


def _require_transformer_engine() -> None:
    missing = _missing_for_transformer_engine()
    if missing:
        raise RuntimeError(
            "te-nvfp4 needs Transformer Engine and a Blackwell GPU (sm_100+); missing: "
            + ", ".join(missing)
            + ". Install the gpu extra (pip install -e '.[gpu]') on a Blackwell machine, "
            "or use backend emulated-nvfp4 / fp8."
        )


def _make_backend(backend: str):
    if backend == "emulated-nvfp4":
        return _EmulatedNVFP4()
    if backend == "fp8":
        return _FP8()
    if backend == "te-nvfp4":
        _require_transformer_engine()
        return _TransformerEngineNVFP4()
    return None  # "none"


def _check_backend_name(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown explorer backend {backend!r}; allowed: {', '.join(BACKENDS)}")


# --- the explorer ----------------------------------------------------------------------------


@contextmanager
def _forward_replaced(module: nn.Module, forward: Callable) -> Iterator[None]:
    """Shadow the class's forward with an instance attribute; put back whatever was there."""
    had_own_forward = "forward" in module.__dict__
    previous = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if had_own_forward:
            module.forward = previous
        else:
            del module.forward


class Explorer:
    """Quantized forwards for `layer_names`, with weights cached by requantize()."""

    def __init__(self, backend: str, layer_names: Sequence[str]):
        _check_backend_name(backend)
        self.backend = backend
        self.layer_names = list(layer_names)
        self._backend_impl = _make_backend(backend)
        self._cached_weights: dict[str, object] = {}

    def requantize(self, model: nn.Module, adapter: str | None = "old") -> None:
        """Quantize each selected layer's weight (base + `adapter`'s LoRA delta) once, and cache it.

        adapter=None quantizes the base weights alone. Layers without that adapter use their base
        weights too. The model is only read.
        """
        if self._backend_impl is None:
            return
        with torch.no_grad():
            self._cached_weights = {
                name: self._backend_impl.quantize(
                    *effective_linear_weights(model.get_submodule(name), adapter)
                )
                for name in self.layer_names
            }

    def _quantized_forward(self, name: str) -> Callable:
        return partial(self._backend_impl.forward, self._cached_weights[name])

    @contextmanager
    def active(self, model: nn.Module) -> Iterator[None]:
        """Inside, the selected layers of `model` run quantized; their LoRA is bypassed because
        it is merged into the cached weights. Forwards are restored on exit, also on exceptions."""
        if self._backend_impl is None:
            yield
            return
        missing = [name for name in self.layer_names if name not in self._cached_weights]
        if missing:
            raise RuntimeError(
                f"requantize() the explorer before use; no quantized weights for {missing[:3]}"
            )
        forwards = {name: self._quantized_forward(name) for name in self.layer_names}
        with _all_forwards_replaced(model, forwards):
            yield


@contextmanager
def _all_forwards_replaced(model: nn.Module, forwards: dict[str, Callable]) -> Iterator[None]:
    # An ExitStack unwinds the layers already patched if patching a later one fails.
    with ExitStack() as stack:
        for name, forward in forwards.items():
            stack.enter_context(_forward_replaced(model.get_submodule(name), forward))
        yield


def build_explorer(model: nn.Module, backend: str, skip: Sequence[str], min_dim: int) -> Explorer:
    """Select the layers and check the backend can run here. Call requantize() before active().

    Backend "none" selects no layers: nothing runs quantized.
    """
    _check_backend_name(backend)
    layer_names = [] if backend == "none" else select_quantized_layers(model, skip, min_dim)
    return Explorer(backend, layer_names)
