"""The output metadata of ops already run on fakes of the same types, for static shapes.

A model repeats itself: each layer of a transformer calls the same ops on tensors of the same
sizes, and capture and the aten trace run the same ops again. torch's meta kernels for many
ops (``addmm``, pointwise ops, layer norms) are Python reference implementations costing a
tenth of a millisecond or more per call; an op's output sizes, strides and dtype follow from
its inputs' metadata and its other arguments alone, so the answer for one call serves every
later call with equal ones.

What is cached, and why only that:

* functional ops (no argument written, no result aliasing an argument): their results are
  fresh tensors, so a fresh meta tensor of the same type stands for one exactly; views and
  in-place ops keep running their kernels (their results share an input's storage);
* calls whose tensors, sizes and strides are all static (symbolic sizes record guards as the
  kernel decides, which a cached answer would skip);
* arguments made of tensors, numbers, strings, None, dtypes, devices, layouts and memory
  formats (other objects, as opaque Python values, are not keyed) and results made of tensors,
  numbers and None. The default dtype is part of the key (Python floats promote to it).

The cache is process-wide and bounded; the oldest entries go first. :class:`FakeMode` consults
it for fakes; :class:`CachedMetaKernels` for plain meta tensors (capture's static fakes).
"""

from __future__ import annotations

from typing import Any

import torch

from ._dispatch_mode import CompilerDispatchMode

_LIMIT = 4096
_entries: dict[tuple, Any] = {}
_eligible: dict[Any, bool] = {}

_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


class _NotKeyed(Exception):
    """An argument or result the cache does not describe."""


def eligible(func) -> bool:
    """Whether ``func`` is a functional aten op whose results alias none of its arguments."""
    known = _eligible.get(func)
    if known is None:
        try:
            schema = func._schema
            known = (func.namespace == "aten" and not schema.is_mutable
                     and all(r.alias_info is None for r in schema.returns))
        except AttributeError:
            known = False
        _eligible[func] = known
    return known


def key(func, args: tuple, kwargs: dict, fake_type: type | None) -> tuple | None:
    """The cache key of a static call, or None when an argument is not one the cache keys.
    ``fake_type``: the class of fakes (keyed by the meta tensor they hold and their device);
    None keys plain meta tensors."""
    try:
        return (func, torch.get_default_dtype(), _key(args, fake_type), _key(kwargs, fake_type))
    except (_NotKeyed, TypeError):  # TypeError: an unhashable (symbolic) size
        return None


def _key(x: Any, fake_type: type | None) -> Any:
    if isinstance(x, torch.Tensor):
        if fake_type is not None and isinstance(x, fake_type):
            m, device = x.meta, x.device
        elif fake_type is None and type(x) is torch.Tensor and x.device.type == "meta":
            m, device = x, None
        else:
            raise _NotKeyed
        if m.layout != torch.strided or m.is_conj() or m.is_neg():
            raise _NotKeyed
        shape, stride, offset = tuple(m.shape), m.stride(), m.storage_offset()
        # symbolic sizes are unhashable: such a call is not keyed (a storage offset too: x[-1]
        # of a tensor of symbolic length starts at s0 - 1 with all its sizes static)
        hash(shape + stride + (offset,))
        return ("tensor", shape, stride, offset, m.dtype, device)
    t = type(x)
    if t is tuple or t is list:
        return (t, tuple(_key(a, fake_type) for a in x))
    if t is dict:
        return (t, tuple((k, _key(v, fake_type)) for k, v in x.items()))
    if t in _PLAIN:
        return (t, x)
    raise _NotKeyed


def lookup(k: tuple) -> Any:
    """The stored description of the results (see :func:`describe`), or None."""
    return _entries.get(k)


def store(k: tuple, out: Any) -> None:
    """Remember the results ``out`` (meta tensors) of the call keyed ``k``, when describable."""
    try:
        described = describe(out)
    except _NotKeyed:
        return
    if len(_entries) >= _LIMIT:
        del _entries[next(iter(_entries))]
    _entries[k] = described


def describe(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        if out.layout != torch.strided or out.is_conj() or out.is_neg():
            raise _NotKeyed
        return ("tensor", tuple(out.shape), out.stride(), out.storage_offset(), out.dtype)
    t = type(out)
    if t is tuple or t is list:
        return (t, [describe(a) for a in out])
    if t in (int, float, bool, type(None)):
        return ("value", out)
    raise _NotKeyed


def rebuild(described: Any, make_tensor) -> Any:
    """Results like the stored ones, each tensor new: ``make_tensor(shape, stride, offset,
    dtype)`` makes it."""
    kind = described[0]
    if kind == "tensor":
        return make_tensor(*described[1:])
    if kind == "value":
        return described[1]
    items = [rebuild(d, make_tensor) for d in described[1]]
    return tuple(items) if kind is tuple else items


def new_meta(size, stride, offset: int, dtype: torch.dtype) -> torch.Tensor:
    """A meta tensor of the given type (its storage large enough for the offset)."""
    if offset == 0:
        return torch.empty_strided(size, stride, dtype=dtype, device="meta")
    extent = 1 + sum((n - 1) * st for n, st in zip(size, stride)) if 0 not in size else 0
    return torch.empty((offset + extent,), dtype=dtype, device="meta").as_strided(size, stride, offset)


class CachedMetaKernels(CompilerDispatchMode):
    """While active, functional aten ops on plain meta tensors answer from the cache (see the
    module docstring), and fill it. It sits below autograd, which still gives the results
    their ``requires_grad`` and history; only the meta kernels' work is skipped."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not eligible(func):
            return func(*args, **kwargs)
        k = key(func, args, kwargs, None)
        if k is None:
            return func(*args, **kwargs)
        known = _entries.get(k)
        if known is not None:
            return rebuild(known, new_meta)
        out = func(*args, **kwargs)
        inputs = {id(a) for a in _tensors(args) + _tensors(kwargs)}
        if not any(id(t) in inputs for t in _tensors(out)):
            store(k, out)
        return out


def _tensors(x: Any) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for a in x for t in _tensors(a)]
    if isinstance(x, dict):
        return [t for a in x.values() for t in _tensors(a)]
    return []


def clear() -> None:
    """Forget every entry (tests use it to compare cached and uncached answers)."""
    _entries.clear()
