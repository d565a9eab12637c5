"""One function per subcommand: ``cmd_<name>(args) -> exit status``."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time

import fireclay_ir as ir
from fireclay.cli.errors import CLIError
from fireclay.cli.inputs import bind_weights, inputs_for, save_tensors, summarize

SUFFIX = ".fcir.json"


def load_program(path: str) -> ir.Program:
    if not os.path.exists(path):
        raise CLIError(f"no such file: {path}")
    if os.path.isdir(path):
        raise CLIError(f"{path} is a folder; expected a {SUFFIX} file")
    try:
        return ir.load(path)
    except ir.FormatError as e:
        if "dialect 'loops' is not registered" in str(e):
            import fireclay_loops  # noqa: F401  (registers the loops dialect; then the file reads)

            return load_program(path)
        raise CLIError(f"{path} is not a readable fireclay-ir file: {e}") from None


def dialects_of(program: ir.Program) -> set[str]:
    return {node.dialect for graph in program.graphs.values() for node in graph.nodes} or set(program.dialects)


def _require(program: ir.Program, path: str, allowed: set[str], command: str, hint: str) -> str:
    """The program's dialect, when ``command`` takes it; otherwise a CLIError saying what to do."""
    found = (dialects_of(program) - {"hop"}) or {"torch"}
    if not found <= allowed:
        raise CLIError(f"`fireclay {command}` takes a program in the {' or '.join(sorted(allowed))} dialect; {path} is in the "
                       f"{', '.join(sorted(found))} dialect. {hint}".rstrip())
    return "loops" if "loops" in found else sorted(found)[0]


