"""LOAD_* / STORE_* / DELETE_*: locals, globals, cells, attributes, subscripts, imports."""

from __future__ import annotations

import builtins
import importlib

from fireclay_capture import bytecode_versions as versions
from fireclay_capture.config import config
from fireclay_capture.errors import Unsupported
from fireclay_capture.interpreter.frame import Frame, handler
from fireclay_capture.side_effects import DELETED
from fireclay_capture.sources import ConstSource, global_source
from fireclay_capture.variables.base import NULL, ConstVar
from fireclay_capture.variables.builder import wrap
from fireclay_capture.variables.functions import SuperVar
from fireclay_capture.variables.objects import ModelOutputVar, ModuleVar, NewObjectVar, ObjectVar, PyModuleVar
from fireclay_capture.variables.owned import OwnedObjectVar


def _local(frame: Frame, name: str):
    try:
        return frame.locals[name]
    except KeyError:
        if versions.LOAD_FAST_LOADS_CELLS and name in frame.cells:
            return frame.cells[name]  # the slot holds the cell: a closure tuple is being built
        raise Unsupported(f"local variable {name!r} referenced before assignment") from None


@handler("LOAD_FAST", "LOAD_FAST_CHECK")
def load_fast(frame: Frame, inst) -> None:
    frame.push(_local(frame, inst.argval))


@handler("LOAD_FAST_AND_CLEAR")
def load_fast_and_clear(frame: Frame, inst) -> None:
    # 3.12 inlined comprehensions save the outer binding (or NULL) and restore it after.
    frame.push(frame.locals.pop(inst.argval, NULL))


@handler("LOAD_FAST_LOAD_FAST")
def load_fast_load_fast(frame: Frame, inst) -> None:
    a, b = inst.argval
    frame.push(_local(frame, a))
    frame.push(_local(frame, b))


@handler("STORE_FAST")
def store_fast(frame: Frame, inst) -> None:
    value = frame.pop()
    if value is NULL:
        frame.locals.pop(inst.argval, None)
    else:
        frame.locals[inst.argval] = value


@handler("STORE_FAST_LOAD_FAST")
def store_fast_load_fast(frame: Frame, inst) -> None:
    store, load = inst.argval
    frame.locals[store] = frame.pop()
    frame.push(_local(frame, load))


@handler("STORE_FAST_STORE_FAST")
def store_fast_store_fast(frame: Frame, inst) -> None:
    a, b = inst.argval
    frame.locals[a] = frame.pop()
    frame.locals[b] = frame.pop()


@handler("DELETE_FAST")
def delete_fast(frame: Frame, inst) -> None:
    frame.locals.pop(inst.argval, None)


@handler("LOAD_CONST")
def load_const(frame: Frame, inst) -> None:
    frame.push(ConstVar(frame.code.co_consts[inst.arg]))


def load_global_value(frame: Frame, name: str):
    g = frame.f_globals
    written = frame.tx.side_effects.read_global(g, name)
    if written is DELETED:
        raise Unsupported(f"name {name!r} is not defined (deleted inside the captured function)")
    if written is not None:
        return written
    if name in g:
        return wrap(frame.tx, g[name], global_source(g, name))
    b = g.get("__builtins__", builtins)
    table = b if isinstance(b, dict) else b.__dict__
    if name in table:
        # Shadowing a builtin later with a global of the same name must re-capture.
        frame.tx.guards.not_in(ConstSource(g, "G"), name)
        return wrap(frame.tx, table[name], None)
    raise Unsupported(f"name {name!r} is not defined")


@handler("LOAD_GLOBAL")
def load_global(frame: Frame, inst) -> None:
    push_null = bool(inst.arg & 1)
    value = load_global_value(frame, inst.argval)
    if push_null and not versions.NULL_AFTER_CALLABLE:
        frame.push(NULL)
    frame.push(value)
    if push_null and versions.NULL_AFTER_CALLABLE:
        frame.push(NULL)


@handler("LOAD_NAME")
def load_name(frame: Frame, inst) -> None:
    if inst.argval in frame.locals:
        frame.push(frame.locals[inst.argval])
    else:
        frame.push(load_global_value(frame, inst.argval))


