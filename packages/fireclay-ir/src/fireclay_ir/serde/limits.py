"""The error type of the format and the bounds every document must stay within.

A document comes from a file a stranger may have written, so the reader checks sizes before it
allocates, and reports every problem as one :class:`FormatError` that says where in the document
it is (``graphs[0].nodes[12].args[1]``) and what was expected there.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass

from fireclay_ir.model import IRError


class FormatError(IRError):
    """A document (or weights file) that cannot be read or written.

    ``where`` is the place in the document (a dotted/indexed path, ``""`` for the whole
    document); ``problem`` the sentence that says what was expected.
    """

    def __init__(self, where: str, problem: str):
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}" if where else problem)

    def __reduce__(self) -> tuple[type[FormatError], tuple[str, str]]:  # keep both parts when the error is copied or sent to another process
        return (type(self), (self.where, self.problem))


@dataclass(frozen=True)
class Limits:
    """Upper bounds a document must respect; the defaults are documented in docs/format/README.md.

    They exist so that a malicious or broken file fails quickly with a FormatError instead of
    exhausting memory or the interpreter's stack.
    """

    max_document_chars: int = 512 * 1024 * 1024
    max_nesting: int = 100
    max_graphs: int = 10_000
    max_nodes: int = 2_000_000
    max_values: int = 8_000_000
    max_name_chars: int = 1024
    max_string_chars: int = 1024 * 1024
    max_rank: int = 64
    max_symbols: int = 100_000
    max_guards: int = 1_000_000
    max_weights: int = 1_000_000
    max_weights_header_bytes: int = 100 * 1024 * 1024


DEFAULT_LIMITS = Limits()

# Integers in a document must fit a signed 64-bit integer, so readers in other languages can
# hold them without a bignum type.
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1


def describe(x: object) -> str:
    """A short description of a JSON value for error messages (never the whole thing)."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, (int, float)):
        text = repr(x)
        return f"number {text if len(text) <= 24 else text[:20] + '...'}"
    if isinstance(x, str):
        shown = x if len(x) <= 40 else x[:37] + "..."
        return f"string {shown!r}"
    if isinstance(x, list):
        return f"a list of {len(x)}"
    if isinstance(x, dict):
        keys = sorted(x)[:4]
        more = ", ..." if len(x) > 4 else ""
        return f"an object with keys {', '.join(map(repr, keys))}{more}" if x else "an empty object"
    return type(x).__name__


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Symbolic expressions and guards are data for fireclay-shapes, which may hand them to sympy;
# this character set keeps out quotes, brackets, backslashes and dunder names, so that no
# document can smuggle Python code through an expression string.
_EXPR_CHARS = re.compile(r"^[A-Za-z0-9_ +\-*/%(),.<>=!&|~^]+$")
EXPR_CHARS_TEXT = "letters, digits, _, spaces and + - * / % ( ) , . < > = ! & | ~ ^"


def is_identifier(s: str) -> bool:
    """A name the format requires to be an identifier: value, graph, symbol, dialect, keyword names."""
    return bool(_IDENT.match(s)) and not keyword.iskeyword(s)


def is_expression(s: str) -> bool:
    """Whether ``s`` may be a symbolic expression or guard in a document."""
    return bool(s.strip()) and bool(_EXPR_CHARS.match(s)) and "__" not in s
