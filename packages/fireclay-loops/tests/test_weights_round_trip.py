"""``to_program``/``from_program`` keep what each input is (user input, parameter, buffer,
constant) and the program's weights, through the text form and through files."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aten_builder import AtenBuilder  # noqa: E402

import fireclay_ir  # noqa: E402
from fireclay_ir import InputSpec, Weight  # noqa: E402
from fireclay_ir.verifier import verify  # noqa: E402
from fireclay_loops import lower, schedule  # noqa: E402
from fireclay_loops.dialect import from_program, to_program  # noqa: E402
from fireclay_loops.reference import run  # noqa: E402

# (input name, its kind) for a linear layer with a running-mean buffer and a lifted constant
INPUTS = [("x", "user"), ("weight", "parameter"), ("bias", "parameter"),
          ("running_mean", "buffer"), ("scale", "constant"), ("y", "user")]
SHAPES = {"x": (3, 5), "weight": (4, 5), "bias": (4,), "running_mean": (4,), "scale": (4,), "y": (3, 4)}


def build(gen, order):
    b = AtenBuilder()
    tensors = {n: torch.randn(SHAPES[n], generator=gen) for n, _ in order}
    h = {n: b.input(tensors[n], n) for n, _ in order}
    lin = b.call("addmm.default", h["bias"], h["x"], b.call("t.default", h["weight"]))
    centred = b.call("sub.Tensor", lin, h["running_mean"])
    out = b.call("add.Tensor", b.call("mul.Tensor", centred, h["scale"]), h["y"])
    program = b.output(out)
    for v, (n, kind) in zip(program.main.inputs, order):
        if kind != "user":
            target = f"layer.{n}"
            program.main.input_specs[list(program.main.inputs).index(v)] = InputSpec(kind, target)
            program.weights[target] = Weight(v.meta, tensors[n])
    return b, program, tensors


def specs(program):
    return [(s.kind, s.target) for s in program.main.input_specs]


@pytest.mark.parametrize("rotation", range(3))
def test_input_kinds_and_weights_survive_the_round_trip(rotation, tmp_path):
    gen = torch.Generator().manual_seed(rotation)
    order = INPUTS[rotation:] + INPUTS[:rotation]  # parameters at the front, middle, back
    b, program, tensors = build(gen, order)
    scheduled = schedule(lower(program))
    assert sorted(s.kind for s in scheduled.program.input_specs.values()) == ["buffer", "constant",
                                                                             "parameter", "parameter"]
    loops = to_program(scheduled)
    verify(loops)
    assert specs(loops) == specs(program)
    assert set(loops.weights) == set(program.weights)
    for back in (fireclay_ir.loads(fireclay_ir.dumps(loops)), None):
        if back is None:
            fireclay_ir.save(loops, tmp_path / "p.fcir.json")
            back = fireclay_ir.load(tmp_path / "p.fcir.json")
        assert specs(back) == specs(program)
        for target, w in program.weights.items():
            assert back.weights[target].meta == w.meta
            if back.weights[target].data is not None:
                torch.testing.assert_close(back.weights[target].data, w.data)
        again = from_program(back)
        assert again.program.input_specs == scheduled.program.input_specs
        assert str(again) == str(scheduled)
        assert specs(to_program(again)) == specs(program)
        fresh = [torch.randn(SHAPES[n], generator=gen) for n, _ in order]
        torch.testing.assert_close(run(again, *fresh)[0], b.eager(*fresh)[0], atol=1e-5, rtol=1e-5)
