"""Inputs for ``fireclay run`` and friends: specs on the command line, safetensors files, or
tensors generated from the program's own input types; and a readable summary of outputs.

Spec grammar (one per program input, in order)::

    randn:2x3:float32     normal samples        rand:4:float64      uniform in [0, 1)
    zeros:2x3:int64       ones:3x1:bool         randint:8:int64     integers in [0, 10)
    randn::float32        a 0-d tensor (empty shape)
    int:5  float:2.5  bool:true                 Python scalars
    data.safetensors      every tensor of the file, in name order
    data.safetensors:w    the tensor named w

No pickle files: ``.pt`` is refused, since loading one can run arbitrary code.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from fireclay_ir import Program, RunLimitError, RunLimits, TensorMeta, bind_inputs, evaluate_symexpr
from fireclay_ir.safetensors_io import raw_to_tensor, read_safetensors, tensor_to_raw, write_safetensors

GENERATORS = ("randn", "rand", "zeros", "ones", "randint")
SCALARS = ("int", "float", "bool")


from fireclay.cli.errors import InputSpecError  # noqa: E402  (defined without torch, for the CLI's errors)


def _shape(text: str, spec: str) -> tuple[int, ...]:
    if text in ("", "()", "scalar"):
        return ()
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise InputSpecError(f"input {spec!r}: shape {text!r} is not sizes joined by 'x' (like 2x3)") from None
    if any(d < 0 for d in dims):
        raise InputSpecError(f"input {spec!r}: sizes must not be negative")
    return dims


def _dtype(name: str, spec: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise InputSpecError(f"input {spec!r}: unknown dtype {name!r} (use torch's names: float32, int64, bool, ...)")
    return dtype


def generate(kind: str, shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator,
             device: str = "cpu") -> torch.Tensor:
    if kind == "zeros":
        return torch.zeros(shape, dtype=dtype, device=device)
    if kind == "ones":
        return torch.ones(shape, dtype=dtype, device=device)
    if kind == "randint" or not (dtype.is_floating_point or dtype.is_complex):
        high = 2 if dtype == torch.bool else 10
        return torch.randint(0, high, shape, generator=generator).to(dtype=dtype, device=device)
    sample = torch.randn if kind == "randn" else torch.rand
    return sample(shape, generator=generator, dtype=dtype).to(device)


def parse_input(spec: str, generator: torch.Generator) -> list[Any]:
    """The value(s) one spec stands for (a safetensors file may give several)."""
    path, _, name = spec.partition(".safetensors")
    if _ or spec.endswith(".safetensors"):
        return _from_safetensors(path + ".safetensors", name.removeprefix(":"), spec)
    if spec.endswith((".pt", ".pth", ".bin", ".pkl")):
        raise InputSpecError(f"input {spec!r}: pickle files are not read (loading one can run code); "
                             "save the tensors with safetensors instead")
    kind, _, rest = spec.partition(":")
    if kind in SCALARS:
        try:
            if kind == "bool":
                if rest.lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                return [rest.lower() in ("true", "1")]
            return [int(rest) if kind == "int" else float(rest)]
        except ValueError:
            raise InputSpecError(f"input {spec!r}: {rest!r} is not a {kind}") from None
    if kind not in GENERATORS:
        raise InputSpecError(f"input {spec!r}: expected KIND:SHAPE[:DTYPE] with KIND one of "
                             f"{', '.join(GENERATORS)}, a scalar ({', '.join(s + ':VALUE' for s in SCALARS)}) "
                             "or a .safetensors file")
    shape_text, _, dtype_text = rest.partition(":")
    dtype = _dtype(dtype_text or ("int64" if kind == "randint" else "float32"), spec)
    return [generate(kind, _shape(shape_text, spec), dtype, generator)]


def _from_safetensors(path: str, name: str, spec: str) -> list[torch.Tensor]:
    if not os.path.exists(path):
        raise FileNotFoundError(f"input {spec!r}: no such file {path!r}")
    tensors, _ = read_safetensors(path)
    if name:
        if name not in tensors:
            raise InputSpecError(f"input {spec!r}: {path} holds no tensor {name!r} (it holds {', '.join(sorted(tensors))})")
        return [raw_to_tensor(tensors[name])]
    return [raw_to_tensor(tensors[k]) for k in sorted(tensors)]


def user_inputs(program: Program) -> list:
    """The entry graph's user inputs (weights and constants come from the program)."""
    graph = program.main
    return [v for v, spec in zip(graph.inputs, graph.input_specs) if spec.kind == "user"]


