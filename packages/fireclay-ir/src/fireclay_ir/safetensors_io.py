"""The safetensors file format, read and written with the standard library.

Layout (https://github.com/huggingface/safetensors): 8 bytes little-endian unsigned header length
N, N bytes of UTF-8 JSON header, then the raw little-endian tensor bytes. The header maps each
tensor name to ``{"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}`` (offsets into
the byte buffer after the header) and may hold ``"__metadata__"``: a string -> string map. The
tensors must cover the buffer exactly, without holes or overlaps.

Tensors are ``RawTensor`` (dtype name as in fireclay-ir, shape, bytes); conversion to and from
``torch.Tensor`` is in the two functions at the end, which import torch only when called.
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
import struct
import sys
from dataclasses import dataclass
from typing import Any

from fireclay_ir.files import write_atomic
from fireclay_ir.serde.limits import DEFAULT_LIMITS, FormatError, Limits, describe

# fireclay-ir dtype name -> (safetensors dtype code, bytes per element)
DTYPE_CODES: dict[str, tuple[str, int]] = {
    "float64": ("F64", 8), "float32": ("F32", 4), "float16": ("F16", 2), "bfloat16": ("BF16", 2),
    "float8_e4m3fn": ("F8_E4M3", 1), "float8_e5m2": ("F8_E5M2", 1),
    "float8_e4m3fnuz": ("F8_E4M3FNUZ", 1), "float8_e5m2fnuz": ("F8_E5M2FNUZ", 1),
    "complex64": ("C64", 8),
    "int64": ("I64", 8), "int32": ("I32", 4), "int16": ("I16", 2), "int8": ("I8", 1),
    "uint64": ("U64", 8), "uint32": ("U32", 4), "uint16": ("U16", 2), "uint8": ("U8", 1),
    "bool": ("BOOL", 1),
}
_FROM_CODE = {code: name for name, (code, _) in DTYPE_CODES.items()}
_HEADER_ALIGN = 8


@dataclass(frozen=True)
class RawTensor:
    """A dense, row-major, little-endian tensor as bytes (``bytearray`` when read from a file)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes | bytearray

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_CODES:
            raise FormatError("", f"dtype {self.dtype} cannot be stored in safetensors; supported are "
                                  f"{', '.join(DTYPE_CODES)}")
        want = math.prod(self.shape) * DTYPE_CODES[self.dtype][1]
        if len(self.data) != want:
            raise FormatError("", f"a {self.dtype} tensor of shape {list(self.shape)} needs {want} bytes, "
                                  f"got {len(self.data)}")


def _check_little_endian() -> None:
    if sys.byteorder != "little":
        raise FormatError("", "weights files are little-endian; reading them on a big-endian host is not supported")


