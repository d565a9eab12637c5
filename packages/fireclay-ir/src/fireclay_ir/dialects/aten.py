"""The ``aten`` dialect: ATen operator overloads with their schemas.

The schemas ship as versioned data (``data/aten_core_v1.json``), generated from torch by
``scripts/gen_aten_schemas.py``, so that lookup and verification work without torch. The data
holds the core ATen op set (``CORE_OPS``: what fireclay-autograd decomposes to) plus the
common non-core ops a graph meets before decomposition (views, in-place variants, ``_to_copy``,
``native_layer_norm``, ``convolution``, matmuls, attention, ...).

An overload missing from the data is looked up in ``torch.ops.aten`` when torch is installed
(flagged in its ``tags`` as ``from_torch``): the namespace is fixed to ``aten``, so no
arbitrary import is possible, and only tensor ops pass (:func:`refusal`): an overload whose
schema holds no tensor (TorchScript's list, string and dict builtins), takes a storage, stream,
future or class object, or is one of the reviewed ops that touch files, share storage or write
process state (:data:`REFUSED`) is refused, by name, with the reason.

Custom operators (``torch.library`` ops of any namespace other than ``aten`` and ``prims``) are
ops of this dialect named ``aten::<namespace>::<op>.<overload>``, but only once this process has
registered them with :func:`register_custom_op` (fireclay-autograd does when it traces a call):
a document naming one that is not registered is refused at load. A document never makes torch
look up an operator of another namespace by itself.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

from fireclay_ir.dialects.registry import NO_DEFAULT, Argument, Dialect, OpDef, Return, get_dialect
from fireclay_ir.model import IRError, Node, Program

DATA_FILE = "aten_core_v1.json"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
_CUSTOM_NAME = re.compile(r"^(?P<ns>[A-Za-z_][A-Za-z0-9_]*)::(?P<op>[A-Za-z_][A-Za-z0-9_]*)"
                          r"\.(?P<overload>[A-Za-z_][A-Za-z0-9_]*)$")
# Namespaces whose operators are torch's own, never custom ops.
TORCH_NAMESPACES = frozenset({"aten", "prims"})


# --------------------------------------------------------------------------- schema text


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside brackets and quotes."""
    parts: list[str] = []
    cur: list[str] = []
    depth, quote = 0, None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    tail = "".join(cur).strip()
    if tail or parts:
        parts.append(tail)
    return [p for p in parts if p]


def _parse_default(text: str) -> Any:
    """Schema defaults as Python values; enum names (``contiguous_format``, ``long``) stay text."""
    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    if text.startswith("[") and text.endswith("]"):
        return [_parse_default(p) for p in _split_top(text[1:-1])]
    if text[:1] in "\"'":
        return text[1:-1]
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


_TYPE = re.compile(r"^(?P<base>(?:Dict|Future|Union)\([^()]*\)|[A-Za-z_][A-Za-z0-9_]*)"
                   r"(?:\((?P<alias>[^()]*)\))?(?P<suffix>(?:\[\d*\]|\?)*)"
                   r"(?:\((?P<alias2>[^()]*)\))?(?P<suffix2>(?:\[\d*\]|\?)*)$")


def _split_type(decl: str) -> tuple[str, str | None, str]:
    """``Tensor(a!) self`` -> (``Tensor``, ``a!``, ``self``); ``Tensor(a)[] x`` -> (``Tensor[]``, ``a``, ``x``)."""
    decl = decl.strip()
    depth, cut = 0, -1
    for i, ch in enumerate(decl):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == " " and depth == 0:
            cut = i
    type_text, name = (decl[:cut], decl[cut + 1:].strip()) if cut >= 0 else (decl, "")
    m = _TYPE.match(type_text.strip())
    if m is None:
        raise IRError(f"malformed schema type {type_text!r}")
    return (m.group("base") + m.group("suffix") + m.group("suffix2"), m.group("alias") or m.group("alias2"),
            name)


