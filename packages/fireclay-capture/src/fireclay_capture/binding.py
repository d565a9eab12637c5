"""A call's arguments bound to a function's parameters, defaults applied: the dict ``L`` the
guards read, as ``inspect.Signature.bind(...)`` with ``apply_defaults()`` gives it, made by
CPython's own call binding.

``inspect``'s binding walks the signature in Python (about 10-20 µs for a transformers forward
with a dozen keyword parameters), on every call of a captured function. A generated function
with the same parameter list that returns its locals does the same in C::

    def forward(self, input_ids=___, attention_mask=___, *, return_dict=___, **kwargs):
        return {'self': self, 'input_ids': input_ids, ..., 'kwargs': kwargs}

Its ``__defaults__`` and ``__kwdefaults__`` are the function's own objects, checked by identity at
each call (a function whose defaults are reassigned binds with the new ones). A call that does
not bind raises CPython's ``TypeError``, naming the function as a direct call would.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from fireclay_capture.code_flags import CO_VARARGS, CO_VARKEYWORDS

Binder = Callable[[tuple, dict], dict]


def argument_binder(fn: types.FunctionType) -> Binder:
    """``bind(args, kwargs) -> {parameter: value}`` for calls of ``fn`` (defaults applied). The
    parameters are read from the code object, which is what a call binds by (a ``__signature__``
    set on the function changes what ``inspect`` shows, not how a call binds)."""
    code = fn.__code__
    n_pos, n_kwonly = code.co_argcount, code.co_kwonlyargcount
    names = list(code.co_varnames[:n_pos + n_kwonly + bool(code.co_flags & CO_VARARGS)
                                  + bool(code.co_flags & CO_VARKEYWORDS)])
    n_defaults = len(fn.__defaults__ or ())
    kwdefaults = fn.__kwdefaults__ or {}
    text = [n if i < n_pos - n_defaults else f"{n}=None" for i, n in enumerate(names[:n_pos])]
    if code.co_posonlyargcount:
        text.insert(code.co_posonlyargcount, "/")
    rest = names[n_pos + n_kwonly:]
    if code.co_flags & CO_VARARGS:
        text.append(f"*{rest.pop(0)}")
    elif n_kwonly:
        text.append("*")
    text += [f"{n}=None" if n in kwdefaults else n for n in names[n_pos:n_pos + n_kwonly]]
    if code.co_flags & CO_VARKEYWORDS:
        text.append(f"**{rest.pop(0)}")
    # in the signature's order (inspect's): positional, *args, keyword-only, **kwargs
    varargs = names[n_pos + n_kwonly:n_pos + n_kwonly + 1] if code.co_flags & CO_VARARGS else []
    ordered = names[:n_pos] + varargs + names[n_pos:n_pos + n_kwonly] + names[n_pos + n_kwonly + len(varargs):]
    body = ", ".join(f"{n!r}: {n}" for n in ordered)
    source = f"def binder({', '.join(text)}):\n    return {{{body}}}\n"
    ns: dict[str, Any] = {}
    exec(compile(source, f"<fireclay binding of {code.co_qualname}>", "exec"), ns)
    binder = ns["binder"]
    # CPython's binding errors name the code object: the user's function, as a direct call would.
    binder.__code__ = binder.__code__.replace(co_name=code.co_name, co_qualname=code.co_qualname)
    binder.__name__, binder.__qualname__ = fn.__name__, fn.__qualname__

    def bind(args: tuple, kwargs: dict) -> dict:
        if binder.__defaults__ is not fn.__defaults__ or binder.__kwdefaults__ is not fn.__kwdefaults__:
            binder.__defaults__, binder.__kwdefaults__ = fn.__defaults__, fn.__kwdefaults__
        return binder(*args, **kwargs)

    return bind
