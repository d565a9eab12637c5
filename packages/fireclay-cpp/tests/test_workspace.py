"""The wrapper's workspace and its extern calls: the arena and its views made once and kept
between calls (small arenas), larger arenas taken from and given back to the process's one kept
block (``runtime.ArenaStore``), outputs that never share memory with a reused arena, calls from
several threads and from inference mode; matmuls with a transposed weight called as ``linear``;
views made once per call. Every result is checked against eager on fresh random inputs."""

from __future__ import annotations

import re
import threading

import pytest
import torch
from aten_builder import AtenBuilder
from batch import SEED

import fireclay_cpp
from fireclay_cpp import Config, runtime

GEN = torch.Generator().manual_seed(SEED)


def _randn(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=GEN, dtype=torch.float64).to(dtype)


def _fresh(b: AtenBuilder) -> list[torch.Tensor]:
    return [_randn(*h.meta.shape, dtype=h.meta.dtype) for h in b.inputs]


def _mlp(rows: int = 12, width: int = 16, depth: int = 2):
    """linear -> gelu -> linear ...: extern calls into arena buffers with kernels between them."""
    b = AtenBuilder()
    h = b.input(_randn(rows, width), "x")
    for layer in range(depth):
        w = b.input(_randn(width, width), f"w{layer}")
        bias = b.input(_randn(width), f"b{layer}")
        h = b.call("gelu.default", b.call("addmm.default", bias, h, b.call("permute.default", w, [1, 0])))
    return b, b.output(b.call("_softmax.default", h, 1, False))


# how a program gets its arena: kept with its views, from the process's block, new every call
ARENAS = {"kept": {}, "store": {"keep_arena_bytes": 0}, "per_call": {"keep_arena_bytes": 0, "reuse_arena_bytes": 0}}


def _compile(program, keep: int | None = None, arena: str | None = None):
    settings = ARENAS[arena] if arena is not None else ({} if keep is None else {"keep_arena_bytes": keep})
    return fireclay_cpp.compile_program(program, cfg=Config(**settings))


class _RecordingStore(runtime.ArenaStore):
    """The process's store, noting the address of every block it hands out."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: list[int] = []

    def take(self, nbytes: int):
        block = super().take(nbytes)
        self.taken.append(block.data_ptr())
        return block


@pytest.fixture
def store(monkeypatch):
    """A store of the test's own: programs compiled in the test bind it."""
    own = _RecordingStore()
    monkeypatch.setattr(runtime, "arena_store", own)
    return own


def _check(compiled, b, inputs, tol=1e-5):
    got = compiled(*inputs)
    for g, w in zip(got, b.eager(*inputs)):
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)
    return got


@pytest.mark.parametrize("arena", sorted(ARENAS))
def test_outputs_of_earlier_calls_survive_later_calls(arena, store):
    b, program = _mlp()
    compiled = _compile(program, arena=arena)
    text = compiled.wrapper_source
    assert "def new_workspace():" in text and ("workspaces.append(ws)" in text) == (arena == "kept")
    assert ("take_arena(" in text and "give_arena(arena)" in text) == (arena == "store")
    first_inputs = _fresh(b)
    first = [t.clone() for t in _check(compiled, b, first_inputs)]
    kept = compiled(*first_inputs)
    for _ in range(3):
        _check(compiled, b, _fresh(b))
    for k, f in zip(kept, first):
        torch.testing.assert_close(k, f, atol=0, rtol=0)


def test_each_view_of_the_arena_is_made_once():
    b, program = _mlp(depth=3)
    text = _compile(program).wrapper_source
    call = text.split("def new_workspace():")[0]
    assert "as_strided" not in call  # every view of the arena is the workspace's
    views = re.findall(r"as_strided\(\([^)]*\), \([^)]*\), \d+\)", text.split("def new_workspace():")[1])
    assert views and len(views) == len(set(views))
    uses = re.findall(r"\bws\d+\b", call.split(" = ws\n", 1)[1])
    assert len(uses) > len(views)  # the same views serve several calls of the program's externs


