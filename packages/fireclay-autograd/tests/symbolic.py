"""Test-only: give a torch-dialect Program symbolic input sizes, as fireclay-capture does with
``dynamic=True``, and make inputs of the same kinds at other sizes."""

from __future__ import annotations

from typing import Any

import torch

from fireclay_ir import Program


def make_dynamic(program: Program, inputs: list[Any]) -> dict[int, str]:
    """Every dim of size >= 2 of the program's tensor user inputs becomes a symbol; equal
    sizes share one (duck sizing). Returns size -> symbol name."""
    graph = program.main
    by_size: dict[int, str] = {}
    user = [v for v, spec in zip(graph.inputs, graph.input_specs) if spec.kind == "user"]
    for v, x in zip(user, inputs):
        if not isinstance(x, torch.Tensor) or not v.is_tensor or not x.is_contiguous():
            continue
        shape = []
        for size in v.meta.shape:
            if size >= 2:
                if size not in by_size:
                    by_size[size] = f"s{len(by_size)}"
                    program.add_symbol(by_size[size], hint=size, min=2)
                shape.append(by_size[size])
            else:
                shape.append(size)
        v.type = v.meta.with_(shape=tuple(shape), strides=None)
    return by_size


def resized(x: Any, sizes: dict[int, int]) -> Any:
    """``x`` with every dim whose size is a key of ``sizes`` grown to that size: its entries
    tiled (so value domains stay: positive, in (-1, 1), valid indices), floats rescaled by a
    fresh random factor in [0.9, 1] so the values are new."""
    if not isinstance(x, torch.Tensor) or not x.is_contiguous():
        return x
    y = x.detach()
    for d, size in enumerate(x.shape):
        if size in sizes:
            index = torch.arange(sizes[size]) % size
            y = y.index_select(d, index)
    if y.dtype.is_floating_point:
        y = y * (0.9 + 0.1 * torch.rand_like(y))
    return y.clone().requires_grad_(x.requires_grad)
