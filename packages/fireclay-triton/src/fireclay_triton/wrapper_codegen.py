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
"""

from __future__ import annotations

from fireclay_loops import Constant, ExternNode, Kernel, ScheduledProgram
from fireclay_loops.backend import WrapperText, constant_size, py_expr, py_shape
from fireclay_loops.backend.runtime import returns_one_tensor
from fireclay_triton.errors import CodegenError
from fireclay_triton.kernel_codegen import KernelSource


class WrapperSource(WrapperText):
    """Generated wrapper text, plus the objects its namespace needs (constants, aten ops)."""


def generate_wrapper(scheduled: ScheduledProgram, kernels: dict[str, KernelSource]) -> WrapperSource:
    """The wrapper of ``scheduled``. Buffers are deleted after their last use, and an allocation
    several buffers share after its last buffer, so the program's peak follows the memory plan."""
    prog = scheduled.program
    plan = scheduled.plan
    w = WrapperSource()
    owners: dict[str, list[str]] = {}
    for b, a in plan.buffer_allocation.items():
        owners.setdefault(a, []).append(b)
    alone = {b for b, a in plan.buffer_allocation.items()
             if len(owners[a]) == 1 and not prog.buffers[b].is_input and prog.buffers[b].offset == 0}
    # an extern call's result is the buffer itself (copied only when its layout differs), never
    # copied into planned memory: that copy would cost a pass over it and its size again at peak
    alone |= {b for k, step in enumerate(scheduled.steps) if isinstance(step, ExternNode) for b in step.outputs
              if b in prog.buffers and not prog.buffers[b].is_input and prog.buffers[b].offset == 0
              and plan.lifetimes.get(b, (k,))[0] == k}  # the extern call is the buffer's first writer
    owners = {a: [b for b in bs if b not in alone] for a, bs in owners.items()}
    uniform = {a: layout for a, bs in owners.items() if (layout := _shared_layout(prog, bs)) is not None}
    exact = {b for a in uniform for b in owners[a]}  # held as the allocation itself, in their own layout
    held = alone | exact
    w.lines.append(f"def call({', '.join(prog.inputs)}):")
    w.bind_sizes(prog)
    # every buffer lives on the inputs' device (programs traced on meta tensors may say "cpu")
    w.line(f"device = pick_device({', '.join(n for n in prog.inputs)}{',' if len(prog.inputs) == 1 else ''})")
    if kernels:  # the device and stream every launch of this call goes to (bound_launch.py)
        w.line("dev, stream = launch_target()")
    for name in prog.inputs:
        buf = prog.buffers[name]
        w.line(f"{name} = as_base({name}, {name!r}, torch.{buf.dtype}, {py_shape(buf.size)}, {py_shape(buf.stride)}, "
               f"{py_expr(buf.offset)}, {py_expr(buf.storage_numel)})")
    mems: set[str] = set()
    # the step after which an allocation's last buffer dies (allocations holding an output or a
    # kept input never die); until then a freed buffer's memory waits for the next buffer the plan
    # puts there, after it the allocation is deleted so the caching allocator can hand it out
    freed_at = {b: k for k, bs in plan.free_after.items() for b in bs}
    last_free: dict[str, int] = {}
    for a, bs in owners.items():
        if bs and all(b in freed_at for b in bs):
            last_free[a] = max(freed_at[b] for b in bs)
    for k, step in enumerate(scheduled.steps):
        produced_by_extern = set(step.outputs) if isinstance(step, ExternNode) else set()
        for b in plan.allocate_before.get(k, []):
            buf = prog.buffers[b]
            if b in alone and b in produced_by_extern:
                continue  # bound to the extern call's result below
            device = "device=device"
            if b in alone:
                w.line(f"{b} = torch.empty_strided({py_shape(buf.size)}, {py_shape(buf.stride)}, "
                       f"dtype=torch.{buf.dtype}, {device})")
                continue
            a = plan.buffer_allocation[b]
            if a not in mems:
                if a in uniform:
                    w.line(f"{a} = torch.empty_strided({py_shape(buf.size)}, {py_shape(buf.stride)}, "
                           f"dtype=torch.{buf.dtype}, {device})")
                else:
                    w.line(f"{a} = torch.empty({py_expr(plan.allocations[a].nbytes)}, dtype=torch.uint8, {device})")
                mems.add(a)
            if a in uniform:
                w.line(f"{b} = {a}")
            else:
                w.line(f"{b} = typed({a}, torch.{buf.dtype}, {py_expr(buf.storage_numel)})")
        if isinstance(step, Kernel):
            src = kernels[step.name]
            # sizes that are constants of the program are bound in the launcher, not passed
            sizes = [py_expr(src.numel)] if constant_size(src.numel) is None else []
            if src.kind != "pointwise" and constant_size(src.rnumel) is None:
                sizes.append(py_expr(src.rnumel))
            args = ["dev", "stream", *src.buffers, *src.symbols, *sizes]
            w.line(f"{step.name}({', '.join(args)})  # {src.kind}: {src.function} in kernels.py")
        else:
            _extern_call(w, step, prog, alone, held)
        for b in plan.free_after.get(k, []):
            if b in prog.inputs:
                continue
            names = [b]
            a = plan.buffer_allocation[b]
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
    w.line("return (" + "".join(f"{x}, " for x in outs) + ")")
    return w


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


def _extern_call(w: WrapperSource, step: ExternNode, prog, alone: set[str], held: set[str]) -> None:
    call_args = w.extern_args(step, lambda a: _tensor(a.buffer, prog.buffers[a.buffer], a.size, a.stride, a.offset,
                                                      held))
    fn = w.op(step.op)
    for b in step.outputs:
        if b not in prog.buffers:
            raise CodegenError(f"extern call {step.name} writes {b}, which the program does not declare")
    results = w.extern_results(fn, call_args, step, step.result_positions() == [0] and returns_one_tensor(step.op))
    for i, b in zip(step.result_positions(), step.outputs):
        buf = prog.buffers[b]
        r, size, stride = results[i], py_shape(buf.size), py_shape(buf.stride)
        if b in alone:
            # the common case (the library returned the planned layout) checked inline
            w.line(f"{b} = {r} if {r}.stride() == {stride} and {r}.shape == {size} else conform({r}, {size}, {stride})")
        else:
            w.line(f"{_view(b, buf.size, buf.stride, buf.offset)}.copy_({r})")
    w.line(f"del {'result' if results == ['result'] else 'result, results'}  # an extern result must not "
           "outlive its buffer")