def _save(program: ir.Program, path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CLIError(f"cannot write {path}: folder {folder} does not exist")
    ir.save(program, path)
    print(f"wrote {path}")


def cmd_show(args: argparse.Namespace) -> int:
    program = load_program(args.file)
    print(ir.format_program(program), end="")
    if args.verify:
        _import_dialects(program)
        ir.verify(program)
        print("# verified")
    return 0


def _import_dialects(program: ir.Program) -> None:
    """Dialects register themselves on import; a loops program needs fireclay_loops loaded."""
    if "loops" in dialects_of(program):
        import fireclay_loops  # noqa: F401


def cmd_capture(args: argparse.Namespace) -> int:
    from fireclay.cli.folders import capture_target

    return capture_target(args)


def cmd_run(args: argparse.Namespace) -> int:
    if os.path.isdir(args.file):  # a folder of generated code (fireclay.cli.folders)
        from fireclay.cli.folders import run_folder

        return run_folder(args)
    program = load_program(args.file)
    _import_dialects(program)
    # A document may come from anyone: the run is bounded in steps and bytes (docs/security.md).
    limits = run_limits(args)
    values = inputs_for(program, args.inputs, args.seed, limits=limits)
    try:
        if "loops" in dialects_of(program):
            from fireclay_loops import from_program
            from fireclay_loops.reference import run as run_scheduled

            outputs = tuple(run_scheduled(from_program(program), *bind_weights(program, values), limits=limits))
        else:
            outputs = ir.interpret(program, *values, limits=limits)
    except ir.RunLimitError as e:
        raise CLIError(f"{args.file}: {e}") from None
    for i, value in enumerate(values):
        print(summarize(f"input {i}", value))
    for i, value in enumerate(outputs):
        print(summarize(f"output {i}", value, full=args.print_values))
    if args.save_outputs:
        save_tensors(args.save_outputs, list(outputs), "out")
        print(f"wrote {args.save_outputs}")
    return 0


def run_limits(args: argparse.Namespace) -> ir.RunLimits:
    """The limits of a command that runs a document: ``--max-steps`` and ``--max-bytes``, or
    the defaults of :class:`fireclay_ir.RunLimits`."""
    defaults = ir.RunLimits()
    return ir.RunLimits(max_steps=defaults.max_steps if args.max_steps is None else args.max_steps,
                        max_bytes=defaults.max_bytes if args.max_bytes is None else args.max_bytes)


def _stem(path: str) -> str:
    return path[: -len(SUFFIX)] if path.endswith(SUFFIX) else os.path.splitext(path)[0]


def cmd_autograd(args: argparse.Namespace) -> int:
    from fireclay_autograd import aot_graphs, trace_to_aten

    program = load_program(args.file)
    _require(program, args.file, {"torch", "aten"}, "autograd", "")
    # Tracing runs the document's ops (on fake tensors): bounded as `fireclay run` is.
    limits = run_limits(args)
    values = inputs_for(program, args.inputs, args.seed, limits=limits)
    start = time.perf_counter()
    try:
        if not args.train:
            _save(trace_to_aten(program, values, limits=limits), args.output)
        else:
            values = [v.requires_grad_() if hasattr(v, "is_floating_point") and v.is_floating_point() else v
                      for v in values]
            if not any(getattr(v, "requires_grad", False) for v in values) and not any(
                    w.meta.requires_grad for w in program.weights.values()):
                raise CLIError(f"--train needs a floating-point input or weight that requires grad; {args.file} "
                               "has none")
            pair = aot_graphs(program, values, limits=limits)
    except ir.RunLimitError as e:
        raise CLIError(f"{args.file}: {e}") from None
    if args.train:
        _save(pair.forward, args.output)
        _save(pair.backward, _stem(args.output) + ".backward" + SUFFIX)
    print(f"autograd took {(time.perf_counter() - start) * 1e3:.1f} ms")
    return 0


def cmd_loops(args: argparse.Namespace) -> int:
    import fireclay_loops

    program = load_program(args.file)
    _require(program, args.file, {"aten"}, "loops", "Run `fireclay autograd` on a torch-dialect program first.")
    start = time.perf_counter()
    scheduled = fireclay_loops.schedule(fireclay_loops.lower(program))
    elapsed = time.perf_counter() - start
    _save(fireclay_loops.to_program(scheduled), args.output)  # keeps weights and input kinds
    print(scheduled.report())
    print(f"loops took {elapsed * 1e3:.1f} ms")
    return 0


def _codegen(args: argparse.Namespace, backend: str) -> int:
    from fireclay.cli.folders import write_folder

    program = load_program(args.file)
    _require(program, args.file, {"aten", "loops"}, backend, "Run `fireclay autograd` on a torch-dialect program first.")
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise CLIError(f"{args.output} exists and is not a folder")
    _import_dialects(program)
    start = time.perf_counter()
    paths = write_folder(program, backend, args.output)
    elapsed = time.perf_counter() - start
    for path in paths:
        print(f"wrote {path}")
    print(f"{backend} took {elapsed * 1e3:.1f} ms; run it with: fireclay run {args.output}")
    return 0


def cmd_cpp(args: argparse.Namespace) -> int:
    return _codegen(args, "cpp")


def cmd_triton(args: argparse.Namespace) -> int:
    return _codegen(args, "triton")


def cmd_report(args: argparse.Namespace) -> int:
    from fireclay.report import CompileEvents, inspect_program, recording, write_report

    target = args.target
    if not os.path.exists(target):
        raise CLIError(f"no such file: {target}")
    status = 0
    if target.endswith(".py"):
        saved_argv = sys.argv
        sys.argv = [target, *args.script_args]
        with recording(title=f"fireclay compile report: {os.path.basename(target)}") as recorder:
            try:
                runpy.run_path(target, run_name="__main__")
            except SystemExit as e:
                status = int(e.code or 0) if not isinstance(e.code, str) else 1
            except Exception as e:  # the report of what compiled so far is still worth writing
                recorder.events().notes.append(f"the script raised {type(e).__name__}: {e}")
                print(f"fireclay: the script raised {type(e).__name__}: {e}", file=sys.stderr)
                status = 1
            finally:
                sys.argv = saved_argv
        source = recorder
    else:
        program = load_program(target)
        if "torch" in dialects_of(program):
            events = CompileEvents(title=f"fireclay compile report: {os.path.basename(target)}")
            values = inputs_for(program, args.inputs, args.seed)
            inspect_program(program, values, events, program.metadata.get("capture", {}).get("function", "program"))
            why = "a saved program holds no capture; run `fireclay report SCRIPT.py` to see them"
            for section in ("graph_breaks", "guards", "recompiles"):
                events.not_recorded[section] = why
            source = events
        else:
            source = program
    write_report(source, args.output)
    if not isinstance(source, ir.Program):
        from fireclay.report import as_events, summary

        print(summary(as_events(source)))
    print(f"wrote {args.output}")
    return status