def parse_schema(schema: str) -> tuple[str, tuple[Argument, ...], tuple[Return, ...]]:
    """Parse ``aten::name.overload(args) -> returns`` into (name, arguments, returns)."""
    try:
        head, rets = schema.rsplit(") -> ", 1)
        name, args_text = head.split("(", 1)
    except ValueError:
        raise IRError(f"malformed op schema {schema!r}") from None
    name = name.split("::", 1)[-1]
    arguments: list[Argument] = []
    kwarg_only = False
    for part in _split_top(args_text):
        if part == "*":
            kwarg_only = True
            continue
        if part == "...":
            # Varargs (einsum.sublist): further positional arguments are not checked.
            arguments.append(Argument("...", "..."))
            continue
        default: Any = NO_DEFAULT
        decl = part
        eq = _top_level_eq(part)
        if eq >= 0:
            decl, default = part[:eq].strip(), _parse_default(part[eq + 1:].strip())
        type_, alias, arg_name = _split_type(decl)
        arguments.append(Argument(arg_name, type_, default, kwarg_only, alias))
    rets = rets.strip()
    if rets.startswith("(") and rets.endswith(")"):
        ret_parts = _split_top(rets[1:-1])
    else:
        ret_parts = [rets]
    returns = []
    for part in ret_parts:
        type_, alias, ret_name = _split_type(part)
        returns.append(Return(ret_name or None, type_, alias))
    return name, tuple(arguments), tuple(returns)


def _top_level_eq(text: str) -> int:
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "=" and depth == 0:
            return i
    return -1


# --------------------------------------------------------------------------- the data


@cache
def _data() -> dict[str, Any]:
    text = resources.files("fireclay_ir.dialects").joinpath("data", DATA_FILE).read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def core_ops() -> tuple[str, ...]:
    """The documented core ATen op set, as ``aten::name.overload`` strings."""
    return tuple(f"aten::{n}" for n in _data()["core"])


def core_aten_ops() -> tuple[str, ...]:
    """The core ATen op set (PyTorch's Core ATen IR, from the shipped data): what
    fireclay-autograd decomposes every other op into, unless the op is in
    :func:`kept_whole_ops`. The same as :func:`core_ops`."""
    return core_ops()


# Ops outside Core ATen that graphs keep whole, with the reason for each group.
_KEPT_WHOLE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("functional forms that functionalization itself produces (functional batch norm returns the "
     "new running statistics)", (
        "aten::_batch_norm_with_update_functional.default",
        "aten::_native_batch_norm_legit_functional.default",
        "aten::copy.default",
        "aten::alias.default",
        "aten::zero.default",
        "aten::fill.Scalar",
        "aten::fill.Tensor",
    )),
    ("fused attention: one extern call; its decomposition returns the attention probabilities where "
     "the backward op expects the log-sum-exp, so it must not be split", (
        "aten::_scaled_dot_product_flash_attention_for_cpu.default",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default",
        "aten::_scaled_dot_product_efficient_attention.default",
        "aten::_scaled_dot_product_efficient_attention_backward.default",
        "aten::_scaled_dot_product_flash_attention.default",
        "aten::_scaled_dot_product_flash_attention_backward.default",
        "aten::_scaled_dot_product_cudnn_attention.default",
        "aten::_scaled_dot_product_cudnn_attention_backward.default",
    )),
    ("checks on the data that eager makes and the decomposition drops: ``one_hot`` refuses a class "
     "outside [0, num_classes), its decomposition (an ``eq`` against ``arange``) gives a row of zeros; "
     "kernels check each class as they read it", (
        "aten::one_hot.default",
    )),
    ("views: functionalization must see them to follow aliasing, and a kernel compiler turns them "
     "into index arithmetic", (
        "aten::view.default",
        "aten::permute.default",
        "aten::expand.default",
        "aten::slice.Tensor",
        "aten::select.int",
        "aten::diagonal.default",
        "aten::as_strided.default",
        "aten::unsqueeze.default",
        "aten::squeeze.dim",
        "aten::squeeze.dims",
        "aten::split_with_sizes.default",
    )),
)


