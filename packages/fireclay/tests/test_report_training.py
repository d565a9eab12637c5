"""The report of a training script records what the run really did: the forward and backward
graphs it compiled, each stage's time as it ran (they account for most of the first step), and
large graphs drawn with their repeated layers collapsed."""

import json
import re
import shutil
import subprocess
import textwrap
from html.parser import HTMLParser

import pytest

import fireclay
from fireclay.cli import main

SCRIPT = textwrap.dedent('''
    import json, sys, time, torch, fireclay

    class Block(torch.nn.Module):
        def __init__(self, width=32, heads=4):
            super().__init__()
            self.heads = heads
            self.norm1 = torch.nn.LayerNorm(width)
            self.qkv = torch.nn.Linear(width, 3 * width)
            self.proj = torch.nn.Linear(width, width)
            self.norm2 = torch.nn.LayerNorm(width)
            self.up = torch.nn.Linear(width, 4 * width)
            self.down = torch.nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                       for z in self.qkv(self.norm1(x)).split(c, dim=-1))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))

    class TinyTransformer(torch.nn.Module):
        def __init__(self, vocab=64, width=32, layers=4):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, width)
            self.layers = torch.nn.ModuleList(Block(width) for _ in range(layers))
            self.head = torch.nn.Linear(width, vocab)

        def forward(self, ids, targets):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            return torch.nn.functional.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())

    torch.manual_seed(0)
    model = TinyTransformer()
    reference = TinyTransformer()
    reference.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = fireclay.compile(model)
    times = []
    for i in range(3):
        ids = torch.randint(0, 64, (2, 16))
        start = time.perf_counter()
        loss = step(ids, ids.roll(1, 1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    with torch.no_grad():  # the trained model still computes what eager does (a recompile: grad mode)
        torch.testing.assert_close(step(ids, ids.roll(1, 1)), model(ids, ids.roll(1, 1)), rtol=1e-4, atol=1e-5)
    json.dump({"steps": times}, open(sys.argv[1], "w"))
''')


class Structure(HTMLParser):
    """Tags in order, with every element closed in order (void and SVG leaf elements aside)."""

    VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "area", "base", "source", "track"}
    LEAVES = {"path", "rect", "line", "circle"}

    def __init__(self):
        super().__init__()
        self.stack, self.problems, self.attrs = [], [], []

    def handle_starttag(self, tag, attrs):
        self.attrs.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.attrs.append((tag, dict(attrs)))
        if tag not in self.LEAVES | self.VOID:
            self.problems.append(f"self-closed <{tag}/>")

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()


@pytest.fixture(scope="module")
def training_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("training-report")
    script, steps, out = folder / "train.py", folder / "steps.json", folder / "report.html"
    script.write_text(SCRIPT)
    # A cache of its own: the first step compiles every stage, as a new user's would.
    with fireclay.config.shared.patch(cache_dir=str(folder / "cache")):
        assert main(["report", str(script), "-o", str(out), "--", str(steps)]) == 0
    return out, out.read_text(), json.loads(steps.read_text())["steps"]


def _events(html_text):
    """(stage, graph, own ms) of the page's timeline, in order."""
    timeline = re.search(r'<h2 id="timeline">.*?</table>', html_text, re.S).group(0)
    return [(stage, graph, float(own)) for stage, graph, own in
            re.findall(r"<tr><td>[\d.]+ s</td><td>(.*?)</td><td>(.*?)</td><td>([\d.]+) ms</td>", timeline)]


