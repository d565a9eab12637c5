"""Write the generated kernel and wrapper source of a fixed set of programs into a folder, one
file per case, so that two trees can be compared with ``diff -r``: a change to the code
generators that should not change their output is checked by dumping before and after.

    python scripts/dump_generated.py OUT [--only optable|models]

The programs: every case of fireclay-loops' op table (one program per case), and the aten
graphs of the quick benchmark suite's models (forward for inference; forward and backward
for a training step; small preset, captured on the CPU). Each program is scheduled once and
rendered by fireclay-cpp (planned for 8 threads) and by fireclay-triton (for a GPU and for
Triton's interpreter); neither is compiled, so no compiler or GPU is needed. The Triton text of
the model graphs is rendered from their CPU graphs (the graphs a CUDA device would give differ
only in device metadata).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import sys
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOPS_TESTS = os.path.join(ROOT, "packages", "fireclay-loops", "tests")
QUICK = ["bert", "mlp", "cnn_bn", "transformer_block", "layernorm", "softmax"]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


TARGETS = ("cpp", "triton")


def render(scheduled, out: str, stem: str) -> None:
    """The C++ and Triton text of one scheduled program, into ``out/stem.*``."""

    def write(suffix: str, make) -> None:
        try:
            text = make()
        except Exception as e:  # the error is part of the output: it must not change either
            text = f"error: {type(e).__name__}: {e}\n"
        with open(os.path.join(out, f"{stem}.{suffix}"), "w") as f:
            f.write(text)

    def cpp() -> str:
        import fireclay_cpp
        from fireclay_cpp import runtime as cpp_runtime
        from fireclay_cpp.api import generate_kernels as cpp_kernels
        from fireclay_cpp.wrapper_codegen import ExternCalls, generate_wrapper

        cfg = dataclasses.replace(fireclay_cpp.config, threads=8)
        kernels = cpp_kernels(scheduled, cfg)
        externs = ExternCalls(cpp_runtime.returns_one_tensor, True, 1 << 20, cpp_runtime.may_alias_argument)
        wrapper = generate_wrapper(scheduled, {k.name: (k.buffers, k.symbols) for k in kernels},
                                   {k.name: 0 for k in kernels}, cpp_runtime.out_argument, externs)
        parts = [k.source + f"// accumulators: {k.accumulators}\n" for k in kernels]
        parts += [r.source for r in wrapper.runs]
        return "\n".join(parts) + "\n# wrapper\n" + wrapper.text

    def triton(interpret: bool):
        def make() -> str:
            import fireclay_triton
            from fireclay_triton.api import generate_kernels as triton_kernels
            from fireclay_triton.wrapper_codegen import generate_wrapper as triton_wrapper

            tcfg = dataclasses.replace(fireclay_triton.config)
            kernels = triton_kernels(scheduled, tcfg, interpret=interpret)
            parts = [f"# {k.name} {k.function} kind={k.kind} numel={k.numel} rnumel={k.rnumel} "
                     f"index64={k.index64} columns={k.columns} partials={k.partials} "
                     f"buffers={k.buffers} symbols={k.symbols}\n{k.source}" for k in kernels]
            wrapper = triton_wrapper(scheduled, {k.name: k for k in kernels})
            return "\n".join(parts) + "\n# wrapper\n" + wrapper.text
        return make

    if "cpp" in TARGETS:
        write("cpp", cpp)
    if "triton" in TARGETS:
        write("triton.py", triton(False))
        write("triton_interpret.py", triton(True))


def dump_op_table(out: str) -> None:
    sys.path.insert(0, LOOPS_TESTS)
    from aten_builder import AtenBuilder, T

    from fireclay_loops import lower, schedule

    spec = importlib.util.spec_from_file_location("fireclay_loops_op_table", os.path.join(LOOPS_TESTS, "test_op_table.py"))
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    for n, p in enumerate(table.CASES):
        op, args, kwargs = p.values[:3]
        stem = f"optable_{n:03d}_{_safe(p.id)}"
        gen = torch.Generator().manual_seed(0)
        b = AtenBuilder()
        count = [0]

        def bind(a, b=b, gen=gen, count=count):
            if isinstance(a, T):
                count[0] += 1
                return b.input(a.make(gen), f"x{count[0]}")
            if isinstance(a, list):
                return [bind(x) for x in a]
            return a

        try:
            res = b.call(op, *[bind(a) for a in args], **kwargs)
            scheduled = schedule(lower(b.output(*(res if isinstance(res, tuple) else (res,)))))
        except Exception as e:
            with open(os.path.join(out, stem + ".error"), "w") as f:
                f.write(f"{type(e).__name__}: {e}\n")
            continue
        render(scheduled, out, stem)


def dump_models(out: str) -> None:
    sys.path.insert(0, ROOT)
    import fireclay
    from benchmarks.models import get_model
    from fireclay_autograd import aot_backend, interpreter_backend
    from fireclay_loops import lower, schedule

    for name in QUICK:
        for mode in ("inference", "training"):
            graphs: list = []

            def record(program, example_inputs, graphs=graphs):
                graphs.append(schedule(lower(program)))
                return interpreter_backend(program, example_inputs)

            try:
                torch.manual_seed(0)
                built = get_model(name).build("small")
                module = built.module.train(mode == "training")
                inputs = built.inputs(0)
                compiled = fireclay.compile(module, backend=aot_backend(record, record))
                if mode == "training":
                    result = compiled(*inputs.args, **inputs.kwargs)
                    flat = [t for t in torch.utils._pytree.tree_leaves(result)
                            if isinstance(t, torch.Tensor) and t.requires_grad]
                    sum(t.float().sum() for t in flat).backward()
                else:
                    with torch.no_grad():
                        compiled(*inputs.args, **inputs.kwargs)
            except Exception:
                with open(os.path.join(out, f"model_{name}_{mode}.error"), "w") as f:
                    f.write(traceback.format_exc(limit=3))
            for i, scheduled in enumerate(graphs):
                render(scheduled, out, f"model_{name}_{mode}_{i}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--only", choices=("optable", "models"))
    parser.add_argument("--targets", default="cpp,triton", help="comma-separated: cpp, triton")
    args = parser.parse_args()
    global TARGETS
    TARGETS = tuple(args.targets.split(","))
    os.makedirs(args.out, exist_ok=True)
    if args.only != "models":
        dump_op_table(args.out)
    if args.only != "optable":
        dump_models(args.out)


if __name__ == "__main__":
    main()
