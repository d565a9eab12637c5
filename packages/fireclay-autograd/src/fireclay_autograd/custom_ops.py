"""Functional forms of mutating ``torch.library`` custom operators.

A custom operator whose schema writes into arguments (``mylib::acc(Tensor(a!) out, Tensor x)
-> ()``) has no functional twin that torch knows. Functionalization needs one: here it is made,
once per operator and process, as another ``torch.library`` operator in the namespace
:data:`NAMESPACE` (``fireclay_functional::mylib__acc__default(Tensor out, Tensor x) -> Tensor``)
that clones the written arguments, calls the operator on the clones, and returns the operator's
own results followed by the clones, the written arguments' new values. Its meta kernel is the
same function on meta tensors, which runs the operator's own fake kernel. The original
operator runs, with its effect on the clones; functionalization writes the new values back
where the operator wrote.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from fireclay_ir import IRError

NAMESPACE = "fireclay_functional"
_ALIAS = re.compile(r"\(([a-z][a-z0-9]*)!?\)")


class _FunctionalForms:
    """The library of functional forms this process made, by the mutating operator."""

    def __init__(self) -> None:
        self.library: Any = None
        self.forms: dict[Any, Any] = {}

    def of(self, op: torch._ops.OpOverload) -> torch._ops.OpOverload:
        form = self.forms.get(op)
        if form is None:
            form = self.forms[op] = self._define(op)
        return form

    def _define(self, op: torch._ops.OpOverload) -> torch._ops.OpOverload:
        schema = op._schema
        written = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
        for i in written:
            if str(schema.arguments[i].type) != "Tensor":
                raise IRError(f"custom operator {schema.name} writes into {schema.arguments[i].name!r} of type "
                              f"{schema.arguments[i].type}; only writes into tensors have a functional form")
        if any(r.alias_info is not None for r in schema.returns):
            raise IRError(f"custom operator {schema.name} returns an alias of an argument; it has no functional form")
        name = f"{schema.name.replace('::', '__')}__{op._overloadname}"
        text = str(schema)
        args_text = _ALIAS.sub("", text[text.index("("):text.rindex(") -> ") + 1])
        returns = [str(r.type) for r in schema.returns] + ["Tensor"] * len(written)
        returns_text = returns[0] if len(returns) == 1 else f"({', '.join(returns)})"
        if self.library is None:
            self.library = torch.library.Library(NAMESPACE, "FRAGMENT")
        self.library.define(f"{name}{args_text} -> {returns_text}")
        self.library.impl(name, _functional_call(op, written, len(schema.returns)), "CompositeExplicitAutograd")
        return getattr(getattr(torch.ops, NAMESPACE), name).default


def _functional_call(op: torch._ops.OpOverload, written: list[int], num_returns: int) -> Callable[..., Any]:
    names = [a.name for a in op._schema.arguments]

    def call(*args: Any, **kwargs: Any) -> Any:
        positional = list(args)
        clones = []
        for i in written:
            if i < len(positional):
                positional[i] = positional[i].clone()
                clones.append(positional[i])
            else:
                kwargs[names[i]] = kwargs[names[i]].clone()
                clones.append(kwargs[names[i]])
        result = op(*positional, **kwargs)
        results = [] if num_returns == 0 else list(result) if num_returns > 1 else [result]
        out = (*results, *clones)
        return out[0] if len(out) == 1 else out

    return call


FUNCTIONAL_FORMS = _FunctionalForms()


def functional_form(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    """The functional form of the mutating custom operator ``op`` (see the module's doc)."""
    return FUNCTIONAL_FORMS.of(op)
