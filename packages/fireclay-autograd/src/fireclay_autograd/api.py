"""The entry points: compile a torch-dialect Program into a callable, or just look at its graphs.

A *backend* (``fw_compiler``, ``bw_compiler``) is any callable ``(program, example_inputs) ->
callable``: it receives an aten-dialect :class:`~fireclay_ir.Program` and one example tensor
per graph input, and returns a function taking those inputs positionally and returning the
graph's outputs as a sequence. The default runs the graph with this package's executor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fireclay_autograd.artifacts import InferenceArtifact, TrainingArtifact
from fireclay_autograd.convert import example_tensors, tensor_meta, torch_dtype
from fireclay_autograd.executor import run_program
from fireclay_autograd.joint import TracedGraph, trace_forward, trace_joint
from fireclay_autograd.layouts import BackwardAtFirstCall
from fireclay_autograd.partition import Partition, partition
from fireclay_autograd.runtime import InferenceRuntime, OutputPlan, TrainingRuntime
from fireclay_autograd.version import __version__
from fireclay_ir import IRError, Program, RunLimits, Weight, bind_inputs
from fireclay_ir.stages import in_stage

Backend = Callable[[Program, list[torch.Tensor]], Callable[..., Sequence[Any]]]


def interpreter_backend(program: Program, example_inputs: list[torch.Tensor]) -> Callable[..., Sequence[Any]]:
    """The default backend: run the aten graph op by op."""
    return lambda *args: run_program(program, *args)


def ir_interpreter_backend(program: Program, example_inputs: list[torch.Tensor]) -> Callable[..., Sequence[Any]]:
    """Run the graph with fireclay-ir's reference interpreter. It binds parameter, buffer and
    constant inputs from ``program.weights`` itself, so only the user inputs are passed on."""
    from fireclay_ir import interpret

    user = [i for i, spec in enumerate(program.main.input_specs) if spec.kind == "user"]
    return lambda *args: interpret(program, *[args[i] for i in user])


def _program(graph, source: Program | None, constants: dict[str, torch.Tensor] | None = None) -> Program:
    """An aten-dialect Program around ``graph``, holding the weights its inputs name."""
    program = Program.single(graph)
    program.producer = ("fireclay-autograd", __version__)
    program.dialects = {"aten": torch.__version__.split("+")[0]}
    if source is not None:
        program.symbols = dict(source.symbols)
        program.metadata = dict(source.metadata)
    for spec in graph.input_specs:
        if spec.target is None:
            continue
        if constants and spec.target in constants:
            program.weights[spec.target] = Weight(tensor_meta(constants[spec.target]), constants[spec.target])
        elif source is not None and spec.target in source.weights:
            program.weights[spec.target] = source.weights[spec.target]
    return program


def _bind_inputs(program: Program, example_inputs: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """All graph inputs (user inputs from ``example_inputs``, weights from the program) and the
    positions of the user inputs."""
    graph = program.main
    user_positions = [i for i, s in enumerate(graph.input_specs) if s.kind == "user"]
    if len(example_inputs) == len(graph.inputs):
        return list(example_inputs), list(range(len(graph.inputs)))
    if len(example_inputs) != len(user_positions):
        raise IRError(f"the program takes {len(user_positions)} user inputs "
                      f"({', '.join('%' + graph.inputs[i].name for i in user_positions)}), got {len(example_inputs)}")
    return bind_inputs(program, list(example_inputs)), user_positions


def trace_to_aten(program: Program, example_inputs: Sequence[Any], *, limits: RunLimits | None = None) -> Program:
    """The program as one functional aten-dialect graph (the inference path: no autograd).

    Its inputs are the program's inputs followed by lifted constants; its outputs are the
    program's outputs followed by the new values of inputs the program mutates. ``limits``: a
    program from someone else (``fireclay autograd``) is traced bounded in steps.
    """
    inputs, _ = _bind_inputs(program, example_inputs)
    from fireclay_autograd.dynamic import symbolic_or_static

    traced, mode = symbolic_or_static(program, inputs, lambda m: trace_forward(program, inputs, regenerate_aliases=False,
                                                                                  mode=m, limits=limits))
    return _specialised(_program(traced.graph, program, traced.constants), mode)


@dataclass
class AOTGraphs:
    """The forward/backward pair for a program whose inputs require grad, and the trace it came
    from. ``partition.forward`` returns the user outputs, the new values of mutated inputs,
    then the saved tensors (``partition.saved``); ``partition.backward`` takes the saved tensors
    then the tangents and returns the gradients of ``traced.grad_inputs``."""

    traced: TracedGraph
    partition: Partition

    @property
    def forward(self) -> Program:
        return self.partition.forward

    @property
    def backward(self) -> Program:
        return self.partition.backward


def aot_graphs(program: Program, example_inputs: Sequence[Any], *, partitioner: str = "min_cut",
               limits: RunLimits | None = None) -> AOTGraphs:
    """Trace the joint graph of ``program`` and partition it (for inspection and benchmarks).
    A program with symbolic input sizes gives graphs with symbolic sizes (static ones if its
    symbolic trace fails). ``limits``: traced bounded in steps (as :func:`trace_to_aten`)."""
    inputs, _ = _bind_inputs(program, example_inputs)
    from fireclay_autograd.dynamic import symbolic_or_static

    graphs, _ = symbolic_or_static(program, inputs, lambda m: _aot_graphs(program, inputs, partitioner, m, limits))
    return graphs


def _aot_graphs(program: Program, inputs: list[Any], partitioner: str, mode: Any = None,
                limits: RunLimits | None = None) -> AOTGraphs:
    traced = trace_joint(program, inputs, mode=mode, limits=limits)
    f = traced.functional
    num_fw_outputs = f.num_user_outputs + len(f.mutated_inputs)
    hints = {n: i.hint for n, i in mode.env.symbols.items()} if mode is not None else None
    with in_stage("partitioning"):
        part = partition(traced.graph, traced.num_forward_inputs, num_fw_outputs, strategy=partitioner, hints=hints)
    part.forward = _specialised(_program(part.forward.main, program, traced.constants), mode)
    part.backward = _specialised(_program(part.backward.main, program), mode)
    return AOTGraphs(traced, part)


def _specialised(program: Program, mode: Any) -> Program:
    """A static trace's aten program names no symbols."""
    if mode is None:
        program.symbols = {}
    return program


