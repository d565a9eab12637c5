"""The call sequence: a generated Python function for what needs torch (checking inputs,
allocating, extern aten ops, outputs) and generated C++ entries for the kernels in between.

Consecutive kernels (between two extern calls, in one library) form a *run*: one ``extern "C"``
entry ``runN(const int64_t* args)`` that calls them in order, so Python enters C++ once per run
(once per call when the program has no extern ops). ``args`` packs every pointer and size the
run needs in one array; a buffer's address is a slot of it, or the arena's slot plus a constant.

Memory: intermediates of static size live in one *arena*, at offsets packed by lifetime (two
buffers share bytes only if no step uses both), so the arena is about the program's peak of live
intermediates. Extern ops write into the arena through their ``out=`` overload where they have
one. Outputs are tensors of their own; intermediates of symbolic size follow the memory plan's
allocations. Every buffer is addressed by its index 0 (the origin of its index expressions);
views for extern calls and outputs are ``as_strided`` of that origin.

The arena and every static view of it form a *workspace*, made by the generated
``new_workspace()`` (one tensor per distinct view, not one per use). A program whose arena is
small (``Config.keep_arena_bytes``) keeps its workspace for the next call: making a tensor costs
about 1-2 µs, as much as a small kernel. A call takes the kept workspace (or makes one when
another call holds it, from another thread) and gives it back when it returns, unless an output
shares its memory (an extern op that returned a view of its input). A larger arena (up to
``Config.reuse_arena_bytes``) comes from the process's one kept block (``runtime.ArenaStore``),
given back on the same terms, and only its views are made per call: an arena allocated every
call costs a page fault per 4 KiB of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy

from fireclay_cpp.errors import CodegenError
from fireclay_cpp.prelude import CTYPES
from fireclay_loops import Constant, ExternNode, Kernel, ScheduledProgram, TensorArg
from fireclay_loops.backend import WrapperText, constant_size, py_expr, py_shape
from fireclay_loops.dtypes import ITEMSIZE

ARENA_ALIGN = 64  # bytes: each arena buffer starts on a cache line (and any dtype's alignment)


@dataclass
class RunSource:
    """One C++ entry that runs consecutive kernels of one library."""

    name: str
    library: int
    kernels: list[str]
    source: str
    slots: int  # entries of its int64 argument array
    checks: bool = False  # its kernels check (fireclay-loops' ops.check_*): it returns nonzero on a failure


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
                 library_of: dict[str, int], has_out: Any, externs: ExternCalls,
                 kernel_checks: dict[str, list] | None = None):
        self.scheduled = scheduled
        self.kernel_checks = kernel_checks or {}  # kernel -> its CheckSites
        self.externs = externs
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
            static = b is not None and constant_size(self.prog.buffers[b].nbytes) is not None
            if out and static and b not in outputs and step.result_positions() == [0]:
                self.out_name[step.name] = out
            else:
                self.bound_results.update(step.outputs)
        self.outputs = outputs
        # Buffers some code touches (a kernel may recompute a buffer instead of storing it).
        used = set(outputs) | {b for args, _ in kernel_args.values() for b in args}
        read = set(used)
        for step in steps:
            if isinstance(step, ExternNode):
                used.update(step.read_buffers(), step.write_buffers())
                read.update(step.read_buffers())
        # Extern results nothing reads (attention's log-sum-exp in inference): never bound.
        self.unread = {b for b in self.bound_results if b not in read}
        sizes, lifetimes = {}, {}
        for b in plan.buffer_allocation:
            buf = prog.buffers[b]
            if (buf.is_input or b in outputs or b in self.bound_results or b not in plan.lifetimes
                    or b not in used):
                continue
            n = constant_size(self.prog.buffers[b].nbytes)
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
        self.typed_arena: dict[str, None] = {}  # dtypes whose view of the arena the workspace holds
        self.arena_views: dict[str, str] = {}  # view expression -> its variable in the workspace
        self.call_views: dict[str, str] = {}  # view expression -> the local holding it this call
        self.views_of: dict[str, list[str]] = {}  # buffer -> locals viewing it (deleted with it)
        self.keep_arena = 0 < self.w.arena_bytes <= externs.keep_arena_bytes
        self.reuse_arena = not self.keep_arena and 0 < self.w.arena_bytes <= externs.reuse_arena_bytes
        self.mems: set[str] = set()

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
            # Fast path: the layout compiled for (a row-major one by the tensor's own flag: the
            # strides of extent-1 dims, which it ignores, address nothing); otherwise as_base
            # checks, explains or copies. Kernels take data_ptr(), so any storage offset will do.
            layout = f"{name}.is_contiguous()" if _row_major(buf.size, buf.stride) else f"{name}.stride() == {stride}"
            w.line(f"if not (type({name}) in tensor_types and {name}.dtype is torch.{buf.dtype} and {name}.is_cpu "
                   f"and {name}.shape == {size} and {layout}):")
            w.line(slow, 2)
        w.line("nthreads = get_num_threads()")
        workspace_at = len(w.lines)  # its lines go here once every view of the arena is known
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
        if w.arena_bytes:
            w.lines[workspace_at:workspace_at] = self._take_workspace()
            w.lines += self._workspace_function()
        return w

    def _workspace_names(self) -> list[str]:
        return (["arena", "arena_ptr"] + [f"arena_{dtype}" for dtype in self.typed_arena]
                + list(self.arena_views.values()))

    def _take_workspace(self) -> list[str]:
        names = ", ".join(self._workspace_names())
        if not self.keep_arena:
            return [f"    {names} = new_workspace()"]
        return ["    ws = workspaces.pop() if workspaces else new_workspace()", f"    {names} = ws"]

    def _workspace_function(self) -> list[str]:
        """``new_workspace()``: the arena, its address, and its views. A kept workspace is made
        outside inference mode, so that later calls in normal mode may write into it."""
        size = self.w.arena_bytes
        body = [f"arena = take_arena({size})" if self.reuse_arena else f"arena = torch.empty({size}, dtype=torch.uint8)"]
        body += [f"arena_{dtype} = arena.view(torch.{dtype})" for dtype in self.typed_arena]
        body.append("return (" + ", ".join(["arena", "arena.data_ptr()"] + [f"arena_{dtype}" for dtype in self.typed_arena]
                                          + list(self.arena_views)) + ",)")
        if not self.keep_arena:
            return ["", "def new_workspace():"] + ["    " + line for line in body]
        return (["", "def new_workspace():", "    with torch.inference_mode(False):"]
                + ["        " + line for line in body])

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
            if b in self.own and b not in self.outputs and b not in self.unread:
                self.w.line(f"del {', '.join([b] + self.views_of.pop(b, []))}")

    def _view(self, b: str, size, stride, offset) -> str:
        """A tensor expression for a strided view of buffer ``b`` (at its index 0 + ``offset``):
        the buffer itself, a workspace view, or a view made once per call into a local."""
        text, made = self._view_text(b, size, stride, offset)
        if not made:
            return text
        if text not in self.call_views:
            var = self.call_views[text] = f"v{len(self.call_views)}"
            self.views_of.setdefault(b, []).append(var)
            self.w.line(f"{var} = {text}")
        return self.call_views[text]

    def _view_text(self, b: str, size, stride, offset) -> tuple[str, bool]:
        """The expression of a view of ``b``, and whether it makes a tensor per call."""
        if b in self.arena:
            dtype = self.prog.buffers[b].dtype
            self.typed_arena[dtype] = None
            start = sympy.sympify(offset) + self.arena[b] // ITEMSIZE[dtype]
            text = f"arena_{dtype}.as_strided({py_shape(size)}, {py_shape(stride)}, {py_expr(start)})"
            if not all(sympy.sympify(x).is_Integer for x in (*size, *stride, start)):
                return text, True  # a symbolic view
            if text not in self.arena_views:
                self.arena_views[text] = f"ws{len(self.arena_views)}"
            return self.arena_views[text], False
        buf = self.prog.buffers[b]
        if b not in self.in_mems and buf.offset == 0 and offset == 0:
            if list(size) == list(buf.size) and list(stride) == list(buf.stride):
                return b, False  # the base tensor has this layout already
            if _row_major(size, stride) and _row_major(buf.size, buf.stride) and _numel(size) == _numel(buf.size):
                # another shape of the whole row-major buffer: Tensor.view is cheaper than as_strided
                return f"{b}.view({py_shape(size)})", True
        return f"view({b}, {py_shape(size)}, {py_shape(stride)}, {py_expr(offset)})", True

    def _extern_call(self, step: ExternNode) -> None:
        prog, w = self.prog, self.w

        for b in step.outputs:
            if b not in prog.buffers:
                raise CodegenError(f"extern call {step.name} writes {b}, which the program does not declare")
        linear = self._linear_args(step)
        if linear is not None:
            fn, call_args = "linear", linear
        else:
            call_args = w.extern_args(step, lambda a: self._view(a.buffer, a.size, a.stride, a.offset))
        if step.name in self.out_name:
            b = step.outputs[0]
            buf = prog.buffers[b]
            out = self._view(b, buf.size, buf.stride, buf.offset)
            fn = fn if linear is not None else w.out_op(step.op)
            w.line(f"{fn}({', '.join(call_args + [f'{self.out_name[step.name]}={out}'])})  # {step.kind} {step.name}")
            return
        fn = fn if linear is not None else w.op(step.op)
        single = step.result_positions() == [0] and (linear is not None or self.externs.returns_one_tensor(step.op))
        results = w.extern_results(fn, call_args, step, single)
        for i, b in zip(step.result_positions(), step.outputs):
            buf = prog.buffers[b]
            if b in self.unread:
                continue
            if b in self.bound_results and buf.offset == 0:
                r, size, stride = results[i], py_shape(buf.size), py_shape(buf.stride)
                # the common case (the library returned the planned layout) checked inline
                w.line(f"{b} = {r} if {r}.stride() == {stride} and {r}.shape == {size} else conform({r}, {size}, {stride})")
            else:
                if b in self.bound_results:
                    w.line(f"{b} = torch.empty({py_expr(buf.storage_numel)}, dtype=torch.{buf.dtype})")
                w.line(f"{self._view(b, buf.size, buf.stride, buf.offset)}.copy_({results[i]})")

    def _linear_args(self, step: ExternNode) -> list[str] | None:
        """``linear(x, w, bias)`` arguments for ``addmm(bias, x, m)`` / ``mm(x, m)`` whose ``m`` is
        the transpose of a row-major matrix ``w`` the wrapper holds as a tensor (a weight): the
        same BLAS call, with the transposed view made in C++ instead of as a Python tensor."""
        if not self.externs.linear_out or step.kwargs:
            return None
        if step.op == "aten::addmm.default" and len(step.args) == 3:
            bias, x, m = step.args
        elif step.op == "aten::mm.default" and len(step.args) == 2:
            bias, (x, m) = None, step.args
        else:
            return None
        tensors = (x, m) if bias is None else (x, m, bias)
        if not all(isinstance(a, TensorArg) for a in tensors) or len(m.size) != 2:
            return None
        k, n = (sympy.sympify(d) for d in m.size)
        if not (k.is_Integer and n.is_Integer) or [sympy.sympify(d) for d in m.stride] != [1, k]:
            return None
        if self._view_text(m.buffer, (n, k), (k, 1), m.offset)[1]:
            return None  # a view made per call either way: nothing to gain
        weight = self._view(m.buffer, (n, k), (k, 1), m.offset)
        args = [self._view(x.buffer, x.size, x.stride, x.offset), weight]
        return args + ([self._view(bias.buffer, bias.size, bias.stride, bias.offset)] if bias is not None else [])

    def _return(self) -> None:
        if self.keep_arena:
            self.w.line(f"if {' and '.join(['not workspaces', *self._outputs_apart_from_arena()])}:")
            self.w.line("workspaces.append(ws)", 2)
        elif self.reuse_arena:
            apart = self._outputs_apart_from_arena()
            if apart:
                self.w.line(f"if {' and '.join(apart)}:")
            self.w.line("give_arena(arena)", 2 if apart else 1)
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

    def _outputs_apart_from_arena(self) -> list[str]:
        """Tests that no output shares the arena's memory (then the arena is not reused). Only a
        library result that may view an argument can (one whose op says so)."""
        made_by = {b: s.op for s in self.scheduled.steps if isinstance(s, ExternNode) for b in s.outputs}
        return [f"{o}.untyped_storage().data_ptr() != arena_ptr" for o in self.prog.outputs
                if not isinstance(o, Constant) and o in self.bound_results and self.externs.may_alias_argument(made_by[o])]

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
        sites = [self.kernel_checks.get(steps[j].name, []) for j in run]
        for position, j in enumerate(run):
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
            if not sites[position]:
                calls.append(f"  {kernel.name}({', '.join(args)});")
                continue
            # a failed check stops the run here: the error slot names the kernel, the wrapper raises
            calls.append(f"  {kernel.name}({', '.join(args + ['fc_err + 1'])});")
            calls.append(f"  if (fc_err[1]) {{ fc_err[0] = {position}; return 1; }}")
        threads = slot("nthreads")
        checks = any(sites)
        name = f"run{len(w.runs)}"
        head = [f"  fc_set_threads(fc_args[{threads}]);"]
        if w.arena_bytes and any("fc_arena" in c for c in calls):
            head.append(f"  char* fc_arena = (char*)fc_args[{slot('arena_ptr')}];")
        if checks:  # (after every argument slot: the error slot is the last 4, zero; see the prelude)
            head[:0] = [f'extern "C" int {name}(int64_t* fc_args) {{', f"  int64_t* fc_err = fc_args + {len(slots)};"]
        else:
            head.insert(0, f'extern "C" void {name}(const int64_t* fc_args) {{')
        kernels = [steps[j].name for j in run]
        source = "\n".join(head + calls + (["  return 0;"] if checks else []) + ["}"]) + "\n"
        if not checks:
            w.runs.append(RunSource(name, lib, kernels, source, len(slots)))
            w.line(f"{name}(pack{name}({', '.join(slots)}))  # {', '.join(kernels)}")
            return
        # the error slot follows the arguments: the kernel's position in the run, then the site, the
        # value and the bound the failing check saw (ctypes arrays start zeroed)
        w.runs.append(RunSource(name, lib, kernels, source, len(slots) + 4, checks=True))
        w.line(f"fc_args = pack{name}({', '.join(slots)})  # {', '.join(kernels)}")
        w.line(f"if {name}(fc_args):")
        w.line(f"raise_check_failure(fc_args, {len(slots)}, {w.constant(tuple(tuple(s) for s in sites))})", 2)

    def _pointer(self, b: str) -> str:
        if b in self.in_mems:
            return f"{self.plan.buffer_allocation[b]}.data_ptr()"
        return f"{b}.data_ptr()"


def _numel(size) -> sympy.Expr:
    return sympy.Mul(*[sympy.sympify(n) for n in size])


def _row_major(size, stride) -> bool:
    """Whether static ``stride`` is the row-major (contiguous) stride of static ``size``."""
    expected = 1
    for n, st in zip(reversed(list(size)), reversed(list(stride))):
        n, st = sympy.sympify(n), sympy.sympify(st)
        if not (n.is_Integer and st.is_Integer) or int(st) != expected:
            return False
        expected *= max(int(n), 1)
    return True


@dataclass
class ExternCalls:
    """What the wrapper may assume about calling torch (the caller, which has torch, knows):
    which ops return one tensor rather than a tuple, whether ``linear(x, w, bias, out=...)`` (the
    namespace's ``linear``) may stand for a matmul with a transposed weight, the largest arena a
    program keeps between calls, which ops may return a view of an argument, and the largest
    arena taken from the process's kept block (the namespace's ``take_arena``/``give_arena``)."""

    returns_one_tensor: Any = lambda op: False
    linear_out: bool = False
    keep_arena_bytes: int = 0
    may_alias_argument: Any = lambda op: True
    reuse_arena_bytes: int = 0


def generate_wrapper(scheduled: ScheduledProgram, kernel_args: dict[str, tuple[list[str], list[str]]],
                     library_of: dict[str, int] | None = None, has_out: Any = None,
                     externs: ExternCalls | None = None, kernel_checks: dict[str, list] | None = None) -> WrapperSource:
    """``kernel_args`` maps each kernel to its (buffer, symbol) arguments, in order;
    ``library_of`` each kernel to the library holding it (default: all in one); ``has_out`` an
    aten op name to the name of its single ``out=`` argument, or None where it has none;
    ``kernel_checks`` a kernel to its CheckSites (a kernel with checks takes the error slot)."""
    library_of = library_of or {k: 0 for k in kernel_args}
    return _Gen(scheduled, kernel_args, library_of, has_out or (lambda op: None), externs or ExternCalls(),
                kernel_checks).generate()

