"""Seconds per compiler stage before any kernel is compiled, on the CPU.

    python packages/fireclay/benchmarks/stage_times.py [--models bert] [--preset large]
        [--modes inference,training] [--runs 3] [--profile out.prof] [--dump folder]

Builds a model of the benchmark suite (``benchmarks/models``: random weights from a config, no
download), compiles it with ``fireclay.compile(..., fullgraph=True)`` and times each stage that
runs before the Triton compiler:

- capture: bytecode capture up to the moment the backend receives the torch-dialect program;
- autograd: aten trace (decomposition happens inside it, op by op), functionalization, and
  for training the min-cut partition;
- loops: lowering and scheduling of each aten graph (forward and backward for training);
- triton: fireclay-triton's kernel sources (``generate_kernels(..., interpret=False)``) and
  its wrapper (``generate_wrapper``), which need no GPU.

Nothing of the model runs compiled: the code generation spies record what they were given and
stop the call once the last graph is generated, so a large preset costs the compile stages
only (and the trace's fake tensors). The compile cache is off (``FIRECLAY_COMPILE_CACHE=0``).
``--dump`` writes every stage's printed artifact (aten programs, scheduled programs, kernel
sources, wrappers) so that two builds of the compiler can be compared text for text;
``--profile`` writes a cProfile of the whole run. Both measure once, in this process; otherwise
each model and mode is measured in ``--runs`` fresh processes (each a cold compile) and the
table gives the minimum and the median per stage (other work on the machine inflates both).
Stages are timed in CPU seconds of the process (``time.process_time``); the total also in wall
seconds. Garbage collection pauses are counted inside the stages they interrupt and also
reported on their own.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

os.environ["FIRECLAY_COMPILE_CACHE"] = "0"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))  # the repository: benchmarks/ holds the models


def _clock() -> float:
    """CPU seconds of this process: the stages are single-threaded Python, and CPU time is
    far less disturbed than wall time by other work on a shared machine."""
    return time.process_time()


class _Stop(Exception):
    """Raised by the last code generation spy: the compile is measured, the model need not run."""


class GcClock:
    """Seconds the cyclic garbage collector ran while enabled (it pauses whatever stage
    allocates when a collection falls due), and collections per generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = _clock()
        else:
            self.seconds += _clock() - self._start
            self.collections[info["generation"]] += 1

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self._callback)


