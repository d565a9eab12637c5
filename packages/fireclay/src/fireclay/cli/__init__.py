"""The ``fireclay`` command: run one stage on a saved program, inspect it, or write a report.

    fireclay capture SCRIPT.py:FN -o OUT --example-inputs SPEC ...
                                             capture FN into a torch-dialect program
    fireclay show FILE                       the program's text form
    fireclay run FILE [--inputs SPEC ...]    run it in the reference interpreter
    fireclay run DIR [--inputs SPEC ...]     run a folder written by `fireclay cpp|triton`
    fireclay autograd IN -o OUT [--train]    torch dialect -> aten (see below for --train)
    fireclay loops IN -o OUT                 aten -> loops dialect (scheduled and fused)
    fireclay cpp IN -o DIR                   aten or loops -> C++ kernels + wrapper in DIR (runnable)
    fireclay triton IN -o DIR                aten or loops -> Triton kernels + wrapper in DIR (runnable)
    fireclay report SCRIPT.py|FILE -o HTML   a self-contained HTML compile report

Files are fireclay-ir documents (``*.fcir.json``, weights beside them in ``*.fcir.safetensors``).
``autograd --train`` writes the forward graph to OUT and the backward graph next to it, named
``<OUT without .fcir.json>.backward.fcir.json``; both are ordinary aten programs, so each can go
on to ``fireclay loops``. Input specs are described in :mod:`fireclay.cli.inputs`.

Errors a user can fix (a missing or malformed file, a bad input spec, an unknown subcommand)
print one ``fireclay: error: ...`` line and exit with status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from fireclay.cli.errors import CLIError, InputSpecError

EXIT_USAGE = 2  # the user can fix it: a file, a spec, an argument
EXIT_FAILURE = 1  # a stage failed


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the usage block
        raise CLIError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fireclay", description="Run fireclay's compiler stages on saved programs.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser.add_argument("--log", metavar="SPEC", help="logging, as FIRECLAY_LOG: e.g. 'capture,loops=debug'")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def with_inputs(p: argparse.ArgumentParser) -> None:
        p.add_argument("--inputs", nargs="+", metavar="SPEC",
                       help="one per input: randn:2x3:float32, zeros:4:int64, int:3, x.safetensors[:name]; "
                            "default: random tensors of the program's input types")
        p.add_argument("--seed", type=int, default=0, help="seed of generated inputs (default 0)")

    def with_run_limits(p: argparse.ArgumentParser) -> None:
        # (a document may come from anyone: what runs it is bounded, see fireclay_ir.RunLimits)
        p.add_argument("--max-steps", type=int, default=None, metavar="N",
                       help="stop after N steps: nodes and graphs run, kernels and their ops "
                            "(default: fireclay_ir.RunLimits().max_steps)")
        p.add_argument("--max-bytes", type=int, default=None, metavar="N",
                       help="refuse to hold more than N bytes of tensors at once (default: RunLimits().max_bytes)")

    p = sub.add_parser("capture", help="capture a function of a script into a torch-dialect program")
    p.add_argument("target", metavar="SCRIPT.py:FUNCTION",
                   help="a function, an nn.Module instance, or an nn.Module class taking no arguments, "
                        "named at the top level of the script (the script runs with __name__ != '__main__')")
    p.add_argument("-o", "--output", help="the program file (default: FUNCTION.fcir.json)")
    p.add_argument("--example-inputs", nargs="*", default=[], metavar="SPEC",
                   help="one per argument, as --inputs of `fireclay run`: randn:2x3:float32, int:3, x.safetensors")
    p.add_argument("--seed", type=int, default=0, help="seed of generated inputs (default 0)")
    p.add_argument("--dynamic", action="store_true", help="capture every size symbolic")

    p = sub.add_parser("show", help="print a program's text form")
    p.add_argument("file")
    p.add_argument("--verify", action="store_true", help="also run the verifier")

    p = sub.add_parser("run", help="run a program in the reference interpreter, or a folder written by "
                                   "`fireclay cpp|triton` through its code generator")
    p.add_argument("file", metavar="FILE_OR_DIR")
    with_inputs(p)
    p.add_argument("--print-values", action="store_true", help="print every output value")
    p.add_argument("--save-outputs", metavar="PATH", help="write the outputs to a .safetensors file (out0, out1, ...)")
    with_run_limits(p)

    p = sub.add_parser("autograd", help="torch dialect -> aten (inference, or forward and backward with --train)")
    p.add_argument("file")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--train", action="store_true", help="floating inputs require grad: write forward and backward")
    with_inputs(p)
    with_run_limits(p)

    p = sub.add_parser("loops", help="aten -> loops dialect")
    p.add_argument("file")
    p.add_argument("-o", "--output", required=True)

    for name, what in (("cpp", "C++"), ("triton", "Triton")):
        p = sub.add_parser(name, help=f"aten or loops -> generated {what} source and wrapper in a folder")
        p.add_argument("file")
        p.add_argument("-o", "--output", required=True, metavar="DIR")

    p = sub.add_parser("report", help="write an HTML compile report of a script or a saved program")
    p.add_argument("target", metavar="SCRIPT_OR_FILE")
    p.add_argument("-o", "--output", default="fireclay-report.html")
    with_inputs(p)
    p.epilog = "Arguments after `--` go to the script: fireclay report train.py -o r.html -- --steps 3"
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fireclay`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in argv:  # the rest belongs to the script of `fireclay report`
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        args.script_args = script_args
        if args.log:
            from fireclay import logs

            levels, problems = logs.parse_spec(args.log)
            if problems:
                raise CLIError("--log " + "; ".join(problems))
            logs.set_levels(levels)
        from fireclay.cli import commands

        return getattr(commands, f"cmd_{args.command}")(args)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except Exception as e:
        if debug:
            raise
        if _is_user_error(e):
            print(f"fireclay: error: {_message(e)}", file=sys.stderr)
            return EXIT_USAGE
        print(f"fireclay: internal error: {type(e).__name__}: {e}\n(rerun with --debug for the traceback, "
              "and please report it)", file=sys.stderr)
        return EXIT_FAILURE


def _is_user_error(e: BaseException) -> bool:
    from fireclay_ir import FormatError, IRError

    return isinstance(e, (CLIError, InputSpecError, FileNotFoundError, IsADirectoryError, PermissionError,
                          FormatError, IRError))


def _message(e: BaseException) -> str:
    if isinstance(e, (FileNotFoundError, IsADirectoryError, PermissionError)) and e.filename:
        return f"{e.strerror or type(e).__name__}: {os.fspath(e.filename)}"
    return str(e)
