"""Loading compiled kernels and launching them through the CUDA driver, from Python.

Triton launches a compiled kernel through C code it generates and builds with the system C
compiler: one module for its driver utilities in each fresh process and one launcher per
distinct kernel signature; with empty caches those builds were a large part of the time until a
BERT program's compiled kernels ran (docs/status.md). Here a kernel's binary (the
cubin ``triton.compile`` produced) is loaded with ``cuModuleLoadData`` and launched with
``cuLaunchKernel``, both called through ``ctypes``: no compiler, and per launch only the argument
slots are written and one foreign call made.

A :class:`CudaKernel` owns one ctypes value per runtime parameter and the array of pointers to
them that ``cuLaunchKernel`` reads; a launch writes each argument into its slot (a tensor's
``data_ptr()``, an integer, a float) and calls the driver. The launch call holds the GIL
(``ctypes.PyDLL``), so two threads launching the same kernel never interleave their slot writes.
Kernels that need what ``cuLaunchKernel`` alone cannot give (thread-block clusters, programmatic
dependent launch, cooperative grids, a global scratch allocation, tensor-descriptor or 16-bit float
parameters) are not loaded here (:func:`load` returns None) and go through Triton's own launcher.
What a launch needs of a compiled kernel is a :class:`KernelBinary`, plain data a forked compile
worker sends back.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

import torch

from fireclay_triton.config import config
from fireclay_triton.errors import TritonBackendError

_SHARED_DEFAULT_LIMIT = 49152  # bytes of shared memory a kernel may use without opting in
_ATTR_SHARED_SIZE_BYTES = 1  # CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
_ATTR_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_CACHE_PREFER_SHARED = 2  # CU_FUNC_CACHE_PREFER_SHARED
_DEVICE_MAX_SHARED_OPTIN = 97  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN

# a runtime parameter's Triton type -> the ctypes value its slot holds
_SLOT_TYPES: dict[str, Any] = {
    "i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
    "u1": ctypes.c_uint8, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64, "fp32": ctypes.c_float, "f32": ctypes.c_float, "fp64": ctypes.c_double,
}


class LaunchError(TritonBackendError):
    """The CUDA driver refused to load or launch a kernel."""


class _Driver:
    """The few driver entry points used here, typed. ``load`` releases the GIL while the driver
    works (module loading can take milliseconds); ``launch`` holds it (see the module doc)."""

    def __init__(self):
        try:
            released = ctypes.CDLL("libcuda.so.1")
            held = ctypes.PyDLL("libcuda.so.1")
        except OSError as error:
            raise LaunchError(f"the CUDA driver library could not be loaded: {error}") from error
        p, i, u = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
        self.get_error_string = self._fn(released, "cuGetErrorString", [i, ctypes.POINTER(ctypes.c_char_p)])
        self.ctx_get_current = self._fn(released, "cuCtxGetCurrent", [ctypes.POINTER(p)])
        self.ctx_set_current = self._fn(released, "cuCtxSetCurrent", [p])
        self.device_get = self._fn(released, "cuDeviceGet", [ctypes.POINTER(i), i])
        self.primary_ctx_retain = self._fn(released, "cuDevicePrimaryCtxRetain_v2", [ctypes.POINTER(p), i],
                                           fallback="cuDevicePrimaryCtxRetain")
        self.device_get_attribute = self._fn(released, "cuDeviceGetAttribute", [ctypes.POINTER(i), i, i])
        self.module_load_data = self._fn(released, "cuModuleLoadData", [ctypes.POINTER(p), p])
        self.module_get_function = self._fn(released, "cuModuleGetFunction", [ctypes.POINTER(p), p, ctypes.c_char_p])
        self.func_get_attribute = self._fn(released, "cuFuncGetAttribute", [ctypes.POINTER(i), i, p])
        self.func_set_attribute = self._fn(released, "cuFuncSetAttribute", [p, i, i])
        self.func_set_cache_config = self._fn(released, "cuFuncSetCacheConfig", [p, i])
        self.launch = self._fn(held, "cuLaunchKernel", [p, u, u, u, u, u, u, u, p, p, p])
        # the same entry point without argument types, for bound launches (bound_launch.py): they
        # pass ctypes values made once, which ctypes hands over as they are; converting eleven
        # Python values per call through ``argtypes`` was half of the foreign call's cost
        self.launch_packed = held["cuLaunchKernel"]
        self.launch_packed.restype = ctypes.c_int

    @staticmethod
    def _fn(lib: Any, name: str, argtypes: list, fallback: str | None = None) -> Any:
        try:
            fn = getattr(lib, name)
        except AttributeError:
            if fallback is None:
                raise
            fn = getattr(lib, fallback)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        return fn

    def check(self, result: int, what: str) -> None:
        if result != 0:
            text = ctypes.c_char_p()
            self.get_error_string(result, ctypes.byref(text))
            name = text.value.decode() if text.value else f"error {result}"
            raise LaunchError(f"CUDA driver: {what} failed: {name}")


_DRIVER: _Driver | None = None
_DRIVER_LOCK = threading.Lock()


def driver() -> _Driver:
    global _DRIVER
    if _DRIVER is None:
        with _DRIVER_LOCK:
            if _DRIVER is None:
                _DRIVER = _Driver()
    return _DRIVER


def _current_context(d: _Driver, device: int) -> None:
    """Make sure this thread has a context for ``device``: torch's runtime makes the device's
    primary context current on the threads that use it; another thread gets it here."""
    ctx = ctypes.c_void_p()
    d.check(d.ctx_get_current(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if ctx.value:
        return
    dev = ctypes.c_int()
    d.check(d.device_get(ctypes.byref(dev), device), "cuDeviceGet")
    d.check(d.primary_ctx_retain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    d.check(d.ctx_set_current(ctx), "cuCtxSetCurrent")


@dataclass(frozen=True)
class KernelBinary:
    """What launching a compiled kernel needs, as plain (picklable) data: a forked compile worker
    sends it back whole. ``signature``: Triton's type of each parameter of the ``@jit`` function
    ("constexpr" for those specialized into the kernel); ``needs_triton``: why only Triton's
    launcher can launch it (None: :class:`CudaKernel` can)."""

    name: str
    num_warps: int
    shared: int
    cubin: bytes
    signature: tuple[tuple[str, str], ...]
    needs_triton: str | None

    @classmethod
    def of(cls, compiled: Any) -> KernelBinary:
        """The binary of a ``triton.compile`` result."""
        md = compiled.metadata
        signature = tuple((name, ty if isinstance(ty, str) else repr(ty)) for name, ty in compiled.src.signature.items())
        return cls(md.name, md.num_warps, md.shared, compiled.asm["cubin"], signature, _needs_triton(md, signature))


def _needs_triton(md: Any, signature: tuple[tuple[str, str], ...]) -> str | None:
    if getattr(md, "num_ctas", 1) != 1:
        return "thread-block clusters"
    if getattr(md, "launch_pdl", False) or getattr(md, "launch_cooperative_grid", False):
        return "a launch attribute"
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        return "a scratch allocation"
    for _, ty in signature:
        if not (ty == "constexpr" or ty.startswith("*") or ty in _SLOT_TYPES):
            return f"a parameter of type {ty}"
    return None


def parameter_types(binary: KernelBinary, arg_names: list[str], nargs: int) -> list[tuple[int, str]]:
    """(argument position, Triton type) of each parameter of the compiled kernel, in order, for a
    launch with the first ``nargs`` arguments of ``arg_names``: those Triton specialized into
    constants (an integer equal to 1, say) are not parameters. The kernel's two scratch pointers
    (global and profile) follow these."""
    signature = dict(binary.signature)
    return [(position, signature[name]) for position, name in enumerate(arg_names[:nargs])
            if signature[name] != "constexpr"]


class CudaKernel:
    """One loaded kernel binary, launched with the runtime arguments of its ``@jit`` function in
    order (``nargs`` of them; the ones Triton specialized into constants are skipped)."""

    __slots__ = ("name", "function", "block", "shared", "_plan", "_slots", "params", "_module")

    def __init__(self, binary: KernelBinary, arg_names: list[str], nargs: int, device: int):
        d = driver()
        self.name = binary.name
        self.block = 32 * binary.num_warps
        self.shared = binary.shared
        cubin = binary.cubin
        _current_context(d, device)
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        d.check(d.module_load_data(ctypes.byref(module), ctypes.c_char_p(cubin)), f"loading kernel {self.name}")
        d.check(d.module_get_function(ctypes.byref(function), module, self.name.encode()),
                f"finding kernel {self.name}")
        self._module, self.function = module, function
        if self.shared > _SHARED_DEFAULT_LIMIT:
            optin, static = ctypes.c_int(), ctypes.c_int()
            d.check(d.device_get_attribute(ctypes.byref(optin), _DEVICE_MAX_SHARED_OPTIN, device), "shared memory limit")
            if optin.value > _SHARED_DEFAULT_LIMIT:
                d.check(d.func_set_cache_config(function, _CACHE_PREFER_SHARED), "cache config")
                d.check(d.func_get_attribute(ctypes.byref(static), _ATTR_SHARED_SIZE_BYTES, function),
                        "static shared memory")
                d.check(d.func_set_attribute(function, _ATTR_MAX_DYNAMIC_SHARED, optin.value - static.value),
                        "dynamic shared memory")
        plan, slots = [], []
        for position, ty in parameter_types(binary, arg_names, nargs):
            slot = ctypes.c_uint64() if ty.startswith("*") else _SLOT_TYPES[ty]()
            slots.append(slot)
            plan.append((slot, position, ty.startswith("*")))
        slots += [ctypes.c_uint64(0), ctypes.c_uint64(0)]  # the global and profile scratch pointers: none
        self._slots = slots
        self._plan = tuple(plan)
        self.params = (ctypes.c_void_p * len(slots))(*[ctypes.addressof(s) for s in slots])

    def pointer_slots(self, count: int) -> dict[int, Any]:
        """Argument position -> the slot of its pointer, for the pointer parameters among the
        first ``count`` arguments."""
        return {position: slot for slot, position, pointer in self._plan if pointer and position < count}

    def write_constants(self, args: tuple) -> None:
        """Write the slots of every parameter that is not a pointer from ``args`` (a launch's
        arguments). A kernel is kept per exact value of each integer argument
        (:func:`launch_key`), so every launch of it writes the same values there: a bound launch
        writes only pointers."""
        for slot, position, pointer in self._plan:
            if not pointer:
                slot.value = args[position]

    def __call__(self, grid_x: int, grid_y: int, stream: int, args: tuple) -> None:
        for slot, position, pointer in self._plan:
            a = args[position]
            slot.value = a.data_ptr() if pointer else a
        result = _DRIVER.launch(self.function, grid_x, grid_y, 1, self.block, 1, 1, self.shared, stream,
                                self.params, None)
        if result:
            _DRIVER.check(result, f"launching kernel {self.name}")


def load(binary: KernelBinary, arg_names: list[str], nargs: int, device: int) -> CudaKernel | None:
    """``binary`` loaded on ``device``, or None when it needs Triton's launcher."""
    if binary.needs_triton is not None:
        return None
    return CudaKernel(binary, arg_names, nargs, device)


