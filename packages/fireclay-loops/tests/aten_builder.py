"""Test helper: build aten-dialect programs op by op, with TensorMeta taken from running each op
on meta tensors, and run the same ops eagerly as the oracle."""

from __future__ import annotations

from typing import Any

import torch

from fireclay_ir import DTYPES, Device, DType, Graph, Program, ScalarType, TensorMeta, Value

_NAMES = {getattr(torch, n): n for n in DTYPES if isinstance(getattr(torch, n, None), torch.dtype)}


def aten_op(name: str):
    packet, _, overload = name.removeprefix("aten::").partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def meta_of(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(_NAMES[t.dtype], tuple(t.shape), tuple(t.stride()), t.storage_offset(),
                      "cpu" if t.device.type == "meta" else str(t.device))


class Handle:
    def __init__(self, value: Value, meta: torch.Tensor):
        self.value = value
        self.meta = meta


class AtenBuilder:
    """``device``: the device the graph's values are typed on (default: the inputs'), so that a
    program for a GPU can be planned, though not run, on a CPU."""

    def __init__(self, device: str | None = None):
        self.device = device
        self.graph = Graph("main")
        self.steps: list[tuple] = []  # (op, args, kwargs, outputs) for the eager replay
        self.inputs: list[Handle] = []

    def input(self, t: torch.Tensor, name: str = "x") -> Handle:
        meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        typed = meta_of(t) if self.device is None else meta_of(t).with_(device=self.device)
        h = Handle(self.graph.add_input(name, typed), meta)
        self.inputs.append(h)
        return h

    def _ir_arg(self, a: Any) -> Any:
        if isinstance(a, Handle):
            return a.value
        if isinstance(a, torch.dtype):
            return DType(_NAMES[a])
        if isinstance(a, torch.device):
            return Device(str(a))
        if isinstance(a, (list, tuple)):
            return type(a)(self._ir_arg(x) for x in a)
        return a

    @staticmethod
    def _meta_arg(a: Any) -> Any:
        if isinstance(a, Handle):
            return a.meta
        if isinstance(a, (list, tuple)):
            return type(a)(AtenBuilder._meta_arg(x) for x in a)
        return a

    def call(self, op: str, *args: Any, **kwargs: Any):
        op = op if op.startswith("aten::") else f"aten::{op}"
        result = aten_op(op)(*self._meta_arg(args), **{k: self._meta_arg(v) for k, v in kwargs.items()})
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        # results come from meta kernels: they live on the device of the graph's inputs
        device = self.inputs[0].value.meta.device if self.inputs else "cpu"
        out = self.graph.call(op, self._ir_arg(args), {k: self._ir_arg(v) for k, v in kwargs.items()},
                              out=[meta_of(r).with_(device=device) if isinstance(r, torch.Tensor)
                                   else ScalarType("int") if isinstance(r, int) else ScalarType("opaque")
                                   for r in results])
        handles = [Handle(v, r) for v, r in zip(out, results)]
        self.steps.append((op, args, kwargs, handles))
        return tuple(handles) if isinstance(result, (tuple, list)) else handles[0]

    def output(self, *outs: Handle) -> Program:
        self.graph.set_outputs([o.value for o in outs])
        self.outs = outs
        return Program.single(self.graph)

    def eager(self, *tensors: torch.Tensor) -> tuple:
        env: dict[int, torch.Tensor] = {id(h): t for h, t in zip(self.inputs, tensors)}

        def real(a: Any) -> Any:
            if isinstance(a, Handle):
                return env[id(a)]
            if isinstance(a, (list, tuple)):
                return type(a)(real(x) for x in a)
            return a

        for op, args, kwargs, handles in self.steps:
            r = aten_op(op)(*real(args), **{k: real(v) for k, v in kwargs.items()})
            rs = list(r) if isinstance(r, (tuple, list)) else [r]
            for h, v in zip(handles, rs):
                env[id(h)] = v
        return tuple(env[id(o)] for o in self.outs)


class T:
    """A random input: shape, dtype, and how to fill it."""

    def __init__(self, *shape: int, dtype: torch.dtype = torch.float32, fill: str = "randn",
                 low: int = 0, high: int = 10, transposed: bool = False):
        self.shape, self.dtype, self.fill, self.low, self.high = shape, dtype, fill, low, high
        self.transposed = transposed

    def make(self, gen: torch.Generator) -> torch.Tensor:
        shape = tuple(reversed(self.shape)) if self.transposed else self.shape
        if self.dtype == torch.bool:
            t = torch.rand(shape, generator=gen) > 0.5
        elif not self.dtype.is_floating_point:
            t = torch.randint(self.low, self.high, shape, generator=gen, dtype=self.dtype)
        elif self.fill == "pos":
            t = torch.rand(shape, generator=gen, dtype=self.dtype) * 2 + 0.1
        elif self.fill == "unit":
            t = torch.rand(shape, generator=gen, dtype=self.dtype) * 1.8 - 0.9
        else:
            t = torch.randn(shape, generator=gen, dtype=self.dtype)
        return t.t() if self.transposed else t

    def __repr__(self) -> str:
        return f"T{self.shape}"


def random_maker(dtype: torch.dtype, generator: torch.Generator):
    """``g(*shape)``: fresh random values of ``dtype`` (normal for floating types, integers in
    [-50, 50) otherwise), drawn from ``generator``."""
    def g(*shape):
        if dtype.is_floating_point:
            return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
        return torch.randint(-50, 50, shape, generator=generator, dtype=dtype)
    return g
