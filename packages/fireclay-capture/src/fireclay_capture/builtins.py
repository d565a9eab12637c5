"""Python builtins, ``operator`` and ``math`` over Vars: folded at trace time on constants,
recorded as ``torch::operator.*`` nodes on tensors, structural on containers."""

from __future__ import annotations

import builtins
import contextlib
import copy
import functools
import inspect
import itertools
import math
import operator
import types
from collections.abc import Callable
from typing import Any

import torch

from fireclay_capture.dynamic import concrete
from fireclay_capture.errors import ObservedException, Unsupported
from fireclay_capture.variables.base import NULL, ConstVar, FakeIdVar, Var, const, wrap_constant
from fireclay_capture.variables.containers import (
    BaseListVar,
    DictVar,
    IteratorVar,
    ListVar,
    SetVar,
    TupleVar,
)
from fireclay_capture.variables.functions import NullContextVar, SuperVar
from fireclay_capture.variables.objects import ClassVar, ModelOutputVar, NewObjectVar
from fireclay_capture.variables.owned import OwnedObjectVar, copy_of
from fireclay_capture.variables.tensor import TensorVar, record_call

# operator functions whose tensor form is recorded as torch::operator.<name>
TENSOR_OPERATORS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
    operator.pow, operator.matmul, operator.and_, operator.or_, operator.xor, operator.lshift,
    operator.rshift, operator.iadd, operator.isub, operator.imul, operator.itruediv,
    operator.ifloordiv, operator.imod, operator.ipow, operator.imatmul, operator.iand, operator.ior,
    operator.ixor, operator.ilshift, operator.irshift, operator.neg, operator.pos, operator.invert,
    operator.abs, operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne,
    operator.getitem,
}


def _is_const(v: Var) -> bool:
    return v.is_constant()


_SET_OPERATORS = frozenset({operator.or_, operator.and_, operator.sub, operator.xor, operator.ior, operator.iand,
                            operator.isub, operator.ixor, operator.eq, operator.ne, operator.lt, operator.le,
                            operator.gt, operator.ge})


def _is_set_like(v: Var) -> bool:
    return isinstance(v, SetVar) or isinstance(v, ConstVar) and isinstance(v.value, (set, frozenset))


def apply_operator(tx, fn: Any, args: list[Var]) -> Var:
    """``fn(*args)`` for an ``operator`` function."""
    if fn in _SET_OPERATORS and len(args) == 2 and (isinstance(args[0], SetVar) or isinstance(args[1], SetVar)) \
            and _is_set_like(args[0]) and _is_set_like(args[1]):
        left, right = args
        if isinstance(left, SetVar):
            return left.binary(tx, fn, right)
        assert isinstance(right, SetVar)
        return right.binary(tx, fn, left, reflected=True)
    if any(isinstance(a, TensorVar) for a in args):
        if fn not in TENSOR_OPERATORS:
            raise Unsupported(f"operator.{fn.__name__} on a tensor")
        if fn in (operator.eq, operator.ne) and not all(isinstance(a, TensorVar) or _is_const(a) for a in args):
            return const((fn is operator.ne) ^ (args[0].identity() is args[1].identity()))
        return record_call(tx, f"operator.{fn.__name__}", fn, list(args), {})
    if all(_is_const(a) for a in args):
        values = [a.as_python_constant() for a in args]
        try:
            return wrap_constant(fn(*values))
        except Exception as e:
            raise ObservedException(type(e), str(e)) from None
    return _structural(tx, fn, args)