def kept_whole_ops() -> tuple[str, ...]:
    """Ops that fireclay-autograd records whole although they are not core ATen ops (or are,
    but torch would decompose them):

    * functional forms functionalization produces: ``_batch_norm_with_update_functional``,
      ``_native_batch_norm_legit_functional``, ``copy``, ``alias``, ``zero``, ``fill.Scalar``,
      ``fill.Tensor``;
    * fused attention, forward and backward (``_scaled_dot_product_flash_attention``,
      ``..._for_cpu``, ``_scaled_dot_product_efficient_attention``,
      ``_scaled_dot_product_cudnn_attention``): one extern call, and the
      decomposition's outputs do not match what the backward op expects;
    * ``one_hot``: eager refuses a class outside ``[0, num_classes)``, and its decomposition
      drops that check (a row of zeros); kernels check each class as they read it;
    * views (``view``, ``permute``, ``expand``, ``slice``, ``select``, ``diagonal``,
      ``as_strided``, ``unsqueeze``, ``squeeze.dim``/``.dims``, ``split_with_sizes``):
      functionalization follows aliasing through them, and kernels turn them into indexing.
    """
    return tuple(op for _, ops in _KEPT_WHOLE for op in ops)


# The additive mask (``attn_bias``) of the memory-efficient and cuDNN attention kernels, by op: its
# argument position. The kernels check its layout: the last dimension dense ("last dimension must
# be contiguous") and the other strides and the start multiples of ATTENTION_BIAS_ALIGNMENT
# elements ("attn_bias is not correctly aligned"). Eager's scaled_dot_product_attention pads the
# mask's rows to that multiple and passes a slice of it; whoever calls these ops directly must do
# the same for a mask stored otherwise.
ATTENTION_BIAS_POSITIONS = {
    "aten::_scaled_dot_product_efficient_attention.default": 3,
    "aten::_scaled_dot_product_efficient_attention_backward.default": 4,
    "aten::_scaled_dot_product_cudnn_attention.default": 3,
    "aten::_scaled_dot_product_cudnn_attention_backward.default": 8,
}
ATTENTION_BIAS_ALIGNMENT = 16  # elements: 16 bytes or more for every dtype the kernels take


def kept_whole_reasons() -> dict[str, str]:
    """Each op of :func:`kept_whole_ops` -> why it is kept whole."""
    return {op: why for why, ops in _KEPT_WHOLE for op in ops}


def shipped_ops() -> tuple[str, ...]:
    """Every overload whose schema ships with this package."""
    return tuple(f"aten::{n}" for n in sorted(_data()["ops"]))


def data_version() -> dict[str, Any]:
    d = _data()
    return {"version": d["version"], "torch_version": d["torch_version"]}


def opdef_from_schema(name: str, schema: str, tags: tuple[str, ...] = ()) -> OpDef:
    """The OpDef of overload ``name`` (``relu.default``) from its schema text."""
    _, arguments, returns = parse_schema(schema)
    mutates = tuple(a.name for a in arguments if a.is_write)
    is_view = any(r.alias and "!" not in r.alias for r in returns)
    return OpDef(
        dialect="aten", name=name, arguments=arguments, returns=returns, mutates=mutates,
        side_effects=bool(mutates) or name.split(".")[0] in _SIDE_EFFECT_STEMS,
        nondeterministic="nondeterministic_seeded" in tags, is_view=is_view, tags=tuple(tags),
        schema=schema, resolve=lambda: _resolve_overload(name),
    )


# Ops without written arguments that still must run: asserts and prints.
_SIDE_EFFECT_STEMS = {"_assert_async", "_assert_scalar", "_print", "sym_constrain_range",
                      "sym_constrain_range_for_size", "_assert_tensor_metadata", "_functional_assert_async"}


def _resolve_overload(name: str) -> Any:
    import torch

    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


# --------------------------------------------------------------------------- checking args

_SCALAR_KIND_OK = {
    "int": {"int", "opaque"}, "SymInt": {"int", "opaque"}, "float": {"float", "int", "opaque"},
    "bool": {"bool", "opaque"}, "Scalar": {"int", "float", "bool", "opaque"},
    "SymFloat": {"float", "int", "opaque"}, "SymBool": {"bool", "opaque"},
}


def _describe(arg: Any) -> str:
    from fireclay_ir.model import TensorMeta, Value

    if isinstance(arg, Value):
        return f"%{arg.name} ({'tensor' if isinstance(arg.type, TensorMeta) else arg.type.kind + ' scalar'})"
    return f"{type(arg).__name__} {arg!r}"


