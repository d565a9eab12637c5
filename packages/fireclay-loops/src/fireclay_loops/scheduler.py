"""The scheduler: fuse loop nodes into kernels, order them, plan memory.

Passes, in order (:func:`schedule`):

0. ``split_scalar_reductions`` — for a GPU (``config.split_reductions``), a reduction to a
   scalar of what a row kernel computes becomes per-row partials that kernel can take
   (:mod:`fireclay_loops.long_reductions`);
   ``inline_pointwise``  — recompute cheap pointwise producers inside consumers that read them
   at another index (:mod:`fireclay_loops.inline`);
1. ``initial_groups``    — one candidate kernel per pointwise/reduction node;
2. ``fuse``              — greedy fusion, best score first, until nothing changes:
   vertical (producer into consumer, pointwise into a reduction's prologue/epilogue) and
   horizontal (independent nodes that read the same buffers over the same iteration space);
   legal only if no cycle appears, the iteration spaces agree, and every buffer passed between
   the two is read at exactly the index it is written (read/write index analysis); profitable
   only if memory traffic is saved (the score, in bytes); for a GPU, never an epilogue inside
   the loop of a reduction with few outputs (it could not be split over programs);
3. ``order_steps``       — topological order of kernels and extern calls;
4. ``finish_kernels``    — reduction-loop stages and internal (never stored) buffers, then
   adjacent loops every index walks as one merged (:mod:`fireclay_loops.merge_loops`,
   ``config.merge_loops``);
5. ``plan_memory``       — buffer lifetimes and reuse (:mod:`fireclay_loops.memory`);
6. ``verify_schedule``   — the invariants code generators rely on (:mod:`fireclay_loops.verify`).

Every fusion considered leaves a :class:`Decision` with its reason, for the report.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

import sympy

from fireclay_loops import exprs
from fireclay_loops.config import config
from fireclay_loops.ir import ComputeNode, ExternNode, LoopProgram
from fireclay_loops.kernel import Kernel, KernelNode
from fireclay_loops.long_reductions import epilogue_in_loop, recompute_for_epilogue
from fireclay_loops.merge_loops import merge_kernel_loops


@dataclass
class Decision:
    action: str  # "fuse", "keep apart" or "inline"
    first: str
    second: str
    kind: str  # "vertical" or "horizontal"
    reason: str
    bytes_saved: int = 0

    def __str__(self) -> str:
        saved = f", saves {self.bytes_saved} bytes" if self.action == "fuse" else ""
        return f"{self.action} {self.first} + {self.second} ({self.kind}): {self.reason}{saved}"


@dataclass
class Group:
    """A kernel being formed: nodes in program order over a shared iteration space."""

    nodes: list[ComputeNode]
    xsizes: list[sympy.Expr]
    rsizes: list[sympy.Expr]
    var_maps: dict[str, dict[Any, Any]]
    order: int

    def __post_init__(self) -> None:
        self.name = "+".join(n.name for n in self.nodes)
        self._accesses: dict[str, list[Any]] = {}
        # (node name, "read" / "write") -> that node's accesses in kernel variables; a merge
        # hands the earlier group's entries on (its nodes keep their variable maps).
        self.node_accesses: dict[tuple[str, str], list[Any]] = {}
        self._reads = {b for n in self.nodes for b, _, _ in n.body.reads()}
        self._writes = {b for n in self.nodes for b, _, _ in n.body.writes()}

    def accesses(self, which: str) -> list[tuple[str, sympy.Expr, ComputeNode]]:
        """``(buffer, index in kernel variables, node)`` of every read or write."""
        if which not in self._accesses:
            out = []
            for n in self.nodes:
                found = self.node_accesses.get((n.name, which))
                if found is None:
                    items = n.body.reads() if which == "read" else n.body.writes()
                    found = [(b, i.xreplace(self.var_maps[n.name]), n) for b, i, _ in items]
                    self.node_accesses[(n.name, which)] = found
                out.extend(found)
            self._accesses[which] = out
        return self._accesses[which]

    @property
    def reduces(self) -> bool:
        """Whether a node of it reduces: even over no loop at all (a reduction over extent-1
        dimensions keeps its accumulator, once per point)."""
        return any(n.kind == "reduction" for n in self.nodes)

    def reads(self) -> set[str]:
        return self._reads

    def writes(self) -> set[str]:
        return self._writes


@dataclass
class FusionState:
    program: LoopProgram
    groups: list[Group]
    externs: list[ExternNode]
    position: dict[str, int]
    decisions: list[Decision] = field(default_factory=list)
    split_reductions: bool = False  # keep reductions with few outputs splittable (a GPU backend's wish)


def single_group(n: ComputeNode, order: int) -> Group:
    """A candidate kernel holding one node, its loops as the kernel's."""
    b = n.body
    xs = [exprs.symbol(f"x{j}") for j in range(len(b.vars))]
    rs = [exprs.symbol(f"r{j}") for j in range(len(b.reduction_vars))]
    var_map = dict(zip(b.vars, xs)) | dict(zip(b.reduction_vars, rs))
    return Group([n], list(b.sizes), list(b.reduction_sizes), {n.name: var_map}, order)