def _structural(tx, fn, args: list[Var]) -> Var:
    a = args[0]
    b: Any = args[1] if len(args) > 1 else None  # every binary rule below has one
    if fn in (operator.is_, operator.is_not):
        same = a.identity() is b.identity()
        return const(same if fn is operator.is_ else not same)
    if fn in (operator.eq, operator.ne):
        if isinstance(a, BaseListVar) and isinstance(b, BaseListVar):
            if len(a.items) != len(b.items) or a.python_type() is not b.python_type():
                return const(fn is operator.ne)
            eq = all(apply_operator(tx, operator.eq, [x, y]).truth(tx) for x, y in zip(a.items, b.items))
            return const(eq if fn is operator.eq else not eq)
        same = a.identity() is b.identity()
        if same or (a.identity() is not a and b.identity() is not b):
            return const(same if fn is operator.eq else not same)
        if _is_const(a) != _is_const(b):
            return const(fn is operator.ne)
    if fn in (operator.add, operator.iadd) and isinstance(a, BaseListVar) and isinstance(b, BaseListVar):
        if fn is operator.iadd and isinstance(a, ListVar):
            a.method(tx, "extend", [b], {})
            return a
        return type(a)(a.items + b.items) if not isinstance(a, TupleVar) else TupleVar(a.items + b.items)
    if fn in (operator.add, operator.iadd) and isinstance(a, BaseListVar) and _is_const(b):
        return apply_operator(tx, fn, [a, wrap_constant(b.as_python_constant())]) \
            if not isinstance(b.as_python_constant(), (tuple, list)) else \
            _concat(a, [const(v) for v in b.as_python_constant()])
    if fn in (operator.add, operator.iadd) and _is_const(a) and isinstance(b, BaseListVar):
        return TupleVar([const(v) for v in a.as_python_constant()] + b.items)
    if fn in (operator.mul, operator.imul) and isinstance(a, BaseListVar) and _is_const(b):
        return type(a)(a.items * b.as_python_constant()) if isinstance(a, ListVar) else TupleVar(a.items * b.as_python_constant())
    if fn is operator.getitem:
        return a.getitem(tx, b)
    if fn is operator.contains:
        return const(any(_equal(tx, x, b) for x in _members(tx, a)))
    if fn in (operator.or_, operator.ior) and isinstance(a, DictVar) and isinstance(b, DictVar):
        merged = DictVar(a.items) if fn is operator.or_ else a
        merged.items.update(b.items)
        return merged
    if fn is operator.not_:
        return const(not a.truth(tx))
    raise Unsupported(f"operator.{fn.__name__} on {a} and {b}")


def _concat(a: BaseListVar, items: list[Var]) -> Var:
    return TupleVar(a.items + items) if isinstance(a, TupleVar) else ListVar(a.items + items)


def _members(tx, container: Var) -> list[Var]:
    if isinstance(container, (DictVar, ModelOutputVar)):
        return container.unpack(tx)
    return container.unpack(tx)


def _equal(tx, x: Var, y: Var) -> bool:
    if isinstance(x, TensorVar) or isinstance(y, TensorVar):
        return x is y or (isinstance(x, TensorVar) and isinstance(y, TensorVar) and x.value is y.value)
    return apply_operator(tx, operator.eq, [x, y]).truth(tx)


def contains(tx, item: Var, container: Var) -> bool:
    if container.is_constant() and item.is_constant():
        return item.as_python_constant() in container.as_python_constant()
    if isinstance(container, DictVar):
        from fireclay_capture.variables.containers import _key

        return _key(tx, item) in container.items
    if isinstance(container, ModelOutputVar):
        return item.as_python_constant() in container.present()
    if isinstance(container, TensorVar):
        raise Unsupported("`in` on a tensor (data-dependent)")
    if hasattr(container, "contains"):
        answer = container.contains(tx, item)
        if answer is not None:
            return answer
    return any(_equal(tx, x, item) for x in container.unpack(tx))


# --------------------------------------------------------------------------- builtins


def _as_int_like(v: Var) -> Any:
    return v.as_python_constant()


def _len(tx, v: Var) -> Var:
    if isinstance(v, TensorVar):
        if v.fake.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        return const(v.fake.shape[0])
    if isinstance(v, (BaseListVar, DictVar, SetVar)):
        return const(len(v.items))
    if isinstance(v, ModelOutputVar):
        return const(len(v.present()))
    if v.is_constant():
        return const(len(v.as_python_constant()))
    return v.call_method(tx, "__len__", [], {})