def _accepts(type_: str, arg: Any) -> bool:
    from fireclay_ir import model as m

    if type_.endswith("?"):
        return arg is None or _accepts(type_[:-1], arg)
    list_match = re.match(r"^(.*)\[(\d*)\]$", type_)
    if list_match:
        elem, size = list_match.group(1), list_match.group(2)
        if isinstance(arg, (list, tuple)):
            return all(_accepts(elem, a) for a in arg)
        # int[2] takes one int that torch broadcasts; a scalar Value of a list is opaque.
        if size and elem in ("int", "SymInt") and _accepts(elem, arg):
            return True
        return isinstance(arg, m.Value) and isinstance(arg.type, m.ScalarType) and arg.type.kind == "opaque"
    if isinstance(arg, m.Value):
        if type_ == "Tensor":
            return arg.is_tensor
        if isinstance(arg.type, m.TensorMeta):
            # A 0-dim tensor may stand for a Scalar (torch wraps numbers so).
            return type_ == "Scalar" and arg.type.rank == 0
        kinds = _SCALAR_KIND_OK.get(type_)
        return kinds is None or arg.type.kind in kinds
    if type_ == "Tensor":
        # torch wraps a Python number passed for a Tensor (aten.add.Tensor(x, 0) from export).
        return isinstance(arg, (int, float, bool, complex))
    if type_ in ("int", "SymInt"):
        return (isinstance(arg, int) and not isinstance(arg, bool)) or isinstance(arg, m.SymExpr)
    if type_ in ("float", "SymFloat"):
        return isinstance(arg, (int, float)) and not isinstance(arg, bool) or isinstance(arg, m.SymExpr)
    if type_ in ("bool", "SymBool"):
        return isinstance(arg, bool)
    if type_ == "Scalar":
        return isinstance(arg, (int, float, bool, complex, m.SymExpr))
    if type_ == "str":
        return isinstance(arg, str)
    if type_ == "ScalarType":
        return isinstance(arg, m.DType)
    if type_ == "Layout":
        return isinstance(arg, m.Layout)
    if type_ == "Device":
        return isinstance(arg, (m.Device, str))
    if type_ == "MemoryFormat":
        return isinstance(arg, m.MemoryFormat)
    # Generator, Storage, Stream, Dimname, ...: opaque to the verifier.
    return True


def check_call(op: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """Problems binding ``args``/``kwargs`` to ``op``'s schema."""
    if op.arguments is None:
        return []
    problems: list[str] = []
    positional = [a for a in op.arguments if not a.kwarg_only]
    if positional and positional[-1].type == "...":
        positional = positional[:-1]
        args = args[:len(positional)]
    if len(args) > len(positional):
        return [f"{op.qualified_name} takes at most {len(positional)} positional arguments, got {len(args)}"]
    by_name = {a.name: a for a in op.arguments}
    bound: dict[str, Any] = {}
    for a, v in zip(positional, args):
        bound[a.name] = v
    for k, v in kwargs.items():
        if k not in by_name:
            problems.append(f"{op.qualified_name} has no argument {k!r}")
        elif k in bound:
            problems.append(f"{op.qualified_name} got argument {k!r} twice")
        else:
            bound[k] = v
    for a in op.arguments:
        if a.type == "...":
            continue
        if a.name not in bound:
            if not a.has_default:
                problems.append(f"{op.qualified_name} is missing argument {a.name!r} ({a.type})")
        elif not _accepts(a.type, bound[a.name]):
            problems.append(f"{op.qualified_name} argument {a.name!r} expects {a.type}, "
                            f"got {_describe(bound[a.name])}")
    return problems


# Ops that a document may never name, reviewed against torch's aten schemas (docs/security.md):
# whatever the op's schema says, running it would reach outside the program's own tensors.
_REFUSED_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("it reads or writes files", ("from_file", "save")),
    ("it shares, swaps or re-points a tensor's storage, so the tensor may address memory it does not own",
     ("set", "set_", "set_data", "_reshape_alias", "_pin_memory", "pin_memory", "is_pinned", "record_stream",
      "_share_memory_", "share_memory_")),
    ("it builds a sparse or nested tensor without checking its indices, so reading it may address memory "
     "outside the tensor", (
         "sparse_coo_tensor", "sparse_csr_tensor", "sparse_csc_tensor", "sparse_bsr_tensor", "sparse_bsc_tensor",
         "sparse_compressed_tensor", "_sparse_coo_tensor_unsafe", "_sparse_coo_tensor_with_dims",
         "_sparse_coo_tensor_with_dims_and_tensors", "_sparse_csr_tensor_unsafe", "_sparse_csc_tensor_unsafe",
         "_sparse_bsr_tensor_unsafe", "_sparse_bsc_tensor_unsafe", "_sparse_compressed_tensor_unsafe",
         "_sparse_compressed_tensor_with_dims", "sparse_resize_", "sparse_resize_and_clear_",
         "_nested_view_from_buffer", "_nested_view_from_buffer_copy", "_nested_view_from_jagged",
         "_nested_view_from_jagged_copy")),
    ("it reads or writes process-wide state (random seeds, grad mode, forward-AD levels, library caches)",
     ("manual_seed", "seed", "initial_seed", "set_grad_enabled", "_make_dual", "_make_dual_copy", "_unpack_dual",
      "_cufft_set_plan_cache_max_size", "_cufft_clear_plan_cache", "_cufft_get_plan_cache_max_size",
      "_cufft_get_plan_cache_size", "_set_item")),
    ("it runs autograd, futures or remote calls, which call code the document does not name",
     ("backward", "grad", "wait", "to_here", "local_value", "owner", "owner_name", "confirmed_by_owner",
      "is_owner")),
)
REFUSED: dict[str, str] = {packet: why for why, packets in _REFUSED_GROUPS for packet in packets}
# Schema types no document can hold a value of, that stand for storage, streams or Python objects.
_REFUSED_TYPES = re.compile(r"\b(Storage|Stream|Future|RRef|Any|Capsule|AnyClassType|__torch__\.[\w.]+)\b")


