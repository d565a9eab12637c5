"""Programs with symbolic sizes: trace once, run at any size the trace's guards allow.

When a torch-dialect program's inputs have symbolic dims (``f32[s0, 768]``, as fireclay-capture
writes them with ``dynamic=True``), its forward, joint and backward graphs are traced over fakes
with those symbolic sizes, so the aten graphs keep them, and one compiled graph serves every size.

Each traced path is an *entry*: its runtime, and the guard that the decisions taken during the
trace add (a kernel that checked ``s0 == 1`` was traced for one side only). At each call the
symbol values are read off the real inputs' sizes; the first entry whose guard holds runs. When
none holds, the program is traced again with the new sizes as hints (a new entry); when a
symbolic trace fails, or after :data:`MAX_SYMBOLIC_ENTRIES`, the program is specialised to
each distinct input shape instead (compiled once per shape, cached), with a log line saying why.
A compiled graph reads its symbols off its inputs' shapes; a symbol that no input shows directly
is handed over by a :class:`~fireclay_autograd.runtime.SizeCarrier` input.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from fireclay_autograd.convert import example_tensors, torch_dtype
from fireclay_autograd.executor import bind_symbols
from fireclay_autograd.joint import symbolic_mode, trace_forward, trace_joint
from fireclay_autograd.partition import partition
from fireclay_autograd.runtime import InferenceRuntime, OutputPlan, SizeCarrier, TrainingRuntime
from fireclay_ir import Graph, InputSpec, IRError, Program, RunLimitError, SymExpr, TensorMeta
from fireclay_shapes import ShapeEnv, parse

if TYPE_CHECKING:
    from fireclay_autograd.api import CompiledProgram

log = logging.getLogger("fireclay_autograd")

# Symbolic traces per path before falling back to one compile per input shape.
MAX_SYMBOLIC_ENTRIES = 4


def has_symbolic_inputs(program: Program) -> bool:
    return any(v.is_tensor and not v.meta.is_static for v in program.main.inputs)


@dataclass
class _Entry:
    runtime: InferenceRuntime | TrainingRuntime
    accepts: Callable[[dict[str, int]], bool]


class DynamicProgram:
    """The call path of a :class:`~fireclay_autograd.api.CompiledProgram` whose program has
    symbolic input sizes (see the module docstring)."""

    def __init__(self, owner: CompiledProgram):
        self.owner = owner
        self.program = owner.program
        graph = self.program.main
        self._symbolic_positions = [i for i, v in enumerate(graph.inputs) if v.is_tensor and not v.meta.is_static]
        self._entries: dict[str, list[_Entry]] = {"inference": [], "training": []}
        self._static: dict[tuple, InferenceRuntime | TrainingRuntime] = {}
        self.symbolic_failure: str | None = None  # why symbolic tracing was given up, if it was
        self.traces = 0  # symbolic traces made (a test can check that sizes did not retrace)

    def __call__(self, user_inputs: Sequence[Any]) -> tuple:
        owner = self.owner
        if len(user_inputs) != len(owner._user_positions):
            raise TypeError(f"compiled program takes {len(owner._user_positions)} inputs, got {len(user_inputs)}")
        inputs: list[Any] = [None] * len(self.program.main.inputs)
        for pos, x in zip(owner._user_positions, user_inputs):
            inputs[pos] = x
        for pos, x in owner._weights.items():
            inputs[pos] = x
        kind = "training" if torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in inputs) else "inference"
        values = self._symbol_values(inputs)
        for entry in self._entries[kind]:
            if entry.accepts(values):
                return entry.runtime(*inputs, symbols=values)
        if self.symbolic_failure is None and len(self._entries[kind]) < MAX_SYMBOLIC_ENTRIES:
            try:
                entry = self._compile(kind, inputs, values, symbolic=True)
            except Exception as exc:  # any failure of the symbolic trace: specialise instead
                first = str(exc).splitlines()[0] if str(exc) else ""
                self.symbolic_failure = f"{type(exc).__name__}: {first}"
                log.warning("fireclay-autograd: tracing with symbolic sizes failed (%s); compiling once per "
                            "input shape instead", self.symbolic_failure)
            else:
                self._entries[kind].append(entry)
                if entry.accepts(values):
                    return entry.runtime(*inputs, symbols=values)
                raise IRError("internal: a symbolic trace does not accept the sizes it was traced with")
        key = (kind, tuple(tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in inputs))
        runtime = self._static.get(key)
        if runtime is None:
            log.info("fireclay-autograd: compiling the %s path for input shapes %s", kind,
                     [list(s) for s in key[1] if s is not None])
            runtime = self._static[key] = self._compile(kind, inputs, values, symbolic=False).runtime
        return runtime(*inputs, symbols=values)

    def _symbol_values(self, inputs: list[Any]) -> dict[str, int]:
        graph = self.program.main
        positions = self._symbolic_positions
        try:
            values = bind_symbols(graph, inputs, positions)
        except IRError as exc:
            raise TypeError(f"the inputs do not fit the program's symbolic shapes: {exc}") from None
        for i in positions:
            v, x = graph.inputs[i], inputs[i]
            for d, size in zip(v.meta.shape, x.shape):
                if isinstance(d, int) and d != size:
                    raise TypeError(f"input %{v.name} has shape {list(x.shape)}, the program takes "
                                    f"{list(v.meta.shape)}; recompile for the new shapes")
        return values

    # -- compiling one entry
    def _compile(self, kind: str, inputs: list[Any], values: dict[str, int], *, symbolic: bool) -> _Entry:
        timer = self.owner.stage_timer
        with timer("autograd") if timer is not None else contextlib.nullcontext():
            mode = symbolic_mode(self.program, inputs) if symbolic else None
            if symbolic:
                self.traces += 1
            if kind == "inference":
                runtime, env = self._inference(inputs, values, mode)
            else:
                runtime, env = self._training(inputs, values, mode)
            return _Entry(runtime, guard_function(env) if env is not None else (lambda _values: True))

    def _inference(self, inputs: list[Any], values: dict[str, int], mode: Any) -> tuple[InferenceRuntime, Any]:
        from fireclay_autograd.api import _program

        owner = self.owner
        traced = trace_forward(self.program, inputs, mode=mode)
        aten = _specialised(_program(traced.graph, self.program, traced.constants), mode)
        carriers = add_size_carriers(aten.main)
        constants = list(traced.constants.values())
        examples = list(inputs) + constants + _carry_examples(carriers, values)
        compiled = owner.inference_compiler(aten, examples)
        f = traced.functional
        plan = OutputPlan(f.num_user_outputs, f.mutated_inputs, f.output_aliases, f.num_intermediate_bases)
        return InferenceRuntime(compiled, plan, constants, carriers), mode.env if mode is not None else None

    def _training(self, inputs: list[Any], values: dict[str, int], mode: Any) -> tuple[TrainingRuntime, Any]:
        from fireclay_autograd.api import AOTGraphs, _program

        owner = self.owner
        traced = trace_joint(self.program, inputs, mode=mode)
        f = traced.functional
        hints = {name: info.hint for name, info in mode.env.symbols.items()} if mode is not None else {}
        part = partition(traced.graph, traced.num_forward_inputs, f.num_user_outputs + len(f.mutated_inputs),
                         strategy=owner.partitioner, hints=hints)
        part.forward = _specialised(_program(part.forward.main, self.program, traced.constants), mode)
        part.backward = _specialised(_program(part.backward.main, self.program), mode)
        owner.graphs = AOTGraphs(traced, part)
        constants = list(traced.constants.values())
        fw_carriers = add_size_carriers(part.forward.main)
        bw_carriers = add_size_carriers(part.backward.main)
        fw = owner.fw_compiler(part.forward, list(inputs) + constants + _carry_examples(fw_carriers, values))
        bw = owner.bw_compiler(part.backward, example_tensors(part.backward.main.inputs, values))
        plan = OutputPlan(f.num_user_outputs, f.mutated_inputs, f.output_aliases, 0, f.num_hidden_outputs)
        tangent_metas = [(tuple(v.meta.shape), torch_dtype(v.meta.dtype), torch.device(v.meta.device))
                         for v in traced.graph.inputs[traced.num_forward_inputs:]]
        runtime = TrainingRuntime(fw, bw, plan, constants, len(part.saved), traced.tangent_outputs,
                                  traced.grad_inputs, tangent_metas, fw_carriers, bw_carriers)
        return runtime, mode.env if mode is not None else None


def _specialised(program: Program, mode: Any) -> Program:
    from fireclay_autograd.api import _specialised as specialised

    return specialised(program, mode)


def symbolic_or_static(program: Program, inputs: list[Any], trace: Callable[[Any], Any]) -> tuple[Any, Any]:
    """``trace(mode)`` with a symbolic mode when ``program`` has symbolic input sizes, else (or
    if that fails, with a warning) with none; returns the result and the mode used."""
    if has_symbolic_inputs(program):
        mode = symbolic_mode(program, inputs)
        try:
            return trace(mode), mode
        except RunLimitError:
            raise  # (a static trace would run the same steps)
        except Exception as exc:
            log.warning("fireclay-autograd: tracing with symbolic sizes failed (%s: %s); tracing for the "
                        "example inputs' shapes instead", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    return trace(None), None


def guard_function(env: ShapeEnv) -> Callable[[dict[str, int]], bool]:
    """A fast check, over symbol values, of the symbols' ranges and the guards ``env`` holds."""
    parts = []
    for name, info in env.symbols.items():
        if info.unbacked:
            raise IRError(f"the trace made a data-dependent size {name}; a graph cannot hold it yet")
        lo, hi = info.declared.lo, info.declared.hi
        if lo != -math.inf:
            parts.append(f"{name} >= {int(lo)}")
        if hi != math.inf:
            parts.append(f"{name} <= {int(hi)}")
    rendered = env.produce_guards().render_python()
    if rendered != "True":
        parts.append(rendered)
    text = " and ".join(f"({p})" for p in parts) or "True"
    code = compile(text, "<fireclay-autograd size guard>", "eval")
    builtins = {"max": max, "min": min, "abs": abs}

    def accepts(values: dict[str, int]) -> bool:
        try:
            return bool(eval(code, {"__builtins__": builtins}, values))
        except NameError:
            return False  # a symbol no input binds: only a fresh trace can tell

    accepts.text = text  # type: ignore[attr-defined]
    return accepts


