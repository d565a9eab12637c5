"""Many op cases compiled as one program: each case's inputs and ops go into one aten program,
so one library holds every case's kernels (one compiler run instead of hundreds)."""

from __future__ import annotations

import copy
import os
import random
import traceback
from dataclasses import dataclass, field

import torch
from aten_builder import AtenBuilder, T

from fireclay_loops import lower, schedule

SEED = int(os.environ.get("FIRECLAY_TEST_SEED", random.SystemRandom().randrange(1 << 30)))


@dataclass
class Case:
    id: str
    op: str
    args: tuple
    kwargs: dict
    atol: float
    rtol: float
    first_only: bool


@dataclass
class Batch:
    """The cases that built, their slice of the program's inputs and outputs, and the errors of
    those that did not build (a case's own test reports its error)."""

    builder: AtenBuilder = field(default_factory=AtenBuilder)
    tensors: list = field(default_factory=list)
    outputs: dict = field(default_factory=dict)  # case id -> (first output index, count)
    errors: dict = field(default_factory=dict)
    handles: list = field(default_factory=list)


def retype(case: Case, dtype: torch.dtype) -> Case:
    """The case with its float32 inputs (and dtype arguments) turned to ``dtype``."""

    def conv(a):
        if isinstance(a, T) and a.dtype == torch.float32:
            t = copy.copy(a)
            t.dtype = dtype
            return t
        if isinstance(a, list):
            return [conv(x) for x in a]
        if a is torch.float32:
            return dtype
        return a

    out = copy.copy(case)
    out.args = tuple(conv(a) for a in case.args)
    out.kwargs = {k: conv(v) for k, v in case.kwargs.items()}
    return out


def _bind(builder: AtenBuilder, a, gen, tensors, prefix):
    if isinstance(a, T):
        t = a.make(gen)
        tensors.append(t)
        return builder.input(t, f"{prefix}_{len(tensors)}")
    if isinstance(a, list):
        return [_bind(builder, x, gen, tensors, prefix) for x in a]
    return a


def _add_case(builder: AtenBuilder, c: Case, gen, tensors: list, prefix: str) -> tuple:
    bound = [_bind(builder, a, gen, tensors, prefix) for a in c.args]
    out = builder.call(c.op, *bound, **c.kwargs)
    return out if isinstance(out, tuple) else (out,)


def _lowers(c: Case) -> str | None:
    """None if the case lowers and schedules alone, else the error."""
    try:
        solo = AtenBuilder()
        outs = _add_case(solo, c, torch.Generator().manual_seed(0), [], "c")
        schedule(lower(solo.output(*outs)))
    except Exception:
        return traceback.format_exc()
    return None


def build_batch(cases: list[Case]) -> Batch:
    """All cases in one program; if that program does not lower, the cases that do not lower
    alone are left out (their tests report why) and the rest are batched."""
    errors: dict = {}
    for attempt in range(2):
        batch = Batch(errors=errors)
        gen = torch.Generator().manual_seed(SEED)
        for n, c in enumerate(cases):
            if c.id in errors:
                continue
            try:
                outs = _add_case(batch.builder, c, gen, batch.tensors, f"c{n}")
            except Exception:
                errors[c.id] = traceback.format_exc()
                continue
            batch.outputs[c.id] = (len(batch.handles), len(outs))
            batch.handles.extend(outs)
        try:
            schedule(lower(batch.builder.output(*batch.handles)))
            return batch
        except Exception:
            if attempt:
                raise
            errors.update({c.id: e for c in cases if c.id not in errors and (e := _lowers(c)) is not None})
    raise AssertionError("unreachable")


def check_case(case: Case, batch: Batch, got: tuple, want: tuple) -> None:
    if case.id in batch.errors:
        raise AssertionError(f"{case.id} did not lower:\n{batch.errors[case.id]}")
    start, count = batch.outputs[case.id]
    pairs = list(zip(got[start:start + count], want[start:start + count]))
    for g, w in pairs[: 1 if case.first_only else None]:
        assert g.dtype == w.dtype, f"{case.id}: dtype {g.dtype} != eager {w.dtype}"
        assert g.shape == w.shape, f"{case.id}: shape {tuple(g.shape)} != eager {tuple(w.shape)}"
        torch.testing.assert_close(g, w, atol=case.atol, rtol=case.rtol, equal_nan=True,
                                   msg=lambda m: f"{case.id} (seed {SEED}): {m}")
