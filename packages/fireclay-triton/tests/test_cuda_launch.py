"""fireclay's own kernel launches (fireclay_triton.cuda_launch): the parameters a launch passes
are exactly the compiled kernel's, in order and in size, whatever Triton specialized away.

Without a GPU: kernels compiled for an sm_90 target (Triton's bundled ptxas), in a subprocess
without ``TRITON_INTERPRET``; the PTX entry's ``.param`` list is the truth the launch plan is
checked against. The launches themselves run in tests/test_gpu.py on a GPU."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

KERNEL = textwrap.dedent('''
    import triton
    import triton.language as tl


    @triton.jit
    def k(ptr0, ptr1, n, m, scale, big, XBLOCK: tl.constexpr):
        i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        x = tl.load(ptr0 + i * m, mask=i < n)
        tl.store(ptr1 + i, x * scale + big, mask=i < n)
''')

WORKER = textwrap.dedent('''
    import importlib.util, json, re, sys
    import torch
    from fireclay_triton.cuda_launch import KernelBinary, parameter_types
    from fireclay_triton.precompile import compile_kernel
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import MockTensor

    spec = importlib.util.spec_from_file_location("kmod", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cases = json.loads(sys.argv[2])
    out = []
    for n, m, scale, big in cases:
        args = [MockTensor(torch.float32), MockTensor(torch.float32), n, m, scale, big]
        compiled = compile_kernel(mod.k, args, {"XBLOCK": 128, "num_warps": 4}, GPUTarget("cuda", 90, 32))
        entry = re.search(r"\\.entry\\s+\\w+\\(([^)]*)\\)", compiled.asm["ptx"], re.S).group(1)
        params = re.findall(r"\\.param\\s+\\.(\\w+)", entry)
        binary = KernelBinary.of(compiled)
        out.append({"plan": parameter_types(binary, mod.k.arg_names, len(args)), "ptx": params,
                    "unsupported": binary.needs_triton})
    print(json.dumps(out))
''')

# PTX parameter type of each Triton type the launch writes
PTX_TYPE = {"i32": "u32", "i64": "u64", "fp32": "f32", "fp64": "f64"}


@pytest.mark.parametrize("n,m,scale,big", [
    (1000, 3, 0.5, 2**40),  # nothing specialized away; a 64-bit integer
    (1000, 1, 2.0, 5),  # m == 1 becomes a constant, not a parameter
    (4096, 16, 1.5, 1),  # multiples of 16 stay parameters (with an alignment attribute)
    (1, 1, 1.0, 1),  # every integer 1
])
def test_launch_parameters_are_the_compiled_kernels(tmp_path, n, m, scale, big):
    source = tmp_path / "kmod.py"
    source.write_text(KERNEL)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    done = subprocess.run([sys.executable, "-c", WORKER, str(source), json.dumps([[n, m, scale, big]])],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["unsupported"] is None
    plan, ptx = found["plan"], found["ptx"]
    # the launch's slots, then the global and profile scratch pointers
    assert len(ptx) == len(plan) + 2, (plan, ptx)
    for (_, ty), ptx_type in zip(plan, ptx):
        assert ptx_type == ("u64" if ty.startswith("*") else PTX_TYPE[ty]), (plan, ptx)
    assert ptx[-2:] == ["u64", "u64"]
    positions = [position for position, _ in plan]
    assert positions == sorted(positions) and positions[:2] == [0, 1]
    ones = {index for index, value in zip((2, 3, 5), (n, m, big)) if value == 1}
    # an integer equal to 1 is specialized into the kernel; every other argument is passed
    assert set(positions) == {0, 1, 2, 3, 4, 5} - ones


def test_a_compile_jobs_key_is_the_key_of_its_launch():
    # kernels compiled ahead are found by the launches they were compiled for: a job's dtype
    # stands for a 16-byte aligned tensor, integers key by value
    import torch

    from fireclay_triton.cuda_launch import job_key, launch_key

    base = torch.empty(64, dtype=torch.float32)
    aligned = base[:32] if base.data_ptr() % 16 == 0 else base[1:33]
    assert aligned.data_ptr() % 16 == 0
    misaligned = aligned[1:]
    assert launch_key(0, (aligned, aligned, 100, 1)) == job_key(0, (torch.float32, torch.float16, 100, 1))
    assert launch_key(0, (misaligned, aligned, 100, 1)) != job_key(0, (torch.float32, torch.float32, 100, 1))
    assert launch_key(0, (aligned, 101)) != job_key(0, (torch.float32, 100))
    assert launch_key(1, (aligned, 100)) != job_key(0, (torch.float32, 100))


def test_prewarm_needs_a_gpu():
    import torch

    from fireclay_triton import prewarm
    from fireclay_triton.config import interpreting

    if torch.cuda.is_available() and not interpreting():
        pytest.skip("a GPU is here: prewarm starts its thread")
    assert prewarm() is None


def test_binaries_kept_ahead_load_at_their_first_launch(monkeypatch):
    import torch

    from fireclay_triton import cuda_launch

    binary = cuda_launch.KernelBinary("k", 4, 0, b"cubin", (("ptr0", "*fp32"), ("n", "i32")), None)
    loads = []

    def load(b, arg_names, nargs, device):
        loads.append((b.name, tuple(arg_names), nargs, device))
        if b.name == "refused":
            raise cuda_launch.LaunchError("the driver refused it")
        return f"loaded {b.name}"

    monkeypatch.setattr(cuda_launch, "load", load)
    fn, options = object(), (("XBLOCK", 128),)
    key = cuda_launch.job_key(0, (torch.float32, 7))
    cuda_launch.remember_binary(fn, options, key, binary, ["ptr0", "n"], 2, 0)
    assert loads == []  # nothing loaded while compiling ahead
    assert cuda_launch.recall(fn, options, key) == (True, "loaded k")
    assert cuda_launch.recall(fn, options, key) == (True, "loaded k")
    assert loads == [("k", ("ptr0", "n"), 2, 0)]  # once
    assert cuda_launch.recall(fn, options, cuda_launch.job_key(0, (torch.float32, 8))) == (False, None)

    refused = cuda_launch.KernelBinary("refused", 4, 0, b"", (), None)
    cuda_launch.remember_binary(fn, options, key, refused, ["ptr0", "n"], 2, 0)
    assert cuda_launch.recall(fn, options, key) == (False, None)  # the launch compiles it itself
    assert cuda_launch.recall(fn, options, key) == (False, None)
    assert len(loads) == 2
