"""The ``torch`` dialect: torch-level callables by their public qualified names.

Names resolve against an allow-list of roots, one attribute below the root
(``torch.nn.functional.gelu``, ``Tensor.view``, ``operator.add``, ``math.sqrt``): a document
can never name an import path of its own choosing. The object named must be a function of its
arguments alone (docs/security.md): one of torch's generated op bindings or tensor functions, an
arithmetic, comparison or indexing dunder, a Tensor attribute that is data, or an operator/math
function on a short list; classes, modules, process-state switches, higher-order functions and
the names in :data:`DENIED` never are. Resolution imports torch and happens on first lookup;
without torch, names are checked for form, root and the name rules only.

Capture registers extra callables at run time (``allow_in_graph``) with :func:`register_callable`;
such ops are flagged ``in_process_only``: a saved program using them loads only in a process
that registered them again.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from collections.abc import Callable
from typing import Any

from fireclay_ir.dialects.aten import REFUSED
from fireclay_ir.dialects.registry import Dialect, OpDef
from fireclay_ir.model import IRError, Node, Program

# Root -> the module path whose public attributes are ops. ``Tensor`` is torch.Tensor's methods.
ROOTS: dict[str, str] = {
    "torch": "torch",
    "torch.nn.functional": "torch.nn.functional",
    "torch.special": "torch.special",
    "torch.linalg": "torch.linalg",
    "torch.fft": "torch.fft",
    "Tensor": "torch.Tensor",
    "operator": "operator",
    "math": "math",
}

# A document is data: running it may call only callables whose effect depends on their arguments.
# The rules below say which objects under the roots are such callables; docs/security.md explains
# them. Names that pass the rules but still reach outside the tensor world (files, pickles,
# process or global state, Python callables passed as arguments) are refused by name.
DENIED: frozenset[str] = frozenset({
    "torch.load", "torch.save", "torch.from_file", "torch.compile", "torch.export", "torch.jit",  # baseline-ok: refused names, never called
    "torch.cond", "torch.while_loop", "torch.vmap",
    "torch.manual_seed", "torch.seed", "torch.set_default_device", "torch.set_default_dtype",
    "torch.set_default_tensor_type", "torch.set_grad_enabled", "torch.set_num_threads",
    "torch.set_printoptions", "torch.use_deterministic_algorithms", "torch.set_rng_state",
    "operator.attrgetter", "operator.itemgetter", "operator.methodcaller", "operator.call",
    "Tensor.register_hook", "Tensor.register_post_accumulate_grad_hook", "Tensor.backward",
    "Tensor.share_memory_", "Tensor.pin_memory", "Tensor.is_pinned", "Tensor.numpy", "Tensor.tolist",
    # Python callables as arguments, storages and raw addresses, import by dotted name
    # (``Tensor.type("pkg.Name")`` imports ``pkg``), subclass casts.
    "Tensor.apply_", "Tensor.map_", "Tensor.map2_", "Tensor.storage", "Tensor.untyped_storage",
    "Tensor.storage_type", "Tensor.set_", "Tensor.data_ptr", "Tensor.record_stream", "Tensor.type",
    "Tensor.as_subclass", "Tensor.module_load", "Tensor.new", "Tensor.to_dlpack",
})

# The only dunders a document may name: arithmetic, comparison and indexing on tensors.
TENSOR_DUNDERS: frozenset[str] = frozenset(
    {f"__{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
                             "or", "xor", "lshift", "rshift")}
    | {f"__r{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
                                "or", "xor", "lshift", "rshift")}
    | {f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
                                "or", "xor", "lshift", "rshift")}
    | {"__neg__", "__pos__", "__abs__", "__invert__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
       "__ge__", "__getitem__", "__setitem__", "__len__"})

# Tensor attributes that are data (read, never called): tensors, sizes, dtypes and flags.
TENSOR_PROPERTIES: frozenset[str] = frozenset({
    "T", "mT", "H", "mH", "real", "imag", "data", "grad", "shape", "dtype", "ndim", "device", "layout",
    "requires_grad", "is_leaf", "is_cuda", "is_cpu", "is_sparse", "is_quantized", "is_meta", "is_nested",
    "itemsize", "nbytes",
})

# operator and math functions that are ops: plain arithmetic on their arguments.
OPERATOR_FUNCTIONS: frozenset[str] = frozenset({
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_", "xor", "lshift",
    "rshift", "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "imatmul", "iand", "ior",
    "ixor", "ilshift", "irshift", "neg", "pos", "invert", "abs", "lt", "le", "gt", "ge", "eq", "ne",
    "getitem", "setitem", "not_", "truth", "index", "contains",
})
MATH_FUNCTIONS: frozenset[str] = frozenset({
    "floor", "ceil", "trunc", "sqrt", "isqrt", "exp", "expm1", "log", "log2", "log10", "log1p", "pow",
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh",
    "atanh", "fabs", "copysign", "fmod", "remainder", "hypot", "degrees", "radians", "erf", "erfc",
    "gamma", "lgamma", "isfinite", "isinf", "isnan", "isclose", "gcd",
})

# Where the functions of the torch roots may come from: torch's generated op bindings (a builtin
# whose ``__self__`` is None or one of these extension modules) and the Python modules that
# define tensor functions. Anything else under a root (classes, modules, torch._C's process-state
# switches, torch.serialization, torch.random, higher-order functions) is not an op.
_BINDING_MODULES = frozenset({"torch._C._nn", "torch._C._special", "torch._C._linalg", "torch._C._fft"})
_FUNCTION_MODULES = frozenset({"torch.functional", "torch.nn.functional", "torch._tensor"})

# Python ints and sequences grow without bound under these operators; an op refuses to build one
# larger than this many bits (ints) or items (sequences), since no program needs it.
MAX_INT_BITS = 4096
MAX_SEQUENCE_ITEMS = 1 << 24

# operator functions that write into their first argument when it is a tensor.
_MUTATING_OPERATORS = frozenset({
    "setitem", "delitem", "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow",
    "imatmul", "iand", "ior", "ixor", "ilshift", "irshift",
})
_RANDOM = re.compile(r"^(torch\.(rand|randn|randint|randperm|bernoulli|multinomial|normal|poisson)"
                     r"(_like)?|torch\.nn\.functional\.(dropout\w*|alpha_dropout|feature_alpha_dropout"
                     r"|rrelu|gumbel_softmax)|Tensor\.(bernoulli|random_|uniform_|normal_|"
                     r"exponential_|geometric_|cauchy_|log_normal_))$")
_PATH = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def split_name(name: str) -> tuple[str, str]:
    """(root, attribute) for a qualified name, or IRError when the name can never be an op."""
    if not _PATH.match(name):
        raise IRError(f"malformed torch-dialect name {name!r}")
    root, _, attr = name.rpartition(".")
    if root not in ROOTS:
        raise IRError(f"torch::{name} is outside the allowed roots ({', '.join(ROOTS)}); "
                      "register it with fireclay_ir.dialects.torch.register_callable in this process")
    if attr.startswith("__") and root == "Tensor":
        if attr not in TENSOR_DUNDERS:
            raise IRError(f"torch::{name} is not an op: of the dunder methods only arithmetic, comparison "
                          "and indexing ones are")
    elif attr.startswith("_"):
        raise IRError(f"torch::{name} is private; only public names are ops")
    if name in DENIED:
        raise IRError(f"torch::{name} is not allowed in a graph (it reaches outside tensors)")
    if root == "operator" and attr not in OPERATOR_FUNCTIONS:
        raise IRError(f"torch::{name} is not an op: operator functions that are ops are the arithmetic, "
                      "comparison and indexing ones")
    if root == "math" and attr not in MATH_FUNCTIONS:
        raise IRError(f"torch::{name} is not an op: math functions that are ops are the elementary ones")
    return root, attr


def _mutation_of(root: str, attr: str) -> tuple[str, ...]:
    if root == "Tensor" and attr.endswith("_") and not attr.startswith("__"):
        return ("self",)
    if root == "Tensor" and attr in ("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__"):
        return ("self",)
    if root == "operator" and attr in _MUTATING_OPERATORS:
        return ("a",)
    return ()


def _make_opdef(name: str, resolve: Callable[[], Any], *, is_property: bool = False,
                in_process_only: bool = False, side_effects: bool | None = None,
                doc: str = "") -> OpDef:
    root, attr = name.rpartition(".")[0], name.rpartition(".")[2]
    mutates = _mutation_of(root, attr)
    return OpDef(
        dialect="torch", name=name, mutates=mutates,
        side_effects=bool(mutates) if side_effects is None else side_effects,
        nondeterministic=bool(_RANDOM.match(name)), is_property=is_property,
        in_process_only=in_process_only, resolve=resolve, doc=doc,
    )


def _resolve(name: str) -> tuple[Any, bool]:
    """The object a checked name denotes, and whether it is a Tensor property."""
    root, attr = split_name(name)
    module_path = ROOTS[root]
    if root == "Tensor":
        torch = importlib.import_module("torch")
        static = inspect.getattr_static(torch.Tensor, attr, None)
        if static is None:
            raise IRError(f"torch::{name}: torch.Tensor has no attribute {attr!r}")
        if isinstance(static, property) or inspect.isgetsetdescriptor(static):
            if attr not in TENSOR_PROPERTIES:
                raise IRError(f"torch::{name} is not an op: the Tensor attributes a graph may read are "
                              f"{', '.join(sorted(TENSOR_PROPERTIES))}")
            return static, True
        obj = getattr(torch.Tensor, attr)
    else:
        module = importlib.import_module(module_path)
        # The module's own namespace only: a lazy ``__getattr__`` would import submodules.
        if attr not in vars(module):
            raise IRError(f"torch::{name}: module {module_path} has no attribute {attr!r}")
        obj = vars(module)[attr]
    if inspect.ismodule(obj) or not callable(obj):
        raise IRError(f"torch::{name} is not a function (got {type(obj).__name__})")
    if root not in ("operator", "math"):
        why = _why_not_a_tensor_function(root, attr, obj)
        if why:
            raise IRError(f"torch::{name} is not an op: {why}")
    return _BOUNDED.get(name, obj), False


def _why_not_a_tensor_function(root: str, attr: str, obj: Any) -> str | None:
    """Why ``obj`` (found under ``root``) is not a function of tensors alone, or None when it is."""
    if isinstance(obj, type):
        return "it is a class, and constructing objects is not an op"
    kind = type(obj).__name__
    if kind in ("method_descriptor", "wrapper_descriptor") and root == "Tensor":
        return None  # a method of torch's generated tensor bindings
    if kind == "builtin_function_or_method":
        owner = getattr(obj, "__self__", None)
        if owner is None or getattr(owner, "__name__", None) in _BINDING_MODULES:
            return REFUSED.get(attr)  # the bindings are aten ops: the aten dialect's review holds
        return f"it is {getattr(owner, '__name__', kind)}.{attr}, which is not one of torch's tensor ops"
    if inspect.isfunction(obj) and obj.__module__ in _FUNCTION_MODULES:
        return None
    module = getattr(obj, "__module__", None) or kind
    return f"it is defined in {module}, not among torch's tensor functions"


def _int_bits(x: Any) -> int:
    return x.bit_length() if isinstance(x, int) else 0


def _check_size(result_bits: float, items: float, name: str) -> None:
    if result_bits > MAX_INT_BITS:
        raise OverflowError(f"operator.{name} would build an integer of about {int(result_bits)} bits "
                            f"(the limit is {MAX_INT_BITS})")
    if items > MAX_SEQUENCE_ITEMS:
        raise OverflowError(f"operator.{name} would build a sequence of {int(items)} items "
                            f"(the limit is {MAX_SEQUENCE_ITEMS})")


def _bounded_pow(op: Callable[[Any, Any], Any], name: str) -> Callable[[Any, Any], Any]:
    def pow_(a: Any, b: Any) -> Any:
        if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1:
            _check_size(a.bit_length() * b, 0, name)
        return op(a, b)
    return pow_


def _bounded_shift(op: Callable[[Any, Any], Any], name: str) -> Callable[[Any, Any], Any]:
    def lshift(a: Any, b: Any) -> Any:
        if isinstance(a, int) and isinstance(b, int) and a:
            _check_size(_int_bits(a) + b, 0, name)
        return op(a, b)
    return lshift


def _bounded_mul(op: Callable[[Any, Any], Any], name: str) -> Callable[[Any, Any], Any]:
    def mul(a: Any, b: Any) -> Any:
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                _check_size(0, len(seq) * n, name)
        if isinstance(a, int) and isinstance(b, int):
            _check_size(_int_bits(a) + _int_bits(b), 0, name)
        return op(a, b)
    return mul


def _bounded_ops() -> dict[str, Callable[..., Any]]:
    import operator

    ops: dict[str, Callable[..., Any]] = {}
    for name, wrap in (("pow", _bounded_pow), ("ipow", _bounded_pow), ("lshift", _bounded_shift),
                       ("ilshift", _bounded_shift), ("mul", _bounded_mul), ("imul", _bounded_mul)):
        ops[f"operator.{name}"] = wrap(getattr(operator, name), name)
    return ops


# Replacements for the few operator functions that could build unbounded Python values; they
# behave like the originals on everything else (tensors included).
_BOUNDED: dict[str, Callable[..., Any]] = _bounded_ops()


def _torch_available() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except ValueError:  # torch in sys.modules as None: deliberately unavailable
        return False


class TorchDialect(Dialect):
    def __init__(self) -> None:
        super().__init__("torch", "1")

    def _missing(self, name: str) -> OpDef | None:
        split_name(name)  # raises with the reason when the name can never be an op
        if not _torch_available():
            # Without torch the name cannot be resolved; its form and root are all we can check.
            return _make_opdef(name, lambda: _resolve(name)[0])
        obj, is_property = _resolve(name)
        return _make_opdef(name, lambda: obj, is_property=is_property)

    def verify_node(self, node: Node, op: OpDef, program: Program) -> list[str]:
        if op.is_property and (len(node.args) != 1 or node.kwargs):
            return [f"{node.op} is a property: it takes the tensor and nothing else"]
        if node.target.startswith("Tensor.") and not node.args:
            return [f"{node.op} is a Tensor method: its first argument is the tensor"]
        return []


TORCH = TorchDialect()


def register_callable(name: str, fn: Callable[..., Any], *, side_effects: bool = True) -> OpDef:
    """Make ``fn`` the op ``torch::name`` in this process (capture's ``allow_in_graph``).

    The op is ``in_process_only``. It is assumed to have side effects (never removed or merged)
    unless ``side_effects=False`` is passed.
    """
    if not _PATH.match(name):
        raise IRError(f"malformed op name torch::{name}")
    if not callable(fn):
        raise IRError(f"torch::{name}: {fn!r} is not callable")
    op = _make_opdef(name, lambda: fn, in_process_only=True, side_effects=side_effects,
                     doc=getattr(fn, "__doc__", "") or "")
    return TORCH.register(op, replace=True)


_REVERSE: dict[int, str] = {}


def name_of(fn: Any) -> str | None:
    """The torch-dialect name of a torch-level callable (``torch.add`` -> ``"torch.add"``), or
    None when it is not reachable from an allowed root."""
    if not _REVERSE:
        torch = importlib.import_module("torch")
        for root, path in ROOTS.items():
            holder = torch.Tensor if root == "Tensor" else importlib.import_module(path)
            for attr in (dir(holder) if root == "Tensor" else list(vars(holder))):
                if attr.startswith("_") and not (root == "Tensor" and attr in TENSOR_DUNDERS):
                    continue
                try:
                    obj = inspect.getattr_static(holder, attr) if root == "Tensor" else vars(holder)[attr]
                    if root == "Tensor" and not isinstance(obj, property) and not inspect.isgetsetdescriptor(obj):
                        obj = getattr(holder, attr)
                except AttributeError:
                    continue
                # The first root listed wins for objects reachable twice (torch.relu before Tensor.relu).
                _REVERSE.setdefault(id(obj), f"{root}.{attr}")
    for op in TORCH.ops():
        if op.in_process_only and op.resolve is not None and op.resolve() is fn:
            return op.name
    name = _REVERSE.get(id(fn))
    if name is None:
        return None
    try:
        TORCH.lookup(name)  # the same rules a document's names meet
    except IRError:
        return None
    return name
