"""Every ``FIRECLAY_*`` variable: defined once (a field of a package's settings section, named by
the one rule), read by live code, and listed in docs/settings.md.

``FIRECLAY_UPDATE_GOLDEN=1`` rewrites the generated tables of docs/settings.md."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

import fireclay

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "settings.md"
BEGIN, END = "<!-- settings tables: begin -->", "<!-- settings tables: end -->"
SECTION_TITLES = {"": "fireclay (`fireclay.config`)", "shared": "shared by every stage (`fireclay_ir.config`, "
                  "`fireclay.config.shared`)"}
# Settings whose effect is applied when they are set (fireclay.config's on_change hook calls the
# logging module), rather than read where they act.
APPLIED_WHEN_SET = {("", "log"), ("", "verbose")}

needs_checkout = pytest.mark.skipif(not (REPO / "packages").is_dir(), reason="needs the repository checkout")
# The tables list every package's section, fireclay-triton's (the umbrella's cuda extra) too.
needs_every_stage = pytest.mark.skipif(importlib.util.find_spec("fireclay_triton") is None,
                                       reason="fireclay-triton is not installed")


def _sections():
    return {"": fireclay.config, **fireclay.config.sections()}


def _tables() -> str:
    out = []
    for name, section in _sections().items():
        title = SECTION_TITLES.get(name, f"fireclay-{name} (`fireclay_{name}.config`, `fireclay.config.{name}`)")
        out += [f"### {title}", "", "| variable | setting | type | default | what it does |", "| --- | --- | --- | --- | --- |"]
        for info in section.describe():
            default = "empty" if info.default in ("", ()) else ("none" if info.default is None else info.default)
            if isinstance(default, tuple):
                default = ",".join(default)
            out.append(f"| `{info.variable}` | `{info.name}` | {info.type} | {default} | {info.doc} |")
        out.append("")
    return "\n".join(out)


def test_variable_names_are_unique_across_sections():
    names = [info.variable for info in fireclay.config.describe_all()]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@needs_checkout
@needs_every_stage
def test_docs_list_every_variable():
    wanted = "\n\n" + _tables() + "\n"
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    if os.environ.get("FIRECLAY_UPDATE_GOLDEN"):
        DOC.write_text(text[:start] + wanted + text[end:])
        text = DOC.read_text()
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    assert text[start:end] == wanted, "docs/settings.md is out of date: rerun with FIRECLAY_UPDATE_GOLDEN=1"


def _source_files():
    for package in sorted((REPO / "packages").iterdir()):
        yield from sorted((package / "src").rglob("*.py"))


@needs_checkout
@needs_every_stage
def test_every_variable_the_product_names_is_a_setting():
    generated = {info.variable for info in fireclay.config.describe_all()}
    prefixes = {f"FIRECLAY_{s.SECTION.upper()}_" for s in _sections().values() if s.SECTION} | {"FIRECLAY_"}
    strays = []
    for path in _source_files():
        for match in re.finditer(r"FIRECLAY_[A-Z0-9_]*", path.read_text()):
            name = match.group()
            if name not in generated and name not in prefixes:
                strays.append(f"{path.relative_to(REPO)}: {name}")
    assert strays == []


@needs_checkout
def test_every_setting_is_read_by_live_code():
    """Each field is read as ``config.NAME`` / ``cfg.NAME`` somewhere in the product, or as
    ``self.NAME`` in a method of its own section (``resolved_*`` helpers the stage calls)."""
    sources = {path: path.read_text() for path in _source_files()}
    unread = []
    for name, section in _sections().items():
        defining = type(section).__module__.replace(".", "/") + ".py"
        for info in section.describe():
            if (name, info.name) in APPLIED_WHEN_SET:
                continue
            elsewhere = re.compile(rf"(?<![A-Za-z0-9_])(config|cfg|shared_config)\.{info.name}\b")
            own = re.compile(rf"(?<![A-Za-z0-9_])self\.{info.name}\b")
            if not any((own if str(path).endswith(defining) else elsewhere).search(text)
                       for path, text in sources.items()):
                unread.append(f"{name or 'fireclay'}.{info.name}")
    assert unread == []
