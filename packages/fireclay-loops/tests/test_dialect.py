"""A scheduled program round-trips through fireclay-ir's loops dialect and serializer."""

import pytest
from hand import Hand, layer_norm_decomposed, softmax_decomposed, t

import fireclay_ir
from fireclay_ir.verifier import verify
from fireclay_loops import lower, schedule
from fireclay_loops.dialect import from_program, register, to_program


def gelu_mm(h):
    x, w, b = h.input("x", 4, 6), h.input("w", 6, 8), h.input("b", 8)
    m = h.op("mm.default", x, w, out=t(4, 8))
    return h.program(h.op("gelu.default", h.op("add.Tensor", m, b, out=t(4, 8)), out=t(4, 8)))


def layer_norm(h):
    x, w, b = h.input("x", 4, 8), h.input("w", 8), h.input("b", 8)
    return h.program(layer_norm_decomposed(h, x, w, b, 4, 8))


def softmax(h):
    return h.program(softmax_decomposed(h, h.input("x", 4, 8), 4, 8))


def gather_cat(h):
    x, i = h.input("x", 4, 8), h.input("i", 4, 3, dtype="int64")
    g = h.op("gather.default", x, 1, i, out=t(4, 3))
    c = h.op("cat.default", [g, x], 1, out=t(4, 11))
    return h.program(h.op("constant_pad_nd.default", c, [1, 0], -1.0, out=t(4, 12)))


def fallback_and_views(h):
    x = h.input("x", 4, 8)
    c = h.op("cumsum.default", h.op("t.default", x, out=t(8, 4)), 1, out=t(8, 4))
    return h.program(h.op("amax.default", c, [0], out=t(4)), 3)


PROGRAMS = [gelu_mm, layer_norm, softmax, gather_cat, fallback_and_views]


@pytest.mark.parametrize("build", PROGRAMS, ids=[p.__name__ for p in PROGRAMS])
def test_round_trip_through_json(build):
    scheduled = schedule(lower(build(Hand())))
    program = to_program(scheduled)
    verify(program)
    text = fireclay_ir.dumps(program)
    back = from_program(fireclay_ir.loads(text))
    assert str(back) == str(scheduled)
    assert str(back.report()) == str(scheduled.report())
    assert fireclay_ir.dumps(to_program(back)) == text


def test_round_trip_through_files(tmp_path):
    scheduled = schedule(lower(gelu_mm(Hand())))
    path = tmp_path / "gelu.fcir.json"
    fireclay_ir.save(to_program(scheduled), path)
    assert str(from_program(fireclay_ir.load(path))) == str(scheduled)


def test_round_tripped_program_runs_like_eager():
    torch = pytest.importorskip("torch")
    from fireclay_loops.reference import run

    back = from_program(fireclay_ir.loads(fireclay_ir.dumps(to_program(schedule(lower(gather_cat(Hand())))))))
    x, i = torch.randn(4, 8), torch.randint(0, 8, (4, 3))
    want = torch.nn.functional.pad(torch.cat([x.gather(1, i), x], 1), [1, 0], value=-1.0)
    torch.testing.assert_close(run(back, x, i)[0], want)


def test_loops_ops_are_registered_with_fireclay_ir():
    register()
    from fireclay_ir.dialects import lookup_op

    assert lookup_op("loops::load").is_pure
    assert not lookup_op("loops::store").is_pure
    assert lookup_op("loops::random").nondeterministic


def test_a_body_with_a_foreign_op_is_refused():
    program = to_program(schedule(lower(softmax(Hand()))))
    body = next(g for name, g in program.graphs.items() if name != "main")
    body.call("aten::relu.default", (), out=None)
    with pytest.raises(fireclay_ir.IRError, match="not a loop-body op"):
        from_program(program)


def test_the_fireclay_ir_verifier_applies_the_loops_rules():
    program = to_program(schedule(lower(softmax(Hand()))))
    body = next(g for name, g in program.graphs.items() if name != "main")
    body.call("aten::relu.default", (), out=None)
    with pytest.raises(fireclay_ir.IRError, match="not a loop-body op"):
        verify(program)