def write_safetensors(path: str | os.PathLike[str], tensors: dict[str, RawTensor],
                      metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` (in name order) to ``path`` atomically (a temporary file, then rename)."""
    _check_little_endian()
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    names = sorted(tensors)
    for name in names:
        if name == "__metadata__":
            raise FormatError("", "a tensor cannot be named '__metadata__' in a safetensors file")
        t = tensors[name]
        header[name] = {"dtype": DTYPE_CODES[t.dtype][0], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(t.data)]}
        offset += len(t.data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    text += b" " * (-(8 + len(text)) % _HEADER_ALIGN)  # pad so the data starts 8-byte aligned
    chunks = [struct.pack("<Q", len(text)), text] + [tensors[name].data for name in names]
    write_atomic(path, chunks, shared=True)


def open_regular_file(path: str | os.PathLike[str], what: str) -> tuple[io.BufferedReader, int]:
    """``path`` opened for reading, with its size; a FormatError unless it is a regular file.

    A FIFO would block the reader forever and a device (``/dev/zero``) would never end, so both
    are refused; the file is opened without blocking and checked through its descriptor, so it
    cannot be swapped between the check and the read.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError("", f"{os.fspath(path)} is not a regular file; {what} must be one "
                                  "(not a FIFO, device or socket)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def _read_exact(f: io.BufferedReader, n: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise FormatError("", f"the weights file ends early: {what} needs {n} bytes, found {len(data)}")
    return data


def read_safetensors(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS
                     ) -> tuple[dict[str, RawTensor], dict[str, str]]:
    """Read a safetensors file into RawTensors and its ``__metadata__``; any defect is a FormatError
    naming the tensor."""
    _check_little_endian()
    f, size = open_regular_file(path, "a weights file")
    with f:
        if size < 8:
            raise FormatError("", f"{os.fspath(path)} is not a safetensors file: only {size} bytes")
        (n,) = struct.unpack("<Q", _read_exact(f, 8, "the header length"))
        if n > limits.max_weights_header_bytes or n > size - 8:
            raise FormatError("", f"the weights file header claims {n} bytes, more than the file has or the limit "
                                  f"{limits.max_weights_header_bytes} allows")
        raw = _read_exact(f, n, "the header")
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise FormatError("", f"the weights file header is not JSON: {exc}") from None
        if not isinstance(header, dict):
            raise FormatError("", f"the weights file header must be an object, got {describe(header)}")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise FormatError("__metadata__", "expected an object of strings")
        if len(header) > limits.max_weights:
            raise FormatError("", f"{len(header)} tensors in the weights file, above the limit {limits.max_weights}")
        buffer_len = size - 8 - n
        spans = []
        entries = {}
        for name, e in header.items():
            where = f"weights file: {name}"
            if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
                raise FormatError(where, f"expected dtype, shape and data_offsets, got {describe(e)}")
            dtype = _FROM_CODE.get(e["dtype"]) if isinstance(e["dtype"], str) else None
            if dtype is None:
                raise FormatError(f"{where}.dtype", f"unsupported dtype {describe(e['dtype'])}")
            shape, offs = e["shape"], e["data_offsets"]
            if (not isinstance(shape, list) or len(shape) > limits.max_rank
                    or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63 for d in shape)):
                raise FormatError(f"{where}.shape", f"expected a list of non-negative ints, got {describe(shape)}")
            if (not isinstance(offs, list) or len(offs) != 2
                    or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
                    or not 0 <= offs[0] <= offs[1] <= buffer_len):
                raise FormatError(f"{where}.data_offsets", f"expected [begin, end] within the {buffer_len} data bytes, "
                                                           f"got {describe(offs)}")
            want = math.prod(shape) * DTYPE_CODES[dtype][1]
            if offs[1] - offs[0] != want:
                raise FormatError(where, f"a {dtype} tensor of shape {shape} needs {want} bytes, the file gives "
                                         f"{offs[1] - offs[0]}")
            spans.append((offs[0], offs[1], name))
            entries[name] = (dtype, tuple(shape))
        spans.sort()
        cursor = 0
        for begin, end, name in spans:
            if begin != cursor:
                raise FormatError(f"weights file: {name}", "tensor data overlaps another tensor or leaves a hole")
            cursor = end
        if cursor != buffer_len:
            raise FormatError("", f"the weights file has {buffer_len - cursor} bytes no tensor accounts for")
        data_start = 8 + n
        tensors = {}
        for begin, end, name in spans:
            f.seek(data_start + begin)
            dtype, shape = entries[name]
            buf = bytearray(end - begin)  # writable, so torch can wrap it without another copy
            if f.readinto(buf) != len(buf):
                raise FormatError(f"weights file: {name}", "the weights file ends inside this tensor's data")
            tensors[name] = RawTensor(dtype, shape, buf)
    return tensors, meta


# --------------------------------------------------------------------------- torch conversion


def tensor_to_raw(tensor: Any) -> RawTensor:
    """A ``torch.Tensor`` (any device, layout strided) as a dense RawTensor."""
    import ctypes

    import torch

    if tensor.layout != torch.strided:
        raise FormatError("", f"only strided tensors can be stored, got layout {tensor.layout}")
    dtype = str(tensor.dtype).removeprefix("torch.")
    t = tensor.detach().to("cpu").contiguous()
    nbytes = t.numel() * t.element_size()
    data = ctypes.string_at(t.data_ptr(), nbytes) if nbytes else b""
    return RawTensor(dtype, tuple(t.shape), data)


def raw_to_tensor(raw: RawTensor) -> Any:
    """A RawTensor as a new, writable ``torch.Tensor`` on the CPU."""
    import torch

    dtype = getattr(torch, raw.dtype)
    if not raw.data:
        return torch.empty(raw.shape, dtype=dtype)
    buf = raw.data if isinstance(raw.data, bytearray) else bytearray(raw.data)
    return torch.frombuffer(buf, dtype=dtype).reshape(raw.shape)