def initial_groups(program: LoopProgram) -> FusionState:
    groups, externs, position = [], [], {}
    for k, n in enumerate(program.nodes):
        position[n.name] = k
        if isinstance(n, ComputeNode):
            groups.append(single_group(n, k))
        elif isinstance(n, ExternNode):
            externs.append(n)
    return FusionState(program, groups, externs, position)


# --------------------------------------------------------------------------- legality


def _same_sizes(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(exprs.equal(x, y) for x, y in zip(a, b))


def _candidate_maps(base: Group, other: Group) -> list[dict[Any, Any]]:
    """Ways to map ``other``'s kernel variables onto ``base``'s, most natural first."""
    bx = [exprs.symbol(f"x{j}") for j in range(len(base.xsizes))]
    br = [exprs.symbol(f"r{j}") for j in range(len(base.rsizes))]
    ox = [exprs.symbol(f"x{j}") for j in range(len(other.xsizes))]
    orr = [exprs.symbol(f"r{j}") for j in range(len(other.rsizes))]
    if other.rsizes or other.reduces:
        # (a reduction over no loop is no pointwise node: its accumulator takes one value per
        # point of its own loops, so none of them may become the base's reduction loops)
        if _same_sizes(base.xsizes, other.xsizes) and _same_sizes(base.rsizes, other.rsizes):
            return [dict(zip(ox, bx)) | dict(zip(orr, br))]
        return []
    maps = []
    if base.rsizes and _same_sizes(base.xsizes, other.xsizes):
        maps.append(dict(zip(ox, bx)))  # over the outer loops only: a reduction's epilogue side
    full_vars, full_sizes = bx + br, base.xsizes + base.rsizes
    if len(other.xsizes) == len(full_sizes) and len(full_sizes) <= config.max_permutation_rank:
        for perm in itertools.permutations(range(len(full_sizes))):
            if all(exprs.equal(other.xsizes[j], full_sizes[p]) for j, p in enumerate(perm)):
                maps.append({ox[j]: full_vars[p] for j, p in enumerate(perm)})
    # The same loops seen through a view ([2, 3, 8] against [6] x r[8]): split or join them.
    targets = ([(bx, base.xsizes)] if base.rsizes else []) + [(full_vars, full_sizes)]
    for vars_, sizes in targets:
        if len(other.xsizes) != len(sizes) or not all(exprs.equal(a, b) for a, b in zip(other.xsizes, sizes)):
            regrouped = _regrouped_map(other.xsizes, vars_, sizes, len(base.xsizes))
            if regrouped is not None and regrouped not in maps:
                maps.append(regrouped)
    return maps


def _regroup(small: list[Any], big: list[Any]) -> list[tuple[list[int], list[int]]] | None:
    """Split two static size lists of one numel into consecutive groups of equal products
    (``[2, 3, 8]`` and ``[6, 8]`` give ``([0, 1], [0]), ([2], [1])``), or None."""
    static_a = [exprs.to_static(s) for s in small]
    static_b = [exprs.to_static(s) for s in big]
    a = [n for n in static_a if n is not None]
    b = [n for n in static_b if n is not None]
    if len(a) != len(static_a) or len(b) != len(static_b) or not a or not b:
        return None
    groups: list[tuple[list[int], list[int]]] = []
    i, j = 0, 0
    while i < len(a) and j < len(b):
        ga, gb, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(a):
                pa, ga = pa * a[i], ga + [i]
                i += 1
            elif pb < pa and j < len(b):
                pb, gb = pb * b[j], gb + [j]
                j += 1
            else:
                return None
        groups.append((ga, gb))
    return groups if i == len(a) and j == len(b) else None


def _regrouped_map(other_sizes: list[Any], vars_: list[Any], sizes: list[Any], outer: int) -> dict[Any, Any] | None:
    """Map a pointwise group's loops onto loops of the same numel shaped differently (a view
    between them): each of its variables becomes a digit of the matching flat index. None where
    a digit would mix a reduction's outer loops (the first ``outer`` of ``vars_``) with its
    reduction loops: a reduction's loop order is not a view's (a column reduction's outer loop
    walks the innermost dim), so each index would take divisions and remainders of them all,
    and no loop vectorises (Swin's patch-merging gradient fused into a layer norm's column sums
    ran 10x slower than on its own)."""
    groups = _regroup(other_sizes, sizes)
    if groups is None:
        return None
    if any(min(gb) < outer <= max(gb) for _, gb in groups):
        return None
    ranges = {v.name: n for v, n in zip(vars_, sizes)}
    ox = [exprs.symbol(f"x{j}") for j in range(len(other_sizes))]
    mapping = {}
    for ga, gb in groups:
        flat = sum((vars_[k] * exprs.product(sizes[k + 1: gb[-1] + 1]) for k in gb), sympy.Integer(0))
        for k in ga:
            inner = exprs.product(other_sizes[k + 1: ga[-1] + 1])
            mapping[ox[k]] = exprs.simplify(exprs.modular_indexing(flat, inner, other_sizes[k]), ranges)
    return mapping


def _remap(group: Group, mapping: dict[Any, Any], onto: Group) -> dict[str, dict[Any, Any]]:
    """``group``'s variable maps composed with ``mapping`` (its kernel variables in ``onto``'s),
    simplified over ``onto``'s loop ranges: a digit of a regrouped loop taken again
    (``FloorDiv(x0, 96)`` after ``x0 -> 96*x0 + 12*x1 + x2``) folds back to one loop variable,
    so that its nodes' accesses stay comparable with one another (the verifier's
    :func:`exprs.equal` knows no ranges) and the code generators index loops, not digits."""
    ranges = {f"x{j}": n for j, n in enumerate(onto.xsizes)} | {f"r{j}": n for j, n in enumerate(onto.rsizes)}
    return {name: {v: exprs.simplify(e.xreplace(mapping), ranges) for v, e in vm.items()}
            for name, vm in group.var_maps.items()}


def _index_conflict(writer: list[Any], reader: list[Any]) -> str | None:
    """Why the reader cannot take the writer's values in registers, or None."""
    written: dict[str, Any] = {}
    for b, idx, _node in writer:
        if b in written and not exprs.equal(written[b], idx):
            return f"{b} is written at two different indices"
        written[b] = idx
    for b, idx, n in reader:
        if b in written and not exprs.equal(written[b], idx):
            return f"{n.name} reads {b} at {exprs.to_str(idx)} but it is written at {exprs.to_str(written[b])}"
    return None


class StepGraph:
    """Which steps (groups and extern calls) feed which, for the cycle check of a fusion. Each
    step's descendants are kept as a bit set (one bit per step), so that the check asks a few
    sets instead of walking the graph once per pair of candidates."""

    def __init__(self, state: FusionState):
        steps = [(g.name, g.reads(), g.writes()) for g in state.groups] + \
                [(e.name, set(e.read_buffers()), set(e.write_buffers())) for e in state.externs]
        readers: dict[str, list[str]] = {}
        for name, reads, _ in steps:
            for b in reads:
                readers.setdefault(b, []).append(name)
        self.succ = {name: {r for b in writes for r in readers.get(b, ()) if r != name} for name, _, writes in steps}
        self.bit = {name: 1 << k for k, name in enumerate(self.succ)}
        self._bits = len(self.bit)
        self.reach: dict[str, int] | None = self._descendants()

    def _descendants(self) -> dict[str, int] | None:
        """Each step's descendants as a bit set; None if the steps are not acyclic (the walk of
        :meth:`path_outside` then answers)."""
        preds = {name: 0 for name in self.succ}
        for nexts in self.succ.values():
            for n in nexts:
                preds[n] += 1
        order = [name for name, k in preds.items() if k == 0]
        for name in order:  # grows while it is read: Kahn's order
            for n in self.succ[name]:
                preds[n] -= 1
                if preds[n] == 0:
                    order.append(n)
        if len(order) != len(self.succ):
            return None
        reach: dict[str, int] = {}
        for name in reversed(order):
            r = 0
            for n in self.succ[name]:
                r |= self.bit[n] | reach[n]
            reach[name] = r
        return reach

    def merge(self, a: str, b: str, merged: str) -> None:
        """Replace steps ``a`` and ``b`` by their fusion ``merged``."""
        succ = (self.succ.pop(a, set()) | self.succ.pop(b, set())) - {a, b}
        for nexts in self.succ.values():
            if a in nexts or b in nexts:
                nexts.discard(a)
                nexts.discard(b)
                nexts.add(merged)
        self.succ[merged] = succ
        both = self.bit.pop(a, 0) | self.bit.pop(b, 0)
        self.bit[merged] = bit = 1 << self._bits
        self._bits += 1
        if self.reach is None:
            return
        below = (self.reach.pop(a, 0) | self.reach.pop(b, 0)) & ~both
        for name, r in self.reach.items():
            if r & both:  # reached a or b: now reaches the fusion and all it reaches
                self.reach[name] = (r & ~both) | bit | below
        self.reach[merged] = below

    def path_outside(self, a: str, b: str) -> bool:
        """Whether a path ``a -> ... -> b`` passes through some third step."""
        if self.reach is not None:
            target = self.bit.get(b, 0)
            return any(self.reach[s] & target for s in self.succ.get(a, ()) if s != b)
        stack = [s for s in self.succ.get(a, ()) if s != b]
        seen = set(stack)
        while stack:
            cur = stack.pop()
            for nxt in self.succ.get(cur, ()):
                if nxt == b:
                    return True
                if nxt not in seen and nxt != a:
                    seen.add(nxt)
                    stack.append(nxt)
        return False


def try_fuse(state: FusionState, a: Group, b: Group, graph: StepGraph | None = None) -> tuple[Group | None, str]:
    """The fused group and why, or None and why not."""
    if state.position[a.nodes[0].name] > state.position[b.nodes[0].name]:
        a, b = b, a
    graph = graph or StepGraph(state)
    if graph.path_outside(a.name, b.name) or graph.path_outside(b.name, a.name):
        return None, "another kernel or extern call runs between them"
    return legal_merge(a, b, state.position)


def legal_merge(a: Group, b: Group, position: dict[str, int]) -> tuple[Group | None, str]:
    """``a`` (the earlier) and ``b`` merged over one iteration space, if their loops can be
    matched so that every buffer passed between them is read where it is written."""
    if any(n.body.accumulates for n in a.nodes + b.nodes):
        # its buffer is complete only once every point has added (and is cleared before the
        # kernel): no reader may share its loop, and a kernel that adds does nothing else
        return None, "a scatter-add runs in a kernel of its own"
    if a.rsizes and b.rsizes or not b.rsizes and not (b.reduces and not a.reduces):
        base, other = a, b
    else:
        base, other = b, a
    maps = _candidate_maps(base, other)
    if not maps:
        return None, (f"iteration spaces differ: {_space(base)} vs {_space(other)}")
    reason = "no mapping of the loops"
    for mapping in maps:
        first, second = (a, b)
        w1 = [(x, i.xreplace(mapping) if first is other else i, n) for x, i, n in first.accesses("write")]
        r2 = [(x, i.xreplace(mapping) if second is other else i, n) for x, i, n in second.accesses("read")]
        w2 = [(x, i.xreplace(mapping) if second is other else i, n) for x, i, n in second.accesses("write")]
        r1 = [(x, i.xreplace(mapping) if first is other else i, n) for x, i, n in first.accesses("read")]
        conflict = _index_conflict(w1, r2) or _index_conflict(w2, r1)
        if conflict is None:
            var_maps = dict(base.var_maps) | _remap(other, mapping, base)
            merged = Group(sorted(a.nodes + b.nodes, key=lambda n: position[n.name]),
                           list(base.xsizes), list(base.rsizes), var_maps, min(a.order, b.order))
            merged.node_accesses.update(base.node_accesses)
            return merged, "same iteration space, every shared buffer read where it is written"
        reason = conflict
    return None, reason


def _space(g: Group) -> str:
    xs = ", ".join(exprs.to_str(s) for s in g.xsizes)
    rs = ", ".join(exprs.to_str(s) for s in g.rsizes)
    return f"[{xs}]" + (f" x r[{rs}]" if g.rsizes else "")


# --------------------------------------------------------------------------- profitability


def _readers(state: FusionState) -> dict[str, set[str]]:
    readers: dict[str, set[str]] = {}
    for g in state.groups:
        for buf in g.reads():
            readers.setdefault(buf, set()).add(g.name)
    for e in state.externs:
        for buf in e.read_buffers():
            readers.setdefault(buf, set()).add(e.name)
    return readers


def fusion_score(state: FusionState, a: Group, b: Group, readers: dict[str, set[str]] | None = None,
                 outputs: set[str] | None = None) -> tuple[int, str]:
    """Bytes of memory traffic the fusion saves, and whether it is vertical or horizontal.
    ``readers`` and ``outputs`` (the program's output buffers): as computed once per round."""
    prog = state.program
    outputs = prog.output_buffers() if outputs is None else outputs
    readers = _readers(state) if readers is None else readers
    saved = 0
    vertical = False
    for src, dst in ((a, b), (b, a)):
        for buf in src.writes() & dst.reads():
            vertical = True
            nbytes = prog.hint(prog.buffers[buf].nbytes)
            others = readers.get(buf, set()) - {a.name, b.name}
            saved += nbytes if others or buf in outputs else 2 * nbytes
    for buf in (a.reads() & b.reads()) - a.writes() - b.writes():
        saved += prog.hint(prog.buffers[buf].nbytes)
    return saved, "vertical" if vertical else "horizontal"


def _related_pairs(groups: list[Group]) -> list[tuple[Group, Group]]:
    """Pairs of groups that touch a common buffer (one writes what the other reads, or both
    read it), in a deterministic order."""
    touching: dict[str, list[int]] = {}
    for k, g in enumerate(groups):
        for b in g.reads() | g.writes():
            touching.setdefault(b, []).append(k)
    pairs: set[tuple[int, int]] = set()
    for ks in touching.values():
        pairs.update(itertools.combinations(sorted(set(ks)), 2))
    return [(groups[i], groups[j]) for i, j in sorted(pairs)]


def fuse(state: FusionState) -> None:
    tried: set[tuple[str, str]] = set()
    outputs = state.program.output_buffers()
    for _ in range(config.max_fusion_rounds):
        pairs = []
        readers = _readers(state)
        for a, b in _related_pairs(state.groups):
            if a.writes() & b.writes():
                continue
            score, kind = fusion_score(state, a, b, readers, outputs)
            pairs.append((score, -min(a.order, b.order), a, b, kind))
        pairs.sort(key=lambda p: (-p[0], -p[1]))
        changed = False
        used: set[str] = set()
        graph = StepGraph(state)
        for score, _, a, b, kind in pairs:
            if a.name in used or b.name in used:
                continue
            key = (a.name, b.name)
            if score <= 0:
                if key not in tried:
                    tried.add(key)
                    state.decisions.append(Decision("keep apart", a.name, b.name, kind, "no memory traffic saved"))
                continue
            merged, reason = try_fuse(state, a, b, graph)
            late = epilogue_in_loop(merged) if merged is not None and state.split_reductions else None
            if late is not None:  # a GPU splits this reduction: its epilogue gets a kernel of its own
                merged, reason = None, late
                if recompute_for_epilogue(state, a, b):
                    used |= {a.name, b.name}
                    graph = StepGraph(state)
                    changed = True
            if merged is None:
                if key not in tried:
                    tried.add(key)
                    state.decisions.append(Decision("keep apart", a.name, b.name, kind, reason))
                continue
            state.decisions.append(Decision("fuse", a.name, b.name, kind, reason, score))
            state.groups = [g for g in state.groups if g is not a and g is not b] + [merged]
            used |= {a.name, b.name}
            graph.merge(a.name, b.name, merged.name)
            changed = True
        if not changed:
            return


# --------------------------------------------------------------------------- order and finish


def order_steps(state: FusionState) -> list[Group | ExternNode]:
    """Kernels and extern calls in a topological order: of the steps whose inputs are ready, the
    one earliest in the program first. A step waits for a buffer it reads until every one of its
    other writers ran (inputs of the program are ready from the start): a padded matmul operand
    is written by the kernel computing it and by the one writing zeros into its pad."""
    steps: list[Group | ExternNode] = list(state.groups) + list(state.externs)
    writes = [s.writes() if isinstance(s, Group) else set(s.write_buffers()) for s in steps]
    reads = [s.reads() if isinstance(s, Group) else set(s.read_buffers()) for s in steps]
    key = [s.order if isinstance(s, Group) else state.position[s.name] for s in steps]
    writers: dict[str, list[int]] = {}
    for k, ws in enumerate(writes):
        for b in ws:
            writers.setdefault(b, []).append(k)
    produced = set(state.program.inputs)
    _early_final_copies(steps, reads, writes, writers, key, produced)
    waiting: list[int] = []
    waiters: dict[str, list[int]] = {}
    ready: list[tuple[Any, int]] = []
    for k, rs in enumerate(reads):
        blocking = [b for b in rs - produced if any(w != k for w in writers.get(b, ()))]
        waiting.append(sum(sum(1 for w in writers[b] if w != k) for b in blocking))
        for b in blocking:
            waiters.setdefault(b, []).append(k)
        if not blocking:
            ready.append((key[k], k))
    heapq.heapify(ready)
    done: list[Any] = []
    while ready:
        _, k = heapq.heappop(ready)
        done.append(steps[k])
        for b in writes[k] - produced:
            for j in waiters.get(b, ()):
                if j == k:
                    continue
                waiting[j] -= 1
                if waiting[j] == 0:
                    heapq.heappush(ready, (key[j], j))
    if len(done) != len(steps):
        raise RuntimeError("cycle among fused kernels; the fusion legality check failed")
    return done


def _early_final_copies(steps: list[Any], reads: list[set[str]], writes: list[set[str]],
                        writers: dict[str, list[int]], key: list[Any], inputs: set[str]) -> None:
    """Moves up (in ``key``) each kernel that only reads buffers no other step reads and only
    writes buffers no step reads (a program output copied into eager's layout from a library
    result: a convolution's weight gradient): it runs right after the last of its writers, while
    what it reads is still in cache, and frees that at once. Placed where the lowering made it,
    at the end of the program, a training step's backward copied every weight gradient back
    from memory (timm's ResNet-50: 7 ms of a 160 ms step)."""
    readers: dict[str, int] = {}
    for rs in reads:
        for b in rs:
            readers[b] = readers.get(b, 0) + 1
    for k, step in enumerate(steps):
        if not isinstance(step, Group) or not reads[k] or any(readers.get(b, 0) for b in writes[k]):
            continue
        if any(b in inputs or b in writes[k] or readers[b] != 1 or not writers.get(b) for b in reads[k]):
            continue
        key[k] = max(key[w] for b in reads[k] for w in writers[b]) + 0.5


def finish_kernel(name: str, group: Group, program: LoopProgram, readers_outside: set[str]) -> Kernel:
    nodes: list[KernelNode] = []
    stage_of: dict[str, int] = {}
    writer_of: dict[str, KernelNode] = {}
    # (buffer names only: a node's accesses in kernel variables would rewrite every index)
    read_names: dict[int, set[str]] = {}
    for n in group.nodes:
        kn = KernelNode(n, group.var_maps[n.name])
        stage = 0
        read_names[id(kn)] = set(n.read_buffers())
        for buf in read_names[id(kn)]:
            w = writer_of.get(buf)
            if w is not None:
                stage = max(stage, w.stage + (1 if w.node.kind == "reduction" else 0))
        kn.stage = stage
        nodes.append(kn)
        for buf, _, _ in n.body.writes():
            writer_of[buf] = kn
            stage_of[buf] = stage
    rvars = {exprs.symbol(f"r{k}") for k in range(len(group.rsizes))}
    internal = set()
    outputs = program.output_buffers()
    writers: dict[str, int] = {}
    for kn in nodes:
        for b, _, _ in kn.node.body.writes():
            writers[b] = writers.get(b, 0) + 1
    for buf, w in writer_of.items():
        if buf in outputs or buf in readers_outside:
            continue
        write_index = next(i for b, i, _ in w.writes() if b == buf)
        crosses = any(buf in read_names[id(kn)] and kn.stage > w.stage for kn in nodes)
        if crosses and write_index.free_symbols & rvars and not _recomputable(buf, w, write_index, nodes, writers):
            continue  # needed by a later loop over r: stays in memory
        internal.add(buf)
    return Kernel(name, nodes, list(group.xsizes), list(group.rsizes), internal)


RECOMPUTE_MAX_OPS = 24  # longest pointwise body recomputed in later loops rather than stored


def _recomputable(buf: str, writer: KernelNode, index: sympy.Expr, nodes: list[KernelNode],
                  writers: dict[str, int]) -> bool:
    """Whether a buffer read by later loops over ``r`` (softmax's scaled input, read by the max,
    the sum and the normalisation) can stay out of memory, each loop computing it again: its one
    writer is a short pointwise body and every read is at the written point, so the value a later
    loop needs is the one its own iteration recomputes. A code generator places the writer's
    computation again in each loop that reads it (a one-block reduction keeps it in registers);
    against a round trip through memory it saves a store and the loads."""
    if writers.get(buf) != 1 or writer.node.kind != "pointwise" or len(writer.node.body.ops) > RECOMPUTE_MAX_OPS:
        return False
    sources = {b for b, _, _ in writer.reads()}
    after = False
    for kn in nodes:
        if kn is writer:
            after = True
            continue
        for b, i, _ in kn.reads():
            if b == buf and (not after or not exprs.equal(i, index)):  # (a view's split dims: equal)
                return False
        if after and any(b in sources for b, _, _ in kn.writes()):
            return False  # what it is computed from changes before a later loop would recompute it
    return True


def finish_kernels(program: LoopProgram, steps: list[Group | ExternNode]) -> list[Kernel | ExternNode]:
    """Each group as a :class:`Kernel` (stages, internal buffers, merged loops); extern calls
    as they are."""
    read_by = {id(s): (s.reads() if isinstance(s, Group) else set(s.read_buffers())) for s in steps}
    readers: dict[str, int] = {}
    for s in steps:
        for b in read_by[id(s)]:
            readers[b] = readers.get(b, 0) + 1
    out: list[Kernel | ExternNode] = []
    count = 0
    for s in steps:
        if isinstance(s, Group):
            # what another step reads, of the buffers this one writes (all finish_kernel asks)
            own = read_by[id(s)]
            outside = {b for b in s.writes() if readers.get(b, 0) > (b in own)}
            kernel = finish_kernel(f"kernel{count}", s, program, outside)
            count += 1
            out.append(merge_kernel_loops(kernel) if config.merge_loops else kernel)
        else:
            out.append(s)
    return out


def splits_reductions(program: LoopProgram) -> bool:
    """Whether ``program`` runs on a device type of ``config.split_reductions``."""
    devices = {b.device.split(":")[0] for b in program.buffers.values()}
    return bool(devices & set(config.split_reductions))


def schedule(program: LoopProgram, *, fusion: bool | None = None, split_reductions: bool | None = None) -> Any:
    """Inline, fuse, order, plan memory and verify a lowered program (``fusion`` defaults to
    ``config.fusion``; without fusion every node is a kernel of its own). ``split_reductions``
    keeps reductions with few outputs splittable over a GPU's programs
    (:mod:`fireclay_loops.long_reductions`); None: when the program's device type is in
    ``config.split_reductions``."""
    from fireclay_loops.backend.program import ScheduledProgram
    from fireclay_loops.index_values import fold_index_values
    from fireclay_loops.inline import inline_pointwise
    from fireclay_loops.long_reductions import split_scalar_reductions
    from fireclay_loops.memory import plan_memory
    from fireclay_loops.verify import verify_schedule

    fusing = config.fusion if fusion is None else fusion
    splitting = fusing and (splits_reductions(program) if split_reductions is None else split_reductions)
    decisions: list[Decision] = []
    if splitting:
        program = split_scalar_reductions(program, decisions)  # partials a row kernel takes
    if fusing:
        program = inline_pointwise(program, decisions)     # recompute cheap producers
    program = fold_index_values(program)                   # indices of loop variables alone
    state = initial_groups(program)                         # one candidate kernel per node
    state.decisions = decisions
    state.split_reductions = splitting
    if fusing:
        fuse(state)                                         # vertical and horizontal fusion
    steps = finish_kernels(program, order_steps(state))     # topological order, kernels
    plan = plan_memory(program, steps)                      # lifetimes and reuse
    scheduled = ScheduledProgram(program, steps, plan, state.decisions)
    if config.verify:
        verify_schedule(scheduled)                          # the schedule's invariants
    return scheduled