def test_report_names_the_forward_and_backward_graphs_of_the_run(training_report):
    _, text, _ = training_report
    titles = re.findall(r'<section class="graph-entry" data-stage="[^"]+"><h3>(.*?)</h3>', text)
    graphs: dict[str, list[str]] = {}
    order: dict[str, str] = {}  # graph numbers run on in a process that compiled before: by first appearance
    for t in titles:
        graph, kind = re.match(r"(graph \d+) \(TinyTransformer\.forward at .*train\.py:\d+\): (.*)", t).groups()
        graphs.setdefault(order.setdefault(graph, f"graph {len(order) + 1}"), []).append(kind)
    # Training: the forward and the backward the first backward call compiled; then the call
    # under no_grad captured again, for inference.
    assert graphs == {"graph 1": ["captured", "aten forward", "loops forward", "aten backward", "loops backward"],
                      "graph 2": ["captured", "aten inference", "loops inference"]}, titles
    # The generated code of each: its C++ kernels and wrapper.
    for role in ("forward", "backward", "inference"):
        assert re.search(rf": {role}: <code>kernels0\.cpp</code>", text)
        assert re.search(rf": {role}: <code>wrapper\.py</code>", text)
    recompiles = re.search(r'<h2 id="recompiles">.*?</table>', text, re.S).group(0)
    assert "TinyTransformer" in recompiles and "<td>1</td>" in recompiles


def test_stage_times_account_for_the_first_step(training_report):
    _, text, steps = training_report
    events = _events(text)
    captures = [i for i, (stage, _, _) in enumerate(events) if stage == "capture"]
    assert len(captures) == 2  # the training step's, then the no_grad call's
    events = events[:captures[1]]  # the first step's
    stages = [stage for stage, _, _ in events]
    # The order they ran in: capture, the forward's autograd/loops/cpp and first run, then the
    # backward's loops/cpp (compiled at the first backward call) and first run.
    assert stages[0] == "capture"
    for stage in ("autograd", "loops", "cpp", "first run"):
        assert stage in stages
    assert stages.count("loops") == stages.count("cpp") == stages.count("first run") == 2
    assert stages.index("autograd") < stages.index("loops") < stages.index("cpp")
    total = sum(ms for _, _, ms in events) / 1e3
    first_step = steps[0]
    # Each stage's own time is exclusive, so they add up to no more than the step; the rest of
    # the step (Python between the stages, the optimizer) is small next to them.
    assert 0.7 * first_step <= total <= first_step * 1.01, (total, steps)
    # No stage ran after the first step: later steps run the compiled code only.
    assert steps[1] < first_step and steps[2] < first_step


def test_large_graphs_are_drawn_with_repeated_layers_collapsed(training_report):
    _, text, _ = training_report
    parser = Structure()
    parser.feed(text)
    parser.close()
    assert parser.problems == [] and parser.stack == [], parser.problems[:5]
    collapsed = [a for tag, a in parser.attrs if tag == "g" and "collapsed" in a.get("class", "").split()]
    # layers.1-3 of every drawn graph (captured, aten and loops; forward, backward, inference)
    # are one box each; layers.0 is drawn whole.
    assert sorted({a["data-layer"] for a in collapsed}) == ["layers.1", "layers.2", "layers.3"]
    assert len(collapsed) == 3 * 8
    assert all(int(a["data-members"]) >= 5 for a in collapsed)
    notes = [a for tag, a in parser.attrs if tag == "span" and a.get("class") == "collapsed-note"]
    assert len(notes) == 8 and all(a["data-collapsed"] == "3" for a in notes)
    # Readable: no drawing wider than a few screens (the captured graph alone has 80 nodes).
    widths = [float(a["width"]) for tag, a in parser.attrs if tag == "svg"]
    assert max(widths) < 4000, widths
    boxes = text.count('<g class="node')
    nodes = sum(int(n) for n in re.findall(r"<p>(\d+) nodes, stage", text))
    assert boxes < nodes / 2, (boxes, nodes)


CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (Debian's chromium-headless-shell)")
def test_training_report_renders_in_a_headless_browser(training_report):
    path, text, _ = training_report
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert 'data-ready="yes"' in dom
    assert dom.count('class="node collapsed"') == text.count('class="node collapsed"') == 24
    boxes = dom.count('<g class="node')
    assert f"{boxes} boxes drawn" in dom