def _isinstance(tx, obj: Var, classes: Var) -> Var:
    cls_value = classes.as_python_constant() if classes.is_constant() else None
    if cls_value is None:
        if isinstance(classes, BaseListVar):
            cls_value = tuple(c.identity() for c in classes.items)
        else:
            cls_value = classes.identity()
    if isinstance(obj, TensorVar):
        t = obj.fake
        ok = isinstance(t, cls_value) if not _mentions(cls_value, torch.nn.Parameter) else _param_check(obj, cls_value)
        return const(bool(ok))
    try:
        typ = obj.python_type()
    except Unsupported:
        raise Unsupported(f"isinstance() of {obj}") from None
    if isinstance(obj, ConstVar):
        return const(isinstance(obj.value, cls_value))
    return const(issubclass(typ, cls_value))


def _mentions(cls_value, target) -> bool:
    if isinstance(cls_value, tuple):
        return any(_mentions(c, target) for c in cls_value)
    return cls_value is target


def _param_check(obj: TensorVar, cls_value) -> bool:
    is_param = obj.source is not None and "_parameters" in repr(obj.source)
    classes = cls_value if isinstance(cls_value, tuple) else (cls_value,)
    return any((c is torch.nn.Parameter and is_param) or (c is not torch.nn.Parameter and isinstance(obj.fake, c))
               for c in classes)


def _getattr(tx, obj: Var, name: Var, *default: Var) -> Var:
    try:
        return obj.getattr(tx, name.as_python_constant())
    except ObservedException as e:
        if default and e.exc_type is AttributeError:
            return default[0]
        raise


def _hasattr(tx, obj: Var, name: Var) -> Var:
    n = name.as_python_constant()
    if isinstance(obj, TensorVar):
        return const(hasattr(obj.fake, n))
    try:
        obj.getattr(tx, n)
        return const(True)
    except ObservedException as e:
        if e.exc_type is AttributeError:
            return const(False)
        raise


def _iterate(tx, v: Var) -> list[Var]:
    if isinstance(v, IteratorVar):
        return v.unpack(tx)
    return v.unpack(tx)


def _reduce(tx, fn, args: list[Var], kwargs: dict[str, Var]) -> Var:
    items = args if len(args) > 1 else _iterate(tx, args[0])
    if kwargs and set(kwargs) - {"default", "key"}:
        raise Unsupported(f"{fn.__name__}() with {sorted(kwargs)}")
    if "key" in kwargs:
        raise Unsupported(f"{fn.__name__}(key=...)")
    if not items:
        if "default" in kwargs:
            return kwargs["default"]
        raise ObservedException(ValueError, f"{fn.__name__}() arg is an empty sequence")
    if all(i.is_constant() for i in items):
        return const(fn(i.as_python_constant() for i in items))
    if any(isinstance(i, TensorVar) for i in items):
        torch_fn = torch.maximum if fn is builtins.max else torch.minimum
        if all(isinstance(i, TensorVar) for i in items) and len(items) == 2:
            raise Unsupported(f"builtin {fn.__name__}() of tensors compares their data")
        del torch_fn
    raise Unsupported(f"{fn.__name__}() over {items}")


def _sum(tx, iterable: Var, start: Var | None = None) -> Var:
    total = start if start is not None else const(0)
    for item in _iterate(tx, iterable):
        total = apply_operator(tx, operator.add, [total, item])
    return total


def _all_any(tx, fn, iterable: Var) -> Var:
    values = [i.truth(tx) for i in _iterate(tx, iterable)]
    return const(fn(values))


def _abs(tx, v: Var) -> Var:
    if isinstance(v, TensorVar):
        return record_call(tx, "torch.abs", torch.abs, [v], {})
    return const(abs(v.as_python_constant()))


def _number(tx, typ, args: list[Var]) -> Var:
    if args and isinstance(args[0], TensorVar):
        raise Unsupported(f"{typ.__name__}() of a tensor needs its data (data-dependent)")
    return const(typ(*[a.as_python_constant() for a in args]))


def _bool(tx, args: list[Var]) -> Var:
    if not args:
        return const(False)
    return const(args[0].truth(tx))


