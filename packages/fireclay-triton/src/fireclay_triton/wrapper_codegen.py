"""The call sequence as a generated Python function: bind sizes, allocate per the memory plan,
launch kernels, call extern aten ops through torch, return the outputs.

Every buffer is held at run time as a *base* tensor whose ``data_ptr()`` is the buffer's index
0 (the origin of its index expressions, and what a Triton kernel receives); views for extern
calls and outputs are ``as_strided`` of the base (``.t()`` for a 2-D transpose). A buffer alone
in its allocation is made with ``torch.empty_strided`` in its own dtype on the inputs' device
(or is the extern call's result itself when its layout is right); an allocation that several
buffers of one dtype and layout share over time is made in that layout, each buffer the
allocation itself (per call, no view is made of it: an MLP's training step made 25 typed views
and 42 ``as_strided`` calls); other shared allocations are byte tensors the buffers are typed
views of. Kernels are launched through bound launches (:mod:`fireclay_triton.bound_launch`).

Memory that only internal temporaries use (an allocation of static size none of whose buffers is
returned, saved for a backward or an input) is *kept*: the program holds a *workspace* made once,
the allocation's tensor, each buffer's typed view and every strided view the wrapper takes of
them, whose storages hold no memory between calls. Where today's plan allocates, a call gives the
storage its bytes (``storage.resize_(n)``: one allocator call, where a tensor and its views cost
several Python-level calls each); where the plan frees, it gives them back (``resize_(0)``). Every
view follows its storage's memory, so the views are made once per workspace, while memory is taken
and returned at exactly the plan's points: the peak is the plan's. A call takes the workspace for
its duration (another thread's call makes its own). Kept results of matmuls are written in place
(``out=``).
"""

from __future__ import annotations

import sympy

from fireclay_loops import Constant, ExternNode, Kernel, ScheduledProgram
from fireclay_loops.backend import WrapperText, constant_size, py_expr, py_shape
from fireclay_loops.backend.runtime import bound_op, contiguous_strides, returns_one_tensor
from fireclay_loops.dtypes import ITEMSIZE
from fireclay_triton.errors import CodegenError
from fireclay_triton.kernel_codegen import KernelSource


class WrapperSource(WrapperText):
    """Generated wrapper text, plus the objects its namespace needs (constants, aten ops)."""


# Matmuls whose result a kept buffer takes through torch's ``out=`` (the same library call,
# writing into the buffer instead of a new tensor); their torch functions are the wrapper's ops
# (fireclay_loops.backend.runtime.bound_op), whose ``out=`` selects the out overload.
_OUT_OPS = {"aten::mm.default", "aten::addmm.default", "aten::bmm.default", "aten::baddbmm.default"}


