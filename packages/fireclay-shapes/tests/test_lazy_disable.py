"""torch's Python meta kernels run without importing TorchDynamo (fireclay_shapes.torch._lazy_disable),
and behave as before once it is imported."""

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))


def run_fresh(code: str) -> str:
    """``code`` in a fresh interpreter (the tests' folder on its path); returns its stdout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_op_table_on_fakes_matches_eager_without_importing_dynamo():
    out = run_fresh("""
        import sys
        import torch
        from optable import CASES
        from fireclay_shapes.torch import FakeMode, UnsupportedOpError
        assert "torch._dynamo" not in sys.modules, "importing torch and fireclay_shapes imported TorchDynamo"

        def flat(out):
            return [t for o in out for t in flat(o)] if isinstance(out, (tuple, list)) else [out]

        def meta_of(t):
            return (tuple(t.shape), t.stride(), t.dtype, t.storage_offset())

        torch.manual_seed(0)
        checked = 0
        for case in CASES:
            real = case.inputs(case.sizes)
            mode = FakeMode()
            fakes = [mode.from_real(t) for t in real]
            try:
                with mode:
                    out = flat(case.fn(*fakes))
            except UnsupportedOpError:
                continue
            assert [meta_of(o) for o in out] == [meta_of(e) for e in flat(case.fn(*real))], case.name
            assert "torch._dynamo" not in sys.modules, f"{case.name} imported TorchDynamo"
            checked += 1
        print(checked)
    """)
    assert int(out.split()[-1]) >= 40  # the table has 50 cases fakes support


def test_wrapped_functions_use_dynamos_disable_once_it_is_imported():
    out = run_fresh("""
        import sys
        import torch
        from fireclay_shapes.torch import FakeMode, _lazy_disable
        mode = FakeMode()
        x = mode.from_real(torch.randn(4, 5))
        with mode:
            torch.rsqrt(x + 1)  # a reference under torch's disable wrapper
        assert _lazy_disable._installed[0] > 0
        assert "torch._dynamo" not in sys.modules

        import torch._dynamo
        wrappers = _lazy_disable._wrappers(_lazy_disable._wrapper_code())
        fns = [dict(zip(w.__code__.co_freevars, w.__closure__))["fn"].cell_contents for w in wrappers]
        y = mode.from_real(torch.randn(6, 7))  # new sizes: the meta-kernel cache does not answer
        with mode:
            torch.rsqrt(y + 1)
        swapped = [f for f in fns if getattr(f.__dynamo_disable, "__qualname__", "").startswith("_stand_in")]
        assert len(swapped) < len(fns), "no stand-in was replaced by TorchDynamo's wrapper"

        # TorchDynamo still compiles code that runs these references, and matches eager
        def f(a, b):
            return torch.rsqrt(a.abs() + 1) * b + torch.nn.functional.gelu(a)
        a, b = torch.randn(8, 3), torch.randn(8, 3)
        got = torch.compile(f, backend="aot_eager")(a, b)
        torch.testing.assert_close(got, f(a, b))
        print("ok")
    """)
    assert out.split()[-1] == "ok"
