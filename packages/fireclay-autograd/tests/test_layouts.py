"""The backward is compiled for the layouts its inputs arrive in (fireclay_autograd.layouts):
whatever layout a forward compiler hands the saved tensors back in, the backward program it is
given types them so, and the gradients stay eager's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fx_programs import program_from
from helpers import clone_inputs, compare_with_eager

from fireclay_autograd import compile_program
from fireclay_autograd.executor import run_program
from fireclay_autograd.layouts import storage_read_inputs, with_input_layouts
from fireclay_ir import Graph, Program, TensorMeta
from fireclay_ir.dialects.aten import ATTENTION_BIAS_POSITIONS


def _mlp(x, w1, b1, w2):
    return F.gelu(F.linear(x, w1, b1)) @ w2.t()


def _attention(x, w_qkv):
    q, k, v = F.linear(x, w_qkv).split(8, dim=-1)
    q, k, v = (t.view(2, 5, 2, 4).transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 5, 8)


def _norm_residual(x, w, b):
    return x.t() + F.layer_norm(x.t(), (6,), w, b)


def _req(*shape):
    return torch.randn(*shape, dtype=torch.float64).requires_grad_()


CASES = [
    ("mlp", _mlp, lambda: [torch.randn(4, 6, dtype=torch.float64), _req(7, 6), _req(7), _req(3, 7)]),
    ("attention", _attention, lambda: [torch.randn(2, 5, 8, dtype=torch.float64), _req(24, 8)]),
    ("norm_residual", _norm_residual, lambda: [_req(6, 9), _req(6), _req(6)]),
]

# How a forward compiler might return its outputs: as they are, as compact copies, or with
# their dims stored in reverse order (a "column-major" copy).
RELAYOUTS = {
    "as_is": lambda t: t,
    "compact": lambda t: t.contiguous(),
    "reversed": lambda t: torch.empty_strided(t.shape, _reversed_strides(t.shape), dtype=t.dtype).copy_(t),
}


def _reversed_strides(shape):
    strides, step = [], 1
    for n in shape:
        strides.append(step)
        step *= max(n, 1)
    return tuple(strides)


def _relaying_forward(relayout):
    def compiler(program, example_inputs):
        return lambda *args: [relayout(t) if isinstance(t, torch.Tensor) else t for t in run_program(program, *args)]
    return compiler


def _recording_backward(seen):
    def compiler(program, example_inputs):
        seen.append(program)
        # The interpreter reads aten views of non-contiguous tensors only after a copy; what is
        # checked here is the program the compiler is handed.
        return lambda *args: run_program(program, *[a.contiguous() if isinstance(a, torch.Tensor) else a for a in args])
    return compiler


def _strides(meta: TensorMeta):
    if meta.strides is not None:
        return tuple(meta.strides)
    return tuple(torch.empty(meta.shape, device="meta").stride())


def _spying_backward(seen: list[Program], arrived: list[list[torch.Tensor]]):
    """A backward compiler recording each program (``seen``) and the arguments of each call (``arrived``)."""
    backward = _recording_backward(seen)

    def spying_backward(program, examples):
        inner = backward(program, examples)

        def run(*args):
            arrived.append(list(args))
            return inner(*args)
        return run
    return spying_backward


@pytest.mark.parametrize("relayout", sorted(RELAYOUTS))
@pytest.mark.parametrize("cid,fn,make", CASES, ids=[c[0] for c in CASES])
def test_backward_is_typed_with_the_layouts_it_receives(cid, fn, make, relayout):
    torch.manual_seed(0)
    inputs = make()
    seen: list[Program] = []
    arrived: list[list[torch.Tensor]] = []
    spying_backward = _spying_backward(seen, arrived)

    compiled = compile_program(program_from(fn, clone_inputs(inputs)), clone_inputs(inputs),
                               fw_compiler=_relaying_forward(RELAYOUTS[relayout]), bw_compiler=spying_backward)
    for _ in range(2):  # the second step reuses the compiled backward
        compare_with_eager(fn, compiled, make(), atol=1e-9, rtol=1e-9)
    assert len(seen) == 1 and len(arrived) == 2
    for v, t in zip(seen[0].main.inputs, arrived[0]):
        if v.is_tensor and isinstance(t, torch.Tensor):
            assert all(n <= 1 or a == b for n, a, b in zip(t.shape, _strides(v.meta), t.stride())), (v, t.stride())
            assert v.meta.storage_offset == 0 or v.meta.storage_offset == t.storage_offset()


def _program(op: str, meta: TensorMeta, args=()) -> Program:
    g = Graph("main")
    x = g.add_input("x", meta)
    y = g.call(op, (x, *args), out=TensorMeta("float32", (3, 2)))
    g.set_outputs([y])
    return Program.single(g)


def test_programs_are_retyped_only_where_layouts_differ():
    p = _program("aten::neg.default", TensorMeta("float32", (3, 2)))
    assert with_input_layouts(p, [torch.randn(3, 2)]) is p
    transposed = torch.randn(2, 3).t()
    q = with_input_layouts(p, [transposed])
    assert q is not p and q.main.inputs[0].meta.strides == (1, 3)
    assert p.main.inputs[0].meta.strides is None  # the traced program is left as it was
    torch.testing.assert_close(run_program(q, transposed)[0], -transposed)


def test_programs_reading_storage_keep_their_traced_layouts():
    p = _program("aten::as_strided.default", TensorMeta("float32", (3, 2)), ([3, 2], [1, 3]))
    assert with_input_layouts(p, [torch.randn(2, 3).t()]) is p


def test_symbolic_inputs_keep_their_traced_layouts():
    p = _program("aten::neg.default", TensorMeta("float32", ("s0", 2)))
    p.add_symbol("s0", hint=3, min=2)
    assert with_input_layouts(p, [torch.randn(2, 3).t()]) is p


class _SettlingForward:
    """A forward that runs a stand-in (outputs as eager lays them out) for its first ``stand_in``
    calls, then its "compiled" code (outputs in reversed-dims layouts), like a forward whose
    kernels compile in the background; ``settled()`` once a call ran the compiled code."""

    def __init__(self, program, stand_in: int):
        self.program, self.stand_in, self.calls = program, stand_in, 0

    def __call__(self, *args):
        self.calls += 1
        relayout = RELAYOUTS["reversed" if self.calls > self.stand_in else "as_is"]
        return [relayout(t) if isinstance(t, torch.Tensor) else t for t in run_program(self.program, *args)]

    def settled(self) -> bool:
        return self.calls > self.stand_in


@pytest.mark.parametrize("stand_in", [0, 1, 3])
@pytest.mark.parametrize("cid,fn,make", CASES, ids=[c[0] for c in CASES])
def test_backward_waits_for_a_settling_forward_then_takes_its_layouts(cid, fn, make, stand_in):
    torch.manual_seed(0)
    inputs = make()
    seen: list[Program] = []
    compiled_at: list[int] = []
    forwards: list[_SettlingForward] = []
    backward = _recording_backward(seen)

    def forward_compiler(program, examples):
        forwards.append(_SettlingForward(program, stand_in))
        return forwards[-1]

    def spying_backward(program, examples):
        compiled_at.append(forwards[0].calls)
        inner = backward(program, examples)
        arrived = []

        def run(*args):
            arrived.append(list(args))
            return inner(*args)
        run.arrived = arrived
        spying_backward.run = run
        return run

    compiled = compile_program(program_from(fn, clone_inputs(inputs)), clone_inputs(inputs),
                               fw_compiler=forward_compiler, bw_compiler=spying_backward)
    for _ in range(stand_in + 2):  # gradients are eager's before and after the backward compiles
        compare_with_eager(fn, compiled, make(), atol=1e-9, rtol=1e-9)
    # compiled once, at the backward of the first forward call that ran the compiled code
    assert compiled_at == [stand_in + 1] and len(seen) == 1
    first = spying_backward.run.arrived[0]
    assert any(isinstance(t, torch.Tensor) and t.dim() > 1 for t in first)
    for v, t in zip(seen[0].main.inputs, first):
        if v.is_tensor and isinstance(t, torch.Tensor):
            assert all(n <= 1 or a == b for n, a, b in zip(t.shape, _strides(v.meta), t.stride())), (v, t.stride())


def _pooled(x, w):
    # adaptive_avg_pool1d's backward writes the gradient through an as_strided view of a
    # zero-filled buffer (as Swin's pooler does): a storage read of the tangent, not of x.
    return F.adaptive_avg_pool1d(F.linear(x, w).transpose(1, 2), 1).flatten(1)


def test_inputs_a_storage_read_does_not_depend_on_take_their_layouts():
    torch.manual_seed(0)

    def make():
        return [torch.randn(2, 5, 8, dtype=torch.float64), _req(6, 8)]

    seen: list[Program] = []
    arrived: list[list[torch.Tensor]] = []
    spying_backward = _spying_backward(seen, arrived)

    inputs = make()
    compiled = compile_program(program_from(_pooled, clone_inputs(inputs)), clone_inputs(inputs),
                               fw_compiler=_relaying_forward(RELAYOUTS["reversed"]), bw_compiler=spying_backward)
    for _ in range(2):
        compare_with_eager(_pooled, compiled, make(), atol=1e-9, rtol=1e-9)
    graph = seen[0].main
    assert any(n.op == "aten::as_strided.default" for n in graph.nodes)
    pinned = storage_read_inputs(graph)
    assert pinned and all(v.name.startswith("tangent") for v in pinned)
    retyped = 0
    for v, t in zip(graph.inputs, arrived[0]):
        if not (v.is_tensor and isinstance(t, torch.Tensor)) or v in pinned or t.dim() < 2:
            continue
        assert _strides(v.meta) == t.stride(), (v, t.stride())
        retyped += 1
    assert retyped >= 1  # the saved activation x, handed back with its dims reversed


# The memory-efficient and cuDNN attention kernels refuse a mask whose last dimension is not dense
# or whose other strides are not multiples of 16 elements; a saved mask can reach the backward in
# the layout generated code stored it in (a permuted relative-position bias). The kernels are
# CUDA-only, so the op is replaced by one that checks what it is given, as they do.
MASK_LAYOUTS = {
    "permuted": lambda: torch.randn(49, 49, 4).permute(2, 0, 1).unsqueeze(0).expand(2, 4, 49, 49),
    "rows of 49": lambda: torch.randn(2, 4, 49, 49),
    "transposed": lambda: torch.randn(2, 4, 48, 48).transpose(-1, -2),
    "offset": lambda: torch.randn(2 * 4 * 64 * 64 + 3)[3:].view(2, 4, 64, 64),
    "aligned": lambda: torch.randn(2, 4, 64, 64),
}


@pytest.mark.parametrize("op", sorted(ATTENTION_BIAS_POSITIONS))
@pytest.mark.parametrize("layout", sorted(MASK_LAYOUTS))
def test_attention_kernels_get_their_mask_in_a_layout_they_take(op, layout, monkeypatch):
    from fireclay_autograd import executor

    mask = MASK_LAYOUTS[layout]()
    position = ATTENTION_BIAS_POSITIONS[op]
    seen = []

    def kernel(*args):
        bias = args[position]
        steps = [st for sz, st in zip(bias.shape[:-1], bias.stride()[:-1]) if sz != 1]
        if bias.stride(-1) != 1:
            raise RuntimeError("(*bias): last dimension must be contiguous")
        if any(s % 16 for s in [*steps, bias.storage_offset()]):
            raise RuntimeError("attn_bias is not correctly aligned")
        seen.append(bias)
        return bias * 2

    resolve = executor.resolve_op
    monkeypatch.setattr(executor, "resolve_op", lambda name: kernel if name == op else resolve(name))
    g = Graph("main")
    args = [g.add_input(f"a{i}", TensorMeta("float32", (2,))) for i in range(position)]
    m = g.add_input("mask", TensorMeta("float32", tuple(mask.shape), strides=tuple(mask.stride())))
    out = g.call(op, [*args, m], out=TensorMeta("float32", tuple(mask.shape)))
    g.set_outputs([out])
    result = executor.run_graph(g, [*(torch.zeros(2) for _ in range(position)), mask])[0]
    torch.testing.assert_close(result, mask * 2, rtol=0, atol=0)
    assert (seen[0] is mask) == (layout == "aligned")  # an aligned mask is passed as it is
