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
            for helper in ("inner", "middle", "outer", "helper", "step", "fn"):
                body = re.sub(rf"\b{helper}\(", f"{helper}_{name}(", body)
            parts.append(body)
            names.append(name)
    path = pathlib.Path(tempfile.mkdtemp(prefix="fireclay_breaks_")) / "generated_breaks.py"
    path.write_text("\n\n".join(parts) + "\n")
    spec = importlib.util.spec_from_file_location("generated_breaks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, {name: getattr(module, f"fn_{name}") for name in names}