@handler("STORE_GLOBAL", "DELETE_GLOBAL")
def store_global(frame: Frame, inst) -> None:
    if not config.replay_side_effects:
        raise Unsupported(f"assigning the global {inst.argval!r} inside the captured function (a side effect)")
    g = frame.f_globals
    if inst.opname == "DELETE_GLOBAL":
        if not (frame.tx.side_effects.read_global(g, inst.argval) not in (None, DELETED) or inst.argval in g):
            raise Unsupported(f"deleting the global {inst.argval!r}, which is not defined")
        frame.tx.side_effects.write_global(g, inst.argval, DELETED)
        return
    frame.tx.side_effects.write_global(g, inst.argval, frame.pop())


@handler("STORE_NAME", "DELETE_NAME")
def store_name(frame: Frame, inst) -> None:
    raise Unsupported(f"assigning the name {inst.argval!r} at module or class level inside the captured code")


@handler("LOAD_DEREF", "LOAD_CLASSDEREF")
def load_deref(frame: Frame, inst) -> None:
    cell = frame.cells.get(inst.argval)
    if cell is None:
        raise Unsupported(f"free variable {inst.argval!r} is not bound")
    frame.push(cell.get(frame.tx))


@handler("STORE_DEREF")
def store_deref(frame: Frame, inst) -> None:
    frame.cells[inst.argval].set(frame.pop(), frame.tx)


@handler("DELETE_DEREF")
def delete_deref(frame: Frame, inst) -> None:
    frame.cells[inst.argval] = frame.tx.new_cell()


@handler("LOAD_CLOSURE")
def load_closure(frame: Frame, inst) -> None:
    frame.push(frame.cells[inst.argval])


@handler("MAKE_CELL")
def make_cell(frame: Frame, inst) -> None:
    name = inst.argval
    if name not in frame.cells:
        frame.cells[name] = frame.tx.new_cell(frame.locals.pop(name, NULL))


@handler("COPY_FREE_VARS")
def copy_free_vars(frame: Frame, inst) -> None:
    # The closure's cells were installed when the frame was made.
    return None


def load_attr_value(frame: Frame, obj, name: str):
    return obj.getattr(frame.tx, name)


@handler("LOAD_ATTR")
def load_attr(frame: Frame, inst) -> None:
    obj = frame.pop()
    is_method = versions.LOAD_ATTR_HAS_METHOD_BIT and bool(inst.arg & 1)
    value = load_attr_value(frame, obj, inst.argval)
    if is_method:
        if versions.NULL_AFTER_CALLABLE:
            frame.push(value)
            frame.push(NULL)
        else:
            frame.push(NULL)
            frame.push(value)
    else:
        frame.push(value)


@handler("LOAD_METHOD")
def load_method(frame: Frame, inst) -> None:
    obj = frame.pop()
    frame.push(NULL)
    frame.push(load_attr_value(frame, obj, inst.argval))


@handler("LOAD_SUPER_ATTR")
def load_super_attr(frame: Frame, inst) -> None:
    self_var = frame.pop()
    cls_var = frame.pop()
    frame.pop()  # the global `super`
    value = SuperVar(cls_var.identity(), self_var).getattr(frame.tx, inst.argval)
    if inst.arg & 1:
        frame.push(NULL)
    frame.push(value)


@handler("STORE_ATTR")
def store_attr(frame: Frame, inst) -> None:
    obj = frame.pop()
    value = frame.pop()
    if isinstance(obj, (NewObjectVar, OwnedObjectVar, ModelOutputVar)):
        obj.setattr(frame.tx, inst.argval, value)
        return
    if isinstance(obj, ObjectVar) and _plain_attribute(obj.obj, inst.argval):
        frame.tx.write_attr(obj.obj, obj.source, inst.argval, value)
        return
    if isinstance(obj, ModuleVar) and config.replay_side_effects and obj.source is not None \
            and _plain_module_attribute(obj.module, inst.argval, value):
        frame.tx.write_attr(obj.module, obj.source, inst.argval, value)
        return
    raise Unsupported(f"assigning attribute {inst.argval!r} of {obj}, which exists outside the "
                      "captured function (a side effect)")


