"""Report the import cycles inside each fireclay package and fail when one is too large.

A cycle is a strongly connected component of a package's module import graph. Every import
statement counts, wherever it sits: a function-level import is still a dependency, only a later
one. Importing ``a.b.c`` is an edge to ``a.b.c`` alone (Python also runs the parent packages'
``__init__`` modules, but a package's ``__init__`` re-exporting its modules would otherwise put
every module in one cycle with it).

    python scripts/import_cycles.py            # each package's largest cycle, exit 1 if > limit
    python scripts/import_cycles.py --limit 3 --show
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIMIT = 3


def package_modules(src: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module under a package's ``src/``."""
    modules = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_modules(module: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The package's own modules that ``module`` imports anywhere in its body."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from pkg import name`` imports the module pkg.name when there is one, else it
            # reads a name of pkg itself.
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in modules else target)
    return {name for name in found if name in modules and name != module}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components in no particular order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def package_cycles(src: pathlib.Path) -> list[list[str]]:
    """The package's import cycles (components of more than one module), largest first."""
    modules = package_modules(src)
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    return sorted(cycles, key=len, reverse=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=LIMIT, help="most files one cycle may span")
    parser.add_argument("--show", action="store_true", help="list every cycle's modules")
    args = parser.parse_args(argv)
    failed = False
    for src in sorted(ROOT.glob("packages/*/src")):
        cycles = package_cycles(src)
        largest = len(cycles[0]) if cycles else 0
        too_big = [c for c in cycles if len(c) > args.limit]
        failed |= bool(too_big)
        print(f"{src.parent.name}: {len(cycles)} cycle(s), largest spans {largest} file(s)"
              + (f"  (over the limit of {args.limit})" if too_big else ""))
        for cycle in cycles if args.show else too_big:
            print("    " + " ".join(cycle))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