class CompiledProgram:
    """A program compiled for both paths, each traced on first use: the inference path when
    grad mode is off or no input requires grad, the training path otherwise."""

    def __init__(self, program: Program, example_inputs: Sequence[Any], *, fw_compiler: Backend | None = None,
                 bw_compiler: Backend | None = None, inference_compiler: Backend | None = None,
                 partitioner: str = "min_cut", artifact_cache: Any = None,
                 stage_timer: Callable[[str], Any] | None = None, inputs_checked: bool = False):
        self.program = program
        # Optional: an object with load(kind, inputs) -> artifact | None and store(kind, inputs,
        # artifact), kind "inference" or "training"; a hit skips tracing and partitioning.
        self.artifact_cache = artifact_cache
        # Optional: stage_timer("autograd") is a context manager around each trace of a program
        # with symbolic sizes (a static program's trace is timed by the artifact cache's load
        # and store); the compilers it calls run inside it.
        self.stage_timer = stage_timer
        self.fw_compiler = fw_compiler or interpreter_backend
        self.bw_compiler = bw_compiler or self.fw_compiler
        self.inference_compiler = inference_compiler or self.fw_compiler
        self.partitioner = partitioner
        inputs, self._user_positions = _bind_inputs(program, example_inputs)
        self._weights = {i: x for i, x in enumerate(inputs) if i not in self._user_positions}
        self._signature = [_signature(x) for x in inputs]
        self._expected = [_expected(sig) for sig in self._signature]
        # With ``inputs_checked`` the caller vouches that every call's inputs have the example
        # inputs' types, shapes, dtypes, devices and requires_grad (the capture's guards check
        # each of them, weights included): a call then only places the user inputs among the
        # weights, and whether any input requires grad is known now. The compiled code still
        # checks what it must for memory safety.
        self.inputs_checked = inputs_checked
        self._any_requires_grad = any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs)
        n_user = len(self._user_positions)
        self._weights_follow_users = (self._user_positions == list(range(n_user))
                                      and sorted(self._weights) == list(range(n_user, len(inputs))))
        self._weight_values = [self._weights[i] for i in sorted(self._weights)]
        self._inference: InferenceRuntime | None = None
        self._training: TrainingRuntime | None = None
        self.graphs: AOTGraphs | None = None
        # Symbolic input sizes: traced once for any size within the trace's guards.
        from fireclay_autograd.dynamic import DynamicProgram, has_symbolic_inputs

        self.dynamic = DynamicProgram(self) if has_symbolic_inputs(program) else None

    def __call__(self, *user_inputs: Any) -> tuple:
        if self.dynamic is not None:
            return self.dynamic(user_inputs)
        if self.inputs_checked and self._weights_follow_users and len(user_inputs) == len(self._user_positions):
            inputs = [*user_inputs, *self._weight_values]
            needs_grad = self._any_requires_grad and torch.is_grad_enabled()
        else:
            inputs = self._full_inputs(user_inputs)
            needs_grad = torch.is_grad_enabled() and any(
                isinstance(x, torch.Tensor) and x.requires_grad for x in inputs)
        if needs_grad:
            if self._training is None:
                self._training = self._compile_training(inputs)
            return self._training(*inputs)
        if self._inference is None:
            self._inference = self._compile_inference(inputs)
        return self._inference(*inputs)

    def _full_inputs(self, user_inputs: Sequence[Any]) -> list[Any]:
        if len(user_inputs) != len(self._user_positions):
            raise TypeError(f"compiled program takes {len(self._user_positions)} inputs, got {len(user_inputs)}")
        inputs: list[Any] = [None] * len(self._signature)
        for pos, x in zip(self._user_positions, user_inputs):
            inputs[pos] = x
        for pos, x in self._weights.items():
            inputs[pos] = x
        # _signature(x) == want, without building a signature per input (a program of many
        # weights is called with dozens of tensors, and this runs on every call)
        tensor = torch.Tensor
        for x, (shape, dtype, device) in zip(inputs, self._expected):
            if shape is None:
                same = not isinstance(x, tensor) and type(x).__name__ == dtype
            else:
                same = (isinstance(x, tensor) and x.dtype is dtype and x.shape == shape
                        and (x.is_cpu if device == "cpu" else x.device.type == device))
            if not same:
                self._reject(inputs)
        return inputs

    def _reject(self, inputs: list[Any]) -> None:
        for i, (x, want) in enumerate(zip(inputs, self._signature)):
            if _signature(x) != want:
                name = self.program.main.inputs[i].name
                raise TypeError(f"input %{name} is {_describe(_signature(x))} but the program was compiled for "
                                f"{_describe(want)}; recompile for the new shapes")
        raise TypeError("the inputs do not match those the program was compiled for; recompile for them")

    def _artifact(self, kind: str, inputs: list[Any], build: Callable[[list[Any]], Any]) -> Any:
        cache = self.artifact_cache
        artifact = cache.load(kind, inputs) if cache is not None else None
        if artifact is None:
            artifact = build(inputs)
            if cache is not None:
                cache.store(kind, inputs, artifact)
        return artifact

    def _compile_inference(self, inputs: list[Any]) -> InferenceRuntime:
        art = self._artifact("inference", inputs, self._inference_artifact)
        compiled = self.inference_compiler(art.program, list(inputs) + art.constants)
        return InferenceRuntime(compiled, art.plan, art.constants)

    def _inference_artifact(self, inputs: list[Any]) -> InferenceArtifact:
        traced = trace_forward(self.program, inputs)
        program = _program(traced.graph, self.program, traced.constants)
        f = traced.functional
        plan = OutputPlan(f.num_user_outputs, f.mutated_inputs, f.output_aliases, f.num_intermediate_bases)
        return InferenceArtifact(program, plan, list(traced.constants.values()))

    def _compile_training(self, inputs: list[Any]) -> TrainingRuntime:
        art = self._artifact("training", inputs, self._training_artifact)
        fw = self.fw_compiler(art.forward, list(inputs) + art.constants)
        # Compiled for the layouts the saved tensors and tangents arrive in (fireclay_autograd.layouts),
        # once a forward that runs a stand-in while compiling has settled.
        bw = BackwardAtFirstCall(self.bw_compiler, art.backward, _examples, forward=fw)
        return TrainingRuntime(fw, bw, art.plan, art.constants, art.num_saved, art.tangent_outputs,
                               art.grad_inputs, art.tangent_metas)

    def _training_artifact(self, inputs: list[Any]) -> TrainingArtifact:
        graphs = self.graphs = _aot_graphs(self.program, inputs, self.partitioner)
        traced, part = graphs.traced, graphs.partition
        f = traced.functional
        plan = OutputPlan(f.num_user_outputs, f.mutated_inputs, f.output_aliases, 0, f.num_hidden_outputs)
        tangent_metas = []
        for v in traced.graph.inputs[traced.num_forward_inputs:]:
            tangent_metas.append((torch.Size(v.meta.shape), torch_dtype(v.meta.dtype), torch.device(v.meta.device)))
        return TrainingArtifact(part.forward, part.backward, plan, list(traced.constants.values()), len(part.saved),
                                traced.tangent_outputs, traced.grad_inputs, tangent_metas)


