"""The report in a real headless browser: its script ran (table of contents built, boxes counted)
and the drawn graphs are in the DOM. Skipped where no Chromium is found: ``FIRECLAY_CHROMIUM``
names one, else the first of the names below on PATH (Debian's ``chromium-headless-shell`` or
``chromium`` package provides one; no PyPI package ships a usable Chromium)."""

import os
import re
import shutil
import subprocess

import pytest
import torch

import fireclay
from fireclay.report import recording, write_report

NAMES = ("chromium-headless-shell", "chrome-headless-shell", "chromium", "chromium-browser", "google-chrome")
CHROMIUM = os.environ.get("FIRECLAY_CHROMIUM") or next((shutil.which(n) for n in NAMES if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: set FIRECLAY_CHROMIUM or install Debian's "
                                                         "chromium-headless-shell")


def block(x, w):
    h = torch.nn.functional.gelu(x @ w)
    return h.softmax(dim=-1) + x.sum()


def with_print(x):
    print("eager")
    return x * 2


def dump_dom(path):
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_report_scripts_run_in_a_headless_browser(tmp_path):
    with recording() as rec:
        f = fireclay.compile(block, backend="eager")
        x, w = torch.randn(4, 4), torch.randn(4, 4)
        torch.testing.assert_close(f(x, w), block(x, w))
        fireclay.compile(with_print, backend="eager")(torch.ones(2))
    path = tmp_path / "report.html"
    write_report(rec, path)
    source = path.read_text()
    dom = dump_dom(path)
    assert 'data-ready="yes"' in dom  # the inline script ran to its end
    toc = re.search(r'<nav id="toc">(.*?)</nav>', dom, re.S).group(1)
    assert re.findall(r'href="#([\w-]+)"', toc) == re.findall(r'<h2 id="([\w-]+)"', source)
    boxes = dom.count('<g class="node')
    assert boxes > 0 and f"{boxes} boxes drawn" in dom
    assert dom.count("<svg") == len(rec.events().graphs)
    assert "gelu" in dom and 'print("eager")' in dom
