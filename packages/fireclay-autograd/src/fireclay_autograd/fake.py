"""A fake tensor: metadata only, stored on the meta device, reporting its real device.

This is a thin stand-in until fireclay-shapes' fake tensor (with symbolic sizes) lands; the
tracer only relies on :func:`fake_from`, :attr:`FakeTensor.elem` and
:attr:`FakeTensor.fake_device`, so swapping it out touches this module alone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree


class FakeTensor(torch.Tensor):
    """A wrapper subclass around a meta tensor ``elem``; ``value`` is the IR value a tracer
    bound to it (None outside tracing)."""

    elem: torch.Tensor
    fake_device: torch.device
    value: Any

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device, requires_grad: bool = False):
        assert elem.device.type == "meta", "a FakeTensor wraps a meta tensor"
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, layout=elem.layout, device=device, requires_grad=requires_grad,
        )
        r.elem = elem
        r.fake_device = device
        r.value = None
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self) -> str:
        value = f", value=%{self.value.name}" if self.value is not None else ""
        return f"FakeTensor({tuple(self.shape)}, {self.dtype}, {self.fake_device}{value})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Outside a tracer a FakeTensor still propagates metadata, so shapes can be asked of it.
        return run_on_fakes(func, args, kwargs or {})


def run_on_fakes(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """Run an aten op on fakes (factory ops included: their device becomes the fake's)."""
    meta_args, meta_kwargs, device = unwrap(args, kwargs)
    out = func(*meta_args, **meta_kwargs)
    return pytree.tree_map_only(torch.Tensor, lambda t: FakeTensor(t, device), out)


def fake_from(t: torch.Tensor, requires_grad: bool | None = None) -> FakeTensor:
    """A fake with ``t``'s dtype, sizes, strides, offset and device."""
    if isinstance(t, FakeTensor):
        return FakeTensor(t.elem.detach(), t.fake_device, bool(t.requires_grad if requires_grad is None else requires_grad))
    elem = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta")
    if t.storage_offset():
        elem = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype,
                           device="meta").as_strided(t.size(), t.stride(), t.storage_offset())
    rg = t.requires_grad if requires_grad is None else requires_grad
    return FakeTensor(elem, t.device, requires_grad=rg)


def unwrap(args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any], torch.device]:
    """Arguments with fakes replaced by their meta tensors and devices by ``meta``, and the
    device the results of the call live on."""
    devices: list[torch.device] = []

    def leaf(x: Any) -> Any:
        if isinstance(x, FakeTensor):
            # A CPU scalar tensor may meet a CUDA tensor; the result then lives on CUDA.
            if x.fake_device.type != "cpu" or x.dim() > 0 or not devices:
                devices.append(x.fake_device)
            return x.elem
        if isinstance(x, torch.Tensor) and x.device.type != "meta":
            raise TypeError("a real tensor reached a fake-tensor computation; lift it as a constant first")
        return x

    meta_args = pytree.tree_map(leaf, args)
    meta_kwargs = pytree.tree_map(leaf, kwargs)
    explicit = meta_kwargs.get("device")
    if explicit is not None:
        device = torch.device(explicit)
        meta_kwargs["device"] = torch.device("meta")
    else:
        non_cpu = [d for d in devices if d.type != "cpu"]
        device = non_cpu[0] if non_cpu else (devices[0] if devices else torch.device("cpu"))
    return meta_args, meta_kwargs, device
