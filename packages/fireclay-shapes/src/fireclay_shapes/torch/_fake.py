"""FakeTensor and FakeMode: tensors without data that report the device they stand for.

A FakeTensor is a ``torch.Tensor`` wrapper subclass (``_make_wrapper_subclass``) whose
metadata (sizes, strides, dtype, device "cpu"/"cuda:0", requires_grad) is the real tensor's,
and which keeps a plain tensor on the meta device beside it. Every aten op on fakes reaches
``__torch_dispatch__``, which runs the op on the meta tensors (torch's own meta kernels, or a
decomposition from torch's tables when an op has none), checks devices as eager would, and
wraps the results back as fakes on the right device. Sizes may be ``torch.SymInt`` backed by a
fireclay ShapeEnv (see ``_symnode``): meta kernels then compute symbolic output shapes, and
every decision they take becomes a guard in the ShapeEnv.

Why a wrapper and not a meta tensor that claims another device: running a kernel on the
fake itself needs dispatcher TLS switches that only torch's private fake tensor uses; with a
wrapper, the meta tensor inside is an ordinary tensor and the ordinary dispatcher runs it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import sympy
import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from .._env import DataDependentError, ShapeEnv
from .._expr import ShapeError, parse
from . import _meta_cache
from ._dispatch_mode import CompilerDispatchMode
from ._symnode import make_symint

aten = torch.ops.aten


class UnsupportedOpError(ShapeError, NotImplementedError):
    """An op that fireclay's fake tensors cannot run (no meta kernel, no decomposition)."""


class FakeTensor(torch.Tensor):
    """A tensor with metadata and no data; see the module docstring."""

    meta: torch.Tensor
    fake_mode: FakeMode

    @staticmethod
    def __new__(cls, meta: torch.Tensor, device, mode: FakeMode, requires_grad: bool = False):
        if meta.device.type != "meta":
            raise ShapeError(f"a FakeTensor wraps a meta tensor, got one on {meta.device}")
        device = _normalize_device(device)
        r = torch.Tensor._make_wrapper_subclass(
            cls, meta.size(), strides=meta.stride(), storage_offset=meta.storage_offset(),
            dtype=meta.dtype, layout=meta.layout, device=device, requires_grad=requires_grad,
        )
        if device.type == "cuda":
            global _cuda_fakes_made
            _cuda_fakes_made = True
            if requires_grad and _CUDA_MISSING:
                raise _cuda_autograd_error(f"making a fake of size {tuple(meta.shape)} on {device}")
        r.meta = meta
        r.fake_mode = mode
        return r

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # Runs above autograd, so it can refuse what would crash below it (see _refuse_cuda_autograd);
        # results are returned as they come (no conversion to this class: ops already return fakes).
        with torch._C.DisableTorchFunctionSubclass():
            if _CUDA_MISSING and _cuda_fakes_made:
                _refuse_cuda_autograd(func, args, kwargs or {})
            operands = _MATMULS.get(func)
            if operands is not None and not kwargs and len(args) == 2:
                return matmul(*operands(args))
            return func(*args, **(kwargs or {}))

    def __repr__(self, *, tensor_contents=None) -> str:
        sizes = ", ".join(str(s) for s in self.shape)
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"FakeTensor(size=({sizes}), dtype={self.dtype}, device={self.device}{grad})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        mode = _mode_of(args, kwargs or {})
        return mode.run(func, args, kwargs or {})


# torch's C++ matmul (CompositeImplicit, run above autograd) calls numel() on its operands in
# some versions (2.11), which a tensor with symbolic sizes refuses. Fakes do matmul themselves,
# in every version, as torch's own algorithm spells it, with sizes kept symbolic.
_MATMULS = {
    torch.matmul: lambda args: args,
    torch.Tensor.matmul: lambda args: args,
    torch.Tensor.__matmul__: lambda args: args,
    torch.Tensor.__rmatmul__: lambda args: (args[1], args[0]),
}


