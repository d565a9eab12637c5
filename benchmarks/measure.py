"""How each number is taken: one step of a model, accuracy against eager, time, memory."""

from __future__ import annotations

import contextlib
import copy
import ctypes
import ctypes.util
import math
import re
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from benchmarks.models import Inputs

MODES = ("inference", "training")
DTYPES = ("float32", "bfloat16", "float16")
LEARNING_RATE = 0.01
# A 16-bit run cannot meet float32's tolerance against eager (each op rounds to 8 or 11 bits):
# the first check uses this, and a miss gets the float64 second opinion as in float32.
HALF_TOLERANCE = 2e-2


@dataclass(frozen=True)
class Precision:
    """The numbers a run computes in, as users run models: weights and floating inputs in
    `dtype`; with `amp`, float32 weights and inputs with the forward (and loss) under
    `torch.autocast` in that 16-bit dtype."""

    dtype: str = "float32"
    amp: str | None = None

    def __post_init__(self):
        if self.dtype not in DTYPES or (self.amp is not None and self.amp not in DTYPES[1:]):
            raise ValueError(f"unknown precision {self.dtype!r}/{self.amp!r}; dtypes: {', '.join(DTYPES)}")
        if self.amp is not None and self.dtype != "float32":
            raise ValueError("--amp runs float32 weights under autocast: leave --dtype at float32")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def tag(self) -> str:
        """The part of a results file name that says the precision ("" for plain float32)."""
        return f"-amp-{self.amp}" if self.amp else ("" if self.dtype == "float32" else f"-{self.dtype}")

    def cast_model(self, module: torch.nn.Module) -> torch.nn.Module:
        return module if self.dtype == "float32" else module.to(self.torch_dtype)

    def cast_inputs(self, inputs: Inputs, device: str) -> Inputs:
        return inputs if self.dtype == "float32" else inputs.to(device, self.torch_dtype)

    def tolerance(self, float32_tolerance: float) -> float:
        return float32_tolerance if self.dtype == "float32" and not self.amp else max(float32_tolerance,
                                                                                      HALF_TOLERANCE)

    def autocast(self, device: str) -> contextlib.AbstractContextManager:
        if not self.amp:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device).type, dtype=getattr(torch, self.amp))


# ---------------------------------------------------------------------------------------------
# One step


