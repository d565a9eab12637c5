"""No package reaches into another package's private names.

A name starting with ``_`` is private to the package that defines it. This reads every package's
source and reports, in one package:

* ``from fireclay_x... import _name`` and imports of a private module of another package;
* ``fireclay_x.<...>._name`` on a module of another package;
* ``something._name`` where ``_name`` is defined nowhere in this package but in another one (a
  method or attribute of another package's object, such as ``Graph._fresh_name``).
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[1] / "packages"

# Private names of torch and sympy objects (tensors, modules, printers) that some fireclay package
# happens to define too: reading them is using torch's or sympy's API, not a sibling's.
THIRD_PARTY = {"_ops", "_print", "_modules", "_base"}
# Exemptions (package, private name), each with its reason: none today.
KNOWN: set[tuple[str, str]] = set()

pytestmark = pytest.mark.skipif(not PACKAGES.is_dir(), reason="needs the repository checkout")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _trees() -> dict[str, list[tuple[Path, ast.AST]]]:
    out = collections.defaultdict(list)
    for package in sorted(PACKAGES.iterdir()):
        for path in sorted((package / "src").rglob("*.py")):
            out[package.name.replace("-", "_")].append((path, ast.parse(path.read_text())))
    return out


def _defined(trees) -> set[str]:
    names = set()
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)  # __slots__ entries, getattr names
    return names


def test_no_package_uses_another_packages_private_names():
    trees = _trees()
    defined = {package: _defined(found) for package, found in trees.items()}
    problems = []
    for package, found in trees.items():
        for path, tree in found:
            where = path.relative_to(PACKAGES)
            siblings: set[str] = set()  # local names bound to another package's modules
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    top = node.module.split(".")[0]
                    if top.startswith("fireclay") and top != package:
                        if any(_private(part) for part in node.module.split(".")):
                            problems.append(f"{where}:{node.lineno}: imports private module {node.module}")
                        for alias in node.names:
                            if _private(alias.name):
                                problems.append(f"{where}:{node.lineno}: imports {node.module}.{alias.name}")
                            siblings.add(alias.asname or alias.name)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        top = alias.name.split(".")[0]
                        if top.startswith("fireclay") and top != package:
                            if any(_private(part) for part in alias.name.split(".")):
                                problems.append(f"{where}:{node.lineno}: imports private module {alias.name}")
                            siblings.add(alias.asname or top)
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                    continue
                if (package, node.attr) in KNOWN or node.attr in THIRD_PARTY:
                    continue
                root = node.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                on_sibling = isinstance(root, ast.Name) and root.id in siblings
                foreign = node.attr not in defined[package] and any(
                    node.attr in names for other, names in defined.items() if other != package)
                if on_sibling or foreign:
                    problems.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    assert problems == []