class Workspace:
    """What a program keeps from one call to the next (see the module doc): per kept allocation,
    its storage and tensors; every view taken of them. ``lines`` make it (in ``new_workspace``),
    ``names`` are what the call unpacks."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.storages: list[str] = []
        self.names: list[str] = []
        self.views: dict[str, str] = {}  # view expression -> its variable

    def make(self, name: str, expression: str) -> None:
        self.lines.append(f"{name} = {expression}")
        self.names.append(name)

    def storage(self, allocation: str) -> str:
        var = f"storage_{allocation}"
        self.make(var, f"{allocation}.untyped_storage()")
        self.storages.append(var)
        return var

    def view(self, expression: str) -> str:
        var = self.views.get(expression)
        if var is None:
            var = self.views[expression] = f"view{len(self.views)}"
            self.make(var, expression)
        return var

    def function(self) -> list[str]:
        """``new_workspace(device)``: made outside inference mode (a later call in normal mode
        writes into it through ``out=``), its storages emptied once every view is made."""
        body = [*self.lines, *(f"{s}.resize_(0)" for s in self.storages)]
        return (["", "def new_workspace(device):", "    with torch.inference_mode(False):"]
                + ["        " + line for line in body]
                + [f"    return (device, {''.join(n + ', ' for n in self.names)})"])


def _static(*values) -> bool:
    """Whether every size expression of ``values`` (each one or a sequence) is an integer."""
    return all(sympy.sympify(e).is_Integer for v in values for e in (v if isinstance(v, (list, tuple)) else [v]))


def generate_wrapper(scheduled: ScheduledProgram, kernels: dict[str, KernelSource], *,
                     keep_workspace: bool = True) -> WrapperSource:
    """The wrapper of ``scheduled``. Buffers are deleted after their last use, and an allocation
    several buffers share after its last buffer, so the program's peak follows the memory plan.
    ``keep_workspace``: temporaries' memory in a workspace kept across calls (the module doc)."""
    prog = scheduled.program
    plan = scheduled.plan
    w = WrapperSource()
    owners: dict[str, list[str]] = {}
    for b, a in plan.buffer_allocation.items():
        owners.setdefault(a, []).append(b)
    alone = {b for b, a in plan.buffer_allocation.items()
             if len(owners[a]) == 1 and not prog.buffers[b].is_input and prog.buffers[b].offset == 0}
    never = len(scheduled.steps)
    if keep_workspace:
        # An output that took over a dead temporary's allocation (always its last owner: outputs
        # are never freed) is made a tensor of its own, which the caching allocator may place in
        # the memory the temporaries just gave back: the same peak, and the temporaries' memory
        # is kept (the workspace) instead of typed per call.
        alone |= {b for b in plan.buffer_allocation if not prog.buffers[b].is_input and prog.buffers[b].offset == 0
                  and plan.lifetimes.get(b, (0, 0))[1] >= never
                  and plan.allocations[plan.buffer_allocation[b]].from_input is None}  # not a donated input's
    # an extern call's result is the buffer itself (copied only when its layout differs), never
    # copied into planned memory: that copy would cost a pass over it and its size again at peak
    extern_results = {b: step for k, step in enumerate(scheduled.steps) if isinstance(step, ExternNode)
                      for b in step.outputs if b in prog.buffers and not prog.buffers[b].is_input
                      and plan.lifetimes.get(b, (k,))[0] == k}  # the extern call is the buffer's first writer
    alone |= {b for b in extern_results if prog.buffers[b].offset == 0}
    owners = {a: [b for b in bs if b not in alone] for a, bs in owners.items()}
    uniform = {a: layout for a, bs in owners.items() if (layout := _shared_layout(prog, bs)) is not None}
    exact = {b for a in uniform for b in owners[a]}  # held as the allocation itself, in their own layout
    held = alone | exact
    # the step after which an allocation's last buffer dies (allocations holding an output or a
    # kept input never die); until then a freed buffer's memory waits for the next buffer the plan
    # puts there, after it the allocation is deleted so the caching allocator can hand it out
    freed_at = {b: k for k, bs in plan.free_after.items() for b in bs}
    last_free: dict[str, int] = {}
    for a, bs in owners.items():
        if bs and all(b in freed_at for b in bs):
            last_free[a] = max(freed_at[b] for b in bs)
    kept_allocations, kept_alone, out_results = (
        _kept(scheduled, alone, owners, extern_results, freed_at, last_free) if keep_workspace else (set(), set(), set()))
    ws = Workspace()
    call_views = CallViews(w) if keep_workspace else None
    whole_call = {b for b in prog.buffers if prog.buffers[b].is_input or plan.lifetimes.get(b, (0, 0))[1] >= never}
    kept_buffers = kept_alone | {b for a in kept_allocations for b in owners[a]}
    w.lines.append(f"def call({', '.join(prog.inputs)}):")
    w.bind_sizes(prog)
    # every buffer lives on the inputs' device (programs traced on meta tensors may say "cpu")
    made_on = next((str(b.device) for b in prog.buffers.values() if str(b.device).split(":")[0] not in ("cpu", "meta")),
                   None)
    w.line(f"device = pick_device({''.join(n + ', ' for n in prog.inputs)}made_on={made_on!r})")
    workspace_at = len(w.lines)  # the workspace's lines go here once every view of it is known
    if kernels:  # the device and stream every launch of this call goes to (bound_launch.py)
        w.line("dev, stream = launch_target()")
    for name in prog.inputs:
        buf = prog.buffers[name]
        w.line(f"{name} = as_base({name}, {name!r}, torch.{buf.dtype}, {py_shape(buf.size)}, {py_shape(buf.stride)}, "
               f"{py_expr(buf.offset)}, {py_expr(buf.storage_numel)})")
    mems: set[str] = set()
    storage_of: dict[str, str] = {}  # kept allocation or buffer -> its storage's variable
    for k, step in enumerate(scheduled.steps):
        produced_by_extern = set(step.outputs) if isinstance(step, ExternNode) else set()
        for b in plan.allocate_before.get(k, []):
            buf = prog.buffers[b]
            if b in alone and b in produced_by_extern and b not in out_results:
                continue  # bound to the extern call's result below
            device = "device=device"
            if b in alone:
                make = (f"torch.empty_strided({py_shape(buf.size)}, {py_shape(buf.stride)}, "
                        f"dtype=torch.{buf.dtype}, {device})")
                if b in kept_alone:
                    ws.make(b, make)
                    storage_of[b] = ws.storage(b)
                    w.line(f"{storage_of[b]}.resize_({_extent_bytes(buf)})")
                else:
                    w.line(f"{b} = {make}")
                continue
            a = plan.buffer_allocation[b]
            kept = a in kept_allocations
            line = ws.make if kept else (lambda name, expression: w.line(f"{name} = {expression}"))
            if a not in mems:
                if a in uniform:
                    line(a, f"torch.empty_strided({py_shape(buf.size)}, {py_shape(buf.stride)}, "
                            f"dtype=torch.{buf.dtype}, {device})")
                else:
                    line(a, f"torch.empty({py_expr(plan.allocations[a].nbytes)}, dtype=torch.uint8, {device})")
                if kept:
                    storage_of[a] = ws.storage(a)
                    nbytes = _extent_bytes(buf) if a in uniform else py_expr(plan.allocations[a].nbytes)
                    w.line(f"{storage_of[a]}.resize_({nbytes})")
                mems.add(a)
            if a in uniform:
                line(b, a)
            else:
                line(b, f"typed({a}, torch.{buf.dtype}, {py_expr(buf.storage_numel)})")
        views = ws.view if kept_buffers else None
        if isinstance(step, Kernel):
            src = kernels[step.name]
            # sizes that are constants of the program are bound in the launcher, not passed
            sizes = [py_expr(src.numel)] if constant_size(src.numel) is None else []
            if src.kind != "pointwise" and constant_size(src.rnumel) is None:
                sizes.append(py_expr(src.rnumel))
            args = ["dev", "stream", *src.buffers, *src.symbols, *sizes]
            for b in step.accumulated_buffers():
                w.line(f"{b}.zero_()  # {step.name} adds into it")
            w.line(f"{step.name}({', '.join(args)})  # {src.kind}: {src.function} in kernels.py")
        else:
            _extern_call(w, step, prog, alone, held, kept_buffers, views, out_results, call_views, whole_call)
        for b in plan.free_after.get(k, []):
            if b in prog.inputs:
                continue
            a = plan.buffer_allocation[b]
            if b in kept_alone:
                w.line(f"{storage_of[b]}.resize_(0)")
                continue
            if a in kept_allocations:
                if last_free.get(a) == k:
                    w.line(f"{storage_of[a]}.resize_(0)")
                continue
            names = [b]
            if b not in alone and last_free.get(a) == k and a in mems:
                names.append(a)  # no buffer uses the allocation after this one: give it back now
            w.line(f"del {', '.join(names)}")
    outs = []
    for o in prog.outputs:
        if isinstance(o, Constant):
            outs.append(w.literal(o.value))
            continue
        buf = prog.buffers[o]
        outs.append(_tensor(o, buf, buf.size, buf.stride, buf.offset, held))
    if ws.names:
        # a workspace of this device from the program's pool (another thread's call holds its
        # own), given back when the call returns; a call that raises drops it
        w.lines[workspace_at:workspace_at] = [
            "    workspace = workspaces.pop() if workspaces else None",
            "    if workspace is None or workspace[0] != device:",
            "        workspace = new_workspace(device)",
            f"    _, {''.join(n + ', ' for n in ws.names)}= workspace"]
        w.line("workspaces.append(workspace)")
    w.line("return (" + "".join(f"{x}, " for x in outs) + ")")
    if ws.names:
        w.lines += ws.function()
    return w


