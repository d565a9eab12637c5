"""The HTML compile report: structure, drawn graphs, recorded events, and the SVG layout."""

import re
from html.parser import HTMLParser

import pytest
import torch

import fireclay
import fireclay_ir as ir
from fireclay.cli import main
from fireclay.report import CompileEvents, Recorder, recording, write_report
from fireclay.report.collect import _capture_splits_frames
from fireclay.report.svg import BOX_H, boxes_of, layout
from fireclay_capture import capture

VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "area", "base", "source", "track"}
# Elements inside <svg> that are legitimately self-closed (<path .../>, <rect .../>).
SVG_EMPTY = {"path", "rect", "line", "circle"}


class StrictStructure(HTMLParser):
    """Collects tags and checks that every element is closed in order."""

    def __init__(self):
        super().__init__()
        self.stack, self.tags, self.problems, self.text = [], [], [], []
        self.attrs = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.append((tag, dict(attrs)))
        if tag not in SVG_EMPTY and tag not in VOID:
            self.problems.append(f"self-closed <{tag}/>")

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(html_text):
    parser = StrictStructure()
    parser.feed(html_text)
    parser.close()
    assert parser.problems == [] and parser.stack == [], (parser.problems, parser.stack)
    return parser


def assert_self_contained(html_text):
    assert not re.search(r"https?://|//cdn|<link\b|\bsrc=|@import|url\(", html_text)


def keeping(programs):
    """A capture backend that keeps each program and runs it in the reference interpreter."""

    def backend(program, example_inputs):
        programs.append(program)
        return lambda *args: ir.interpret(program, *args)

    return backend


def mlp(x, w):
    return torch.relu(x @ w + 1.0).sum(dim=1)


def with_print(x):
    print("not capturable")
    return x.sin()


def scaled(x):
    return torch.tanh(x) * x.shape[0]


@pytest.fixture(scope="module")
def recorded_report(tmp_path_factory):
    """One recorded session: a compile by the fireclay backend, a frame that runs eagerly, a
    recompile, a module."""
    with recording() as rec:
        f = fireclay.compile(mlp)
        x, w = torch.randn(3, 4), torch.randn(4, 5)
        torch.testing.assert_close(f(x, w), mlp(x, w))
        g = fireclay.compile(with_print, backend="eager")
        g(torch.randn(3))
        h = fireclay.compile(scaled, backend="eager")
        for n in (2, 5):
            a = torch.randn(n, 3)
            torch.testing.assert_close(h(a), scaled(a))
        lin = torch.nn.Linear(4, 2)
        m = fireclay.compile(lin)
        b = torch.randn(3, 4)
        torch.testing.assert_close(m(b), lin(b))
    path = tmp_path_factory.mktemp("report") / "report.html"
    write_report(rec, path)
    return path.read_text(), rec.events()


def test_report_is_valid_self_contained_html(recorded_report):
    text, _ = recorded_report
    assert text.startswith("<!DOCTYPE html>")
    parsed = parse(text)
    assert_self_contained(text)
    for section in ("times", "graphs", "graph-breaks", "guards", "recompiles", "kernels"):
        assert ("h2", {"id": section}) in [(t, {k: v for k, v in a.items() if k == "id"}) for t, a in parsed.attrs]
    assert parsed.tags.count("script") == 1


def test_report_draws_every_graph_with_its_ops(recorded_report):
    text, events = recorded_report
    parsed = parse(text)
    svgs = [a for t, a in parsed.attrs if t == "svg"]
    assert len(svgs) == len(events.graphs) >= 4
    body = "".join(parsed.text)
    for op in ("matmul", "relu", "mm.default", "relu.default", "tanh", "addmm.default", "linear"):
        assert op in body, op
    # Source lines of the user's code appear in the graphs' text form.
    assert "return torch.relu(x @ w + 1.0).sum(dim=1)" in body