# -- size carriers


def _symbols_in(x: Any, out: set[str]) -> None:
    if isinstance(x, SymExpr):
        out.update(s.name for s in parse(x.expr).free_symbols)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _symbols_in(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _symbols_in(y, out)


def _meta_symbols(meta: TensorMeta, out: set[str]) -> None:
    for d in (*meta.shape, *(meta.strides or ()), meta.storage_offset):
        if isinstance(d, str):
            out.update(s.name for s in parse(d).free_symbols)


def add_size_carriers(graph: Graph) -> list[SizeCarrier]:
    """Append one :class:`SizeCarrier` input to ``graph`` per symbol it uses that no input's
    shape holds as a bare dim; returns them in input order."""
    used: set[str] = set()
    bound: set[str] = set()
    device = "cpu"
    for v in graph.inputs:
        if v.is_tensor:
            device = v.meta.device
            _meta_symbols(v.meta, used)
            bound.update(d for d in v.meta.shape if isinstance(d, str) and d.isidentifier())
    for node in graph.nodes:
        _symbols_in(list(node.args), used)
        _symbols_in(dict(node.kwargs), used)
        for o in node.outputs:
            if o.is_tensor:
                _meta_symbols(o.meta, used)
    carriers = []
    for name in sorted(used - bound):
        meta = TensorMeta("uint8", (name,), device=device)
        graph.add_input(f"size_{name}", meta, InputSpec())
        carriers.append(SizeCarrier(name, device))
    return carriers


def _carry_examples(carriers: list[SizeCarrier], values: dict[str, int]) -> list[torch.Tensor]:
    return [torch.empty(values[c.symbol], dtype=torch.uint8, device=c.device) for c in carriers]
