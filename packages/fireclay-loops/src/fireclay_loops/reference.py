"""The reference executor: runs a scheduled loop program with torch, for tests and as the oracle
runner for code generators. Slow and simple, and exact about the things that matter:

* each kernel is evaluated over its whole iteration grid at once (index expressions become
  integer tensors over the grid);
* buffers live in the allocations of the memory plan, so two buffers sharing memory really
  share it here: a wrong reuse gives wrong results;
* buffers internal to a kernel never reach memory: a read of one takes the value its writer
  computed, and checks it is read at the index it was written.

A program from someone else (``fireclay run`` of a loops document) runs with ``limits``, a
:class:`fireclay_ir.RunLimits`, bounded as the reference interpreter bounds one: every kernel,
extern call and op of a loop body is a step, and so is every operation of an index or size
expression (a power ``i0**n`` counts ``n``); sizes beyond 64 bits are refused; the inputs and
the memory plan's allocations are checked against ``max_bytes`` before they are made, and every
op torch then runs is first run on the meta device (``fireclay_ir.run_limits.allocation_guard``).

Needs torch (the ``torch`` extra); ``import fireclay_loops`` does not import this module.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from fireclay_ir import RunLimitError, RunLimits
from fireclay_loops import exprs
from fireclay_loops.backend.program import ScheduledProgram
from fireclay_loops.backend.runtime import aten_op
from fireclay_loops.errors import SchedulingError, check_failure
from fireclay_loops.ir import Constant, ExternNode, LoopProgram, TensorArg
from fireclay_loops.kernel import Kernel

DTYPE = {name: getattr(torch, name) for name in (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "complex64", "complex128")}

_MATH = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1,
    "log": torch.log, "log2": torch.log2, "log10": torch.log10, "log1p": torch.log1p,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
    "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh,
    "cosh": torch.cosh, "tanh": torch.tanh, "asinh": torch.asinh, "acosh": torch.acosh,
    "atanh": torch.atanh, "erf": torch.erf, "erfc": torch.erfc, "sigmoid": torch.sigmoid,
    "relu": torch.relu, "reciprocal": torch.reciprocal, "floor": torch.floor, "ceil": torch.ceil,
    "round": torch.round, "trunc": torch.trunc, "sign": torch.sign, "square": torch.square,
    "bitwise_not": torch.bitwise_not, "logical_not": torch.logical_not, "isnan": torch.isnan,
    "isinf": torch.isinf, "lgamma": torch.lgamma, "frac": torch.frac,
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.true_divide,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"), "remainder": torch.remainder,
    "fmod": torch.fmod, "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum,
    "atan2": torch.atan2, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor, "copysign": torch.copysign, "where": torch.where,
}

_M32 = 0xFFFFFFFF


def _mulhilo(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    # 32x32 -> 64-bit product in int64 without overflow: split b into 16-bit halves.
    lo16, hi16 = b & 0xFFFF, b >> 16
    p1, p2 = a * lo16, a * hi16
    low = (p1 & _M32) + ((p2 & 0xFFFF) << 16)
    hi = (p1 >> 32) + (p2 >> 16) + (low >> 32)
    return hi & _M32, low & _M32


def philox(seed: int, counter: torch.Tensor) -> list[torch.Tensor]:
    """Philox4x32-10 of (counter, 0, 0, 0) keyed by ``seed``: four uint32 words as int64."""
    c = [counter & _M32, (counter >> 32) & _M32, torch.zeros_like(counter), torch.zeros_like(counter)]
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(10):
        hi0, lo0 = _mulhilo(c[0], 0xD2511F53)
        hi1, lo1 = _mulhilo(c[2], 0xCD9E8D57)
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
    return c


def random_values(kind: str, seed: int, offset: torch.Tensor) -> torch.Tensor:
    words = philox(seed, offset.to(torch.int64))
    u0 = (words[0] >> 8).to(torch.float32) * (1.0 / (1 << 24))
    if kind == "rand":
        return u0
    u1 = (words[1] >> 8).to(torch.float32) * (1.0 / (1 << 24))
    # Box-Muller; 1 - u0 is in (0, 1], so the log is finite.
    return torch.sqrt(-2.0 * torch.log(1.0 - u0)) * torch.cos(2.0 * torch.pi * u1)


class _NodeHandler:
    """Evaluates one node's body over its kernel's grid."""

    def __init__(self, runner: _Runner, kernel: Kernel, env: dict[str, Any], internal_values: dict,
                 reduce_axes: list[int], grid: list[int]):
        self.runner = runner
        self.kernel = kernel
        self.env = env
        self.internal_values = internal_values
        self.reduce_axes = reduce_axes
        self.grid = grid

    def _index(self, index: sympy.Expr) -> torch.Tensor:
        v = self.runner.evaluate(index, self.env)
        return v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.int64)

    def _internal(self, buf: str, index: sympy.Expr):
        if buf in self.kernel.internal:
            if buf not in self.internal_values:
                raise SchedulingError(f"{buf} is read in {self.kernel.name} before it is computed")
            written_at, value = self.internal_values[buf]
            if not exprs.equal(written_at, index):
                raise SchedulingError(f"{buf} is read at {index} but written at {written_at} in {self.kernel.name}")
            return value
        return None

    def load(self, buf: str, index):
        v = self._internal(buf, index)
        if v is not None:
            return v
        idx = self._index(index)
        return self.runner.storage(buf)[idx]

    def masked_load(self, buf: str, index, mask):
        v = self._internal(buf, index)
        if v is not None:
            return torch.where(mask, v, torch.zeros((), dtype=v.dtype))
        idx = torch.where(mask, self._index(index), torch.zeros((), dtype=torch.int64))
        v = self.runner.storage(buf)[idx]
        return torch.where(mask, v, torch.zeros((), dtype=v.dtype))

    def store(self, buf: str, index, value):
        if buf in self.kernel.internal:
            self.internal_values[buf] = (index, value)
            return
        idx, val = torch.broadcast_tensors(self._index(index), value)
        storage = self.runner.storage(buf)
        storage[idx.reshape(-1)] = val.reshape(-1).to(storage.dtype)

    store_reduction = store

    def store_add(self, buf, index, value):
        # (the runner cleared the buffer before the kernel); in index order, as eager's CPU
        # index_put with accumulate adds
        idx, val = torch.broadcast_tensors(self._index(index), value)
        storage = self.runner.storage(buf)
        storage.index_put_((idx.reshape(-1),), val.reshape(-1).to(storage.dtype), accumulate=True)

    def constant(self, value, dtype):
        return torch.tensor(value, dtype=DTYPE[dtype])

    def index_expr(self, expr, dtype):
        return self._index(expr).to(DTYPE[dtype])

    def to_dtype(self, x, dtype):
        return x.to(DTYPE[dtype])

    def random(self, kind, seed, offset):
        return random_values(kind, seed, self._index(offset))

    def indirect_indexing(self, value, size, name):
        self.env[name] = value.to(torch.int64)
        return None

    def check_bounds(self, value, size, negative, site, mask=None):
        n = self._index(size)
        lo = -n if negative else torch.zeros((), dtype=torch.int64)
        self._check("check_bounds", (value < lo) | (value >= n), mask, site, value, n)
        return value

    def check_nonzero(self, value, site, mask=None):
        self._check("check_nonzero", value == 0, mask, site, value, None)
        return value

    def _check(self, op, bad, mask, site, value, size):
        if mask is not None:
            bad = bad & mask
        if bool(bad.any()):
            first = torch.broadcast_to(value, bad.shape)[bad].reshape(-1)[0]
            raise check_failure(op, site, int(first), None if size is None else int(size))

    def reduction(self, dtype, src_dtype, reduction_type, value):
        v = value.expand(self.grid) if value.dim() <= len(self.grid) else value
        axes = self.reduce_axes
        out_dtype = DTYPE[dtype]
        if not axes:
            if reduction_type == "welford":
                return (v.to(out_dtype), torch.zeros_like(v, dtype=out_dtype), torch.ones_like(v, dtype=out_dtype))
            if reduction_type in ("argmax", "argmin"):
                return torch.zeros_like(v, dtype=torch.int64)
            return v.to(out_dtype)
        if reduction_type == "sum":
            return v.to(out_dtype).sum(dim=axes, keepdim=True)
        if reduction_type == "prod":
            return v.to(out_dtype).prod(dim=axes[0], keepdim=True) if len(axes) == 1 else \
                _flat(v, axes).to(out_dtype).prod(dim=-1).reshape(_kept(v, axes))
        if reduction_type == "max":
            return v.amax(dim=axes, keepdim=True).to(out_dtype)
        if reduction_type == "min":
            return v.amin(dim=axes, keepdim=True).to(out_dtype)
        if reduction_type == "any":
            return _flat(v, axes).bool().any(dim=-1).reshape(_kept(v, axes))
        if reduction_type == "all":
            return _flat(v, axes).bool().all(dim=-1).reshape(_kept(v, axes))
        if reduction_type in ("argmax", "argmin"):
            f = _flat(v, axes)
            fn = torch.argmax if reduction_type == "argmax" else torch.argmin
            return fn(f, dim=-1).reshape(_kept(v, axes))
        if reduction_type == "welford":
            x = v.to(out_dtype)
            mean = x.mean(dim=axes, keepdim=True)
            m2 = ((x - mean) ** 2).sum(dim=axes, keepdim=True)
            count = torch.full_like(mean, float(_flat(v, axes).shape[-1]))
            return (mean, m2, count)
        raise SchedulingError(f"unknown reduction {reduction_type}")

    def getitem(self, value, i):
        return value[i]

    def __getattr__(self, name):
        fn = _MATH.get(name)
        if fn is None:
            raise AttributeError(name)
        return fn


def _flat(v: torch.Tensor, axes: list[int]) -> torch.Tensor:
    keep = [a for a in range(v.dim()) if a not in axes]
    moved = v.permute(keep + axes)
    return moved.reshape([v.shape[a] for a in keep] + [-1])


def _kept(v: torch.Tensor, axes: list[int]) -> list[int]:
    return [1 if a in axes else v.shape[a] for a in range(v.dim())]


_INT64_MAX = 2**63 - 1


def _cost(e: Any) -> int:
    """Steps to evaluate expression ``e``: one per operation, ``n`` for a power ``x**n``."""
    if not isinstance(e, sympy.Basic):
        return 1
    steps = 0
    for node in sympy.preorder_traversal(e):
        steps += 1
        if isinstance(node, sympy.Pow) and node.exp.is_Integer:
            steps += abs(int(node.exp))
    return steps


class _Runner:
    def __init__(self, scheduled: ScheduledProgram, inputs: tuple, limits: RunLimits | None = None):
        self.s = scheduled
        self.prog: LoopProgram = scheduled.program
        self.limits = limits
        self.steps = 0
        self.held_bytes = 0  # (with limits) inputs and allocations: what the run holds throughout
        self.symbols: dict[str, int] = {}
        self.memory: dict[str, torch.Tensor] = {}
        self._bind_symbols(inputs)
        plan = scheduled.plan
        if limits is not None:
            from fireclay_ir.run_limits import value_bytes

            self.held_bytes = limits.check_tensor((value_bytes(list(inputs)),), "uint8", "the input data")
            for name, alloc in plan.allocations.items():
                self.held_bytes += limits.check_tensor((self.value(alloc.nbytes),), "uint8", f"allocation {name}",
                                                       self.held_bytes)
        for name, alloc in plan.allocations.items():
            self.memory[name] = torch.zeros(self.value(alloc.nbytes), dtype=torch.uint8)
        for b, t in zip(self.prog.inputs, inputs):
            self.view(b).copy_(t)

    def _bind_symbols(self, inputs: tuple) -> None:
        if len(inputs) != len(self.prog.inputs):
            raise TypeError(f"the program takes {len(self.prog.inputs)} inputs, got {len(inputs)}")
        for b, t in zip(self.prog.inputs, inputs):
            buf = self.prog.buffers[b]
            if len(buf.size) != t.dim():
                raise TypeError(f"input {b} should have rank {len(buf.size)}, got shape {tuple(t.shape)}")
            for d, n in zip(buf.size, t.shape):
                if isinstance(d, sympy.Symbol):
                    self.symbols.setdefault(d.name, int(n))
        for name, hint in self.prog.symbols.items():
            if hint is not None:
                self.symbols.setdefault(name, hint)

    def step(self, count: int, what: str) -> None:
        """Count ``count`` steps of a limited run (see the module docstring)."""
        if self.limits is None:
            return
        self.steps += count
        if self.steps > self.limits.max_steps:
            raise RunLimitError(f"the run took more than {self.limits.max_steps} steps (kernels, extern calls, "
                                f"loop-body ops and index arithmetic) and was stopped at {what}; raise "
                                "RunLimits.max_steps to run it")

    def evaluate(self, e: sympy.Expr, env: dict[str, Any]) -> Any:
        """``e`` at ``env``; in a limited run, its operations counted and its ints within 64 bits."""
        if self.limits is None:
            return exprs.evaluate(e, env)
        self.step(_cost(e), f"index expression {e}")
        try:
            return exprs.evaluate(e, env, bound=_INT64_MAX)
        except OverflowError as err:
            raise RunLimitError(f"a size or index of the program is too large: {err}") from None

    def value(self, e: Any) -> int:
        return int(self.evaluate(exprs.as_expr(e), self.symbols))

    def storage(self, buf: str) -> torch.Tensor:
        b = self.prog.buffers[buf]
        raw = self.memory[self.s.plan.buffer_allocation[buf]]
        n = self.value(b.storage_numel)
        return raw[: n * b.itemsize].view(DTYPE[b.dtype])

    def view(self, buf: str) -> torch.Tensor:
        b = self.prog.buffers[buf]
        return self.storage(buf).as_strided([self.value(s) for s in b.size], [self.value(s) for s in b.stride],
                                            self.value(b.offset))

    def run_kernel(self, k: Kernel) -> None:
        xs = [self.value(s) for s in k.xsizes]
        rs = [self.value(s) for s in k.rsizes]
        grid = xs + rs
        kvars = k.xvars + k.rvars
        internal: dict = {}
        self.step(1, f"kernel {k.name}")
        for buf in k.accumulated_buffers():
            self.storage(buf).zero_()
        for kn in k.nodes:
            self.step(len(kn.node.body.ops), f"kernel {k.name}")
            env: dict[str, Any] = dict(self.symbols)
            for axis, v in enumerate(kvars):
                shape = [1] * len(grid)
                shape[axis] = grid[axis]
                env[v.name] = torch.arange(grid[axis], dtype=torch.int64).reshape(shape)
            raxes = [kvars.index(kn.var_map[r]) for r in kn.node.body.reduction_vars]
            kn.node.body.run(_NodeHandler(self, k, env, internal, raxes, grid), kn.var_map)

    def run_extern(self, n: ExternNode) -> None:
        def arg(a: Any) -> Any:
            if isinstance(a, TensorArg):
                return self.storage(a.buffer).as_strided([self.value(s) for s in a.size],
                                                         [self.value(s) for s in a.stride], self.value(a.offset))
            if isinstance(a, sympy.Basic):
                return self.value(a)
            if isinstance(a, (list, tuple)):
                return type(a)(arg(x) for x in a)
            kind = type(a).__name__
            if kind == "DType":
                return DTYPE[a.name]
            if kind == "Device":
                return torch.device(a.name)
            if kind == "Layout":
                return getattr(torch, a.name)
            if kind == "MemoryFormat":
                return getattr(torch, a.name)
            return a

        self.step(1, f"extern call {n.name} ({n.op})")
        fn = aten_op(n.op, SchedulingError)
        result = fn(*arg(n.args), **{k: arg(v) for k, v in n.kwargs.items()})
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        for buf, k in zip(n.outputs, n.result_positions()):
            target = self.view(buf)
            if target.shape != results[k].shape:  # declared in the shape the program returns it
                target = target.view(results[k].shape)
            target.copy_(results[k])

    def outputs(self) -> tuple:
        out = []
        for o in self.prog.outputs:
            if isinstance(o, Constant):
                out.append(self.value(o.value) if isinstance(o.value, sympy.Basic) else o.value)
            else:
                out.append(self.view(o).clone())
        return tuple(out)


def run(scheduled: ScheduledProgram, *inputs: torch.Tensor, limits: RunLimits | None = None) -> tuple:
    """Run a scheduled program on real tensors; returns its outputs as a tuple. ``limits``: a
    program from a source you do not control runs bounded in steps and bytes (see the module
    docstring), raising :class:`fireclay_ir.RunLimitError` before it crosses one."""
    if limits is None:
        return _run(_Runner(scheduled, inputs))
    from fireclay_ir.run_limits import allocation_guard

    runner = _Runner(scheduled, inputs, limits)
    with torch.no_grad(), allocation_guard(lambda: limits.max_bytes - runner.held_bytes):
        return _run(runner)


def _run(runner: _Runner) -> tuple:
    for step in runner.s.steps:
        if isinstance(step, Kernel):
            runner.run_kernel(step)
        else:
            runner.run_extern(step)
    return runner.outputs()
