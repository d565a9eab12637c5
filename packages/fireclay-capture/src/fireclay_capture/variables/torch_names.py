"""Public names of torch callables, for op names (``torch::torch.nn.functional.gelu``), and the
torch functions the capture answers at trace time instead of recording."""

from __future__ import annotations

import re
from typing import Any

import torch

from fireclay_ir.dialects.torch import DENIED, register_callable

# The torch dialect's roots, in its order of preference (torch.relu before Tensor.relu).
_ROOTS = ("torch", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special")
_NAMES: dict[int, tuple[Any, str | None]] = {}


def public_torch_name(fn: Any) -> str | None:
    """The torch-dialect name of a torch callable (``torch.nn.functional.gelu`` for F.gelu);
    None when it is not an op there.

    Looked up by the callable's own ``__name__`` under each root rather than by scanning the
    namespaces, which would import every lazily loaded torch submodule.
    """
    cached = _NAMES.get(id(fn))
    if cached is not None and cached[0] is fn:
        return cached[1]
    name = None
    short = getattr(fn, "__name__", None)
    if isinstance(short, str) and not short.startswith("_"):
        for root in _ROOTS:
            holder = _module(root)
            # C functions of torch.linalg / fft / special are named linalg_norm, fft_fft, ...
            prefix = root.rsplit(".", 1)[-1] + "_"
            attr = short[len(prefix):] if short.startswith(prefix) and root != "torch" else short
            if holder.__dict__.get(attr) is fn:
                name = f"{root}.{attr}"
                break
    if name is None:
        name = _by_identity().get(id(fn))
    if name is not None and name in DENIED:
        name = None
    _NAMES[id(fn)] = (fn, name)
    return name


_IDENTITY: dict[int, str] = {}


def _by_identity() -> dict[int, str]:
    """Public names by object identity, from the roots' ``__dict__`` (reading ``__dict__``, not
    ``getattr``, so that no lazily loaded submodule gets imported)."""
    if not _IDENTITY:
        for root in _ROOTS:
            for attr, obj in list(_module(root).__dict__.items()):
                if not attr.startswith("_") and callable(obj) and not isinstance(obj, type):
                    _IDENTITY.setdefault(id(obj), f"{root}.{attr}")
    return _IDENTITY


def _module(dotted: str) -> Any:
    obj: Any = torch
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def op_name_of_overload(op: Any) -> str:
    """``torch.ops.<ns>.<name>[.<overload>]`` for an op packet or overload (an ATen op, a
    ``torch.library`` custom op such as transformers' grouped matmul), registered as an in-process
    op of the torch dialect under that name: the qualified name is how the op is re-read, and the
    node runs the op itself. An op that mutates an argument keeps its node (side effects)."""
    if isinstance(op, torch._ops.OpOverload):
        packet, overload = op.overloadpacket, op._overloadname
        mutates = op._schema.is_mutable
    else:
        packet, overload = op, None
        mutates = any(getattr(packet, o)._schema.is_mutable for o in packet.overloads())
    namespace, name = packet._qualified_op_name.split("::", 1)
    parts = ["torch", "ops", namespace, name] + ([overload] if overload else [])
    dotted = ".".join(re.sub(r"\W", "_", p) or "_" for p in parts)
    register_callable(dotted, op, side_effects=mutates)
    return dotted


def _true(*args, **kwargs):
    return True


def _false(*args, **kwargs):
    return False


def _none(*args, **kwargs):
    return None


# torch functions answered at trace time; each receives Python constants (tensors as fakes).
TRACE_TIME_FUNCTIONS: dict[Any, Any] = {
    torch.is_grad_enabled: torch.is_grad_enabled,
    torch.get_default_dtype: torch.get_default_dtype,
    torch.is_tensor: lambda x: isinstance(x, torch.Tensor),
    torch.is_floating_point: lambda x: x.is_floating_point(),
    torch.is_complex: lambda x: x.is_complex(),
    torch.numel: lambda x: x.numel(),
    torch.is_autocast_enabled: torch.is_autocast_enabled,
    torch.is_inference_mode_enabled: torch.is_inference_mode_enabled,
    torch.compiler.is_compiling: _true,
    torch.compiler.is_dynamo_compiling: _false,
    torch.jit.is_scripting: _false,
    torch.jit.is_tracing: _false,
    torch.cuda.is_available: torch.cuda.is_available,
    torch.is_storage: _false,
    torch._C._get_tracing_state: _none,
    # usage telemetry (torchvision's layers call it in forward): nothing a graph computes
    torch._C._log_api_usage_once: _none,
    # functorch's transform stack (vmap, grad) as the trace sees it: torch.autograd.Function and
    # library helpers branch on it, the way TorchDynamo answers it (a constant of the trace).
    torch._C._are_functorch_transforms_active: torch._C._are_functorch_transforms_active,
    torch.finfo: torch.finfo,
    torch.iinfo: torch.iinfo,
}


def _uses_current_device(device: Any = None, *args: Any, **kwargs: Any) -> bool:
    """Whether a CUDA query on ``device`` (an index, a device, a name or None) asks about the
    current device, which ``torch.cuda.set_device`` changes."""
    device = kwargs.get("device", device)
    if isinstance(device, str):
        device = torch.device(device)
    return not isinstance(device, int) and (device is None or device.index is None)


# CUDA state queries, answered at trace time as TorchDynamo does: on a GPU they reach C functions
# (the fork check behind torch.cuda's lazy init) that no graph holds, and libraries ask them in
# forward (transformers' MoE layers check the compute capability before using grouped_mm). A
# device's properties are fixed for the process; what can change is guarded: the current device
# where the query names no index, and whether CUDA is initialised. Each entry gives the guard
# expressions (over ``torch``) a call with those arguments needs. Where CUDA is missing, the
# query's error is the traced code's own exception.
CUDA_QUERY_GUARDS: dict[Any, Any] = {
    torch.cuda.get_device_capability: lambda *a, **k: _current_device_guard(_uses_current_device(*a, **k)),
    torch.cuda.get_device_properties: lambda *a, **k: _current_device_guard(_uses_current_device(*a, **k)),
    torch.cuda.get_device_name: lambda *a, **k: _current_device_guard(_uses_current_device(*a, **k)),
    torch.cuda.current_device: lambda *a, **k: _current_device_guard(True),
    torch.cuda.device_count: lambda *a, **k: [],
    torch.cuda.is_initialized: lambda *a, **k: [f"torch.cuda.is_initialized() is {torch.cuda.is_initialized()}"],
}


def _current_device_guard(needed: bool) -> list[str]:
    return [f"torch.cuda.current_device() == {torch.cuda.current_device()}"] if needed else []


TRACE_TIME_FUNCTIONS.update({fn: fn for fn in CUDA_QUERY_GUARDS})


def _register_controls() -> None:
    from fireclay_capture.controls import is_compiling

    TRACE_TIME_FUNCTIONS[is_compiling] = _true


_register_controls()
for _name in ("is_exporting",):
    if hasattr(torch.compiler, _name):
        TRACE_TIME_FUNCTIONS[getattr(torch.compiler, _name)] = _false
for _overrides in ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic"):
    TRACE_TIME_FUNCTIONS[getattr(torch.overrides, _overrides)] = _false


def _weight_norm(v, g, dim=0):
    # What ATen's composite _weight_norm computes (its fused CPU/CUDA kernel gives the same
    # values): the direction v scaled to the norm g, with the norm taken over every dim but dim.
    return v * (g / torch.norm_except_dim(v, 2, dim))


# Private torch functions (no public name to record) that library code calls directly, traced as
# these Python functions over public ops instead.
TRACED_REPLACEMENTS: dict[Any, Any] = {
    torch._weight_norm: _weight_norm,
}


# Grad-mode switches inside a graph (``with torch.no_grad():``). torch.set_grad_enabled is not a
# shipped op (as a class it also builds a context manager), so the plain function is registered.
GRAD_MODE_OP = "torch.autograd.set_grad_enabled"
register_callable(GRAD_MODE_OP, torch._C._set_grad_enabled)


def _autocast_enter(device_type: str, dtype, enabled: bool, cache_enabled):
    ctx = torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
    ctx.__enter__()
    return ctx


def _autocast_exit(ctx) -> None:
    ctx.__exit__(None, None, None)


# ``with torch.autocast(...)`` inside a graph: enter returns the context (an opaque value) that
# exit takes back, so the region is explicit in the IR.
AUTOCAST_ENTER_OP = "torch.amp.autocast_enter"
AUTOCAST_EXIT_OP = "torch.amp.autocast_exit"
register_callable(AUTOCAST_ENTER_OP, _autocast_enter)
register_callable(AUTOCAST_EXIT_OP, _autocast_exit)
