"""The state of one capture: the graph being built, its inputs and weights, the guards, and the
stack of frames being interpreted (the root frame and every inlined call).

:class:`Tracer` implements :class:`~fireclay_capture.trace_state.TraceState`, the protocol the
values being traced see it through."""

from __future__ import annotations

import contextlib
import linecache
from typing import TYPE_CHECKING, Any

import torch

from fireclay_capture.aliases import AliasTable
from fireclay_capture.builtins import call_builtin
from fireclay_capture.code_flags import ASYNC, CO_GENERATOR
from fireclay_capture.config import config
from fireclay_capture.dynamic import ShapeSession, marked_dims, source_text
from fireclay_capture.errors import Unsupported
from fireclay_capture.guards import GuardSet, global_state
from fireclay_capture.side_effects import SideEffects
from fireclay_capture.sources import Source, clean_name
from fireclay_capture.variables.base import NULL, CellVar, Var
from fireclay_capture.variables.builder import wrap, wrap_container
from fireclay_capture.variables.tensor import TensorVar, device_str, fake_from_real, meta_of
from fireclay_capture.variables.torch_names import GRAD_MODE_OP
from fireclay_ir import Graph, InputSpec, Program, Weight
from fireclay_ir.dialects import TORCH

if TYPE_CHECKING:
    from fireclay_capture.interpreter.frame import Frame

