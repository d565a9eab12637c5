"""Bytes the forward keeps for the backward, per model: fireclay-autograd's min-cut
partitioner, the naive "save every intermediate the backward reads", and AOTAutograd's default
(min-cut) partitioner as the baseline.

    python -m benchmarks.saved_bytes            (from the repository root)

Prints the table and writes ``benchmarks/results/saved-bytes-<YYYYmmdd-HHMM>.md`` and ``.json``.
Programs are made with torch.fx (fireclay-autograd's test helper), standing in for
fireclay-capture, so that the three partitioners see the same graph.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import sys

import torch
import torch.nn.functional as F

from benchmarks.report import environment
from benchmarks.runner import REPO_ROOT

sys.path.insert(0, os.path.join(str(REPO_ROOT), "packages", "fireclay-autograd", "tests"))

from fx_programs import BatchNorm2d, program_from  # noqa: E402
from test_transformer_training import GPT2, SEQ, VOCAB, Llama  # noqa: E402

from fireclay_autograd import aot_graphs  # noqa: E402


class MLPBlock(torch.nn.Module):
    def __init__(self, d=256, hidden=1024):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, hidden)
        self.down = torch.nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class AttentionBlock(torch.nn.Module):
    def __init__(self, d=128, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.mlp = MLPBlock(d, 4 * d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, -1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.mlp(x + self.proj(y))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 32, 3, padding=1, bias=False)
        self.bn1 = BatchNorm2d(32)
        self.conv2 = torch.nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn2 = BatchNorm2d(32)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)) + h)
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


MODELS = {
    "mlp_block": (MLPBlock, (64, 256)),
    "attention_block": (AttentionBlock, (4, 64, 128)),
    "cnn_batchnorm": (CNN, (8, 3, 32, 32)),
    "gpt2_style": (GPT2, None),
    "llama_style": (Llama, None),
}


def aot_autograd_saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes AOTAutograd's default partitioner saves (baseline only; not used by fireclay)."""
    from torch._functorch.aot_autograd import aot_module
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    found: list[int] = []

    def fw_compiler(gm, example_inputs):
        out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        # The forward returns the user outputs then the saved tensors (and symints).
        num_user = 1
        total = 0
        for node in out[num_user:]:
            val = node.meta.get("val") if hasattr(node, "meta") else None
            if isinstance(val, torch.Tensor):
                total += val.numel() * val.element_size()
        found.append(total)
        return gm

    compiled = aot_module(model, fw_compiler=fw_compiler, bw_compiler=lambda gm, _: gm,
                          partition_fn=min_cut_rematerialization_partition)
    compiled(x)
    return found[0]


def measure() -> list[dict]:
    rows = []
    for name, (cls, shape) in MODELS.items():
        torch.manual_seed(0)
        model = cls()
        x = torch.randn(*shape) if shape is not None else torch.randint(0, VOCAB, (4, SEQ))
        ours = aot_graphs(program_from(copy.deepcopy(model), [x]), [x])
        naive = aot_graphs(program_from(copy.deepcopy(model), [x]), [x], partitioner="save_all")
        try:
            baseline: int | str = aot_autograd_saved_bytes(copy.deepcopy(model), x)
        except Exception as exc:  # the baseline is optional: report why it is missing
            baseline = f"n/a ({type(exc).__name__})"
        rows.append({
            "model": name, "input_shape": list(x.shape), "ours": ours.partition.saved_bytes,
            "save_all": naive.partition.saved_bytes, "aot_autograd": baseline,
            "recomputed": sorted({op.split("::")[1] for op in ours.partition.recomputed}),
        })
    return rows


def _bytes(v: int | str) -> str:
    return f"{v:,}" if isinstance(v, int) else v


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# Bytes saved for the backward",
        "",
        f"{meta['date']}, {meta['environment']['cpu']}, torch {meta['environment']['versions']['torch']}. "
        "Lower is better; `save all` keeps every forward value the backward reads.",
        "",
        "| model | input | ours (min-cut) | save all | AOTAutograd | ours / AOTAutograd | recomputed in the backward |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ratio = f"{r['ours'] / r['aot_autograd']:.2f}" if isinstance(r["aot_autograd"], int) else "n/a"
        lines.append(f"| {r['model']} | {r['input_shape']} | {_bytes(r['ours'])} | {_bytes(r['save_all'])} | "
                     f"{_bytes(r['aot_autograd'])} | {ratio} | {', '.join(r['recomputed'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(str(REPO_ROOT), "benchmarks", "results"),
                        help="output directory (default benchmarks/results/)")
    args = parser.parse_args(argv)
    now = datetime.datetime.now()
    meta = {"date": now.strftime("%Y-%m-%d %H:%M"), "environment": environment("cpu")}
    rows = measure()
    print(f"{'model':<18}{'min-cut (ours)':>16}{'save-all':>12}{'AOTAutograd':>14}  recomputed")
    for r in rows:
        print(f"{r['model']:<18}{_bytes(r['ours']):>16}{_bytes(r['save_all']):>12}{_bytes(r['aot_autograd']):>14}  "
              f"{', '.join(r['recomputed'])}")
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"saved-bytes-{now.strftime('%Y%m%d-%H%M')}")
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    with open(stem + ".md", "w") as f:
        f.write(markdown(rows, meta))
    print(f"wrote {stem}.md and {stem}.json")


if __name__ == "__main__":
    main()