def _product(sizes) -> object:
    n: object = 1
    for s in sizes:
        n = n * s
    return n


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul`` by mm/bmm/reshape/expand, never asking a tensor for its numel."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError(f"matmul(): arguments must be tensors, got {type(a).__name__} and {type(b).__name__}")
    da, db = a.dim(), b.dim()
    if da == 0 or db == 0:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {da}D and {db}D")
    if da == 1 and db == 1:
        return torch.dot(a, b)
    if da == 2 and db == 1:
        return torch.mv(a, b)
    if da == 1 and db == 2:
        return torch.mm(a.unsqueeze(0), b).squeeze(0)
    if da == 2 and db == 2:
        return torch.mm(a, b)
    if da >= 3 and db <= 2:
        # Fold a's batch dims into its rows: one mm.
        lead = list(a.shape[:-1])
        b2 = b.unsqueeze(-1) if db == 1 else b
        out = torch.mm(a.reshape(_product(lead), a.shape[-1]), b2)
        return out.view(lead) if db == 1 else out.view(lead + [b2.shape[-1]])
    # Batched: broadcast the batch dims, one bmm, then drop the dims 1-D operands gained.
    a2 = a.unsqueeze(0) if da == 1 else a
    b2 = b.unsqueeze(-1) if db == 1 else b
    n, k, p = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    batch = list(torch.broadcast_shapes(tuple(a2.shape[:-2]), tuple(b2.shape[:-2])))
    count = _product(batch)
    a3 = a2.expand(batch + [n, k]).reshape(count, n, k)
    b3 = b2.expand(batch + [b2.shape[-2], p]).reshape(count, b2.shape[-2], p)
    out = torch.bmm(a3, b3).view(batch + [n, p])
    if da == 1:
        out = out.squeeze(-2)
    if db == 1:
        out = out.squeeze(-1)
    return out


# On a torch built without CUDA, autograd's bookkeeping for a "cuda" tensor that requires grad
# takes a CUDA device guard and aborts the process from C++ (it cannot be caught). Fakes refuse
# that combination up front with an error instead.
_CUDA_MISSING = not torch.backends.cuda.is_built()
# Whether a fake on a CUDA device was ever made in this process: until then no call can
# involve one, and the check above (a walk over every call's arguments) is skipped.
_cuda_fakes_made = False


def _cuda_autograd_error(what: str) -> ShapeError:
    return ShapeError(
        f"{what}: a fake CUDA tensor that requires grad needs a torch built with CUDA (torch's "
        f"autograd takes a CUDA device guard, which this build lacks and which would abort the "
        f"process). Trace with requires_grad=False, or on the CPU, or on a CUDA build of torch.")


def _refuse_cuda_autograd(func, args, kwargs) -> None:
    flat = tree_flatten((args, kwargs))[0]
    cuda = [a for a in flat if isinstance(a, FakeTensor) and a.device.type == "cuda"]
    if not cuda:
        return
    name = getattr(func, "__name__", str(func))
    if name == "requires_grad_" and (len(args) < 2 or args[1]) and kwargs.get("requires_grad", True):
        raise _cuda_autograd_error(f"{name} on {cuda[0]!r}")
    if torch.is_grad_enabled() and any(a.requires_grad for a in cuda):
        raise _cuda_autograd_error(f"{name} on {cuda[0]!r}")


def _mode_of(args, kwargs) -> FakeMode:
    for a in tree_flatten((args, kwargs))[0]:
        if isinstance(a, FakeTensor):
            return a.fake_mode
    raise ShapeError("internal: a fake tensor op without fake tensor arguments")


# Ops whose output lives on the device named by their arguments, not on their inputs' device.
_COPY_OPS = {aten._to_copy.default, aten.copy_.default, aten.copy.default, aten._copy_from.default,
             aten._copy_from_and_resize.default}
# Indexing takes index tensors on the CPU for a tensor on any device (eager moves them).
_INDEX_OPS = {"index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put"}


