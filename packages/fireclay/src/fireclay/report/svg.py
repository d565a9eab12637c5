"""A graph drawn as inline SVG: a layered (Sugiyama-style) layout done here, no external tools.

Layers are longest paths from the inputs, so every edge points down; the order inside a layer
comes from a few barycenter sweeps, which removes most crossings on the chain-and-diamond
shapes compiler graphs have. Boxes show the op and the output type; hovering shows the user's
source line (an SVG ``<title>``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

from fireclay_ir import Graph, TensorMeta, iter_values

CHAR_W = 7.0  # px per character of the 12px monospace label
BOX_H = 38.0
LAYER_GAP = 34.0
BOX_GAP = 18.0
MARGIN = 12.0
SWEEPS = 4


@dataclass
class Box:
    key: str
    title: str  # first line: the op or the input name
    subtitle: str  # second line: the value's type
    kind: str  # "input", "op" or "output"
    hover: str = ""
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


def boxes_of(graph: Graph) -> list[Box]:
    """One box per graph input, per node and one for the outputs, with their predecessors."""
    boxes: list[Box] = []
    index: dict[int, int] = {}  # id(Value) -> box producing it
    last_effect: int | None = None
    for v in graph.inputs:
        index[id(v)] = len(boxes)
        boxes.append(Box(f"in:{v.name}", v.name, type_text(v.type), "input", hover=f"input %{v.name}"))
    for node in graph.nodes:
        me = len(boxes)
        outs = ", ".join(type_text(o.type) for o in node.outputs) or "()"
        src = node.source or {}
        hover = node.op
        if src.get("file") or src.get("code"):
            hover += f"\n{src.get('file', '?')}:{src.get('line', '?')}: {src.get('code', '')}".rstrip()
        title = node.target
        if isinstance(node.kwargs.get("name"), str):  # loops kernels and extern calls are named
            title += f" {node.kwargs['name']}"
        box = Box(f"node:{me}", title, outs, "op", hover=hover)
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
    return boxes


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


def graph_svg(graph: Graph, dom_id: str) -> str:
    """The graph as one ``<svg>`` element (no external references)."""
    boxes = boxes_of(graph)
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
        parts.append(f'<g class="node {b.kind}" data-index="{i}" transform="translate({b.x:.1f},{b.y:.1f})">'
                     f"<title>{escape(b.hover)}</title>"
                     f'<rect width="{b.width:.1f}" height="{BOX_H:.0f}" rx="5"/>'
                     f'<text x="8" y="15" class="op">{escape(b.title)}</text>'
                     f'<text x="8" y="30" class="ty">{escape(b.subtitle)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)
