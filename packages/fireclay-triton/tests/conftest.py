"""Without a CUDA GPU, kernels run in Triton's interpreter on CPU tensors: the switch must be
set before triton is first imported. The op-table helpers come from fireclay-loops' tests."""

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
LOOPS_TESTS = os.path.join(HERE, "..", "..", "fireclay-loops", "tests")
if os.path.isdir(LOOPS_TESTS):
    sys.path.append(LOOPS_TESTS)