def _sequence(tx, typ, args: list[Var]) -> Var:
    items = _iterate(tx, args[0]) if args else []
    if typ is list:
        return ListVar(items)
    if typ is tuple:
        return TupleVar(items)
    if typ is set or typ is frozenset:
        from fireclay_capture.variables.containers import real_iterable

        # set(x) as eager builds it: a set's table copied, any other iterable added in its order.
        real, vars_ = real_iterable(tx, args[0]) if args else ((), {})
        if typ is frozenset:
            return const(frozenset(real))
        out = SetVar([], real=set(real))
        out.vars.update(vars_)
        return out
    raise Unsupported(f"{typ.__name__}()")


def _dict(tx, args: list[Var], kwargs: dict[str, Var]) -> Var:
    d = DictVar({})
    if args:
        src = args[0]
        if isinstance(src, DictVar):
            d.items.update(src.items)
            d.key_vars.update(src.key_vars)
        elif isinstance(src, ModelOutputVar):
            d.items.update(src.present())
        else:
            for pair in _iterate(tx, src):
                k, v = pair.unpack(tx)
                d.setitem(tx, k, v)
    d.items.update(kwargs)
    return d


def _enumerate(tx, iterable: Var, start: Var | None = None) -> Var:
    s = start.as_python_constant() if start is not None else 0
    return IteratorVar([TupleVar([const(s + i), v]) for i, v in enumerate(_iterate(tx, iterable))])


def _zip(tx, *iterables: Var, strict: Var | None = None) -> Var:
    lists = [_iterate(tx, it) for it in iterables]
    return IteratorVar([TupleVar(list(group)) for group in zip(*lists)])


def _range(tx, *args: Var) -> Var:
    return const(range(*[a.as_python_constant() for a in args]))


def _reversed(tx, v: Var) -> Var:
    return IteratorVar(list(reversed(_iterate(tx, v))))


def _sorted(tx, v: Var, **kwargs: Var) -> Var:
    items = _iterate(tx, v)
    if not all(i.is_constant() for i in items) or set(kwargs) - {"reverse"}:
        raise Unsupported("sorted() of values that are not constants")
    rev = kwargs["reverse"].as_python_constant() if "reverse" in kwargs else False
    return ListVar([const(x) for x in sorted((i.as_python_constant() for i in items), reverse=rev)])


def _map(tx, fn: Var, *iterables: Var) -> Var:
    lists = [_iterate(tx, it) for it in iterables]
    return IteratorVar([fn.call(tx, list(group), {}) for group in zip(*lists)])


def _functools_reduce(tx, fn: Var, iterable: Var, *initial: Var) -> Var:
    """``functools.reduce``: ``fn`` called in the trace on the running value and each item
    (Reformer checks ``reduce(mul, axial_pos_shape)`` against the sequence length)."""
    items = _iterate(tx, iterable)
    if initial:
        acc = initial[0]
    elif items:
        acc, items = items[0], items[1:]
    else:
        raise ObservedException(TypeError, "reduce() of empty iterable with no initial value")
    for item in items:
        acc = fn.call(tx, [acc, item], {})
    return acc


def _constant_int(v: Var, what: str) -> int:
    if not v.is_constant() or not isinstance(v.as_python_constant(), int):
        raise Unsupported(f"{what} that is not a constant int")
    return v.as_python_constant()


# itertools: finite iterators, made into their items at trace time (torch.nn.modules.utils'
# ``_ntuple`` builds ``tuple(repeat(x, n))`` for a convolution's sizes).
def _repeat(tx, obj: Var, times: Var | None = None) -> Var:
    if times is None:
        raise Unsupported("itertools.repeat without a count (an endless iterator)")
    return IteratorVar([obj] * max(_constant_int(times, "itertools.repeat count"), 0))


def _chain(tx, *iterables: Var) -> Var:
    return IteratorVar([item for it in iterables for item in _iterate(tx, it)])


def _product(tx, *iterables: Var, repeat: Var | None = None) -> Var:
    pools = [_iterate(tx, it) for it in iterables] * (1 if repeat is None else _constant_int(repeat, "repeat"))
    return IteratorVar([TupleVar(list(group)) for group in itertools.product(*pools)])


def _islice(tx, iterable: Var, *bounds: Var) -> Var:
    limits = [None if b.is_constant() and b.as_python_constant() is None else _constant_int(b, "islice bound")
              for b in bounds]
    return IteratorVar(_iterate(tx, iterable)[slice(*limits)])