def output_tensors(output) -> list[torch.Tensor]:
    """Every tensor of a model's output, in a stable order (ModelOutput, tuples, dicts, tensors)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):  # Hugging Face ModelOutput is an OrderedDict of its non-None fields
        return [t for value in output.values() for t in output_tensors(value)]
    if isinstance(output, (list, tuple)):
        return [t for value in output for t in output_tensors(value)]
    return []


def eager_outputs(built, seed: int = 1) -> list[torch.Tensor]:
    """The output tensors of one eager inference call of a built model on its inputs of ``seed``."""
    inputs = built.inputs(seed)
    with torch.no_grad():
        return output_tensors(built.module.eval()(*inputs.args, **inputs.kwargs))


def loss_of(output) -> torch.Tensor:
    """mean(y ** 2) of the first floating-point output: a scalar with a gradient in every element.

    (A plain mean would be constant for normalised outputs such as softmax rows.)
    """
    for tensor in output_tensors(output):
        if tensor.is_floating_point() and tensor.requires_grad:
            return tensor.float().pow(2).mean()
    raise RuntimeError("the model returned no floating-point output that requires grad: nothing to train")


class Step:
    """One call of `fn` on `model`'s inputs, in inference or training mode.

    Inference: module in eval mode, under torch.no_grad(). Training: module in train mode (every
    dropout of the suite is zero), forward, loss_of, backward, one SGD step.
    """

    def __init__(self, fn: Callable, model: torch.nn.Module, mode: str,
                 autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; use one of {MODES}")
        self.fn, self.model, self.mode, self.autocast = fn, model, mode, autocast
        model.train(mode == "training")
        self.optimizer = (torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
                          if mode == "training" else None)

    def __call__(self, inputs: Inputs):
        if self.optimizer is None:
            with torch.no_grad(), self.autocast():
                return self.fn(*inputs.args, **inputs.kwargs)
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():  # the forward and the loss; backward outside, as autocast asks
            output = self.fn(*inputs.args, **inputs.kwargs)
            loss = loss_of(output)
        loss.backward()
        self.optimizer.step()
        return output, loss

    def observed(self, inputs: Inputs) -> list[tuple[str, torch.Tensor | None]]:
        """Run one step and return everything it produced, labelled, for comparison with eager.

        Training: outputs, the loss, every gradient, and the parameters and buffers after the step
        (buffers catch lost in-place updates such as BatchNorm's running statistics).
        """
        result = self(inputs)
        if self.optimizer is None:
            return [(f"output[{i}]", t.detach()) for i, t in enumerate(output_tensors(result))]
        output, loss = result
        observed = [(f"output[{i}]", t.detach()) for i, t in enumerate(output_tensors(output))]
        observed.append(("loss", loss.detach()))
        # Snapshots, not views: anything that runs the model afterwards (graph counting runs it
        # once more, updating BatchNorm's statistics in place) must not change what is compared.
        for name, parameter in self.model.named_parameters():
            observed.append((f"grad {name}", None if parameter.grad is None else parameter.grad.detach().clone()))
            observed.append((f"param {name}", parameter.detach().clone()))
        observed += [(f"buffer {name}", b.detach().clone()) for name, b in self.model.named_buffers()]
        return observed


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# Accuracy


def relative_error(result: torch.Tensor, reference: torch.Tensor) -> float:
    """max |result - reference| / max |reference| (absolute when the reference is all zero).

    Scale-free, so that tiny gradients are judged as strictly as large activations.
    """
    if result.shape != reference.shape:
        return math.inf
    if reference.numel() == 0:
        return 0.0
    result, reference = result.detach().double().cpu(), reference.detach().double().cpu()
    if not torch.equal(torch.isnan(result), torch.isnan(reference)):
        return math.inf
    finite = torch.isfinite(reference)
    if not torch.equal(result[~finite].nan_to_num(), reference[~finite].nan_to_num()):
        return math.inf
    result, reference = result[finite], reference[finite]
    if reference.numel() == 0:
        return 0.0
    difference = (result - reference).abs().max().item()
    scale = reference.abs().max().item()
    return difference / scale if scale > 0 else difference


@dataclass
class Accuracy:
    passed: bool
    max_error: float  # the worst relative_error over everything compared
    worst: str  # the label of that tensor
    detail: str = ""


def compare(result: list[tuple[str, torch.Tensor | None]], reference: list[tuple[str, torch.Tensor | None]],
            tolerance: float) -> Accuracy:
    if [label for label, _ in result] != [label for label, _ in reference]:
        return Accuracy(False, math.inf, "structure",
                        f"produced {len(result)} tensors, eager produced {len(reference)}")
    worst, worst_label = 0.0, ""
    for (label, got), (_, expected) in zip(result, reference):
        if (got is None) != (expected is None):
            # A compiled backward may give zeros where eager leaves a gradient None (a parameter
            # reaching only outputs the loss ignores); both mean "no gradient".
            present = expected if got is None else got
            if label.startswith("grad ") and not present.any():
                continue
            return Accuracy(False, math.inf, label, f"{label}: None in one run only")
        if got is None:
            continue
        if got.dtype != expected.dtype:
            return Accuracy(False, math.inf, label, f"{label}: dtype {got.dtype}, eager {expected.dtype}")
        error = relative_error(got, expected)
        if error > worst or not worst_label:
            worst, worst_label = error, label
    return Accuracy(worst <= tolerance, worst, worst_label)


def judge_with_float64(result, reference, reference64, tolerance: float) -> Accuracy:
    """Second opinion for a float32 mismatch, as torchbench does: a backend whose error against a
    float64 run is no worse than eager's own (times 3, at least `tolerance`) passes; it computed
    differently, not wrongly."""
    cast = [(label, None if t is None else t.to(r.dtype) if r is not None else t)
            for (label, t), (_, r) in zip(reference64, reference)]
    eager_error = compare(reference, cast, math.inf).max_error
    backend = compare(result, cast, max(tolerance, 3 * eager_error))
    backend.detail = (f"float64 check: backend error {backend.max_error:.2e}, eager error {eager_error:.2e}"
                      f" (at {backend.worst})")
    return backend


def judge(result, reference, tolerance: float, reference64: Callable[[], list]) -> Accuracy:
    """compare(), then on a finite miss the float64 second opinion; `reference64()` runs eager
    in float64 (called only when needed: it costs a float64 copy of the model)."""
    accuracy = compare(result, reference, tolerance)
    if accuracy.passed or not math.isfinite(accuracy.max_error):
        return accuracy
    return judge_with_float64(result, reference, reference64(), tolerance)


def float64_reference(module: torch.nn.Module, inputs: Inputs, mode: str, device: str) -> list:
    """Eager in float64 (no autocast) from the same weights and inputs; the outputs are compared
    after a cast to the run's own dtypes."""
    model64 = fresh_copy(module, device).double()
    return Step(model64, model64, mode).observed(inputs.to(device, torch.float64))


# ---------------------------------------------------------------------------------------------
# Time


# What a sample's seconds are: wall time, or this process's CPU time (all its threads). On a
# shared, loaded machine a one-thread run's CPU time leaves out the time other processes held the
# core, which wall time counts; with several threads it adds up their time and is no wall time.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def median_times(thunks: dict[str, Callable[[], object]], device: str, repeats: int,
                 min_sample_s: float = 0.01, clock: str = "wall") -> dict[str, float]:
    """Median seconds per call of each thunk, sampling them interleaved.

    Each sample runs a thunk `inner` times back to back (enough for `min_sample_s`), and the
    thunks take turns sample by sample, so that a slow phase of the machine (another process, a
    frequency change) falls on every backend alike. ``clock`` names the CLOCKS entry samples read.
    """
    now = CLOCKS[clock]
    inner: dict[str, int] = {}
    for name, thunk in thunks.items():
        sync(device)
        start = time.perf_counter()
        thunk()
        sync(device)
        once = time.perf_counter() - start
        inner[name] = max(1, min(100, math.ceil(min_sample_s / max(once, 1e-7))))
    samples: dict[str, list[float]] = {name: [] for name in thunks}
    for _ in range(repeats):
        for name, thunk in thunks.items():
            sync(device)
            start = now()
            for _ in range(inner[name]):
                thunk()
            sync(device)
            samples[name].append((now() - start) / inner[name])
    return {name: statistics.median(values) for name, values in samples.items()}