class FakeMode(CompilerDispatchMode):
    """While active, factory functions (``torch.empty``, ``torch.randn(..., device="cuda")``)
    make fakes, and real tensors meeting fakes are turned into fakes (constants; their data is
    not kept) unless ``allow_real_inputs=False``.

    ``env`` is the ShapeEnv that symbolic sizes belong to; data-dependent sizes (``nonzero``,
    ``.item()``) become unbacked symbols in it.
    """

    def __init__(self, env: ShapeEnv | None = None, *, allow_real_inputs: bool = True):
        super().__init__()
        # Occupy torch's "fake" mode slot: torch then skips initialising CUDA for factory
        # calls with device="cuda" (it would fail on machines without a GPU), as it does for
        # its own fake mode. The slot also orders this mode after user modes, nearest the kernels.
        self._mode_key = torch._C._TorchDispatchModeKey.FAKE
        self.env = env if env is not None else ShapeEnv()
        self.allow_real_inputs = allow_real_inputs
        self._constants: dict[int, tuple[torch.Tensor, FakeTensor]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.run(func, args, kwargs or {})

    # ------------------------------------------------------------------ making fakes

    def from_real(self, tensor: torch.Tensor, *, dynamic_dims: Sequence[int] = (),
                  sources: Sequence[str] | None = None, static: bool = False) -> FakeTensor:
        """A fake standing for ``tensor``: same sizes, strides, dtype, device, requires_grad.
        Dims in ``dynamic_dims`` get symbolic sizes (``sources[d]`` names where each size comes
        from, for guards); 0/1 sizes and duck sizing follow the ShapeEnv's rules."""
        if isinstance(tensor, FakeTensor):
            return tensor
        if tensor.layout != torch.strided:
            raise ShapeError(f"fake tensors support strided tensors only, got layout {tensor.layout}")
        if not dynamic_dims:
            meta = _empty_meta(list(tensor.size()), list(tensor.stride()), tensor.storage_offset(), tensor.dtype)
            return FakeTensor(meta, tensor.device, self, tensor.requires_grad)
        dims = [d % tensor.dim() for d in dynamic_dims]
        sizes: list = []
        for d, hint in enumerate(tensor.size()):
            if d in dims:
                source = sources[d] if sources is not None else None
                sizes.append(make_symint(self.env, self.env.create_symbol(int(hint), source)))
            else:
                sizes.append(int(hint))
        strides = _symbolic_strides(tensor, sizes)
        meta = _empty_meta(sizes, strides, tensor.storage_offset(), tensor.dtype)
        return FakeTensor(meta, tensor.device, self, tensor.requires_grad)

    def fake(self, shape: Sequence, strides: Sequence | None = None, *, dtype="float32", device="cpu",
             requires_grad: bool = False, storage_offset=0) -> FakeTensor:
        """A fake from metadata alone (a program's tensor type): dims are ints, expression
        strings over this mode's symbols (``"2*s0"``), sympy expressions or SymInts;
        ``strides=None`` means contiguous; ``dtype`` is a torch.dtype or its name."""
        sizes = [self._dim(d) for d in shape]
        if strides is None:
            strides_out: list = []
            acc: object = 1
            for d in reversed(sizes):
                strides_out.append(acc)
                acc = acc * d
            strides_out.reverse()
        else:
            strides_out = [self._dim(d) for d in strides]
        torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        if not isinstance(torch_dtype, torch.dtype):
            raise ShapeError(f"unknown dtype {dtype!r}")
        meta = _empty_meta(sizes, strides_out, self._dim(storage_offset), torch_dtype)
        return FakeTensor(meta, device, self, requires_grad)

    def _dim(self, d):
        if isinstance(d, torch.SymInt):
            return d
        if isinstance(d, bool):
            raise ShapeError(f"a dimension cannot be a bool ({d!r})")
        if isinstance(d, int):
            return d
        e = parse(d) if isinstance(d, str) else sympy.sympify(d)
        unknown = [str(s) for s in e.free_symbols if str(s) not in self.env.symbols]
        if unknown:
            raise ShapeError(f"dimension {d!r} uses symbols {unknown} that this mode's ShapeEnv does not "
                             f"have; restore them first (ShapeEnv.restore)")
        return make_symint(self.env, e)

    # ------------------------------------------------------------------ running ops

    def run(self, func, args, kwargs):
        rule = _RULES.get(func)
        if rule is not None:
            out = rule(self, func, args, kwargs)
            if out is not NotImplemented:
                return out
        flat, spec = tree_flatten((args, kwargs))
        flat = [self._adopt(a, func) if isinstance(a, torch.Tensor) else a for a in flat]
        fakes = [a for a in flat if isinstance(a, FakeTensor)]
        out_device = _output_device(func, fakes, kwargs)
        if func.namespace == "prims" and hasattr(func, "prim_meta_impl"):
            # Prims' metas check devices (CPU scalars may meet any tensor), so they must see
            # fakes, not the meta tensors inside them; their outputs are made under this mode.
            with self:
                return func.prim_meta_impl(*args, **kwargs)
        symbolic = any(_is_symbolic(a) for a in flat)
        cache_key = None
        if not symbolic and fakes and _meta_cache.eligible(func):
            with torch._C.DisableTorchFunctionSubclass():
                cache_key = _meta_cache.key(func, args, kwargs, FakeTensor)
            if cache_key is not None:
                known = _meta_cache.lookup(cache_key)
                if known is not None:
                    return _meta_cache.rebuild(known, lambda size, stride, offset, dtype: FakeTensor(
                        _meta_cache.new_meta(size, stride, offset, dtype), out_device, self))
        if symbolic and _needs_python_semantics(func):
            # The C++ meta kernels of most ops want concrete sizes; torch states these ops'
            # semantics in Python too (a decomposition, or their CompositeImplicit body).
            from torch._decomp import decomposition_table

            decomposition = decomposition_table.get(func)
            with self:
                if decomposition is not None:
                    return decomposition(*args, **kwargs)
                r = func.decompose(*args, **kwargs)
                if r is not NotImplemented:
                    return r
        metas = [a.meta if isinstance(a, FakeTensor) else a for a in flat]
        margs, mkwargs = tree_unflatten(metas, spec)
        if "device" in mkwargs or _takes_device(func):
            mkwargs = {**mkwargs, "device": torch.device("meta")}
        try:
            # A mode is off while its own handler runs, and plain meta tensors reach no
            # subclass: this call goes straight to the meta kernel. A Python meta kernel is
            # called directly when sizes are symbolic: reached through the dispatcher with
            # SymInts backed by Python nodes, some trip an internal assert in torch's arg parser.
            python_meta = _python_meta(func) if symbolic else None
            out = python_meta(*margs, **mkwargs) if python_meta is not None else func(*margs, **mkwargs)
        except NotImplementedError as e:
            return self._decompose_or_fail(func, args, kwargs, e)
        except RuntimeError as e:
            if python_meta is not None and any(m in str(e) for m in _SYMBOLIC_DISPATCH_FAILURES):
                # A Python meta kernel whose inner ops (narrow, ...) reach the dispatcher with
                # SymInts backed by Python nodes trips torch's argument parser; run it over the
                # fakes instead, so those inner ops come back to this mode.
                with self:
                    return python_meta(*args, **kwargs)
            if "meta" in str(e).lower() and ("not implemented" in str(e).lower() or "could not run" in str(e).lower()):
                return self._decompose_or_fail(func, args, kwargs, e)
            raise
        if func is aten.convolution.default:
            out = _convolution_layout(margs, out)
        by_id = {id(a.meta): a for a in fakes}
        if cache_key is not None and not any(id(t) in by_id for t in tree_flatten(out)[0]):
            _meta_cache.store(cache_key, out)  # (a kernel that hands back an input is not cached)
        if isinstance(out, torch.Tensor):
            return self._wrap(out, out_device, by_id, func)
        return tree_map(lambda t: self._wrap(t, out_device, by_id, func), out)

    def _wrap(self, t, device, by_id, func):
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) in by_id:
            same = by_id[id(t)]
            if tuple(same.shape) != tuple(t.shape) or same.stride() != t.stride():
                raise UnsupportedOpError(
                    f"{func} changed the sizes or strides of a tensor in place; fireclay's fake tensors "
                    f"cannot follow in-place metadata changes. Use the out-of-place form (e.g. "
                    f"x = x.unsqueeze(0) instead of x.unsqueeze_(0)).")
            return same
        return FakeTensor(t, device, self)

    def _adopt(self, t: torch.Tensor, func) -> torch.Tensor:
        if isinstance(t, FakeTensor):
            return t
        if not self.allow_real_inputs:
            raise ShapeError(f"{func} got a real tensor ({tuple(t.shape)}, {t.dtype}, {t.device}) among fake "
                             f"tensors; convert it with FakeMode.from_real, or allow_real_inputs=True")
        if t.device.type == "meta":
            return FakeTensor(t, "meta", self)
        hit = self._constants.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        fake = self.from_real(t)
        self._constants[id(t)] = (t, fake)
        return fake

    def _decompose_or_fail(self, func, args, kwargs, error):
        from torch._decomp import decomposition_table

        decomposition = decomposition_table.get(func)
        if decomposition is None:
            raise UnsupportedOpError(
                f"{func} has no meta kernel and no decomposition, so fireclay's fake tensors cannot "
                f"compute its output's shape ({type(error).__name__}: {str(error).splitlines()[0]}). "
                f"Register one with torch.library.register_fake, or keep this op out of the compiled "
                f"region.") from None
        with self:
            return decomposition(*args, **kwargs)