def enabled() -> bool:
    """``config.direct_launch`` off sends every launch through Triton's ``fn[grid](...)``."""
    return config.direct_launch


# ---------------------------------------------------------------------------------------- the store
# Kernels compiled ahead (fireclay_triton.precompile) wait here for the launches that need them,
# keyed like ``DirectLaunch`` keys a launch: the function, its options (constexprs, warps, stages)
# and the specialization (device; per argument: a tensor's 16-byte alignment, an integer's value).
# A value of None: that launch goes through Triton's launcher (``KernelBinary.needs_triton``).

_STORE: dict[tuple, CudaKernel | None] = {}
_STORE_LOCK = threading.Lock()


def job_key(device: int, args: tuple) -> tuple:
    """The specialization of a compile job's launch (``CompileJob.args``: a dtype stands for an
    aligned tensor)."""
    return (device, *[True if isinstance(a, torch.dtype) else a for a in args])


def launch_key(device: int, args: tuple) -> tuple:
    """The specialization of a launch with ``args``."""
    return (device, *[(a.data_ptr() & 15) == 0 if isinstance(a, torch.Tensor) else a for a in args])


@dataclass(frozen=True)
class _Unloaded:
    """A binary compiled ahead, loaded by the first launch that needs it."""

    binary: KernelBinary
    arg_names: tuple[str, ...]
    nargs: int
    device: int


