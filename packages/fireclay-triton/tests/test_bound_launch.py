"""Bound launches (fireclay_triton.bound_launch): a wrapper's kernel calls after the first go
through a function bound to one config, device and set of integer arguments.

In Triton's interpreter, programs with constant and symbolic sizes against eager on fresh inputs,
sizes changing between calls. Without a GPU, the driver path with a stand-in driver that decodes
what ``cuLaunchKernel`` would receive: the grid, the stream and each parameter slot, in order."""

import ctypes
import os

import pytest
import torch
from aten_builder import T
from programs import build_program

import fireclay_triton
from fireclay_ir import Graph, Program, TensorMeta
from fireclay_triton import bound_launch, compile_program, cuda_launch, runtime
from fireclay_triton.autotune import TuningCache

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs in Triton's interpreter")


def _bound_in_namespace(compiled) -> dict:
    namespace = compiled._call.__globals__
    return {name: namespace[name] for name in compiled.launchers}


def _three_inputs(b, x, y, z):
    # distinct roles per argument: a swapped pair of pointers gives other numbers
    return (b.call("add.Tensor", b.call("mul.Tensor", x, y), b.call("exp.default", z)),
            b.call("_softmax.default", b.call("sub.Tensor", x, z), 1, False))


@interpreted
@pytest.mark.parametrize("shapes", [((5, 7), (7,), (5, 7)), ((33, 130), (130,), (33, 130))], ids=["small", "ragged"])
def test_constant_sizes_are_bound_not_passed(shapes):
    b, program, _ = build_program(_three_inputs, tuple(T(*s) for s in shapes), "cpu")
    compiled = compile_program(program)
    for name in compiled.launchers:
        line = next(ln for ln in compiled.wrapper_source.splitlines() if f"{name}(" in ln)
        assert "numel" not in line.split("#")[0] and f"{name}(dev, stream, " in line
    gen = torch.Generator().manual_seed(1)
    for call in range(3):  # the first call binds; the next ones launch through the bound functions
        tensors = [torch.randn(s, generator=gen) for s in shapes]
        for got, want in zip(compiled(*tensors), b.eager(*tensors)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        if call == 0:
            bound = _bound_in_namespace(compiled)
            assert all(not isinstance(f, runtime.Launcher) for f in bound.values())
    assert _bound_in_namespace(compiled) == bound  # nothing bound again


def _symbolic_program():
    """(s0, s1) softmax rows plus a broadcast row vector: kernels with two size symbols, whose
    number of points depends on both."""
    g = Graph("main")
    x = g.add_input("x", TensorMeta("float32", ("s0", "s1")))
    v = g.add_input("v", TensorMeta("float32", ("s1",)))
    s = g.call("aten::mul.Tensor", (x, v), out=TensorMeta("float32", ("s0", "s1")))
    m = g.call("aten::_softmax.default", (s, 1, False), out=TensorMeta("float32", ("s0", "s1")))
    t = g.call("aten::add.Tensor", (m, x), out=TensorMeta("float32", ("s0", "s1")))
    g.set_outputs([t])
    p = Program.single(g)
    p.add_symbol("s0", hint=4, min=2)
    p.add_symbol("s1", hint=8, min=2)
    return p


@interpreted
def test_symbolic_sizes_rebind_when_they_change():
    compiled = compile_program(_symbolic_program())
    assert "s0, s1" in compiled.wrapper_source  # the symbols are passed to the kernels
    gen = torch.Generator().manual_seed(2)
    sizes = [(3, 5), (5, 3), (3, 5), (9, 40), (5, 3)]  # swapped values catch swapped integer arguments
    for rows, cols in sizes:
        x, v = torch.randn(rows, cols, generator=gen), torch.randn(cols, generator=gen)
        want = torch.softmax(x * v, 1) + x
        torch.testing.assert_close(compiled(x, v)[0], want, atol=1e-5, rtol=1e-5)
    for launcher in compiled.launchers.values():
        assert len(launcher._bound) == len(set(sizes))  # one bound launch per size, kept for reuse


@interpreted
def test_an_empty_launch_binds_to_nothing():
    compiled = compile_program(_symbolic_program())
    gen = torch.Generator().manual_seed(3)
    for rows in (0, 4, 0):
        x, v = torch.randn(rows, 6, generator=gen), torch.randn(6, generator=gen)
        torch.testing.assert_close(compiled(x, v)[0], torch.softmax(x * v, 1) + x)


# ------------------------------------------------------------ the driver path, with a stand-in driver


class RecordingDriver:
    """The driver calls CudaKernel makes, succeeding at once; each launch is decoded and kept."""

    def __init__(self):
        self.launches = []
        self.kernels = []  # every CudaKernel loaded, with its signature

    def __getattr__(self, name):  # module loading and context calls
        return lambda *args: 0

    def check(self, result, what):
        assert result == 0, what

    def _decode(self, params):
        kernel = next(k for k, _ in self.kernels if ctypes.addressof(k.params) == ctypes.addressof(params))
        values = []
        for i, (_, _, pointer) in enumerate(kernel._plan):
            ty = ctypes.c_uint64 if pointer else type(kernel._slots[i])
            values.append(ty.from_address(params[i]).value)
        return kernel, values

    def launch(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        kernel, values = self._decode(params)
        self.launches.append({"kernel": kernel, "grid": (gx, gy, gz), "block": bx, "stream": stream,
                              "values": values, "bound": False})
        return 0

    def launch_packed(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        kernel, values = self._decode(params)
        assert function is kernel.function
        self.launches.append({"kernel": kernel, "grid": (gx.value, gy.value, gz.value), "block": bx.value,
                              "stream": stream.value or 0, "values": values, "bound": True})
        return 0


class FakeJit:
    """A ``@triton.jit`` function's face: its parameter names, and ``fn[grid](...)``."""

    def __init__(self, arg_names):
        self.arg_names = arg_names
        self.triton_launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.triton_launches.append((grid, args))


@pytest.fixture
def driver(monkeypatch):
    d = RecordingDriver()
    monkeypatch.setattr(cuda_launch, "_DRIVER", d)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(runtime, "_raw_stream", lambda device: 0x5000 + device)
    monkeypatch.setattr(fireclay_triton.config, "direct_launch", True)

    def recall(fn, options, key):
        # what Triton would compile: a pointer per tensor, an integer equal to 1 made a constant
        signature = [(name, "*fp32" if isinstance(spec, bool) else ("constexpr" if spec == 1 else "i64"))
                     for name, spec in zip(fn.arg_names, key[1:])]
        signature += [(name, "constexpr") for name in fn.arg_names[len(key) - 1:]]
        binary = cuda_launch.KernelBinary("k", 4, 0, b"", tuple(signature), None)
        kernel = cuda_launch.load(binary, list(fn.arg_names), len(key) - 1, key[0])
        d.kernels.append((kernel, signature))
        return True, kernel

    monkeypatch.setattr(cuda_launch, "recall", recall)
    return d


def _launcher(tmp_path, sizes=(None, None)):
    fn = FakeJit(["ptr0", "ptr1", "ptr2", "ks0", "xnumel", "XBLOCK"])
    launcher = runtime.Launcher(fn, "kernel0", "pointwise", "h", False, False, TuningCache(str(tmp_path)),
                                arity=(3, 1), sizes=sizes)
    launcher.namespace = {"kernel0": launcher}
    return launcher, fn


def _expected(tensors, s0, numel):
    """A launch's parameter values in order, as Triton's specialization leaves them."""
    return [t.data_ptr() for t in tensors] + [v for v in (s0, numel) if v != 1]


def test_driver_launches_pass_pointers_and_sizes_in_order(driver, tmp_path):
    launcher, _ = _launcher(tmp_path)
    stream = ctypes.c_void_p(0x5000)
    tensors = [torch.empty(300) for _ in range(3)]
    launcher(0, stream, *tensors, 7, 300)  # the first launch: through the launcher, then bound
    first = driver.launches[-1]
    assert not first["bound"] and first["values"] == _expected(tensors, 7, 300)
    assert first["stream"] == 0x5000 and first["grid"][1:] == (1, 1)
    bound = launcher.namespace["kernel0"]
    assert not isinstance(bound, runtime.Launcher)
    for _ in range(3):
        fresh = [torch.empty(300) for _ in range(3)]
        bound(0, stream, *fresh, 7, 300)
        last = driver.launches[-1]
        assert last["bound"] and last["values"] == _expected(fresh, 7, 300)
        assert last["grid"] == first["grid"] and last["stream"] == 0x5000 and last["block"] == first["block"]
    assert len(driver.kernels) == 1


@pytest.mark.parametrize("change", ["symbol", "numel", "one", "misaligned", "device"])
def test_a_bound_launch_hands_other_arguments_back(driver, tmp_path, change):
    launcher, _ = _launcher(tmp_path)
    stream = ctypes.c_void_p(0x5000)
    launcher(0, stream, *[torch.empty(300) for _ in range(3)], 7, 300)
    bound = launcher.namespace["kernel0"]
    tensors = [torch.empty(301) for _ in range(3)]
    s0, numel, dev = 7, 300, 0
    if change == "symbol":
        s0 = 9
    elif change == "numel":
        numel = 5000
    elif change == "one":
        s0 = 1  # Triton specializes it away: not a parameter of that binary
    elif change == "misaligned":
        tensors[1] = tensors[1][1:]  # 4 bytes past an aligned start
    elif change == "device":
        dev = 1
    bound(dev, stream, *tensors, s0, numel)
    last = driver.launches[-1]
    assert not last["bound"] and last["values"] == _expected(tensors, s0, numel)
    assert len(driver.kernels) == 2  # another specialization, loaded for its own key
    rebound = launcher.namespace["kernel0"]
    assert rebound is not bound
    rebound(dev, stream, *tensors, s0, numel)
    assert driver.launches[-1]["bound"] and driver.launches[-1]["values"] == _expected(tensors, s0, numel)
    # the first arguments again: the launch bound for them is put back, nothing loaded again
    rebound(0, stream, *[torch.empty(300) for _ in range(3)], 7, 300)
    assert launcher.namespace["kernel0"] is bound and len(driver.kernels) == 2


def test_constant_sizes_are_written_once(driver, tmp_path):
    launcher, _ = _launcher(tmp_path, sizes=(4096, None))
    stream = ctypes.c_void_p(0)
    tensors = [torch.empty(4096) for _ in range(3)]
    launcher(0, stream, *tensors, 5)  # no numel passed: the program's constant
    bound = launcher.namespace["kernel0"]
    fresh = [torch.empty(4096) for _ in range(3)]
    bound(0, stream, *fresh, 5)  # writes the pointers only: the integers are in their slots already
    assert driver.launches[-1]["bound"] and driver.launches[-1]["values"] == _expected(fresh, 5, 4096)
    assert driver.launches[-1]["grid"] == driver.launches[0]["grid"]
    assert driver.launches[0]["grid"][0] == -(-4096 // launcher.chosen[(4096, 1)].XBLOCK)


def test_without_direct_launches_every_launch_goes_through_triton(driver, tmp_path, monkeypatch):
    launcher, fn = _launcher(tmp_path)
    stream = ctypes.c_void_p(0)
    launcher(0, stream, *[torch.empty(64) for _ in range(3)], 3, 64)
    bound = launcher.namespace["kernel0"]
    monkeypatch.setattr(fireclay_triton.config, "direct_launch", False)
    dev, stream = runtime.launch_target()
    assert (dev, stream) == (-1, None)
    tensors = [torch.empty(64) for _ in range(3)]
    bound(dev, stream, *tensors, 3, 64)
    (grid, args), = fn.triton_launches
    assert args == (*tensors, 3, 64)
    assert launcher.namespace["kernel0"] is bound  # nothing bound for a launch through Triton


def _split_launcher(tmp_path):
    """A split reduction (two buffers, constant sizes) over a stand-in pair of kernels."""
    main = FakeJit(["ptr0", "ptr1", "ws", "rchunk", "xnumel", "rnumel", "XBLOCK", "RBLOCK"])
    finish = FakeJit(["ptr0", "ptr1", "ws", "nsplit", "xnumel", "XBLOCK", "NSPLIT"])
    launcher = runtime.Launcher(main, "kernel0", "split", "h", False, False, TuningCache(str(tmp_path)),
                                finisher=finish, partials=1, arity=(2, 0), sizes=(8, 100000))
    launcher.namespace = {"kernel0": launcher}
    launcher._sms = 132
    return launcher


def test_split_reductions_bind_both_launches(driver, tmp_path):
    launcher = _split_launcher(tmp_path)
    stream = ctypes.c_void_p(0x5000)
    launcher(0, stream, torch.empty(800000), torch.empty(8))
    first = driver.launches[-2:]
    assert [launch["bound"] for launch in first] == [False, False]
    bound = launcher.namespace["kernel0"]
    assert not isinstance(bound, runtime.Launcher)
    for _ in range(2):
        x, out = torch.empty(800000), torch.empty(8)
        before = len(driver.launches)
        bound(0, stream, x, out)
        assert len(driver.launches) == before + 2
        main, finish = driver.launches[-2:]
        assert main["bound"] and finish["bound"] and main["kernel"] is not finish["kernel"]
        for launch, was in zip((main, finish), first):
            # the program's pointers, a workspace both kernels share, then the bound integers
            assert launch["values"][:2] == [x.data_ptr(), out.data_ptr()]
            assert launch["values"][3:] == was["values"][3:] and launch["grid"] == was["grid"]
            assert launch["stream"] == 0x5000
        assert main["values"][2] == finish["values"][2]
    # the workspace is one tensor kept across launches, holding no memory between them
    (ws, storage), = bound.__closure__[[c for c in bound.__code__.co_freevars].index("pool")].cell_contents
    assert storage.nbytes() == 0 and ws.untyped_storage().nbytes() == 0
    assert len(driver.kernels) == 2
    bound(1, stream, torch.empty(800000), torch.empty(8))  # another device: back to the launcher
    assert not driver.launches[-1]["bound"] and launcher.namespace["kernel0"] is not bound


def test_bound_functions_are_shared_per_argument_shape():
    made = []
    for buffers, values in [(2, (3,)), (2, (5,)), (3, ())]:
        made.append(bound_launch.bind_run(lambda *a: ("general", a), lambda own: ("run", own), buffers + len(values),
                                          buffers, values))
    assert made[0].__code__ is made[1].__code__ and made[0].__code__ is not made[2].__code__
    assert made[0](0, None, "a", "b", 3) is None and made[0](0, None, "a", "b", 4) == ("general", (0, None, "a", "b", 4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bound_driver_launches_on_gpu():
    """Sizes changing, a misaligned input and another stream: each launch through the bound
    function or back through the launcher, always eager's result."""
    compiled = compile_program(_symbolic_program())
    gen = torch.Generator(device="cuda").manual_seed(4)
    side = torch.cuda.Stream()
    for rows, cols, misaligned, on_side in [(3, 5, False, False), (3, 5, False, False), (5, 3, False, False),
                                            (3, 5, True, False), (3, 5, False, True), (64, 1000, False, False)]:
        x = torch.randn(rows * cols + 1, device="cuda", generator=gen)
        x = (x[1:] if misaligned else x[:-1]).view(rows, cols)
        v = torch.randn(cols, device="cuda", generator=gen)
        want = torch.softmax(x * v, 1) + x
        if on_side:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                got = compiled(x, v)[0]
            torch.cuda.current_stream().wait_stream(side)
        else:
            got = compiled(x, v)[0]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert all(not isinstance(f, runtime.Launcher) for f in _bound_in_namespace(compiled).values())