# Ops whose C++ meta kernels handle symbolic sizes (besides view_copy ops), per torch.
_CPP_META_SYMBOLIC_OK = {
    aten.empty.memory_format, aten.empty_strided.default, aten.as_strided_scatter.default,
    aten.as_strided.default, aten.as_strided_.default, aten.zeros.default, aten.detach.default,
    aten.view_as_real.default, aten.view_as_complex.default,
}


def _needs_python_semantics(func) -> bool:
    from torch._decomp import meta_table

    return not (func in meta_table or func in _CPP_META_SYMBOLIC_OK or torch.Tag.view_copy in func.tags)


# What torch says when a Python meta kernel's inner ops reach C++ kernels with SymInts backed by
# Python nodes: its argument parser asserts, or a non-symbolic kernel (expand in index's
# broadcasting) refuses the sizes.
# (torch 2.14's constant_pad_nd meta narrows its input: the C++ slice asks a meta tensor with
# symbolic sizes for its storage offset.)
_SYMBOLIC_DISPATCH_FAILURES = ("INTERNAL ASSERT", "expected to contain only concrete integers",
                               "on tensor with symbolic sizes/strides")


def _python_meta(func):
    from torch._decomp import meta_table

    return meta_table.get(func)


def _is_symbolic(a) -> bool:
    if isinstance(a, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        return True
    if isinstance(a, FakeTensor):
        m = a.meta  # the same sizes, read without the fake's __torch_function__
        return any(isinstance(s, torch.SymInt) for s in itertools.chain(m.shape, m.stride()))
    if isinstance(a, (list, tuple)):
        return any(_is_symbolic(x) for x in a)
    return False


def _convolution_layout(margs, out: torch.Tensor) -> torch.Tensor:
    """The meta kernel of convolution always answers a contiguous output; the CPU (mkldnn) and
    CUDA (cudnn) kernels answer channels-last when the input or the weight is channels-last."""
    x, w = margs[0], margs[1]
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    fmt = formats.get(out.dim())
    if fmt is None:
        return out
    if any(_channels_last_like(t, fmt) for t in (x, w)):
        return torch.empty(out.shape, dtype=out.dtype, device="meta").contiguous(memory_format=fmt)
    return out


def _channels_last_like(t: torch.Tensor, fmt) -> bool:
    return t.dim() == (4 if fmt is torch.channels_last else 5) and t.is_contiguous(memory_format=fmt) \
        and not t.is_contiguous()


def _takes_device(func) -> bool:
    try:
        return any(a.name == "device" for a in func._schema.arguments)
    except AttributeError:
        return False


def _normalize_device(device) -> torch.device:
    d = torch.device(device)
    if d.type not in ("cpu", "meta") and d.index is None:
        return torch.device(d.type, 0)  # eager puts "cuda" on the current device, cuda:0 here
    return d


def _output_device(func, fakes: list[FakeTensor], kwargs) -> torch.device:
    requested = kwargs.get("device")
    if requested is not None:
        return _normalize_device(requested)
    if func in _COPY_OPS and fakes:
        return fakes[0].device
    if not fakes:
        return torch.get_default_device() if _takes_device(func) else torch.device("cpu")
    if func.__name__.split(".")[0] in _INDEX_OPS:
        fakes = [fakes[0], *(t for t in fakes[1:] if not _cpu_index(t))]
    devices = [t.device for t in fakes]
    first_non_cpu = next((d for d in devices if d.type != "cpu"), None)
    if first_non_cpu is None:
        return torch.device("cpu")
    for t in fakes:
        d = t.device
        if d == first_non_cpu:
            continue
        if d.type == "cpu" and t.dim() == 0:
            continue  # eager lets CPU scalars meet tensors of any device
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"{first_non_cpu} and {d}! (in {func}, on fireclay fake tensors)")
    return first_non_cpu


