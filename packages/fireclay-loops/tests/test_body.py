"""Loop bodies are recorded define-by-run and replayed on any handler."""

import pytest

from fireclay_loops import exprs, ops, record_body, use_handler


def record_axpy():
    dtypes = {"x": "float32", "y": "float32", "out": "float32"}

    def fn(vars, _r):
        i0, i1 = vars
        idx = 8 * i0 + i1
        v = ops.add(ops.mul(ops.constant(2.0, "float32"), ops.load("x", idx)), ops.load("y", idx))
        ops.store("out", idx, v)

    return record_body([4, 8], [], fn, dtypes.__getitem__)


def test_recording_infers_dtypes_and_lists_accesses():
    body = record_axpy()
    assert [op.name for op in body.ops] == ["constant", "load", "mul", "load", "add", "store"]
    assert [op.dtype for op in body.ops][:5] == ["float32"] * 5
    assert [b for b, _, _ in body.reads()] == ["x", "y"]
    assert [(b, exprs.to_str(i)) for b, i, _ in body.writes()] == [("out", "8*i0 + i1")]


class Interpreter:
    """A tiny handler: runs the body at one point with dict-backed memory."""

    def __init__(self, memory, point):
        self.memory, self.point = memory, point

    def load(self, buf, index):
        return self.memory[buf][exprs.evaluate(index, self.point)]

    def store(self, buf, index, value):
        self.memory[buf][exprs.evaluate(index, self.point)] = value

    def constant(self, value, dtype):
        return value

    def add(self, a, b):
        return a + b

    def mul(self, a, b):
        return a * b


def test_the_same_body_runs_on_another_handler():
    body = record_axpy()
    mem = {"x": list(range(32)), "y": [1.0] * 32, "out": [None] * 32}
    for i0 in range(4):
        for i1 in range(8):
            body.run(Interpreter(mem, {"i0": i0, "i1": i1}))
    assert mem["out"] == [2.0 * k + 1.0 for k in range(32)]


def test_substitution_moves_a_body_into_kernel_variables():
    body = record_axpy()
    seen = []

    class Spy(Interpreter):
        def load(self, buf, index):
            seen.append(exprs.to_str(index))
            return 0.0

        def store(self, buf, index, value):
            seen.append(exprs.to_str(index))

    x0, r0 = exprs.symbol("x0"), exprs.symbol("r0")
    body.run(Spy({}, {}), {body.vars[0]: x0, body.vars[1]: r0})
    assert seen == ["r0 + 8*x0"] * 3


def test_ops_outside_a_handler_and_unknown_ops_are_errors():
    with pytest.raises(RuntimeError, match="outside a handler"):
        ops.add(1, 2)
    with pytest.raises(AttributeError, match="not in the loop-body vocabulary"):
        ops.__getattr__("frobnicate")
    with use_handler(Interpreter({}, {})):
        assert ops.add(1, 2) == 3
