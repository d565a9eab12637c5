"""The ``torch`` dialect: torch-level callables by their public qualified names.

Names resolve against an allow-list of roots, walking attributes from the root only
(``torch.nn.functional.gelu``, ``Tensor.view``, ``operator.add``, ``math.sqrt``): a document
can never name an import path of its own choosing. Resolution imports torch and happens on
first lookup; without torch, names are checked for form and root only.

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

# Public names that reach outside the tensor world (files, pickles, process state, arbitrary
# callables): never ops, whatever a document says.
DENIED: frozenset[str] = frozenset({
    "torch.load", "torch.save", "torch.from_file", "torch.compile", "torch.export", "torch.jit",  # baseline-ok: refused names, never called
    "torch.manual_seed", "torch.seed", "torch.set_default_device", "torch.set_default_dtype",
    "torch.set_default_tensor_type", "torch.set_grad_enabled", "torch.set_num_threads",
    "torch.set_printoptions", "torch.use_deterministic_algorithms", "torch.set_rng_state",
    "operator.attrgetter", "operator.itemgetter", "operator.methodcaller", "operator.call",
    "Tensor.register_hook", "Tensor.register_post_accumulate_grad_hook", "Tensor.backward",
    "Tensor.share_memory_", "Tensor.pin_memory", "Tensor.numpy", "Tensor.tolist",
})

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
    """(root, attribute) for a qualified name, or IRError when no allowed root matches."""
    if not _PATH.match(name):
        raise IRError(f"malformed torch-dialect name {name!r}")
    root, _, attr = name.rpartition(".")
    if root not in ROOTS:
        raise IRError(f"torch::{name} is outside the allowed roots ({', '.join(ROOTS)}); "
                      "register it with fireclay_ir.dialects.torch.register_callable in this process")
    if attr.startswith("_") and not (root == "Tensor" and re.match(r"^__[a-z]+__$", attr)):
        raise IRError(f"torch::{name} is private; only public names are ops")
    if name in DENIED:
        raise IRError(f"torch::{name} is not allowed in a graph (it reaches outside tensors)")
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
    return obj, False


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
                if attr.startswith("_") and not (root == "Tensor" and re.match(r"^__[a-z]+__$", attr)):
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
    if name is None or name in DENIED:
        return None
    return name