def _signature(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.dtype, x.device.type)
    return ("value", type(x).__name__)


def _expected(sig: Any) -> tuple:
    """(shape, dtype, device type) of a tensor signature; (None, type name, None) of a value's."""
    if sig[0] == "tensor":
        return sig[1], sig[2], sig[3]
    return None, sig[1], None


def _describe(sig: Any) -> str:
    if sig[0] == "tensor":
        return f"a {sig[2]} tensor of shape {list(sig[1])} on {sig[3]}"
    return f"a {sig[1]}"


def _examples(program: Program) -> list[torch.Tensor]:
    return example_tensors(program.main.inputs)


def compile_program(program: Program, example_inputs: Sequence[Any], *, fw_compiler: Backend | None = None,
                    bw_compiler: Backend | None = None, inference_compiler: Backend | None = None,
                    partitioner: str = "min_cut", artifact_cache: Any = None,
                    stage_timer: Callable[[str], Any] | None = None, inputs_checked: bool = False) -> CompiledProgram:
    """Compile a torch-dialect ``program`` into a callable taking its user inputs (weights are
    bound from ``program.weights``, or pass every graph input). Gradients flow to inputs that
    require grad as in eager; inputs the program mutates are updated in place.
    ``artifact_cache`` (see :class:`CompiledProgram`) lets a compile reuse stored artifacts;
    ``stage_timer`` times the traces of programs with symbolic sizes. ``inputs_checked=True``
    says the caller checks, before each call, that the inputs have the example inputs' types,
    shapes, strides, dtypes, devices and requires_grad (as the capture's guards do): the call
    then skips its own check of them."""
    return CompiledProgram(program, example_inputs, fw_compiler=fw_compiler, bw_compiler=bw_compiler,
                           inference_compiler=inference_compiler, partitioner=partitioner,
                           artifact_cache=artifact_cache, stage_timer=stage_timer, inputs_checked=inputs_checked)


def aot_backend(fw_compiler: Backend | None = None, bw_compiler: Backend | None = None, *,
                partitioner: str = "min_cut") -> Backend:
    """A capture backend ``(program, example_inputs) -> callable`` that runs this package's
    pipeline and hands the aten graphs to ``fw_compiler`` / ``bw_compiler``."""

    def backend(program: Program, example_inputs: list[torch.Tensor]) -> Callable[..., Sequence[Any]]:
        return compile_program(program, example_inputs, fw_compiler=fw_compiler, bw_compiler=bw_compiler,
                               partitioner=partitioner)

    return backend
