"""Generated Python files (kernels, wrappers) imported as modules, once per process."""

from __future__ import annotations

import importlib.util
import sys
import types


def import_file(path: str, name: str, source: str | None = None) -> types.ModuleType:
    """The module of the Python file ``path``, imported as ``name`` once per process. The code run
    is ``source`` when given (what the caller checked the file holds), else the file's text read
    once here; never a bytecode cache beside the file, which no one has compared with it."""
    if name in sys.modules:
        return sys.modules[name]
    if source is None:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:
        raise ImportError(f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        exec(compile(source, path, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


__all__ = ["import_file"]