@pytest.mark.parametrize("arena", ["kept", "store"])
def test_an_output_that_views_the_arena_keeps_it(arena, store):
    """A bit cast (a library call returning a view of its argument) of an intermediate in the
    arena: the output shares the arena's memory, so the next call must not reuse that arena."""
    b = AtenBuilder()
    x = b.input(_randn(6, 8), "x")
    program = b.output(b.call("view.dtype", b.call("exp.default", x), torch.int32))
    compiled = _compile(program, arena=arena)
    assert "untyped_storage().data_ptr() != arena_ptr" in compiled.wrapper_source
    inputs = _fresh(b)
    (first,) = _check(compiled, b, inputs)
    want = first.clone()
    for _ in range(2):
        _check(compiled, b, _fresh(b))
    torch.testing.assert_close(first, want, atol=0, rtol=0)


def test_only_results_that_may_view_an_argument_are_checked_against_the_arena():
    b = AtenBuilder()
    e = b.call("exp.default", b.input(_randn(6, 8), "x"))  # an intermediate: in the arena
    product = b.call("mm.default", e, b.input(_randn(8, 3), "w"))  # a new tensor
    windows = b.call("view.dtype", e, torch.int32)  # a view of the arena (a bit cast)
    compiled = _compile(b.output(product, windows))
    text = compiled.wrapper_source
    returned = text.split("    return (", 1)[1].split(")")[0].split(", ")
    assert f"{returned[1]}.untyped_storage()" in text and f"{returned[0]}.untyped_storage()" not in text
    for _ in range(2):
        _check(compiled, b, _fresh(b))


@pytest.mark.parametrize("arena", ["kept", "store"])
def test_calls_from_several_threads_at_once(arena, store):
    """Each call runs in a workspace no other call uses: results are those of calls one at a time,
    bit for bit, and match eager."""
    b, program = _mlp(rows=64, width=64, depth=3)
    compiled = _compile(program, arena=arena)
    cases = [_fresh(b) for _ in range(6)]
    alone = [_check(compiled, b, c, tol=1e-4) for c in cases]
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def work(offset: int) -> None:
        try:
            barrier.wait()
            for i in range(30):
                case = (i + offset) % len(cases)
                for g, w in zip(compiled(*cases[case]), alone[case]):
                    assert torch.equal(g, w)
        except BaseException as e:  # noqa: BLE001 - reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.parametrize("arena", ["kept", "store"])
def test_a_workspace_made_in_inference_mode_serves_normal_mode(arena, store):
    b, program = _mlp()
    compiled = _compile(program, arena=arena)
    with torch.inference_mode():
        _check(compiled, b, _fresh(b))
    with torch.no_grad():
        _check(compiled, b, _fresh(b))
    _check(compiled, b, _fresh(b))


def test_a_larger_arena_is_the_same_memory_every_call(store):
    """An arena over keep_arena_bytes is not allocated anew each call (the C library would hand
    it back to the system and fault its pages in again, one per 4 KiB): every call after the
    first runs in the block the first gave back."""
    b, program = _mlp(rows=64, width=64, depth=3)
    compiled = _compile(program, arena="store")
    for _ in range(4):
        _check(compiled, b, _fresh(b), tol=1e-4)
    assert len(store.taken) == 4 and len(set(store.taken)) == 1
    size = int(re.search(r"take_arena\((\d+)\)", compiled.wrapper_source).group(1))
    assert size <= store.held_bytes < size + runtime.ArenaStore.ALIGN


def test_programs_share_one_block_the_size_of_the_largest_arena(store):
    """Two programs taking turns (a training step's forward and backward): the store holds one
    block, as large as the larger arena, and both run in it; results stay right."""
    small, small_program = _mlp(rows=8, width=16)
    large, large_program = _mlp(rows=64, width=64, depth=3)
    first, second = _compile(small_program, arena="store"), _compile(large_program, arena="store")
    sizes = [int(re.search(r"take_arena\((\d+)\)", c.wrapper_source).group(1)) for c in (first, second)]
    assert sizes[0] < sizes[1]
    for _ in range(3):
        _check(first, small, _fresh(small))
        _check(second, large, _fresh(large), tol=1e-4)
    assert len(set(store.taken[1:])) == 1  # after the first block grew to the larger arena
    assert sizes[1] <= store.held_bytes < sizes[1] + runtime.ArenaStore.ALIGN