def _cpu_index(t: FakeTensor) -> bool:
    return t.device.type == "cpu" and (t.dtype in (torch.int64, torch.int32, torch.bool, torch.uint8))


def _empty_meta(sizes, strides, offset, dtype) -> torch.Tensor:
    if offset == 0:
        return torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
    extent = 1 + sum((s - 1) * st for s, st in zip(sizes, strides)) if all(
        not (isinstance(s, int) and s == 0) for s in sizes) else 0
    base = torch.empty((offset + extent,), dtype=dtype, device="meta")
    return base.as_strided(sizes, strides, offset)


def _symbolic_strides(tensor: torch.Tensor, sizes: list) -> list:
    """Strides of ``tensor`` rewritten over its symbolic sizes, for tensors dense in some dim
    order (contiguous, channels-last, transposed): stride[d] is the product of the sizes of the
    dims inside d in that order."""
    real_sizes, real_strides = list(tensor.size()), list(tensor.stride())
    order = sorted(range(tensor.dim()), key=lambda d: (real_strides[d], real_sizes[d]))
    expected, out = 1, [0] * tensor.dim()
    symbolic_expected: object = 1
    for d in order:
        if real_sizes[d] != 1 and real_strides[d] != expected:
            raise ShapeError(
                f"cannot give symbolic sizes to a tensor with sizes {tuple(real_sizes)} and strides "
                f"{tuple(real_strides)}: it is not dense in any dim order. Make it contiguous first, "
                f"or leave its dims static.")
        out[d] = symbolic_expected if real_sizes[d] != 1 else real_strides[d]
        if real_sizes[d] != 1:
            expected *= real_sizes[d]
            symbolic_expected = symbolic_expected * sizes[d]
    return out


