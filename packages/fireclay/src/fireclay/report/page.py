"""The report as one self-contained HTML page: inline CSS, inline SVG, one small inline script
(table of contents, edge highlighting). Nothing is fetched: no external URL appears in it."""

from __future__ import annotations

from html import escape

from fireclay.report.events import CompileEvents
from fireclay.report.svg import COLLAPSE_OVER, drawn_boxes, graph_svg
from fireclay_ir import format_program

SECTIONS = [
    ("times", "Time per stage"),
    ("timeline", "Timeline"),
    ("graphs", "Graphs"),
    ("graph-breaks", "Graph breaks"),
    ("guards", "Guards"),
    ("recompiles", "Recompiles"),
    ("kernels", "Kernels"),
    ("schedules", "Schedules"),
    ("notes", "Notes"),
]

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:0 16px;color:#1d1d1f}
h1{font-size:22px}h2{border-bottom:1px solid #ccc;padding-bottom:3px;margin-top:32px}
pre{background:#f5f5f7;padding:8px;overflow:auto;font-size:12px}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
.bar{background:#e8743b;height:10px}.not-recorded{color:#8a5a00;background:#fff6df;padding:6px 10px}
.svgwrap{overflow:auto;border:1px solid #eee;max-height:720px}
svg.graph .edge{fill:none;stroke:#9aa0a6;stroke-width:1.3}
svg.graph .edge.order{stroke-dasharray:4 3}
svg.graph .edge.lit{stroke:#e8743b;stroke-width:2.5}
svg.graph rect{fill:#fff;stroke:#5f6368}svg.graph .input rect{fill:#e3f2fd}
svg.graph .output rect{fill:#e8f5e9}svg.graph .collapsed rect{fill:#f3e5f5;stroke-dasharray:5 2}svg.graph .lit rect{stroke:#e8743b;stroke-width:2}
svg.graph text{font:12px monospace}svg.graph .ty{fill:#5f6368}
nav#toc a{margin-right:12px}
"""

# Builds the table of contents from the h2 headings, lights up a node's edges on hover, and
# marks the page as ready (the headless-browser test reads these back from the DOM).
_SCRIPT = """
(function(){
  var toc=document.getElementById('toc');
  document.querySelectorAll('h2[id]').forEach(function(h){
    var a=document.createElement('a');a.href='#'+h.id;a.textContent=h.textContent;toc.appendChild(a);
  });
  var drawn=0;
  document.querySelectorAll('svg.graph').forEach(function(svg){
    drawn+=svg.querySelectorAll('g.node').length;
    svg.querySelectorAll('g.node').forEach(function(g){
      var i=g.getAttribute('data-index');
      function light(on){
        g.classList.toggle('lit',on);
        svg.querySelectorAll('.edge[data-from="'+i+'"],.edge[data-to="'+i+'"]').forEach(function(e){
          e.classList.toggle('lit',on);});
      }
      g.addEventListener('mouseenter',function(){light(true);});
      g.addEventListener('mouseleave',function(){light(false);});
    });
  });
  document.getElementById('drawn-count').textContent=drawn+' boxes drawn';
  document.body.setAttribute('data-ready','yes');
})();
"""


def _not_recorded(events: CompileEvents, section: str) -> str:
    why = events.not_recorded.get(section.replace("-", "_"))
    return f'<p class="not-recorded">Not recorded by this version: {escape(why)}</p>' if why else ""


def _pre(text: str) -> str:
    return f"<pre>{escape(text)}</pre>"


def _times(events: CompileEvents) -> str:
    if not events.stage_times:
        return _not_recorded(events, "stage_times") or "<p>No stage ran.</p>"
    total = {stage: seconds for stage, (seconds, _) in stage_totals(events).items()}
    longest = max(total.values()) or 1.0
    rows = "".join(f'<tr><td>{escape(s)}</td><td>{sec * 1e3:.1f} ms</td>'
                   f'<td style="width:320px"><div class="bar" style="width:{100 * sec / longest:.1f}%"></div></td></tr>'
                   for s, sec in total.items())
    detail = "".join(f"<tr><td>{escape(t.stage)}</td><td>{t.seconds * 1e3:.1f} ms</td><td>{escape(t.note)}</td></tr>"
                     for t in events.stage_times)
    notes = "".join(f"<p>{escape(n)}</p>" for n in events.time_notes) + _not_recorded(events, "capture_time")
    return (f"<table><tr><th>stage</th><th>total</th><th></th></tr>{rows}</table>{notes}"
            f"<details><summary>each step</summary><table>{detail}</table></details>{_cache(events)}")


def stage_totals(events: CompileEvents) -> dict[str, tuple[float, int]]:
    """stage -> (seconds, number of steps), in the order the stages first ran."""
    totals: dict[str, tuple[float, int]] = {}
    for t in events.stage_times:
        seconds, count = totals.get(t.stage, (0.0, 0))
        totals[t.stage] = (seconds + t.seconds, count + 1)
    return totals


def _cache(events: CompileEvents) -> str:
    if not events.cache:
        return ""
    rows = "".join(f'<tr class="cache-stage" data-stage="{escape(stage)}"><td>{escape(stage)}</td>'
                   f"<td>{c.get('hits', 0)}</td><td>{c.get('misses', 0)}</td><td>{c.get('stored', 0)}</td>"
                   f"<td>{c.get('corrupt', 0)}</td><td>{c.get('load_seconds', 0) * 1e3:.1f} ms</td>"
                   f"<td>{c.get('build_seconds', 0) * 1e3:.1f} ms</td></tr>"
                   for stage, c in events.cache.items())
    return ("<h3>Compile cache</h3><p>Artifacts reused from earlier processes (config.shared.cache_dir): a hit skips "
            "the stage.</p><table><tr><th>stage</th><th>hits</th><th>misses</th><th>stored</th><th>corrupt, "
            f"rebuilt</th><th>loading hits</th><th>building misses</th></tr>{rows}</table>")


def summary(events: CompileEvents) -> str:
    """A few lines for a terminal: time per stage (capture included) and the compile cache."""
    lines = ["Time per stage:"]
    for stage, (seconds, count) in stage_totals(events).items():
        lines.append(f"  {stage:<22} {seconds * 1e3:9.1f} ms  ({count} step{'s' if count != 1 else ''})")
    if len(lines) == 1:
        lines.append("  (no stage ran)")
    if events.cache:
        parts = [f"{stage} {c.get('hits', 0)} hit(s), {c.get('misses', 0)} miss(es)"
                 + (f", {c['corrupt']} corrupt entr(ies) rebuilt" if c.get("corrupt") else "")
                 for stage, c in events.cache.items()]
        lines.append("Compile cache: " + "; ".join(parts))
    return "\n".join(lines)


def _timeline(events: CompileEvents) -> str:
    if not events.timeline:
        return _not_recorded(events, "stage_times") or "<p>No stage ran.</p>"
    rows = "".join(f'<tr><td>{t.at:.3f} s</td><td>{escape(t.stage)}</td><td>{escape(t.label)}</td>'
                   f"<td>{t.seconds * 1e3:.1f} ms</td><td>{t.span * 1e3:.1f} ms</td></tr>"
                   for t in sorted(events.timeline, key=lambda t: t.at))
    return ("<p>Every stage of the run in the order it started (seconds from the start of the recording): its "
            "own time, and its span with the stages nested in it.</p><table><tr><th>start</th><th>stage</th>"
            f"<th>graph</th><th>own</th><th>span</th></tr>{rows}</table>")


def _graphs(events: CompileEvents) -> str:
    if not events.graphs:
        return _not_recorded(events, "graphs") or "<p>No graph was captured.</p>"
    texts: dict[int, str] = {}
    out = ['<p id="drawn-count"></p>']
    for i, entry in enumerate(events.graphs):
        key = id(entry.program)
        if key not in texts:
            texts[key] = format_program(entry.program)
        graph = entry.drawn
        boxes = drawn_boxes(graph, entry.modules)
        layers = [b for b in boxes if b.kind == "collapsed"]
        note = ""
        if layers:
            note = (f' <span class="collapsed-note" data-collapsed="{len(layers)}">(more than {COLLAPSE_OVER} nodes: '
                    f"{len(layers)} repeated layers drawn as one box each, "
                    f"{sum(b.members for b in layers)} nodes in them; the text form has every node)</span>")
        out.append(f'<section class="graph-entry" data-stage="{escape(entry.stage)}"><h3>{escape(entry.title)}</h3>'
                   f"<p>{len(graph.nodes)} nodes, stage {escape(entry.stage)}{note}</p>"
                   f'<div class="svgwrap">{graph_svg(graph, f"graph-{i}", boxes)}</div>'
                   f"<details><summary>text form</summary>{_pre(texts[key])}</details></section>")
    return "".join(out)


def _breaks(events: CompileEvents) -> str:
    head = _not_recorded(events, "graph_breaks")
    if not events.graph_breaks:
        return head or "<p>None: every frame was captured.</p>"
    rows = "".join(f"<tr><td>{escape(b.function)}</td><td>{escape(f'{b.file}:{b.line}' if b.file else '?')}</td>"
                   f"<td><code>{escape(b.source_line or '')}</code></td><td>{_pre(b.reason)}</td></tr>"
                   for b in events.graph_breaks)
    return head + f"<table><tr><th>function</th><th>where</th><th>source line</th><th>reason</th></tr>{rows}</table>"


def _guards(events: CompileEvents) -> str:
    if not events.guards:
        return _not_recorded(events, "guards") or "<p>No guards.</p>"
    return "".join(f"<h3>{escape(g.function)}, cache entry {g.entry}</h3>{_pre(g.text)}" for g in events.guards)


def _recompiles(events: CompileEvents) -> str:
    head = _not_recorded(events, "recompiles")
    if not events.recompiles:
        return head or "<p>None.</p>"
    rows = "".join(f"<tr><td>{escape(r.function)}</td><td>{r.entry}</td><td>{escape(r.reason)}</td></tr>"
                   for r in events.recompiles)
    return head + f"<table><tr><th>function</th><th>entry</th><th>reason</th></tr>{rows}</table>"


def _kernels(events: CompileEvents) -> str:
    if not events.kernels:
        return _not_recorded(events, "kernels") or "<p>No kernel was generated.</p>"
    return "".join(f'<details class="kernel"><summary>{escape(k.graph)}: <code>{escape(k.name)}</code> '
                   f"({escape(k.language)}, {k.source.count(chr(10)) + 1} lines)</summary>{_pre(k.source)}</details>"
                   for k in events.kernels)


def _schedules(events: CompileEvents) -> str:
    if not events.schedules:
        return _not_recorded(events, "schedules") or "<p>No loop schedule was made.</p>"
    return "".join(f"<h3>{escape(title)}</h3>{_pre(text)}" for title, text in events.schedules)


def _notes(events: CompileEvents) -> str:
    return "".join(f"<p>{escape(n)}</p>" for n in events.notes) or "<p>None.</p>"


_RENDER = {"times": _times, "timeline": _timeline, "graphs": _graphs, "graph-breaks": _breaks, "guards": _guards,
           "recompiles": _recompiles, "kernels": _kernels, "schedules": _schedules, "notes": _notes}


def render(events: CompileEvents) -> str:
    """The whole page as a string."""
    body = "".join(f'<h2 id="{sid}">{escape(title)}</h2>{_RENDER[sid](events)}' for sid, title in SECTIONS)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(events.title)}</title>'
            f"<style>{_CSS}</style></head><body><h1>{escape(events.title)}</h1><nav id=\"toc\"></nav>"
            f"{body}<script>{_SCRIPT}</script></body></html>\n")
