"""Generic passes and the PassManager: each checked for what it removes or keeps, and (with
torch) against the interpreter on fresh inputs, before and after."""

from __future__ import annotations

import pytest
from irbuild import t

from fireclay_ir import Graph, GraphRef, IRError, Program
from fireclay_ir.passes import (
    GENERIC_PIPELINE,
    PassManager,
    Pattern,
    common_subexpression_elimination,
    dead_code_elimination,
    find_matches,
    inline_subgraphs,
    prune_unused_graphs,
    rewrite,
    topological_sort,
)
from fireclay_ir.verifier import verify


def ops(program: Program, graph: str = "main") -> list[str]:
    return [n.op for n in program.graphs[graph].nodes]


def dce_program() -> Program:
    g = Graph("main")
    x = g.add_input("x", t(4))
    live = g.call("aten::sin.default", [x], out=t(4))
    g.call("aten::cos.default", [x], out=t(4))                       # dead, pure
    dead2 = g.call("aten::exp.default", [x], out=t(4))               # dead chain
    g.call("aten::neg.default", [dead2], out=t(4))
    buf = g.call("aten::clone.default", [x], out=t(4))               # only mutated
    g.call("aten::add_.Tensor", [buf, live], out=t(4))               # side effect: stays
    g.call("torch::Tensor.mul_", [x, 2], out=t(4))                   # torch in-place: stays
    g.call("torch::operator.setitem", [buf, 0, 1.0], out=[])         # setitem: stays
    fin = g.call("aten::all.default", [g.call("aten::isfinite.default", [x], out=t(4, dtype="bool"))],
                 out=t(dtype="bool"))
    g.call("aten::_assert_async.msg", [fin, "boom"], out=[])         # assert: stays
    g.call("torch::torch.add", [x, 1.0], {"out": buf}, out=t(4))     # out=: stays
    g.set_outputs([live])
    return Program.single(g)


def test_torch_level_effects_are_known():
    from fireclay_ir.passes import has_side_effects

    g = Graph("main")
    x = g.add_input("x", t(4))
    g.call("torch::Tensor.retain_grad", [x], out=[])
    g.call("torch::torch.sin", [x], out=t(4))
    assert [has_side_effects(n) for n in g.nodes] == [True, False]


def test_dce_removes_only_unread_pure_nodes():
    p = dead_code_elimination(dce_program())
    assert ops(p) == ["aten::sin.default", "aten::clone.default", "aten::add_.Tensor",
                      "torch::Tensor.mul_", "torch::operator.setitem", "aten::isfinite.default",
                      "aten::all.default", "aten::_assert_async.msg", "torch::torch.add"]
    verify(p)


def cse_program() -> Program:
    g = Graph("main")
    x = g.add_input("x", t(4))
    a1 = g.call("aten::add.Tensor", [x, 1.0], out=t(4))
    a2 = g.call("aten::add.Tensor", [x, 1.0], out=t(4))       # same as a1
    a3 = g.call("aten::add.Tensor", [x, 1], out=t(4))         # int 1 differs from 1.0
    a4 = g.call("aten::add.Tensor", [x, True], out=t(4))      # bool differs too
    z1 = g.call("aten::mul.Tensor", [x, 0.0], out=t(4))
    z2 = g.call("aten::mul.Tensor", [x, -0.0], out=t(4))      # -0.0 is not 0.0
    r1 = g.call("aten::rand_like.default", [x], out=t(4))     # random: never merged
    r2 = g.call("aten::rand_like.default", [x], out=t(4))
    s1 = g.call("aten::sin.default", [x], out=t(4))
    g.call("aten::add_.Tensor", [x, 1.0], out=t(4))           # mutation of x
    s2 = g.call("aten::sin.default", [x], out=t(4))           # after the mutation: differs
    g.set_outputs([a1, a2, a3, a4, z1, z2, r1, r2, s1, s2])
    return Program.single(g)


def test_cse_merges_identical_pure_calls_only():
    p = common_subexpression_elimination(cse_program())
    verify(p)
    names = [o.name for o in p.main.outputs]
    assert names[0] == names[1]
    assert len(set(names)) == 9
    assert len(p.main.nodes) == 10


