"""Each reduction kind of the loop-body vocabulary as data: what its running state holds, where
each part starts, how a value is folded in and two partial states are merged, and what its
result is. A generator renders these forms in its own spelling (C++ accumulator structs,
Triton tiles and combine functions) instead of spelling each kind itself.

A kind of one part folds with one binary op of the vocabulary (``add`` for a sum), both a
value into the state and one partial state into another. The kinds of several parts (argmax
and argmin: a value and its index; Welford: mean, m2 and weight) fold by their own rules,
which their renderers write once: the comparison that keeps the first index, Chan's merge.
"""

from __future__ import annotations

from dataclasses import dataclass

from fireclay_loops.backend.dtypes import extreme


@dataclass(frozen=True, kw_only=True)
class ReductionForm:
    """One reduction kind (see the module docstring)."""

    kind: str
    parts: tuple[str, ...] = ("value",)  # what its state holds (an ``index`` part is an int64)
    # where each part starts: "0", "1", "-1", or the end of the dtype's range the kind moves
    # away from ("lowest" for a max, "highest" for a min)
    start: tuple[str, ...] = ("0",)
    fold: str = ""  # the binary op folding a value in, and merging partials ("" for several parts)
    truth: bool = False  # folds whether the value is nonzero (any, all): the state is a bool
    of_values: bool = False  # the state is in the values' dtype, not the result's (argmax's index)
    selects: bool = False  # the result is one of the values folded in (it is compared with them)

    def start_value(self, dtype: str, part: int = 0) -> float | int:
        """Where part ``part`` of the state starts, as a number of ``dtype``."""
        start = self.start[part]
        if start in ("lowest", "highest"):
            return extreme(dtype, largest=start == "highest")
        return int(start)

    def state_bytes(self, itemsize: int) -> int:
        """Bytes one state takes when its value parts have ``itemsize`` bytes (an index part
        has 8, a truth 1), padded as a C struct of its parts is."""
        sizes = [8 if p == "index" else 1 if self.truth else itemsize for p in self.parts]
        align = max(sizes)
        return -(-sum(sizes) // align) * align


REDUCTIONS: dict[str, ReductionForm] = {form.kind: form for form in (
    ReductionForm(kind="sum", fold="add"),
    ReductionForm(kind="prod", start=("1",), fold="mul"),
    ReductionForm(kind="max", start=("lowest",), fold="maximum", selects=True),
    ReductionForm(kind="min", start=("highest",), fold="minimum", selects=True),
    ReductionForm(kind="any", fold="logical_or", truth=True),
    ReductionForm(kind="all", start=("1",), fold="logical_and", truth=True),
    ReductionForm(kind="argmax", parts=("value", "index"), start=("0", "-1"), of_values=True, selects=True),
    ReductionForm(kind="argmin", parts=("value", "index"), start=("0", "-1"), of_values=True, selects=True),
    ReductionForm(kind="welford", parts=("mean", "m2", "weight"), start=("0", "0", "0")),
)}
