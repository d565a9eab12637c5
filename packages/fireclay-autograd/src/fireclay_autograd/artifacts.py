"""What this stage produces, as data that can be written to disk and read back.

A compiled program's inference path is an :class:`InferenceArtifact` (one functional aten
program and the plan that turns its outputs into the user's); its training path is a
:class:`TrainingArtifact` (forward and backward aten programs, the saved-tensor count and which
outputs take tangents and which inputs get gradients). Code generation starts from these, so a
second process that reads them back skips tracing, functionalization and partitioning.

``dumps_artifact`` gives one JSON text: the programs in fireclay-ir's canonical form (weights
by metadata only: a cache must not hold a model's parameters), the runtime plan, and the lifted
constants' values (small tensors made during tracing, base64 of their bytes). No pickle:
``loads_artifact`` reads only plain JSON and fireclay-ir documents, and rebinds each program's
weights to the data of the program it was compiled from. Anything malformed raises
:class:`ArtifactError`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

import torch

from fireclay_autograd.convert import dtype_name, tensor_meta, torch_dtype
from fireclay_autograd.functionalize import OutputAlias, ViewStep
from fireclay_autograd.runtime import OutputPlan
from fireclay_ir import Device, DType, IRError, Layout, MemoryFormat, Program, SymExpr, Weight, dumps, loads

FORMAT = "fireclay-autograd-artifact"
FORMAT_VERSION = 1


class ArtifactError(IRError):
    """An artifact that cannot be written (it holds something with no JSON form) or read back."""


@dataclass
class InferenceArtifact:
    """The inference path: ``program`` takes the graph inputs then ``constants``."""

    program: Program
    plan: OutputPlan
    constants: list[torch.Tensor]


@dataclass
class TrainingArtifact:
    """The training path; the fields are :class:`~fireclay_autograd.runtime.TrainingRuntime`'s."""

    forward: Program
    backward: Program
    plan: OutputPlan
    constants: list[torch.Tensor]
    num_saved: int
    tangent_outputs: list[int]
    grad_inputs: list[int]
    tangent_metas: list[tuple[torch.Size, torch.dtype, torch.device]]


Artifact = InferenceArtifact | TrainingArtifact


# -- atoms (the arguments of view steps)

_ENUM_ATOMS = {"dtype": DType, "device": Device, "layout": Layout, "memory_format": MemoryFormat}


def _atom_to_json(x: Any) -> Any:
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):  # tagged: JSON has no inf/nan, and 2.0 must not come back as 2
        return {"$": "float", "v": repr(x)}
    if isinstance(x, (list, tuple)):
        return {"$": "list" if isinstance(x, list) else "tuple", "v": [_atom_to_json(a) for a in x]}
    if isinstance(x, SymExpr):
        return {"$": "sym", "v": x.expr}
    for tag, cls in _ENUM_ATOMS.items():
        if isinstance(x, cls):
            return {"$": tag, "v": x.name}
    raise ArtifactError(f"a view step argument of type {type(x).__name__} has no serialized form")


def _atom_from_json(x: Any) -> Any:
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if not isinstance(x, dict) or set(x) != {"$", "v"}:
        raise ArtifactError(f"malformed atom {x!r}")
    tag, v = x["$"], x["v"]
    if tag == "float":
        return float(v)
    if tag in ("list", "tuple"):
        items = [_atom_from_json(a) for a in _list(v, "atom list")]
        return items if tag == "list" else tuple(items)
    if tag == "sym":
        return SymExpr(v)
    if tag in _ENUM_ATOMS:
        return _ENUM_ATOMS[tag](v)
    raise ArtifactError(f"unknown atom tag {tag!r}")


def _list(x: Any, what: str) -> list:
    if not isinstance(x, list):
        raise ArtifactError(f"{what}: expected a list, got {type(x).__name__}")
    return x


def _ints(x: Any, what: str) -> list[int]:
    items = _list(x, what)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        raise ArtifactError(f"{what}: expected integers, got {items!r}")
    return items


# -- the runtime plan