def refusal(name: str, schema: str | None = None) -> str | None:
    """Why the aten overload ``name`` (``from_file.default``) may not be in a document, or None.

    ``schema`` is checked too when given: an op from torch (not in the shipped data) must work on
    tensors and take no storage, stream or object arguments."""
    why = REFUSED.get(name.split(".")[0])
    if why is not None:
        return why
    if schema is not None:
        args = schema.rsplit(") -> ", 1)[0]
        bad = _REFUSED_TYPES.search(args)
        if bad:
            return f"it takes an argument of type {bad.group(1)}, which is not data"
        if "Tensor" not in schema:
            return "it is not a tensor op (it works on Python lists, strings or dicts only)"
    return None


class AtenDialect(Dialect):
    def __init__(self) -> None:
        super().__init__("aten", str(_data_version_lazy()))

    def _missing(self, name: str) -> OpDef | None:
        if "::" in name:
            # Registered custom ops were found before this; any other is refused by name.
            if _CUSTOM_NAME.match(name) is None:
                raise IRError(f"malformed custom op name aten::{name}; expected aten::<namespace>::<op>.<overload>")
            raise IRError(f"aten::{name} is a custom operator that is not registered in this process; a "
                          "document may name only custom operators the process registered (import the library "
                          "that defines it and register it with fireclay_ir.dialects.register_custom_op)")
        if not _NAME.match(name):
            return None
        why = refusal(name)
        if why is not None:
            raise IRError(f"aten::{name} is refused in a program: {why}")
        entry = _data()["ops"].get(name)
        if entry is not None:
            return opdef_from_schema(name, entry["schema"], tuple(entry.get("tags", ())))
        op = _from_torch(name)
        if op is not None:
            why = refusal(name, op.schema)
            if why is not None:
                raise IRError(f"aten::{op.name} is refused in a program: {why}")
        return op

    def _hint(self, name: str) -> str:
        stem = name.split(".")[0]
        close = sorted(n for n in _data()["ops"] if n.split(".")[0] == stem)[:5]
        return f" (did you mean {', '.join('aten::' + c for c in close)}?)" if close else ""

    def verify_node(self, node: Node, op: OpDef, program: Program) -> list[str]:
        problems = check_call(op, node.args, node.kwargs)
        if op.returns is not None and not any(r.type.endswith("[]") for r in op.returns):
            expected = len(op.returns)
            if len(node.outputs) != expected:
                problems.append(f"{op.qualified_name} returns {expected} values but the node "
                                f"defines {len(node.outputs)}")
            for r, out in zip(op.returns, node.outputs):
                base = r.type.rstrip("?")
                if base == "Tensor" and not out.is_tensor and not r.type.endswith("?"):
                    problems.append(f"{op.qualified_name} returns a tensor but %{out.name} is a scalar")
                if base in _SCALAR_KIND_OK and out.is_tensor:
                    problems.append(f"{op.qualified_name} returns {r.type} but %{out.name} is a tensor")
        return problems


