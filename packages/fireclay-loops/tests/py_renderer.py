"""A third code generator on fireclay-loops' kernel-emission kit, small on purpose: each kernel
of a scheduled program becomes a plain Python function of nested ``for`` loops over flat lists
(docs/writing-a-backend.md walks through it). Values are Python floats, ints and bools; a
reduction keeps an accumulator variable declared before its loop. No extern calls, no symbolic
sizes, no random numbers: what it cannot render raises ``NotImplementedError``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy
import torch

from fireclay_loops import Kernel
from fireclay_loops.backend import (
    REDUCTIONS,
    KernelEmitter,
    KernelOps,
    Scope,
    Value,
    indent,
    py_expr,
    to_scheduled,
)

# -- op templates: ``{a}``, ``{b}`` are operand names
UNARY = {"neg": "-{a}", "abs": "abs({a})", "exp": "math.exp({a})", "log": "math.log({a})",
         "sqrt": "math.sqrt({a})", "rsqrt": "1.0 / math.sqrt({a})", "tanh": "math.tanh({a})",
         "erf": "math.erf({a})", "sin": "math.sin({a})", "cos": "math.cos({a})",
         "sigmoid": "1.0 / (1.0 + math.exp(-{a}))", "relu": "max({a}, 0.0)", "reciprocal": "1.0 / {a}",
         "square": "{a} * {a}", "logical_not": "not {a}"}
BINARY = {"add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "truediv": "{a} / {b}",
          "maximum": "max({a}, {b})", "minimum": "min({a}, {b})", "pow": "{a} ** {b}", "eq": "{a} == {b}",
          "ne": "{a} != {b}", "lt": "{a} < {b}", "le": "{a} <= {b}", "gt": "{a} > {b}", "ge": "{a} >= {b}",
          "logical_and": "{a} and {b}", "logical_or": "{a} or {b}"}
CAST = {"bool": "bool", "float32": "float", "float64": "float", "int64": "int", "int32": "int"}
PYTHON_TYPE = {"bool": bool, "float": float, "int": int}


def literal(value: float | int, dtype: str) -> str:
    """Python text of ``value`` as a ``dtype`` (``float('inf')`` where repr will not do)."""
    v = PYTHON_TYPE[CAST[dtype]](value)
    return repr(v) if not isinstance(v, float) or math.isfinite(v) else f"float({str(v)!r})"


@dataclass(eq=False, kw_only=True)
class PyValue(Value):
    varying: bool = False  # changes along the reduction loop
    parts: tuple[str, ...] = ()  # welford: the names of mean, m2 and count

    def in_loop(self) -> bool:
        return self.varying


class PyOps(KernelOps):
    """The op templates: each ``ops.*`` call becomes one Python assignment."""

    def __init__(self, gen: PyKernel):
        super().__init__(gen)
        self.gen = gen

    def _val(self, expr: str, deps: list[PyValue], varying: bool = False) -> PyValue:
        def make() -> PyValue:
            name = self.gen.fresh("t")
            return PyValue(name=name, code=f"{name} = {expr}", deps=deps,
                           varying=varying or any(d.varying for d in deps))

        return self.gen.cached((expr, tuple(id(d) for d in deps)), make)

    def _index(self, index) -> tuple[str, list[PyValue], bool]:
        names = {s.name for s in sympy.sympify(index).free_symbols}
        deps = [self.gen.indirect[n] for n in sorted(names) if n in self.gen.indirect]
        return py_expr(index), deps, bool(names & self.gen.rnames)

    # memory: the kit's load, masked_load and store keep internal buffers as values
    def load_memory(self, buf, index, mask):
        text, deps, varying = self._index(index)
        if mask is None:
            return self._val(f"{buf}[{text}]", deps, varying)
        return self._val(f"{buf}[{text}] if {mask.name} else 0", deps + [mask], varying)

    def masked(self, value, mask):
        return self._val(f"{value.name} if {mask.name} else 0", [value, mask])

    def store_memory(self, buf, index, value):
        text, deps, varying = self._index(index)
        self.gen.cse.clear()  # loads of this buffer are stale now
        self.gen.roots.append(PyValue(name="", code=f"{buf}[{text}] = {value.name}", deps=deps + [value],
                                      varying=varying or value.varying))

    def constant(self, value, dtype):
        if dtype not in CAST:
            raise NotImplementedError(f"the Python renderer has no dtype {dtype}")
        return self._val(literal(value, dtype), [])

    def index_expr(self, expr, dtype):
        text, deps, varying = self._index(expr)
        return self._val(f"{CAST[dtype]}({text})", deps, varying)

    def to_dtype(self, x, dtype):
        if dtype not in CAST:
            raise NotImplementedError(f"the Python renderer has no dtype {dtype}")
        return self._val(f"{CAST[dtype]}({x.name})", [x])

    def indirect_indexing(self, value, size, name):
        self.gen.indirect[name] = PyValue(name=name, code=f"{name} = int({value.name})", deps=[value],
                                          varying=value.varying)

    def getitem(self, value, i):
        return PyValue(name=value.parts[int(i)], code="", deps=[value])

    def unary(self, name, a):
        if name not in UNARY:
            raise NotImplementedError(f"the Python renderer has no ops.{name}")
        return self._val(UNARY[name].format(a=a.name), [a])

    def binary(self, name, a, b):
        if name not in BINARY:
            raise NotImplementedError(f"the Python renderer has no ops.{name}")
        return self._val(BINARY[name].format(a=a.name, b=b.name), [a, b])

    def where(self, c, a, b):
        return self._val(f"{a.name} if {c.name} else {b.name}", [c, a, b])

    def accumulate(self, kind, *, dtype, src_dtype, value):
        """A reduction of one part, rendered from its form: the start, then the fold in the
        op templates (argmax and argmin keep an index too: not rendered here)."""
        form = REDUCTIONS[kind]
        if not form.fold:
            raise NotImplementedError(f"the Python renderer has no {kind} reduction")
        acc = self.gen.fresh("acc")
        self.gen.inits.append(f"{acc} = {literal(form.start_value(dtype), 'bool' if form.truth else dtype)}")
        v = f"{value.name} != 0" if form.truth else value.name
        update = f"{acc} = {BINARY[form.fold].format(a=acc, b=v)}"
        self.gen.roots.append(PyValue(name="", code=update, deps=[value], varying=True))
        return PyValue(name=acc, code="")

    def reduce_welford(self, *, dtype, src_dtype, value):
        acc = self.gen.fresh("acc")
        self.gen.inits.append(f"{acc}_mean = {acc}_m2 = {acc}_n = 0.0")
        self.gen.roots.append(PyValue(name="", code="\n".join([
            f"{acc}_n += 1.0", f"{acc}_d = {value.name} - {acc}_mean", f"{acc}_mean += {acc}_d / {acc}_n",
            f"{acc}_m2 += {acc}_d * ({value.name} - {acc}_mean)"]), deps=[value], varying=True))
        return PyValue(name=acc, code="", parts=(f"{acc}_mean", f"{acc}_m2", f"{acc}_n"))


class PyKernel(KernelEmitter):
    """The placement hooks: the loops over ``x`` around everything, one loop over ``r`` per stage;
    accumulators start before their loop and are read after it."""

    def __init__(self, kernel: Kernel):
        super().__init__(kernel)
        self.inits: list[str] = []

    def generate(self) -> str:
        k = self.kernel
        if any(not sympy.sympify(s).is_Integer for s in k.xsizes + k.rsizes):
            raise NotImplementedError("the Python renderer needs static sizes")
        outer = Scope()
        for nodes in self.stages().values():
            self.roots, self.inits = [], []
            for kn in nodes:
                kn.node.body.run(PyOps(self), kn.var_map)
            loop = Scope(parent=outer)
            loop.place_all(v for v in self.roots if v.in_loop())
            outer.lines += self.inits
            if loop.lines:
                heads = [f"for {v.name} in range({s}):" for v, s in zip(k.rvars, k.rsizes)]
                outer.lines += _nest(heads, loop.lines)
            outer.place_all(v for v in self.roots if not v.in_loop())
        heads = [f"for {v.name} in range({s}):" for v, s in zip(k.xvars, k.xsizes)]
        return "\n".join([f"def {k.name}({', '.join(sorted(self.buffers))}):"] + indent(_nest(heads, outer.lines),
                                                                                         "    ")) + "\n"


def _nest(heads: list[str], body: list[str]) -> list[str]:
    for head in reversed(heads):
        body = [head] + indent(body, "    ")
    return body


def compile_python(program) -> tuple[str, object]:
    """The Python source of every kernel of ``program`` and a callable running them."""
    scheduled = to_scheduled(program)
    prog = scheduled.program
    kernels = {}
    for step in scheduled.steps:
        if not isinstance(step, Kernel):
            raise NotImplementedError(f"the Python renderer has no extern calls ({step.name})")
        kernels[step.name] = PyKernel(step).generate()
    source = "import math\n\n" + "\n".join(kernels.values())
    namespace: dict = {}
    exec(compile(source, "<python renderer>", "exec"), namespace)

    def call(*inputs):
        memory = {name: [0] * max(prog.hint(buf.storage_numel), 1) for name, buf in prog.buffers.items()}
        for name, t in zip(prog.inputs, inputs):
            buf, flat = prog.buffers[name], torch.zeros(len(memory[name]), dtype=t.dtype)
            flat.as_strided(t.shape, tuple(int(s) for s in buf.stride), int(buf.offset)).copy_(t)
            memory[name] = flat.tolist()
        for step in scheduled.steps:
            fn = namespace[step.name]
            fn(*[memory[b] for b in fn.__code__.co_varnames[:fn.__code__.co_argcount]])
        outs = []
        for name in prog.outputs:
            buf = prog.buffers[name]
            flat = torch.tensor(memory[name], dtype=getattr(torch, buf.dtype))
            outs.append(flat.as_strided(tuple(int(s) for s in buf.size), tuple(int(s) for s in buf.stride),
                                        int(buf.offset)))
        return tuple(outs)

    return source, call

