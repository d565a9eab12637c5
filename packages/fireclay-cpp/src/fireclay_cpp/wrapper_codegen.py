"""The call sequence: a generated Python function for what needs torch (checking inputs,
allocating, extern aten ops, outputs) and generated C++ entries for the kernels in between.

Consecutive kernels (between two extern calls, in one library) form a *run*: one ``extern "C"``
entry ``runN(const int64_t* args)`` that calls them in order, so Python enters C++ once per run
(once per call when the program has no extern ops). ``args`` packs every pointer and size the
run needs in one array; a buffer's address is a slot of it, or the arena's slot plus a constant.

Memory: intermediates of static size live in one *arena*, one allocation per call, at offsets
packed by lifetime (two buffers share bytes only if no step uses both), so the arena is about
the program's peak of live intermediates. Extern ops write into the arena through their ``out=``
overload where they have one. Outputs are tensors of their own; intermediates of symbolic size
follow the memory plan's allocations. Every buffer is addressed by its index 0 (the origin of
its index expressions); views for extern calls and outputs are ``as_strided`` of that origin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy

from fireclay_cpp.errors import CodegenError
from fireclay_cpp.prelude import CTYPES
from fireclay_loops import Constant, ExternNode, Kernel, ScheduledProgram
from fireclay_loops.codegen_support import WrapperText, py_expr, py_shape

ARENA_ALIGN = 64  # bytes: each arena buffer starts on a cache line (and any dtype's alignment)

_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
             "int8": 1, "uint8": 1, "bool": 1}


@dataclass
class RunSource:
    """One C++ entry that runs consecutive kernels of one library."""

    name: str
    library: int
    kernels: list[str]
    source: str
    slots: int  # entries of its int64 argument array


class WrapperSource(WrapperText):
    """Generated wrapper text, the C++ runs it calls, and the objects its namespace needs."""

    def __init__(self) -> None:
        super().__init__()
        self.out_ops: dict[str, str] = {}  # variable -> aten op name whose out= it calls
        self.runs: list[RunSource] = []
        self.arena_bytes = 0

    def out_op(self, name: str) -> str:
        var = "out_" + name.replace("::", "_").replace(".", "_")
        self.out_ops[var] = name
        return var


def pack_arena(sizes: dict[str, int], lifetimes: dict[str, tuple[int, int]]) -> tuple[dict[str, int], int]:
    """Byte offsets for buffers of static size: largest first, each at the lowest offset that
    overlaps no placed buffer whose lifetime (first step, last step) meets its own."""
    offsets: dict[str, int] = {}
    total = 0
    for b in sorted(sizes, key=lambda n: (-sizes[n], lifetimes[n][0], n)):
        first, last = lifetimes[b]
        busy = sorted((offsets[o], offsets[o] + sizes[o]) for o in offsets
                      if lifetimes[o][0] <= last and first <= lifetimes[o][1])
        at = 0
        for start, end in busy:
            if at + sizes[b] <= start:
                break
            at = max(at, -(-end // ARENA_ALIGN) * ARENA_ALIGN)
        offsets[b] = at
        total = max(total, at + sizes[b])
    return offsets, -(-total // ARENA_ALIGN) * ARENA_ALIGN


class _Gen:
    def __init__(self, scheduled: ScheduledProgram, kernel_args: dict[str, tuple[list[str], list[str]]],
                 library_of: dict[str, int], has_out: Any):
        self.scheduled = scheduled
        self.prog = scheduled.program
        self.plan = scheduled.plan
        self.kernel_args = kernel_args
        self.library_of = library_of
        self.has_out = has_out  # op name -> name of its single out argument, or None
        self.w = WrapperSource()
        prog, plan = self.prog, self.plan
        outputs = {o for o in prog.outputs if not isinstance(o, Constant)}
        steps = scheduled.steps
        # Buffers whose extern result is taken as is (no out= overload, or a program output).
        self.bound_results: set[str] = set()
        self.out_name: dict[str, str] = {}  # extern step name -> out argument name
        for step in steps:
            if not isinstance(step, ExternNode):
                continue
            out = has_out(step.op) if len(step.outputs) == 1 else None
            b = step.outputs[0] if step.outputs else None
            static = b is not None and self._static_nbytes(b) is not None
            if out and static and b not in outputs and step.result_positions() == [0]:
                self.out_name[step.name] = out
            else:
                self.bound_results.update(step.outputs)
        self.outputs = outputs
        # Buffers some code touches (a kernel may recompute a buffer instead of storing it).
        used = set(outputs) | {b for args, _ in kernel_args.values() for b in args}
        for step in steps:
            if isinstance(step, ExternNode):
                used.update(step.read_buffers(), step.write_buffers())
        sizes, lifetimes = {}, {}
        for b in plan.buffer_allocation:
            buf = prog.buffers[b]
            if (buf.is_input or b in outputs or b in self.bound_results or b not in plan.lifetimes
                    or b not in used):
                continue
            n = self._static_nbytes(b)
            if n is not None:
                sizes[b] = max(n, 1)
                lifetimes[b] = plan.lifetimes[b]
        self.arena, self.w.arena_bytes = pack_arena(sizes, lifetimes)
        # Program outputs and symbolic-size intermediates: tensors of their own, made in Python.
        self.own = {b for b in plan.buffer_allocation
                    if b not in self.arena and not prog.buffers[b].is_input and b in used}
        # ... of which those typed into the plan's shared allocations (symbolic sizes).
        self.in_mems = {b for b in self.own if b not in outputs and b not in self.bound_results
                        and not sympy.sympify(plan.allocations[plan.buffer_allocation[b]].nbytes).is_Integer}
        self.typed_arena: set[str] = set()  # dtypes whose view of the arena is bound
        self.mems: set[str] = set()

    def _static_nbytes(self, b: str) -> int | None:
        n = sympy.sympify(self.prog.buffers[b].nbytes)
        return int(n) if n.is_Integer else None

    # -- Python side
    def generate(self) -> WrapperSource:
        prog, w = self.prog, self.w
        w.lines.append(f"def call({', '.join(prog.inputs)}):")
        w.bind_sizes(prog)
        for name in prog.inputs:
            buf = prog.buffers[name]
            size, stride = py_shape(buf.size), py_shape(buf.stride)
            slow = (f"{name} = as_base({name}, {name!r}, torch.{buf.dtype}, {size}, {stride}, {py_expr(buf.offset)}, "
                    f"{py_expr(buf.storage_numel)})")
            if buf.offset != 0:
                w.line(slow)
                continue
            # Fast path: the layout compiled for; otherwise as_base checks, explains or copies.
            w.line(f"if not (type({name}) in tensor_types and {name}.dtype is torch.{buf.dtype} and {name}.is_cpu "
                   f"and {name}.shape == {size} and {name}.stride() == {stride} and {name}.storage_offset() == 0):")
            w.line(slow, 2)
        w.line("nthreads = get_num_threads()")
        if w.arena_bytes:
            w.line(f"arena = torch.empty({w.arena_bytes}, dtype=torch.uint8)")
            w.line("arena_ptr = arena.data_ptr()")
        steps = self.scheduled.steps
        k = 0
        while k < len(steps):
            step = steps[k]
            if isinstance(step, ExternNode):
                self._allocate(k)
                self._extern_call(step)
                self._free(k)
                k += 1
                continue
            run = [k]
            lib = self.library_of[step.name]
            while (run[-1] + 1 < len(steps) and isinstance(steps[run[-1] + 1], Kernel)
                   and self.library_of[steps[run[-1] + 1].name] == lib):
                run.append(run[-1] + 1)
            for j in run:
                self._allocate(j)
            self._run(run, lib)
            for j in run:
                self._free(j)
            k = run[-1] + 1
        self._return()
        return w

    def _allocate(self, k: int) -> None:
        prog, plan, w = self.prog, self.plan, self.w
        step = self.scheduled.steps[k]
        produced = set(step.outputs) if isinstance(step, ExternNode) else set()
        for b in plan.allocate_before.get(k, []):
            if b not in self.own or b in self.bound_results & produced:
                continue
            buf = prog.buffers[b]
            if b not in self.in_mems:
                if buf.offset == 0:
                    w.line(f"{b} = torch.empty_strided({py_shape(buf.size)}, {py_shape(buf.stride)}, "
                           f"dtype=torch.{buf.dtype})")
                else:
                    w.line(f"{b} = torch.empty({py_expr(buf.storage_numel)}, dtype=torch.{buf.dtype})")
                continue
            a = plan.buffer_allocation[b]
            if a not in self.mems:
                w.line(f"{a} = torch.empty({py_expr(plan.allocations[a].nbytes)}, dtype=torch.uint8)")
                self.mems.add(a)
            w.line(f"{b} = typed({a}, torch.{buf.dtype}, {py_expr(buf.nbytes)})")

    def _free(self, k: int) -> None:
        for b in self.plan.free_after.get(k, []):
            if b in self.own and b not in self.outputs:
                self.w.line(f"del {b}")

    def _view(self, b: str, size, stride, offset) -> str:
        """A tensor expression for a strided view of buffer ``b`` (at its index 0 + ``offset``)."""
        if b in self.arena:
            dtype = self.prog.buffers[b].dtype
            var = f"arena_{dtype}"
            if dtype not in self.typed_arena:
                self.w.line(f"{var} = arena.view(torch.{dtype})")
                self.typed_arena.add(dtype)
            start = self.arena[b] // _ITEMSIZE[dtype]
            return f"{var}.as_strided({py_shape(size)}, {py_shape(stride)}, {py_expr(sympy.sympify(offset) + start)})"
        buf = self.prog.buffers[b]
        if (buf.offset == 0 and offset == 0 and list(size) == list(buf.size) and list(stride) == list(buf.stride)
                and b not in self.in_mems):
            return b  # the base tensor has this layout already
        return f"view({b}, {py_shape(size)}, {py_shape(stride)}, {py_expr(offset)})"

    def _extern_call(self, step: ExternNode) -> None:
        prog, w = self.prog, self.w

        call_args = w.extern_args(step, lambda a: self._view(a.buffer, a.size, a.stride, a.offset))
        for b in step.outputs:
            if b not in prog.buffers:
                raise CodegenError(f"extern call {step.name} writes {b}, which the program does not declare")
        if step.name in self.out_name:
            b = step.outputs[0]
            buf = prog.buffers[b]
            out = self._view(b, buf.size, buf.stride, buf.offset)
            fn = w.out_op(step.op)
            w.line(f"{fn}({', '.join(call_args + [f'{self.out_name[step.name]}={out}'])})  # {step.kind} {step.name}")
            return
        fn = w.op(step.op)
        w.call_extern(fn, call_args, step)
        for i, b in zip(step.result_positions(), step.outputs):
            buf = prog.buffers[b]
            if b in self.bound_results and buf.offset == 0:
                w.line(f"{b} = conform(results[{i}], {py_shape(buf.size)}, {py_shape(buf.stride)})")
            else:
                if b in self.bound_results:
                    w.line(f"{b} = torch.empty({py_expr(buf.storage_numel)}, dtype=torch.{buf.dtype})")
                w.line(f"{self._view(b, buf.size, buf.stride, buf.offset)}.copy_(results[{i}])")

    def _return(self) -> None:
        outs = []
        for o in self.prog.outputs:
            if isinstance(o, Constant):
                outs.append(self.w.literal(o.value))
                continue
            buf = self.prog.buffers[o]
            if buf.is_input or buf.offset != 0 or o not in self.own:
                outs.append(self._view(o, buf.size, buf.stride, buf.offset))
            else:
                outs.append(o)
        self.w.line("return (" + "".join(f"{x}, " for x in outs) + ")")

    # -- C++ side
    def _run(self, run: list[int], lib: int) -> None:
        prog, w = self.prog, self.w
        steps = self.scheduled.steps
        slots: list[str] = []  # Python expressions, in array order

        def slot(expr: str) -> int:
            if expr not in slots:
                slots.append(expr)
            return slots.index(expr)

        calls = []
        for j in run:
            kernel = steps[j]
            buffers, symbols = self.kernel_args[kernel.name]
            args = []
            for b in buffers:
                t = CTYPES[prog.buffers[b].dtype][0]
                if b in self.arena:
                    args.append(f"({t}*)(fc_arena + {self.arena[b]})")
                else:
                    args.append(f"({t}*)fc_args[{slot(self._pointer(b))}]")
            args += [f"fc_args[{slot(s)}]" for s in symbols]
            calls.append(f"  {kernel.name}({', '.join(args)});")
        threads = slot("nthreads")
        head = [f'extern "C" void run{len(w.runs)}(const int64_t* fc_args) {{',
                f"  fc_set_threads(fc_args[{threads}]);"]
        if w.arena_bytes and any("fc_arena" in c for c in calls):
            head.append(f"  char* fc_arena = (char*)fc_args[{slot('arena_ptr')}];")
        name = f"run{len(w.runs)}"
        kernels = [steps[j].name for j in run]
        source = "\n".join(head + calls + ["}"]) + "\n"
        w.runs.append(RunSource(name, lib, kernels, source, len(slots)))
        w.line(f"{name}(pack{name}({', '.join(slots)}))  # {', '.join(kernels)}")

    def _pointer(self, b: str) -> str:
        if b in self.in_mems:
            return f"{self.plan.buffer_allocation[b]}.data_ptr()"
        return f"{b}.data_ptr()"


def generate_wrapper(scheduled: ScheduledProgram, kernel_args: dict[str, tuple[list[str], list[str]]],
                     library_of: dict[str, int] | None = None, has_out: Any = None) -> WrapperSource:
    """``kernel_args`` maps each kernel to its (buffer, symbol) arguments, in order;
    ``library_of`` each kernel to the library holding it (default: all in one); ``has_out`` an
    aten op name to the name of its single ``out=`` argument, or None where it has none."""
    library_of = library_of or {k: 0 for k in kernel_args}
    return _Gen(scheduled, kernel_args, library_of, has_out or (lambda op: None)).generate()

