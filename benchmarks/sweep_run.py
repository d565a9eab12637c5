"""One architecture of the sweep, in its own process: build, run eagerly, compile, compare, count."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import time
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from benchmarks.sweep_models import input_candidates, rebuilt, shrink_config, unfillable
from benchmarks.sweep_report import Outcome

# Largest relative error (max |compiled - eager| / max |eager|) that counts as correct.
TOLERANCE = {"float32": 1e-3, "bfloat16": 3e-2}

# A gradient is judged against at least this fraction of the largest gradient of the model: one
# that is zero in exact arithmetic (a key projection's bias under softmax, which ignores a constant
# added to every score) is rounding noise, in eager as in any compiled run, and relative error makes
# noise look like 1e8. A wrong gradient of a thousandth of the model's largest is still flagged.
GRADIENT_FLOOR = 1e-3

# The float64 second opinion on a miss: a leaf passes when fireclay's error against eager in
# float64 is within the tolerance of the leaf's float64 scale, or within this many times eager's own
# error there. A gradient that is zero in exact arithmetic (a batch norm's bias feeding another
# batch norm) is rounding noise in every float32 run, and relative error makes noise look like 1e8.
NOISE_FACTOR = 10

# Above this many parameters a model is too slow for the sweep (the gentler shrink keeps widths).
MAX_PARAMETERS = 40_000_000

# Module prefix of the innermost frame of an exception's traceback -> the stage it came from.
_STAGES = [
    ("fireclay_capture", "capture"),
    ("fireclay_autograd.functionalize", "functionalization"),
    ("fireclay_autograd.partition", "partitioning"),
    ("fireclay_autograd.runtime", "runtime plan"),
    ("fireclay_autograd.layouts", "runtime plan"),
    ("fireclay_autograd", "aten tracing"),
    ("fireclay_loops", "lowering"),
    ("fireclay_cpp", "code generation (C++)"),
    ("fireclay_triton", "code generation (Triton)"),
    ("fireclay_shapes", "shapes"),
    ("fireclay_ir", "fireclay-ir"),
    ("fireclay", "fireclay"),
]


def stage_of(exc: BaseException) -> tuple[str, str]:
    """(stage, file:line) of the innermost frame of fireclay's own code that ``exc`` passed."""
    tagged = getattr(exc, "fireclay_stage", None)
    stage, where = None, ""
    for frame, line in traceback.walk_tb(exc.__traceback__):
        module = frame.f_globals.get("__name__", "")
        for prefix, name in _STAGES:
            if module == prefix or module.startswith(prefix + "."):
                stage, where = name, f"{frame.f_code.co_filename.rsplit('/src/', 1)[-1]}:{line}"
                break
    return tagged or stage or "outside fireclay", where


