"""The reference interpreter: run a torch-, aten- or hop-dialect program on real tensors.

It executes node by node with torch's own ops, so it works for any tensor subclass and under
any ``TorchDispatchMode`` (autograd traces straight through it). It is the ``eager`` backend and
the oracle every later stage is compared against.

Inputs are bound in order to the entry graph's user inputs; parameter, buffer and constant
inputs take their tensors from ``Program.weights``. Symbols that appear as plain names in the
inputs' shapes are bound to the actual sizes, and symbolic arguments (``SymExpr``) are
evaluated from those bindings with a small, safe evaluator (no ``eval``).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from typing import Any

from fireclay_ir.model import (
    Device,
    DType,
    Graph,
    GraphRef,
    IRError,
    Layout,
    MemoryFormat,
    Node,
    Program,
    SymExpr,
    TensorMeta,
    Value,
)
from fireclay_ir.run_limits import RunLimitError, RunLimits


class InterpreterError(IRError):
    """A node failed while interpreting; the message names the node and its source line."""


# --------------------------------------------------------------------------- symbolic ints

# A symbolic size fits 64 bits; a power far beyond that is a hostile document, not a program.
_MAX_POW_BITS = 4096


def _pow(base: Any, exponent: Any) -> Any:
    if isinstance(exponent, int) and exponent > 1 and isinstance(base, (int, Fraction)) and not -1 <= base <= 1:
        bits = max(int(base.numerator).bit_length(), int(base.denominator).bit_length())
        if bits * exponent > _MAX_POW_BITS:
            raise IRError(f"{base}**{exponent} is too large for a symbolic size (more than {_MAX_POW_BITS} bits)")
    return operator.pow(base, exponent)


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: _pow,
    ast.Div: lambda a, b: Fraction(a) / Fraction(b),
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_FUNCS: dict[str, Callable[..., Any]] = {
    "Max": max, "max": max, "Min": min, "min": min, "Abs": abs, "abs": abs,
    "floor": math.floor, "ceiling": math.ceil, "ceil": math.ceil,
    "FloorDiv": operator.floordiv, "Mod": operator.mod, "PythonMod": operator.mod,
    "CeilDiv": lambda a, b: -(-a // b), "CleanDiv": operator.floordiv, "IntTrueDiv": lambda a, b: a / b,
    "ModularIndexing": lambda x, d, m: (x // d) % m, "Eq": operator.eq, "Ne": operator.ne,
    "Lt": operator.lt, "Le": operator.le, "Gt": operator.gt, "Ge": operator.ge,
}
_MAX_EXPR_LEN = 10_000


@lru_cache(maxsize=4096)
def _parse_expr(expr: str) -> ast.Expression:
    if len(expr) > _MAX_EXPR_LEN:
        raise IRError(f"symbolic expression too long ({len(expr)} characters)")
    try:
        return ast.parse(expr, mode="eval")
    except SyntaxError:
        raise IRError(f"malformed symbolic expression {expr!r}") from None


def evaluate_symexpr(expr: str | SymExpr, bindings: dict[str, Any]) -> Any:
    """The value of a symbolic expression string given values for its symbols.

    Arithmetic (``+ - * // % ** /``), comparisons, ``and``/``or``/``not`` and the functions
    fireclay-shapes prints (``Max``, ``Min``, ``FloorDiv``, ``CeilDiv``, ``ModularIndexing``,
    ``floor``, ``ceiling``, ...) are understood; anything else is an IRError.
    """
    text = expr.expr if isinstance(expr, SymExpr) else expr
    tree = _parse_expr(text)

    def ev(n: ast.AST) -> Any:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float, bool)):
            return n.value
        if isinstance(n, ast.Name):
            if n.id in ("True", "False"):
                return n.id == "True"
            if n.id not in bindings:
                raise IRError(f"symbol {n.id!r} in {text!r} is not bound to a value "
                              f"(bound: {', '.join(sorted(bindings)) or 'none'})")
            return bindings[n.id]
        if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
            return _BINOPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd, ast.Not)):
            v = ev(n.operand)
            return -v if isinstance(n.op, ast.USub) else (+v if isinstance(n.op, ast.UAdd) else not v)
        if isinstance(n, ast.BoolOp):
            vals = [ev(v) for v in n.values]
            return all(vals) if isinstance(n.op, ast.And) else any(vals)
        if isinstance(n, ast.Compare):
            left, result = ev(n.left), True
            for op, comp in zip(n.ops, n.comparators):
                right = ev(comp)
                result = result and _CMPOPS[type(op)](left, right)
                left = right
            return result
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _FUNCS and not n.keywords:
            return _FUNCS[n.func.id](*[ev(a) for a in n.args])
        raise IRError(f"unsupported construct {ast.dump(n)[:60]} in symbolic expression {text!r}")

    value = ev(tree)
    if isinstance(value, Fraction):
        value = int(value) if value.denominator == 1 else float(value)
    return value


# --------------------------------------------------------------------------- the interpreter

HopRule = Callable[["Interpreter", Node, dict[str, Any]], Any]


class Interpreter:
    """Runs a program; subclass and override :meth:`call_op` to observe or replace calls.

    ``dialect_rules`` maps a dialect name to ``rule(interpreter, node, args, kwargs)`` for
    dialects the reference interpreter does not know (a stage may add its own).
    """

    dialect_rules: dict[str, Callable[..., Any]] = {}

    def __init__(self, program: Program, *, limits: RunLimits | None = None):
        self.program = program
        self.limits = limits
        self.steps = 0
        self.held_bytes = 0  # bytes of the tensors bound in the graphs now running (with limits)
        self._targets: dict[str, Any] = {}

    # -- public
    def run(self, *args: Any, graph: str | None = None) -> tuple[Any, ...]:
        g = self.program.graphs[graph] if graph is not None else self.program.main
        user = [v for v, s in zip(g.inputs, g.input_specs) if s.kind == "user"]
        if len(args) != len(user):
            raise InterpreterError(f"graph {g.name!r} takes {len(user)} user inputs "
                                   f"({', '.join('%' + v.name for v in user)}), got {len(args)}")
        values: list[Any] = []
        it = iter(args)
        for v, spec in zip(g.inputs, g.input_specs):
            values.append(next(it) if spec.kind == "user" else self._weight(spec.target, v))
        if self.limits is None:
            return self.run_graph(g, values)
        return self._run_limited(g, values)

    def _run_limited(self, graph: Graph, values: list[Any]) -> tuple[Any, ...]:
        import torch

        from fireclay_ir.run_limits import allocation_guard

        limits = self._run_limits
        grad_mode = torch.is_grad_enabled()  # a program may switch it; the caller's comes back
        try:
            with allocation_guard(lambda: limits.max_bytes - self.held_bytes):
                return self.run_graph(graph, values)
        finally:
            torch.set_grad_enabled(grad_mode)

    def run_graph(self, graph: Graph, inputs: list[Any], bindings: dict[str, Any] | None = None) -> tuple[Any, ...]:
        """Run ``graph`` on ``inputs`` (one per graph input, weights included); ``bindings``
        are symbol values known already (a sub-graph sees its caller's)."""
        env: dict[Value, Any] = {}
        symbols: dict[str, Any] = dict(bindings or {})
        limited = self.limits is not None
        held: dict[Value, int] = {}
        if limited:
            self._step(graph.name)
        try:
            for v, x in zip(graph.inputs, inputs, strict=True):
                env[v] = x
                self._bind_symbols(v, x, symbols)
                if limited and bindings is None:  # a sub-graph's inputs are its caller's values
                    self._hold(held, v, x, f"input %{v.name}")
            last_use = _last_uses(graph)
            for node in graph.nodes:
                try:
                    if limited:
                        self._step(node.op)
                        self._check_declared(node, symbols)
                    args = self._materialize(node.args, env, symbols)
                    kwargs = self._materialize(node.kwargs, env, symbols)
                    result = self.call_op(node, args, kwargs, symbols)
                    self._bind_outputs(node, result, env)
                    if limited:
                        for v in node.outputs:
                            self._hold(held, v, env.get(v), f"%{v.name} = {node.op}(...)")
                except (InterpreterError, RunLimitError):
                    raise
                except Exception as exc:
                    raise InterpreterError(_describe_failure(node, exc)) from exc
                for v in last_use.get(node, ()):
                    env.pop(v, None)
                    self.held_bytes -= held.pop(v, 0)
            return tuple(self._materialize(list(graph.outputs), env, symbols))
        finally:
            self.held_bytes -= sum(held.values())

    # -- limits (only with RunLimits)
    @property
    def _run_limits(self) -> RunLimits:
        if self.limits is None:  # pragma: no cover - the checks below run only with limits
            raise AssertionError("the interpreter runs without limits")
        return self.limits

    def _step(self, what: str) -> None:
        self.steps += 1
        if self.steps > self._run_limits.max_steps:
            raise RunLimitError(f"the run took more than {self._run_limits.max_steps} steps (nodes and graphs "
                                f"entered) and was stopped at {what}; raise RunLimits.max_steps to run it")

    def _hold(self, held: dict[Value, int], v: Value, x: Any, what: str) -> None:
        from fireclay_ir.run_limits import value_bytes

        size = value_bytes(x)
        if self.held_bytes + size > self._run_limits.max_bytes:
            raise RunLimitError(f"{what} holds {size} bytes, and the run may hold {self._run_limits.max_bytes} "
                                f"bytes at once ({self.held_bytes} already held); raise RunLimits.max_bytes "
                                "to run it")
        held[v] = held.get(v, 0) + size
        self.held_bytes += size

    def _check_declared(self, node: Node, symbols: dict[str, Any]) -> None:
        """Refuse a node whose declared outputs alone would not fit, before it allocates them."""
        from fireclay_ir.run_limits import declared_shape

        for v in node.outputs:
            if isinstance(v.type, TensorMeta):
                shape = declared_shape(v.type, symbols)
                if shape is not None:
                    self._run_limits.check_tensor(shape, v.type.dtype, f"%{v.name} = {node.op}(...)", self.held_bytes)

    def call_op(self, node: Node, args: list[Any], kwargs: dict[str, Any], symbols: dict[str, Any]) -> Any:
        """Execute one node's op on materialized arguments."""
        dialect = node.dialect
        if dialect == "hop":
            return _HOP_RULES[node.target](self, node, args, kwargs, symbols)
        if dialect in ("aten", "torch"):
            target, is_property = self._target(node)
            if is_property:
                return getattr(args[0], node.target.rsplit(".", 1)[1])
            return target(*args, **kwargs)
        rule = self.dialect_rules.get(dialect)
        if rule is None:
            raise InterpreterError(f"the reference interpreter runs torch, aten and hop ops; "
                                   f"{node.op} needs the backend that owns dialect {dialect!r}")
        return rule(self, node, args, kwargs)

    # -- helpers
    def _target(self, node: Node) -> tuple[Any, bool]:
        cached = self._targets.get(node.op)
        if cached is None:
            from fireclay_ir.dialects import lookup_op

            op = lookup_op(node.op)
            cached = (None if op.is_property else op.target(), op.is_property)
            self._targets[node.op] = cached
        return cached

    def _weight(self, target: str | None, v: Value) -> Any:
        import torch

        weight = self.program.weights.get(target or "")
        if weight is None or weight.data is None:
            raise InterpreterError(f"input %{v.name} needs weight {target!r}, which the program "
                                   "does not hold (load the program with its weights file)")
        data = weight.data
        if isinstance(data, (bytes, bytearray, memoryview)):
            meta = weight.meta
            data = torch.frombuffer(bytearray(data), dtype=getattr(torch, meta.dtype)).reshape(meta.shape)
        return data

    def _bind_symbols(self, v: Value, x: Any, symbols: dict[str, Any]) -> None:
        if not isinstance(v.type, TensorMeta) or not hasattr(x, "shape"):
            if v.name in self.program.symbols and isinstance(x, int):
                symbols.setdefault(v.name, x)
            return
        shape = tuple(x.shape)
        if len(shape) != v.type.rank:
            raise InterpreterError(f"input %{v.name} expects rank {v.type.rank} "
                                   f"(shape {list(v.type.shape)}), got shape {list(shape)}")
        for i, (d, actual) in enumerate(zip(v.type.shape, shape)):
            if isinstance(d, int):
                if d != actual:
                    raise InterpreterError(f"input %{v.name} dim {i} is {d} in the program, "
                                           f"got {actual} (shape {list(shape)})")
            elif d.isidentifier():
                bound = symbols.setdefault(d, actual)
                if bound is not actual and bound != actual:
                    raise InterpreterError(f"input %{v.name} dim {i} is {d}, bound to {bound} by an "
                                           f"earlier input, but got {actual}")

    def _materialize(self, arg: Any, env: dict[Value, Any], symbols: dict[str, Any]) -> Any:
        if isinstance(arg, Value):
            try:
                return env[arg]
            except KeyError:
                raise InterpreterError(f"%{arg.name} has no value (read before definition?)") from None
        if isinstance(arg, list):
            return [self._materialize(a, env, symbols) for a in arg]
        if isinstance(arg, tuple):
            return tuple(self._materialize(a, env, symbols) for a in arg)
        if isinstance(arg, dict):
            return {k: self._materialize(a, env, symbols) for k, a in arg.items()}
        if isinstance(arg, slice):
            return slice(*(self._materialize(a, env, symbols) for a in (arg.start, arg.stop, arg.step)))
        if isinstance(arg, SymExpr):
            return evaluate_symexpr(arg, symbols)
        if isinstance(arg, (DType, Layout, MemoryFormat)):
            import torch

            return getattr(torch, arg.name)
        if isinstance(arg, Device):
            import torch

            return torch.device(arg.name)
        return arg

    def _bind_outputs(self, node: Node, result: Any, env: dict[Value, Any]) -> None:
        outs = node.outputs
        if not outs:
            return
        if len(outs) == 1:
            if isinstance(result, (tuple, list)) and outs[0].is_tensor and len(result) == 1:
                result = result[0]
            env[outs[0]] = result
            return
        if not isinstance(result, (tuple, list)) or len(result) != len(outs):
            got = f"{len(result)} values" if isinstance(result, (tuple, list)) else type(result).__name__
            raise InterpreterError(f"{node.op} defines {len(outs)} outputs but returned {got}")
        for v, r in zip(outs, result):
            env[v] = r


def _last_uses(graph: Graph) -> dict[Node, list[Value]]:
    """For each node, the values no later node reads (freed after it runs)."""
    from fireclay_ir.model import iter_values

    kept = {v for v in iter_values(graph.outputs)}
    seen: set[Value] = set()
    result: dict[Node, list[Value]] = {}
    for node in reversed(graph.nodes):
        dead = [v for v in node.inputs() if v not in seen and v not in kept]
        seen.update(dead)
        result[node] = dead
    return result


def _describe_failure(node: Node, exc: BaseException) -> str:
    outs = ", ".join(f"%{o.name}" for o in node.outputs)
    where = ""
    src = node.source
    if src:
        where = f"\n  at {src.get('file', '?')}:{src.get('line', '?')}: {str(src.get('text', '')).strip()}"
    return f"{outs + ' = ' if outs else ''}{node.op}(...) failed: {type(exc).__name__}: {exc}{where}"


# --------------------------------------------------------------------------- higher-order ops


def _subgraph(interp: Interpreter, ref: Any) -> Graph:
    if not isinstance(ref, GraphRef) or ref.name not in interp.program.graphs:
        raise InterpreterError(f"sub-graph {ref!r} is not in the program")
    return interp.program.graphs[ref.name]


def _truth(pred: Any) -> bool:
    return bool(pred.item()) if hasattr(pred, "item") else bool(pred)


def _bound(node: Node, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    from fireclay_ir.dialects.hop import bind_arguments

    return bind_arguments(node.target, args, kwargs)


def _run_cond(interp: Interpreter, node: Node, args: list[Any], kwargs: dict[str, Any], symbols: dict[str, Any]) -> Any:
    b = _bound(node, args, kwargs)
    branch = b["true_graph"] if _truth(b["pred"]) else b["false_graph"]
    return interp.run_graph(_subgraph(interp, branch), list(b["operands"]), symbols)


def _run_while(interp: Interpreter, node: Node, args: list[Any], kwargs: dict[str, Any], symbols: dict[str, Any]) -> Any:
    b = _bound(node, args, kwargs)
    cond, body = _subgraph(interp, b["cond_graph"]), _subgraph(interp, b["body_graph"])
    carried, extra = list(b["carried"]), list(b["additional"])
    while _truth(interp.run_graph(cond, carried + extra, symbols)[0]):
        carried = list(interp.run_graph(body, carried + extra, symbols))
    return tuple(carried)


def _run_checkpoint(interp: Interpreter, node: Node, args: list[Any], kwargs: dict[str, Any], symbols: dict[str, Any]) -> Any:
    b = _bound(node, args, kwargs)
    return interp.run_graph(_subgraph(interp, b["body"]), list(b["operands"]), symbols)


_HOP_RULES = {"cond": _run_cond, "while_loop": _run_while, "checkpoint": _run_checkpoint}


def interpret(program: Program, *args: Any, graph: str | None = None, limits: RunLimits | None = None) -> tuple[Any, ...]:
    """Run ``program``'s entry graph (or ``graph``) on ``args``; returns the outputs as a tuple.

    Pass ``limits`` (a :class:`~fireclay_ir.run_limits.RunLimits`) for a program from a source you
    do not trust: the run then stops with a RunLimitError before it takes more steps or holds more
    bytes than they allow, and the caller's grad mode is restored after it.
    """
    return Interpreter(program, limits=limits).run(*args, graph=graph)
