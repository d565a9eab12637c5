"""Worker side of test_distributed.py: runs in each of the spawned processes of a gloo group.

Every case trains a fresh copy of one model for a few SGD steps under DDP or FSDP2, eagerly and
compiled, on inputs that differ per rank, and records how far the compiled parameters end from
eager's and what the compiled run did (graphs compiled, bucket all-reduces started before the
backward reached the model's input).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 5


class MLP(torch.nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16 if i == 0 else width, width) for i in range(3))
        self.head = torch.nn.Linear(width, 4)

    def forward(self, x):
        for layer in self.layers:
            x = F.gelu(layer(x))
        return self.head(x)


class Block(torch.nn.Module):
    """A pre-norm transformer block: causal self-attention and an MLP."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Transformer(torch.nn.Module):
    def __init__(self, dim: int = 32, layers: int = 2):
        super().__init__()
        self.embed = torch.nn.Linear(8, dim)
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = torch.nn.Linear(dim, 8)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


MODELS = {"mlp": (MLP, (8, 16), (8, 4)), "transformer": (Transformer, (2, 6, 8), (2, 6, 8))}


@dataclass
class Case:
    name: str
    model: str
    wrap: str          # "compile(ddp)", "ddp(compile)", "fsdp2-blocks", "fsdp2-whole", "dtensor"
    backend: str = "aot_eager"
    optimize_ddp: bool = True
    bucket_cap_mb: float = 0.002


@dataclass
class Outcome:
    name: str
    max_difference: float = float("nan")
    graphs_compiled: int = 0
    grads_ready_before_input: int = 0
    warnings: list[str] = field(default_factory=list)
    error: str = ""


def _batch(shape, step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(*shape[0], generator=g), torch.randn(*shape[1], generator=g)


def _train(model, params, shapes, comm_log=None) -> None:
    opt = torch.optim.SGD(params, lr=0.05)
    rank = dist.get_rank()
    for step in range(STEPS):
        x, y = _batch(shapes, step, rank)
        x.requires_grad_(True)
        if comm_log is not None:
            x.register_hook(lambda g: comm_log.append("input") or g)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def _fresh(model_name: str):
    torch.manual_seed(0)
    return MODELS[model_name][0]()


def _full_params(model) -> list[torch.Tensor]:
    out = []
    for p in model.parameters():
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        out.append(p.detach().clone())
    return out


def _counting(backend: str, counter: list):
    import fireclay
    from fireclay.backends import lookup_backend

    inner = lookup_backend(backend)

    def counted(program, example_inputs):
        counter.append(len(program.main.nodes))
        return inner(program, example_inputs)

    counted.__name__ = backend
    return fireclay.compile, counted


def _ddp_run(case: Case, compiled: bool, counter: list, comm_log: list | None):
    model = _fresh(case.model)
    shapes = MODELS[case.model][1:]
    if not compiled:
        ddp = DDP(model, bucket_cap_mb=case.bucket_cap_mb)
        _train(ddp, ddp.parameters(), shapes)
        return _full_params(ddp.module)
    compile_, backend = _counting(case.backend, counter)
    if case.wrap == "compile(ddp)":
        ddp = DDP(model, bucket_cap_mb=case.bucket_cap_mb)
        runnable = compile_(ddp, backend=backend)
    else:
        ddp = DDP(compile_(model, backend=backend), bucket_cap_mb=case.bucket_cap_mb)
        runnable = ddp
    if comm_log is not None:
        # DDP's reducer hooks a parameter's gradient accumulation: log when each one is ready.
        for name, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(lambda p, name=name: comm_log.append(name))
    _train(runnable, runnable.parameters(), shapes, comm_log)
    return _full_params(model)


def _fsdp_run(case: Case, compiled: bool, counter: list):
    from torch.distributed.fsdp import fully_shard

    model = _fresh(case.model)
    shapes = MODELS[case.model][1:]
    compile_, backend = _counting(case.backend, counter)
    blocks = model.blocks if hasattr(model, "blocks") else model.layers
    for i, block in enumerate(blocks):
        fully_shard(block)
        if compiled and case.wrap == "fsdp2-blocks":
            blocks[i] = compile_(block, backend=backend)
    fully_shard(model)
    runnable = compile_(model, backend=backend) if compiled and case.wrap == "fsdp2-whole" else model
    _train(runnable, model.parameters(), shapes)
    return _full_params(model)


def _dtensor_run(case: Case, compiled: bool, counter: list):
    """A module whose parameters and input are DTensors, compiled without FSDP2's hooks to turn
    them into plain tensors: the frame must run eagerly (with one warning), never wrongly."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = _fresh(case.model)
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Replicate()])))
    shapes = MODELS[case.model][1:]
    compile_, backend = _counting(case.backend, counter)
    runnable = compile_(model, backend=backend) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = (distribute_tensor(t, mesh, [Replicate()]) for t in _batch(shapes, step, 0))
        loss = F.mse_loss(runnable(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return _full_params(model)


class _Warnings(logging.Handler):
    """fireclay's fallback notices (logged at WARNING once per place) and Python warnings."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_case(case: Case) -> Outcome:
    import fireclay

    outcome = Outcome(case.name)
    counter: list = []
    comm_log: list = []
    notices = _Warnings()
    loggers = [logging.getLogger(name) for name in ("fireclay", "fireclay_capture")]
    for logger in loggers:
        logger.addHandler(notices)
    try:
        with warnings.catch_warnings(record=True) as caught, fireclay.config.patch(optimize_ddp=case.optimize_ddp):
            warnings.simplefilter("always")
            fireclay.reset()
            if case.wrap == "dtensor":
                expected = _dtensor_run(case, False, [])
                got = _dtensor_run(case, True, counter)
            elif case.wrap.startswith("fsdp2"):
                expected = _fsdp_run(case, False, [])
                got = _fsdp_run(case, True, counter)
            else:
                expected = _ddp_run(case, False, [], None)
                got = _ddp_run(case, True, counter, comm_log)
        # fireclay.capture relays fireclay_capture's records: one notice, possibly seen twice.
        outcome.warnings = sorted({m.splitlines()[0] for m in notices.messages})
        outcome.warnings += [str(w.message).splitlines()[0] for w in caught if "fireclay" in str(w.message)]
        outcome.max_difference = max((a - b).abs().max().item() for a, b in zip(expected, got, strict=True))
        outcome.graphs_compiled = len(counter)
        # The first step's log: parameter gradients ready before the backward reached the input.
        first_step = comm_log[: comm_log.index("input")] if "input" in comm_log else []
        outcome.grads_ready_before_input = len(first_step)
    except Exception as exc:  # reported to the test, which names the case
        import traceback

        outcome.error = "".join(traceback.format_exception(exc))[-3000:]
    finally:
        for logger in loggers:
            logger.removeHandler(notices)
    return outcome


def worker(rank: int, world_size: int, init_file: str, cases: list[dict], out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        results = [asdict(run_case(Case(**c))) for c in cases]
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