def test_report_records_breaks_guards_recompiles_and_kernels(recorded_report):
    text, events = recorded_report
    [brk] = events.graph_breaks
    assert brk.function == "with_print" and brk.file.endswith("test_report.py")
    assert brk.source_line == 'print("not capturable")'
    assert "print(&quot;not capturable&quot;)" in text
    [recompile] = events.recompiles
    assert recompile.function == "scaled" and "L['x'] shape (2, 3) -> (5, 3)" in recompile.reason
    assert len([g for g in events.guards if g.function == "scaled"]) == 2
    assert "float32[5, 3]" in text
    # The kernels and wrappers the run really compiled, and the stages that ran.
    assert {k.language for k in events.kernels} == {"cpp", "python"}
    assert any(k.name in text and "for" in k.source for k in events.kernels if k.language == "cpp")
    stages = {t.stage for t in events.stage_times}
    assert {"capture", "autograd", "loops", "cpp", "first run", "backend eager", "backend fireclay"} <= stages
    # What ran: mlp's inference graph; the Linear's forward (its weights require grad), and no
    # backward graph, as no backward call was made.
    kinds = [g.title.split(": ")[-1] for g in events.graphs if g.title.startswith("graph ")]
    assert kinds.count("aten inference") == kinds.count("aten forward") == 1 and "aten backward" not in kinds
    # Where capture cannot split a frame at a break, the page says that it records no such breaks.
    if _capture_splits_frames():  # the code after the break is captured too, with its own guards
        assert any(g.function.startswith("with_print → ") for g in events.guards)
    says_so = "breaks that split a frame into several graphs are not recorded" in text
    assert says_so != _capture_splits_frames()


def test_report_of_a_program_says_what_is_not_recorded(tmp_path):
    programs = []
    capture(mlp, backend=keeping(programs))(torch.randn(2, 4), torch.randn(4, 3))
    path = tmp_path / "p.html"
    write_report(programs[0], path)
    text = path.read_text()
    parse(text)
    # breaks, guards (a captured program carries none), recompiles, times, timeline, kernels
    assert text.count("Not recorded by this version") == 6
    assert "matmul" in text and "relu" in text
    assert "<svg" in text


def test_report_command_on_a_script_and_a_file(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch, fireclay\n"
        "def step(x):\n"
        "    return (x.exp() - 1).mean(dim=0)\n"
        "f = fireclay.compile(step, backend='eager')\n"
        "for _ in range(int(sys.argv[1])):\n"
        "    x = torch.randn(4, 3)\n"
        "    assert torch.allclose(f(x), step(x))\n")
    out = tmp_path / "r.html"
    assert main(["report", str(script), "-o", str(out), "--", "2"]) == 0
    printed = capsys.readouterr().out
    assert "Time per stage:" in printed and re.search(r"^  capture +[\d.]+ ms  \(1 step\)$", printed, re.M)
    text = out.read_text()
    parse(text)
    assert "return (x.exp() - 1).mean(dim=0)" in text and "Tensor.exp" in text
    programs = []
    capture(mlp, backend=keeping(programs))(torch.randn(2, 4), torch.randn(4, 3))
    saved = str(tmp_path / "mlp.fcir.json")
    ir.save(programs[0], saved)
    out2 = tmp_path / "r2.html"
    assert main(["report", saved, "-o", str(out2)]) == 0
    text2 = out2.read_text()
    parse(text2)
    assert "mm.default" in text2 and "kernel" in text2 and "Not recorded by this version" in text2


def test_recorder_compile_keeps_the_compiled_contract():
    rec = Recorder()
    f = rec.compile(mlp, backend="aot_eager")
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5)
    out = f(x, w)
    out.sum().backward()
    x2 = x.detach().requires_grad_()
    mlp(x2, w).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    events = rec.events()
    rec.stop()
    assert [g.title for g in events.graphs] == ["mlp #0: captured"]
    assert not events.kernels


@pytest.mark.parametrize("first, second, reason", [
    (torch.randn(2, 3), torch.randn(4, 3), "L['x'] shape (2, 3) -> (4, 3)"),
    (torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64), "L['x'] dtype float32 -> float64"),
    (torch.randn(2, 3), torch.randn(2, 3, requires_grad=True), "L['x'] requires_grad False -> True"),
    (torch.randn(2, 3), torch.randn(3, 2).t(), "L['x'] stride (3, 1) -> (1, 2)"),
])
def test_recompile_reasons_name_the_input_that_changed(first, second, reason):
    rec = Recorder()
    f = rec.compile(scaled, backend="eager")
    for x in (first, second):
        torch.testing.assert_close(f(x), scaled(x))
    rec.stop()
    [recompile] = rec.events().recompiles
    assert recompile.reason.startswith(reason)


def test_write_report_rejects_other_things(tmp_path):
    with pytest.raises(TypeError, match="write_report takes"):
        write_report("nope", tmp_path / "x.html")
    empty = tmp_path / "e.html"
    write_report(CompileEvents(), empty)
    parse(empty.read_text())


# -- the layered drawing


def chain(x):
    return x.sin().cos().exp()


def diamond(x, y):
    a = x + y
    return (a.relu() * a.sigmoid() + y) @ x.t()


def wide(x):
    return torch.cat([x.sin(), x.cos(), x.exp(), x.abs(), x.neg()], dim=0).sum()