def _extent_bytes(buf) -> int:
    """The bytes ``torch.empty_strided`` gives a buffer of static layout (offset 0)."""
    sizes, strides = [int(n) for n in buf.size], [int(s) for s in buf.stride]
    if 0 in sizes:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(sizes, strides))) * ITEMSIZE[str(buf.dtype)]


def _kept(scheduled: ScheduledProgram, alone: set[str], owners: dict[str, list[str]],
          extern_results: dict[str, ExternNode], freed_at: dict[str, int],
          last_free: dict[str, int]) -> tuple[set[str], set[str], set[str]]:
    """(shared allocations, buffers alone in theirs, of those the matmul results written with
    ``out=``) that a workspace keeps: static layouts, internal temporaries only (each freed
    inside the call: never an output, a saved tensor or an input), never a donated input's
    memory."""
    prog, plan = scheduled.program, scheduled.plan
    never = len(scheduled.steps)

    def internal(b: str) -> bool:
        buf = prog.buffers[b]
        return (not buf.is_input and b in freed_at and plan.lifetimes[b][1] < never
                and _static(buf.size, buf.stride, buf.offset, buf.storage_numel))

    allocations = {a for a, bs in owners.items() if bs and a in last_free and plan.allocations[a].from_input is None
                   and _static(plan.allocations[a].nbytes) and all(internal(b) for b in bs)}
    out_results = {b for b, step in extern_results.items()
                   if b in alone and step.op in _OUT_OPS and bound_op(step.op) is not None
                   and step.result_positions() == [0] and len(step.outputs) == 1
                   and tuple(prog.buffers[b].stride) == contiguous_strides(prog.buffers[b].size)}
    kept_alone = {b for b in alone if internal(b) and (b not in extern_results or b in out_results)}
    return allocations, kept_alone, out_results & kept_alone