def _pairwise(tx, iterable: Var) -> Var:
    items = _iterate(tx, iterable)
    return IteratorVar([TupleVar([a, b]) for a, b in zip(items, items[1:])])


def _accumulate(tx, iterable: Var, func: Var | None = None, *, initial: Var | None = None) -> Var:
    items = _iterate(tx, iterable)
    if initial is not None and not (initial.is_constant() and initial.as_python_constant() is None):
        items = [initial] + items
    out: list[Var] = []
    for item in items:
        if not out:
            out.append(item)
        elif func is None or (func.is_constant() and func.as_python_constant() is None):
            out.append(apply_operator(tx, operator.add, [out[-1], item]))
        else:
            out.append(func.call(tx, [out[-1], item], {}))
    return IteratorVar(out)


def _starmap(tx, fn: Var, iterable: Var) -> Var:
    return IteratorVar([fn.call(tx, _iterate(tx, args), {}) for args in _iterate(tx, iterable)])


def _filter(tx, fn: Var, iterable: Var) -> Var:
    items = _iterate(tx, iterable)
    if isinstance(fn, ConstVar) and fn.value is None:
        return IteratorVar([i for i in items if i.truth(tx)])
    return IteratorVar([i for i in items if fn.call(tx, [i], {}).truth(tx)])


def _iter(tx, v: Var) -> Var:
    if isinstance(v, IteratorVar):
        return v
    return IteratorVar(_iterate(tx, v))


def _next(tx, it: Var, *default: Var) -> Var:
    if not isinstance(it, IteratorVar):
        raise Unsupported(f"next() of {it}")
    item = it.next()
    if item is None:
        if default:
            return default[0]
        raise Unsupported("next() of an exhausted iterator (StopIteration)")
    return item


def _type(tx, v: Var) -> Var:
    if isinstance(v, TensorVar):
        if v.source is not None and "_parameters" in repr(v.source):
            return ClassVar(torch.nn.Parameter)
        return ClassVar(torch.Tensor)
    return ClassVar(v.python_type()) if not v.is_constant() else BuiltinOrClass(v.python_type())


def BuiltinOrClass(typ: type) -> Var:
    from fireclay_capture.variables.functions import BuiltinVar

    return BuiltinVar(typ) if typ.__module__ == "builtins" else ClassVar(typ)


def _super(tx, *args: Var) -> Var:
    if args:
        return SuperVar(args[0].identity(), args[1])
    frame = tx.frames[-1]
    if "__class__" not in frame.cells or not frame.code.co_varnames:
        raise Unsupported("zero-argument super() outside a method")
    cls = frame.cells["__class__"].get(tx).identity()
    first = frame.code.co_varnames[0]
    self_var = frame.locals.get(first) or frame.cells[first].get(tx)
    return SuperVar(cls, self_var)


def _callable(tx, v: Var) -> Var:
    from fireclay_capture.variables.functions import (
        BuiltinVar,
        NestedFunctionVar,
        UserFunctionVar,
        UserMethodVar,
    )
    from fireclay_capture.variables.objects import ModuleVar
    from fireclay_capture.variables.tensor import TorchFnVar

    if isinstance(v, (UserFunctionVar, NestedFunctionVar, UserMethodVar, BuiltinVar, TorchFnVar,
                      ClassVar, ModuleVar)):
        return const(True)
    if v.is_constant() or isinstance(v, (TensorVar, BaseListVar, DictVar)):
        return const(callable(v.as_python_constant()) if v.is_constant() else False)
    raise Unsupported(f"callable({v})")


def _delattr(tx, obj: Var, name: Var) -> Var:
    n = name.as_python_constant()
    if isinstance(obj, OwnedObjectVar):
        obj.delattr(tx, n)
        return const(None)
    if isinstance(obj, NewObjectVar) and n in obj.attrs:
        del obj.attrs[n]
        return const(None)
    raise Unsupported(f"delattr on {obj}, which exists outside the captured function")


def _copy(tx, v: Var, memo: Var | None = None, *, deep: bool) -> Var:
    if memo is not None and not (memo.is_constant() and memo.as_python_constant() is None):
        raise Unsupported("copy.deepcopy() with a memo")
    return copy_of(tx, v, deep)


