"""``python -m fireclay_ir.serde FILE.fcir.json ...``: print saved programs in the text form."""

from __future__ import annotations

import sys

from fireclay_ir.model import IRError
from fireclay_ir.printer import format_program
from fireclay_ir.serde import load


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m fireclay_ir.serde FILE.fcir.json [...]", file=sys.stderr)
        return 2
    status = 0
    for path in paths:
        try:
            sys.stdout.write(format_program(load(path, weights="none")))
        except (OSError, IRError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
