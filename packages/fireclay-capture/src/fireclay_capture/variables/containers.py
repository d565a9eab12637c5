"""Containers: tuple (and namedtuple), list, dict, set and iterators over materialized items."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fireclay_capture.errors import ObservedException, Unsupported
from fireclay_capture.sources import Source
from fireclay_capture.variables.base import ConstVar, Var, const, is_constant_value


def _key(tx, v: Var) -> Any:
    """A hashable Python key for a Var: constants by value, other things by identity."""
    if v.is_constant():
        return v.as_python_constant()
    ident = v.identity()
    if ident is v:
        raise Unsupported(f"using {v} as a dict key or set member")
    return ident


def _key_error(k: Any) -> ObservedException:
    return ObservedException(KeyError, repr(k), args_known=(k,) if is_constant_value(k) else ())


def _index(tx, key: Var, n: int) -> Any:
    k = key.as_python_constant()
    if isinstance(k, bool) or not isinstance(k, (int, slice)):
        raise Unsupported(f"indexing a sequence with {k!r}")
    return k


class BaseListVar(Var):
    def __init__(self, items: Sequence[Var], source: Source | None = None):
        self.items = list(items)
        self.source = source

    def is_constant(self) -> bool:
        return all(i.is_constant() for i in self.items)

    def unpack(self, tx):
        return list(self.items)

    def truth(self, tx):
        return bool(self.items)

    def getitem(self, tx, key):
        k = _index(tx, key, len(self.items))
        try:
            got = self.items[k]
        except IndexError:
            raise ObservedException(IndexError, f"index {k} out of range") from None
        return self.rebuild(got) if isinstance(k, slice) else got

    def rebuild(self, items: list[Var]) -> Var:
        return type(self)(items)

    def method(self, tx, name: str, args: list[Var], kwargs: dict[str, Var]) -> Var:
        if name == "__getitem__" and len(args) == 1 and not kwargs:
            return self.getitem(tx, args[0])
        if name == "index" and not kwargs:
            target = _key(tx, args[0])
            for i, item in enumerate(self.items):
                if item.is_constant() or item.identity() is not item:
                    if _key(tx, item) == target:
                        return const(i)
            raise Unsupported("list.index of a value that is not found")
        if name == "count" and not kwargs:
            target = _key(tx, args[0])
            return const(sum(1 for i in self.items if i.is_constant() and i.as_python_constant() == target))
        if name == "__len__":
            return const(len(self.items))
        raise Unsupported(f"{self.python_type().__name__}.{name}")

    def getattr(self, tx, name):
        return ContainerMethodVar(self, name)


class TupleVar(BaseListVar):
    def __init__(self, items, source=None, cls: type = tuple):
        super().__init__(items, source)
        self.cls = cls

    def python_type(self):
        return self.cls

    def rebuild(self, items):
        return TupleVar(items)

    def as_python_constant(self):
        values = [i.as_python_constant() for i in self.items]
        return self.cls(*values) if self.cls is not tuple and hasattr(self.cls, "_fields") else self.cls(values)

    def getattr(self, tx, name):
        # namedtuples name their fields in _fields, structseqs (torch.return_types) in __match_args__
        fields = getattr(self.cls, "_fields", None) or getattr(self.cls, "__match_args__", None)
        if fields and name in fields:
            return self.items[fields.index(name)]
        return super().getattr(tx, name)

    def __repr__(self):
        return f"TupleVar({self.items!r})"

    def reconstruct(self, specs):
        if self.source is not None:
            # The caller's own tuple is read again; a fresh one is rebuilt from its items.
            return specs.output(self) if getattr(self, "fresh", False) else ("source", self.source)
        return ("seq", self.cls, [specs.spec_of(i) for i in self.items])


class SliceVar(Var):
    """``a:b`` with a bound that is not a constant (a 0-d tensor holding data: Aria's experts
    slice their tokens by a CPU cumsum on CUDA). Building it is fine; using it as an index needs
    its value, so the graph breaks at the subscript, which then runs in Python."""

    def __init__(self, parts: list[Var]):
        self.parts = parts  # start, stop[, step], as BUILD_SLICE took them

    def python_type(self):
        return slice

    def as_python_constant(self):
        return slice(*[p.as_python_constant() for p in self.parts])

    def getattr(self, tx, name):
        if name in ("start", "stop", "step"):
            return (self.parts + [const(None)])[("start", "stop", "step").index(name)]
        return super().getattr(tx, name)

    def __repr__(self):
        return f"SliceVar({self.parts!r})"

    def reconstruct(self, specs):
        return ("seq", slice, [specs.spec_of(p) for p in self.parts])


class ListVar(BaseListVar):
    def python_type(self):
        return list

    def as_python_constant(self):
        return [i.as_python_constant() for i in self.items]

    def _mutable(self, tx):
        _note_change(tx, self, "list")

    def delitem(self, tx, key):
        k = _index(tx, key, len(self.items))
        self._mutable(tx)
        try:
            del self.items[k]
        except IndexError:
            raise ObservedException(IndexError, "list assignment index out of range") from None

    def setitem(self, tx, key, value):
        self._mutable(tx)
        k = _index(tx, key, len(self.items))
        if isinstance(k, slice):
            self.items[k] = value.unpack(tx)
        else:
            self.items[k] = value

    def method(self, tx, name, args, kwargs):
        if name in ("append", "extend", "insert", "pop", "clear", "reverse", "remove", "sort"):
            self._mutable(tx)
        if name == "append":
            self.items.append(args[0])
        elif name == "extend":
            self.items.extend(args[0].unpack(tx))
        elif name == "insert":
            self.items.insert(args[0].as_python_constant(), args[1])
        elif name == "pop":
            if not self.items:
                raise ObservedException(IndexError, "pop from empty list")
            return self.items.pop(args[0].as_python_constant() if args else -1)
        elif name == "remove":
            target = _key(tx, args[0])
            for i, item in enumerate(self.items):
                if (item.is_constant() or item.identity() is not item) and _key(tx, item) == target:
                    del self.items[i]
                    break
            else:
                raise Unsupported("list.remove of a value the capture cannot find by identity or value")
        elif name == "clear":
            self.items.clear()
        elif name == "reverse":
            self.items.reverse()
        elif name == "copy":
            return ListVar(list(self.items))
        elif name == "sort" and not args and self.is_constant():
            values = sorted((i.as_python_constant() for i in self.items),
                            reverse=bool(kwargs["reverse"].as_python_constant()) if "reverse" in kwargs else False)
            self.items = [const(v) for v in values]
        else:
            return super().method(tx, name, args, kwargs)
        return const(None)

    def __repr__(self):
        return f"ListVar({self.items!r})"

    def reconstruct(self, specs):
        if self.source is not None and not getattr(self, "fresh", False):
            return ("source", self.source)  # the caller's own list (mutating it ends a trace)
        return specs.shared(self, lambda: ("seq", list, [specs.spec_of(i) for i in self.items]))


class DictVar(Var):
    """A dict with keys known at trace time (constants or identities) and Var values."""

    def __init__(self, items: dict[Any, Var], source: Source | None = None, cls: type = dict,
                 key_vars: dict[Any, Var] | None = None):
        self.items = dict(items)
        self.source = source
        self.cls = cls
        # The Vars standing for non-constant keys (modules, functions), by their identity.
        self.key_vars = dict(key_vars or {})

    def python_type(self):
        return self.cls

    def is_constant(self):
        return all(v.is_constant() for v in self.items.values())

    def as_python_constant(self):
        return {k: v.as_python_constant() for k, v in self.items.items()}

    def key_var(self, k: Any) -> Var | None:
        return self.key_vars.get(id(k)) if not is_constant_value(k) else const(k)

    def unpack(self, tx):
        return [self.key_var(k) for k in self.items]

    def truth(self, tx):
        return bool(self.items)

    def getitem(self, tx, key):
        k = _key(tx, key)
        if k not in self.items:
            raise _key_error(k)
        return self.items[k]

    def _mutable(self, tx):
        _note_change(tx, self, "dict")

    def delitem(self, tx, key):
        k = _key(tx, key)
        if k not in self.items:
            raise _key_error(k)
        self._mutable(tx)
        del self.items[k]

    def setitem(self, tx, key, value):
        self._mutable(tx)
        k = _key(tx, key)
        if not key.is_constant():
            self.key_vars[id(k)] = key
        self.items[k] = value

    def getattr(self, tx, name):
        return ContainerMethodVar(self, name)

    def method(self, tx, name, args, kwargs):
        if name == "__getitem__" and len(args) == 1 and not kwargs:  # dict.__getitem__(d, k), super()'s
            return self.getitem(tx, args[0])
        if name == "get":
            k = _key(tx, args[0])
            return self.items.get(k, args[1] if len(args) > 1 else const(None))
        if name == "keys":
            return TupleVar(self.unpack(tx))
        if name == "values":
            return TupleVar(list(self.items.values()))
        if name == "items":
            return TupleVar([TupleVar([self.key_var(k), v]) for k, v in self.items.items()])
        if name == "copy":
            return DictVar(self.items, key_vars=self.key_vars)
        if name == "__contains__":
            return const(_key(tx, args[0]) in self.items)
        if name == "__len__":
            return const(len(self.items))
        if name not in ("update", "pop", "setdefault", "clear", "popitem"):
            raise Unsupported(f"dict.{name}")
        self._mutable(tx)
        if name == "update":
            if args:
                other = args[0]
                if isinstance(other, DictVar):
                    self.items.update(other.items)
                    self.key_vars.update(other.key_vars)
                else:
                    for pair in other.unpack(tx):
                        k, v = pair.unpack(tx)
                        self.setitem(tx, k, v)
            for n, v in kwargs.items():
                self.items[n] = v
            return const(None)
        if name == "pop":
            k = _key(tx, args[0])
            if k in self.items:
                return self.items.pop(k)
            if len(args) > 1:
                return args[1]
            raise _key_error(k)
        if name == "setdefault":
            k = _key(tx, args[0])
            if k not in self.items:
                self.setitem(tx, args[0], args[1] if len(args) > 1 else const(None))
            return self.items[k]
        if name == "clear":
            self.items.clear()
            return const(None)
        if name == "popitem" and not args and self.items:
            k, v = self.items.popitem()
            return TupleVar([self.key_var(k), v])
        raise Unsupported(f"dict.{name}")

    def __repr__(self):
        return f"DictVar({self.items!r})"

    def reconstruct(self, specs):
        if self.source is not None and not getattr(self, "fresh", False):
            return ("source", self.source)  # the caller's own dict (mutating it ends a trace)

        def build():
            if self.key_vars:
                raise Unsupported("a dict keyed by objects is live across a graph break")
            return ("dict", self.cls, [(k, specs.spec_of(x)) for k, x in self.items.items()])

        return specs.shared(self, build)


def _note_change(tx, var, what: str) -> None:
    """``var`` is about to change. A list or dict that exists outside the trace (it has a source)
    is changed in the model and the change recorded for replay after the graph; ``fresh`` ones
    were made by the call itself (the root's **kwargs), so their changes stay invisible."""
    if var.source is not None and not getattr(var, "fresh", False):
        from fireclay_capture.config import config

        if not config.replay_side_effects:
            raise Unsupported(f"mutating a {what} that exists outside the captured function "
                              "(config.replay_side_effects is off)")
        if type(var).python_type(var) not in (list, dict) and getattr(var, "cls", list).__name__ != "OrderedDict":
            raise Unsupported(f"mutating a {var.python_type().__name__} that exists outside the captured function")
        tx.side_effects.mutate_container(var)
        return
    tx.note_mutation(var)


class SetVar(Var):
    """A set of constants (or objects compared by identity), made in the trace or read from a
    source. Its members' keys are kept in a real Python ``set`` (``real``) and every operation is
    the same operation on that set, so iteration follows the order eager's set would have (string
    hashes differ between processes, and a set's order depends on its history)."""

    _MUTATING = frozenset({"add", "discard", "remove", "pop", "clear", "update", "intersection_update",
                           "difference_update", "symmetric_difference_update"})

    def __init__(self, items: list[Var], source: Source | None = None, real: set | None = None):
        self.source = source
        self.vars: dict[Any, Var] = {}  # key -> the Var it stands for
        self.real: set = set() if real is None else real
        for i in items:
            k = _key(None, i)
            self.vars.setdefault(k, i)
            if real is None:
                self.real.add(k)

    @property
    def items(self) -> dict[Any, Var]:
        return {k: self.vars[k] for k in self.real}

    def python_type(self):
        return set

    def is_constant(self):
        return all(v.is_constant() for v in self.vars.values())

    def as_python_constant(self):
        return set(self.real)

    def unpack(self, tx):
        return [self.vars[k] for k in self.real]

    def truth(self, tx):
        return bool(self.real)

    def getattr(self, tx, name):
        return ContainerMethodVar(self, name)

    def contains(self, tx, item: Var) -> bool | None:
        return _key(tx, item) in self.real

    def _derived(self, real: set, others: list[SetVar]) -> SetVar:
        out = SetVar([], real=real)
        for o in (self, *others):
            for k, v in o.vars.items():
                out.vars.setdefault(k, v)
        return out

    def _as_set(self, tx, v: Var) -> SetVar:
        real, vars_ = real_iterable(tx, v)
        out = SetVar([], real=real if isinstance(real, (set, frozenset)) else set(real))  # type: ignore[arg-type]
        out.vars.update(vars_)
        return out

    def method(self, tx, name, args, kwargs):
        if kwargs:
            raise Unsupported(f"set.{name} with keyword arguments")
        if name in self._MUTATING:
            if self.source is not None:
                raise Unsupported(f"set.{name} of a set that exists outside the captured function")
            tx.note_mutation(self)
        if name in ("add", "discard", "remove"):
            k = _key(tx, args[0])
            if name == "add":
                self.vars.setdefault(k, args[0])
                self.real.add(k)
            elif name == "discard":
                self.real.discard(k)
            elif k in self.real:
                self.real.remove(k)
            else:
                raise _key_error(k)
            return const(None)
        # The real method on the real keys: a set argument is merged as CPython merges sets (its
        # table copied), any other iterable added item by item, in its order.
        reals = []
        for a in args:
            real, vars_ = real_iterable(tx, a)
            for k, v in vars_.items():
                self.vars.setdefault(k, v)
            reals.append(real)
        if name == "pop":
            if not self.real:
                raise ObservedException(KeyError, "'pop from an empty set'")
            return self.vars[self.real.pop()]
        if name == "clear":
            self.real.clear()
            return const(None)
        if name.endswith("update"):
            getattr(self.real, name)(*reals)
            return const(None)
        if name in ("union", "intersection", "difference", "symmetric_difference", "copy"):
            return self._derived(getattr(self.real, name)(*reals), [])
        if name in ("issubset", "issuperset", "isdisjoint"):
            return const(getattr(self.real, name)(*reals))
        if name == "__contains__":
            return const(_key(tx, args[0]) in self.real)
        if name == "__len__":
            return const(len(self.real))
        raise Unsupported(f"set.{name}")

    def binary(self, tx, fn, other: Var, reflected: bool = False) -> Var:
        """``self <op> other`` for the set operators (``|``, ``&``, ``-``, ``^``, comparisons)."""
        import operator

        o = self._as_set(tx, other) if isinstance(other, (SetVar, ConstVar)) else None
        if o is None or (isinstance(other, ConstVar) and not isinstance(other.value, (set, frozenset))):
            raise Unsupported(f"operator.{fn.__name__} on a set and {other}")
        a, b = (o, self) if reflected else (self, o)
        if fn in (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge):
            return const(fn(a.real, b.real))
        inplace = fn in (operator.ior, operator.iand, operator.isub, operator.ixor)
        if inplace and not reflected:
            if self.source is not None:
                raise Unsupported("changing a set that exists outside the captured function")
            tx.note_mutation(self)
            for k, v in o.vars.items():
                self.vars.setdefault(k, v)
            self.real = fn(self.real, o.real)
            return self
        return a._derived(fn(a.real, b.real), [b])

    def __repr__(self):
        return f"SetVar({list(self.unpack(None))!r})"


def real_iterable(tx, v: Var) -> tuple[Any, dict[Any, Var]]:
    """What a set method or ``set(...)`` receives in eager, as real keys: a set's own table (a
    SetVar's mirror, a frozenset constant), else the items' keys in iteration order; with the Var
    each key stands for."""
    if isinstance(v, SetVar):
        return v.real, v.vars
    if isinstance(v, ConstVar) and isinstance(v.value, (set, frozenset)):
        return v.value, {k: const(k) for k in v.value}
    items = v.unpack(tx)
    keys = [_key(tx, i) for i in items]
    vars_: dict[Any, Var] = {}
    for k, i in zip(keys, items):
        vars_.setdefault(k, i)
    return keys, vars_


class ContainerMethodVar(Var):
    """A bound method of a container Var (``xs.append``, ``d.items``)."""

    def __init__(self, owner: Var, name: str):
        self.owner, self.name = owner, name

    def call(self, tx, args, kwargs):
        return self.owner.method(tx, self.name, args, kwargs)

    def __repr__(self):
        return f"method {self.name} of {self.owner}"

    def reconstruct(self, specs):
        if self.source is not None:
            return specs.output(self)
        return ("attr", specs.spec_of(self.owner), self.name)


class IteratorVar(Var):
    """An iterator over items known at trace time (what GET_ITER makes of every iterable)."""

    def __init__(self, items: list[Var]):
        self.items = list(items)
        self.pos = 0

    def python_type(self):
        return type(iter(()))

    def next(self) -> Var | None:
        if self.pos >= len(self.items):
            return None
        self.pos += 1
        return self.items[self.pos - 1]

    def unpack(self, tx):
        rest = self.items[self.pos:]
        self.pos = len(self.items)
        return rest

    def __repr__(self):
        return f"IteratorVar({len(self.items) - self.pos} left)"

    def reconstruct(self, specs):
        # (On the value stack, a for-loop's iterator crosses as the tuple of its remaining items.)
        raise Unsupported("an iterator kept in a variable is live across a graph break")


def sequence_of(items: list[Var], like: type) -> Var:
    if like is list:
        return ListVar(items)
    return TupleVar(items)


__all__ = ["BaseListVar", "ConstVar", "ContainerMethodVar", "DictVar", "IteratorVar", "ListVar",
           "SetVar", "TupleVar", "real_iterable", "sequence_of"]
