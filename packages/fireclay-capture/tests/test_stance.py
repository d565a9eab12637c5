"""set_stance (as torch.compiler.set_stance) and the reason of a recompile: the failing guard."""

import contextlib
import logging

import pytest
import torch

import fireclay_capture as fc
from fireclay_capture import config


def _fn(x, n):
    return torch.sin(x) * n + 1


@pytest.fixture(autouse=True)
def _static(monkeypatch):
    monkeypatch.setattr(config, "automatic_dynamic", False)
    monkeypatch.setattr(config, "stance", "default")


def _captured():
    seen = []

    def backend(program, example_inputs):
        seen.append(program)
        return fc.lookup_backend("eager")(program, example_inputs)

    return fc.capture(_fn, backend=backend), seen


@contextlib.contextmanager
def collected(*names):
    """The messages logged at INFO on each channel logger, read off the logger itself (a process
    that imported fireclay forwards this package's records to its own loggers)."""
    messages = {name: [] for name in names}

    class Collect(logging.Handler):
        def emit(self, record):
            messages[self.name].append(record.getMessage())

    saved = []
    for name in names:
        logger, handler = logging.getLogger(name), Collect()
        handler.name = name
        saved.append((logger, handler, logger.level))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        for logger, handler, level in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)


# stance -> (captures after a call at a new size, whether that call raises)
STANCES = {
    "default": (2, False),
    "force_eager": (1, False),
    "eager_on_recompile": (1, False),
    "fail_on_recompile": (1, True),
}


@pytest.mark.parametrize("form", ["call", "with", "decorator"])
@pytest.mark.parametrize("stance", list(STANCES))
def test_stances_against_eager(stance, form):
    g, seen = _captured()
    x = torch.randn(2, 3)
    torch.testing.assert_close(g(x, 2), _fn(x, 2))  # compiled under the default stance
    y = torch.randn(5, 3)
    captures, raises = STANCES[stance]

    def call():
        return g(y, 2)

    if form == "call":
        fc.set_stance(stance)
        run = call
    elif form == "with":
        def run():
            with fc.set_stance(stance):
                return call()
    else:
        run = fc.set_stance(stance)(call)
        assert config.stance == "default"  # decorating does not change the stance
    try:
        if raises:
            with pytest.raises(fc.RecompileError, match=r"L\['x'\]: shape expected \(2, 3\), got \(5, 3\)"):
                run()
        else:
            torch.testing.assert_close(run(), _fn(y, 2))
    finally:
        if form == "call":
            fc.set_stance("default")
    assert config.stance == "default"
    assert len(seen) == captures
    # a call the cache already holds runs compiled under every stance but force_eager
    with fc.set_stance(stance):
        torch.testing.assert_close(g(x, 2), _fn(x, 2))
    assert len(seen) == captures


def test_force_eager_skips_even_the_first_capture():
    g, seen = _captured()
    with fc.set_stance("force_eager"):
        torch.testing.assert_close(g(torch.ones(2), 3), _fn(torch.ones(2), 3))
    assert seen == []


def test_unknown_stance_names_the_stances():
    with pytest.raises(ValueError, match="unknown stance 'eager'; stances are: default"):
        fc.set_stance("eager")
    assert config.stance == "default"


@pytest.mark.parametrize("second_call, reason", [
    ((torch.randn(4, 3), 2), r"L\['x'\]: shape expected \(2, 3\), got \(4, 3\)"),
    ((torch.randn(2, 3, dtype=torch.float64), 2), r"L\['x'\]: dtype expected torch.float32, got torch.float64"),
    ((torch.randn(2, 3), 5), r"L\['n'\] == 2 expected, got 5"),
    ((torch.randn(2, 3), 2.5), r"L\['n'\]: type expected int \(2\), got float"),
    ((torch.randn(2, 3).t().contiguous().t(), 2), r"stride expected \(3, 1\), got \(1, 2\)"),
    ((torch.randn(2, 3, requires_grad=True), 2), "requires_grad expected False, got True"),
])
def test_recompiles_log_names_the_failing_guard(second_call, reason):
    g, seen = _captured()
    g(torch.randn(2, 3), 2)
    with collected("fireclay_capture.recompiles") as logged:
        g(*second_call)
    messages = logged["fireclay_capture.recompiles"]
    assert len(messages) == 1 and "recompiling _fn" in messages[0]
    assert __file__ in messages[0]
    import re

    assert re.search(reason, messages[0]), messages[0]
    assert len(seen) == 2


def test_graph_breaks_and_guards_channels():
    def breaks(x):
        y = x + 1
        print("between graphs")
        return y * 2

    g = fc.capture(breaks)
    with collected("fireclay_capture.graph_breaks", "fireclay_capture.guards") as by_name:
        torch.testing.assert_close(g(torch.ones(3)), breaks(torch.ones(3)))
    (first, *_) = by_name["fireclay_capture.graph_breaks"]
    assert f"{__file__}:" in first and 'print("between graphs")' in first
    assert any("def check_and_extract(L):" in m for m in by_name["fireclay_capture.guards"])