# --------------------------------------------------------------------------- own rules
# Ops whose output shape depends on data: meta kernels cannot know it, so these make
# data-dependent (unbacked) symbols.


def _item(mode: FakeMode, func, args, kwargs):
    (t,) = args
    if t.dtype.is_floating_point or t.dtype.is_complex:
        raise DataDependentError(
            f"{func} on a {t.dtype} fake tensor: the value is only known when the program runs, and "
            f"fireclay does not trace data-dependent floats. Keep .item() out of the compiled region.")
    if t.dtype == torch.bool:
        u = mode.env.create_unbacked_symbol(min=0, max=1)
        from ._symnode import make_symbool

        return make_symbool(mode.env, sympy.Eq(u, 1))
    return make_symint(mode.env, mode.env.create_unbacked_symbol(min=-(2**63), max=2**63 - 1))


def _nonzero(mode: FakeMode, func, args, kwargs):
    (t,) = args
    numel = 1
    for s in t.shape:
        numel = numel * s
    bound = numel if isinstance(numel, int) else None
    u = mode.env.create_unbacked_symbol(min=0, max=bound)
    meta = torch.empty_strided((make_symint(mode.env, u), t.dim()), (1, make_symint(mode.env, u)),
                               dtype=torch.int64, device="meta")
    return FakeTensor(meta, t.device, mode)


def _index_with_masks(mode: FakeMode, func, args, kwargs):
    # x[mask]: a boolean mask of k dims stands for the k index tensors of mask.nonzero(),
    # whose length is data-dependent. The meta kernel would need the mask's values.
    self, indices = args[0], list(args[1])
    if not any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
        return NotImplemented
    expanded = []
    with mode:
        for i in indices:
            if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
                expanded.extend(i.nonzero().unbind(1))
            else:
                expanded.append(i)
        return func(self, expanded)


def _repeat_interleave(mode: FakeMode, func, args, kwargs):
    repeats = args[0]
    if kwargs.get("output_size") is not None or len(args) > 1:
        return NotImplemented
    u = mode.env.create_unbacked_symbol()
    meta = torch.empty((make_symint(mode.env, u),), dtype=repeats.dtype, device="meta")
    return FakeTensor(meta, repeats.device, mode)


_RULES = {
    aten._local_scalar_dense.default: _item,
    aten.nonzero.default: _nonzero,
    aten.index.Tensor: _index_with_masks,
    aten.repeat_interleave.Tensor: _repeat_interleave,
}


def fake_from_real(tensor: torch.Tensor, env: ShapeEnv | None = None, *, dynamic_dims: Sequence[int] = (),
                   sources: Sequence[str] | None = None, mode: FakeMode | None = None) -> FakeTensor:
    """A fake for ``tensor`` (see :meth:`FakeMode.from_real`), in ``mode`` or a new FakeMode over
    ``env``."""
    if mode is None:
        mode = FakeMode(env)
    elif env is not None and env is not mode.env:
        raise ShapeError("fake_from_real: env and mode.env differ")
    return mode.from_real(tensor, dynamic_dims=dynamic_dims, sources=sources)

