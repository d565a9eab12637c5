"""Training throughput and losses of compiled models under DDP and FSDP2, one process per GPU.

    python -m benchmarks.distributed                        # every visible GPU, NCCL, bf16, 20 steps
    python -m benchmarks.distributed --world-size 2 --models gpt2 --parallel ddp
    python -m benchmarks.distributed --tiny                 # CPU, gloo, 2 processes: a smoke test
    python -m benchmarks.distributed --profile results/     # also profiler traces of the compiled cells

For each model (GPT-2 and Llama-style, about 100M parameters, random weights built from a config),
each parallelism (``ddp``: ``DistributedDataParallel``, the compiler wrapping the DDP module;
``fsdp2``: ``fully_shard`` on every transformer block and the root, each block compiled) and each
backend (``eager``, ``inductor`` = ``torch.compile``, ``fireclay`` = ``fireclay.compile``), every
rank trains a fresh copy from the same seed on its own batches for ``--steps`` AdamW steps; the
backends' copies of a model live side by side and take turns over the timed steps (``--rounds``),
so that the host's slow spells fall on all of them. The table gives tokens/s over all ranks after
``--warmup`` steps and the largest loss difference to eager's at any step. Processes are started with ``torch.multiprocessing.spawn`` (no torchrun):
rank r uses ``cuda:r`` and NCCL, or gloo on CPU. Results go to ``--out`` as JSON and Markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import socket
import time

import torch
import torch.distributed as dist


@dataclasses.dataclass
class Settings:
    world_size: int
    device: str
    dtype: str
    steps: int
    warmup: int
    batch: int
    seq: int
    models: list[str]
    parallel: list[str]
    backends: list[str]
    tiny: bool
    rounds: int
    profile: str
    out: str
    port: int


@dataclasses.dataclass
class Row:
    model: str
    parallel: str
    backend: str
    parameters: int = 0
    tokens_per_s: float = 0.0
    compile_s: float = 0.0  # the first step
    compiled_s: float = 0.0  # fireclay: from the start until no kernel compiles in the background
    losses: list[float] = dataclasses.field(default_factory=list)
    step_s: list[float] = dataclasses.field(default_factory=list)  # each step, synchronized by its loss
    max_loss_difference: float | None = None
    error: str = ""


def build_model(name: str, tiny: bool) -> torch.nn.Module:
    """A causal LM with random weights: GPT-2 (124M at full size) or Llama-style (about 100M).

    No key/value cache: training never reads it, and building one per step makes TorchDynamo
    recompile per layer under FSDP2 (its guards read the cache's per-layer state).
    """
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        size = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=128) if tiny else {}
        cfg = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, **size)
        return GPT2LMHeadModel(cfg)
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        size = (dict(hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=512) if tiny else
                dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=10, num_attention_heads=12,
                     num_key_value_heads=4, vocab_size=32000))
        return LlamaForCausalLM(LlamaConfig(max_position_embeddings=2048, use_cache=False, **size))
    raise SystemExit(f"unknown model {name!r}: gpt2 or llama")


def blocks_of(model: torch.nn.Module) -> torch.nn.ModuleList:
    inner = getattr(model, "transformer", None) or getattr(model, "model", None)
    return inner.h if hasattr(inner, "h") else inner.layers


def compiler_for(backend: str):
    if backend == "eager":
        return lambda m: m
    if backend == "inductor":
        return torch.compile
    if backend == "fireclay" or backend.startswith("fireclay-"):
        import fireclay

        name = "fireclay" if backend == "fireclay" else backend.removeprefix("fireclay-")
        return lambda m: fireclay.compile(m, backend=name)
    raise SystemExit(f"unknown backend {backend!r}: eager, inductor, fireclay or fireclay-NAME")


def prepare(model: torch.nn.Module, parallel: str, backend: str, device: torch.device) -> torch.nn.Module:
    compile_ = compiler_for(backend)
    if parallel == "none":  # one process's model as it is: the single-GPU baseline of the same step
        return compile_(model)
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        return compile_(ddp)
    if parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        blocks = blocks_of(model)
        for i, block in enumerate(blocks):
            fully_shard(block)
            blocks[i] = compile_(block)
        fully_shard(model)
        return model
    raise SystemExit(f"unknown parallelism {parallel!r}: ddp, fsdp2 or none")


def batch(s: Settings, vocab: int, step: int, rank: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(10_000 * step + rank)
    return torch.randint(0, vocab, (s.batch, s.seq), generator=g).to(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclasses.dataclass
class Cell:
    """One backend's copy of the model in a comparison: its compiled module, optimizer and results."""

    row: Row
    runnable: torch.nn.Module
    opt: torch.optim.Optimizer
    vocab: int
    timed_s: float = 0.0


def start(s: Settings, model_name: str, parallel: str, backend: str, device: torch.device) -> Cell:
    row = Row(model_name, parallel, backend)
    torch.manual_seed(0)
    model = build_model(model_name, s.tiny).to(device=device, dtype=getattr(torch, s.dtype))
    row.parameters = sum(p.numel() for p in model.parameters())
    runnable = prepare(model, parallel, backend, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    return Cell(row, runnable, opt, model.config.vocab_size)


def train_step(cell: Cell, s: Settings, step: int, rank: int, device: torch.device) -> float:
    """One optimizer step on the step's batch; its loss (averaged over ranks) is recorded. Seconds."""
    t0 = time.perf_counter()
    ids = batch(s, cell.vocab, step, rank, device)
    loss = cell.runnable(input_ids=ids, labels=ids).loss
    loss.backward()
    cell.opt.step()
    cell.opt.zero_grad(set_to_none=True)
    summed = loss.detach().float().clone()
    dist.all_reduce(summed)
    cell.row.losses.append(summed.item() / s.world_size)  # .item() waits for the step's kernels
    seconds = time.perf_counter() - t0
    cell.row.step_s.append(seconds)
    return seconds


def warm_up(cell: Cell, s: Settings, rank: int, device: torch.device) -> None:
    begun = time.perf_counter()
    for step in range(s.warmup):
        seconds = train_step(cell, s, step, rank, device)
        if step == 0:
            cell.row.compile_s = seconds
    if cell.row.backend == "fireclay":
        # steady state: kernels still compiling in the background finish first, as Inductor's
        # compile finished inside the first step
        import fireclay

        fireclay.wait_compiled()
        cell.row.compiled_s = time.perf_counter() - begun


def compare(s: Settings, model_name: str, parallel: str, rank: int, device: torch.device) -> list[Row]:
    """Every backend's copy of one model, side by side: each warms up, then the timed steps run in
    ``--rounds`` turns, each backend a share of the steps per turn, the first backend rotating, so
    that a slow spell of the host falls on all of them alike."""
    cells, failed = [], []
    for backend in s.backends:
        try:
            cell = start(s, model_name, parallel, backend, device)
            warm_up(cell, s, rank, device)
            cells.append(cell)
        except Exception as exc:  # one failing cell is reported, the rest still run
            failed.append(Row(model_name, parallel, backend, error=f"{type(exc).__name__}: {exc}"[:500]))
    timed = s.steps - s.warmup
    rounds = max(1, min(s.rounds, timed))
    shares = [timed // rounds + (1 if r < timed % rounds else 0) for r in range(rounds)]
    step = s.warmup
    for turn, share in enumerate(shares):
        for i in range(len(cells)):
            cell = cells[(turn + i) % len(cells)]
            if cell.row.error:
                continue
            synchronize(device)
            dist.barrier()
            try:
                cell.timed_s += sum(train_step(cell, s, step + k, rank, device) for k in range(share))
            except Exception as exc:
                cell.row.error = f"{type(exc).__name__}: {exc}"[:500]
        step += share
    for cell in cells:
        if not cell.row.error:
            cell.row.tokens_per_s = timed * s.batch * s.seq * s.world_size / cell.timed_s
            if s.profile and cell.row.backend != "eager":
                # Every rank runs the profiled steps (the collectives need them all); rank 0 records.
                profile(cell.runnable, cell.opt, s, cell.vocab, rank, device,
                        f"{model_name}-{parallel}-{cell.row.backend}")
    return [cell.row for cell in cells] + failed


def profile(runnable, opt, s: Settings, vocab: int, rank: int, device: torch.device, name: str) -> None:
    """A Chrome trace of three steps: the all-reduces should overlap the backward's kernels."""
    import contextlib

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    recording = profiler(activities=activities) if rank == 0 else contextlib.nullcontext()
    with recording as prof:
        for step in range(3):
            ids = batch(s, vocab, s.steps + step, rank, device)
            runnable(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        synchronize(device)
    if rank != 0:
        return
    os.makedirs(s.profile, exist_ok=True)
    path = os.path.join(s.profile, f"trace-{name}.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f).get("traceEvents", [])
    share, comm_ms, count = communication_overlap(events)
    print(f"{name}: {count} communication kernels, {comm_ms:.2f} ms over 3 steps, "
          f"{share:.0%} of it while a compute kernel ran", flush=True)
    print(kernel_summary(events, steps=3), flush=True)


def kernel_summary(events: list[dict], steps: int, top: int = 12) -> str:
    """Device time per step from a Chrome trace: all kernels, the time no kernel ran between the
    first and the last, the host's launch calls, and the kernels taking the most."""
    per_name: dict[str, list[float]] = {}
    launches = [e["dur"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "dur" in e
                and "launch" in e.get("name", "").lower()]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    for e in kernels:
        per_name.setdefault(e.get("name", "?"), []).append(e["dur"])
    total = sum(sum(d) for d in per_name.values())
    communication = sum(sum(d) for name, d in per_name.items() if "nccl" in name.lower())
    busy = merged_length(sorted((e["ts"], e["ts"] + e["dur"]) for e in kernels))
    span = (max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)) if kernels else 0.0
    lines = [f"  kernels per step {len(kernels) / steps:.0f}, compute kernels {(total - communication) / steps / 1000:.2f}"
             f" ms and communication kernels {communication / steps / 1000:.2f} ms per step, first kernel to last "
             f"{span / steps / 1000:.2f} ms per step, of it no kernel running {(span - busy) / steps / 1000:.2f} ms; "
             f"launch calls {len(launches) / steps:.0f} per step, {sum(launches) / steps / 1000:.2f} ms of host time"]
    for name, durations in sorted(per_name.items(), key=lambda kv: -sum(kv[1]))[:top]:
        lines.append(f"  {sum(durations) / steps / 1000:8.3f} ms {len(durations) / steps:6.1f}x  {name[:90]}")
    return "\n".join(lines)


def merged(intervals: list[tuple[float, float]]) -> list[list[float]]:
    """Sorted (begin, end) intervals joined where they overlap or touch."""
    joined: list[list[float]] = []
    for begin, end in intervals:
        if joined and begin <= joined[-1][1]:
            joined[-1][1] = max(joined[-1][1], end)
        else:
            joined.append([begin, end])
    return joined


def merged_length(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of sorted (begin, end) intervals."""
    return sum(end - begin for begin, end in merged(intervals))


def communication_overlap(events: list[dict]) -> tuple[float, float, int]:
    """How much of the communication kernels' time (NCCL) overlaps compute kernels, from a Chrome
    trace's events: (share of communication time overlapped, communication ms, kernels)."""
    kernels = [(e["ts"], e["ts"] + e["dur"], "nccl" in e.get("name", "").lower())
               for e in events if e.get("cat") == "kernel" and "dur" in e]
    busy = merged(sorted((begin, end) for begin, end, comm in kernels if not comm))
    total = covered = 0.0
    count = 0
    for begin, end, comm in kernels:
        if not comm:
            continue
        count += 1
        total += end - begin
        covered += sum(max(0.0, min(end, m_end) - max(begin, m_begin)) for m_begin, m_end in busy
                       if m_begin < end and m_end > begin)
    return (covered / total if total else 0.0), total / 1000.0, count


def worker(rank: int, s: Settings) -> None:
    if s.device == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if s.device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{s.port}",
                            rank=rank, world_size=s.world_size, device_id=device if s.device == "cuda" else None)
    rows = []
    try:
        for model_name in s.models:
            for parallel in s.parallel:
                compared = compare(s, model_name, parallel, rank, device)
                rows.extend(compared)
                if rank == 0:
                    for r in compared:
                        print(f"{model_name} {parallel} {r.backend}: {r.tokens_per_s:,.0f} tokens/s "
                              f"{r.error or ''}", flush=True)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        report(s, rows)


def report(s: Settings, rows: list[Row]) -> None:
    eager = {(r.model, r.parallel): r.losses for r in rows if r.backend == "eager" and r.losses}
    for r in rows:
        ref = eager.get((r.model, r.parallel))
        if ref and r.losses:
            r.max_loss_difference = max(abs(a - b) for a, b in zip(ref, r.losses))
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M")
    base = os.path.join(s.out, f"distributed-{s.device}-{s.world_size}x-{'tiny-' if s.tiny else ''}{stamp}")
    taken, n = base, 2
    while os.path.exists(taken + ".json"):  # two runs in one minute keep both results
        taken, n = f"{base}-{n}", n + 1
    base = taken
    os.makedirs(s.out, exist_ok=True)
    with open(base + ".json", "w") as f:
        json.dump({"settings": dataclasses.asdict(s), "torch": torch.__version__,
                   "gpu": torch.cuda.get_device_name(0) if s.device == "cuda" else "",
                   "rows": [dataclasses.asdict(r) for r in rows]}, f, indent=1)
    lines = [f"# distributed training: {s.world_size} x {s.device}, {s.dtype}, batch {s.batch} x {s.seq} per rank, "
             f"{s.steps} steps ({s.warmup} warm-up)", "",
             "| model | parallel | backend | params | tokens/s | vs eager | first step s | compiled s | median step ms "
             "| max loss diff | note |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    speed = {(r.model, r.parallel): r.tokens_per_s for r in rows if r.backend == "eager"}
    for r in rows:
        base_speed = speed.get((r.model, r.parallel)) or 0
        ratio = f"{r.tokens_per_s / base_speed:.2f}x" if base_speed and r.tokens_per_s else ""
        diff = "" if r.max_loss_difference is None else f"{r.max_loss_difference:.2e}"
        compiled = f"{r.compiled_s:.1f}" if r.compiled_s else ""
        timed = sorted(r.step_s[s.warmup:])
        median = f"{1000 * timed[len(timed) // 2]:.1f}" if timed else ""
        lines.append(f"| {r.model} | {r.parallel} | {r.backend} | {r.parameters / 1e6:.1f}M | {r.tokens_per_s:,.0f} | "
                     f"{ratio} | {r.compile_s:.1f} | {compiled} | {median} | {diff} | {r.error} |")
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {base}.json and .md")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=int, default=0, help="processes (default: GPUs, or 2 on CPU)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="", help="bfloat16 (default on CUDA) or float32 (default on CPU)")
    p.add_argument("--steps", type=int, default=0, help="default 20 (4 with --tiny)")
    p.add_argument("--warmup", type=int, default=0, help="steps left out of tokens/s (default 5; 1 with --tiny)")
    p.add_argument("--batch", type=int, default=0, help="sequences per rank (default 8; 2 with --tiny)")
    p.add_argument("--seq", type=int, default=0, help="tokens per sequence (default 1024; 32 with --tiny)")
    p.add_argument("--models", default="gpt2,llama")
    p.add_argument("--parallel", default="ddp,fsdp2", help="ddp, fsdp2, or none (no wrapper: one process's step)")
    p.add_argument("--backends", default="eager,inductor,fireclay")
    p.add_argument("--rounds", type=int, default=4, help="turns the timed steps are split into, every backend "
                   "taking its share of each turn (interleaved; default 4)")
    p.add_argument("--tiny", action="store_true", help="tiny models on CPU with gloo: a smoke test")
    p.add_argument("--profile", default="", help="folder for profiler traces of the compiled backends (rank 0)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = p.parse_args(argv)
    device = "cpu" if a.tiny else a.device
    world = a.world_size or (torch.cuda.device_count() if device == "cuda" else 2)
    if device == "cuda" and world > torch.cuda.device_count():
        raise SystemExit(f"--world-size {world} needs {world} GPUs; {torch.cuda.device_count()} are visible")
    s = Settings(world_size=world, device=device, dtype=a.dtype or ("bfloat16" if device == "cuda" else "float32"),
                 steps=a.steps or (4 if a.tiny else 20), warmup=a.warmup or (1 if a.tiny else 5),
                 batch=a.batch or (2 if a.tiny else 8), seq=a.seq or (32 if a.tiny else 1024),
                 models=a.models.split(","), parallel=a.parallel.split(","), backends=a.backends.split(","),
                 tiny=a.tiny, rounds=a.rounds, profile=a.profile, out=a.out, port=free_port())
    if s.warmup >= s.steps:
        raise SystemExit("--warmup must be smaller than --steps")
    os.environ.setdefault("FIRECLAY_BACKGROUND_COMPILE", "0")
    if device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    torch.multiprocessing.spawn(worker, args=(s,), nprocs=world, join=True)


if __name__ == "__main__":
    main()
