"""Cold compile time of one model on one backend, measured in this fresh process.

The parent (benchmarks.runner) starts `python -m benchmarks.cold ...` with every cache
directory variable (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, FIRECLAY_CACHE_DIR) pointed at a
new empty temporary directory. Here: build the model and its inputs (not timed; imports of torch
and transformers are not timed either), then time the backend's compile call (``torch.compile``
imports TorchDynamo there) and the first call of the compiled model, which includes capture,
compile and one run (the time to the first output), and the time until
compiled code is in use: a backend that compiles in the background (fireclay on CUDA) answers
the first calls another way, so the calls after the first run until every graph switched
(`measure.run_until_compiled`). The last line of stdout is a JSON object.
"""

from __future__ import annotations

import argparse
import json

from benchmarks.backends import get_backend
from benchmarks.measure import DTYPES, MODES, Precision, fresh_copy, run_until_compiled, timed
from benchmarks.models import PRESETS, get_model
from benchmarks.runner import TIMING_SEED, Options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--preset", choices=PRESETS, default="small", help="model sizes: small, medium or large")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", choices=MODES, default="inference")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--amp", choices=DTYPES[1:])
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    report: dict = {"model": args.model, "backend": args.backend, "cold_compile_s": None, "cold_compiled_s": None,
                    "error": None}
    try:
        options = Options(device=args.device, mode=args.mode, preset=args.preset,
                          precision=Precision(args.dtype, args.amp))
        built = get_model(args.model).build(args.preset)
        options.precision.cast_model(built.module)
        backend = get_backend(args.backend)
        reason = backend.unavailable()
        if reason:
            raise RuntimeError(reason)
        inputs = options.inputs(built, TIMING_SEED)
        model = fresh_copy(built.module, args.device)
        # timed from the compile call: torch.compile imports TorchDynamo there, fireclay.compile
        # nothing, and both then pay torch's own lazy imports in the first call
        wrap_s, compiled = timed(lambda: backend.compile(model), args.device)
        step = options.step(compiled, model)
        first_s, _ = timed(lambda: step(inputs), args.device)
        report["cold_compile_s"] = wrap_s + first_s
        settle_s, _ = timed(lambda: run_until_compiled(lambda: step(inputs), backend.wait_compiled), args.device)
        report["cold_compiled_s"] = report["cold_compile_s"] + settle_s
    except Exception as error:
        report["error"] = f"{type(error).__name__}: {str(error).strip()[:300]}"
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
