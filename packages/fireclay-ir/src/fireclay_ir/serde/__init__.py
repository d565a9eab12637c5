"""The serialized format: ``dumps``/``loads`` for the JSON text, ``save``/``load`` for files.

A program is saved as ``<stem>.fcir.json`` (the canonical JSON document) and, when any weight
holds data, ``<stem>.fcir.safetensors`` beside it. docs/format/README.md specifies both.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, cast

from fireclay_ir.files import write_atomic
from fireclay_ir.model import Program, TensorMeta
from fireclay_ir.safetensors_io import (
    RawTensor,
    open_regular_file,
    raw_to_tensor,
    read_safetensors,
    tensor_to_raw,
    write_safetensors,
)
from fireclay_ir.serde.limits import DEFAULT_LIMITS, FormatError, Limits
from fireclay_ir.serde.reader import from_document, parse_json
from fireclay_ir.serde.writer import document_text, to_document
from fireclay_ir.upgraders import UPGRADERS, UpgraderRegistry

__all__ = ["FormatError", "Limits", "dumps", "loads", "save", "load", "weights_path"]


def dumps(program: Program, *, limits: Limits = DEFAULT_LIMITS) -> str:
    """The canonical JSON text of ``program`` (weights' metadata only, never their data)."""
    return document_text(to_document(program, limits))


def _verify(program: Program) -> None:
    try:
        from fireclay_ir.verifier import verify
    except ImportError:  # fireclay-ir built without its verifier module: nothing more to check
        return
    verify(program)


def loads(
    text: str,
    *,
    limits: Limits = DEFAULT_LIMITS,
    upgraders: UpgraderRegistry = UPGRADERS,
    allow_newer_minor: bool = False,
    check_ops: bool = True,
    verify: bool = True,
) -> Program:
    """A Program from JSON text; weights come without data. Raises FormatError (or the
    verifier's IRError) for anything malformed.

    ``allow_newer_minor`` reads a document of a newer minor version of the same major, ignoring
    the fields this version does not know. ``check_ops`` checks every op against the dialect
    registries; ``verify`` runs the verifier on the result.
    """
    doc = parse_json(text, limits)
    program = from_document(doc, limits=limits, upgraders=upgraders, allow_newer_minor=allow_newer_minor,
                            check_ops=check_ops)
    if verify:
        _verify(program)
    return program


def weights_path(path: str | os.PathLike[str]) -> str:
    """Where the weights of the document at ``path`` live: ``x.fcir.json`` -> ``x.fcir.safetensors``."""
    p = os.fspath(path)
    return (p[: -len(".json")] if p.endswith(".json") else p) + ".safetensors"


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _weight_bytes(name: str, meta: TensorMeta, data: Any) -> RawTensor:
    where = f"weights.{name}"
    if not all(isinstance(d, int) for d in meta.shape):
        raise FormatError(where, f"a weight with data needs a static shape, got {list(meta.shape)}")
    if _is_torch_tensor(data):
        if getattr(data.device, "type", None) == "meta":
            raise FormatError(where, "the tensor is on the meta device and has no data to save; "
                                     "set Weight.data to None or to a real tensor")
        raw = tensor_to_raw(data)
        if raw.dtype != meta.dtype or raw.shape != tuple(meta.shape):
            raise FormatError(where, f"the tensor is {raw.dtype}{list(raw.shape)} but the weight's type says "
                                     f"{meta.dtype}{list(meta.shape)}")
        return raw
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            return RawTensor(meta.dtype, cast(tuple[int, ...], tuple(meta.shape)), bytes(data))
        except FormatError as exc:
            raise FormatError(where, exc.problem) from None
    raise FormatError(where, f"weight data must be a torch.Tensor or bytes, got {type(data).__name__}")


def save(program: Program, path: str | os.PathLike[str], *, limits: Limits = DEFAULT_LIMITS) -> None:
    """Write ``program`` to ``path`` (``x.fcir.json``) and its weight data to ``x.fcir.safetensors``.

    A stale weights file from an earlier save is removed when no weight holds data now.
    """
    text = dumps(program, limits=limits)
    tensors = {name: _weight_bytes(name, w.meta, w.data) for name, w in program.weights.items() if w.data is not None}
    wpath = weights_path(path)
    if tensors:
        write_safetensors(wpath, tensors, {"format": "pt", "producer": "fireclay-ir"})
    elif os.path.exists(wpath):
        os.remove(wpath)
    write_atomic(path, text.encode("ascii"), shared=True)


def _convert(raw: RawTensor, meta: TensorMeta, as_: str) -> Any:
    if as_ == "bytes":
        return bytes(raw.data)
    tensor = raw_to_tensor(raw)
    if meta.requires_grad and (tensor.is_floating_point() or tensor.is_complex()):
        tensor.requires_grad_(True)  # a trainable parameter comes back trainable
    return tensor


def load(
    path: str | os.PathLike[str],
    *,
    weights: str = "auto",
    limits: Limits = DEFAULT_LIMITS,
    upgraders: UpgraderRegistry = UPGRADERS,
    allow_newer_minor: bool = False,
    check_ops: bool = True,
    verify: bool = True,
) -> Program:
    """Read a program saved by :func:`save`.

    ``weights``: ``"auto"`` (torch tensors if torch is installed, else bytes), ``"torch"``,
    ``"bytes"``, or ``"none"`` (do not read the weights file; every ``Weight.data`` is None).
    A weight the weights file does not hold keeps ``data=None``.
    """
    if weights not in ("auto", "torch", "bytes", "none"):
        raise ValueError(f"weights must be 'auto', 'torch', 'bytes' or 'none', got {weights!r}")
    f, size = open_regular_file(path, "a program document")
    with f:
        if size > limits.max_document_chars:
            raise FormatError("", f"{os.fspath(path)} has {size} bytes, above the limit {limits.max_document_chars}")
        raw_text = f.read(limits.max_document_chars + 1)
    try:
        text = raw_text.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError("", f"{os.fspath(path)} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    program = loads(text, limits=limits, upgraders=upgraders, allow_newer_minor=allow_newer_minor,
                    check_ops=check_ops, verify=verify)
    wpath = weights_path(path)
    if weights == "none" or not os.path.exists(wpath):
        return program
    as_ = weights
    if as_ == "auto":
        as_ = "torch" if importlib.util.find_spec("torch") is not None else "bytes"
    tensors, _ = read_safetensors(wpath, limits)
    for name, raw in tensors.items():
        w = program.weights.get(name)
        if w is None:
            raise FormatError(f"weights file: {name}", f"the weights file holds {name!r}, which the document "
                                                        "does not declare")
        if raw.dtype != w.meta.dtype or raw.shape != tuple(w.meta.shape):
            raise FormatError(f"weights file: {name}", f"the file holds {raw.dtype}{list(raw.shape)} but the "
                                                        f"document declares {w.meta.dtype}{list(w.meta.shape)}")
        w.data = _convert(raw, w.meta, as_)
    return program