def remember(fn: Any, options: tuple, key: tuple, kernel: CudaKernel | None) -> None:
    with _STORE_LOCK:
        _STORE[(fn, options, key)] = kernel


def remember_binary(fn: Any, options: tuple, key: tuple, binary: KernelBinary, arg_names: list[str], nargs: int,
                    device: int) -> None:
    """Keep ``binary`` for the launch ``key``, unloaded: the launch that first needs it loads it,
    on its own thread (a compile-ahead thread loading it would wait for the GIL between each
    driver call while the first call runs in the interpreter: 0.38 s for BERT's 10 kernels)."""
    with _STORE_LOCK:
        _STORE[(fn, options, key)] = _Unloaded(binary, tuple(arg_names), nargs, device)


def recall(fn: Any, options: tuple, key: tuple) -> tuple[bool, CudaKernel | None]:
    """(found, kernel) for a launch's key; a kept binary is loaded now. A binary the driver
    refuses is forgotten (found False): the launch then compiles the kernel itself and reports
    what fails, naming it."""
    entry = (fn, options, key)
    with _STORE_LOCK:
        if entry not in _STORE:
            return False, None
        value = _STORE[entry]
    if not isinstance(value, _Unloaded):
        return True, value
    try:
        kernel = load(value.binary, list(value.arg_names), value.nargs, value.device)
    except LaunchError:
        with _STORE_LOCK:
            _STORE.pop(entry, None)
        return False, None
    remember(fn, options, key, kernel)
    return True, kernel