def test_a_per_call_arena_is_never_kept(store):
    b, program = _mlp()
    compiled = _compile(program, arena="per_call")
    assert "take_arena(" not in compiled.wrapper_source
    for _ in range(2):
        _check(compiled, b, _fresh(b))
    assert store.taken == [] and store.held_bytes == 0


BIASES = {"none": None, "row": (16,), "full": (12, 16), "broadcast_row": (1, 16)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("bias", sorted(BIASES))
@pytest.mark.parametrize("out", [False, True], ids=["result", "into_arena"])
def test_matmul_with_a_transposed_weight_runs_as_linear(bias, out, dtype):
    b = AtenBuilder()
    x = b.input(_randn(12, 8, dtype=dtype), "x")
    w = b.call("permute.default", b.input(_randn(16, 8, dtype=dtype), "w"), [1, 0])
    if BIASES[bias] is None:
        y = b.call("mm.default", x, w)
    else:
        y = b.call("addmm.default", b.input(_randn(*BIASES[bias], dtype=dtype), "bias"), x, w)
    program = b.output(b.call("tanh.default", y) if out else y)
    compiled = _compile(program)
    assert "linear(" in compiled.wrapper_source
    for _ in range(2):
        _check(compiled, b, _fresh(b), tol=1e-6 if dtype == torch.float32 else 1e-12)


def test_a_weight_that_is_not_a_plain_transpose_stays_a_matmul():
    b = AtenBuilder()
    x = b.input(_randn(12, 8), "x")
    w = b.input(_randn(8, 16), "w")  # row-major already: no transpose to fold
    program = b.output(b.call("addmm.default", b.input(_randn(16), "bias"), x, w))
    compiled = _compile(program)
    assert "linear(" not in compiled.wrapper_source
    _check(compiled, b, _fresh(b))


def test_reshapes_of_a_buffer_are_made_once_per_call():
    """(batch, seq, hidden) activations reshaped to (tokens, hidden) for three matmuls."""
    b = AtenBuilder()
    x = b.input(_randn(2, 5, 8), "x")
    h = b.call("view.default", b.call("exp.default", x), [10, 8])
    outs = [b.call("mm.default", h, b.input(_randn(8, 4), f"w{i}")) for i in range(3)]
    program = b.output(*outs, b.call("exp.default", x))
    compiled = _compile(program, keep=0)
    text = compiled.wrapper_source
    assert text.count(".view((10, 8))") + text.count("as_strided((10, 8)") == 1
    for _ in range(2):
        _check(compiled, b, _fresh(b))


def test_a_leading_slice_of_a_buffer_is_not_taken_for_a_reshape():
    """Rows 0..2 of a (6, 4) buffer are row-major at offset 0 but not the whole buffer."""
    b = AtenBuilder()
    x = b.input(_randn(6, 4), "x")
    e = b.call("exp.default", x)
    rows = b.call("slice.Tensor", e, 0, 0, 3)
    program = b.output(b.call("mm.default", rows, b.input(_randn(4, 5), "w")), e)
    for keep in (None, 0):
        compiled = _compile(program, keep)
        for _ in range(2):
            _check(compiled, b, _fresh(b))


def test_linear_is_decided_outside_tensor_modes_only(monkeypatch):
    """Under a fake-tensor mode the bit-for-bit check cannot run: nothing is decided then."""
    import fireclay_cpp.runtime as runtime
    from fireclay_shapes.torch import FakeMode

    monkeypatch.setattr(runtime, "_LINEAR_OUT", [])
    with FakeMode():
        assert runtime.linear_out() is None
    assert runtime._LINEAR_OUT == []
    assert runtime.linear_out() is torch.nn.functional.linear and runtime._LINEAR_OUT
