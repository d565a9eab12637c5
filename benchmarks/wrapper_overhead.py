"""The host's cost of one call of fireclay-triton's compiled programs, measured without a GPU.

A GPU program's call is Python: the generated wrapper binds sizes, allocates buffers, makes views,
calls the extern ops and launches each kernel through the CUDA driver. On a GPU host that work
decides the wall time of small and medium programs. Here the programs a model compiles to are
generated for the GPU (not Triton's interpreter), and the driver is replaced by a stand-in: every
kernel "loads" without a binary and every launch is a foreign call into a C function that returns
at once (built here with the system C compiler; a Python function when there is none). Tensors are
CPU tensors, so extern ops (matmuls, attention) run for real, on tiny inputs.

    python -m benchmarks.wrapper_overhead --models bert,llama --calls 2000
    python -m benchmarks.wrapper_overhead --compare-workspace --models llama --mode training --dtype bfloat16

Prints per model: the compiled programs' kernel launches and views per call, the microseconds of
one call of the programs (median over repeats), of one kernel launch (the launches of one call
recorded, then replayed as the wrapper makes them), and of the whole compiled model's call
(guards, runtime wrapper and the programs).

``--compare-workspace`` instead compiles each program of the model's call twice, with
fireclay-triton's kept workspace (``keep_workspace``) off and on, and times the two sets of
programs taking turns sample by sample (``--clock cpu``, the default: the thread's CPU time), with
each wrapper's work per call counted from its text: new tensors, kept storages given their bytes
(``resize_``, a fraction of a new tensor's cost), views (strided and typed views, transposes),
library calls, launches. In training the
programs are the forward and the backward (a backward's inputs are copies taken at its first call:
it overwrites the saved tensors it was given). Extern ops run for real on the CPU, so a matmul's
time here includes its arithmetic on tiny inputs (bf16 matmuls are slow on CPUs).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)  # programs for the GPU, launched through the stand-in
os.environ.setdefault("FIRECLAY_TRITON_AUTOTUNE", "0")  # no GPU to time configs on
os.environ.setdefault("FIRECLAY_COMPILE_CACHE", "0")

import torch  # noqa: E402

from benchmarks.call_overhead import interleaved  # noqa: E402

NOOP_C = """
int noop_launch(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                unsigned shared, void* stream, void** params, void** extra) { return 0; }
"""


def _noop_library():
    """A C function with ``cuLaunchKernel``'s signature that does nothing, or None without a
    compiler."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    folder = tempfile.mkdtemp(prefix="fireclay-noop-launch-")
    src, lib = os.path.join(folder, "noop.c"), os.path.join(folder, "noop.so")
    with open(src, "w") as f:
        f.write(NOOP_C)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", lib, src], check=True)
    return lib


class StandInDriver:
    """What fireclay_triton.cuda_launch asks of the CUDA driver, answering success at once."""

    def __init__(self):
        p, u = ctypes.c_void_p, ctypes.c_uint
        lib = _noop_library()
        if lib is not None:
            held = ctypes.PyDLL(lib)
            self.launch = held["noop_launch"]
            self.launch.argtypes = [p, u, u, u, u, u, u, u, p, p, p]
            self.launch.restype = ctypes.c_int
            self.launch_packed = held["noop_launch"]  # no argtypes: takes ctypes values as they are
            self.launch_packed.restype = ctypes.c_int
        else:
            self.launch = self.launch_packed = lambda *args: 0
        self.foreign = lib is not None

    def __getattr__(self, name):  # the loading calls: succeed without doing anything
        return lambda *args: 0

    def check(self, result, what):
        if result:
            raise RuntimeError(f"{what}: {result}")