def flatten(value: Any, path: str = "out", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """Every leaf of a model's output: tensors and plain values, with a path naming it."""
    if depth > 8:
        yield path, repr(type(value))
    elif isinstance(value, torch.Tensor):
        yield path, value
    elif value is None or isinstance(value, (bool, int, float, str)):
        yield path, value
    elif isinstance(value, dict) or (hasattr(value, "keys") and hasattr(value, "__getitem__")):
        for key in value.keys():
            yield from flatten(value[key], f"{path}.{key}", depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from flatten(item, f"{path}[{i}]", depth + 1)
    elif hasattr(value, "__dict__"):  # a cache object and the like
        for key, item in sorted(vars(value).items()):
            if not key.startswith("_"):
                yield from flatten(item, f"{path}.{key}", depth + 1)
    else:
        yield path, repr(type(value))


def _scale(value: Any) -> float:
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() == 0:
        return 0.0
    value = value.detach().abs()
    return value[torch.isfinite(value)].max().item() if torch.isfinite(value).any() else 0.0


def relative_error(actual: Any, expected: Any, floor: float = 0.0) -> float:
    """max |actual - expected| / max(max |expected|, floor) over finite values; inf when shapes,
    dtypes or the places of NaN and infinities differ."""
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape or actual.dtype != expected.dtype:
        return math.inf
    if actual.numel() == 0:
        return 0.0
    if not (expected.is_floating_point() or expected.is_complex()):
        return 0.0 if torch.equal(actual.cpu(), expected.cpu()) else math.inf
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    if not torch.equal(torch.isnan(a), torch.isnan(e)) or not torch.equal(torch.isinf(a), torch.isinf(e)):
        return math.inf
    finite = torch.isfinite(e)
    if not torch.equal(a[~finite & ~torch.isnan(e)], e[~finite & ~torch.isnan(e)]):
        return math.inf
    if not finite.any():
        return 0.0
    diff = (a[finite] - e[finite]).abs().max().item()
    scale = max(e[finite].abs().max().item(), floor)
    return diff / scale if scale > 0 else diff


def compare(actual: list[tuple[str, Any]], expected: list[tuple[str, Any]], by_shape: bool,
            tolerance: float, by_structure: bool = False) -> tuple[bool, float, str]:
    """(passed, worst error, what differs) over every leaf of two flattened outputs; ``by_shape``
    compares tensors by shape and dtype (a model drawing random numbers), ``by_structure`` by
    number of dimensions and dtype (one whose output sizes are random too)."""
    if [p for p, _ in actual] != [p for p, _ in expected]:
        return False, math.inf, f"output structure differs: {len(actual)} leaves vs eager's {len(expected)}"
    worst, where = 0.0, ""
    gradient_floor = GRADIENT_FLOOR * max((_scale(e) for p, e in expected if p.startswith("grad[")), default=0.0)
    for (path, a), (_, e) in zip(actual, expected):
        if isinstance(e, torch.Tensor):
            if by_structure:
                err = 0.0 if isinstance(a, torch.Tensor) and a.dim() == e.dim() and a.dtype == e.dtype else math.inf
            elif by_shape:
                err = 0.0 if isinstance(a, torch.Tensor) and a.shape == e.shape and a.dtype == e.dtype else math.inf
            else:
                err = relative_error(a, e, gradient_floor if path.startswith("grad[") else 0.0)
        else:
            err = 0.0 if a == e or (isinstance(e, float) and isinstance(a, float) and math.isnan(a)
                                    and math.isnan(e)) else math.inf
        if err > worst or (math.isnan(err) and not math.isnan(worst)):
            worst, where = err, path
    return worst <= tolerance, worst, where


def float64_second_opinion(actual: list[tuple[str, Any]], expected: list[tuple[str, Any]],
                           expected64: list[tuple[str, Any]], tolerance: float) -> tuple[bool, float, str]:
    """(passed, worst ratio, what differs) for a result that missed ``compare``'s tolerance with a
    finite error (so every leaf has eager's shape, dtype and non-finite places): each floating
    leaf's error against float64 eager over what it is allowed, max(tolerance x the leaf's float64
    scale (at least the gradient floor), NOISE_FACTOR x eager float32's own error against
    float64); a ratio <= 1 passes."""
    worst, where = 0.0, ""
    gradient_floor = GRADIENT_FLOOR * max((_scale(e) for p, e in expected64 if p.startswith("grad[")), default=0.0)
    for (path, a), (_, e), (_, e64) in zip(actual, expected, expected64):
        if not (isinstance(e, torch.Tensor) and e.is_floating_point()):
            continue  # compare() already found it equal
        e64 = e64.detach().cpu().double() if isinstance(e64, torch.Tensor) else None
        if e64 is None or e64.shape != e.shape or not torch.isfinite(e64).all():
            return False, math.inf, f"{path} (float64 eager gives no finite reference)"
        finite = torch.isfinite(e).cpu()  # the leaves may be on a GPU; the comparison runs on the CPU
        a, e = a.detach().cpu().double()[finite], e.detach().cpu().double()[finite]
        e64 = e64[finite]
        if e64.numel() == 0:
            continue
        error = (a - e64).abs().max().item()
        scale = max(e64.abs().max().item(), gradient_floor if path.startswith("grad[") else 0.0)
        allowed = max(tolerance * scale, NOISE_FACTOR * (e - e64).abs().max().item())
        ratio = error / allowed if allowed > 0 else (0.0 if error == 0 else math.inf)
        if ratio > worst or math.isnan(ratio):
            worst, where = ratio, path
    return worst <= 1.0, worst, where


def _float64_run(model: Any, kwargs: dict[str, Any], mode: str) -> list[tuple[str, Any]] | None:
    """Eager in float64 from the same weights and inputs (None where the model cannot run so)."""
    model64 = copy.deepcopy(model).double()
    kwargs64 = {k: _to(v, getattr(v, "device", "cpu"), torch.float64) for k, v in kwargs.items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            return _step(model64, kwargs64, mode, [p for p in model64.parameters() if p.requires_grad])
    except Exception:
        return None


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("fireclay"):
            self.messages.append(f"[{record.name}] {record.getMessage()}")


@contextlib.contextmanager
def _collected_warnings() -> Iterator[list[str]]:
    """Warnings and WARNING log records fireclay gives during the block."""
    handler = _Records()
    root = logging.getLogger()
    root.addHandler(handler)
    out: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield out
    finally:
        root.removeHandler(handler)
        out.extend(handler.messages)
        out.extend(f"[{w.category.__name__}] {w.message}" for w in caught
                   if "fireclay" in str(w.message) or "fireclay" in (w.filename or ""))


def _first_line(text: str, limit: int = 300) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _to(value: Any, device: str, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype) if value.is_floating_point() else value.to(device)
    return value


def _step(model: Any, kwargs: dict[str, Any], mode: str, params: list[torch.nn.Parameter]) -> list[tuple[str, Any]]:
    """One call: inference under no_grad; training: forward, a loss of the floating outputs
    backward (``_loss``), and the parameters' gradients appended to the outputs."""
    if mode == "inference":
        with torch.no_grad():
            return list(flatten(model(**kwargs)))
    for p in params:
        p.grad = None
    out = list(flatten(model(**kwargs)))
    loss = _loss([t for _, t in out if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()])
    if isinstance(loss, torch.Tensor):
        loss.backward()
    out = [(p, t.detach() if isinstance(t, torch.Tensor) else t) for p, t in out]
    return out + [(f"grad[{i}]", p.grad) for i, p in enumerate(params)]


def _loss(outputs: list[torch.Tensor]) -> torch.Tensor | int:
    """The sum over ``outputs`` of mean(output x a fixed random tensor of its shape).

    Not the plain mean, nor the mean square: a layer norm's output (with its initial weight 1 and
    bias 0) has mean 0 and mean square 1 whatever its input, so every gradient below it would be
    zero in exact arithmetic and float32 rounding noise in every run; a random projection depends
    on each element.
    """
    generator = torch.Generator().manual_seed(0)
    return sum((t.float() * torch.randn(t.shape, generator=generator).to(t.device)).mean() for t in outputs)


def _widest(config: Any) -> int:
    """The largest hidden size a config or its sub-configs name."""
    widest = 0
    for name, value in vars(config).items():
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
            widest = max(widest, _widest(value))
        elif name in ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "intermediate_size") and \
                isinstance(value, int) and not isinstance(value, bool):
            widest = max(widest, value // 4 if name == "intermediate_size" else value)
    return widest


def _build(model_type: str, class_name: str, outcome: Outcome, widths: bool = True) -> tuple[Any, Any] | None:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = getattr(transformers, class_name, None)
    if cls is None:
        outcome.skip("build", f"transformers has no class {class_name}")
        return None
    try:
        config = CONFIG_MAPPING[model_type]()
    except Exception as exc:
        outcome.skip("build", f"default config does not build: {type(exc).__name__}: {_first_line(str(exc))}")
        return None
    if not widths and _widest(config) > 1024:
        outcome.skip("build", f"too wide to keep its widths ({_widest(config)})")
        return None
    report = shrink_config(config, widths=widths)
    outcome.config_changes = len(report.changed)
    config = rebuilt(config)
    outcome.shrink = "tiny" if widths else "layers only"
    try:
        torch.manual_seed(0)
        model = cls(config)
    except Exception as exc:
        outcome.skip("build", f"the tiny model does not build: {type(exc).__name__}: {_first_line(str(exc))}")
        return None
    outcome.parameters = sum(p.numel() for p in model.parameters())
    if outcome.parameters > MAX_PARAMETERS:
        outcome.skip("build", f"{outcome.parameters / 1e6:.0f}M parameters even shrunk")
        return None
    return model, config


def run_architecture(model_type: str, class_name: str, *, device: str = "cpu", dtype: str = "float32",
                     mode: str = "inference", dynamo: bool = True, threads: int = 1) -> Outcome:
    torch.set_num_threads(threads)
    start = time.perf_counter()
    first = _tiny_model(model_type, class_name, device, dtype, mode, widths=True)
    if first.status == "skipped" and "CUDA error" not in first.outcome.reason:
        # some parts assume their default widths: keep them, fewer layers (not after a device-side
        # assert, which leaves the process unable to use the GPU)
        second = _tiny_model(model_type, class_name, device, dtype, mode, widths=False)
        if second.status != "skipped":
            first = second
        else:
            first.outcome.detail += f"\nwith widths kept: {second.outcome.stage}: {second.outcome.reason}"
    outcome = first.outcome
    if outcome.status == "skipped":
        outcome.seconds = round(time.perf_counter() - start, 2)
        return outcome
    return _compile_and_compare(first, device, dtype, mode, dynamo, start)


@dataclasses.dataclass
class _Ready:
    outcome: Outcome
    model: Any = None
    kwargs: Any = None
    expected: Any = None
    params: Any = None

    @property
    def status(self) -> str:
        return self.outcome.status


def _tiny_model(model_type: str, class_name: str, device: str, dtype: str, mode: str, widths: bool) -> _Ready:
    """The model built and run eagerly, with the inputs eager accepted."""
    outcome = Outcome(model_type, class_name)
    torch_dtype = getattr(torch, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = _build(model_type, class_name, outcome, widths)
    if built is None:
        return _Ready(outcome)
    model, config = built
    model = model.to(device=device, dtype=torch_dtype)
    model.train(mode == "training")
    params = [p for p in model.parameters() if p.requires_grad]

    # Inputs: the first candidate eager accepts.
    eager_errors = []
    chosen = None
    t0 = time.perf_counter()
    for candidate in input_candidates(model, config):
        try:
            # inside the try: a device-side assert of the candidate before surfaces at the next copy
            kwargs = {k: _to(v, device, torch_dtype) for k, v in candidate.kwargs.items()}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.manual_seed(0)
                expected = _step(model, kwargs, mode, params)
            chosen = candidate.note, kwargs
            break
        except Exception as exc:
            eager_errors.append(f"{candidate.note}: {type(exc).__name__}: {_first_line(str(exc), 200)}")
            if "CUDA error" in str(exc):  # a device-side assert: this process can use the GPU no more
                break
    outcome.eager_seconds = round(time.perf_counter() - t0, 3)
    if chosen is None:
        missing = unfillable(model)
        why = (f"needs inputs the sweep cannot make: {', '.join(missing)}" if missing and not eager_errors
               else eager_errors[-1] if eager_errors else "no input recipe")
        outcome.detail = "\n".join(eager_errors)
        outcome.skip("eager", why)
        return _Ready(outcome)
    outcome.inputs, kwargs = chosen
    return _Ready(outcome, model, kwargs, expected, params)


def _compile_and_compare(ready: _Ready, device: str, dtype: str, mode: str, dynamo: bool, start: float) -> Outcome:
    outcome, model, kwargs, expected, params = ready.outcome, ready.model, ready.kwargs, ready.expected, ready.params
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(1)
        again = _step(model, kwargs, mode, params)
    outcome.random = not compare(again, expected, False, 0.0)[0]
    # vits draws its durations from numpy: two eager runs differ in output length as well
    outcome.random_sizes = outcome.random and not compare(again, expected, True, 0.0)[0]
    tolerance = TOLERANCE[dtype]

    # fireclay, on a copy (training steps change gradients; module state may change too).
    import fireclay

    compiled_model = copy.deepcopy(model)
    compiled_params = [p for p in compiled_model.parameters() if p.requires_grad]
    compiled = fireclay.compile(compiled_model)
    t0 = time.perf_counter()
    with _collected_warnings() as notes:
        try:
            results = []
            for _ in range(2):  # the first call captures and compiles, the second hits the cache
                torch.manual_seed(0)
                results.append(_step(compiled, kwargs, mode, compiled_params))
        except Exception as exc:
            stage, where = stage_of(exc)
            outcome.status = "raised"
            outcome.stage = stage
            outcome.reason = f"{type(exc).__name__}: {_first_line(str(exc))}"
            outcome.detail = f"at {where}\n" + "".join(traceback.format_exception(exc))[-4000:]
            results = []
    outcome.fireclay_seconds = round(time.perf_counter() - t0, 3)
    outcome.warnings = [_first_line(m, 400) for m in dict.fromkeys(notes)]
    _count_fireclay(compiled, outcome)
    if results:
        passed, worst, where = True, 0.0, ""
        for result in results:
            ok, err, at = compare(result, expected, outcome.random, tolerance, outcome.random_sizes)
            if err > worst or not ok:
                worst, where = err, at
            passed = passed and ok
        outcome.max_error = None if math.isinf(worst) else worst
        if not passed and not outcome.random and math.isfinite(worst):
            passed, where = _second_opinion(ready, mode, results, tolerance, outcome, where)
        if passed:
            outcome.status = "pass"
        else:
            outcome.status = "wrong"
            outcome.stage = "result"
            outcome.reason = f"differs from eager at {where} (relative error {worst:.3g})"

    if dynamo:
        dynamo_result = _count_dynamo(model, kwargs, mode, outcome)
        if outcome.status == "wrong" and dynamo_result is not None and results:
            # TorchDynamo's graph gives the same answer: the library takes another path while
            # compiling (torch.compiler.is_compiling()), so eager is not what compiling can match.
            outcome.same_as_dynamo = compare(results[0], dynamo_result, outcome.random, tolerance,
                                             outcome.random_sizes)[0]
            if outcome.same_as_dynamo:
                outcome.reason += "; the same as TorchDynamo's result"
    outcome.seconds = round(time.perf_counter() - start, 2)
    return outcome


def _second_opinion(ready: _Ready, mode: str, results: list[list[tuple[str, Any]]], tolerance: float,
                    outcome: Outcome, where: str) -> tuple[bool, str]:
    """The float64 judgement of a finite miss: (passed, the leaf to name); notes it in the detail."""
    expected64 = _float64_run(ready.model, ready.kwargs, mode)
    if expected64 is None:
        outcome.detail = "float64 check: the model does not run in float64"
        return False, where
    ratio, at = 0.0, where
    for result in results:
        _, r, w = float64_second_opinion(result, ready.expected, expected64, tolerance)
        if r > ratio or math.isnan(r):
            ratio, at = r, w
    outcome.detail = (f"float64 check: worst error {ratio:.3g}x what is allowed at {at} (tolerance x scale, "
                      f"or {NOISE_FACTOR}x eager float32's own error)")
    return ratio <= 1.0, at if ratio > 1.0 else where


def _count_fireclay(compiled: Any, outcome: Outcome) -> None:
    """Graphs, breaks and eager frames of every function ``compiled`` captured."""
    root = getattr(compiled, "_compiled", None)  # OptimizedModule keeps its CapturedFunction here
    if root is None:
        return
    seen: set[int] = set()
    order = []

    def visit(cf: Any) -> None:
        if id(cf) in seen:
            return
        seen.add(id(cf))
        order.append(cf)
        for child in cf.children:
            visit(child)

    visit(root)
    graphs = breaks = 0
    for cf in order:
        for entry in cf.cache.entries:
            if entry.program is not None and entry.program.graphs[entry.program.entry].nodes:
                graphs += 1
            if entry.graph_break is not None:
                breaks += 1
                loc = entry.graph_break.location or {}
                outcome.break_reasons.append(f"{_first_line(entry.graph_break.reason, 200)} "
                                             f"[{_short(loc.get('file', '?'))}:{loc.get('line', 0)}]")
            if entry.compiled is None and entry.reason:
                outcome.eager_frames.append(_eager_reason(cf, entry.reason))
        hooked = cf.stats.fallbacks - sum(1 for e in cf.cache.entries if e.compiled is None)
        if hooked > 0 and cf.module is not None:
            outcome.eager_frames.append(f"{cf.code.co_qualname}: the module has hooks, so its forward runs eagerly")
        if cf.cache.given_up:
            outcome.eager_frames.append(f"{cf.code.co_qualname}: recompile limit reached")
    outcome.graphs, outcome.breaks = graphs, breaks


def _short(path: str) -> str:
    for marker in ("site-packages/", "/src/"):
        if marker in path:
            return path.rsplit(marker, 1)[-1]
    return path


def _eager_reason(cf: Any, reason: str) -> str:
    lines = reason.strip().splitlines()
    head = lines[0].replace(f"fireclay_capture could not capture {cf.code.co_qualname}: ", "")
    at = next((ln.strip()[3:] for ln in lines[1:] if ln.strip().startswith("at ")), "")
    return f"{cf.code.co_qualname}: {_first_line(head, 240)}" + (f" [{_short(at.split(' ')[0])}]" if at else "")


def _count_dynamo(model: Any, kwargs: dict[str, Any], mode: str, outcome: Outcome) -> list[tuple[str, Any]] | None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    graphs: list[int] = []

    def counting(gm: Any, example_inputs: Any) -> Any:
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    t0 = time.perf_counter()
    result = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            result = _step(torch.compile(model, backend=counting), kwargs, mode,
                           [p for p in model.parameters() if p.requires_grad])
        outcome.dynamo_graphs = len(graphs)
        outcome.dynamo_breaks = int(sum(counters["graph_break"].values()))
    except Exception as exc:
        outcome.dynamo_error = f"{type(exc).__name__}: {_first_line(str(exc), 200)}"
    outcome.dynamo_seconds = round(time.perf_counter() - t0, 3)
    return result
