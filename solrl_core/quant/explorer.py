"""The explorer: the policy with its large Linear layers in a cheap precision (SPEC §2-§3).

The explorer is not a second model. It is a set of quantized weights, cached per requantize,
plus a context manager that swaps the forwards of the selected layers of the policy for
quantized ones. Merging the "old" LoRA adapter into those cached weights is what makes the
explorer sample like the sampling policy; layers left in high precision keep running whatever
adapter the caller has active.

A quantizable layer is an nn.Linear or a 1x1 nn.Conv2d (stride 1, no padding, one group): over a
[B, C, H, W] tensor such a convolution is a Linear over its C channels at every pixel, and a
channels-last token tensor (SANA's feed-forward) is exactly that Linear's row-major input.

Backends (solrl_core.quant.backends holds their records, and what ``auto`` picks):
- "none": no quantization (the explorer is the policy itself).
- "emulated-nvfp4": exact W4A4 NVFP4 numerics; bf16 tensor-core GEMMs on a GPU.
- "fp8" / "fp8-rowwise": FP8 E4M3 current scaling; real FP8 GEMMs on sm_89+ / sm_90+.
- "te-nvfp4": Transformer Engine's NVFP4BlockScaling (1x16 blocks) on Blackwell (sm_100+).
"""

from __future__ import annotations

import fnmatch
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from solrl_core.quant.backends import BACKENDS, BackendUnavailable, resolve_backend, spec

__all__ = ["BACKENDS", "BackendUnavailable", "Explorer", "build_explorer", "effective_linear_weights",
           "quantizable_layers", "select_quantized_layers"]


# --- which layers ----------------------------------------------------------------------------


def _is_pointwise_conv(module: nn.Module) -> bool:
    return (isinstance(module, nn.Conv2d) and module.kernel_size == (1, 1) and module.stride == (1, 1)
            and module.padding == (0, 0) and module.dilation == (1, 1) and module.groups == 1)


def _is_quantizable_base(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or _is_pointwise_conv(module)


def _is_lora_wrapped(module: nn.Module, base_test: Callable[[nn.Module], bool]) -> bool:
    # Importing this module just for BACKENDS (config validation) must stay cheap and quiet, and
    # peft pulls in torchao, which logs warnings.
    # deferred: peft at import time (start-up of every solrl command: validation reads BACKENDS)
    from peft.tuners.lora import LoraLayer

    return isinstance(module, LoraLayer) and base_test(getattr(module, "base_layer", None))


def _is_lora_wrapped_linear(module: nn.Module) -> bool:
    return _is_lora_wrapped(module, lambda base: isinstance(base, nn.Linear))


def _walk(model: nn.Module, base_test: Callable[[nn.Module], bool]) -> Iterator[tuple[str, nn.Module]]:
    """(qualified name, underlying layer) of each layer passing ``base_test``, a LoRA wrapper
    counting as one. named_modules() visits a wrapper before its children, so the wrapper's
    prefix is known by the time its base_layer and lora_A / lora_B come up, and they are passed over."""
    wrapper_prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix) for prefix in wrapper_prefixes):
            continue
        if _is_lora_wrapped(module, base_test):
            wrapper_prefixes.append(name + ".")
            yield name, module.base_layer
        elif base_test(module):
            yield name, module


def _linear_layers(model: nn.Module) -> Iterator[tuple[str, nn.Linear]]:
    """(qualified name, underlying nn.Linear) of each Linear, a LoRA wrapper counting as one."""
    yield from _walk(model, lambda module: isinstance(module, nn.Linear))


def layer_features(layer: nn.Module) -> tuple[int, int]:
    """(in, out) features of a Linear or of a 1x1 convolution (its channels)."""
    if isinstance(layer, nn.Linear):
        return layer.in_features, layer.out_features
    return layer.in_channels, layer.out_channels


