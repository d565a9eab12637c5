"""Guards: everything a trace assumed, compiled into one Python function per cache entry.

The generated function both checks the guards and gathers the graph's flat inputs, so that a
cache hit evaluates each source expression once::

    def check_and_extract(L):
        try:
            v0 = L['x']
            if type(v0) is not k0 or v0.dtype is not k1 or ...: return None
            ...
        except Exception:
            return None
        return [v0, v3]

It returns the input list on success and ``None`` when any guard fails.

Every entry also guards the process-wide state that changes what a traced program computes, as
TorchDynamo's global-state guard does (:func:`global_state`): grad mode, the default dtype,
autocast (on or off, and its dtype, for cpu and cuda), deterministic algorithms (and warn-only),
and how many torch function modes and dispatch modes are active. It is one tuple, compared in one
line of the generated function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from fireclay_capture.sources import ConstSource, ItemSource, Source, read_source


class GlobalState(NamedTuple):
    """The process-wide settings a trace depends on (compared as a plain tuple)."""

    grad_mode: bool
    default_dtype: torch.dtype
    autocast_cpu: bool | torch.dtype  # False when off, else its dtype
    autocast_cuda: bool | torch.dtype
    deterministic: bool | int  # False when off, 1 when on, 2 when on and warn-only
    function_modes: int  # torch function modes on the stack (a mode sees every call)
    dispatch_modes: int  # dispatch modes on the stack

    def __repr__(self) -> str:  # short enough for one line of explain(): autocast as cpu/cuda
        def short(value: Any) -> str:
            return "off" if value is False else str(value).removeprefix("torch.")

        deterministic = {False: "off", 1: "on", 2: "warn-only"}[self.deterministic]
        modes = f", modes {self.function_modes}+{self.dispatch_modes}" if self.function_modes or self.dispatch_modes else ""
        return (f"grad {'on' if self.grad_mode else 'off'}, {short(self.default_dtype)}, autocast "
                f"{short(self.autocast_cpu)}/{short(self.autocast_cuda)}, deterministic {deterministic}{modes}")


def _global_state_reader():
    # The readers bound once: the guard calls this on every call of every entry, so settings that
    # only matter while another is on (autocast's dtype, deterministic's warn-only) are read only
    # then. The mode stack lengths are torch's own counters (the public getters build lists).
    grad, dtype = torch.is_grad_enabled, torch.get_default_dtype
    on, autocast_dtype = torch.is_autocast_enabled, torch.get_autocast_dtype
    det, warn = torch.are_deterministic_algorithms_enabled, torch.is_deterministic_algorithms_warn_only_enabled
    function_modes = getattr(torch._C, "_len_torch_function_stack", lambda: 0)
    dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)

    def read() -> tuple:
        return (grad(), dtype(), on("cpu") and autocast_dtype("cpu"), on("cuda") and autocast_dtype("cuda"),
                det() and 1 + warn(), function_modes(), dispatch_modes())

    return read


_read_global_state = _global_state_reader()


def global_state() -> GlobalState:
    """The process-wide settings now: what every cache entry is guarded on."""
    return GlobalState(*_read_global_state())


@dataclass
class Guard:
    source: Source | None
    kind: str  # type | id | equals | tensor | len | dict_keys | not_in | same | distinct | global_state | no_hooks
    data: Any = None

    def describe(self) -> str:
        where = self.source.expr({}) if self.source is not None and not self._needs_consts() else ""
        return f"{self.kind}({where or self.source}) {self.data!r}"

    def _needs_consts(self) -> bool:
        return any(isinstance(p, ConstSource) for p in (self.source.parts() if self.source else []))


class GuardSet:
    """The guards of one trace, deduplicated, in the order they were installed (a container's
    type and length before its elements, so that the generated code reads them safely)."""

    def __init__(self) -> None:
        self.guards: list[Guard] = []
        self._seen: set[tuple] = set()

    def _add(self, source: Source | None, kind: str, data: Any = None, key: Any = None) -> None:
        k = (source, kind, key if key is not None else _freeze(data))
        if k in self._seen:
            return
        self._seen.add(k)
        self.guards.append(Guard(source, kind, data))

    def type_is(self, source: Source, typ: type) -> None:
        self._add(source, "type", typ, key=id(typ))

    def id_is(self, source: Source, obj: Any) -> None:
        self._add(source, "id", obj, key=id(obj))

    def equals(self, source: Source, value: Any) -> None:
        self._add(source, "equals", value, key=(type(value), _freeze(value)))

    def tensor(self, source: Source, t: torch.Tensor, dynamic_dims: frozenset[int] = frozenset()) -> None:
        data = (type(t), t.dtype, t.device, tuple(t.shape), tuple(t.stride()), t.requires_grad,
                dynamic_dims)
        self._add(source, "tensor", data, key=(id(type(t)), str(t.dtype), str(t.device),
                                              data[3], data[4], data[5], dynamic_dims))

    def length(self, source: Source, typ: type, n: int) -> None:
        self._add(source, "len", (typ, n), key=(id(typ), n))

    def dict_keys(self, source: Source, typ: type, keys: list) -> None:
        self._add(source, "dict_keys", (typ, list(keys)), key=(id(typ), tuple(keys)))

    def no_hooks(self, module_source: Source) -> None:
        """The module still has no forward (pre-)hooks."""
        self._add(module_source, "no_hooks")

    def not_in(self, source: Source, name: str) -> None:
        self._add(source, "not_in", name)

    def same_object(self, source: Source, other: Source) -> None:
        self._add(source, "same", other, key=other)

    def distinct(self, sources: list[Source]) -> None:
        """The objects at ``sources`` are pairwise different objects."""
        self._add(sources[0], "distinct", list(sources), key=tuple(sources))

    def expression(self, text: str) -> None:
        """A Python boolean expression over ``L`` (the symbolic-shape guards)."""
        self._add(None, "expr", text)

    def global_state(self, state: GlobalState) -> None:
        """Grad mode, default dtype, autocast, deterministic algorithms, modes: as at capture."""
        self._add(None, "global_state", state)

    def __len__(self) -> int:
        return len(self.guards)

    def compile(self, input_sources: list[Source], L: dict | None = None) -> CompiledGuards:
        """The guard function; ``L``, the call the trace was made from, lets it skip the item
        checks of tuples that are still the objects seen then."""
        return CompiledGuards(self.guards, input_sources, L)


def _is_singleton(value: Any) -> bool:
    """Whether ``value`` is the only object of its type and value (an identity test suffices)."""
    return value is None or value is True or value is False or value is Ellipsis or value is NotImplemented


def _freeze(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return id(value)


# Item values whose type cannot change while the object stays the same (no ``__class__``
# assignment): a type guard on such an item of an unchanged tuple holds.
_IMMUTABLE_TYPES = (type(None), bool, int, float, complex, str, bytes, tuple, frozenset, torch.dtype)
_INDENT = "    "


class CompiledGuards:
    """The generated ``check_and_extract(L)`` of one cache entry, with its source text kept for
    people (``entry.guards.source``).

    The code is ordered and shaped for the call that passes, which is every call but the few
    that recompile:

    * every source is read once into a local, and each guard is one ``if`` over locals;
    * a tensor's metadata is one line: type, shape, strides (a contiguity test where the shape
      pins them), dtype, requires_grad, device (``is_cpu`` for the CPU); a weight's identity,
      the cheaper test, comes first;
    * guards on the items of a tuple (a function's ``__defaults__``) sit in a block entered only
      when the tuple is not the object seen at capture: a tuple cannot change, so the same
      object has the same items (``if v9 is not k3:`` then the item checks). Given ``L`` (the
      call the trace was made from) the compiler reads those tuples.
    """

    def __init__(self, guards: list[Guard], input_sources: list[Source], L: dict | None = None):
        self.guards = guards
        ns: dict[str, Any] = {"torch": torch, "___global_state": _read_global_state}
        consts: dict[int, str] = {}
        lines: list[str] = []  # each with its indentation
        names: dict[Source, str] = {}

        def const(obj: Any, hint: str = "k") -> str:
            if id(obj) not in consts:
                name = f"{hint}{len(consts)}"
                consts[id(obj)] = name
                ns[name] = obj
            return consts[id(obj)]

        def ref(source: Source) -> str:
            if source in names:  # its constants were named with it
                return names[source]
            for part in source.parts():
                if isinstance(part, ConstSource):
                    const(part.obj, "G" if part.hint == "G" else "c")
            base = getattr(source, "base", None)
            if isinstance(source, ConstSource):
                return source.expr(consts)
            if base is None:
                text = source.expr(consts)
            else:
                text = step(source, ref(base))
            name = f"v{len(names)}"
            names[source] = name
            lines.append(f"{name} = {text}")
            return name

        def step(source: Source, base_name: str) -> str:
            """The expression of ``source``'s last step, its base being the local ``base_name``."""
            rebased: Any = _Rebased(source, base_name)  # read like a source by its expr()
            return type(source).expr(rebased, consts)

        tagged: list[tuple[int, int]] = []  # (first line of the guard, guard index)
        typed: dict[str, type] = {}  # local name -> the type an earlier line checked it has
        blocks = _tuple_blocks(guards, L)  # guard index -> (tuple source, tuple, guard indices)
        identity_of = {g.source: i for i, g in enumerate(guards) if g.kind == "id" and g.source is not None}
        done: set[int] = set()

        def emit(index: int, indent: str = "", v: str | None = None) -> None:
            g = guards[index]
            done.add(index)
            tagged.append((len(lines), index))
            if g.kind == "expr":
                lines.append(f"if not ({g.data}): return None")
                return
            if g.kind == "global_state":
                lines.append(f"if ___global_state() != {const(tuple(g.data), 'state')}: return None")
                return
            if g.source is None:  # pragma: no cover - only expr and global_state guards have none
                raise AssertionError(f"a {g.kind} guard without a source")
            if v is None:
                v = ref(g.source)
            if g.kind == "same":
                check = f"{v} is not {ref(g.data)}"
            elif g.kind == "distinct":
                ids = ", ".join(f"id({ref(s)})" for s in g.data)
                check = f"len({{{ids}}}) != {len(g.data)}"
            else:
                check = self._check(g, v, const, typed)
            lines.append(f"{indent}if {check}: return None")

        for index, g in enumerate(guards):
            if index in done:
                continue
            if index in blocks:
                source, value, members = blocks[index]
                v = ref(source)
                lines.append(f"if {v} is not {const(value)}:")
                for member in members:
                    m = guards[member]
                    assert m.source is not None  # a block's members are items of its tuple
                    # an item is read inline: outside the block, a later guard binds it if needed
                    emit(member, _INDENT, v if m.source == source else step(m.source, v))
                continue
            if g.kind == "tensor" and g.source in identity_of and identity_of[g.source] not in done:
                emit(identity_of[g.source])  # a weight: its identity first, the cheaper test
            emit(index)
        outs = ", ".join(ref(s) for s in input_sources)
        body = "\n".join(2 * _INDENT + line for line in lines) or 2 * _INDENT + "pass"
        self.source = (
            "def check_and_extract(L):\n"
            "    try:\n"
            f"{body}\n"
            "    except Exception:\n"
            "        return None\n"
            f"    return [{outs}]\n"
        )
        exec(compile(self.source, "<fireclay guards>", "exec"), ns)
        self.fn = ns["check_and_extract"]
        self._ns, self._lines, self._tagged = ns, lines, tagged
        self._diagnose: Any = None

    @staticmethod
    def _check(g: Guard, v: str, const: Any, typed: dict[str, type]) -> str:
        """The condition under which guard ``g`` on the value ``v`` (a local or an expression) fails."""

        def type_check(typ: type) -> str:
            # a type already checked on an earlier line of this value holds here too
            return "" if typed.get(v) is typ else f"type({v}) is not {const(typ)} or "

        if g.kind == "type":
            typed[v] = g.data
            return f"type({v}) is not {const(g.data)}"
        if g.kind == "id" or g.kind == "equals" and _is_singleton(g.data):
            # None, True, False, ...: being that object is having its type and value
            return f"{v} is not {const(g.data)}"
        if g.kind == "equals":
            return f"{type_check(type(g.data))}{v} != {const(g.data)}"
        if g.kind == "len":
            typ, n = g.data
            return f"{type_check(typ)}len({v}) != {n}"
        if g.kind == "dict_keys":
            typ, keys = g.data
            return f"{type_check(typ)}list({v}) != {const(keys)}"
        if g.kind == "no_hooks":
            return f"{v}._forward_hooks or {v}._forward_pre_hooks"
        if g.kind == "not_in":
            return f"{g.data!r} in {v}"
        if g.kind == "tensor":
            return _tensor_check(g, v, const)
        raise AssertionError(g.kind)  # pragma: no cover - the kinds are closed

    def first_failure(self, L: dict) -> str | None:
        """Which guard rejects ``L``, in words (``None`` when all pass): the reason of a
        recompile. Built on first use from the same checks, each returning its guard's index
        (the item checks of a tuple block run whatever the tuple, to find the one that fails)."""
        if self._diagnose is None:
            starts = dict(self._tagged)
            body = []
            for i, line in enumerate(self._lines):
                indent = line[:len(line) - len(line.lstrip())]
                if i in starts:
                    body.append(f"{indent}___at = {starts[i]}")
                if line.endswith(":"):  # a tuple block's entry: enter it always
                    line = "if True:"
                body.append(line.replace(": return None", ": return ___at"))
            text = ("def diagnose(L):\n    ___at = -1\n    try:\n"
                    + "".join(f"        {line}\n" for line in body or ["pass"])
                    + "    except Exception:\n        return ___at\n    return None\n")
            exec(compile(text, "<fireclay guard diagnosis>", "exec"), self._ns)
            self._diagnose = self._ns["diagnose"]
        index = self._diagnose(L)
        if index is None:
            return None
        if index < 0:
            return "reading the inputs failed"
        return describe_failure(self.guards[index], L)

    def __call__(self, L: dict) -> list | None:
        return self.fn(L)


def _tuple_blocks(guards: list[Guard], L: dict | None) -> dict[int, tuple[Source, tuple, list[int]]]:
    """Guards that hold whenever a tuple is the object it was at capture, grouped by the tuple:
    {index of the group's first guard: (the tuple's source, the tuple, the group's guards)}.
    A group holds the guards on the tuple itself (its type, its length) and the identity, value
    and immutable-type guards on its items; groups of one guard are left as they are."""
    if L is None:
        return {}
    groups: dict[Source, list[int]] = {}
    values: dict[Source, tuple] = {}
    for index, g in enumerate(guards):
        if g.source is None:
            continue
        if g.kind in ("type", "len") and _reads_tuple(g.source, L, values):
            groups.setdefault(g.source, []).append(index)
        elif (isinstance(g.source, ItemSource) and _implied_by_identity(g)
              and _reads_tuple(g.source.base, L, values)):
            groups.setdefault(g.source.base, []).append(index)
    return {members[0]: (source, values[source], members) for source, members in groups.items() if len(members) > 1}


def _implied_by_identity(g: Guard) -> bool:
    """Whether ``g``, on an item of a tuple, holds while the tuple is the same object."""
    if g.kind in ("id", "equals"):  # equals: constants only (immutable values)
        return True
    return g.kind == "type" and g.data in _IMMUTABLE_TYPES


def _reads_tuple(source: Source, L: dict, values: dict[Source, tuple]) -> bool:
    if source not in values:
        try:
            value = read_source(source, L)
        except Exception:
            return False
        if type(value) is not tuple:
            return False
        values[source] = value
    return True


def _pinned_by_contiguity(shape: tuple, stride: tuple) -> bool:
    """Whether a contiguous tensor of ``shape`` must have ``stride``: the strides are the
    contiguous ones and no dimension has extent 0 or 1 (whose stride contiguity ignores)."""
    expected, step = [], 1
    for n in reversed(shape):
        expected.append(step)
        step *= n
    return all(n >= 2 for n in shape) and tuple(reversed(expected)) == tuple(stride)


def _tensor_check(g: Guard, v: str, const: Any) -> str:
    typ, dtype, device, shape, stride, rg, dyn = g.data
    # cheap first, for the entries a call does not match: a size differs more often than a dtype
    checks = [f"type({v}) is not {const(typ)}"]
    if dyn:
        # Strides follow the dynamic sizes: pin the layout by contiguity instead.
        checks.append(f"{v}.dim() != {len(shape)}")
        checks += [f"{v}.size({i}) != {s}" for i, s in enumerate(shape) if i not in dyn]
        checks.append(f"not {v}.is_contiguous()")
    else:
        checks.append(f"{v}.shape != {shape!r}")
        # is_contiguous() answers without building a tuple of strides
        checks.append(f"not {v}.is_contiguous()" if _pinned_by_contiguity(shape, stride)
                      else f"{v}.stride() != {stride!r}")
    checks += [f"{v}.dtype is not {const(dtype)}", f"{v}.requires_grad is not {rg}"]
    # reading .device builds a torch.device; is_cpu is a flag
    checks.append(f"not {v}.is_cpu" if device.type == "cpu" else f"{v}.device != {const(device)}")
    return " or ".join(checks)


class _Rebased:
    """A stand-in source whose base prints as an already-bound local name."""

    def __init__(self, source: Source, base_name: str):
        fields = source.__dataclass_fields__  # type: ignore[attr-defined]  # every concrete source is a dataclass
        self.__dict__.update({k: getattr(source, k) for k in fields})
        self.base = _Named(base_name)


class _Named:
    def __init__(self, name: str):
        self.name = name

    def expr(self, consts):
        return self.name


_TENSOR_FIELDS = ("type", "dtype", "device", "shape", "stride", "requires_grad")


def _where(g: Guard) -> str:
    if g.source is None:
        return "the call"
    try:
        return g.source.expr({})
    except Exception:
        return str(g.source)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def describe_failure(g: Guard, L: dict) -> str:
    """A failed guard in words, with the value the call brought where it can be read."""
    return _FailureText(g).explain(L)


class _FailureText:
    """Why one guard failed, in words: one method per guard kind (``on_<kind>``), given the value
    the call brought where the guard reads it (None for the guards on the call as a whole)."""

    _ON_THE_CALL = frozenset({"expr", "global_state"})  # guards with no source to read

    def __init__(self, guard: Guard):
        self.guard, self.where = guard, _where(guard)

    def explain(self, L: dict) -> str:
        describe = getattr(self, f"on_{self.guard.kind}", self.on_other)
        source = self.guard.source
        if self.guard.kind in self._ON_THE_CALL or source is None:
            return describe(None)
        try:
            value = read_source(source, L)
        except Exception as exc:
            return f"{self.where}: could not be read ({type(exc).__name__}: {exc})"
        return describe(value)

    def on_expr(self, _: None) -> str:
        return f"size guard {self.guard.data}"

    def on_global_state(self, _: None) -> str:
        want, got = self.guard.data, global_state()
        changed = [f"{name} expected {_short(w)}, got {_short(g)}"
                   for name, w, g in zip(GlobalState._fields, want, got) if w != g]
        return "global state: " + ("; ".join(changed) or "changed")

    def on_tensor(self, value: Any) -> str:
        where = self.where
        if not isinstance(value, torch.Tensor):
            return f"{where}: expected a tensor, got {type(value).__name__}"
        typ, dtype, device, shape, stride, rg, dyn = self.guard.data
        actual = (type(value), value.dtype, value.device, tuple(value.shape), value.stride(), value.requires_grad)
        for name, want, got in zip(_TENSOR_FIELDS, (typ, dtype, device, shape, stride, rg), actual):
            if name in ("shape", "stride") and dyn:
                continue
            if want != got:
                return f"{where}: {name} expected {want}, got {got}"
        if dyn:
            return (f"{where}: static sizes of {tuple(shape)} (dynamic dims {sorted(dyn)}) or contiguity "
                    f"changed, got {tuple(value.shape)}")
        return f"{where}: tensor guard failed"

    def on_type(self, value: Any) -> str:
        return f"{self.where}: type expected {self.guard.data.__name__}, got {type(value).__name__}"

    def on_id(self, value: Any) -> str:
        return f"{self.where}: expected the same object as when captured ({_short(self.guard.data)}), got {_short(value)}"

    def on_equals(self, value: Any) -> str:
        want = self.guard.data
        if type(value) is not type(want):
            return f"{self.where}: type expected {type(want).__name__} ({_short(want)}), got {type(value).__name__}"
        return f"{self.where} == {_short(want)} expected, got {_short(value)}"

    def on_len(self, value: Any) -> str:
        got = len(value) if hasattr(value, "__len__") else _short(value)
        return f"len({self.where}) == {self.guard.data[1]} expected, got {got}"

    def on_dict_keys(self, value: Any) -> str:
        return f"keys of {self.where} expected {_short(self.guard.data[1])}, got {_short(list(value))}"

    def on_no_hooks(self, value: Any) -> str:
        return f"{self.where}: a forward hook was added"

    def on_not_in(self, value: Any) -> str:
        return f"{self.where}: {self.guard.data!r} appeared"

    def on_same(self, value: Any) -> str:
        return f"{self.where}: expected the same object as {_where(Guard(self.guard.data, 'same'))}"

    def on_distinct(self, value: Any) -> str:
        names = ", ".join(_where(Guard(s, "distinct")) for s in self.guard.data)
        return f"expected different objects at {names}, some are the same object"

    def on_other(self, value: Any) -> str:
        return f"{self.where}: {self.guard.kind} guard failed"
