"""``benchmarks.kernel_checks`` runs on the CPU (C++ kernels) and, given a GPU, with
``--device cuda`` (Triton kernels with and without their device-side asserts)."""

from __future__ import annotations

import sys

import pytest
import torch

from benchmarks import kernel_checks

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))]


@pytest.mark.parametrize("device", DEVICES)
def test_gather_is_timed_with_and_without_checks(device, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["kernel_checks", "--device", device, "--only", "gather", "--repeats", "1",
                                      "--runs", "1"])
    kernel_checks.main()
    out = capsys.readouterr().out
    assert f"device {device}" in out
    (row,) = [line for line in out.splitlines() if line.startswith("gather")]
    on, off, slowdown = row.split()[1:]
    assert float(on) > 0 and float(off) > 0 and slowdown.endswith("%")


def test_cuda_is_refused_without_a_gpu(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    monkeypatch.setattr(sys, "argv", ["kernel_checks", "--device", "cuda"])
    with pytest.raises(SystemExit):
        kernel_checks.main()