def bind_weights(program: Program, values: list[Any]) -> list[Any]:
    """Every entry-graph input: ``values`` for the user inputs, weight data for the others."""
    return bind_inputs(program, values, error=InputSpecError,
                       hint="no data for it was saved beside the program (its .fcir.safetensors file)")


def _size(dim: Any, program: Program) -> int:
    if isinstance(dim, int):
        return dim
    hints = {name: s.hint for name, s in program.symbols.items() if s.hint is not None}
    try:
        return int(evaluate_symexpr(dim, hints))
    except Exception:
        raise InputSpecError(f"the size {dim} has no hint in the program; give this input with --inputs") from None


def inputs_for(program: Program, specs: list[str] | None, seed: int = 0,
               limits: RunLimits | None = None) -> list[Any]:
    """Inputs from ``specs``, or generated from the program's input types (symbolic sizes at
    their hints) when no spec is given; with ``limits``, an input larger than they allow is an
    InputSpecError before anything is allocated."""
    generator = torch.Generator().manual_seed(seed)
    expected = user_inputs(program)
    if specs:
        values = [v for spec in specs for v in parse_input(spec, generator)]
        if len(values) != len(expected):
            names = ", ".join(f"%{v.name}" for v in expected)
            raise InputSpecError(f"the program takes {len(expected)} input(s) ({names}); --inputs gave {len(values)}")
        return values
    values = []
    for v in expected:
        if not isinstance(v.type, TensorMeta):
            raise InputSpecError(f"input %{v.name} is a {v.type.kind} scalar; give the inputs with --inputs")
        meta = v.type
        shape = tuple(_size(d, program) for d in meta.shape)
        if limits is not None:
            try:
                limits.check_tensor(shape, meta.dtype, f"input %{v.name}")
            except RunLimitError as e:
                raise InputSpecError(str(e)) from None
        device = meta.device if meta.device.startswith("cpu") or torch.cuda.is_available() else "cpu"
        values.append(generate("randn", shape, _dtype(meta.dtype, meta.dtype), generator, device))
    return values


def save_tensors(path: str, values: list[Any], prefix: str) -> None:
    tensors = {f"{prefix}{i}": tensor_to_raw(v) for i, v in enumerate(values) if isinstance(v, torch.Tensor)}
    write_safetensors(path, tensors)


def summarize(name: str, value: Any, full: bool = False) -> str:
    """One line per value: dtype, shape and statistics; the values too when small or asked for."""
    if not isinstance(value, torch.Tensor):
        return f"{name}: {type(value).__name__} {value!r}"
    dtype = str(value.dtype).removeprefix("torch.")
    head = f"{name}: {dtype}[{', '.join(str(d) for d in value.shape)}]"
    if value.numel() == 0:
        return head + " (empty)"
    stats = value.detach().to("cpu")
    if stats.dtype.is_floating_point:
        head += f" min={stats.min().item():.6g} max={stats.max().item():.6g} mean={stats.mean().item():.6g}"
    elif stats.dtype != torch.bool and not stats.dtype.is_complex:
        head += f" min={stats.min().item()} max={stats.max().item()}"
    if full or value.numel() <= 16:
        head += "\n  " + str(stats.tolist())
    return head