def _plan_to_json(plan: OutputPlan) -> dict[str, Any]:
    """Every field of the plan: aliases by their view chains, the rest as atoms (a field of
    another kind cannot be written, so such a plan is simply not cached)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(plan):
        value = getattr(plan, f.name)
        out[f.name] = _aliases_to_json(value) if f.name == "output_aliases" else _atom_to_json(value)
    return out


def _aliases_to_json(aliases: list[OutputAlias | None]) -> list[Any]:
    out: list[Any] = []
    for alias in aliases:
        if alias is None:
            out.append(None)
            continue
        chain = [{"op": s.op, "args": _atom_to_json(list(s.args)),
                  "kwargs": [[k, _atom_to_json(v)] for k, v in s.kwargs]} for s in alias.chain]
        out.append({"kind": alias.kind, "index": alias.index, "chain": chain})
    return out


def _plan_from_json(d: Any) -> OutputPlan:
    if not isinstance(d, dict):
        raise ArtifactError("malformed output plan")
    names = {f.name for f in dataclasses.fields(OutputPlan)}
    if set(d) != names:
        raise ArtifactError(f"the output plan has fields {sorted(d)}, this fireclay-autograd {sorted(names)}")
    try:
        aliases: list[OutputAlias | None] = []
        for a in _list(d["output_aliases"], "output_aliases"):
            if a is None:
                aliases.append(None)
                continue
            if not isinstance(a["kind"], str) or not isinstance(a["index"], int):
                raise ArtifactError(f"malformed output alias {a!r}")
            chain = tuple(ViewStep(str(s["op"]), tuple(_atom_from_json(s["args"])),
                                   tuple((str(k), _atom_from_json(v)) for k, v in s["kwargs"]))
                          for s in _list(a["chain"], "alias chain"))
            aliases.append(OutputAlias(a["kind"], a["index"], chain))
        fields = {name: _atom_from_json(v) for name, v in d.items() if name != "output_aliases"}
        plan = OutputPlan(output_aliases=aliases, **fields)
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"malformed output plan: {type(e).__name__}: {e}") from None
    if not isinstance(plan.num_user_outputs, int) or not isinstance(plan.mutated_inputs, list):
        raise ArtifactError("malformed output plan: num_user_outputs or mutated_inputs")
    _ints(plan.mutated_inputs, "mutated_inputs")
    return plan


# -- tensors (lifted constants: small, made while tracing)

def _tensor_to_json(name: str, t: torch.Tensor) -> dict[str, Any]:
    # bytes without numpy (not a dependency); lifted constants are small
    data = bytes(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).tolist()) if t.numel() else b""
    return {"name": name, "dtype": dtype_name(t.dtype), "shape": list(t.shape), "stride": list(t.stride()),
            "device": str(t.device), "data": base64.b64encode(data).decode("ascii")}


def _tensor_from_json(d: Any) -> tuple[str, torch.Tensor]:
    try:
        dtype = torch_dtype(d["dtype"])
        shape, stride = _ints(d["shape"], "constant shape"), _ints(d["stride"], "constant stride")
        raw = base64.b64decode(d["data"], validate=True)
        numel = math.prod(shape)
        if len(raw) != numel * dtype.itemsize:
            raise ArtifactError(f"constant {d['name']!r}: {len(raw)} bytes for {numel} {d['dtype']} elements")
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype) if raw else torch.empty(0, dtype=dtype)
        t = torch.empty_strided(shape, stride, dtype=dtype, device=torch.device(d["device"]))
        t.copy_(flat.reshape(shape))
        return str(d["name"]), t
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise ArtifactError(f"malformed constant: {type(e).__name__}: {e}") from None


# -- programs

def _program_text(program: Program) -> str:
    try:
        return dumps(program)
    except IRError as e:
        raise ArtifactError(f"the aten program cannot be serialized: {e}") from None


def _program_from_text(text: Any, source: Program, constants: dict[str, torch.Tensor]) -> Program:
    if not isinstance(text, str):
        raise ArtifactError("a program must be stored as fireclay-ir JSON text")
    program = loads(text, verify=False)
    for spec in program.main.input_specs:
        if spec.target is None:
            continue
        if spec.target in constants:
            program.weights[spec.target] = Weight(tensor_meta(constants[spec.target]), constants[spec.target])
        elif spec.target in source.weights:
            program.weights[spec.target] = source.weights[spec.target]
    return program


def _constant_names(program: Program, constants: list[torch.Tensor]) -> list[str]:
    """The weight names the lifted constants have in ``program`` (they come last among its
    named inputs, in order)."""
    by_identity = {id(w.data): name for name, w in program.weights.items() if w.data is not None}
    names = [by_identity.get(id(c)) for c in constants]
    if None in names:
        raise ArtifactError("a lifted constant is not among the program's weights")
    return names  # type: ignore[return-value]


def dumps_artifact(artifact: Artifact) -> str:
    """One JSON text for ``artifact`` (parameters by metadata, constants by value)."""
    first = artifact.program if isinstance(artifact, InferenceArtifact) else artifact.forward
    names = _constant_names(first, artifact.constants)
    doc: dict[str, Any] = {
        "format": FORMAT, "version": FORMAT_VERSION, "torch": torch.__version__,
        "plan": _plan_to_json(artifact.plan),
        "constants": [_tensor_to_json(n, c) for n, c in zip(names, artifact.constants)],
    }
    if isinstance(artifact, InferenceArtifact):
        doc.update(kind="inference", program=_program_text(artifact.program))
    else:
        doc.update(kind="training", forward=_program_text(artifact.forward),
                   backward=_program_text(artifact.backward), num_saved=artifact.num_saved,
                   tangent_outputs=list(artifact.tangent_outputs), grad_inputs=list(artifact.grad_inputs),
                   tangent_metas=[[list(s), dtype_name(dt), str(dev)] for s, dt, dev in artifact.tangent_metas])
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def loads_artifact(text: str, source: Program) -> Artifact:
    """Read an artifact back; weights are bound to ``source``'s (the program it was compiled
    from, or one with the same weight names and metadata)."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ArtifactError(f"not an artifact: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ArtifactError(f"not a {FORMAT} document")
    if doc.get("version") != FORMAT_VERSION:
        raise ArtifactError(f"artifact version {doc.get('version')!r}; this fireclay-autograd reads {FORMAT_VERSION}")
    try:
        named = dict(_tensor_from_json(c) for c in _list(doc["constants"], "constants"))
        plan = _plan_from_json(doc["plan"])
        constants = list(named.values())
        if doc["kind"] == "inference":
            return InferenceArtifact(_program_from_text(doc["program"], source, named), plan, constants)
        if doc["kind"] != "training":
            raise ArtifactError(f"unknown artifact kind {doc['kind']!r}")
        metas = []
        for shape, dt, dev in _list(doc["tangent_metas"], "tangent_metas"):
            metas.append((torch.Size(_ints(shape, "tangent shape")), torch_dtype(dt), torch.device(dev)))
        return TrainingArtifact(
            _program_from_text(doc["forward"], source, named), _program_from_text(doc["backward"], source, {}),
            plan, constants, int(doc["num_saved"]), _ints(doc["tangent_outputs"], "tangent_outputs"),
            _ints(doc["grad_inputs"], "grad_inputs"), metas)
    except ArtifactError:
        raise
    except IRError as e:
        raise ArtifactError(f"a stored program does not load: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"malformed artifact: {type(e).__name__}: {e}") from None

