"""Test-only: turn a Python function or nn.Module into a torch-dialect Program.

Uses torch.fx.symbolic_trace (every module inlined, so parameters and buffers become
``get_attr`` nodes, turned into program weights). This stands in for fireclay-capture and
fireclay-ir's fx interop in this package's own tests.
"""

from __future__ import annotations

import builtins
import copy
import math
import operator
from typing import Any

import torch
import torch.fx

from fireclay_autograd.convert import tensor_meta, to_ir_atom
from fireclay_ir import Graph, InputSpec, Program, ScalarType, Weight


class _InlineAll(torch.fx.Tracer):
    def __init__(self):
        # F.batch_norm checks the batch size in Python; keep it one call.
        super().__init__(autowrap_functions=(torch.nn.functional.batch_norm,))

    def is_leaf_module(self, m, qualname):
        return False


def _qualified(fn: Any) -> str:
    if fn.__module__ == "_operator" or getattr(operator, fn.__name__, None) is fn:
        return f"torch::operator.{fn.__name__}"
    if getattr(math, fn.__name__, None) is fn:
        return f"torch::math.{fn.__name__}"
    for prefix, mod in (("torch.nn.functional", torch.nn.functional), ("torch.special", torch.special),
                        ("torch.linalg", torch.linalg), ("torch", torch)):
        if getattr(mod, fn.__name__, None) is fn:
            return f"torch::{prefix}.{fn.__name__}"
        for name, obj in vars(mod).items():
            if obj is fn and not name.startswith("_"):
                return f"torch::{prefix}.{name}"
    raise NotImplementedError(f"no torch-dialect name for {fn}")


def _python_function(fn: Any, arity: int) -> Any:
    """A Python function with ``arity`` named parameters calling the builtin ``fn`` (fx traces
    only Python functions)."""
    wrappers = {
        1: lambda a: fn(a),
        2: lambda a, b: fn(a, b),
        3: lambda a, b, c: fn(a, b, c),
        4: lambda a, b, c, d: fn(a, b, c, d),
    }
    return wrappers[arity]


def _type_of(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return tensor_meta(x)
    if isinstance(x, bool):
        return ScalarType("bool")
    if isinstance(x, int):
        return ScalarType("int")
    if isinstance(x, float):
        return ScalarType("float")
    return ScalarType("opaque")


def program_from(fn: Any, example_inputs: list[torch.Tensor]) -> Program:
    """A torch-dialect Program for ``fn`` (a function or module); weights hold the module's
    live parameters and buffers (so updates to them are seen by the program)."""
    root = fn if isinstance(fn, torch.nn.Module) else torch.nn.Module()
    if not isinstance(fn, torch.nn.Module):
        fn = _python_function(fn, len(example_inputs))
    tracer = _InlineAll()
    graph_fx = tracer.trace(fn)
    gm = torch.fx.GraphModule(tracer.root if not isinstance(fn, torch.nn.Module) else root, graph_fx)
    # Types of every node, from one eager run on copies (BatchNorm must not update the real stats).
    results: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            r = super().run_node(n)
            results[n.name] = r
            return r

    Recorder(copy.deepcopy(gm)).run(*[x.detach().clone() for x in example_inputs])

    g = Graph("main")
    program = Program.single(g)
    env: dict[torch.fx.Node, Any] = {}

    def arg(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        if isinstance(a, dict):
            return {k: arg(v) for k, v in a.items()}
        if isinstance(a, slice):
            return slice(arg(a.start), arg(a.stop), arg(a.step))
        return to_ir_atom(a)

    def out_type(n: torch.fx.Node) -> Any:
        r = results[n.name]
        if isinstance(r, (tuple, list)):
            return [_type_of(x) for x in r]
        return _type_of(r)

    for n in graph_fx.nodes:
        meta = {"source": {"file": "test", "line": 0, "text": n.format_node()}}
        if n.op == "placeholder":
            env[n] = g.add_input(n.name, tensor_meta(results[n.name]).with_(requires_grad=results[n.name].requires_grad))
        elif n.op == "get_attr":
            real = gm
            for part in n.target.split("."):
                real = getattr(real, part)
            kind = "parameter" if isinstance(real, torch.nn.Parameter) else "buffer"
            program.weights[n.target] = Weight(tensor_meta(real), real)
            env[n] = g.add_input(n.target.replace(".", "_"), tensor_meta(real).with_(requires_grad=real.requires_grad),
                                 InputSpec(kind, n.target))
        elif n.op == "call_function":
            if n.target is builtins.getattr:
                op = f"torch::Tensor.{n.args[1]}"
                env[n] = g.call(op, [arg(n.args[0])], out=out_type(n), meta=meta)
                continue
            env[n] = g.call(_qualified(n.target), arg(n.args), arg(n.kwargs), out=out_type(n), meta=meta)
        elif n.op == "call_method":
            env[n] = g.call(f"torch::Tensor.{n.target}", arg(n.args), arg(n.kwargs), out=out_type(n), meta=meta)
        elif n.op == "output":
            result = n.args[0]
            outs = list(result) if isinstance(result, (tuple, list)) else [result]
            g.set_outputs([arg(o) for o in outs])
        else:
            raise NotImplementedError(n.op)
    return program


class BatchNorm1d(torch.nn.BatchNorm1d):
    """BatchNorm whose input-rank check (Python control flow fx cannot trace) is skipped."""

    def _check_input_dim(self, input):
        pass


class BatchNorm2d(torch.nn.BatchNorm2d):
    """BatchNorm whose input-rank check (Python control flow fx cannot trace) is skipped."""

    def _check_input_dim(self, input):
        pass