class StageClock:
    """Seconds per stage name; :meth:`wrap` times every call of a function (nested stages are
    counted in both, so the report subtracts the inner ones where it says so)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._patched: list[tuple[Any, str, Any]] = []

    @contextlib.contextmanager
    def stage(self, name: str):
        start = _clock()
        try:
            yield
        finally:
            self.seconds[name] += _clock() - start

    def wrap(self, module: Any, attr: str, name: str) -> None:
        original = getattr(module, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.stage(name):
                return original(*args, **kwargs)

        self._patched.append((module, attr, original))
        setattr(module, attr, timed)

    def unwrap(self) -> None:
        for module, attr, original in reversed(self._patched):
            setattr(module, attr, original)
        self._patched.clear()


def _spy_codegen(clock: StageClock, artifacts: list[tuple[str, str]] | None, last: set[str]):
    """A forward/backward compiler that lowers, schedules and generates Triton source for one
    aten graph, records the printed artifacts (when ``artifacts`` is a list; printing is not
    timed), and stops the call after the ``last`` one."""
    import fireclay_loops
    from fireclay_ir import format_program
    from fireclay_triton.api import generate_kernels
    from fireclay_triton.wrapper_codegen import generate_wrapper

    def codegen(role: str):
        def compile_graph(program: Any, example_inputs: list) -> Any:
            with clock.stage("loops: lower"):
                loop_program = fireclay_loops.lower(program)
            with clock.stage("loops: schedule"):
                scheduled = fireclay_loops.schedule(loop_program)
            with clock.stage("triton: kernels"):
                kernels = generate_kernels(scheduled, interpret=False)
            with clock.stage("triton: wrapper"):
                wrapper = generate_wrapper(scheduled, {k.name: k for k in kernels})
            if artifacts is not None:
                artifacts.append((f"{role}.aten.txt", format_program(program)))
                artifacts.append((f"{role}.scheduled.txt", str(scheduled)))
                artifacts.append((f"{role}.kernels.py", "\n\n".join(k.source for k in kernels)))
                artifacts.append((f"{role}.wrapper.py", wrapper.text))
            clock.seconds[f"kernels: {role}"] = len(kernels)
            if role in last:
                raise _Stop
            return lambda *args: ()

        return compile_graph

    return codegen


def measure(model: str, preset: str, mode: str, profile: cProfile.Profile | None = None,
            dump: str | None = None) -> dict[str, float]:
    """Seconds per stage of one cold compile of ``model`` in ``mode`` (inference or training)."""
    sys.path.insert(0, ROOT)
    import fireclay
    import fireclay_autograd.api as autograd_api
    import fireclay_autograd.joint as joint
    from benchmarks.measure import Step
    from benchmarks.models import get_model
    from fireclay_autograd import compile_program

    fireclay.reset()
    built = get_model(model).build(preset)
    inputs = built.inputs(1, "cpu")
    clock = StageClock()
    clock.wrap(autograd_api, "trace_forward", "autograd: trace (with decomposition) + functionalize")
    clock.wrap(autograd_api, "trace_joint", "autograd: trace (with decomposition) + functionalize")
    clock.wrap(joint, "functionalize", "autograd: functionalize")
    clock.wrap(autograd_api, "partition", "autograd: partition")
    artifacts: list[tuple[str, str]] | None = [] if dump else None
    spy = _spy_codegen(clock, artifacts, {"inference", "backward"})
    entered: list[float] = []

    def backend(program: Any, example_inputs: list) -> Any:
        entered.append(_clock())
        if artifacts is not None:
            artifacts.append(("torch.txt", _format(program)))
        return compile_program(program, example_inputs, fw_compiler=spy("forward"), bw_compiler=spy("backward"),
                               inference_compiler=spy("inference"))

    if mode == "training":
        _compile_backward_with_forward(clock)
    compiled = fireclay.compile(built.module, backend=backend, fullgraph=True)
    step = Step(compiled, built.module, mode)
    if profile is not None:
        profile.enable()
    start, wall = _clock(), time.perf_counter()
    try:
        with GcClock() as collector:
            step(inputs)
    except _Stop:
        pass
    else:
        raise RuntimeError("the compiled call finished without reaching the code generation spies")
    finally:
        total, wall = _clock() - start, time.perf_counter() - wall
        if profile is not None:
            profile.disable()
        clock.unwrap()
    if artifacts is not None:
        folder = os.path.join(dump, f"{model}-{preset}-{mode}")
        os.makedirs(folder, exist_ok=True)
        for name, text in artifacts:
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
    seconds = dict(clock.seconds)
    seconds["capture"] = entered[0] - start
    seconds["total"] = total
    seconds["total, wall clock"] = wall
    seconds["garbage collection (within the stages)"] = collector.seconds
    return seconds


def _compile_backward_with_forward(clock: StageClock) -> None:
    """A backward compiled lazily, at its first call (to see the layouts its inputs arrive in),
    would need the forward to run first; compile it right after the forward instead, at the
    traced layouts, so that the measured call reaches both code generation spies."""
    import fireclay_autograd.api as autograd_api

    cls = autograd_api.CompiledProgram
    original = cls._compile_training

    def compile_training(self: Any, inputs: list) -> Any:
        runtime = original(self, inputs)
        backward = runtime.backward
        if all(hasattr(backward, a) for a in ("compiler", "program", "examples")):
            backward.compiler(backward.program, backward.examples(backward.program))
        return runtime

    clock._patched.append((cls, "_compile_training", original))
    cls._compile_training = compile_training


def _format(program: Any) -> str:
    from fireclay_ir import format_program

    return format_program(program)


def stage_rows(seconds: dict[str, float]) -> dict[str, float]:
    """The reported stages (inner stages taken out of the ones that contain them), the kernel
    counts and the total, from what :func:`measure` recorded."""
    trace = seconds.get("autograd: trace (with decomposition) + functionalize", 0.0)
    functionalize = seconds.get("autograd: functionalize", 0.0)
    rows = {"capture": seconds["capture"],
            "autograd: trace (with decomposition)": trace - functionalize,
            "autograd: functionalize": functionalize}
    for name in ("autograd: partition", "loops: lower", "loops: schedule", "triton: kernels", "triton: wrapper"):
        rows[name] = seconds.get(name, 0.0)
    rows["other (binding, runtime, backward examples)"] = seconds["total"] - sum(rows.values())
    rows["total"] = seconds["total"]
    rows["total, wall clock"] = seconds["total, wall clock"]
    rows["garbage collection (within the stages)"] = seconds["garbage collection (within the stages)"]
    rows.update({k: v for k, v in seconds.items() if k.startswith("kernels: ")})
    return rows


def _child(model: str, preset: str, mode: str) -> None:
    print("RESULT " + json.dumps(stage_rows(measure(model, preset, mode))), flush=True)


def _in_fresh_process(model: str, preset: str, mode: str) -> dict[str, float]:
    env = dict(os.environ, FIRECLAY_COMPILE_CACHE="0")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", f"{model}:{preset}:{mode}"],
                          capture_output=True, text=True, env=env)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{model} {mode}: {done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def print_table(model: str, preset: str, mode: str, runs: list[dict[str, float]]) -> None:
    kernels = ", ".join(f"{k.split()[1]} {int(v)}" for k, v in runs[0].items() if k.startswith("kernels: "))
    print(f"\n{model} ({preset}, {mode}), {len(runs)} fresh process(es); kernels: {kernels}")
    print("| stage | min s | median s |")
    print("| --- | --- | --- |")
    for name in runs[0]:
        if not name.startswith("kernels: "):
            values = [r[name] for r in runs]
            print(f"| {name} | {min(values):.3f} | {statistics.median(values):.3f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert")
    parser.add_argument("--preset", default="large")
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per model and mode")
    parser.add_argument("--profile", help="measure once in this process and write a cProfile to this file")
    parser.add_argument("--dump", help="measure once in this process and write each stage's printed artifacts "
                                       "under this folder")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child.split(":"))
        return 0
    profile = cProfile.Profile() if args.profile else None
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            if profile is not None or args.dump:
                runs = [stage_rows(measure(model, args.preset, mode, profile, args.dump))]
            else:
                runs = [_in_fresh_process(model, args.preset, mode) for _ in range(args.runs)]
            print_table(model, args.preset, mode, runs)
    if profile is not None:
        profile.dump_stats(args.profile)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