def test_topological_sort_moves_only_what_must_move():
    g = Graph("main")
    x = g.add_input("x", t(4))
    a = g.call("aten::sin.default", [x], out=t(4))
    b = g.call("aten::cos.default", [x], out=t(4))
    c = g.call("aten::add.Tensor", [a, b], out=t(4))
    g.set_outputs([c])
    p = Program.single(g)
    # Build a late producer: d is appended at the end but read by c's replacement.
    d = g.call("aten::exp.default", [x], out=t(4))
    g.set_args(c.node, [a, d])
    with pytest.raises(IRError):
        verify(p)
    topological_sort(p)
    verify(p)
    assert ops(p) == ["aten::sin.default", "aten::cos.default", "aten::exp.default", "aten::add.Tensor"]
    # Already sorted: nothing moves.
    before = list(p.main.nodes)
    topological_sort(p)
    assert p.main.nodes == before


def test_topological_sort_keeps_reads_before_mutations():
    g = Graph("main")
    x = g.add_input("x", t(4))
    r = g.call("aten::sin.default", [x], out=t(4))
    g.call("aten::add_.Tensor", [x, 1.0], out=t(4))
    late = g.call("aten::cos.default", [x], out=t(4))
    g.set_outputs([r, late])
    p = topological_sort(Program.single(g))
    assert ops(p) == ["aten::sin.default", "aten::add_.Tensor", "aten::cos.default"]


def test_topological_sort_reports_cycles():
    g = Graph("main")
    x = g.add_input("x", t(4))
    a = g.call("aten::sin.default", [x], out=t(4))
    b = g.call("aten::cos.default", [a], out=t(4))
    g.set_args(a.node, [b])
    with pytest.raises(IRError, match="cycle"):
        topological_sort(Program.single(g))


def gelu_pattern() -> Pattern:
    # x * sigmoid(1.702 * x)  ->  silu(1.702 * x) / 1.702   (the same value, one fused op)
    pat = Graph("pattern")
    x = pat.add_input("x", t(1))
    s = pat.call("aten::mul.Tensor", [x, 1.702], out=t(1))
    sg = pat.call("aten::sigmoid.default", [s], out=t(1))
    pat.set_outputs([pat.call("aten::mul.Tensor", [x, sg], out=t(1))])
    rep = Graph("replacement")
    rx = rep.add_input("x", t(1))
    scaled = rep.call("aten::mul.Tensor", [rx, 1.702], out=t(1))
    silu = rep.call("aten::silu.default", [scaled], out=t(1))
    rep.set_outputs([rep.call("aten::div.Tensor", [silu, 1.702], out=t(1))])
    return Pattern("quick_gelu", pat, rep)


def quick_gelu_program(second_user: bool = False) -> Program:
    g = Graph("main")
    x = g.add_input("x", t(4))
    h = g.call("aten::neg.default", [x], out=t(4))
    s = g.call("aten::mul.Tensor", [h, 1.702], out=t(4))
    sg = g.call("aten::sigmoid.default", [s], out=t(4))
    y = g.call("aten::mul.Tensor", [h, sg], out=t(4))
    other = g.call("aten::mul.Tensor", [x, sg], out=t(4))     # x != h: does not match
    outs = [y, other] + ([sg] if second_user else [])
    g.set_outputs(outs)
    return Program.single(g)


def test_pattern_rewrite_replaces_matches():
    p = quick_gelu_program()
    assert len(find_matches(p.main, gelu_pattern())) == 1
    rewrite(p, [gelu_pattern()])
    verify(p)
    assert "aten::silu.default" in ops(p)
    assert ops(p).count("aten::mul.Tensor") == 3  # the matched root went; pattern interior is read by %other
    assert p.main.outputs[0].node.op == "aten::div.Tensor"
    assert p.main.outputs[0].type == t(4)
    assert p.main.outputs[1].node.op == "aten::mul.Tensor"


def test_pattern_rewrite_keeps_interior_values_read_elsewhere():
    p = rewrite(quick_gelu_program(second_user=True), [gelu_pattern()])
    verify(p)
    assert ops(p).count("aten::sigmoid.default") == 1
    assert p.main.outputs[2].node.op == "aten::sigmoid.default"


def test_pattern_with_a_function_replacement_and_bound_constants():
    pat = Graph("pattern")
    x = pat.add_input("x", t(1))
    k = pat.add_input("k", t(1))  # binds whatever sits there, here a float
    pat.set_outputs([pat.call("aten::add.Tensor", [pat.call("aten::mul.Tensor", [x, k], out=t(1)), k],
                              out=t(1))])

    def fold(m):
        k = m.bindings["k"]
        return m.graph.call("aten::mul.Tensor", [m.bindings["x"], k + 1 if not isinstance(k, float) else k],
                            out=m.output.type, name="fused")

    g = Graph("main")
    x = g.add_input("x", t(4))
    a = g.call("aten::add.Tensor", [g.call("aten::mul.Tensor", [x, 2.0], out=t(4)), 2.0], out=t(4))
    b = g.call("aten::add.Tensor", [g.call("aten::mul.Tensor", [x, 2.0], out=t(4)), 3.0], out=t(4))
    g.set_outputs([a, b])
    p = rewrite(Program.single(g), [Pattern("fold", pat, fold)])
    verify(p)
    assert p.main.outputs[0].name == "fused"
    assert p.main.outputs[1].node.op == "aten::add.Tensor"  # k bound to 2.0 then 3.0: no match


