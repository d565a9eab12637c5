"""fireclay-triton's reductions: one method per reduction kind on the ops handler (see
:class:`fireclay_loops.backend.KernelOps`). A reduction keeps a ``[XBLOCK, RBLOCK]`` accumulator,
updated once per tile (the *update*, a statement of the loop) and reduced across ``RBLOCK``
after it (the *result*); Welford keeps mean, m2 and count per lane and merges them with Chan's
formula. A sum of ``exp(a - max(a))`` in a looped kernel runs in the loop that computes the max
(online softmax). Split kernels store partial results (:mod:`fireclay_triton.split_reduction`).
"""

from __future__ import annotations

from functools import partialmethod

from fireclay_loops.backend.dtypes import extreme, is_float
from fireclay_loops.backend.patterns import canonical, exp_of_difference, strip_casts
from fireclay_loops.backend.reductions import REDUCTIONS
from fireclay_triton.op_templates import TritonOps, TritonValue, literal, tl_dtype
from fireclay_triton.split_reduction import SPLITTABLE, chan_merge, lanes_folded, split_result
from fireclay_triton.tiling import NotSplittable


class TritonKernelOps(TritonOps):
    """The handler a kernel's node bodies run on: the op templates and the reductions."""

    def reduction(self, dtype, src_dtype, reduction_type, value):
        gen = self.gen
        if not gen.reducing:  # a reduction over nothing: the value itself (welford: x, 0, 1)
            if reduction_type == "welford":
                zero = self.constant(0.0, dtype)
                one = self.constant(1.0, dtype)
                out = self.to_dtype(value, dtype)
                return TritonValue(name=out.name, code="", deps=[out], dtype=dtype, dims=out.dims, post=out.post,
                                   parts=[out, zero, one])
            if reduction_type in ("argmax", "argmin"):
                return self._const("0", "int64")
            return self.to_dtype(value, dtype)
        if gen.split and (gen.stage != 0 or reduction_type not in SPLITTABLE or dtype != "float32"):
            raise NotSplittable(f"a {reduction_type} in {dtype} at stage {gen.stage}")
        return super().reduction(dtype, src_dtype, reduction_type, value)

    def _finish(self, kind: str, dtype: str, update: TritonValue, done: TritonValue) -> TritonValue:
        gen = self.gen
        if gen.split:
            done = split_result(gen, kind, dtype, done)
        gen.roots.append(update)
        gen.finals.append(done)
        return done

    def _result(self, name: str, code: str, update: TritonValue, dtype: str) -> TritonValue:
        """A reduction's result after its loop, ``[XBLOCK, 1]``."""
        return TritonValue(name=name, code=code, deps=[update], dtype=dtype, dims=_X, varying=False,
                           post=self.gen.stage)

    def _arg_reduction(self, kind: str, *, dtype: str, src_dtype: str, value: TritonValue) -> TritonValue:
        gen = self.gen
        acc = gen.fresh("acc")
        vt = "int8" if src_dtype == "bool" else src_dtype
        init = TritonValue(name=acc, code=f"{acc}_v = tl.full({_FULL}, 0, {tl_dtype(vt)})\n"
                           f"{acc}_i = tl.full({_FULL}, -1, tl.int64)", dtype=vt, dims=_XR)
        ridx, ideps, _ = gen.index(self.flat_r)
        combine = f"fc_{kind}_combine"
        update = TritonValue(name="", code=f"{acc}_v, {acc}_i = {combine}({acc}_v, {acc}_i, {value.name}.to("
                             f"{tl_dtype(vt)}) + tl.zeros({_FULL}, {tl_dtype(vt)}), tl.where(xrmask, (zxr + ({ridx}))"
                             ".to(tl.int64), -1))", deps=[init, value] + ideps, dtype=vt, dims=_XR, varying=True)
        res = gen.fresh("red")
        if gen.interpret:
            # the interpreter runs a custom combine element by element: use builtin reductions
            # (numpy's max and min propagate NaN, like torch's argmax and argmin)
            pick = "tl.max" if kind == "argmax" else "tl.min"
            empty = literal(extreme(vt, largest=kind == "argmin"))
            line = (f"{res}_v = {pick}(tl.where({acc}_i >= 0, {acc}_v, {empty}), 1)[:, None]\n"
                    f"{res}_hit = (({acc}_v == {res}_v) | (({acc}_v != {acc}_v) & ({res}_v != {res}_v))) "
                    f"& ({acc}_i >= 0)\n"
                    f"{res}_i = tl.min(tl.where({res}_hit, {acc}_i, 9223372036854775807), 1)")
        else:
            line = f"{res}_v, {res}_i = tl.reduce(({acc}_v, {acc}_i), 1, {combine})"
        return self._finish(kind, dtype, update, self._result(f"{res}_i[:, None]", line, update, "int64"))

    reduce_argmax = partialmethod(_arg_reduction, "argmax")
    reduce_argmin = partialmethod(_arg_reduction, "argmin")

    def reduce_welford(self, *, dtype, src_dtype, value):
        acc, res = self.gen.fresh("acc"), self.gen.fresh("red")
        t = tl_dtype(dtype)
        if self.gen.kind == "persistent":
            # the whole row is in registers: the mean, then the squares about it (two sums, no
            # division per element, and more accurate than merging per-lane Welford states)
            update = TritonValue(name="", code=f"{acc}_x = tl.where(xrmask, {value.name}.to({t}), 0.0)",
                                 deps=[value], dtype=dtype, dims=_XR, varying=True)
            merge = chan_merge(res, f"rmask.to({t})", f"{acc}_x",
                               f"tl.where(xrmask, {acc}_x - {res}_mean, 0.0)", f"{res}_dm * {res}_dm")
        else:  # per lane, Welford's online update; then the lanes' states merged
            zeros = [f"{acc}_{p} = tl.zeros({_FULL}, {t})" for p in ("mean", "m2", "w")]
            init = TritonValue(name=acc, code="\n".join(zeros), dtype=dtype, dims=_XR)
            v = f"{value.name}.to({t})"
            update = TritonValue(name="", code="\n".join([
                f"{acc}_d = {v} - {acc}_mean",
                f"{acc}_wn = {acc}_w + 1.0",
                f"{acc}_mn = {acc}_mean + {acc}_d / {acc}_wn",
                f"{acc}_mean = tl.where(xrmask, {acc}_mn, {acc}_mean)",
                f"{acc}_m2 = tl.where(xrmask, {acc}_m2 + {acc}_d * ({v} - {acc}_mn), {acc}_m2)",
                f"{acc}_w = tl.where(xrmask, {acc}_wn, {acc}_w)"]), deps=[init, value], dtype=dtype, dims=_XR,
                varying=True)
            merge = chan_merge(res, f"{acc}_w", f"{acc}_w * {acc}_mean", f"{acc}_mean - {res}_mean",
                               f"{acc}_m2 + {acc}_w * {res}_dm * {res}_dm")
        done = self._result(res, "\n".join(merge), update, dtype)
        done.parts = [TritonValue(name=f"{res}_{p}", code="", deps=[done], dtype=dtype, dims=_X,
                                  post=self.gen.stage) for p in ("mean", "m2", "w")]
        return self._finish("welford", dtype, update, done)

    def accumulate(self, kind, *, dtype, src_dtype, value):
        """sum, prod, max, min, any, all: one accumulator, one step per tile, one final reduce."""
        gen = self.gen
        acc = gen.fresh("acc")
        if kind == "sum" and gen.kind == "looped" and is_float(dtype):
            found = self._online_softmax_source(value)
            if found is not None:
                return self._online_sum(dtype, *found)
        form = REDUCTIONS[kind]
        if form.truth:  # (a truth as an int8 of 0 or 1: `or` is its maximum, `and` its minimum)
            t, v = "tl.int8", f"({value.name} != 0).to(tl.int8)"
        else:
            t, v = tl_dtype(dtype), f"{value.name}.to({tl_dtype(dtype)})"
        init_text = literal(form.start_value(dtype))
        step = _FOLD[form.fold].format(a=acc, b=v)
        init = TritonValue(name=acc, code=f"{acc} = tl.full({_FULL}, {init_text}, {t})", dtype=dtype, dims=_XR)
        update = TritonValue(name="", code=f"{acc} = tl.where(xrmask, {step}, {acc})", deps=[init, value],
                             dtype=dtype, dims=_XR, varying=True)
        res = gen.fresh("red")
        done = self._result(res, f"{res} = ({lanes_folded(kind, acc, gen.interpret)})[:, None]", update, dtype)
        if kind == "max" and gen.kind == "looped" and is_float(dtype):
            gen.max_results[done] = (value, gen.stage)
        return self._finish(kind, dtype, update, done)

    # -- online softmax: sum(exp(a - max(a))) in the loop that computes max(a)
    def _online_softmax_source(self, value: TritonValue) -> tuple[TritonValue, int] | None:
        """For ``sum(exp(a - m))`` where ``m = max(a)`` was reduced by an earlier loop of this
        kernel: (``a`` as that loop computed it, that loop's stage)."""
        term = exp_of_difference(value)
        found = None if term is None else self.gen.max_results.get(term[1])
        if term is None or found is None or found[1] >= self.gen.stage or found[1] not in self.gen.loop_marks:
            return None
        memo = self.gen.canon_memo
        return found if canonical(strip_casts(term[0]), memo) == canonical(strip_casts(found[0]), memo) else None

    def _insert(self, pos: int, lines: list[str], outside_loop_of: int | None = None) -> None:
        self.gen.main[pos:pos] = lines
        for stage, mark in self.gen.loop_marks.items():
            for i in (0, 1):
                if mark[i] > pos or (mark[i] == pos and not (stage == outside_loop_of and i == 1)):
                    mark[i] += len(lines)

    def _online_sum(self, dtype: str, a: TritonValue, stage: int) -> TritonValue:
        """Keep a running max and a sum rescaled to it per lane in the loop of ``stage`` (which
        already reads ``a``), so the row is read once for both reductions, not twice.

        Per lane: ``s = s * exp(m_old - m_new) + exp(a - m_new)``; lanes merge as
        ``sum(s_lane * exp(m_lane - m))``. A lane whose max is still -inf holds no sum; it gives
        NaN only when the whole row is -inf, as ``exp(-inf - -inf)`` does in eager."""
        acc, res = self.gen.fresh("acc"), self.gen.fresh("red")
        t, full, ninf = tl_dtype(dtype), "[XBLOCK, RBLOCK]", 'float("-inf")'
        pre = [f"{acc}_m = tl.full({full}, {ninf}, {t})", f"{acc}_s = tl.zeros({full}, {t})",
               f"{acc}_seen = tl.zeros({full}, tl.int8)"]
        loop = [f"{acc}_v = {a.name}.to({t})",
                f"{acc}_mn = tl.where(xrmask, fc_maximum({acc}_m, {acc}_v), {acc}_m)",
                f"{acc}_s = tl.where(xrmask, {acc}_s * tl.where({acc}_mn == {ninf}, 1.0, tl.exp({acc}_m - {acc}_mn)) "
                f"+ tl.where({acc}_mn == {ninf}, 0.0, tl.exp({acc}_v - {acc}_mn)), {acc}_s)",
                f"{acc}_m = {acc}_mn",
                f"{acc}_seen = tl.maximum({acc}_seen, xrmask.to(tl.int8))"]
        post = [f"{res}_m = ({lanes_folded('max', f'{acc}_m', self.gen.interpret)})[:, None]",
                f"{res}_c = tl.where({acc}_m == {ninf}, tl.where(({acc}_seen != 0) & ({res}_m == {ninf}), "
                f'float("nan"), 0.0), {acc}_s * tl.exp({acc}_m - {res}_m))',
                f"{res} = (tl.sum({res}_c, 1))[:, None].to({t})"]
        mark = self.gen.loop_marks[stage]
        self._insert(mark[0], pre)
        self._insert(mark[1], ["    " + ln for ln in loop])
        self._insert(mark[1], post, outside_loop_of=stage)
        return TritonValue(name=res, code="", dtype=dtype, dims=_X, post=stage)



_FULL = "[XBLOCK, RBLOCK]"
# a fold of a reduction form (fireclay_loops.backend.reductions) on a tile of states
_FOLD = {"add": "{a} + {b}", "mul": "{a} * {b}", "maximum": "fc_maximum({a}, {b})", "minimum": "fc_minimum({a}, {b})",
         "logical_or": "tl.maximum({a}, {b})", "logical_and": "tl.minimum({a}, {b})"}
_X = frozenset({"x"})
_XR = frozenset({"x", "r"})
