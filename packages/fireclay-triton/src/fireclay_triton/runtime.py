"""What a generated wrapper runs with: tensor helpers, kernel launchers, the compiled program."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import threading
from collections.abc import Callable
from typing import Any

import torch

from fireclay_ir.files import write_atomic
from fireclay_loops.backend.runtime import CompiledCall, bound_op, input_base
from fireclay_loops.backend.runtime import aten_op as shared_aten_op
from fireclay_loops.backend.runtime import conform as conform  # re-exported for the wrapper
from fireclay_loops.backend.runtime import view as view
from fireclay_loops.cache_dirs import cache_folder_or_private
from fireclay_triton import background, bound_launch, cuda_launch, precompile
from fireclay_triton.autotune import LaunchConfig, TuningCache, candidates, next_pow2, tuning_key
from fireclay_triton.background import BackgroundCompile
from fireclay_triton.config import interpreting
from fireclay_triton.errors import CodegenError, InputError, TritonBackendError
from fireclay_triton.kernel_modules import import_file
from fireclay_triton.precompile import CompileJob, finisher_options, launch_options

_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def as_base(t: Any, name: str, dtype: torch.dtype, size: tuple, stride: tuple, offset: int,
            storage_numel: int) -> torch.Tensor:
    """The input as a base tensor whose ``data_ptr()`` is index 0 of the buffer's layout; a copy
    in that layout when the input's strides or offset differ from the compiled ones."""
    # the common case first, in as few attribute reads as possible: this runs per input per call
    if offset == 0 and t.__class__ in _PLAIN_TENSORS and t.dtype is dtype and t.shape == size and t.stride() == stride:
        return t
    return input_base(t, name, dtype, size, stride, offset, storage_numel, InputError)


