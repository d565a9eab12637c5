"""``python -m fireclay_ir show|verify FILE``: read a program without torch.

    python -m fireclay_ir show model.fcir.json      the text form
    python -m fireclay_ir verify model.fcir.json    load, then check every rule; exit 1 if broken

Errors a user can fix (no such file, a file that is not a fireclay-ir document, a broken rule)
print one ``fireclay_ir: error: ...`` line and exit with status 2 (1 for a verification failure).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from fireclay_ir import FormatError, IRError, Program, VerificationError, format_program, load, verify

# Dialects registered by other distributions, loaded when a program uses them and they are installed.
_DIALECT_PACKAGES = {"loops": ("fireclay_loops", "fireclay-loops")}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fireclay_ir",
                                     description="Read, print and verify fireclay-ir programs (*.fcir.json).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser("show", help="print a program's text form")
    p.add_argument("file")
    p.add_argument("--verify", action="store_true", help="also run the verifier")
    p = sub.add_parser("verify", help="check a program against the format's and its dialects' rules")
    p.add_argument("file")
    return parser


def _load(path: str) -> Program:
    """Load ``path``; a dialect another installed distribution registers is loaded on demand."""
    try:
        return load(path)
    except FormatError as e:
        for dialect, (module, _) in _DIALECT_PACKAGES.items():
            if f"dialect '{dialect}' is not registered" in str(e) and importlib.util.find_spec(module) is not None:
                importlib.import_module(module)
                return load(path)
        raise


def _register_dialects(program: Program) -> None:
    used = {node.dialect for graph in program.graphs.values() for node in graph.nodes}
    for dialect in sorted(used & set(_DIALECT_PACKAGES)):
        module, dist = _DIALECT_PACKAGES[dialect]
        if importlib.util.find_spec(module) is None:
            raise IRError(f"the program uses the {dialect} dialect, which {dist} registers; install it to verify "
                          f"this program (pip install {dist})")
        importlib.import_module(module)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        program = _load(args.file)
        if args.command == "show":
            sys.stdout.write(format_program(program))
        if args.command == "verify" or args.verify:
            _register_dialects(program)
            verify(program)
            nodes = sum(len(g.nodes) for g in program.graphs.values())
            version = ".".join(str(part) for part in program.format_version)
            print(f"{args.file}: verified ({len(program.graphs)} graph(s), {nodes} nodes, format {version})"
                  if args.command == "verify" else "# verified")
    except VerificationError as e:
        print(f"fireclay_ir: {args.file} does not verify: {e}", file=sys.stderr)
        return 1
    except (FormatError, IRError, OSError) as e:
        print(f"fireclay_ir: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
