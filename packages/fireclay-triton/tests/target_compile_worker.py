"""Run in a fresh process without ``TRITON_INTERPRET``: compile some test programs' kernels
ahead for an sm_90 target (no GPU needed) and print, as JSON, what went into Triton's cache.

    python target_compile_worker.py [p]WORKERS PROGRAM_ID...   ("p": forked processes, else threads;
                                                                 ids of tests/programs.py, "split", "broken")
"""

import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(HERE, "..", "..", "fireclay-loops", "tests"))

from programs import PROGRAMS, build_program  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from fireclay_triton import Config, compile_program  # noqa: E402
from fireclay_triton.api import program_compile_jobs  # noqa: E402
from fireclay_triton.precompile import CompileJob, compile_for_target  # noqa: E402

BROKEN = '''
import triton
import triton.language as tl


@triton.jit
def broken_kernel(x_ptr, numel, XBLOCK: tl.constexpr):
    offs = tl.arange(0, 3)  # not a power of two: Triton refuses it
    tl.store(x_ptr + offs, tl.load(x_ptr + offs), mask=offs < numel)
'''


def jobs_for(ids):
    jobs = []
    by_id = {p.id: p for p in PROGRAMS}
    for pid in ids:
        if pid == "split":  # a split column reduction: its kernel and its finishing kernel
            import torch
            from test_kernel_variants import SPLIT_CASES, program_of
            _, program = program_of(SPLIT_CASES[0].values[0], torch.empty(5000, 40, device="meta"))
            jobs += program_compile_jobs(compile_program(program, cfg=Config(autotune=True)))
            continue
        if pid == "broken":
            import torch

            from fireclay_triton.runtime import load_module
            module, _ = load_module(BROKEN, os.path.join(os.environ["FIRECLAY_CACHE_DIR"], "broken"))
            jobs.append(CompileJob("broken_kernel", module.broken_kernel, (torch.float32, 100),
                                   (("XBLOCK", 128), ("num_stages", 1), ("num_warps", 4))))
            continue
        fn, inputs, _, _ = by_id[pid].values
        _, program, _ = build_program(fn, inputs, "cpu")
        compiled = compile_program(program, cfg=Config(autotune=True))
        jobs += program_compile_jobs(compiled)
    return jobs


def cache_listing():
    found = {}
    root = os.environ["TRITON_CACHE_DIR"]
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".cubin"):
                path = os.path.join(folder, f)
                with open(path, "rb") as fh:
                    found[os.path.relpath(path, root)] = [hashlib.sha256(fh.read()).hexdigest(),
                                                          os.stat(path).st_mtime_ns]
    return found


def main():
    pool = "processes" if sys.argv[1].startswith("p") else "threads"
    workers = int(sys.argv[1].lstrip("p"))
    jobs = jobs_for(sys.argv[2:])
    report = compile_for_target(jobs, GPUTarget("cuda", 90, 32), workers=workers, pool=pool)
    print(json.dumps({"jobs": report.jobs, "failures": report.failures, "seconds": report.seconds,
                      "names": sorted({j.name for j in jobs}), "cubins": cache_listing()}))


if __name__ == "__main__":
    main()