def pick_device(*inputs: Any, made_on: str | None = None) -> torch.device:
    """Where the program's buffers go: the device of its first tensor input not on the CPU (index
    tensors may come from the CPU, as eager allows; the program copies them over), else the GPU
    device the program says it makes its tensors on (``made_on``: a graph may take only CPU
    tensors and make CUDA ones), else of its first tensor input; with none, the GPU (or the CPU
    in Triton's interpreter)."""
    first = None
    for t in inputs:
        if isinstance(t, torch.Tensor):
            if t.device.type != "cpu":
                return t.device
            first = t.device if first is None else first
    if made_on is not None and not interpreting():
        return torch.device(made_on)
    if first is not None:
        return first
    if torch.cuda.is_available() and not interpreting():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def typed(mem: torch.Tensor, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """A buffer of ``numel`` elements of ``dtype`` at the start of a byte allocation."""
    return mem[: numel * dtype.itemsize].view(dtype)


def aten_op(name: str) -> Callable:
    """What a wrapper calls for the aten op ``name``: torch's own function where it selects
    this overload (fireclay_loops.backend.runtime.bound_op), else the overload."""
    return bound_op(name) or shared_aten_op(name, TritonBackendError)


MAX_SPLIT = 256  # most chunks of a split reduction (the finisher combines them in one tile row)


def split_shape(cfg: LaunchConfig, numel: int, rnumel: int, sms: int) -> tuple[int, int, int]:
    """A split reduction's chunk count, chunk length and finishing block: enough chunks for
    about four programs per SM (at most ``MAX_SPLIT``; batch norm's 64 channels are one or two
    blocks of outputs), each a whole number of tiles; the finisher's tiles hold at most 2048
    partials."""
    programs = max(1, -(-numel // cfg.XBLOCK))
    nsplit = max(1, min(MAX_SPLIT, -(-4 * sms // programs), -(-rnumel // cfg.RBLOCK)))
    per_split = -(-rnumel // nsplit)
    chunk = -(-per_split // cfg.RBLOCK) * cfg.RBLOCK
    nsplit = -(-rnumel // chunk)
    return nsplit, chunk, max(8, min(64, 2048 // next_pow2(nsplit)))


def load_module(source: str, folder: str):
    """Import generated kernel source from a file named by its hash (Triton's ``@jit`` reads
    source through ``inspect``, so the kernels must live in a real file).

    ``folder`` is used only if it is this user's alone
    (:mod:`fireclay_loops.cache_dirs`; else a private temporary folder), and a file already there
    is imported only if it holds exactly ``source``: anything else is rewritten first."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:32]
    folder = cache_folder_or_private(folder)
    path = os.path.join(folder, f"k{digest}.py")
    if not _holds(path, source):
        write_atomic(path, source)
    return import_file(path, f"fireclay_triton_kernels_{digest}", source), digest


def _holds(path: str, source: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read() == source.encode()
    except OSError:
        return False


def time_ms(fn: Callable[[], None], runs: int = 10) -> float:
    """Milliseconds per run of ``fn`` on the current stream, timed with CUDA events after two
    warm-up runs (which compile). No cache-flush buffer, unlike ``triton.testing.do_bench``:
    its 256 MB scratch allocation would become the program's peak memory on the first call."""
    fn()
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / runs


class DirectLaunch:
    """Launches one ``@triton.jit`` function at one config (constexprs, warps, stages) with as
    little Python per launch as possible.

    ``fn[grid](...)`` binds every argument, computes the specialization key, reads Triton's knobs
    and builds launch metadata on each launch: tens of microseconds, a kernel's whole run time at
    small sizes, and its first use in a process builds Triton's C utilities and a C launcher per
    signature. Here each *specialization* is compiled once (or found compiled ahead, in
    :mod:`fireclay_triton.cuda_launch`'s store), its binary loaded, and every launch is a
    :class:`~fireclay_triton.cuda_launch.CudaKernel` call on torch's current stream. The
    specialization is keyed more finely than Triton keys it: the device, each pointer's 16-byte
    alignment, and each integer's exact value, so a launch that Triton would have compiled
    differently never takes a kept kernel. Kernels the driver call cannot launch alone, launches
    while Triton launch hooks (profilers) are installed, and ``FIRECLAY_TRITON_DIRECT_LAUNCH=0``
    go through ``fn[grid]``.
    """

    def __init__(self, fn: Any, options: tuple, nargs: int):
        self.fn = fn
        self.options = options  # sorted (name, value) pairs
        self.kwargs = dict(options)
        self.nargs = nargs
        # the runtime arguments are exactly the parameters before the constexprs
        self.arg_names = list(getattr(fn, "arg_names", ()))
        constexprs = self.arg_names[nargs:]
        self.kernels: dict[tuple, cuda_launch.CudaKernel | None] = {}
        self.enabled = cuda_launch.enabled() and bool(self.arg_names) and all(n in self.kwargs for n in constexprs)

    def _prepare(self, key: tuple, device: int, args: tuple) -> cuda_launch.CudaKernel | None:
        """The kernel of a new specialization: compiled ahead, else compiled and loaded now."""
        found, kernel = cuda_launch.recall(self.fn, self.options, key)
        if not found:
            compiled = precompile.compile_kernel(self.fn, list(args), self.kwargs, precompile.cuda_target(device))
            kernel = cuda_launch.load(cuda_launch.KernelBinary.of(compiled), self.arg_names, self.nargs, device)
            cuda_launch.remember(self.fn, self.options, key, kernel)
        self.kernels[key] = kernel
        return kernel

    def __call__(self, grid: tuple, args: tuple) -> None:
        if not self.enabled or launch_hooked():
            self.fn[grid](*args, **self.kwargs)
            return
        device = torch.cuda.current_device()
        kernel = self.kernel(device, cuda_launch.launch_key(device, args), args)
        if kernel is None:  # needs Triton's launcher
            self.fn[grid](*args, **self.kwargs)
            return
        kernel(grid[0], grid[1], _raw_stream(device), args)

    def kernel(self, device: int, key: tuple, args: tuple) -> cuda_launch.CudaKernel | None:
        """The loaded kernel of the launch ``key`` with ``args`` (None: it needs Triton's launcher)."""
        kernel = self.kernels.get(key, _MISSING)
        if kernel is _MISSING:
            kernel = self._prepare(key, device, args)
        return kernel


_MISSING = object()
_INTERPRETER_ASSERTS = threading.Lock()  # the interpreter's options are global: one launch at a time


def _public_raw_stream(device: int) -> int:
    return torch.cuda.current_stream(device).cuda_stream


# the current stream's handle, per launch: torch's C getter (what Triton's own launches read)
# costs a fraction of a microsecond; ``torch.cuda.current_stream`` builds a Stream object (several
# microseconds, times every launch of a call). The public one where the getter is missing.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _public_raw_stream


def launch_hooked() -> bool:
    """Whether a Triton launch hook is installed (a hook chain with calls, or a plain callable):
    profilers such as Proton see launches only through Triton's own launcher."""
    from triton import knobs

    runtime = knobs.runtime
    enter, exit_ = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter) or getattr(exit_, "calls", exit_))


def launch_target() -> tuple[int, Any]:
    """What a wrapper's launches of one call run on: (the current device's index, its current
    stream as a ``ctypes.c_void_p``), read once per call (bound_launch.py). (-1, None) where
    launches go through Triton's launcher: ``config.direct_launch`` off, or a launch hook
    installed; a bound launch then hands every launch to its launcher."""
    if not cuda_launch.enabled() or launch_hooked():
        return -1, None
    device = torch.cuda.current_device()
    return device, ctypes.c_void_p(_raw_stream(device))


def interpreted_target() -> tuple[int, Any]:
    """:func:`launch_target` in Triton's interpreter, where there is no device or stream."""
    return -1, None


class Launcher:
    """Launches one kernel: picks its config (heuristic, or autotuned once per size bucket and
    cached on disk), computes the grid, and binds the launch (:mod:`fireclay_triton.bound_launch`).

    A wrapper calls it as ``launcher(dev, stream, *buffers, *ints)``: ``buffers`` pointer arguments
    (``arity[0]``), then the kernel's size symbols (``arity[1]``), then its number of points and
    reduction points where ``sizes`` does not give them (a program's constant sizes are bound
    here, not passed). Once bound, the wrapper's namespace (``namespace``, set by whoever executes
    the wrapper; None: never rebound) holds the bound launch under the kernel's ``name``."""

    def __init__(self, fn: Any, name: str, kind: str, source_hash: str, autotune: bool, interpret: bool,
                 cache: TuningCache, columns: bool = False, max_autotune: bool = False, finisher: Any = None,
                 partials: int = 0, checks: list | None = None, arity: tuple[int, int] = (0, 0),
                 sizes: tuple[int | None, int | None] = (None, None)):
        self.fn = fn
        self.arity = arity
        self.sizes = sizes  # (numel, rnumel) when constants of the program, else None (passed)
        self.namespace: dict[str, Any] | None = None
        self._bound: dict[tuple, Callable] = {}
        self.checks = checks or []  # (CheckSite, its assert message) of each check of the kernel
        self.finisher = finisher  # split kernels: adds the partials
        self.partials = partials
        self._sms = 0
        self.name = name
        self.kind = kind
        self.columns = columns
        self.max_autotune = max_autotune
        self.source_hash = source_hash
        self.autotune = autotune
        self.interpret = interpret
        self.cache = cache
        self.chosen: dict[tuple[int, int], LaunchConfig] = {}
        self._direct: dict[tuple, DirectLaunch] = {}

    def _grid(self, cfg: LaunchConfig, numel: int, rnumel: int) -> tuple[int, int]:
        programs = max(1, -(-numel // cfg.XBLOCK))
        return (programs, max(1, -(-rnumel // cfg.RBLOCK)) if self.kind == "tiled" else 1)

    def _tail(self, numel: int, rnumel: int) -> tuple:
        """The size arguments after the kernel's own (a pointwise kernel has no ``rnumel``)."""
        return (numel,) if self.kind == "pointwise" else (numel, rnumel)

    def _run(self, cfg: LaunchConfig, args: tuple, numel: int, rnumel: int) -> None:
        grid = self._grid(cfg, numel, rnumel)
        if self.kind == "split":
            self._run_split(cfg, args, numel, rnumel, grid[0])
            return
        options = launch_options(cfg, self.kind, bool(self.checks))
        self._launch(self.fn, grid, args + self._tail(numel, rnumel), options)

    def _run_split(self, cfg: LaunchConfig, args: tuple, numel: int, rnumel: int, programs: int) -> None:
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        if not self._sms:
            self._sms = 8 if self.interpret else torch.cuda.get_device_properties(device).multi_processor_count
        nsplit, chunk, fx = split_shape(cfg, numel, rnumel, self._sms)
        ws = torch.empty(self.partials * nsplit * numel, dtype=torch.float32, device=device)
        options = launch_options(cfg, self.kind, bool(self.checks))
        self._launch(self.fn, (programs, nsplit), (*args, ws, chunk, numel, rnumel), options)
        self._launch(self.finisher, (-(-numel // fx), 1), (*args, ws, nsplit, numel), finisher_options(nsplit, fx))

    def _direct_launch(self, fn: Any, options: tuple, nargs: int) -> DirectLaunch:
        launch = self._direct.get((fn, options))
        if launch is None:
            launch = self._direct[(fn, options)] = DirectLaunch(fn, options, nargs)
        return launch

    def _launch(self, fn: Any, grid: tuple, args: tuple, options: tuple) -> None:
        """One launch; ``options``: sorted (name, value) pairs of constexprs, warps and stages."""
        if self.interpret:
            if self.checks:
                self._interpreted_with_checks(fn, grid, args, options)
            else:
                fn[grid](*args, **dict(options))
            return
        self._direct_launch(fn, options, len(args))(grid, args)

    def _interpreted_with_checks(self, fn: Any, grid: tuple, args: tuple, options: tuple) -> None:
        """A launch in Triton's interpreter with its asserts on (its builder ignores a launch's
        ``debug`` option); a failed check raises its error, as the C++ backend's call does."""
        from triton.runtime import interpreter
        from triton.runtime.errors import InterpreterError

        with _INTERPRETER_ASSERTS:
            builder = interpreter.interpreter_builder
            saved = builder.options
            builder.options = dataclasses.replace(saved, debug=True, sanitize_overflow=False)
            try:
                fn[grid](*args, **dict(options))
            except InterpreterError as error:
                for check, message in self.checks:
                    if message in str(error):  # (the interpreter does not tell the value)
                        raise type(check.error())(message) from error
                raise
            finally:
                builder.options = saved

    def planned_configs(self, numel: int, rnumel: int, device_name: str | None) -> list[LaunchConfig]:
        """The configs the first call at these sizes launches: the one already chosen or cached on
        disk (``device_name`` None: the disk cache is not consulted), else every candidate the
        autotuner will time, else the heuristic choice."""
        found = self.chosen.get((numel, rnumel))
        if found is not None:
            return [found]
        options = candidates(self.kind, numel, rnumel, self.interpret, self.columns, self.max_autotune)
        if not (self.autotune and len(options) > 1):
            return options[:1]
        if device_name is not None:
            cached = self.cache.get(self._key(numel, rnumel, device_name))
            if cached is not None:
                return [cached]
        return options

    def compile_jobs(self, args: tuple, numel: int, rnumel: int, device_name: str | None,
                     sms: int) -> list[CompileJob]:
        """Every launch the first call at these sizes makes, as jobs to compile ahead. ``args``:
        the kernel's own arguments as ``CompileJob.args`` describes them."""
        if numel == 0:
            return []
        jobs = []
        for cfg in self.planned_configs(numel, rnumel, device_name):
            opts = launch_options(cfg, self.kind, bool(self.checks))
            if self.kind == "pointwise":
                jobs.append(CompileJob(self.name, self.fn, (*args, numel), opts))
            elif self.kind != "split":
                jobs.append(CompileJob(self.name, self.fn, (*args, numel, rnumel), opts))
            else:
                nsplit, chunk, fx = split_shape(cfg, numel, rnumel, sms)
                ws = torch.float32
                jobs.append(CompileJob(self.name, self.fn, (*args, ws, chunk, numel, rnumel), opts))
                jobs.append(CompileJob(self.name + "_finish", self.finisher, (*args, ws, nsplit, numel),
                                       finisher_options(nsplit, fx)))
        return jobs

    def _key(self, numel: int, rnumel: int, device_name: str) -> str:
        # the function's name is a digest of its text: kernels sharing a function share their choice
        return tuning_key(self.source_hash + ("/max" if self.max_autotune else ""), numel, rnumel, device_name)

    def config_for(self, args: tuple, numel: int, rnumel: int) -> LaunchConfig:
        found = self.chosen.get((numel, rnumel))
        if found is not None:
            return found
        options = candidates(self.kind, numel, rnumel, self.interpret, self.columns, self.max_autotune)
        cfg = options[0]
        if self.autotune and len(options) > 1:
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cuda"))
            key = self._key(numel, rnumel, torch.cuda.get_device_name(device))
            cfg = self.cache.get(key) or self._tune(options, args, numel, rnumel, key)
        self.chosen[(numel, rnumel)] = cfg
        return cfg

    def _tune(self, options: list[LaunchConfig], args: tuple, numel: int, rnumel: int, key: str) -> LaunchConfig:
        # Kernels never write a buffer they read (the memory plan reuses only dead buffers), so
        # running one repeatedly is harmless.
        times = []
        for cfg in options:
            try:
                times.append((time_ms(lambda c=cfg: self._run(c, args, numel, rnumel)), cfg))
            except Exception:  # a config that does not compile (too many registers...) is skipped
                continue
        best = min(times, key=lambda t: t[0])[1] if times else options[0]
        self.cache.put(key, best)
        return best

    def __call__(self, dev: int, stream: Any, *passed: Any) -> None:
        """One launch (see the class doc for the arguments); binds the launch for the next call."""
        own = passed[:self.arity[0] + self.arity[1]]
        sizes = iter(passed[len(own):])
        numel = self.sizes[0] if self.sizes[0] is not None else next(sizes)
        rnumel = 1 if self.kind == "pointwise" else (self.sizes[1] if self.sizes[1] is not None else next(sizes))
        ints = passed[self.arity[0]:]
        if numel == 0:
            self._install(("none", ints), lambda: bound_launch.bind_run(self, _nothing, len(own), self.arity[0], ints))
            return
        cfg = self.config_for(own, numel, rnumel)
        if self.kind == "split" and not ints and dev >= 0 and not self.interpret:
            split = self._bind_split(dev, stream, own, cfg, numel, rnumel)
            if split is not None:
                self._install(("split", dev), lambda: split)
                return
        if self.interpret or self.kind == "split":
            self._run(cfg, own, numel, rnumel)
            self._install(("run", ints), lambda: bound_launch.bind_run(
                self, functools.partial(self._run, cfg, numel=numel, rnumel=rnumel), len(own), self.arity[0], ints))
            return
        args = own + self._tail(numel, rnumel)
        launch = self._direct_launch(self.fn, launch_options(cfg, self.kind, bool(self.checks)), len(args))
        grid = self._grid(cfg, numel, rnumel)
        if dev < 0 or not launch.enabled:  # through Triton's launcher this time: nothing to bind
            self.fn[grid](*args, **launch.kwargs)
            return
        key = cuda_launch.launch_key(dev, args)
        kernel = launch.kernel(dev, key, args)
        if kernel is None:  # needs Triton's launcher, always
            launch(grid, args)
            self._install(("run", ints), lambda: bound_launch.bind_run(
                self, functools.partial(self._run, cfg, numel=numel, rnumel=rnumel), len(own), self.arity[0], ints))
            return
        kernel.write_constants(args)
        kernel(grid[0], grid[1], bound_launch.stream_value(stream), args)
        aligned = key[1:1 + self.arity[0]]
        self._install(("driver", key), lambda: bound_launch.bind_driver(
            self, kernel, grid, dev, self.arity[0], ints, aligned, cuda_launch.driver()))

    def _bind_split(self, dev: int, stream: Any, own: tuple, cfg: LaunchConfig, numel: int,
                    rnumel: int) -> Callable | None:
        """Launch a split reduction of a program whose sizes are all constants (its two kernels,
        with a fresh workspace) and return its bound launch; None where either kernel needs
        Triton's launcher (nothing launched then)."""
        device = next(a.device for a in own if isinstance(a, torch.Tensor))
        if not self._sms:
            self._sms = torch.cuda.get_device_properties(device).multi_processor_count
        nsplit, chunk, fx = split_shape(cfg, numel, rnumel, self._sms)
        size = self.partials * nsplit * numel
        ws = torch.empty(size, dtype=torch.float32, device=device)
        stages = [(self.fn, (self._grid(cfg, numel, rnumel)[0], nsplit), (chunk, numel, rnumel),
                   launch_options(cfg, self.kind, bool(self.checks))),
                  (self.finisher, (-(-numel // fx), 1), (nsplit, numel), finisher_options(nsplit, fx))]
        kernels = []
        for fn, grid, tail, options in stages:
            args = (*own, ws, *tail)
            launch = self._direct_launch(fn, options, len(args))
            key = cuda_launch.launch_key(dev, args)
            kernel = launch.kernel(dev, key, args) if launch.enabled else None
            if kernel is None:
                return None
            kernels.append((kernel, grid, key, args, tail, fn, options))
        raw_stream = bound_launch.stream_value(stream)
        bound = []
        buffers = len(own) + 1  # the program's buffers, then the workspace
        for kernel, grid, key, args, tail, fn, options in kernels:
            kernel.write_constants(args)
            kernel(grid[0], grid[1], raw_stream, args)

            def general(dev_: int, stream_: Any, *pointers: Any, _fn=fn, _grid=grid, _tail=tail, _options=options):
                self._launch(_fn, _grid, (*pointers, *_tail), _options)

            bound.append(bound_launch.bind_driver(general, kernel, grid, dev, buffers, (), key[1:1 + buffers],
                                                  cuda_launch.driver()))
        return bound_launch.bind_split(self, bound[0], bound[1], size, device, dev)

    def _install(self, key: tuple, bind: Callable[[], Callable]) -> None:
        """Put the bound launch of ``key`` (made by ``bind`` the first time) in the wrapper's
        namespace: the wrapper's next call launches through it."""
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = bind()
        if self.namespace is not None:
            self.namespace[self.name] = bound


def _nothing(args: tuple) -> None:
    """A launch over no points."""


class CompiledProgram(CompiledCall):
    """A scheduled program compiled to Triton: call it with tensors, get a tuple of tensors.

    ``wrapper_source`` and ``kernel_source`` are the generated text; ``dump(folder)`` writes them
    (``wrapper.py``, ``kernels.py``, ``schedule.txt``) for reading.
    """

    input_error = InputError

    def __init__(self, scheduled, wrapper_source: str, kernel_source: str, kernels: list, call: Callable[..., tuple],
                 launchers: dict[str, Launcher]):
        super().__init__(scheduled, wrapper_source, call)
        self.kernel_source = kernel_source
        self.kernels = kernels
        self.launchers = launchers
        # what compiling the kernels ahead did (a precompile.PrecompileReport; None when nothing
        # was compiled ahead: the interpreter, no GPU, or FIRECLAY_TRITON_PRECOMPILE=0; set when
        # a background compile finishes)
        self.precompile_report = None
        # the kernels' compile on the background thread (compile_program(..., background=True)),
        # or None: compiled before compile_program returned
        self.background: BackgroundCompile | None = None

    def ready(self) -> bool:
        """Whether the kernels' compile has finished (successfully or not): always True for a
        program compiled in the foreground. Check ``compile_error`` before calling a ready one."""
        return self.background is None or self.background.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until ``ready()`` or ``timeout`` seconds passed; returns ``ready()``."""
        return self.background is None or self.background.wait(timeout)

    @property
    def compile_error(self) -> BaseException | None:
        """Why the background compile failed (None while it runs, or when it succeeded). A program
        with an error is not usable: calling it raises, before any kernel runs."""
        return None if self.background is None else self.background.error

    def compile_in_background(self, work: Callable[[], Any]) -> None:
        """Run ``work`` (the kernels' compile) on the background thread. Until it finishes, a call
        waits for it; a call after it failed raises :class:`CodegenError` naming the cause, before
        running anything, so no input is half updated."""
        self.background = background.submit(work)
        compiled_call = self._call

        def call_when_compiled(*inputs: Any) -> tuple:
            self.wait()
            error = self.compile_error
            if error is not None:
                raise CodegenError(f"this program's kernels failed to compile in the background "
                                   f"({type(error).__name__}: {error}); run the graph another way") from error
            self._call = compiled_call
            return compiled_call(*inputs)

        self._call = call_when_compiled

    def source_files(self) -> dict[str, str]:
        return {"wrapper.py": self.wrapper_source, "kernels.py": self.kernel_source,
                "schedule.txt": str(self.scheduled) + "\n"}
