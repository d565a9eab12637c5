"""Functions with graph breaks: every *breaker* (code the capture cannot put in a graph) placed in
every *shape* of code around it (straight-line, loops, closed with-blocks, calls three deep,
try blocks, ...). The functions are generated from the two tables below into a real file, so
that their source lines exist for error messages, and loaded as a module.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import tempfile
import textwrap

# Each breaker reads and rebinds the tensor `y`; they are the unsupported things users write.
BREAKERS = {
    "print": 'print("value", y.shape)',
    "item": "s = y.sum().item()\ny = y + s",
    "item_branch": "if y.sum().item() > 0:\n    y = y * 2\nelse:\n    y = y - 1",
    "tensor_branch": "if y.mean() > 0:\n    y = y + 1",
    "tolist": "values = y.tolist()\ny = y + len(values)",
    "numpy": "y = y + float(np.sum(y.numpy()))",
    "numpy_call": "scale = np.float64(y.abs().max().item())\ny = y / (1.0 + scale)",
    "logging": 'LOG.info("shape %s", y.shape)',
    "id_builtin": "marker = id(y) > 0\ny = y * marker",
    "graph_break": "graph_break()",
    "disabled": "y = eager_double(y)",
    "global_append": "EVENTS.append(len(EVENTS))",
}

# Each shape holds one {BREAK} (indented in place) and starts from tensor inputs x (and w).
SHAPES = {
    "straight": """
        def fn(x, w):
            y = x * 2 + w
            {BREAK}
            return torch.relu(y) - w
    """,
    "two_breaks": """
        def fn(x, w):
            y = x.sin()
            {BREAK}
            y = y * w
            {BREAK}
            return y.cos()
    """,
    "result_in_tuple": """
        def fn(x, w):
            y = x @ w.T
            before = y.clone()
            {BREAK}
            return before, y + 1, 7
    """,
    "for_loop": """
        def fn(x, w):
            y = x
            for i in range(3):
                y = y * 0.5 + i
                {BREAK}
            return y + w
    """,
    "for_over_list": """
        def fn(x, w):
            y = x
            for scale in [0.5, 2.0]:
                y = y * scale
                {BREAK}
            return y - w
    """,
    "while_loop": """
        def fn(x, w):
            y = x
            i = 0
            while i < 2:
                y = torch.tanh(y + w)
                {BREAK}
                i += 1
            return y
    """,
    "after_no_grad": """
        def fn(x, w):
            with torch.no_grad():
                z = x * 3
            y = z + w
            {BREAK}
            return y.exp()
    """,
    "nested_three_deep": """
        def inner(y):
            y = y + 1
            {BREAK}
            return y * 2

        def middle(y):
            return inner(y - 1) + 1

        def outer(y, w):
            return middle(y * w) * 3

        def fn(x, w):
            a = x.abs()
            return outer(a, w) + a
    """,
    "in_inlined_call": """
        def helper(y, w):
            y = y * w
            {BREAK}
            return y.sum(0)

        def fn(x, w):
            total = helper(x, w) + helper(w, x)
            return total.sigmoid()
    """,
    "in_try_block": """
        def fn(x, w):
            y = x + w
            try:
                {BREAK}
                y = y * 2
            except ValueError:
                y = y * 0
            return y
    """,
    "in_with_block": """
        def fn(x, w):
            with torch.no_grad():
                y = x + w
                {BREAK}
                y = y * 2
            return y + 1
    """,
    "try_except_caught": """
        def fn(x, w):
            y = x + w
            try:
                {BREAK}
                y = y * 2
                fail_if(True)
                y = y + 100
            except ValueError:
                y = y - 1
            return y
    """,
    "try_finally": """
        def fn(x, w):
            y = x * w
            try:
                {BREAK}
                y = y + 1
            finally:
                EVENTS.append("finally")
            return y
    """,
    "nested_try_finally_raises": """
        def fn(x, w):
            y = x + 1
            try:
                try:
                    {BREAK}
                    y = y * w
                    fail_if(True)
                finally:
                    EVENTS.append("inner finally")
                    y = y + 2
            except ValueError:
                y = y * 3
            return y
    """,
    "loop_in_try": """
        def fn(x, w):
            y = x
            try:
                for i in range(3):
                    y = y * 0.5 + i
                    {BREAK}
                fail_if(y.dim() == 2)
            except ValueError:
                y = y + w
            return y
    """,
    "user_with_in_loop": """
        def fn(x, w):
            y = x
            for i in range(2):
                with Tracker("loop") as t:
                    y = y + w * i
                    {BREAK}
                    y = t.scale(y)
            return y
    """,
    "user_with_suppresses": """
        def fn(x, w):
            y = x * 2
            with Suppress():
                {BREAK}
                y = y + w
                fail_if(True)
                y = y * 100
            return y
    """,
    "contextmanager_block": """
        def fn(x, w):
            with managed("gen") as scale:
                y = x * scale
                {BREAK}
                y = y + w
            return y
    """,
    "three_deep_try_in_middle": """
        def inner(y):
            y = y + 1
            {BREAK}
            fail_if(True)
            return y

        def middle(y):
            try:
                return inner(y) * 2
            except ValueError:
                return y - 1

        def outer(y, w):
            return middle(y * w) + 3

        def fn(x, w):
            return outer(x, w) * x
    """,
    "closure_cells": """
        def fn(x, w):
            scale = 2.0
            def bump(t):
                return t * scale
            y = bump(x)
            {BREAK}
            scale = 3.0
            return bump(y) + w
    """,
    "nonlocal_counter": """
        def fn(x, w):
            count = 0
            def step(t):
                nonlocal count
                count += 1
                return t + w * count
            y = step(x)
            {BREAK}
            y = step(y)
            return y * count
    """,
    "kwargs_and_defaults": """
        def step(y, *, bias=1.0, scale=2.0):
            y = y * scale
            {BREAK}
            return y + bias

        def fn(x, w):
            return step(x, bias=w) + step(w, scale=0.5)
    """,
}

HEADER = '''
import contextlib
import logging

import numpy as np
import torch

from fireclay_capture import disable, graph_break

LOG = logging.getLogger("breaks_corpus")
EVENTS = []
LOG.info("warm up")  # the logger's first call fills its level cache; later calls only read it


@disable
def eager_double(t):
    return t * 2


@disable
def fail_if(condition):
    if condition:
        raise ValueError("failed on purpose")


class Tracker:
    """A user context manager: its __enter__ and __exit__ are traced."""

    def __init__(self, name):
        self.name = name
        self.factor = 0.5

    def __enter__(self):
        EVENTS.append(("enter", self.name))
        return self

    def __exit__(self, kind, value, tb):
        EVENTS.append(("exit", self.name, kind is None))
        return False

    def scale(self, t):
        return t * self.factor


class Suppress:
    def __enter__(self):
        EVENTS.append("suppress enter")
        return self

    def __exit__(self, kind, value, tb):
        EVENTS.append(("suppress exit", kind is not None))
        return kind is not None and issubclass(kind, ValueError)


@contextlib.contextmanager
def managed(name):
    EVENTS.append(("managed enter", name))
    try:
        yield 2.0
    finally:
        EVENTS.append(("managed exit", name))
'''


def _place(shape: str, breaker: str) -> str:
    lines = []
    for line in textwrap.dedent(shape).splitlines():
        if "{BREAK}" in line:
            indent = line[:len(line) - len(line.lstrip())]
            lines.extend(indent + b for b in breaker.splitlines())
        else:
            lines.append(line)
    return "\n".join(lines)


def build_module():
    """Write every (shape, breaker) function into one file and import it."""
    parts = [HEADER]
    names = []
    for shape_name, shape in SHAPES.items():
        for breaker_name, breaker in BREAKERS.items():
            name = f"{shape_name}__{breaker_name}"
            body = _place(shape, breaker)
            # Each case gets its own helpers: rename every def with the case's suffix.
            for helper in ("inner", "middle", "outer", "helper", "step", "bump", "fn"):
                body = re.sub(rf"\b{helper}\(", f"{helper}_{name}(", body)
            parts.append(body)
            names.append(name)
    path = pathlib.Path(tempfile.mkdtemp(prefix="fireclay_breaks_")) / "generated_breaks.py"
    path.write_text("\n\n".join(parts) + "\n")
    spec = importlib.util.spec_from_file_location("generated_breaks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, {name: getattr(module, f"fn_{name}") for name in names}
