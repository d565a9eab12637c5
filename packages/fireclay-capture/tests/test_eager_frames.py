"""A function whose capture gave up runs eagerly, and the functions and modules it calls are
still captured on their own (as TorchDynamo's frame hook stays on for the callees of a frame it
skips): each once, reused on later calls, and every result as eager's."""

from __future__ import annotations

import pytest
import torch

from fireclay_capture import capture


def scale(t, k=2.0):
    return t * k + 1


def double_sin(t):
    return scale(t.sin())  # scale is inlined into double_sin's own capture


def stats(*args, **kwargs):
    return sum(args) + kwargs.get("bias", 0)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).relu()


class Stack(torch.nn.Module):
    """transformers' shape: a compile-only path that subscripts what eager builds, so the capture
    of forward gives up (the user's TypeError), while its blocks are captured on their own."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.head = Block()

    def forward(self, x, mask=None):
        if torch.compiler.is_compiling():
            x = x + mask[0]  # mask is None here: only the trace raises
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def nested_calls(x, mask=None):
    y = double_sin(x)
    if torch.compiler.is_compiling():
        y = y + mask[0]
    return scale(y, k=3.0) + double_sin(y)


def star_calls_and_methods(x, mask=None):
    if torch.compiler.is_compiling():
        mask[0]
    parts = [x.cos(), x.sin()]
    total = stats(*parts, bias=x.exp())  # CALL_FUNCTION_EX
    return total.mul(2) + [scale(p) for p in parts][0]  # a method call, calls in a comprehension


def handler_calls(x, mask=None):
    if torch.compiler.is_compiling():
        mask[0]
    try:
        y = scale(x)
        raise ValueError("eager raises and catches this")
    except ValueError:
        y = double_sin(y)
    return y


def recursive(x, n: int, mask=None):
    if torch.compiler.is_compiling():
        mask[0]
    if n == 0:
        return scale(x)
    return recursive(x.sin(), n - 1) + 1


def _numbers(x):
    for i in range(3):
        yield scale(x) * i


def with_generator(x, mask=None):
    if torch.compiler.is_compiling():
        mask[0]
    return sum(_numbers(x)) + double_sin(x)


class Counter:
    def __init__(self):
        self.k = 3.0

    def bump(self, t):
        return scale(t, self.k)


COUNTER = Counter()


def bound_method_callee(x, mask=None):
    if torch.compiler.is_compiling():
        mask[0]
    return COUNTER.bump(x) + COUNTER.bump(x.cos())


class Base:
    def scaled(self, t):
        return scale(t)


class Child(Base):
    def scaled(self, t):
        return super().scaled(t) + 1  # zero-argument super() reads its caller's frame


CHILD = Child()


def super_call_in_method(x, mask=None):
    if torch.compiler.is_compiling():
        mask[0]
    return CHILD.scaled(x) + Child.scaled(CHILD, x.cos())


def reports_compiling() -> bool:
    return torch.compiler.is_compiling()


def compile_only_helper(x, mask=None):
    # A callee with no tensor work runs as it is: captured, it would answer True to the eager
    # frame calling it (transformers' is_torchdynamo_compiling()).
    if reports_compiling():
        x = x + mask[0]
    if torch.compiler.is_compiling():
        mask[0]
    return double_sin(x)


# (function, arguments maker, the callees captured on their own: function/forward names)
CASES = {
    "nested_calls": (nested_calls, lambda: (torch.randn(4),), {"double_sin", "scale"}),
    # (calls inside a comprehension's own code object are not rewritten: scale runs as it is)
    "star_calls_and_methods": (star_calls_and_methods, lambda: (torch.randn(4),), {"stats"}),
    "handler_calls": (handler_calls, lambda: (torch.randn(4),), {"scale", "double_sin"}),
    # the recursive calls reach the root's own capture (not a second one): it gives up once per n
    "recursive": (recursive, lambda: (torch.randn(4), 3), {"scale"}),
    "with_generator": (with_generator, lambda: (torch.randn(4),), {"double_sin"}),
    "bound_method_callee": (bound_method_callee, lambda: (torch.randn(4),), {"Counter.bump"}),
    "super_call_in_method": (super_call_in_method, lambda: (torch.randn(4),), {"Child.scaled"}),
    "compile_only_helper": (compile_only_helper, lambda: (torch.randn(4),), {"double_sin"}),
}


def _captured(compiled) -> dict[str, int]:
    """Captures of every function captured on its own below ``compiled``, by qualified name."""
    out: dict[str, int] = {}
    for child in compiled.children:
        name = child.code.co_qualname
        out[name] = out.get(name, 0) + child.stats.captures
        for k, v in _captured(child).items():
            out[k] = out.get(k, 0) + v
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_callees_of_an_eager_frame_are_captured(name):
    fn, make_args, callees = CASES[name]
    compiled = capture(fn)
    args = make_args()
    torch.testing.assert_close(compiled(*args), fn(*args))
    assert compiled.stats.fallbacks >= 1 and compiled.stats.captures == 0  # the frame itself runs eagerly
    gave_up = compiled.stats.fallbacks  # once, or once per depth of the recursion
    first = _captured(compiled)
    assert callees <= set(first), first
    for _ in range(2):
        args = make_args()
        torch.testing.assert_close(compiled(*args), fn(*args))
    # Nothing captured again on later calls, and the frame gave up once.
    assert _captured(compiled) == first
    assert compiled.stats.fallbacks == gave_up


def test_modules_called_by_an_eager_frame_are_captured_once_each():
    model = Stack()
    compiled = capture(model)
    for _ in range(3):
        x = torch.randn(2, 4)
        torch.testing.assert_close(compiled(x), model(x))
    blocks = [c for c in compiled.children if c.code.co_qualname == "Block.forward"]
    assert len(blocks) == 4  # three blocks and the head, one capture each
    assert all((c.stats.captures, c.stats.calls) == (1, 3) for c in blocks)
    assert compiled.graph_count() == 4 and compiled.stats.fallbacks == 1


def test_a_called_module_with_hooks_runs_as_it_is(caplog):
    # hooks run around forward (FSDP2 gathers parameters in one): the module is called as eager
    # calls it, its hooks once per call, with no warning of its own; the other blocks are captured
    model = Stack()
    calls = []
    model.blocks[1].register_forward_pre_hook(lambda module, args: calls.append(1))
    compiled = capture(model)
    with caplog.at_level("WARNING"):
        for _ in range(3):
            x = torch.randn(2, 4)
            torch.testing.assert_close(compiled(x), model(x))
    assert len(calls) == 6  # three compiled calls and three eager ones
    assert not [r for r in caplog.records if "hooks" in r.getMessage()]
    blocks = [c for c in compiled.children if c.code.co_qualname == "Block.forward"]
    assert len(blocks) == 3


def test_the_frame_that_gave_up_is_warned_about_once(caplog):
    def once(x, mask=None):
        if torch.compiler.is_compiling():
            mask[0]
        return scale(x)

    compiled = capture(once)
    with caplog.at_level("INFO", logger="fireclay_capture"):
        for _ in range(3):
            compiled(torch.randn(4))
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "once" in r.getMessage()]
    assert len(warnings) == 1
    assert "the traced code raised TypeError" in warnings[0].getMessage()
    assert "internal error" not in caplog.text


class Router(torch.nn.Module):
    """openai_privacy_filter's experts in miniature: the experts hit are found with ``nonzero``
    (data-dependent) after the call filled dicts of its own (merge_with_config_defaults)."""

    def __init__(self):
        super().__init__()
        self.experts = torch.nn.ModuleList([Block() for _ in range(2)])

    def forward(self, x):
        options = {"top_k": 1}
        options.update(scale=2.0)
        hit = (x.sum(-1) > 0).nonzero()  # a graph break, inside a called module
        out = torch.zeros_like(x)
        for i in range(hit.shape[0]):
            out = out + self.experts[i % 2](x) * options["scale"]
        return out


class Recurrent(torch.nn.Module):
    """parakeet's decoder in miniature: torch's LSTM (whose forward reads a weak reference)
    inside a module of the user's."""

    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 4, batch_first=True)
        self.proj = Block()

    def forward(self, x):
        state = {}
        state["h"] = self.proj(x)
        out, _ = self.lstm(state["h"])
        return self.proj(out)