def _setattr(tx, obj: Var, name: Var, value: Var) -> Var:
    if isinstance(obj, OwnedObjectVar):
        obj.setattr(tx, name.as_python_constant(), value)
        return const(None)
    if isinstance(obj, NewObjectVar):
        obj.setattr(tx, name.as_python_constant(), value)
        return const(None)
    raise Unsupported(f"setattr on {obj}, which exists outside the captured function")


def _divmod(tx, a: Var, b: Var) -> Var:
    return TupleVar([apply_operator(tx, operator.floordiv, [a, b]), apply_operator(tx, operator.mod, [a, b])])


def _round(tx, v: Var, nd: Var | None = None) -> Var:
    if isinstance(v, TensorVar):
        raise Unsupported("round() of a tensor")
    return const(round(v.as_python_constant(), *( [nd.as_python_constant()] if nd is not None else [])))


def _print(tx, *args, **kwargs):
    raise Unsupported("print() inside the captured function (a side effect)")


_PURE_MATH = {getattr(math, n) for n in dir(math) if callable(getattr(math, n)) and not n.startswith("_")}

BUILTIN_RULES: dict[Any, Callable[..., Var]] = {
    builtins.len: _len,
    builtins.isinstance: _isinstance,
    builtins.getattr: _getattr,
    builtins.hasattr: _hasattr,
    builtins.setattr: _setattr,
    builtins.delattr: _delattr,
    copy.deepcopy: lambda tx, v, memo=None: _copy(tx, v, memo, deep=True),
    copy.copy: lambda tx, v: _copy(tx, v, deep=False),
    builtins.range: _range,
    builtins.enumerate: _enumerate,
    builtins.zip: _zip,
    builtins.min: lambda tx, *a, **k: _reduce(tx, builtins.min, list(a), k),
    builtins.max: lambda tx, *a, **k: _reduce(tx, builtins.max, list(a), k),
    builtins.abs: _abs,
    builtins.sum: _sum,
    builtins.all: lambda tx, it: _all_any(tx, all, it),
    builtins.any: lambda tx, it: _all_any(tx, any, it),
    builtins.int: lambda tx, *a: _number(tx, int, list(a)),
    builtins.float: lambda tx, *a: _number(tx, float, list(a)),
    builtins.bool: lambda tx, *a: _bool(tx, list(a)),
    builtins.str: lambda tx, *a: const(str(*[concrete(x.as_python_constant()) for x in a])),
    builtins.list: lambda tx, *a: _sequence(tx, list, list(a)),
    builtins.tuple: lambda tx, *a: _sequence(tx, tuple, list(a)),
    builtins.set: lambda tx, *a: _sequence(tx, set, list(a)),
    builtins.frozenset: lambda tx, *a: _sequence(tx, frozenset, list(a)),
    builtins.dict: lambda tx, *a, **k: _dict(tx, list(a), k),
    builtins.reversed: _reversed,
    builtins.sorted: _sorted,
    builtins.map: _map,
    functools.reduce: _functools_reduce,
    itertools.repeat: _repeat,
    itertools.chain: _chain,
    itertools.product: _product,
    itertools.islice: _islice,
    itertools.pairwise: _pairwise,
    itertools.accumulate: _accumulate,
    itertools.starmap: _starmap,
    builtins.filter: _filter,
    builtins.iter: _iter,
    builtins.next: _next,
    builtins.type: _type,
    builtins.super: _super,
    builtins.callable: _callable,
    builtins.divmod: _divmod,
    builtins.round: _round,
    builtins.print: _print,
    builtins.slice: lambda tx, *a: const(slice(*[x.as_python_constant() for x in a])),
    contextlib.nullcontext: lambda tx, *a: NullContextVar(a[0] if a else None),
    builtins.id: lambda tx, v: _id(tx, v),
}


