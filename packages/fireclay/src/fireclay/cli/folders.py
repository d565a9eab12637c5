"""Folders of generated code that ``fireclay run DIR`` runs, and ``fireclay capture``.

``fireclay cpp|triton IN -o DIR`` writes into DIR:

    program.fcir.json (+ .fcir.safetensors)   the scheduled loops program the code was made from
    wrapper.py, kernels*.cpp / kernels.py     the generated code, for reading
    schedule.txt                              the schedule in words
    fireclay-code.json                        what made the folder: the code generator, the program
                                              file, and a SHA-256 of each generated file

``fireclay run DIR`` compiles DIR's program with the code generator named there (a C++ library
comes from the build cache when one was built for the same source), checks that the generated
files still match DIR's (a file edited by hand is reported: the program is what runs), and calls
the result with the program's user inputs; the weights are bound from the program's weights file.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import runpy
import sys
from typing import Any

import fireclay_ir as ir
from fireclay.cli.errors import CLIError
from fireclay_ir.serde import weights_path

MANIFEST = "fireclay-code.json"
PROGRAM = "program.fcir.json"
GENERATORS = ("cpp", "triton")


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def code_generator(name: str) -> Any:
    """fireclay_cpp or fireclay_triton; Triton runs in its interpreter on a machine without CUDA."""
    if name == "triton":
        import torch

        if not torch.cuda.is_available():
            # Must be set before triton is first imported.
            os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        return importlib.import_module(f"fireclay_{name}")
    except ImportError as exc:
        raise CLIError(f"fireclay-{name} cannot be imported ({exc}); install it "
                       f"(pip install {'fireclay[cuda]' if name == 'triton' else 'fireclay-cpp'})") from None


def write_folder(program: ir.Program, generator: str, folder: str) -> list[str]:
    """Compile ``program`` (aten or loops dialect) with ``generator`` and write the runnable folder."""
    import fireclay_loops

    package = code_generator(generator)
    compiled = package.compile_program(program)
    scheduled = compiled.scheduled
    os.makedirs(folder, exist_ok=True)
    paths = compiled.dump(folder)
    program_path = os.path.join(folder, PROGRAM)
    ir.save(fireclay_loops.to_program(scheduled), program_path)  # keeps weights and input kinds
    manifest = {"generator": generator, "program": PROGRAM,
                "files": {os.path.basename(p): _digest(p) for p in paths}}
    manifest_path = os.path.join(folder, MANIFEST)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    weights = weights_path(program_path)
    extra = [weights] if os.path.exists(weights) else []
    return [*paths, program_path, *extra, manifest_path]


def read_folder(folder: str) -> tuple[ir.Program, str, dict[str, str]]:
    """The program, its code generator and the recorded digests of a folder made by write_folder."""
    manifest_path = os.path.join(folder, MANIFEST)
    if not os.path.exists(manifest_path):
        raise CLIError(f"{folder} is a folder without {MANIFEST}; `fireclay run` takes a program file or a folder "
                       "written by `fireclay cpp` or `fireclay triton`")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
        generator, program_name, files = manifest["generator"], manifest["program"], dict(manifest["files"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CLIError(f"{manifest_path} is not readable ({type(exc).__name__}: {exc})") from None
    if generator not in GENERATORS:
        raise CLIError(f"{manifest_path} names code generator {generator!r}; known: {', '.join(GENERATORS)}")
    if os.path.basename(program_name) != program_name:
        raise CLIError(f"{manifest_path}: the program must be a file of the folder, not {program_name!r}")
    import fireclay_loops  # noqa: F401  (registers the loops dialect)
    from fireclay.cli.commands import load_program

    return load_program(os.path.join(folder, program_name)), generator, files


def run_folder(args: argparse.Namespace) -> int:
    from fireclay.cli.inputs import inputs_for, save_tensors, summarize

    program, generator, files = read_folder(args.file)
    package = code_generator(generator)
    compiled = package.compile_program(program)
    for name, text in compiled.source_files().items():
        path = os.path.join(args.file, name)
        if name in files and os.path.exists(path) and _digest(path) != hashlib.sha256(text.encode()).hexdigest():
            print(f"fireclay: {os.path.join(args.file, name)} differs from what fireclay-{generator} generates for "
                  f"{PROGRAM} (edited by hand, or another version made it); running the program as generated now",
                  file=sys.stderr)
    values = inputs_for(program, args.inputs, args.seed)
    outputs = compiled(*values)  # the user inputs: the weights are bound from the program
    for i, value in enumerate(values):
        print(summarize(f"input {i}", value))
    for i, value in enumerate(outputs):
        print(summarize(f"output {i}", value, full=args.print_values))
    if args.save_outputs:
        save_tensors(args.save_outputs, list(outputs), "out")
        print(f"wrote {args.save_outputs}")
    return 0


def capture_target(args: argparse.Namespace) -> int:
    """``fireclay capture SCRIPT.py:FN``: run the script's top level, capture FN on the example
    inputs in one graph and save the torch-dialect program (weights beside it)."""
    import torch

    from fireclay.cli.inputs import parse_input
    from fireclay_capture import CaptureError, capture

    script, sep, name = args.target.rpartition(":")
    if not sep or not script or not name:
        raise CLIError(f"expected SCRIPT.py:FUNCTION, got {args.target!r}")
    if not os.path.isfile(script):
        raise CLIError(f"no such file: {script}")
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        namespace = runpy.run_path(script, run_name="__fireclay_capture__")
    finally:
        sys.path.pop(0)
    target: Any = namespace
    for part in name.split("."):
        target = target.get(part) if isinstance(target, dict) else getattr(target, part, None)
        if target is None:
            raise CLIError(f"{script} defines no {name!r} at its top level")
    if isinstance(target, type) and issubclass(target, torch.nn.Module):
        try:
            target = target()
        except TypeError as exc:
            raise CLIError(f"{name} is an nn.Module class that needs arguments ({exc}); create an instance at the "
                           f"top level of {script} and name that instead") from None
    if not callable(target):
        raise CLIError(f"{script}:{name} is a {type(target).__name__}, not a function or an nn.Module")
    generator = torch.Generator().manual_seed(args.seed)
    values = [v for spec in args.example_inputs for v in parse_input(spec, generator)]
    programs: list[ir.Program] = []

    def keep(program: ir.Program, example_inputs: list) -> Any:
        from fireclay_capture.backends import eager

        programs.append(program)
        return eager(program, example_inputs)

    captured = capture(target, backend=keep, fullgraph=True, dynamic=True if args.dynamic else None)
    try:
        captured(*values)
    except CaptureError as exc:
        raise CLIError(f"{script}:{name} does not capture in one graph: {exc}") from None
    except TypeError as exc:
        if not programs:
            raise CLIError(f"calling {name} with {len(values)} example input(s) failed: {exc}") from None
        raise
    output = args.output or f"{name.rpartition('.')[2]}.fcir.json"
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise CLIError(f"cannot write {output}: folder {folder} does not exist")
    ir.save(programs[-1], output)
    nodes = len(programs[-1].main.nodes)
    print(f"captured {name} ({nodes} nodes, {len(programs[-1].weights)} weights)")
    print(f"wrote {output}")
    return 0

