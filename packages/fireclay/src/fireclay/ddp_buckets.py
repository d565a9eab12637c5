"""DDP-aware graph splitting (``config.optimize_ddp``), as TorchDynamo's DDPOptimizer does it.

A graph compiled as one piece has one autograd backward: every parameter's gradient appears when
that backward ends, so DDP's bucketed all-reduces all start after the whole backward. Cut the
graph where DDP's buckets end and compile each piece on its own: the last piece's backward runs
first, its parameters' gradients become ready, DDP's reducer launches that bucket's all-reduce,
and the earlier pieces' backward runs while it travels.

DDP's reducer fills buckets with parameters in reverse order of use, up to ``bucket_bytes_cap``
bytes each (the first bucket closed is smaller: ``torch.distributed``'s first-bucket size). The
pieces follow the same rule over the graph's parameter inputs, walking the nodes backwards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from fireclay_ir import Program, Value
from fireclay_ir.interpreter import interpret
from fireclay_ir.passes import SplitProgram, split_program

log = logging.getLogger("fireclay")

_ITEM_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
               "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}


def parameter_bytes(value: Value) -> int:
    meta = value.type
    count = 1
    for d in meta.shape:
        count *= d if isinstance(d, int) else 1
    return count * _ITEM_BYTES.get(meta.dtype, 4)


def bucket_boundaries(program: Program, bucket_bytes: int, first_bucket_bytes: int | None = None) -> list[int]:
    """Node indices to cut the entry graph before, so that each piece's trainable parameters
    fill about one DDP bucket. A parameter belongs to the node that first reads it; nodes are
    walked from the last, a bucket closes once it holds ``bucket_bytes`` (the first one closed:
    ``first_bucket_bytes``) and the next node back starts a new piece."""
    graph = program.main
    trainable = {v for v, s in zip(graph.inputs, graph.input_specs)
                 if s.kind == "parameter" and getattr(v.type, "requires_grad", False)}
    owner: dict[Value, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs():
            if v in trainable and v not in owner:
                owner[v] = i
    bytes_at: dict[int, int] = {}
    for v, i in owner.items():
        bytes_at[i] = bytes_at.get(i, 0) + parameter_bytes(v)
    cuts: list[int] = []
    held = 0
    cap = first_bucket_bytes if first_bucket_bytes is not None else bucket_bytes
    for i in range(len(graph.nodes) - 1, 0, -1):
        held += bytes_at.get(i, 0)
        if held >= cap:
            cuts.append(i)
            held = 0
            cap = bucket_bytes
    return sorted(cuts)


def compile_in_buckets(program: Program, example_inputs: list, compiler: Callable[..., Any],
                       bucket_bytes: int, first_bucket_bytes: int | None = None) -> Callable[..., Any]:
    """``program`` cut at DDP's bucket boundaries, each piece compiled by ``compiler``; returns
    one callable running the chain (or the whole program compiled, when it fills one bucket)."""
    cuts = bucket_boundaries(program, bucket_bytes, first_bucket_bytes)
    if not cuts:
        return compiler(program, example_inputs)
    split = split_program(program, cuts)
    log.info("fireclay: optimize_ddp split the graph into %d pieces at nodes %s", len(split.pieces), cuts)
    compiled = [compiler(piece.program, examples)
                for piece, examples in zip(split.pieces, _piece_examples(split, example_inputs))]
    return SplitRunner(split, compiled)


class SplitRunner:
    """Runs a split program's compiled pieces in order; called like the whole compiled program."""

    def __init__(self, split: SplitProgram, compiled: list[Callable[..., Any]]):
        self.split = split
        self.compiled = compiled

    def __call__(self, *inputs: Any) -> tuple:
        return tuple(self.split.run(self.compiled, inputs))

    @property
    def piece_count(self) -> int:
        return len(self.compiled)


def _piece_examples(split: SplitProgram, example_inputs: list) -> list[list]:
    """Example inputs of every piece: the values passing between pieces, computed once in the
    interpreter without gradients, carrying the ``requires_grad`` their types record."""
    examples: list[list] = []

    def recording(piece_index: int):
        piece = split.pieces[piece_index]

        def run(*args: Any) -> tuple:
            graph = piece.program.main
            user = [v for v, s in zip(graph.inputs, graph.input_specs) if s.kind == "user"]
            examples.append([_like(a, v) for a, v in zip(args, user)])
            return interpret(piece.program, *args)

        return run

    with torch.no_grad():
        split.run([recording(i) for i in range(len(split.pieces))], list(example_inputs))
    return examples


def _like(example: Any, value: Value) -> Any:
    if not isinstance(example, torch.Tensor):
        return example
    wants_grad = bool(getattr(value.type, "requires_grad", False))
    if example.requires_grad == wants_grad:
        return example
    return example.detach().requires_grad_(wants_grad)
