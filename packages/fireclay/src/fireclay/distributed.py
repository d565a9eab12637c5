"""Compiled modules under ``torch.distributed``: DistributedDataParallel, and its bucket-aware
graph splitting (``config.optimize_ddp``).

DDP's forward is never captured: its bookkeeping (buffer broadcast, ``prepare_for_backward``,
the autograd hooks it puts on parameters) runs eagerly, and only the wrapped module's forward is
compiled, as TorchDynamo does. Gradients reach DDP's reducer through the parameters' ordinary
gradient accumulation, so its all-reduce hooks fire as in eager.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fireclay.config import config
from fireclay.ddp_buckets import compile_in_buckets
from fireclay_ir import Program


def _ddp_class() -> type | None:
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel


def is_data_parallel(target: Any) -> bool:
    """Whether ``target`` is a ``DistributedDataParallel`` module."""
    ddp = _ddp_class()
    return ddp is not None and isinstance(target, ddp)


def is_fully_sharded(target: Any) -> bool:
    """Whether ``fully_shard`` (FSDP2) manages ``target``: its forward hooks gather the
    parameters before the forward and free them after, around the (compiled) forward."""
    if not torch.distributed.is_available():
        return False
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(target, FSDPModule)


def active_data_parallel() -> Any:
    """The DDP module whose forward is running now (DDP records itself around the call of its
    wrapped module), or None."""
    ddp = _ddp_class()
    return None if ddp is None else ddp._get_active_ddp_module()


@contextlib.contextmanager
def forward_replaced(module: torch.nn.Module, forward: Callable[..., Any]) -> Iterator[None]:
    """``module.forward`` is ``forward`` for the block: calling the module still runs its hooks
    around it (DDP calls its wrapped module this way)."""
    had = "forward" in module.__dict__
    saved = module.__dict__.get("forward")
    module.__dict__["forward"] = forward
    try:
        yield
    finally:
        if had:
            module.__dict__["forward"] = saved
        else:
            del module.__dict__["forward"]


def ddp_aware(compiler: Callable[..., Any]) -> Callable[..., Any]:
    """``compiler``, which splits a program captured inside a DDP forward at DDP's bucket
    boundaries when ``config.optimize_ddp`` is on (see :mod:`fireclay.ddp_buckets`)."""

    def compile_for_ddp(program: Program, example_inputs: list) -> Callable[..., Any]:
        ddp = active_data_parallel() if config.optimize_ddp else None
        if ddp is None:
            return compiler(program, example_inputs)
        return compile_in_buckets(program, example_inputs, compiler, bucket_bytes=ddp.bucket_bytes_cap,
                                  first_bucket_bytes=_first_bucket_bytes(ddp))

    compile_for_ddp.__name__ = getattr(compiler, "__name__", "compile_for_ddp")
    return compile_for_ddp


def _first_bucket_bytes(ddp: Any) -> int:
    """DDP's reducer closes its first bucket early (torch.distributed's first-bucket size) when
    the module was built with the default bucket size (``bucket_bytes_cap_default``)."""
    if getattr(ddp, "bucket_bytes_cap_default", False):
        return min(getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", ddp.bucket_bytes_cap),
                   ddp.bucket_bytes_cap)
    return ddp.bucket_bytes_cap