def install_stand_ins() -> StandInDriver:
    """Replace the driver, the current device and stream, and the kernel store by stand-ins."""
    from fireclay_triton import cuda_launch, runtime

    driver = StandInDriver()
    cuda_launch._DRIVER = driver
    torch.cuda.current_device = lambda: 0
    runtime._raw_stream = lambda device: 0

    def recall(fn, options, key):
        # the signature Triton would compile: a pointer per tensor, integers equal to 1 specialized
        names = list(fn.arg_names)
        signature = []
        for name, spec in zip(names, key[1:]):
            ty = "*fp32" if isinstance(spec, bool) else ("constexpr" if spec == 1 else "i32")
            signature.append((name, ty))
        signature += [(name, "constexpr") for name in names[len(key) - 1:]]
        binary = cuda_launch.KernelBinary("stand_in", 4, 0, b"", tuple(signature), None)
        return True, cuda_launch.load(binary, names, len(key) - 1, 0)

    cuda_launch.recall = recall
    return driver


def compiled_programs(model_name: str, training: bool = False, dtype: str = "float32"):
    """The model compiled by fireclay for the GPU; returns (compiled model, inputs, [(compiled
    program, its inputs)] as the model's call ran them; in training the forward's and the
    backward's, their inputs copied before the call)."""
    import fireclay
    import fireclay_triton
    import fireclay_triton.api as api
    from benchmarks.models import get_model
    from fireclay.backends import builtin

    builtin._targets_gpu = lambda example_inputs: True
    programs = []
    compile_program = api.compile_program

    def compile_in_foreground(*args, **kwargs):
        kwargs["background"] = False
        compiled = compile_program(*args, **kwargs)
        call = compiled._call

        def first(*inputs):
            programs.append((compiled, tuple(x.clone() if training and isinstance(x, torch.Tensor) else x
                                             for x in inputs)))
            compiled._call = call
            return call(*inputs)

        compiled._call = first
        return compiled

    api.compile_program = fireclay_triton.compile_program = compile_in_foreground
    built = get_model(model_name).build("small")
    module = (built.module.train() if training else built.module.eval()).to(getattr(torch, dtype))
    inputs = built.inputs(3, tiny=True)
    compiled = fireclay.compile(module)
    with torch.set_grad_enabled(training):
        out = compiled(*inputs.args, **inputs.kwargs)
        if training:
            (out.logits if hasattr(out, "logits") else out[0]).float().sum().backward()
    return compiled, inputs, programs


def _clock(name: str):
    return time.thread_time if name == "cpu" else time.perf_counter


WORK = {  # what a wrapper line does, by the text that does it
    "new tensors": r"torch\.empty(_strided)?\(",
    "bytes given": r"\.resize_\([1-9]",
    "views": r"\.as_strided\(|\bview\(|\btyped\(|\.t\(\)",
    "library calls": r"\bop_aten_\w+\(|\blinear\(",
    "launches": r"^\s*kernel\d+\(",
}


def work_per_call(programs) -> dict[str, int]:
    """Each kind of work (WORK) the programs' wrappers do per call, from their text: the call's
    own lines (a kept workspace is made once, not per call)."""
    counts = dict.fromkeys(WORK, 0)
    for compiled, _ in programs:
        call = compiled.wrapper_source.split("\ndef new_workspace(")[0]
        for kind, pattern in WORK.items():
            counts[kind] += len(re.findall(pattern, call, re.M))
    return counts


def compare_workspace(name: str, training: bool, dtype: str, calls: int, repeats: int, clock: str) -> None:
    """The model's programs with the kept workspace off and on, interleaved (see the module doc)."""
    from fireclay_triton import Config
    from fireclay_triton.api import compile_program

    _, _, programs = compiled_programs(name, training, dtype)
    variants = {}
    for label, keep in (("off", False), ("on", True)):
        variants[label] = [(compile_program(p.scheduled, cfg=Config(keep_workspace=keep, autotune=False)), inputs)
                           for p, inputs in programs]

    def runner(progs):
        def run():
            for compiled, inputs in progs:
                compiled(*inputs)
        return run

    with torch.no_grad():
        us = interleaved({label: runner(progs) for label, progs in variants.items()}, calls, repeats, _clock(clock))
    mode = "training" if training else "inference"
    work = {label: work_per_call(progs) for label, progs in variants.items()}
    print(f"{name:8s} {mode:9s} {dtype:8s} {us['off']:9.1f} {us['on']:9.1f} {us['on'] - us['off']:+8.1f} "
          + "  ".join(f"{work['off'][k]:4d}->{work['on'][k]:<4d}" for k in WORK))