class Tracer:
    def __init__(self, root_module: torch.nn.Module | None = None,
                 dynamic_dims: dict[Source, set[int]] | None = None, dynamic_all: bool = False,
                 on_fakes: bool = False):
        self.graph = Graph("main")
        self.main_graph = self.graph  # the graph that takes the inputs (``graph`` may be a sub-graph)
        self.guards = GuardSet()
        self.aliases = AliasTable(self.guards)
        self.input_sources: list[Source] = []
        self.weights: dict[str, Weight] = {}
        self.example_inputs: list[torch.Tensor] = []
        self._tensors: dict[int, tuple[TensorVar, Source]] = {}
        self.frames: list[Frame] = []
        self.module_stack: list[str] = []
        self.instructions_run = 0
        self._qualnames: dict[int, str] = {}
        if root_module is not None:
            self._qualnames = {id(m): name for name, m in root_module.named_modules(remove_duplicate=False)}
        state = global_state()
        self.guards.global_state(state)
        self.dynamic_dims = dynamic_dims or {}
        self.dynamic_all = dynamic_all
        self.shapes: ShapeSession | None = None
        if self.dynamic_dims or dynamic_all or on_fakes or state.autocast_cpu is not False \
                or state.autocast_cuda is not False:
            self.shapes = ShapeSession()
        self.entered_contexts: list = []  # real context managers to leave if the trace fails
        self.dynamic_sources: list[tuple[Source, frozenset[int]]] = []
        # Changes to objects that exist outside the trace: read back by the trace, replayed on
        # the real objects after the graph runs.
        self.side_effects = SideEffects()
        self.subgraphs: list[Graph] = []  # the branches of hop::cond nodes
        self._cells: dict[int, CellVar] = {}  # real closure cells by id (each CellVar keeps its cell)
        # Changes to lists, dicts, objects and cells made inside the trace, counted so that a
        # graph break inside an inlined call knows whether the callee changed state the caller
        # can see (then the callee cannot simply run again for real, and the frame runs eagerly).
        self.mutated: list[Any] = []  # what changed, in order (None where the change names nothing)
        self.handled_exception = None  # the exception an `except` block of the trace is handling
        # The torch calls recorded while a vmapped function is traced, for its batching (vmap.py);
        # None outside such a trace.
        self.call_log: list | None = None
        # Torch function modes entered in the trace whose effect the trace reproduces (their
        # names, innermost last; see variables/function_modes.py).
        self.function_modes: list[str] = []

    # -- inputs
    def wrap(self, value: Any, source: Source | None, *, weight: tuple[str, str] | None = None,
             qualname: str | None = None) -> Var:
        return wrap(self, value, source, weight=weight, qualname=qualname)

    def wrap_container(self, value: Any, source: Source | None) -> Var:
        return wrap_container(self, value, source)

    def qualname_of(self, module: torch.nn.Module) -> str | None:
        return self._qualnames.get(id(module))

    def tensor_input(self, value: torch.Tensor, source: Source, weight: tuple[str, str] | None) -> TensorVar:
        known = self._tensors.get(id(value))
        if known is not None:
            var, first_source = known
            if first_source != source:
                self.guards.same_object(source, first_source)
            return var
        if value.is_sparse or value.layout != torch.strided:
            raise Unsupported(f"a {value.layout} tensor input")
        if type(value) not in (torch.Tensor, torch.nn.Parameter) and not isinstance(value, torch.nn.Parameter):
            raise Unsupported(f"a tensor subclass input ({type(value).__name__})")
        if type(value).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
            # A parameter whose data is a dispatching subclass (DTensor under FSDP2 or tensor
            # parallelism) passes the Parameter check above, but its ops are not plain tensor ops.
            raise Unsupported(f"a tensor subclass input ({type(value).__name__}): tensor subclasses "
                              "with their own dispatch, such as DTensor, are not captured")
        dims = self._dynamic_dims_of(value, source, weight)
        if dims and self.shapes is None:
            self.shapes = ShapeSession()
        self.guards.tensor(source, value, frozenset(dims))
        if weight is not None:
            # Weights are read from Program.weights by reference: the same object must be there.
            self.guards.id_is(source, value)
        if self.shapes is not None:
            try:
                fake = self.shapes.fake_input(value, source, dims)
            except Unsupported:
                raise
            except Exception as e:
                raise Unsupported(f"making a symbolic fake of {source.name_hint()}: {e}") from None
        else:
            fake = fake_from_real(value)
        device = device_str(value.device)
        meta = meta_of(fake, device)
        if weight is not None:
            kind, target = weight
            spec = InputSpec(kind, target)
            self.weights[target] = Weight(meta, value)
            name = clean_name(target)
        else:
            spec = InputSpec()
            name = clean_name(source.name_hint())
        ir_value = self.main_graph.add_input(name, meta, spec)
        var = TensorVar(ir_value, fake, device, source)
        self._tensors[id(value)] = (var, source)
        if weight is None:
            self.input_sources.append(source)
            self.example_inputs.append(value)
        return var

    def _dynamic_dims_of(self, value: torch.Tensor, source: Source, weight) -> dict[int, tuple]:
        if weight is not None or source_text(source) is None:
            return {}
        dims: dict[int, tuple[Any, Any]] = {d: (None, None) for d in self.dynamic_dims.get(source, ())}
        if self.dynamic_all:
            dims.update({d: (None, None) for d in range(value.dim())})
        dims.update(marked_dims(value))
        if dims and not value.is_contiguous():
            return {}  # symbolic strides of arbitrary layouts are not guarded: keep it static
        return dims

    # -- where we are in the user's code
    def location(self, frame: Frame | None = None) -> dict[str, Any] | None:
        frame = frame or (self.frames[-1] if self.frames else None)
        if frame is None or frame.inst is None:
            return None
        line = frame.inst.positions.lineno if frame.inst.positions else None
        if line is None:
            line = frame.code.co_firstlineno
        text = linecache.getline(frame.code.co_filename, line).strip()
        return {"file": frame.code.co_filename, "line": line, "text": text}

    def call_stack(self) -> list[dict[str, Any]]:
        return [loc for loc in (self.location(f) for f in self.frames[:-1]) if loc]

    def node_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {}
        loc = self.location()
        if loc:
            meta["source"] = loc
        if len(self.frames) > 1:
            meta["stack"] = self.call_stack()
        if self.module_stack and self.module_stack[-1]:
            meta["module"] = self.module_stack[-1]
        return meta

    @contextlib.contextmanager
    def in_module(self, qualname: str, type_name: str):
        self.module_stack.append(qualname)
        try:
            yield
        finally:
            self.module_stack.pop()

    # -- global state the graph must reproduce
    def set_grad_enabled(self, enabled: bool) -> None:
        if torch.is_grad_enabled() != enabled:
            self.graph.call(f"torch::{GRAD_MODE_OP}", [bool(enabled)], out=None, meta=self.node_meta())
        torch.set_grad_enabled(enabled)

    # -- calls
    def inline_call(self, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:  # fn: a function Var
        from fireclay_capture.interpreter.frame import Frame, bind_arguments

        if len(self.frames) >= config.max_inline_depth:
            raise Unsupported(f"calls nested deeper than {config.max_inline_depth} (unbounded recursion?)")
        code = fn.code
        f_globals, defaults, kwdefaults, cells = fn.frame_inputs(self)
        local_vars = bind_arguments(code, args, kwargs, defaults, kwdefaults)
        frame = Frame(self, code, f_globals, local_vars, cells)
        if code.co_flags & CO_GENERATOR:
            return frame.run_generator()
        if code.co_flags & ASYNC:
            raise Unsupported(f"calling async function {code.co_qualname}")
        return frame.run()

    def call_builtin(self, fn: Any, args: list[Var], kwargs: dict[str, Var]) -> Var:
        return call_builtin(self, fn, args, kwargs)

    @property
    def mutations(self) -> int:
        return len(self.mutated)

    def note_mutation(self, var: Any = None) -> None:
        self.mutated.append(var)

    def new_cell(self, contents: Any = NULL) -> CellVar:
        """A closure cell made inside the trace (MAKE_CELL)."""
        return CellVar(contents)

    def cell_var(self, cell: Any, source: Source) -> CellVar:
        """The one CellVar of a real closure cell in this trace (a write through one function or
        frame is seen through every other that shares the cell)."""
        known = self._cells.get(id(cell))
        if known is not None:
            if known.source is not None and known.source != source:
                self.guards.same_object(source, known.source)
            return known
        var = CellVar(real_cell=cell, source=source)
        self._cells[id(cell)] = var
        return var

    def write_attr(self, obj: Any, source: Source | None, name: str, value: Any) -> None:
        """Record ``obj.name = value`` (``value`` a Var, or DELETED for ``del obj.name``)."""
        if source is None:
            raise Unsupported(f"assigning attribute {name!r} of an object the capture cannot re-read")
        self.side_effects.write_attr(obj, source, name, value)

    def read_attr(self, obj: Any, name: str) -> Any:
        """The Var written to ``obj.name`` during the trace, DELETED, or None if never written."""
        return self.side_effects.read_attr(obj, name)

    def program(self) -> Program:
        program = Program.single(self.graph, weights=self.weights, producer=("fireclay-capture", "0.1.0"),
                                 dialects={"torch": TORCH.version, **({"hop": "1"} if self.subgraphs else {})})
        for graph in self.subgraphs:
            program.add_graph(graph)
        if self.shapes is not None:
            for name, hint, lo, hi in self.shapes.symbols():
                program.add_symbol(name, hint, lo, hi)
            # In terms of the symbols (the string form the format holds), not of the call's arguments.
            program.guards.extend(self.shapes.env.produce_guards().dumps())
        return program