def _shared_layout(prog, names: list[str]):
    """The one buffer layout (dtype, size, stride, no offset) of every buffer in ``names``, as
    one of them; None when they differ or there are none."""
    if not names:
        return None
    first = prog.buffers[names[0]]
    layout = (first.dtype, tuple(first.size), tuple(first.stride))
    for b in names:
        buf = prog.buffers[b]
        if buf.is_input or buf.offset != 0 or (buf.dtype, tuple(buf.size), tuple(buf.stride)) != layout:
            return None
    return first


def _view(b: str, size, stride, offset) -> str:
    """A tensor expression for a strided view of buffer ``b`` (at its index 0 + ``offset``): at
    offset 0 ``as_strided`` itself, which keeps the base's storage offset (no Python helper,
    no ``storage_offset()`` read: a call makes one view per matmul operand)."""
    if offset == 0:
        return f"{b}.as_strided({py_shape(size)}, {py_shape(stride)})"
    return f"view({b}, {py_shape(size)}, {py_shape(stride)}, {py_expr(offset)})"


def _tensor(b: str, buf, size, stride, offset, held: set[str]) -> str:
    """A tensor expression for buffer ``b`` seen with ``size``/``stride`` at ``offset``: the held
    tensor itself when it already has exactly that layout (an input, which ``as_base`` gives in
    the buffer's layout, or a buffer ``held`` in its own layout: alone in its allocation, or
    sharing one made in that layout), else a view."""
    if (buf.is_input or b in held) and offset == 0 and buf.offset == 0:
        if tuple(size) == tuple(buf.size) and tuple(stride) == tuple(buf.stride):
            return b
        if _transposed(buf.size, buf.stride, size, stride):
            return f"{b}.t()"  # a linear layer's weight: cheaper than a strided view
    return _view(b, size, stride, offset)


