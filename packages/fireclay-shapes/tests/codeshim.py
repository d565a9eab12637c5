"""Evaluate printed Triton expressions on Python ints with Triton's integer semantics.

Triton's integer ``//`` and ``%`` truncate toward zero like C; Python's floor. The shim
rewrites those operators into C-semantics helpers before evaluating, so that a printer that
emitted a bare ``//`` for a negative operand would be caught.
"""

from __future__ import annotations

import ast
import types


def c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def c_mod(a: int, b: int) -> int:
    return a - b * c_div(a, b)


class _CSemantics(ast.NodeTransformer):
    def visit_BinOp(self, node):
        self.generic_visit(node)
        helper = {ast.FloorDiv: "_c_div", ast.Mod: "_c_mod"}.get(type(node.op))
        if helper is None:
            return node
        return ast.copy_location(ast.Call(ast.Name(helper, ast.Load()), [node.left, node.right], []), node)


TL = types.SimpleNamespace(where=lambda c, a, b: a if c else b, maximum=max, minimum=min)


def compile_triton(text: str, names: list[str]):
    tree = ast.parse(text, mode="eval")
    tree = ast.fix_missing_locations(_CSemantics().visit(tree))
    code = compile(tree, "<triton>", "eval")
    env = {"tl": TL, "_c_div": c_div, "_c_mod": c_mod, "__builtins__": {}}
    return lambda values: eval(code, env, dict(values))