class Outer(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.pre = Block()
        self.inner = inner

    def forward(self, x):
        return self.inner(self.pre(x)).sin()


@pytest.mark.parametrize("inner", [Router, Recurrent], ids=["nonzero", "lstm"])
def test_a_break_inside_a_called_module_splits_the_caller(inner):
    model = Outer(inner())
    compiled = capture(model)
    for _ in range(3):
        x = torch.randn(2, 3, 4)
        torch.testing.assert_close(compiled(x), model(x))

    def everything(cf):
        yield cf
        for child in cf.children:
            yield from everything(child)

    captured = list(everything(compiled))
    assert sum(c.stats.fallbacks for c in captured) == 0  # no frame runs eagerly
    assert compiled.break_count() >= 1 and compiled.graph_count() >= 3
    # the called module's forward is captured on its own, once
    assert [c.code.co_qualname for c in captured].count(f"{inner.__name__}.forward") == 1


class Sequenced(torch.nn.Module):
    """torchvision's layout: the model calls ``nn.Sequential`` stages (torch's code) whose user
    blocks break inside."""

    def __init__(self, container):
        super().__init__()
        self.features = container(Block(), Outer(Router()), torch.nn.ReLU(), Block())

    def forward(self, x):
        return self.features(x).cos()


def _feature_stages(*modules):
    return torch.nn.Sequential(torch.nn.Sequential(*modules[:2]), *modules[2:])


@pytest.mark.parametrize("container", [torch.nn.Sequential, _feature_stages], ids=["flat", "nested"])
def test_user_modules_inside_torch_containers_are_captured_after_a_break(container):
    # TorchDynamo's frame hook stays on inside torch.nn's containers: the blocks they call are
    # captured on their own, not run eagerly with the container
    model = Sequenced(container)
    compiled = capture(model)
    for _ in range(3):
        x = torch.randn(2, 3, 4)
        torch.testing.assert_close(compiled(x), model(x))
    captured, pending = [], [compiled]
    while pending:
        captured.append(pending.pop())
        pending.extend(captured[-1].children)
    names = [c.code.co_qualname for c in captured]
    assert sum(c.stats.fallbacks for c in captured) == 0  # no frame runs eagerly
    assert names.count("Router.forward") == 1 and "Sequential.forward" in names


def test_a_break_inside_a_comprehension_runs_it_as_it_is():
    # The comprehension's own code (parameter ".0") is the break's callee: it runs as it is.
    def fn(x):
        y = x.cos()
        values = [float(t.sum().item()) for t in y.split(2)]  # .item() breaks inside
        return y * sum(values)

    compiled = capture(fn)
    for _ in range(2):
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), fn(x))
    assert compiled.break_count() >= 1