def _transposed(size, stride, view_size, view_stride) -> bool:
    """Whether a 2-D view is the transpose of a 2-D layout."""
    return len(size) == 2 and len(view_size) == 2 and tuple(view_size) == (size[1], size[0]) \
        and tuple(view_stride) == (stride[1], stride[0])


class CallViews:
    """Views of buffers that live through the whole call (inputs, outputs): each made once per
    call, at its first use (a saved activation is viewed as a matrix by every matmul reading it)."""

    def __init__(self, w: WrapperSource) -> None:
        self.w = w
        self.made: dict[str, str] = {}

    def __call__(self, expression: str) -> str:
        var = self.made.get(expression)
        if var is None:
            var = self.made[expression] = f"call_view{len(self.made)}"
            self.w.line(f"{var} = {expression}")
        return var


def _linear(step: ExternNode, args: list[str]) -> list[str] | None:
    """``linear``'s arguments where a matmul by a transposed weight is what torch's ``linear``
    computes with the same library call (``mm(x, w.t())``, ``addmm(bias, x, w.t())`` of a vector
    bias), so the wrapper makes no transposed view; else None."""
    if step.kwargs or not args[-1].endswith(".t()"):
        return None
    weight = args[-1][: -len(".t()")]
    if step.op == "aten::mm.default" and len(args) == 2:
        return [args[0], weight]
    bias = step.args[0] if step.args else None
    if step.op == "aten::addmm.default" and len(args) == 3 and len(getattr(bias, "size", ())) == 1:
        return [args[1], weight, args[0]]
    return None


def _extern_call(w: WrapperSource, step: ExternNode, prog, alone: set[str], held: set[str], kept: set[str],
                 views, out_results: set[str], call_views: CallViews | None, whole_call: set[str]) -> None:
    def tensor(a) -> str:
        text = _tensor(a.buffer, prog.buffers[a.buffer], a.size, a.stride, a.offset, held)
        if text == a.buffer or text.endswith(".t()"):
            return text
        if a.buffer in kept:
            return views(text)
        return call_views(text) if call_views is not None and a.buffer in whole_call else text

    call_args = w.extern_args(step, tensor)
    for b in step.outputs:
        if b not in prog.buffers:
            raise CodegenError(f"extern call {step.name} writes {b}, which the program does not declare")
    linear = _linear(step, call_args) if call_views is not None else None
    fn = "linear" if linear is not None else w.op(step.op)
    call_args = linear if linear is not None else call_args
    if step.outputs and step.outputs[0] in out_results:
        w.line(f"{fn}({', '.join(call_args)}, out={step.outputs[0]})  # {step.kind} {step.name}")
        return
    results = w.extern_results(fn, call_args, step, step.result_positions() == [0] and returns_one_tensor(step.op))
    for i, b in zip(step.result_positions(), step.outputs):
        buf = prog.buffers[b]
        r, size, stride = results[i], py_shape(buf.size), py_shape(buf.stride)
        if b in alone:
            # the common case (the library returned the planned layout) checked inline
            w.line(f"{b} = {r} if {r}.stride() == {stride} and {r}.shape == {size} else conform({r}, {size}, {stride})")
        else:
            target = _view(b, buf.size, buf.stride, buf.offset)
            w.line(f"{views(target) if b in kept else target}.copy_({r})")
    w.line(f"del {'result' if results == ['result'] else 'result, results'}  # an extern result must not "
           "outlive its buffer")
