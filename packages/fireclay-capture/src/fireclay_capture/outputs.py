"""The user's return value: which graph outputs it holds and how to rebuild its structure
(tuples, lists, dicts, namedtuples, dataclasses, ModelOutputs) around the graph's results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fireclay_capture.errors import Unsupported
from fireclay_capture.side_effects import DELETED, MISSING, Replay, SideEffects, attribute_now
from fireclay_capture.sources import Source, read_source
from fireclay_capture.variables.base import ConstVar, FakeIdVar, Var
from fireclay_capture.variables.containers import DictVar, ListVar, TupleVar
from fireclay_capture.variables.objects import ModelOutputVar, NewObjectVar
from fireclay_capture.variables.replayed import ReplayedCallVar
from fireclay_capture.variables.tensor import TensorVar
from fireclay_ir import Graph, Value

# An output spec is a small tree of tuples:
#   ("tensor", i) | ("const", v) | ("source", src) | ("seq", cls, [spec]) | ("dict", cls, [(k, spec)])
#   | ("object", cls, [(name, spec)]) | ("model_output", cls, [(name, spec)])


def output_spec(graph: Graph, var: Var, shapes=None, memo: dict | None = None) -> Any:
    """Append the graph outputs ``var`` needs and return its spec. Specs made with one ``memo``
    share the spec of a mutable value reached twice (also across calls)."""
    outputs: list[Value] = list(graph.outputs)
    # A user object, list or dict reached twice is described by one spec object, which
    # rebuild() turns into one object again (``out.a is out.b`` holds as eagerly).
    objects: dict[int, tuple] = {} if memo is None else memo

    def walk(v: Var) -> Any:
        if isinstance(v, TensorVar):
            outputs.append(v.value)
            return ("tensor", len(outputs) - 1)
        if isinstance(v, ConstVar) and isinstance(v.value, torch.SymInt) and shapes is not None:
            from fireclay_capture.dynamic import python_of

            text = python_of(v.value, shapes)
            return ("eval", compile(text, "<fireclay output size>", "eval"), text)
        if isinstance(v, ConstVar) and isinstance(v.value, torch.Size) and shapes is not None \
                and any(isinstance(d, torch.SymInt) for d in v.value):
            return ("seq", torch.Size, [walk(ConstVar(d)) for d in v.value])
        if isinstance(v, FakeIdVar):
            raise Unsupported("returning id() of an object made inside the captured function")
        if isinstance(v, ConstVar):
            if isinstance(v.value, (torch.SymBool, torch.SymFloat)):
                # Returned as its value: bool()/float() make the ShapeEnv guard that value.
                return ("const", bool(v.value) if isinstance(v.value, torch.SymBool) else float(v.value))
            if isinstance(v.value, torch.SymInt):
                raise Unsupported("returning a symbolic size outside a dynamic capture")
            return ("const", v.value)
        if isinstance(v, TupleVar):
            return ("seq", v.cls, [walk(i) for i in v.items])
        if isinstance(v, (ListVar, DictVar)) and v.source is not None and not getattr(v, "fresh", False):
            return ("source", v.source)  # the caller's own list or dict, changes replayed on it
        if isinstance(v, ListVar):
            if id(v) not in objects:
                items: list[Any] = []
                objects[id(v)] = ("seq", list, items)
                items.extend(walk(i) for i in v.items)
            return objects[id(v)]
        if isinstance(v, DictVar):
            if v.key_vars:
                raise Unsupported("returning a dict keyed by objects")
            if id(v) not in objects:
                pairs: list = []
                objects[id(v)] = ("dict", v.cls, pairs)
                pairs.extend((k, walk(x)) for k, x in v.items.items())
            return objects[id(v)]
        if isinstance(v, ModelOutputVar) and v.source is None:
            # One object however often it is reached: a graph break's stack and locals (or two
            # outputs) share it, and an attribute write between the graphs must reach them all.
            if id(v) not in objects:
                named: list[Any] = []
                objects[id(v)] = ("model_output", v.cls, named)
                named.extend((k, walk(x)) for k, x in v.fields.items())
            return objects[id(v)]
        if isinstance(v, NewObjectVar):
            if id(v) not in objects:
                fields: list[Any] = []
                objects[id(v)] = ("object", v.cls, fields)
                fields.extend((k, walk(x)) for k, x in v.attrs.items())
            return objects[id(v)]
        if v.source is not None:
            return ("source", v.source)
        if isinstance(v, ReplayedCallVar):  # a logging call left to run between graphs
            return ("const", v.fn)
        raise Unsupported(f"returning {v} from the captured function")

    spec = walk(var)
    graph.set_outputs(outputs)
    return spec




def rebuild(spec: Any, results, L: dict, made: dict | None = None) -> Any:
    made = {} if made is None else made
    kind = spec[0]
    if kind == "tensor":
        return results[spec[1]]
    if kind == "const":
        return spec[1]
    if kind == "source":
        return read_source(spec[1], L)
    if kind == "eval":
        return eval(spec[1], {"L": L})  # noqa: S307 - text generated from symbol sources
    if kind == "seq":
        _, cls, items = spec
        if cls is list:
            # a list reached twice comes out as one list (filled after it is registered)
            if id(spec) not in made:
                values: list[Any] = []
                made[id(spec)] = values
                values.extend(rebuild(s, results, L, made) for s in items)
            return made[id(spec)]
        values = [rebuild(s, results, L, made) for s in items]
        if cls is tuple:
            return tuple(values)
        if hasattr(cls, "_fields") or cls is slice:
            return cls(*values)
        return cls(values)  # torch.return_types and other structseqs take one sequence
    if kind == "dict":
        _, cls, items = spec
        if id(spec) not in made:
            made[id(spec)] = cls((k, rebuild(s, results, L, made)) for k, s in items)
        return made[id(spec)]
    if kind == "model_output":
        if id(spec) not in made:
            _, cls, items = spec
            made[id(spec)] = cls(**{k: rebuild(s, results, L, made) for k, s in items})
        return made[id(spec)]
    if kind == "object":
        if id(spec) in made:
            return made[id(spec)]
        _, cls, items = spec
        obj = cls.__new__(cls)
        made[id(spec)] = obj  # before the attributes: an object may refer back to itself
        for k, s in items:
            object.__setattr__(obj, k, rebuild(s, results, L, made))
        return obj
    raise AssertionError(kind)


def replay_of(effects: SideEffects, spec_of: Callable[[Any], Any]) -> Replay | None:
    """The replay of every change ``effects`` recorded; ``spec_of`` turns a Var into an output
    spec (and adds the graph outputs it needs)."""
    replay = Replay()
    keep: list = []  # the stand-in Vars below stay alive: specs are memoised by id()
    target_of: dict[Source, int] = {}

    def target(source: Source) -> int:
        if source not in target_of:
            target_of[source] = len(replay.targets)
            replay.targets.append(source)
        return target_of[source]

    def value(v: Any) -> Any:
        if v is DELETED:
            return DELETED
        replay.values.append(spec_of(v))
        return len(replay.values) - 1

    for key in effects.order:
        kind = key[0]
        if kind == "attr":
            obj, source, name, v = effects.attrs[key[1:]]
            before = attribute_now(obj, name)
            if v is DELETED and before is MISSING:
                continue
            if isinstance(v, ConstVar) and type(before) is type(v.value) and before == v.value:
                continue  # set, then restored: nothing to do
            replay.ops.append(("attr", target(source), name, value(v)))
        elif kind == "call":
            replay.ops.append(("call", *effects.calls[key[1]]))
        elif kind == "global":
            g, name, v = effects.globals[key[1:]]
            before = g.get(name, MISSING)
            if isinstance(v, ConstVar) and type(before) is type(v.value) and before == v.value:
                continue
            replay.ops.append(("global", g, name, value(v)))
        else:
            var = effects.containers[key[1]]
            if var.source is None:  # pragma: no cover - only containers with a source are recorded
                raise AssertionError(var)
            if isinstance(var, ListVar):
                keep.append(ListVar(var.items))
                replay.ops.append(("list", target(var.source), value(keep[-1])))
            elif isinstance(var, DictVar):
                if var.key_vars:
                    raise Unsupported("changing a dict keyed by objects that exists outside the capture")
                keep.append(DictVar(var.items))
                replay.ops.append(("dict", target(var.source), value(keep[-1])))
            else:  # pragma: no cover - only lists and dicts are recorded
                raise AssertionError(var)
    return replay if replay.ops else None
