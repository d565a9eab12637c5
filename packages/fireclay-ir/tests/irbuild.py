"""Small helpers the semantics tests share for building programs by hand."""

from __future__ import annotations

from fireclay_ir import Graph, Program, ScalarType, TensorMeta

F32 = "float32"


def t(*shape, dtype: str = F32) -> TensorMeta:
    return TensorMeta(dtype, tuple(shape))


INT = ScalarType("int")


def program_of(graph: Graph, **kwargs) -> Program:
    return Program.single(graph, **kwargs)


def src(line: int, text: str = "y = f(x)") -> dict:
    return {"source": {"file": "model.py", "line": line, "text": text}}
