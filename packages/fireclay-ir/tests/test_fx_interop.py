"""torch.fx interop: fx -> Program -> (interpret | fx) against eager, over a table of modules,
and a Hugging Face BERT through torch.export."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from fireclay_ir import IRError  # noqa: E402
from fireclay_ir.fx_interop import FxConversionError, from_fx, to_fx  # noqa: E402
from fireclay_ir.interpreter import interpret  # noqa: E402
from fireclay_ir.verifier import verify  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x))).softmax(-1)


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, 4)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x))).mean(dim=(2, 3))


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, 2, 8).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + o.transpose(1, 2).reshape(b, n, 16)


class MultiOut(torch.nn.Module):
    def forward(self, x, y):
        values, idx = torch.topk(x, 2, dim=-1)
        a, b = torch.split(y, [1, 2], dim=0)
        return values * 2, idx, a.sum() + b.amax(), x[:, 1:3] @ y[:2, :].T[:3, :2].T


class TiedEmbedding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, ids):
        h = self.emb(ids) * self.scale
        return h @ self.emb.weight.T


class Arith(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        y.mul_(0.5).add_(1.0)
        n = x.shape[1]
        return torch.where(x > 0, x, -x) ** 2 / n + y.flip(0).cumsum(1), x.to(torch.float64).sum()


MODULES = {
    "mlp": (MLP, lambda: (torch.randn(5, 8),)),
    "conv": (Conv, lambda: (torch.randn(2, 3, 6, 6),)),
    "attention": (Attention, lambda: (torch.randn(2, 5, 16),)),
    "multi out": (MultiOut, lambda: (torch.randn(4, 5), torch.randn(3, 5))),
    "tied embedding": (TiedEmbedding, lambda: (torch.randint(0, 20, (3, 4)),)),
    "arith": (Arith, lambda: (torch.randn(3, 4),)),
}


def _same(got, want):
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a, b)


def _module(name):
    cls, inputs = MODULES[name]
    torch.manual_seed(0)
    return cls().eval(), inputs


@pytest.mark.parametrize("name", sorted(MODULES))
def test_symbolic_trace_to_program_runs_like_eager(name):
    model, inputs = _module(name)
    gm = torch.fx.symbolic_trace(model)
    program = from_fx(gm, inputs())
    verify(program)
    assert {n.dialect for n in program.main.nodes} == {"torch"}
    for _ in range(2):
        args = inputs()
        _same(interpret(program, *args), model(*args))
        _same(to_fx(program)(*args), model(*args))


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize("decompose", [False, True])
def test_exported_aten_graphs_run_like_eager(name, decompose):
    model, inputs = _module(name)
    ep = torch.export.export(model, inputs())
    if decompose:
        ep = ep.run_decompositions()
    program = from_fx(ep.module())
    verify(program)
    assert {n.dialect for n in program.main.nodes} <= {"aten"}
    round_trip = to_fx(program)
    for _ in range(2):
        args = inputs()
        _same(interpret(program, *args), model(*args))
        _same(round_trip(*args), model(*args))
    # Program -> fx -> Program keeps the ops and their order.
    again = from_fx(round_trip, inputs())
    assert [n.op for n in again.main.nodes] == [n.op for n in program.main.nodes]


def test_weights_become_parameter_and_buffer_inputs():
    model, inputs = _module("tied embedding")
    program = from_fx(torch.fx.symbolic_trace(model), inputs())
    kinds = {s.target: s.kind for s in program.main.input_specs if s.target}
    assert kinds == {"emb.weight": "parameter", "scale": "buffer"}
    # The tied weight is one weight and one input, read twice.
    assert sum(1 for s in program.main.input_specs if s.target == "emb.weight") == 1
    assert program.weights["emb.weight"].meta.requires_grad


def test_gradients_reach_the_module_parameters_through_the_interpreter():
    model, inputs = _module("mlp")
    program = from_fx(torch.fx.symbolic_trace(model), inputs())
    x = inputs()[0]
    interpret(program, x)[0].square().sum().backward()
    ours = model.fc1.weight.grad.clone()
    model.zero_grad()
    model(x).square().sum().backward()
    assert torch.allclose(ours, model.fc1.weight.grad, atol=1e-6)


def test_source_and_module_path_are_kept():
    model, inputs = _module("attention")
    program = from_fx(torch.export.export(model, inputs()).module())
    sdpa = program.main.find("aten::scaled_dot_product_attention.default")[0]
    assert sdpa.source["file"].endswith("test_fx_interop.py")
    assert "scaled_dot_product_attention" in sdpa.source["text"]
    norm = program.main.find("aten::layer_norm.default")[0]
    assert norm.meta["module"] == "norm"
    gm = to_fx(program)
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.scaled_dot_product_attention.default)
    assert "test_fx_interop.py" in node.meta["stack_trace"]


def test_dynamic_shapes_become_symbols():
    model, inputs = _module("mlp")
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(model, inputs(), dynamic_shapes=({0: batch},))
    program = from_fx(ep.module())
    verify(program)
    (x,) = [v for v, s in zip(program.main.inputs, program.main.input_specs) if s.kind == "user"]
    sym = x.meta.shape[0]
    assert isinstance(sym, str) and sym.isidentifier()
    assert program.symbols[sym].hint == 5
    for n in (3, 17):
        args = (torch.randn(n, 8),)
        _same(interpret(program, *args), model(*args))


def test_cond_becomes_a_hop_with_subgraphs():
    class Branchy(torch.nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos() * 2, (x,))

    model = Branchy()
    ep = torch.export.export(model, (torch.randn(4),))
    program = from_fx(ep.module())
    verify(program)
    (cond,) = program.main.find("hop::cond")
    assert len(program.graphs) == 3
    for x in (torch.ones(4), -torch.ones(4), torch.randn(4)):
        _same(interpret(program, x), model(x))
        _same(to_fx(program)(x), model(x))


def test_while_loop_becomes_a_hop_with_subgraphs():
    class Loop(torch.nn.Module):
        def forward(self, x):
            def cond(i, a):
                return i < 3

            def body(i, a):
                return i + 1, a * 2 + x

            return torch.while_loop(cond, body, (torch.tensor(0), x))

    model = Loop()
    program = from_fx(torch.export.export(model, (torch.randn(4),)).module())
    verify(program)
    assert len(program.main.find("hop::while_loop")) == 1
    for x in (torch.randn(4), torch.randn(4)):
        _same(interpret(program, x), model(x))
        _same(to_fx(program)(x), model(x))


def opaque_helper(x):
    return x + 1


torch.fx.wrap("opaque_helper")


class UsesHelper(torch.nn.Module):
    def forward(self, x):
        return opaque_helper(x) * 2


class UntraceableLeaf(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(x)


def test_unmappable_targets_raise_a_clear_error():
    gm = torch.fx.symbolic_trace(UsesHelper())
    with pytest.raises(FxConversionError, match="register it with"):
        from_fx(gm, (torch.randn(2),))
    with pytest.raises(FxConversionError, match="example_inputs"):
        from_fx(torch.fx.symbolic_trace(MLP()))
    with pytest.raises(IRError):
        from_fx(MLP())
    with pytest.raises(FxConversionError, match="call_module 'bn'"):
        from_fx(torch.fx.symbolic_trace(UntraceableLeaf().eval()), (torch.randn(2, 3),))


def test_bert_from_export_saves_loads_and_equals_eager(tmp_path):
    transformers = pytest.importorskip("transformers")
    from fireclay_ir import format_program, load, save

    config = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ep = torch.export.export(model, (torch.randint(0, 120, (2, 9)),))
    program = from_fx(ep.module())
    verify(program)
    assert len(program.weights) > 30
    save(program, tmp_path / "bert.fcir.json")
    loaded = load(tmp_path / "bert.fcir.json")  # verifies on load
    assert format_program(loaded) == format_program(program)
    for _ in range(2):
        ids = torch.randint(0, 120, (2, 9))
        with torch.no_grad():
            ref = model(ids)
            for p in (program, loaded):
                got = interpret(p, ids)
                assert torch.allclose(got[0], ref.last_hidden_state, atol=1e-5)
                assert torch.allclose(got[1], ref.pooler_output, atol=1e-5)


def test_checkpoint_programs_convert_to_fx():
    from test_passes import checkpoint_program

    program = checkpoint_program()
    gm = to_fx(program)
    for _ in range(2):
        x = torch.randn(4)
        _same(gm(x), interpret(program, x))
        _same(gm(x), (torch.sin(x).exp() + torch.sin(x),))


@pytest.mark.parametrize("shape", [(3, 4), (5, 2), (1, 7)])
def test_symbolic_arguments_become_size_arithmetic_in_fx(shape):
    from test_interpreter import _aten_symbolic_view

    program, ref, _ = _aten_symbolic_view()
    gm = to_fx(program)
    assert "sym_size" in gm.code
    x = torch.randn(*shape)
    _same(gm(x), ref(x))
    _same(gm(x), interpret(program, x))


def test_tensor_meta_from_shape_propagation_is_enough():
    from torch.fx.passes.shape_prop import ShapeProp

    model, inputs = _module("multi out")
    gm = torch.fx.symbolic_trace(model)
    ShapeProp(gm).propagate(*inputs())
    program = from_fx(gm)  # no example inputs: node.meta["tensor_meta"] carries the types
    verify(program)
    args = inputs()
    _same(interpret(program, *args), model(*args))


@pytest.mark.parametrize("dynamic", [False, True])
def test_dynamo_graphs_convert_and_run_through_the_interpreter(dynamic):
    """The shape of ``torch.compile(model, backend="fireclay")``: Dynamo's fx graph in, our
    Program, the reference interpreter as the compiled function."""
    from fireclay_ir import check_boundary

    programs = []

    def backend(gm, example_inputs):
        program = check_boundary(verify(from_fx(gm, example_inputs)), "fx import")
        programs.append(program)
        return lambda *args: interpret(program, *args)

    model, _ = _module("attention")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    for batch, n in ((2, 5), (3, 7)) if dynamic else ((2, 5), (2, 5)):
        args = (torch.randn(batch, n, 16),)
        _same((compiled(*args),), model(*args))
    assert len(programs) == 1
    assert {n.dialect for n in programs[0].main.nodes} == {"torch"}
    if dynamic:
        assert [s.hint for s in programs[0].symbols.values()] == [2, 5]


def _pad_then_loss(logits, labels):
    # What TorchDynamo records for F.pad and F.cross_entropy: the private C functions under them
    # (torch._C._nn.pad, torch._C._nn.cross_entropy_loss with an integer reduction).
    shifted = torch._C._nn.pad(labels, (0, 1), "constant", -100)[..., 1:]
    loss = torch._C._nn.cross_entropy_loss(logits.flatten(0, 1), shifted.flatten(), None, 1, -100, 0.0)
    summed = torch._C._nn.nll_loss_nd(logits.log_softmax(-1).flatten(0, 1), shifted.flatten(), None, 2, -100)
    return loss, summed, torch._C._nn.silu(logits), torch._C._nn.hardtanh(logits, -0.5, 0.5)


@pytest.mark.parametrize("trace", ["symbolic_trace", "dynamo"])
def test_private_nn_functions_convert_as_their_public_calls(trace):
    logits, labels = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    if trace == "symbolic_trace":
        graphs = [torch.fx.symbolic_trace(_pad_then_loss)]
    else:  # GPT-2's loss through torch.compile(backend=...): the graph TorchDynamo hands over
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm

        def loss_fn(logits, labels):
            shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]
            return F.cross_entropy(logits.flatten(0, 1), shifted.flatten(), ignore_index=-100)

        torch._dynamo.reset()
        torch.compile(loss_fn, backend=backend, fullgraph=True)(logits, labels)
    gm = graphs[0]
    # TorchDynamo orders its placeholders by first use: bind the inputs by name.
    order = ["labels" in n.name for n in gm.graph.nodes if n.op == "placeholder"]
    program = verify(from_fx(gm, tuple(labels if is_labels else logits for is_labels in order)))
    ops = {n.op for n in program.main.nodes}
    assert "torch::torch.nn.functional.pad" in ops
    assert "torch::torch.nn.functional.cross_entropy" in ops
    assert all(op.split("::", 1)[1].split(".")[0] != "_C" for op in ops), ops
    for _ in range(2):
        logits, labels = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
        args = tuple(labels if is_labels else logits for is_labels in order)
        _same(interpret(program, *args), gm(*args))