def _plain_attribute(obj, name: str) -> bool:
    """Writes to ``obj.name`` only touch its __dict__ (no property, no __setattr__ override)."""
    import inspect

    if type(obj).__setattr__ is not object.__setattr__ or not hasattr(obj, "__dict__"):
        return False
    return not hasattr(inspect.getattr_static(type(obj), name, None), "__set__")


def _plain_module_attribute(module, name: str, value) -> bool:
    """``module.name = value`` only sets an entry of ``__dict__`` or ``_buffers`` (what
    ``nn.Module.__setattr__`` does for anything but parameters and submodules)."""
    import inspect

    import torch

    from fireclay_capture.variables.tensor import TensorVar

    if type(module).__setattr__ is not torch.nn.Module.__setattr__:
        return False
    if name in module._parameters or name in module._modules or isinstance(value, ModuleVar):
        return False
    if name in module._buffers and not (isinstance(value, TensorVar) or _is_none(value)):
        return False
    if isinstance(value, TensorVar) and isinstance(value.fake, torch.nn.Parameter):
        return False
    return not hasattr(inspect.getattr_static(type(module), name, None), "__set__")


def _is_none(v) -> bool:
    return isinstance(v, ConstVar) and v.value is None


@handler("DELETE_ATTR")
def delete_attr(frame: Frame, inst) -> None:
    obj = frame.pop()
    if isinstance(obj, OwnedObjectVar):
        obj.delattr(frame.tx, inst.argval)
        return
    if isinstance(obj, NewObjectVar) and inst.argval in obj.attrs:
        del obj.attrs[inst.argval]
        return
    if isinstance(obj, ObjectVar) and _plain_attribute(obj.obj, inst.argval):
        frame.tx.write_attr(obj.obj, obj.source, inst.argval, DELETED)
        return
    raise Unsupported(f"deleting attribute {inst.argval!r} of {obj}")


@handler("BINARY_SUBSCR")
def binary_subscr(frame: Frame, inst) -> None:
    key = frame.pop()
    obj = frame.pop()
    frame.push(obj.getitem(frame.tx, key))


@handler("STORE_SUBSCR")
def store_subscr(frame: Frame, inst) -> None:
    key = frame.pop()
    obj = frame.pop()
    value = frame.pop()
    obj.setitem(frame.tx, key, value)


@handler("DELETE_SUBSCR")
def delete_subscr(frame: Frame, inst) -> None:
    key = frame.pop()
    obj = frame.pop()
    from fireclay_capture.variables.containers import DictVar, ListVar
    from fireclay_capture.variables.objects import NewObjectVar

    if isinstance(obj, (DictVar, ListVar, NewObjectVar)):
        obj.delitem(frame.tx, key)
        return
    raise Unsupported(f"deleting an item of {obj}")


@handler("BINARY_SLICE")
def binary_slice(frame: Frame, inst) -> None:
    stop = frame.pop()
    start = frame.pop()
    obj = frame.pop()
    frame.push(obj.getitem(frame.tx, _slice_of(start, stop)))


@handler("STORE_SLICE")
def store_slice(frame: Frame, inst) -> None:
    stop = frame.pop()
    start = frame.pop()
    obj = frame.pop()
    value = frame.pop()
    obj.setitem(frame.tx, _slice_of(start, stop), value)


def _slice_of(start, stop) -> ConstVar:
    return ConstVar(slice(start.as_python_constant(), stop.as_python_constant()))


@handler("LOAD_ASSERTION_ERROR")
def load_assertion_error(frame: Frame, inst) -> None:
    frame.push(wrap(frame.tx, AssertionError, None))


@handler("IMPORT_NAME")
def import_name(frame: Frame, inst) -> None:
    fromlist = frame.pop().as_python_constant()
    level = frame.pop().as_python_constant()
    if level != 0:
        raise Unsupported("a relative import inside the captured function")
    module = importlib.import_module(inst.argval)
    if not fromlist:
        module = importlib.import_module(inst.argval.split(".")[0])
    frame.push(PyModuleVar(module))


@handler("IMPORT_FROM")
def import_from(frame: Frame, inst) -> None:
    module = frame.stack[-1]
    frame.push(module.getattr(frame.tx, inst.argval))
