"""A graph drawn as inline SVG: a layered (Sugiyama-style) layout done here, no external tools.

Layers are longest paths from the inputs, so every edge points down; the order inside a layer
comes from a few barycenter sweeps, which removes most crossings on the chain-and-diamond
shapes compiler graphs have. Boxes show the op and the output type; hovering shows the user's
source line (an SVG ``<title>``).

A graph of more than ``COLLAPSE_OVER`` nodes draws its repeated layers collapsed: nodes made
inside the modules ``<container>.<i>`` (``encoder.layer.3``, ``layers.0``; the ``module`` every
node keeps from capture) of a container with several such modules are drawn once for the first
of them, and each other one becomes a single box (class ``collapsed``) naming its node count and
whether its ops are the first one's.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from html import escape

from fireclay_ir import Graph, TensorMeta, iter_values

CHAR_W = 7.0  # px per character of the 12px monospace label
BOX_H = 38.0
LAYER_GAP = 34.0
BOX_GAP = 18.0
MARGIN = 12.0
SWEEPS = 4
COLLAPSE_OVER = 60  # nodes; a graph this large or smaller is drawn whole


@dataclass
class Box:
    key: str
    title: str  # first line: the op or the input name
    subtitle: str  # second line: the value's type
    kind: str  # "input", "op", "output" or "collapsed" (one box for a repeated layer's nodes)
    hover: str = ""
    module: str | None = None  # the module the node was made in (its meta), if known
    members: int = 1  # nodes drawn by this box
    preds: list[int] = field(default_factory=list)
    after: int | None = None  # the previous effect-only node: runs before this one
    layer: int = 0
    x: float = 0.0
    y: float = 0.0
    width: float = 0.0


def type_text(t) -> str:
    if isinstance(t, TensorMeta):
        return f"{t.dtype}[{', '.join(str(d) for d in t.shape)}]"
    return getattr(t, "kind", str(t))


def boxes_of(graph: Graph, modules: dict[int, str] | None = None) -> list[Box]:
    """One box per graph input, per node and one for the outputs, with their predecessors.
    ``modules`` gives the module of nodes (by position) whose meta names none; a node with no
    module takes its first user's, else its inputs' (buffers and views of a loops program)."""
    modules = modules or {}
    boxes: list[Box] = []
    index: dict[int, int] = {}  # id(Value) -> box producing it
    last_effect: int | None = None
    for v in graph.inputs:
        index[id(v)] = len(boxes)
        boxes.append(Box(f"in:{v.name}", v.name, type_text(v.type), "input", hover=f"input %{v.name}"))
    outputs = {id(v) for v in iter_values(graph.outputs)}
    for position, node in enumerate(graph.nodes):
        if node.op == "loops::buffer" and not any(o.users or id(o) in outputs for o in node.outputs):
            continue  # a buffer fusion kept inside a kernel: nothing reads it (the text form lists it)
        me = len(boxes)
        outs = ", ".join(type_text(o.type) for o in node.outputs) or "()"
        src = node.source or {}
        hover = node.op
        if src.get("file") or src.get("code"):
            hover += f"\n{src.get('file', '?')}:{src.get('line', '?')}: {src.get('code', '')}".rstrip()
        title = node.target
        if isinstance(node.kwargs.get("name"), str):  # loops kernels and extern calls are named
            title += f" {node.kwargs['name']}"
        module = node.meta.get("module")
        module = module if isinstance(module, str) else modules.get(position)
        box = Box(f"node:{me}", title, outs, "op", hover=hover, module=module)
        box.preds = sorted({index[id(v)] for v in node.inputs() if id(v) in index})
        for o in node.outputs:
            index[id(o)] = me
        if not node.outputs:
            # Effect-only nodes (loops kernels writing buffers) are ordered by the program,
            # not by values: draw that order as a dashed edge and lay them out along it.
            if last_effect is not None and last_effect not in box.preds:
                box.after = last_effect
            last_effect = me
        boxes.append(box)
    out = Box("output", "output", f"{len(graph.outputs)} value(s)", "output", hover="graph outputs")
    out.preds = sorted({index[id(v)] for v in iter_values(graph.outputs) if id(v) in index})
    boxes.append(out)
    _fill_modules(boxes)
    return boxes


def _fill_modules(boxes: list[Box]) -> None:
    """Nodes without a module take their first user's, then their inputs'."""
    users: dict[int, list[int]] = {}
    for i, b in enumerate(boxes):
        for p in b.preds:
            users.setdefault(p, []).append(i)
    for i in range(len(boxes) - 1, -1, -1):
        b = boxes[i]
        if b.kind == "op" and b.module is None:
            b.module = next((boxes[u].module for u in users.get(i, []) if boxes[u].module), None)
    for b in boxes:
        if b.kind == "op" and b.module is None:
            b.module = next((boxes[p].module for p in b.preds if boxes[p].module), None)


# The outermost indexed part of a module path: "encoder.layer.3.attention" -> ("encoder.layer", 3).
_INDEXED = re.compile(r"^(?:(?P<container>.*?)\.)?(?P<index>\d+)(?:\.|$)")


def _layer_of(box: Box) -> tuple[str, int] | None:
    if box.kind != "op" or box.module is None:
        return None
    m = _INDEXED.match(box.module)
    return (m["container"] or "", int(m["index"])) if m else None


def collapse_layers(boxes: list[Box]) -> list[Box]:
    """``boxes`` with each repeated layer but the first of its container drawn as one box (see
    the module docstring); a layer whose collapse would make a cycle (its nodes interleave with
    others') stays whole. Returns new boxes in topological order."""
    layers = {i: _layer_of(b) for i, b in enumerate(boxes)}
    # An input read only inside one layer (its weights) is drawn with that layer.
    readers: dict[int, set] = {}
    for i, b in enumerate(boxes):
        if b.kind == "output":  # weights a forward hands to its backward are outputs too
            continue
        for p in b.preds:
            readers.setdefault(p, set()).add(layers[i])
    for i, b in enumerate(boxes):
        only = readers.get(i, set())
        if b.kind == "input" and len(only) == 1 and None not in only:
            layers[i] = next(iter(only))
    indexes: dict[str, set[int]] = {}
    for key in layers.values():
        if key is not None:
            indexes.setdefault(key[0], set()).add(key[1])
    first = {c: min(ix) for c, ix in indexes.items() if len(ix) > 1}
    collapsed = {key for key in layers.values() if key is not None and key[0] in first and key[1] != first[key[0]]}
    while True:
        order, unit_of = _condensed_order(boxes, layers, collapsed)
        if order is not None:
            return _collapsed_boxes(boxes, layers, collapsed, order, first)
        collapsed = collapsed - set(unit_of.values())  # the layers caught in cycles stay whole
        if not collapsed:
            return boxes


def _condensed_order(boxes: list[Box], layers: dict, collapsed: set) -> tuple[list | None, dict]:
    """A topological order of the units (a box, or one collapsed layer), or None and, in the
    second item, the collapsed layers left in a cycle."""
    def unit(i: int) -> object:
        key = layers[i]
        return key if key in collapsed else i

    units: dict[object, None] = {}
    preds: dict[object, set] = {}
    for i, b in enumerate(boxes):
        u = unit(i)
        units.setdefault(u)
        before = b.preds + ([b.after] if b.after is not None else [])
        preds.setdefault(u, set()).update(unit(p) for p in before if unit(p) != u)
    position = {u: k for k, u in enumerate(units)}
    waiting = {u: len(ps) for u, ps in preds.items()}
    succs: dict[object, list] = {u: [] for u in units}
    for u, ps in preds.items():
        for p in ps:
            succs[p].append(u)
    ready = sorted((u for u, n in waiting.items() if n == 0), key=position.__getitem__)
    order = []
    while ready:
        u = ready.pop(0)
        order.append(u)
        for v in succs[u]:
            waiting[v] -= 1
            if waiting[v] == 0:
                ready.append(v)
        ready.sort(key=position.__getitem__)
    if len(order) == len(units):
        return order, {}
    stuck = {u: u for u, n in waiting.items() if n > 0 and isinstance(u, tuple)}
    return None, stuck


def _collapsed_boxes(boxes: list[Box], layers: dict, collapsed: set, order: list,
                     first: dict[str, int]) -> list[Box]:
    def unit(i: int) -> object:
        return layers[i] if layers[i] in collapsed else i

    def ops_of(key: tuple[str, int]) -> list[str]:
        return [boxes[i].title for i, k in layers.items() if k == key and boxes[i].kind != "input"]

    def name_of(key: tuple[str, int]) -> str:
        return f"{key[0]}.{key[1]}" if key[0] else str(key[1])

    members: dict[object, list[int]] = {}
    for i in range(len(boxes)):
        members.setdefault(unit(i), []).append(i)
    new_index = {u: k for k, u in enumerate(order)}
    out: list[Box] = []
    for u in order:
        ix = members[u]
        if isinstance(u, tuple):
            nodes = sum(1 for i in ix if boxes[i].kind != "input")
            ops, model = ops_of(u), (u[0], first[u[0]])
            same = ops == ops_of(model)
            tail = f", as {name_of(model)}" if same else ""
            hover = (f"{name_of(u)}: {nodes} nodes drawn as one box{tail.replace(', as', '; the same ops as')}\n"
                     + "\n".join(f"{n} × {op}" for op, n in Counter(ops).most_common(6)))
            box = Box(f"layer:{name_of(u)}", name_of(u), f"{nodes} nodes{tail}", "collapsed", hover=hover,
                      module=name_of(u), members=nodes)
        else:
            b = boxes[u]
            box = Box(b.key, b.title, b.subtitle, b.kind, hover=b.hover, module=b.module)
        preds: set[int] = set()
        afters: set[int] = set()
        for i in ix:
            preds.update(new_index[unit(p)] for p in boxes[i].preds if unit(p) != u)
            after = boxes[i].after
            if after is not None and unit(after) != u:
                afters.add(new_index[unit(after)])
        box.preds = sorted(preds)
        afters -= preds
        box.after = max(afters) if afters else None
        out.append(box)
    return out


def layout(boxes: list[Box]) -> tuple[float, float]:
    """Assign layers and coordinates in place; returns the drawing's (width, height)."""
    for b in boxes:  # boxes are in topological order
        before = b.preds + ([b.after] if b.after is not None else [])
        b.layer = max((boxes[p].layer + 1 for p in before), default=0)
        b.width = max(len(b.title), len(b.subtitle)) * CHAR_W + 16
    # The outputs go last even when they read values made early (loops buffers, inputs).
    for b in boxes:
        if b.kind == "output":
            b.layer = max((o.layer + 1 for o in boxes if o.kind != "output"), default=0)
    # Every box then moves down to just above its first reader: inputs, loops buffers and their
    # views sit where they are used, not in top rows as wide as all of them.
    readers: dict[int, list[int]] = {}
    for i, b in enumerate(boxes):
        for p in b.preds + ([b.after] if b.after is not None else []):
            readers.setdefault(p, []).append(i)
    for i in range(len(boxes) - 1, -1, -1):
        b = boxes[i]
        if readers.get(i) and b.kind != "output":
            b.layer = max(b.layer, min(boxes[r].layer for r in readers[i]) - 1)
    depth = max((b.layer for b in boxes), default=0) + 1
    layers: list[list[int]] = [[] for _ in range(depth)]
    for i, b in enumerate(boxes):
        layers[b.layer].append(i)
    succs: dict[int, list[int]] = {i: [] for i in range(len(boxes))}
    for i, b in enumerate(boxes):
        for p in b.preds:
            succs[p].append(i)
    position = {i: float(k) for layer in layers for k, i in enumerate(layer)}
    for sweep in range(SWEEPS):
        down = sweep % 2 == 0
        order = layers[1:] if down else list(reversed(layers[:-1]))
        for layer in order:
            layer.sort(key=lambda i, down=down: _barycenter(i, boxes[i].preds if down else succs[i], position))
            for k, i in enumerate(layer):
                position[i] = float(k)
    widths = [sum(boxes[i].width for i in layer) + BOX_GAP * (len(layer) - 1) for layer in layers]
    total_w = max(widths, default=0.0) + 2 * MARGIN
    for li, layer in enumerate(layers):
        x = (total_w - widths[li]) / 2
        for i in layer:
            boxes[i].x, boxes[i].y = x, MARGIN + li * (BOX_H + LAYER_GAP)
            x += boxes[i].width + BOX_GAP
    return total_w, MARGIN * 2 + depth * BOX_H + (depth - 1) * LAYER_GAP


def _barycenter(i: int, near: list[int], position: dict[int, float]) -> float:
    return sum(position[j] for j in near) / len(near) if near else position[i]


def drawn_boxes(graph: Graph, modules: dict[int, str] | None = None) -> list[Box]:
    """The boxes drawn for ``graph``: one per input, node and the outputs, with repeated layers
    collapsed when the graph has more than COLLAPSE_OVER nodes (``modules``: see boxes_of)."""
    boxes = boxes_of(graph, modules)
    return collapse_layers(boxes) if len(graph.nodes) > COLLAPSE_OVER else boxes


def graph_svg(graph: Graph, dom_id: str, boxes: list[Box] | None = None) -> str:
    """The graph as one ``<svg>`` element (no external references)."""
    boxes = drawn_boxes(graph) if boxes is None else boxes
    width, height = layout(boxes)
    parts = [f'<svg class="graph" id="{escape(dom_id)}" '
             f'width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
             f'role="img" aria-label="graph {escape(graph.name)}">']
    for i, b in enumerate(boxes):
        edges = [(p, "edge") for p in b.preds] + ([(b.after, "edge order")] if b.after is not None else [])
        for p, cls in edges:
            a = boxes[p]
            x1, y1 = a.x + a.width / 2, a.y + BOX_H
            x2, y2 = b.x + b.width / 2, b.y
            mid = (y1 + y2) / 2
            parts.append(f'<path class="{cls}" data-from="{p}" data-to="{i}" '
                         f'd="M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2:.1f}"/>')
    for i, b in enumerate(boxes):
        extra = f' data-layer="{escape(b.title)}" data-members="{b.members}"' if b.kind == "collapsed" else ""
        parts.append(f'<g class="node {b.kind}" data-index="{i}"{extra} transform="translate({b.x:.1f},{b.y:.1f})">'
                     f"<title>{escape(b.hover)}</title>"
                     f'<rect width="{b.width:.1f}" height="{BOX_H:.0f}" rx="5"/>'
                     f'<text x="8" y="15" class="op">{escape(b.title)}</text>'
                     f'<text x="8" y="30" class="ty">{escape(b.subtitle)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)