@pytest.mark.parametrize("fn, shapes", [(chain, [(3,)]), (diamond, [(3, 3), (3, 3)]), (wide, [(2, 2)]), (mlp, [(2, 4), (4, 3)])])
def test_layout_puts_every_edge_downwards_without_overlaps(fn, shapes):
    programs = []
    capture(fn, backend=keeping(programs))(*[torch.randn(s) for s in shapes])
    graph = programs[0].main
    boxes = boxes_of(graph)
    width, height = layout(boxes)
    assert len(boxes) == len(graph.inputs) + len(graph.nodes) + 1
    for b in boxes:
        for p in b.preds:
            assert boxes[p].layer < b.layer and boxes[p].y + BOX_H < b.y
        assert 0 <= b.x and b.x + b.width <= width and b.y + BOX_H <= height
    by_layer = {}
    for b in boxes:
        by_layer.setdefault(b.layer, []).append(b)
    for row in by_layer.values():
        row.sort(key=lambda b: b.x)
        for left, right in zip(row, row[1:]):
            assert left.x + left.width < right.x
    assert boxes[-1].kind == "output" and boxes[-1].preds


def test_report_of_a_failing_script_is_still_written(tmp_path, capsys):
    script = tmp_path / "fails.py"
    script.write_text(
        "import torch, fireclay\n"
        "f = fireclay.compile(lambda x: x.cos() * 3, backend='eager')\n"
        "f(torch.randn(3))\n"
        "raise RuntimeError('out of data')\n")
    out = tmp_path / "r.html"
    assert main(["report", str(script), "-o", str(out)]) == 1
    assert "the script raised RuntimeError: out of data" in capsys.readouterr().err
    text = out.read_text()
    parse(text)
    assert "Tensor.cos" in text and "the script raised RuntimeError: out of data" in text
    assert main(["report", str(tmp_path / "missing.py")]) == 2
    assert capsys.readouterr().err == f"fireclay: error: no such file: {tmp_path / 'missing.py'}\n"


def _broken_in_two(x):
    y = torch.sin(x) + 1
    print("a graph break")
    return y * torch.cos(y)


def test_capture_time_is_recorded_per_frame_without_the_backend():
    import time

    def slow_backend(program, example_inputs):
        time.sleep(0.5)
        return lambda *args: ir.interpret(program, *args)

    rec = Recorder()
    f = rec.compile(_broken_in_two, backend=slow_backend)
    x = torch.randn(5)
    start = time.perf_counter()
    torch.testing.assert_close(f(x), _broken_in_two(x))
    wall = time.perf_counter() - start
    events = rec.events()
    rec.stop()
    captures = [t for t in events.stage_times if t.stage == "capture"]
    backends = [t for t in events.stage_times if t.stage.startswith("backend")]
    frames = 2 if _capture_splits_frames() else 1
    assert len(captures) == frames and len(backends) == frames
    assert captures[0].note.startswith("_broken_in_two at ")
    assert all(t.seconds > 0 for t in captures)
    # The backend's sleep is not counted as capture time.
    assert sum(t.seconds for t in captures) <= wall - 0.5 * frames
    assert "capture_time" not in events.not_recorded


def test_report_and_summary_show_capture_time_and_the_compile_cache(tmp_path):
    from fireclay.report import summary

    def small(x, w):
        return torch.nn.functional.gelu(x @ w).sum(dim=-1)

    x, w = torch.randn(3, 4), torch.randn(4, 4)
    with fireclay.config.shared.patch(cache_dir=str(tmp_path / "cache")):
        for round_ in range(2):  # the second compile of the same function hits the cache
            with recording() as rec:
                f = fireclay.compile(small)
                with torch.no_grad():
                    torch.testing.assert_close(f(x, w), small(x, w))
            events = rec.events()
            assert events.cache["autograd"]["hits"] == round_ and events.cache["autograd"]["misses"] == 1 - round_
            assert events.cache["loops"]["hits"] == round_
    path = tmp_path / "report.html"
    write_report(rec, path)
    text = path.read_text()
    parse(text)
    assert "<h3>Compile cache</h3>" in text and 'data-stage="autograd"' in text
    assert re.search(r"<tr><td>capture</td><td>[\d.]+ ms</td>", text)
    lines = summary(events).splitlines()
    assert lines[0] == "Time per stage:" and any(line.split()[0] == "capture" for line in lines[1:])
    assert lines[-1].startswith("Compile cache: autograd 1 hit(s), 0 miss(es); loops 1 hit(s), 0 miss(es)")
