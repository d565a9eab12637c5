"""The ``ops`` handler interface: the vocabulary loop bodies are written in.

A lowering writes a loop body as ordinary Python calling ``ops.load(buf, index)``,
``ops.add(a, b)``, ``ops.reduction(...)``, ``ops.store(buf, index, value)``... Each call goes to
the *current handler*; the same body can therefore be recorded (:class:`~fireclay_loops.body.
BodyRecorder`), printed, run by the reference executor, or generated as C++/Triton by handing it
a different handler. A handler is any object with methods of these names.

Vocabulary (the closed set; :data:`OPS` is the table):

* memory: ``load(buf, index)``, ``masked_load(buf, index, mask)`` (0 where ``mask`` is false, and
  the address is not touched there), ``store(buf, index, value)``,
  ``store_reduction(buf, index, value)`` (the result of a reduction, index over the outer loop
  variables only), ``store_add(buf, index, value)`` (adds ``value`` to ``buf[index]``; several
  points may add at one index, and their sum is what remains, in no set order: a scatter-add,
  such as the backward of ``x[idx]`` or of an embedding). A buffer that a node adds to is written
  by that node alone and holds zeros before its kernel runs: the code generator clears it (the
  scheduler never fuses such a node with another, so a kernel that adds does nothing else);
* values: ``constant(value, dtype)``, ``index_expr(expr, dtype)``, ``to_dtype(x, dtype)``,
  ``random(kind, seed, offset)`` (``kind`` "rand" uniform in [0, 1) or "randn" standard normal,
  Philox4x32-10 keyed by ``seed`` at counter ``offset``, float32);
* indirection: ``indirect_indexing(value, size)`` turns a loaded integer into a symbol
  (``ind3``) that later index expressions may use (gather, embedding, advanced indexing); the
  value must already be in ``[0, size)`` (a lowering checks it first);
* checks, for what eager raises on (each returns its ``value``, and generated code never reads
  memory at a value that failed): ``check_bounds(value, size, negative, site, mask)`` asserts
  ``0 <= value < size`` (``-size <= value < size`` when ``negative``: the op counts negative
  indices from the end), ``check_nonzero(value, site, mask)`` that an integer divisor is not 0.
  ``site`` says what is checked, for the error (``dimension 0 of embedding at model.py:12:
  ...``); points where ``mask`` (a bool value, or None) is false are not checked. A failure
  raises :class:`~fireclay_loops.errors.IndexOutOfBounds` or
  :class:`~fireclay_loops.errors.IntegerDivisionByZero` (fireclay-cpp, once the kernel returns)
  or is a device-side assert (fireclay-triton); ``config.kernel_checks`` off emits none;
* reduction: ``reduction(dtype, src_dtype, reduction_type, value)`` over all reduction variables,
  ``getitem(value, i)`` for the parts of a multi-part result (welford: mean, m2, count);
* math: the unary, binary and ternary ops of :data:`MATH_OPS`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

UNARY = (
    "neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
    "atanh", "erf", "erfc", "sigmoid", "relu", "reciprocal", "floor", "ceil", "round", "trunc",
    "sign", "square", "bitwise_not", "logical_not", "isnan", "isinf", "lgamma", "frac",
)
BINARY = (
    "add", "sub", "mul", "truediv", "floordiv", "remainder", "fmod", "pow", "maximum", "minimum",
    "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "copysign",
)
TERNARY = ("where",)
MATH_OPS: dict[str, int] = {**{n: 1 for n in UNARY}, **{n: 2 for n in BINARY}, **{n: 3 for n in TERNARY}}
BOOL_RESULT = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
               "logical_not", "isnan", "isinf"}

REDUCTION_TYPES = ("sum", "prod", "max", "min", "any", "all", "argmax", "argmin", "welford")

MEMORY_OPS = ("load", "masked_load", "store", "store_reduction", "store_add")
VALUE_OPS = ("constant", "index_expr", "to_dtype", "random", "indirect_indexing", "reduction", "getitem")
CHECK_OPS = ("check_bounds", "check_nonzero")
OPS: tuple[str, ...] = MEMORY_OPS + VALUE_OPS + CHECK_OPS + tuple(MATH_OPS)

_state = threading.local()


def current_handler() -> Any:
    stack = getattr(_state, "stack", None)
    if not stack:
        raise RuntimeError("ops.* called outside a handler: wrap the call in `with use_handler(h):`")
    return stack[-1]


@contextmanager
def use_handler(handler: Any) -> Iterator[Any]:
    """Route ``ops.*`` calls to ``handler`` inside the block."""
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(handler)
    try:
        yield handler
    finally:
        stack.pop()


class _Ops:
    """``ops.name(...)`` forwards to the current handler's ``name`` method."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in _OPS_SET:
            raise AttributeError(f"ops.{name} is not in the loop-body vocabulary")

        def call(*args: Any, **kwargs: Any) -> Any:
            return getattr(current_handler(), name)(*args, **kwargs)

        call.__name__ = name
        return call


_OPS_SET = frozenset(OPS)
ops = _Ops()