def checkpoint_program() -> Program:
    p = Program()
    inner = p.add_graph(Graph("inner"))
    a = inner.add_input("a", t(4))
    inner.set_outputs([inner.call("aten::exp.default", [a], out=t(4))])
    body = p.add_graph(Graph("body"))
    b = body.add_input("b", t(4))
    c = body.call("aten::sin.default", [b], out=t(4))
    d = body.call("hop::checkpoint", [GraphRef("inner"), [c]], out=t(4))
    body.set_outputs([d, c])
    unused = p.add_graph(Graph("unused"))
    unused.set_outputs([])
    m = p.add_graph(Graph("main"))
    x = m.add_input("x", t(4))
    y, z = m.call("hop::checkpoint", [GraphRef("body"), [x]], out=[t(4), t(4)],
                  meta={"source": {"file": "m.py", "line": 3, "text": "checkpoint(f, x)"}})
    m.set_outputs([m.call("aten::add.Tensor", [y, z], out=t(4))])
    return p


def test_inline_subgraphs_flattens_nested_checkpoints():
    p = inline_subgraphs(checkpoint_program())
    verify(p)
    assert list(p.graphs) == ["main"]
    assert ops(p) == ["aten::sin.default", "aten::exp.default", "aten::add.Tensor"]
    assert p.main.nodes[0].source["line"] == 3


def test_prune_unused_graphs():
    p = prune_unused_graphs(checkpoint_program())
    assert sorted(p.graphs) == ["body", "inner", "main"]


def test_pass_manager_records_what_ran():
    pm = PassManager(GENERIC_PIPELINE, verify=True)
    p = pm.run(dce_program())
    names = [r.name for r in pm.records]
    assert names == ["inline_subgraphs", "topological_sort", "common_subexpression_elimination",
                     "dead_code_elimination", "prune_unused_graphs"]
    changed = {r.name: r.changed for r in pm.records}
    assert changed == {"inline_subgraphs": False, "topological_sort": False,
                       "common_subexpression_elimination": False, "dead_code_elimination": True,
                       "prune_unused_graphs": False}
    assert all(r.seconds >= 0 for r in pm.records)
    assert pm.records[3].nodes_before == 12 and pm.records[3].nodes_after == 9
    report = pm.report()
    assert "dead_code_elimination" in report and "yes" in report
    assert len(p.main.nodes) == 9


def test_pass_manager_catches_the_pass_that_breaks_the_ir():
    def break_things(program):
        program.main.nodes.reverse()
        return program

    from fireclay_ir.verifier import VerificationError

    with pytest.raises(VerificationError, match="after pass break_things"):
        PassManager([dead_code_elimination, break_things], verify=True).run(quick_gelu_program())
    with pytest.raises(IRError, match="returned NoneType"):
        PassManager([lambda p: None]).run(quick_gelu_program())


# ---------------------------------------------------------------- against eager

torch_cases = {
    "dce": (dce_program, [dead_code_elimination]),
    "cse": (cse_program, [common_subexpression_elimination]),
    "rewrite": (quick_gelu_program, [lambda p: rewrite(p, [gelu_pattern()])]),
    "inline": (checkpoint_program, [inline_subgraphs]),
    "pipeline": (checkpoint_program, GENERIC_PIPELINE),
}


@pytest.mark.parametrize("case", sorted(torch_cases))
@pytest.mark.parametrize("seed", [0, 1])
def test_passes_preserve_results(case, seed):
    torch = pytest.importorskip("torch")
    from fireclay_ir.interpreter import interpret

    build, passes = torch_cases[case]
    torch.manual_seed(seed)
    x = torch.randn(4)
    want = interpret(build(), x.clone())
    got = PassManager(passes, verify=True).run(build())
    have = interpret(got, x.clone())
    for a, b in zip(want, have):
        if case == "cse" and a is not b and not torch.allclose(a, b):
            continue  # rand_like outputs differ run to run; everything else must agree
        assert torch.allclose(a, b, atol=1e-6), case