def per_call_us(fn, calls: int, repeats: int = 7) -> float:
    for _ in range(min(calls, 50)):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def count_calls(programs) -> tuple[int, int]:
    """(kernel launches, views) per call of the programs, from their wrappers' text."""
    launches = views = 0
    for compiled, _ in programs:
        text = compiled.wrapper_source
        launches += sum(text.count(f"{name}(") for name in compiled.launchers)
        views += text.count("view(") + text.count(".as_strided(")
    return launches, views


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bert,llama")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--compare-workspace", action="store_true",
                        help="the programs with fireclay-triton's kept workspace off and on, interleaved")
    parser.add_argument("--mode", choices=["inference", "training"], default="inference",
                        help="with --compare-workspace: the forward, or the forward and the backward")
    parser.add_argument("--dtype", default="float32", help="with --compare-workspace: the model's dtype")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    driver = install_stand_ins()
    print(f"launch stand-in: {'a C function through ctypes' if driver.foreign else 'a Python function'}")
    if args.compare_workspace:
        print(f"microseconds per call of the programs ({args.clock} clock, median of {args.repeats}); "
              "work per call, workspace off->on")
        print(f"{'model':8s} {'mode':9s} {'dtype':8s} {'off us':>9s} {'on us':>9s} {'change':>8s} "
              + "  ".join(f"{k:>10s}" for k in WORK))
        for name in args.models.split(","):
            compare_workspace(name, args.mode == "training", args.dtype, args.calls, args.repeats, args.clock)
        return
    print(f"{'model':10s} {'launches':>8s} {'views':>6s} {'programs us':>12s} {'per launch us':>14s} "
          f"{'model call us':>14s}")
    for name in args.models.split(","):
        launches, views, total, launching, model = measure(name, args.calls)
        print(f"{name:10s} {launches:8d} {views:6d} {total:12.1f} {launching:14.2f} {model:14.1f}")


def measure(name: str, calls: int) -> tuple[int, int, float, float, float]:
    """(launches, views, programs' call us, us per launch, the compiled model's call us)."""
    compiled, inputs, programs = compiled_programs(name)
    launches, views = count_calls(programs)

    def run_programs():
        for program, program_inputs in programs:
            program(*program_inputs)

    def run_model():
        compiled(*inputs.args, **inputs.kwargs)

    with torch.no_grad():
        run_programs()  # every launch bound (where the launchers bind)
        recorded = record_launches(programs, run_programs)

        def replay():
            for launch, args, kwargs in recorded:
                launch(*args, **kwargs)

        total = per_call_us(run_programs, calls)
        model = per_call_us(run_model, calls)
        launching = per_call_us(replay, calls) / max(len(recorded), 1)
    return launches, views, total, launching, model


def record_launches(programs, run) -> list[tuple]:
    """(what the wrapper called, its arguments) of every kernel launch of one ``run``."""
    recorded, saved = [], []
    for program, _ in programs:
        namespace = program._call.__globals__
        for name in program.launchers:
            launch = namespace[name]
            saved.append((namespace, name, launch))

            def record(*args, _launch=launch, **kwargs):
                recorded.append((_launch, args, kwargs))
                return _launch(*args, **kwargs)

            namespace[name] = record
    run()
    for namespace, name, launch in saved:
        namespace[name] = launch
    return recorded


if __name__ == "__main__":
    main()