class AttentionAfterBreak(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = Block()
        self.mha = torch.nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, x):
        y = self.pre(x)
        print(end="")  # a graph break before the call
        return self.mha(y, y, y)[0].cos()


def test_torch_layers_with_eager_fast_paths_run_as_they_are_after_a_break():
    # MultiheadAttention probes dispatch state for its native inference kernel: called as it is
    model = AttentionAfterBreak().eval()
    compiled = capture(model)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 3, 4)
            torch.testing.assert_close(compiled(x), model(x))
    pending, names = [compiled], []
    while pending:
        c = pending.pop()
        names.append(c.code.co_qualname)
        pending.extend(c.children)
    assert "MultiheadAttention.forward" not in names


def _closure_made_per_call(x):
    def inner(t):
        u = t.cos()
        print(end="")  # a graph break inside the closure: it becomes a callee of its own
        return u * 2
    return inner(x) + 1


class _FreshPool(torch.nn.Module):
    def forward(self, x):
        pool = Block()  # a module of the user's made on every call (weights differ each time)
        print(end="")
        return pool(x).sum()


@pytest.mark.parametrize("fn", [_closure_made_per_call, _FreshPool()], ids=["closure", "module"])
def test_callees_made_anew_on_every_call_stop_being_captured(fn, monkeypatch, caplog):
    from fireclay_capture.config import config

    monkeypatch.setattr(config, "recompile_limit", 3)
    compiled = capture(fn)
    with caplog.at_level("WARNING", logger="fireclay_capture"):
        for seed in range(7):
            x = torch.randn(2, 4)
            torch.manual_seed(seed)
            want = fn(x)
            torch.manual_seed(seed)
            torch.testing.assert_close(compiled(x), want)
    tree, pending = [], [compiled]
    while pending:
        tree.append(pending.pop())
        pending.extend(tree[-1].children)
    made_anew = [c for c in tree if c.code.co_name in ("inner", "forward") and c is not compiled]
    assert len(made_anew) == 3  # one per call up to the limit, then they run as they are
    assert sum("made on every call" in r.getMessage() for r in caplog.records) == 1