def quantizable_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(qualified name, underlying layer) of every Linear and 1x1 convolution."""
    yield from _walk(model, _is_quantizable_base)


def _fused_widths(layers: dict[str, nn.Module], fused: Sequence[str]) -> dict[str, int]:
    """Output width of the layer a reference model holds fused, for each member name.

    An entry "attn2.to_k+attn2.to_v" says: under one parent, these sibling layers read the same
    input and are one Linear in the reference model (SANA's kv_linear), so the size rule sees
    their summed output width."""
    widths: dict[str, int] = {}
    for entry in fused:
        parts = [part for part in entry.split("+") if part]
        for name in layers:
            if not name.endswith(parts[0]) or not (name == parts[0] or name.endswith("." + parts[0])):
                continue
            prefix = name[: len(name) - len(parts[0])]
            members = [prefix + part for part in parts]
            if all(member in layers for member in members):
                total = sum(layer_features(layers[member])[1] for member in members)
                widths.update({member: total for member in members})
    return widths


def select_quantized_layers(model: nn.Module, skip: Sequence[str], min_dim: int,
                            fused: Sequence[str] = ()) -> list[str]:
    """Names of the layers the explorer quantizes.

    A layer is skipped when its qualified name matches any glob in `skip` (fnmatch, whole name,
    case-sensitive) or when max(in, out) <= min_dim: small layers cost little in high precision
    and are the most sensitive to quantization. `out` is the fused width for members of a
    `fused` group (see _fused_widths), as the reference applies the rule to its fused layers.
    """
    layers = dict(quantizable_layers(model))
    widths = _fused_widths(layers, fused)
    selected = []
    for name, layer in layers.items():
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in skip):
            continue
        in_features, out_features = layer_features(layer)
        if max(in_features, widths.get(name, out_features)) > min_dim:
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


def _matrix(weight: torch.Tensor) -> torch.Tensor:
    """A Linear's [out, in] weight, or a 1x1 convolution's [out, in, 1, 1] one as [out, in]."""
    return weight.detach().float().reshape(weight.shape[0], -1)


def effective_linear_weights(
    module: nn.Module, adapter: str | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 (weight [out, in], bias) of a layer with `adapter`'s LoRA merged in, if it has one.

    Always new tensors (out-of-place adds on fp32 copies): the model is never written.
    """
    wrapped = _is_lora_wrapped(module, _is_quantizable_base)
    base = module.base_layer if wrapped else module
    weight = _matrix(base.weight)
    bias = None if base.bias is None else base.bias.detach().float()
    if wrapped and adapter is not None and adapter in module.lora_A:
        _check_plain_lora(module, adapter)
        scaling = module.scaling[adapter]
        lora_a, lora_b = module.lora_A[adapter], module.lora_B[adapter]
        weight = weight + scaling * (_matrix(lora_b.weight) @ _matrix(lora_a.weight))
        if lora_b.bias is not None:
            bias = bias + scaling * lora_b.bias.detach().float()
    return weight.clone(), None if bias is None else bias.clone()


def _base_layer(module: nn.Module) -> nn.Module:
    return module.base_layer if _is_lora_wrapped(module, _is_quantizable_base) else module


# --- backends --------------------------------------------------------------------------------
# Each backend's record (quant/backends.py) names its implementation (quant/implementations.py):
# it turns (weight, bias) into a cached entry once per requantize, quantizes an activation, and
# multiplies the two.


def _implementation(backend: str, device: torch.device | None, packages=None):
    """The implementation of a resolved backend name (None for one that quantizes nothing),
    checked to run on ``device`` first unless the caller passes stand-ins for its packages."""
    record = spec(backend)
    if record.implementation is None:
        return None
    if packages is None:
        resolve_backend(backend, device if device is not None else _default_cuda())
    return record.implementation(packages)


def _default_cuda() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


# --- one quantized activation for the layers that read the same input ------------------------


def _version_of(x: torch.Tensor) -> int | None:
    try:
        return x._version
    except RuntimeError:  # inference-mode tensors track no version: never reused
        return None


class _SharedActivation:
    """The last quantized activation, reused while the very same input tensor comes back
    unchanged: q, k and v (and FLUX's proj_mlp) read one tensor, quantized once. The source is
    held, so its identity cannot be taken by a new tensor while it is cached."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.source, self.version, self.value = None, None, None

    def get(self, x: torch.Tensor, quantize: Callable[[torch.Tensor], object]):
        if torch.compiler.is_compiling():
            # In a compiled block (model.compile) the compiler sees the layers' common input
            # itself; a tensor held here across calls would be guarded on, and its shape changing
            # from block to block would recompile the block.
            return quantize(x)
        version = _version_of(x)
        if version is not None and self.source is x and self.version == version:
            return self.value
        self.source, self.version, self.value = x, version, quantize(x)
        return self.value


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

    def __init__(self, backend: str, layer_names: Sequence[str], device: torch.device | None = None,
                 te_modules=None):
        # te_modules: stand-ins for the packages the backend requires (Transformer Engine's, in tests).
        self.backend = backend
        self.layer_names = list(layer_names)
        self._backend_impl = _implementation(backend, device, te_modules)
        self._cached_weights: dict[str, object] = {}
        self._shared = _SharedActivation()

    def requantize(self, model: nn.Module, adapter: str | None = "old") -> None:
        """Quantize each selected layer's weight (base + `adapter`'s LoRA delta) once, and cache it.

        adapter=None quantizes the base weights alone. Layers without that adapter use their base
        weights too. The model is only read. Each layer's old entry is dropped before its new one
        is built, so the cache never exists twice; a failure leaves an empty cache, not a mix.
        """
        if self._backend_impl is None:
            return
        try:
            with torch.no_grad():
                for name in self.layer_names:
                    module = model.get_submodule(name)
                    previous = self._cached_weights.pop(name, None)
                    weight, bias = effective_linear_weights(module, adapter)
                    dtype = _base_layer(module).weight.dtype
                    self._cached_weights[name] = self._backend_impl.quantize_weight(weight, bias, dtype, previous)
                    del previous, weight, bias
        except BaseException:
            self._cached_weights = {}
            raise

    def _linear_forward(self, name: str) -> Callable:
        impl, cached, shared = self._backend_impl, self._cached_weights[name], self._shared

        def forward(x: torch.Tensor) -> torch.Tensor:
            return impl.matmul(shared.get(x, impl.quantize_activation), cached, x)

        return forward

    def _quantized_forward(self, model: nn.Module, name: str) -> Callable:
        linear = self._linear_forward(name)
        if isinstance(_base_layer(model.get_submodule(name)), nn.Conv2d):
            # [B, C, H, W] -> [B, H, W, C] tokens -> Linear -> back; no copy for channels-last input.
            return lambda x: linear(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return linear

    @contextmanager
    def active(self, model: nn.Module) -> Iterator[None]:
        """Inside, the selected layers of `model` run quantized; their LoRA is bypassed because
        it is merged into the cached weights. Forwards are restored on exit, also on exceptions.
        A backend with a session (Transformer Engine's autocast) enters it once, here."""
        if self._backend_impl is None:
            yield
            return
        missing = [name for name in self.layer_names if name not in self._cached_weights]
        if missing:
            raise RuntimeError(
                f"requantize() the explorer before use; no quantized weights for {missing[:3]}"
            )
        forwards = {name: self._quantized_forward(model, name) for name in self.layer_names}
        session = getattr(self._backend_impl, "session", nullcontext)
        try:
            with session(), _all_forwards_replaced(model, forwards):
                yield
        finally:
            self._shared.clear()

    def describe(self, model: nn.Module) -> dict:
        """What is quantized: layer count and the share of the model's weights they hold."""
        quantized = sum(_base_layer(model.get_submodule(name)).weight.numel() for name in self.layer_names)
        total = sum(p.numel() for name, p in model.named_parameters() if ".lora_" not in name)
        return {"backend": self.backend, "quantized_layers": len(self.layer_names),
                "quantized_parameters": quantized, "quantized_share": round(quantized / max(total, 1), 4)}


@contextmanager
def _all_forwards_replaced(model: nn.Module, forwards: dict[str, Callable]) -> Iterator[None]:
    # An ExitStack unwinds the layers already patched if patching a later one fails.
    with ExitStack() as stack:
        for name, forward in forwards.items():
            stack.enter_context(_forward_replaced(model.get_submodule(name), forward))
        yield


def _model_device(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def build_explorer(model: nn.Module, backend: str, skip: Sequence[str], min_dim: int,
                   fused: Sequence[str] = ()) -> Explorer:
    """Select the layers and check the backend can run here (``auto``: pick the one for the
    model's device). Call requantize() before active(). Backend "none" selects no layers."""
    device = _model_device(model)
    backend = resolve_backend(backend, device)  # an unknown name raises, naming the allowed ones
    layer_names = [] if backend == "none" else select_quantized_layers(model, skip, min_dim, fused)
    return Explorer(backend, layer_names, device)