def _real_callable(v: Var):
    from fireclay_capture.variables.functions import UserFunctionVar, UserMethodVar

    if isinstance(v, UserFunctionVar):
        return v.fn
    if isinstance(v, UserMethodVar) and isinstance(v.fn, UserFunctionVar) and v.self_var.identity() is not v.self_var:
        return types.MethodType(v.fn.fn, v.self_var.identity())
    if v.identity() is not v and callable(v.identity()):
        return v.identity()
    raise Unsupported(f"inspect.signature of {v}")


def _signature(tx, fn: Var, **kwargs: Var) -> Var:
    # A Signature is immutable; the function it describes is pinned by guards already.
    return ConstVar(inspect.signature(_real_callable(fn), **{k: v.as_python_constant() for k, v in kwargs.items()}))


def _id(tx, v: Var) -> Var:
    """``id(v)``, as TorchDynamo answers it: the real id of an object that existed before the
    frame (a constant, guarded by identity when it was read from a source), an opaque stand-in
    for a container or object made inside the trace (equal only to itself; it may key dicts and
    be compared for equality, not used as a number or returned)."""
    if isinstance(v, ConstVar) and (v.value is None or v.value is True or v.value is False):
        return const(id(v.value))
    if isinstance(v, TensorVar):
        # A tensor's id names the real tensor of one call (an input's changes every call): a
        # graph break here, where the call stands, rather than at a later use of the number.
        raise Unsupported("id() of a tensor inside the captured function")
    obj = v.identity()
    if obj is not v and not isinstance(v, ConstVar):
        source = getattr(v, "source", None)
        if source is not None:
            tx.guards.id_is(source, obj)
        return const(id(obj))
    return FakeIdVar(v)


BUILTIN_RULES[inspect.signature] = _signature


def _issubclass(tx, cls: Var, classinfo: Var) -> Var:
    def real_class(v: Var) -> Any:
        if isinstance(v, BaseListVar):
            return tuple(real_class(i) for i in v.items)
        obj = v.identity()
        if obj is v:
            raise Unsupported(f"issubclass() of {v}")
        return obj

    try:
        return const(issubclass(real_class(cls), real_class(classinfo)))
    except TypeError as e:
        raise ObservedException(TypeError, str(e)) from None


BUILTIN_RULES[builtins.issubclass] = _issubclass




def call_builtin(tx, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
    rule = BUILTIN_RULES.get(fn)
    if rule is not None:
        return rule(tx, *args, **kwargs)
    if fn is operator.contains:
        return const(contains(tx, args[1], args[0]))
    if getattr(fn, "__module__", None) in ("_operator", "operator") and not kwargs:
        if fn in (operator.setitem,):
            args[0].setitem(tx, args[1], args[2])
            return const(None)
        if fn is operator.not_:
            return const(not args[0].truth(tx))
        if fn is operator.truth:
            return const(args[0].truth(tx))
        if fn in (operator.is_, operator.is_not):
            return _structural(tx, fn, args)
        if fn is operator.index:
            return const(operator.index(args[0].as_python_constant()))
        if fn is operator.itemgetter or fn is operator.attrgetter:
            raise Unsupported(f"operator.{fn.__name__}")
        return apply_operator(tx, fn, args)
    if fn in _PURE_MATH:
        if any(isinstance(a, TensorVar) for a in args):
            raise Unsupported(f"math.{fn.__name__} of a tensor needs its data")
        return const(fn(*[a.as_python_constant() for a in args], **{k: v.as_python_constant() for k, v in kwargs.items()}))
    if fn is builtins.object:
        raise Unsupported("object() inside the captured function")
    if isinstance(fn, type) and issubclass(fn, BaseException):
        from fireclay_capture.variables.exceptions import make_exception

        return make_exception(fn, args, kwargs)
    if all(a.is_constant() for a in args) and all(v.is_constant() for v in kwargs.values()) and fn in (
            builtins.pow, builtins.hash, builtins.repr, builtins.ord, builtins.chr, builtins.format,
            builtins.bin, builtins.hex, builtins.complex):
        return wrap_constant(fn(*[a.as_python_constant() for a in args],
                                **{k: v.as_python_constant() for k, v in kwargs.items()}))
    raise Unsupported(f"builtin {getattr(fn, '__qualname__', fn)}")


__all__ = ["NULL", "apply_operator", "call_builtin", "contains"]