def run_until_compiled(call: Callable[[], object], wait_compiled: Callable[[], int], limit: int = 8) -> int:
    """Call `call` until `wait_compiled()` (which blocks while the backend compiles in the
    background) reports no graph with new compiled code: every graph `call` reaches then runs the
    code it keeps (fireclay switches a graph at its first call after its kernels compiled, and
    compiles a backward after its forward switched). Returns the number of calls made; after
    `limit` calls it waits once more and stops."""
    calls = 0
    while calls < limit:
        if not wait_compiled():
            return calls
        call()
        calls += 1
    wait_compiled()
    return calls


def timed(fn: Callable[[], object], device: str) -> tuple[float, object]:
    sync(device)
    start = time.perf_counter()
    value = fn()
    sync(device)
    return time.perf_counter() - start, value


# ---------------------------------------------------------------------------------------------
# Memory


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# The ceiling that glibc's own adjustment raises the threshold to (64-bit) once a process has freed
# large blocks, as any program running a model in a loop has: its steady state. glibc's initial
# 128 KiB, fixed (and with it a trim threshold of 128 KiB), handed the heap's free top back to the
# OS after every call and mapped every larger block afresh, so each call faulted its pages in
# again: a cost no user sees, largest for programs that allocate fewer, larger blocks (fireclay's
# CPU training step of MobileNetV3: 14,000 page faults and 3x the time; eager's: none).
_MMAP_THRESHOLD_FOR_TIMING = 32 * 1024 * 1024
_MMAP_THRESHOLD_FOR_MEMORY = 4 * 1024


def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _set_mmap_threshold(size: int) -> None:
    """Set glibc's mmap threshold, and its trim threshold to twice that, as glibc's own adjustment
    does (set alone, the trim threshold stays at 128 KiB: the heap's free top goes back to the OS
    after each call and the next call faults its pages in again)."""
    libc = _libc()
    with contextlib.suppress(AttributeError):
        if libc is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, size)
            libc.mallopt(_M_TRIM_THRESHOLD, 2 * size)


def _release_free_heap() -> None:
    """Hand free heap pages back to the OS, so that reusing them shows in the resident set."""
    libc = _libc()
    with contextlib.suppress(AttributeError):
        if libc is not None:
            libc.malloc_trim(0)


def make_rss_track_tensors() -> None:
    """Fix glibc's mmap threshold at the steady state a long-running process reaches.

    glibc raises its threshold after large frees, so the first calls of a run would see another
    allocator than the later ones; setting the threshold explicitly turns that adjustment off.
    peak_memory lowers it for the one call it measures, so that freed tensor memory goes back to
    the OS at once and RSS deltas measure tensors, and then sets it back.
    """
    _set_mmap_threshold(_MMAP_THRESHOLD_FOR_TIMING)


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            match = re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # "5" resets the peak RSS (VmHWM) to the current RSS
        return True
    except OSError:
        return False


@contextlib.contextmanager
def peak_memory(device: str) -> Iterator[dict[str, float | None]]:
    """Peak memory above the starting point while the block runs, in MiB, as result["peak_mb"].

    CUDA: torch.cuda.max_memory_allocated above what was allocated before. CPU: the process's
    peak resident set (VmHWM, reset through /proc/self/clear_refs) above its resident set before;
    None where /proc does not offer that (not Linux). Run the block once beforehand: a first call
    also touches code and allocator pages that are not the model's memory.
    """
    result: dict[str, float | None] = {"peak_mb": None}
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        yield result
        torch.cuda.synchronize()
        result["peak_mb"] = (torch.cuda.max_memory_allocated() - before) / 2**20
        return
    # Every allocation of a page or more gets its own mapping during the measured call (slower,
    # so only there): then each tensor's pages enter the resident set when written and leave it
    # when freed, and the peak counts tensors alive at once.
    _set_mmap_threshold(_MMAP_THRESHOLD_FOR_MEMORY)
    _release_free_heap()
    before = _status_kib("VmRSS")
    can_measure = before is not None and _reset_peak_rss()
    try:
        yield result
    finally:
        _set_mmap_threshold(_MMAP_THRESHOLD_FOR_TIMING)
    peak = _status_kib("VmHWM")
    if can_measure and peak is not None:
        result["peak_mb"] = max(0, peak - before) / 1024


def fresh_copy(module: torch.nn.Module, device: str) -> torch.nn.Module:
    return copy.deepcopy(module).to(device)