def _data_version_lazy() -> int:
    # Reading the data file for the version is cheap and keeps one source of truth.
    return int(_data()["version"])


def _from_torch(name: str) -> OpDef | None:
    # Only when torch is installed; without it the shipped data is all there is.
    if sys.modules.get("torch") is None and importlib.util.find_spec("torch") is None:
        return None
    try:
        import torch
    except ImportError:
        return None

    packet_name, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, packet_name, None) if not packet_name.startswith("__") else None
    if packet is None or not hasattr(packet, "overloads"):
        return None
    if (overload or "default") not in packet.overloads():
        return None
    op = getattr(packet, overload or "default")
    tags = tuple(str(t).split(".")[-1] for t in op.tags) + ("from_torch",)
    return opdef_from_schema(f"{packet_name}.{overload or 'default'}", str(op._schema), tags)


# --------------------------------------------------------------------------- custom ops


def split_op_name(op: str) -> tuple[str, str, str]:
    """(torch namespace, packet, overload) of an aten-dialect op: ``aten::add.Tensor`` ->
    (``aten``, ``add``, ``Tensor``); ``aten::mylib::scale.default`` -> (``mylib``, ``scale``,
    ``default``). Also takes torch's own qualified names (``prims::convert_element_type.default``)."""
    dialect, _, target = op.partition("::")
    if dialect == "aten" and "::" in target:
        dialect, _, target = target.partition("::")
    packet, _, overload = target.partition(".")
    return dialect, packet, overload or "default"


def is_custom_op(op: str) -> bool:
    """Whether ``op`` names a custom operator (``aten::<namespace>::<op>.<overload>``)."""
    return op.startswith("aten::") and "::" in op[len("aten::"):]


def custom_op_name(namespace: str, packet: str, overload: str) -> str:
    """The aten-dialect name of a custom operator: ``aten::mylib::scale.default``."""
    return f"aten::{namespace}::{packet}.{overload or 'default'}"


def register_custom_op(op: str, schema: str, resolve: Callable[[], Any], *, tags: tuple[str, ...] = ()) -> OpDef:
    """Make the ``torch.library`` operator ``op`` (``aten::<namespace>::<op>.<overload>``, see
    :func:`custom_op_name`) an op of the aten dialect in this process, with its ``schema`` text
    (``mylib::scale(Tensor x, float alpha) -> Tensor``) and ``resolve`` giving the operator.

    The op is ``in_process_only``: a document naming it loads only in a process that registered
    it. Registering the same name again replaces the entry (a library reloaded)."""
    if not is_custom_op(op):
        raise IRError(f"{op!r} is not a custom operator name (aten::<namespace>::<op>.<overload>)")
    target = op[len("aten::"):]
    match = _CUSTOM_NAME.match(target)
    if match is None:
        raise IRError(f"malformed custom op name {op!r}; expected aten::<namespace>::<op>.<overload>")
    if match.group("ns") in TORCH_NAMESPACES:
        raise IRError(f"{op!r}: namespace {match.group('ns')!r} holds torch's own operators, not custom ones")
    if not callable(resolve):
        raise IRError(f"{op}: resolve must be a function giving the operator")
    why = refusal(target, schema)
    if why is not None:
        raise IRError(f"{op} is refused in a program: {why}")
    base = opdef_from_schema(target, schema, tuple(tags) + ("custom",))
    entry = OpDef(
        dialect="aten", name=target, arguments=base.arguments, returns=base.returns, mutates=base.mutates,
        side_effects=base.side_effects, nondeterministic=base.nondeterministic, is_view=base.is_view,
        in_process_only=True, tags=base.tags, schema=schema, resolve=resolve,
    )
    return get_dialect("aten").register(entry, replace=True)
